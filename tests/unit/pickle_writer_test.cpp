#include "pickle/writer.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "pickle/graph_compare.h"
#include "pickle/graph_digest.h"
#include "pickle/parser.h"
#include "test_util.h"
#include "torch/torch_file.h"
#include "zip/zip_archive.h"

namespace ckpt::pickle {
namespace {

using test::B;
using test::OrderedDictWithState;
using test::P;

WriteOptions Proto(int protocol) {
  WriteOptions o;
  o.protocol = protocol;
  return o;
}

// parse -> write -> parse gives the same graph (values and sharing).
void ExpectRoundTrip(const std::string& stream) {
  Graph a = Parse(B(stream)).graph;
  std::string written = Write(a, a.root, Proto(std::max(2, a.protocol)));
  Graph b = Parse(B(written)).graph;
  EXPECT_EQ(CompareGraphs(a, a.root, b, b.root), "");
  EXPECT_EQ(DigestGraph(a, a.root), DigestGraph(b, b.root));
  // Writing is deterministic and idempotent.
  EXPECT_EQ(Write(b, b.root, Proto(std::max(2, b.protocol))), written);
}

TEST(PickleWriter, RoundTripsScalarsAndContainers) {
  ExpectRoundTrip(
      "(I42\nI01\nL-7L\nF1.5\nS'a\\nb'\nVcaf\\u00e9\nN"
      "t.");
  ExpectRoundTrip(std::string("\x80\x02\x8a\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x40\x00.", 15));
  ExpectRoundTrip(OrderedDictWithState(-70000));
  // Big ints of every size class.
  for (int64_t v : std::vector<int64_t>{0, 255, 256, 65535, 65536, -1, 2147483647, 2147483648,
                                        -2147483649, INT64_MAX, INT64_MIN}) {
    Graph g;
    g.root = g.AddInt(v);
    Graph back = Parse(B(Write(g, g.root))).graph;
    EXPECT_EQ(back.at(back.root).integer, v);
  }
}

TEST(PickleWriter, KeepsSharingAndCycles) {
  // l = []; l.append(l); (l, l)
  ExpectRoundTrip(P().proto(2).op(']').put(0).get(0).op('a').get(0).op(0x86).stop().bytes());
  // t = (l,); l.append(t): a cycle through a tuple.
  ExpectRoundTrip(
      P().proto(2).op(']').put(0).get(0).op(0x85).put(1).op('a').op('0').get(1).stop().bytes());
}

TEST(PickleWriter, RoundTripsRealTorchPickles) {
  for (const char* name : {"small.pt"}) {
    std::string f = test::ReadFixture(name);
    zip::Archive a = zip::Archive::Parse(B(f));
    std::string pkl = zip::ReadRecord(B(f), *a.Find("small/data.pkl"), 1 << 20);
    ExpectRoundTrip(pkl);
  }
}

TEST(PickleWriter, RefusesValuesTheProtocolCannotHold) {
  Graph g;
  g.root = g.AddText(Kind::kBytes, "abc");
  EXPECT_THROW(Write(g, g.root, Proto(2)), Error);
  EXPECT_NO_THROW(Write(g, g.root, Proto(3)));
}

TEST(GraphCompare, FindsDifferences) {
  Graph a = Parse(B(P().proto(2).mark().bin_int(1).str("x").op('l').stop().bytes())).graph;
  Graph b = Parse(B(P().proto(2).mark().bin_int(2).str("x").op('l').stop().bytes())).graph;
  EXPECT_NE(CompareGraphs(a, a.root, b, b.root).find("int 1 became 2"), std::string::npos);
  // Same values but different sharing.
  Graph c = Parse(B(P().proto(2).op(']').put(0).get(0).op(0x86).stop().bytes())).graph;
  Graph d = Parse(B(P().proto(2).op(']').op(']').op(0x86).stop().bytes())).graph;
  EXPECT_NE(CompareGraphs(c, c.root, d, d.root).find("sharing"), std::string::npos);
}

// The digest tells apart what CompareGraphs tells apart.
TEST(GraphDigest, DiffersWhereGraphsDiffer) {
  auto digest = [](const std::string& stream) {
    Graph g = Parse(B(stream)).graph;
    return DigestGraph(g, g.root);
  };
  auto list = [](std::initializer_list<std::string_view> strs) {
    P p;
    p.proto(2).mark();
    for (std::string_view s : strs) p.str(s);
    return p.op('l').stop().bytes();
  };
  EXPECT_EQ(digest(list({"ab", "c"})), digest(list({"ab", "c"})));
  // Text boundaries count, not only the concatenated bytes.
  EXPECT_NE(digest(list({"ab", "c"})), digest(list({"a", "bc"})));
  EXPECT_NE(digest(list({"ab"})), digest(list({"ab", ""})));
  // Values, kinds and sharing.
  EXPECT_NE(digest(P().proto(2).mark().bin_int(1).op('l').stop().bytes()),
            digest(P().proto(2).mark().bin_int(2).op('l').stop().bytes()));
  EXPECT_NE(digest(P().proto(2).op(']').put(0).get(0).op(0x86).stop().bytes()),
            digest(P().proto(2).op(']').op(']').op(0x86).stop().bytes()));
  EXPECT_NE(digest(P().proto(2).global("torch", "a.b").stop().bytes()),
            digest(P().proto(2).global("torch.a", "b").stop().bytes()));
  // A tuple and a list of the same items.
  EXPECT_NE(digest(P().proto(2).mark().bin_int(1).op('t').stop().bytes()),
            digest(P().proto(2).mark().bin_int(1).op('l').stop().bytes()));
  // Real checkpoints: equal to their own round trip, different from each other.
  std::string f = test::ReadFixture("small.pt");
  zip::Archive a = zip::Archive::Parse(B(f));
  std::string pkl = zip::ReadRecord(B(f), *a.Find("small/data.pkl"), 1 << 20);
  Graph g = Parse(B(pkl)).graph;
  GraphDigest before = DigestGraph(g, g.root);
  EXPECT_EQ(before, digest(Write(g, g.root, Proto(2))));
  ASSERT_FALSE(g.pairs(g.root).empty());
  NodeId key = g.pairs(g.root)[0];  // the first tensor's name
  ASSERT_EQ(g.kind(key), Kind::kStr);
  g.SetText(key, std::string(g.text(key)) + "x");
  EXPECT_NE(before, DigestGraph(g, g.root));
}

}  // namespace
}  // namespace ckpt::pickle
