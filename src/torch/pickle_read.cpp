#include "torch/pickle_read.h"

#include <fmt/format.h>

#include "base/error.h"
#include "torch/global_policy.h"

namespace ckpt::torch {

namespace {

using pickle::FrameMode;
using pickle::Reading;

std::string Effects(const pickle::PartialParse& p) {
  std::string e = DescribeEffects(p.result.graph);
  if (e.empty()) e = "does nothing that imports or calls";
  if (!p.error.empty()) e += " before it fails";
  return e;
}

}  // namespace

pickle::ParseResult ParseTorchPickle(Bytes data, uint64_t base_offset,
                                     const pickle::Limits& limits) {
  pickle::PartialParse p = pickle::ParsePartial(data, base_offset, limits);
  if (p.error.empty()) return std::move(p.result);
  std::string message = p.error;
  if (p.diverged) {
    pickle::PartialParse as_torch =
        pickle::ParsePartial(data, base_offset, limits, Reading{FrameMode::kBytesIO, true});
    pickle::PartialParse straight =
        pickle::ParsePartial(data, base_offset, limits, Reading{FrameMode::kStraight, true});
    message +=
        fmt::format(". Read as torch.load reads it, the pickle {}; read straight through, it {}",
                    Effects(as_torch), Effects(straight));
  } else if (p.patched) {
    // What the patched objects lead to: read on with the patch applied.
    pickle::PartialParse patched =
        pickle::ParsePartial(data, base_offset, limits, Reading{FrameMode::kStrict, true});
    message += fmt::format(". With the patch applied, as torch.load would, the pickle {}",
                           Effects(patched));
  } else if (std::string before = DescribeEffects(p.result.graph); !before.empty()) {
    message +=
        fmt::format(". Before that point, torch.load would have run what the pickle {}", before);
  }
  throw Error(message);
}

std::string EffectsOfFirstPickle(Bytes data, const pickle::Limits& limits) {
  pickle::PartialParse p =
      pickle::ParsePartial(data, 0, limits, Reading{FrameMode::kBytesIO, true});
  std::string e = DescribeEffects(p.result.graph);
  std::string straight = DescribeEffects(
      pickle::ParsePartial(data, 0, limits, Reading{FrameMode::kStraight, true}).result.graph);
  if (e.empty()) return straight;
  if (!straight.empty() && straight != e) e += "; read straight through, it " + straight;
  return e;
}

}  // namespace ckpt::torch
