#include "safetensors/safetensors_file.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "test_util.h"

namespace ckpt::safetensors {
namespace {

using test::B;

std::string Make(const std::string& header, const std::string& data) {
  std::string out;
  AppendLE<uint64_t>(out, header.size());
  return out + header + data;
}

std::string ErrorOf(const std::string& bytes) {
  return test::ErrorOf([&] { Parse(B(bytes)); });
}

TEST(Safetensors, ReadsTensorsAndMetadata) {
  std::string f = Make(R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
                       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("__metadata__":{"format":"pt"}})",
                       std::string(12, '\0'));
  File st = Parse(B(f));
  ASSERT_EQ(st.tensors.size(), 2u);
  EXPECT_EQ(st.tensors[0].name, "a");  // offset order
  EXPECT_EQ(st.tensors[1].torch_dtype, "bfloat16");
  EXPECT_EQ(st.metadata.at("format"), "pt");
  EXPECT_TRUE(LooksLikeSafetensors(B(f)));
}

TEST(Safetensors, ParseEachHandsEveryEntryOverAndCheckTilingFindsHolesAndOverlaps) {
  std::string f = Make(R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
                       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                       std::string(12, '\0'));
  std::vector<std::string> names;
  std::vector<Span> spans;
  Header h = ParseEach(B(f), [&](TensorEntry&& e) {
    spans.push_back({e.begin, e.end, names.size()});
    names.push_back(e.name);
  });
  EXPECT_EQ(names, (std::vector<std::string>{"b", "a"}));  // header order
  auto name_of = [&](size_t i) -> std::string_view { return names[i]; };
  CheckTiling(spans, f.size() - h.data_offset, name_of);
  EXPECT_EQ(spans[0].id, 1u);  // now in file order
  // The same spans against a longer buffer, or with a hole or an overlap: refused, named.
  EXPECT_NE(test::ErrorOf([&] { CheckTiling(spans, 16, name_of); }).find("cover 12 bytes"),
            std::string::npos);
  std::vector<Span> hole = {{0, 8, 1}, {9, 12, 0}};
  EXPECT_NE(test::ErrorOf([&] { CheckTiling(hole, 12, name_of); }).find("'b' starts at 9"),
            std::string::npos);
  std::vector<Span> overlap = {{0, 8, 1}, {6, 12, 0}};
  EXPECT_NE(test::ErrorOf([&] { CheckTiling(overlap, 12, name_of); }).find("overlap"),
            std::string::npos);
}

TEST(Safetensors, CommittedFixtureParses) {
  std::string f = test::ReadFixture("small.safetensors");
  File st = Parse(B(f));
  EXPECT_EQ(st.tensors.size(), 3u);
  EXPECT_EQ(st.data_offset % 8, 0u);
}

TEST(Safetensors, RejectsBrokenHeaders) {
  std::string data(8, '\0');
  auto one = [&](const std::string& entry) { return Make("{" + entry + "}", data); };
  EXPECT_NE(
      ErrorOf(one(R"("a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]})")).find("unknown dtype"),
      std::string::npos);
  EXPECT_NE(ErrorOf(one(R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]})")).find("needs"),
            std::string::npos);
  EXPECT_NE(ErrorOf(one(R"("a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]})")).find("shape"),
            std::string::npos);
  EXPECT_NE(ErrorOf(one(R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})")).find("hole"),
            std::string::npos);
  EXPECT_NE(ErrorOf(one(R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})"))
                .find("after the header"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(
          one(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})"))
          .find("twice"),
      std::string::npos);
  EXPECT_NE(
      ErrorOf(
          one(R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]})"))
          .find("overlap"),
      std::string::npos);
  EXPECT_NE(ErrorOf(one(R"("__metadata__":{"k":1})")).find("__metadata__"), std::string::npos);
  EXPECT_NE(ErrorOf(Make("[1,2]", "")).find("not a JSON object"), std::string::npos);
  // Objects inside a header that is not an object (the streaming reader once followed their
  // keys into an empty stack: found by the fuzz corpus replay).
  EXPECT_NE(ErrorOf(Make(R"([{"__metadata__":{"a":"b"}},{"x":[{"y":1}]}])", ""))
                .find("not a JSON object"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Make("{\"a\":", "")).find("JSON"), std::string::npos);
  EXPECT_NE(ErrorOf(Make("{\"\xff\":1}", "")).find("UTF-8"), std::string::npos);
}

TEST(Safetensors, HeaderLengthIsCheckedAgainstTheFile) {
  std::string f;
  AppendLE<uint64_t>(f, 1ull << 40);
  f += "{}";
  EXPECT_NE(ErrorOf(f).find("exceeds"), std::string::npos);
  std::string g;
  AppendLE<uint64_t>(g, 1000);
  g += "{}";
  EXPECT_NE(ErrorOf(g).find("runs past"), std::string::npos);
  EXPECT_NE(ErrorOf("abc").find("too small"), std::string::npos);
}

TEST(Safetensors, TruncationAtEveryByteIsAnError) {
  std::string f = test::ReadFixture("small.safetensors");
  for (size_t n = 0; n < f.size(); ++n) {
    EXPECT_THROW(Parse(B(f.substr(0, n))), Error) << n;
  }
}

}  // namespace
}  // namespace ckpt::safetensors
