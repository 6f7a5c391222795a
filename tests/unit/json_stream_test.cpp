#include "base/json_stream.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace ckpt {
namespace {

using json = nlohmann::ordered_json;

std::string Dump(const json& j) {
  return j.dump(1, ' ', false, json::error_handler_t::replace);
}

// Writes `j` through the stream: containers opened and closed member by member, except that
// containers for which whole(depth) says so go in as one Value (as the reports' rows do).
void Write(JsonStream& out, const json& j, const std::function<bool(size_t)>& whole) {
  if (!j.is_structured() || whole(out.depth())) {
    out.Value(j);
    return;
  }
  if (j.is_object()) {
    out.BeginObject();
    for (const auto& [k, v] : j.items()) {
      out.Key(k);
      Write(out, v, whole);
    }
  } else {
    out.BeginArray();
    for (const json& v : j) Write(out, v, whole);
  }
  out.End();
}

std::string Streamed(const json& j, const std::function<bool(size_t)>& whole,
                     std::vector<size_t>* pieces = nullptr) {
  std::string text;
  {
    JsonStream out([&](std::string_view t) {
      text.append(t);
      if (pieces) pieces->push_back(t.size());
    });
    Write(out, j, whole);
  }
  return text;
}

json Tricky() {
  return json{
      {"path", "a/b.pt"},
      {"empty_object", json::object()},
      {"empty_array", json::array()},
      {"nested", {{"x", json::array({1, json::array(), json::object(), json::array({2, 3})})}}},
      {"text", "line\nbreak \"quoted\" tab\t back\\slash \x01 caf\xc3\xa9"},
      {"bad utf-8 \xff key", "bad \xc3 value"},
      {"numbers", {0, -1, 18446744073709551615ull, -9223372036854775807ll, 0.5, 1e300}},
      {"flags", {true, false, nullptr}},
  };
}

TEST(JsonStream, WritesWhatDumpOfTheWholeDocumentWrites) {
  json doc = Tricky();
  std::string expected = Dump(doc);
  EXPECT_EQ(Streamed(doc, [](size_t) { return false; }), expected);  // every container streamed
  EXPECT_EQ(Streamed(doc, [](size_t) { return true; }), expected);   // the document as one value
  for (size_t at = 0; at < 5; ++at) {  // whole below one depth, streamed above it
    EXPECT_EQ(Streamed(doc, [at](size_t d) { return d >= at; }), expected) << at;
  }
  EXPECT_EQ(Streamed(json::object(), [](size_t) { return false; }), "{}");
  EXPECT_EQ(Streamed(json::array(), [](size_t) { return false; }), "[]");
  EXPECT_EQ(Streamed(json(7), [](size_t) { return false; }), "7");
}

TEST(JsonStream, TypedValuesAreWrittenAsDumpWritesThem) {
  // The row writers' path: text, integers, bools, null and integer lists without a json value.
  const std::vector<std::string> texts = {"",     "layers.0.weight", "a\"b", "back\\slash",
                                          "\x7f", "tab\there",       "\x01", "caf\xc3\xa9",
                                          "\xff", "\xe2\x82",        "~ !"};
  json expected = json::object();
  std::string text;
  {
    JsonStream out([&](std::string_view t) { text.append(t); });
    out.BeginObject();
    for (size_t i = 0; i < texts.size(); ++i) {
      std::string key = texts[i] + "#" + std::to_string(i);
      out.Member(key, texts[i]);
      expected[key] = texts[i];
    }
    out.Member("literal", "dcp");
    expected["literal"] = "dcp";
    out.Member("int", -42);
    expected["int"] = -42;
    out.Member("min", std::numeric_limits<int64_t>::min());
    expected["min"] = std::numeric_limits<int64_t>::min();
    out.Member("max", std::numeric_limits<uint64_t>::max());
    expected["max"] = std::numeric_limits<uint64_t>::max();
    out.Member("small", uint8_t{7});
    expected["small"] = uint8_t{7};
    out.Member("yes", true);
    expected["yes"] = true;
    out.Member("no", false);
    expected["no"] = false;
    out.Member("none", nullptr);
    expected["none"] = nullptr;
    out.Member("shape", std::vector<int64_t>{4, -1, 0});
    expected["shape"] = std::vector<int64_t>{4, -1, 0};
    out.Member("scalar_shape", std::vector<int64_t>{});
    expected["scalar_shape"] = std::vector<int64_t>{};
    out.BeginArray("list");
    out.Value(std::string("x"));
    out.Value(3u);
    out.Value(nullptr);
    out.End();
    expected["list"] = {"x", 3u, nullptr};
    out.End();
  }
  EXPECT_EQ(text, Dump(expected));
}

TEST(JsonStream, RandomDocumentsMatchDumpHoweverTheyAreSplit) {
  std::mt19937 rng(12345);
  const std::vector<std::string> words = {
      "", "a", "layers.0.weight", "x\ny", "\xe2\x82\xac", "\xff\xfe", "\"", "{}[]"};
  std::function<json(int)> make = [&](int depth) -> json {
    int kind = depth > 4 ? static_cast<int>(rng() % 4) : static_cast<int>(rng() % 6);
    switch (kind) {
      case 0:
        return static_cast<int64_t>(rng()) - (1 << 30);
      case 1:
        return words[rng() % words.size()];
      case 2:
        return rng() % 2 == 0;
      case 3:
        return nullptr;
      case 4: {
        json a = json::array();
        for (size_t n = rng() % 4; n > 0; --n) a.push_back(make(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (size_t n = rng() % 4; n > 0; --n) o[words[rng() % words.size()]] = make(depth + 1);
        return o;
      }
    }
  };
  for (int i = 0; i < 300; ++i) {
    json doc = make(0);
    uint32_t mask = rng();
    std::string got = Streamed(doc, [mask](size_t d) { return (mask >> (d % 32)) & 1; });
    ASSERT_EQ(got, Dump(doc)) << i;
  }
}

TEST(JsonStream, HandsTextToTheSinkInBoundedPieces) {
  json rows = json::array();
  for (int i = 0; i < 20000; ++i)
    rows.push_back({{"name", "layer." + std::to_string(i)}, {"i", i}});
  json doc = {{"tensors", rows}};
  std::vector<size_t> pieces;
  std::string text = Streamed(
      doc, [](size_t d) { return d >= 2; }, &pieces);
  EXPECT_EQ(text, Dump(doc));
  ASSERT_GT(pieces.size(), 5u);  // flushed as it went, not held to the end
  for (size_t n : pieces) EXPECT_LT(n, JsonStream::kFlushBytes + 100);
}

TEST(JsonStream, RefusesAMemberWithoutAKeyAndAKeyOutsideAnObject) {
  JsonStream out([](std::string_view) {});
  EXPECT_THROW(out.Key("k"), Error);
  out.BeginObject();
  EXPECT_THROW(out.Value(1), Error);
  out.Key("k");
  EXPECT_THROW(out.Key("again"), Error);
  out.Value(1);
  out.End();
  EXPECT_THROW(out.End(), Error);
}

}  // namespace
}  // namespace ckpt
