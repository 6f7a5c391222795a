// MeasureLoss's fast paths (a vectorised count of values that only round) must give what
// classifying every value one at a time gives.
#include "kernels/conversion_loss.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <vector>

namespace ckpt::kernels {
namespace {

ConversionLoss OneByOne(Half to, const std::vector<float>& v) {
  ConversionLoss sum;
  for (float x : v) {
    uint8_t b[4];
    std::memcpy(b, &x, 4);
    sum.Add(MeasureLoss(to, b, 1));  // a single value is always classified
  }
  return sum;
}

void ExpectSame(Half to, const std::vector<float>& v) {
  ConversionLoss bulk = MeasureLoss(to, reinterpret_cast<const uint8_t*>(v.data()), v.size());
  ConversionLoss ref = OneByOne(to, v);
  EXPECT_EQ(bulk.values, ref.values);
  EXPECT_EQ(bulk.nonzero, ref.nonzero);
  EXPECT_EQ(bulk.overflow, ref.overflow);
  EXPECT_EQ(bulk.to_zero, ref.to_zero);
  EXPECT_EQ(bulk.to_subnormal, ref.to_subnormal);
  EXPECT_EQ(bulk.all_integers, ref.all_integers);
  if (ref.all_integers) {
    EXPECT_EQ(bulk.integers_changed, ref.integers_changed);
  }
  EXPECT_EQ(bulk.Reason(to), ref.Reason(to));
}

TEST(ConversionLoss, BulkEqualsOneByOne) {
  std::mt19937 rng(7);
  std::normal_distribution<float> weights(0.0f, 0.02f);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (Half to : {Half::kBFloat16, Half::kFloat16}) {
    std::vector<float> w(10000);
    for (float& x : w) x = weights(rng);
    ExpectSame(to, w);  // trained weights: all in range after the first
    w[5000] = 1e6f;     // one overflow (float16) in the middle
    w[7000] = 1e-30f;   // one flush to zero
    ExpectSame(to, w);
    std::vector<float> bits(4096);
    for (float& x : bits) x = std::bit_cast<float>(any_bits(rng));  // NaNs, infinities too
    ExpectSame(to, bits);
    std::vector<float> counters = {4096.0f, 4097.0f, 0.0f, 1.0f, 65504.0f, 70000.0f};
    ExpectSame(to, counters);  // whole numbers: every one classified
    std::vector<float> tiny(1000, 1e-9f);
    ExpectSame(to, tiny);  // optimizer moments
    ExpectSame(to, {});
  }
}

}  // namespace
}  // namespace ckpt::kernels
