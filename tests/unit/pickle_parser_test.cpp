#include "pickle/parser.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "pickle/text_codec.h"
#include "test_util.h"

namespace ckpt::pickle {
namespace {

using test::B;
using test::OrderedDictWithState;
using test::P;

Graph ParseBytes(const std::string& s, const Limits& limits = {}) {
  return Parse(B(s), 0, limits).graph;
}

TEST(PickleParser, ScalarsOfEveryProtocol) {
  // Protocol 0 text forms.
  Graph g = ParseBytes(
      "(I42\nI01\nL-7L\nF1.5\nS'a\\nb'\nVcaf\\u00e9\nN"
      "t.");
  ASSERT_EQ(g.kind(g.root), Kind::kTuple);
  const auto& t = g.items(g.root);
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(g.at(t[0]).integer, 42);
  EXPECT_EQ(g.kind(t[1]), Kind::kBool);
  EXPECT_TRUE(g.at(t[1]).boolean);
  EXPECT_EQ(g.at(t[2]).integer, -7);
  EXPECT_DOUBLE_EQ(g.at(t[3]).real, 1.5);
  EXPECT_EQ(g.text(t[4]), "a\nb");
  EXPECT_EQ(g.text(t[5]), "caf\xc3\xa9");
  EXPECT_EQ(g.kind(t[6]), Kind::kNone);
}

// INT as CPython's unpickler reads it: strtol with base 0, and any two-character text that
// says 0 or 1 is a bool (each checked against python3 -c "pickle.loads(b'I...\n.')").
TEST(PickleParser, TextIntegersFollowCPython) {
  struct Case {
    const char* text;
    Kind kind;
    int64_t value;
  };
  for (const Case& c : {Case{"I010\n.", Kind::kInt, 8}, Case{"I0x10\n.", Kind::kInt, 16},
                        Case{"I+1\n.", Kind::kBool, 1}, Case{"I-0\n.", Kind::kBool, 0},
                        Case{"I00\n.", Kind::kBool, 0}, Case{"I01\n.", Kind::kBool, 1},
                        Case{"I+5\n.", Kind::kInt, 5}, Case{"I-12\n.", Kind::kInt, -12},
                        Case{"I1\n.", Kind::kInt, 1}, Case{"L+5L\n.", Kind::kInt, 5}}) {
    Graph g = ParseBytes(c.text);
    ASSERT_EQ(g.kind(g.root), c.kind) << c.text;
    EXPECT_EQ(c.kind == Kind::kBool ? int64_t{g.at(g.root).boolean} : g.at(g.root).integer, c.value)
        << c.text;
  }
  Graph big = ParseBytes("I99999999999999999999\n.");
  ASSERT_EQ(big.kind(big.root), Kind::kBigInt);
  EXPECT_EQ(TwosComplementToDecimal(big.text(big.root)), "99999999999999999999");
  EXPECT_THROW(ParseBytes("I12x\n."), Error);
  // One sign at most, as Python's int(): "++1" is refused (it once parsed as a big int that
  // the writer's LONG1 turned into an int: the fuzzer's round trip caught the kind change).
  EXPECT_THROW(ParseBytes("I++1\n."), Error);
  EXPECT_THROW(ParseBytes("L+-1L\n."), Error);
  // A value that fits in 64 bits is an int however it is spelt.
  Graph plus = ParseBytes("L+9223372036854775807\n.");
  ASSERT_EQ(plus.kind(plus.root), Kind::kInt);
  EXPECT_EQ(plus.at(plus.root).integer, INT64_MAX);
}

TEST(PickleParser, BigIntsStayExact) {
  // LONG1 with 10 bytes: 2**70.
  std::string s =
      "\x80\x02\x8a\x0a" + std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x40\x00", 10) + ".";
  Graph g = ParseBytes(s);
  ASSERT_EQ(g.kind(g.root), Kind::kBigInt);
  EXPECT_EQ(TwosComplementToDecimal(g.text(g.root)), "1180591620717411303424");
  // LONG1 that fits in int64, negative.
  g = ParseBytes(std::string("\x80\x02\x8a\x02\x00\xff.", 7));
  EXPECT_EQ(g.at(g.root).integer, -256);
}

TEST(PickleParser, MemoSharesNodesAndCyclesAreKept) {
  // l = []; l.append(l); (l, l)
  std::string s = P().proto(2).op(']').put(0).get(0).op('a').get(0).op(0x86).stop().bytes();
  Graph g = ParseBytes(s);
  const auto& t = g.items(g.root);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0], t[1]);
  EXPECT_EQ(g.items(t[0]).size(), 1u);
  EXPECT_EQ(g.items(t[0])[0], t[0]);
}

TEST(PickleParser, GlobalsAndReduceAreRecordedNeverCalled) {
  std::string s =
      P().proto(2).global("os", "system").str("touch /tmp/pwned").op(0x85).op('R').stop().bytes();
  Graph g = ParseBytes(s);
  ASSERT_EQ(g.kind(g.root), Kind::kObject);
  NodeId fn = g.CalledGlobal(g.root);
  ASSERT_NE(fn, kNil);
  EXPECT_EQ(g.GlobalText(fn), "os.system");
  EXPECT_EQ(g.text(g.Arg(g.root, 0)), "touch /tmp/pwned");
}

TEST(PickleParser, StackGlobalProtocol4WithFramesAndMemoize) {
  std::string body = P().op(0x8c)
                         .raw("\x08")
                         .raw("builtins")
                         .op(0x94)
                         .op(0x8c)
                         .raw("\x04")
                         .raw("eval")
                         .op(0x94)
                         .op(0x93)
                         .op(0x94)
                         .bytes();
  std::string s = "\x80\x04\x95" + std::string(8, '\0') + body + ".";
  uint64_t frame = body.size() + 1;
  for (int i = 0; i < 8; ++i) s[3 + i] = static_cast<char>((frame >> (8 * i)) & 0xFF);
  Graph g = ParseBytes(s);
  EXPECT_EQ(g.protocol, 4);
  ASSERT_EQ(g.kind(g.root), Kind::kGlobal);
  EXPECT_EQ(g.GlobalText(g.root), "builtins.eval");
}

TEST(PickleParser, DictsSetsAndObjectsWithState) {
  std::string s = OrderedDictWithState(2);
  Graph g = ParseBytes(s);
  ASSERT_EQ(g.kind(g.root), Kind::kObject);

  EXPECT_EQ(g.pairs(g.root).size(), 4u);
  ASSERT_EQ(g.states(g.root).size(), 1u);
  EXPECT_EQ(g.kind(g.states(g.root)[0]), Kind::kDict);
  NodeId set = g.pairs(g.states(g.root)[0])[1];
  EXPECT_EQ(g.kind(set), Kind::kSet);
  EXPECT_EQ(g.items(set).size(), 1u);
}

TEST(PickleParser, RejectsMalformedStreams) {
  EXPECT_THROW(ParseBytes(""), Error);                   // empty
  EXPECT_THROW(ParseBytes("\x80\x02"), Error);           // no STOP
  EXPECT_THROW(ParseBytes("\x80\x02."), Error);          // STOP on empty stack
  EXPECT_THROW(ParseBytes("\x80\x02h\x05."), Error);     // undefined memo key
  EXPECT_THROW(ParseBytes("\x80\x02\xff."), Error);      // unknown opcode
  EXPECT_THROW(ParseBytes("\x80\x09N."), Error);         // protocol 9
  EXPECT_THROW(ParseBytes("\x80\x02Na."), Error);        // APPEND to None
  EXPECT_THROW(ParseBytes("\x80\x02(Nt0u."), Error);     // SETITEMS, no mark
  EXPECT_THROW(ParseBytes("\x80\x02\x82\x01."), Error);  // EXT1
  EXPECT_THROW(ParseBytes("\x80\x05\x97."), Error);      // NEXT_BUFFER
  EXPECT_THROW(ParseBytes("\x80\x02"
                          "cos\nsys"),
               Error);  // truncated GLOBAL
}

TEST(PickleParser, LyingLengthsAreCheckedBeforeUse) {
  // BINUNICODE8 / BINBYTES8 / LONG4 claiming huge sizes must fail without allocating.
  std::string huge =
      std::string("\x80\x04\x8d") + std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "abc.";
  EXPECT_THROW(ParseBytes(huge), Error);
  std::string bytes8 =
      std::string("\x80\x04\x8e") + std::string("\x00\x00\x00\x00\x01\x00\x00\x00", 8) + ".";
  EXPECT_THROW(ParseBytes(bytes8), Error);
  std::string long4 = std::string("\x80\x02\x8b\xff\xff\xff\x7f") + "..";
  EXPECT_THROW(ParseBytes(long4), Error);
  std::string frame =
      std::string("\x80\x04\x95") + std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8) + "N.";
  EXPECT_THROW(ParseBytes(frame), Error);
}

TEST(PickleParser, DeepNestingHitsTheLimit) {
  std::string s = "\x80\x02";
  for (int i = 0; i < 5000; ++i) s += "]";  // 5000 lists...
  for (int i = 0; i < 4999; ++i) s += "a";  // ...each appended into the previous
  s += ".";
  try {
    ParseBytes(s);
    FAIL() << "expected a nesting error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper"), std::string::npos) << e.what();
  }
  std::string marks(3000, '(');
  EXPECT_THROW(ParseBytes("\x80\x02" + marks + "N."), Error);
  // Nested tuples built without marks hit the same limit.
  std::string tuples = "\x80\x02N";
  for (int i = 0; i < 3000; ++i) tuples += "\x85";
  EXPECT_THROW(ParseBytes(tuples + "."), Error);
}

TEST(PickleParser, NodeAndMemoLimits) {
  Limits small;
  small.max_nodes = 100;
  std::string many = "\x80\x02(";
  for (int i = 0; i < 200; ++i) many += "N";
  many += "l.";
  EXPECT_THROW(ParseBytes(many, small), Error);
  Limits memo;
  memo.max_memo = 10;
  std::string puts = "\x80\x02N";
  for (int i = 0; i < 20; ++i) puts += std::string("q") + static_cast<char>(i);
  EXPECT_THROW(ParseBytes(puts + ".", memo), Error);
}

std::string U32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// The memo behaves as Python's dict whether a key lands in the vector (keys 0, 1, 2...) or in
// the map (a key far beyond the entries so far); each case checked with pickle.loads.
TEST(PickleParser, MemoKeysBehaveLikePythonsDict) {
  // memo[1100] = 1 (in the map), memo[0..59] (the vector), then memo[1100] = 99 once the
  // vector reaches that far: the key moves over and is still one entry.
  std::string s = "\x80\x04K\x01r" + U32(1100) + "0";
  for (int i = 0; i < 60; ++i) s += "K" + std::string(1, static_cast<char>(i)) + "r" + U32(i) + "0";
  s += "Kcr" + U32(1100) + "0(j" + U32(1100) + "j" + U32(5) + "t.";  // -> (99, 5)
  Limits exact;
  exact.max_memo = 61;
  Graph g = ParseBytes(s, exact);
  ASSERT_EQ(g.items(g.root).size(), 2u);
  EXPECT_EQ(g.at(g.items(g.root)[0]).integer, 99);
  EXPECT_EQ(g.at(g.items(g.root)[1]).integer, 5);
  Limits one_less;
  one_less.max_memo = 60;
  EXPECT_THROW(ParseBytes(s, one_less), Error);
  // MEMOIZE uses the number of keys: memo = {0: 7, 2: 8}; MEMOIZE sets memo[2] = 9 -> (9,).
  Graph m =
      ParseBytes(std::string("\x80\x04K\x07q\x00"
                             "0K\x08q\x02"
                             "0K\x09\x94"
                             "0(h\x02t.",
                             21));
  ASSERT_EQ(m.items(m.root).size(), 1u);
  EXPECT_EQ(m.at(m.items(m.root)[0]).integer, 9);
  // A key inside the vector's range that was never put is undefined.
  std::string error =
      test::ErrorOf([] { ParseBytes(std::string("\x80\x02Nq\x00q\x05h\x03.", 10)); });
  EXPECT_NE(error.find("memo key 3 is not defined"), std::string::npos) << error;
  // A hostile key near 2^32 costs one map entry, not a 16 GiB vector.
  Graph far = ParseBytes("\x80\x02Nr" + U32(0xfffffff0u) + "0j" + U32(0xfffffff0u) + ".");
  EXPECT_EQ(far.kind(far.root), Kind::kNone);
}

TEST(PickleParser, BillionLaughsStaysSmall) {
  // a = [N]; b = [a, a]; c = [b, b] ... 40 levels: 2^40 paths, 40 nodes.
  std::string s("\x80\x02(Nlq\x00", 7);
  for (int i = 1; i < 40; ++i) {
    s += "(h";
    s += static_cast<char>(i - 1);
    s += "h";
    s += static_cast<char>(i - 1);
    s += "lq";
    s += static_cast<char>(i);
  }
  s += ".";
  Graph g = ParseBytes(s);
  EXPECT_LT(g.nodes.size(), 100u);
}

TEST(PickleParser, ErrorsNameTheOffset) {
  try {
    Parse(B("\x80\x02NNh\x07."), 1000);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 1004"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("memo key 7"), std::string::npos) << e.what();
  }
}

TEST(TextCodec, DecimalRoundTrips) {
  for (std::string v : {"0", "1", "-1", "127", "128", "-128", "-129", "255", "256",
                        "9223372036854775807", "-9223372036854775808", "1180591620717411303424",
                        "-340282366920938463463374607431768211457"}) {
    std::string le;
    ASSERT_TRUE(DecimalToTwosComplement(v, le)) << v;
    EXPECT_EQ(TwosComplementToDecimal(le), v);
  }
  std::string le;
  EXPECT_FALSE(DecimalToTwosComplement("12a", le));
  EXPECT_FALSE(DecimalToTwosComplement("", le));
}

// A 1 MiB integer (a dict key a hostile file uses to name a tensor) must not take hours to
// print: beyond kMaxDecimalBytes it is written in hex, in linear time.
// 60 levels of (previous, previous): the full text of that key would be 2^60 pairs long.
TEST(GraphKeyText, SharedTupleKeysStopAtTheirLimit) {
  test::P p;
  p.proto(2).str("x").put(0);
  for (uint8_t level = 1; level < 60; ++level) p.get(level - 1).get(level - 1).op(0x86).put(level);
  Graph g = ParseBytes(p.stop().bytes());
  std::string text = g.KeyText(g.root);
  EXPECT_EQ(text.substr(0, 62), std::string(59, '(') + "x, ");
  EXPECT_GE(text.size(), 4096u);
  EXPECT_LT(text.size(), 4096u + 512);
  EXPECT_NE(text.find("..."), std::string::npos);
}

TEST(TextCodec, HugeIntegersPrintInHex) {
  EXPECT_EQ(TwosComplementToDecimal(std::string(kMaxDecimalBytes, '\x01') + '\x00').substr(0, 6),
            "0x0101");
  EXPECT_EQ(
      TwosComplementToDecimal(std::string(kMaxDecimalBytes - 1, '\xff') + '\x7f'),
      "57896044618658097711785492504343953926634992332820282019728792003956564819967");  // 2^255-1
  std::string huge(1 << 20, '\0');
  huge.back() = '\x80';  // -(2^(8n-1))
  std::string text = TwosComplementToDecimal(huge);
  EXPECT_EQ(text.substr(0, 5), "-0x80");
  EXPECT_EQ(text.size(), 3 + 2 * huge.size());
  EXPECT_EQ(text.find_first_not_of('0', 5), std::string::npos);
}

}  // namespace
}  // namespace ckpt::pickle
