// The places where a straight reading of a pickle and CPython's C unpickler (what torch.load
// runs) could differ, each pinned to _pickle.c's behaviour (docs/pickle-parity.md). The
// differential fuzz target (fuzz/fuzz_pickle_parity.cpp) checks the same against CPython
// itself; these cases name each rule.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "pickle/parser.h"
#include "pickle/text_codec.h"
#include "test_util.h"
#include "torch/global_policy.h"
#include "torch/pickle_read.h"

namespace ckpt::pickle {
namespace {

using test::B;
using namespace std::string_literals;

std::string Frame(uint64_t n) {
  std::string s = "\x95";
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  return s;
}

std::string U32(uint32_t n) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  return s;
}

// The globals a reading imports, "module.name" in order.
std::string Globals(const Graph& g) {
  std::string out;
  for (NodeId id = 0; id < g.nodes.size(); ++id) {
    if (g.kind(id) == Kind::kGlobal) out += (out.empty() ? "" : " ") + g.GlobalText(id);
  }
  return out;
}

PartialParse Read(const std::string& s, FrameMode mode) {
  return ParsePartial(B(s), 0, {}, Reading{mode, false});
}

// A BINBYTES whose 4-byte length starts inside a 2-byte frame: _pickle.c drops the frame's
// rest and reads the length from after it, so the "bytes" hold opcodes torch.load runs.
const std::string kHiddenCall = [] {
  std::string call = "cbuiltins\nprint\nX\x02\x00\x00\x00hi\x85R."s;
  std::string s = "\x80\x04" + Frame(2) + "B" + "\x10";  // 'B' + 1 byte of its length in the frame
  s += U32(0) + call;  // straight: length 0x10 + ..., torch: length 0 then the call
  return s;
}();

TEST(PickleParity, AFrameEndingInsideAReadIsRefused) {
  PartialParse strict = Read(kHiddenCall, FrameMode::kStrict);
  EXPECT_TRUE(strict.diverged);
  EXPECT_NE(strict.error.find("a FRAME ends 1 byte into a 4-byte read"), std::string::npos)
      << strict.error;
  // Read as _pickle.c reads io.BytesIO: the frame's rest dropped, the call seen.
  PartialParse torch = Read(kHiddenCall, FrameMode::kBytesIO);
  EXPECT_EQ(Globals(torch.result.graph), "builtins.print") << torch.error;
  // The refusal names it.
  try {
    torch::ParseTorchPickle(B(kHiddenCall), 0);
    FAIL() << "not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Read as torch.load reads it, the pickle imports "
                                         "builtins.print, calls builtins.print"),
              std::string::npos)
        << e.what();
  }
}

TEST(PickleParity, AGlobalLineStraddlingAFrameEnd) {
  // FRAME 4 holds "cmac"; _pickle.c drops "mac" and reads the module line from the file.
  std::string s = "\x80\x04" + Frame(4) + "cmac" + "builtins\nprint\n.";
  EXPECT_TRUE(Read(s, FrameMode::kStrict).diverged);
  EXPECT_EQ(Globals(Read(s, FrameMode::kBytesIO).result.graph), "builtins.print");
  EXPECT_EQ(Globals(Read(s, FrameMode::kStraight).result.graph), "macbuiltins.print");
}

TEST(PickleParity, BytesDataMayRunPastAFrameButIsMarked) {
  // _Unpickler_ReadInto takes the frame's rest then the file: the same bytes as a straight
  // reading; no pickler writes it, so it is an anomaly (reported as a problem).
  std::string s = "\x80\x04" + Frame(5) + "B" + U32(3) + "abc.";
  PartialParse p = Read(s, FrameMode::kStrict);
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.result.graph.text(p.result.graph.root), "abc");
  ASSERT_EQ(p.result.anomalies.size(), 1u);
  EXPECT_NE(p.result.anomalies[0].find("between it and its 3 bytes of data"), std::string::npos);
}

TEST(PickleParity, FramesThatFitAreTransparent) {
  std::string body = "X\x02\x00\x00\x00hi."s;
  std::string s = "\x80\x04" + Frame(body.size()) + body;
  for (FrameMode m : {FrameMode::kStrict, FrameMode::kStraight, FrameMode::kBytesIO}) {
    PartialParse p = Read(s, m);
    ASSERT_TRUE(p.error.empty()) << p.error;
    EXPECT_EQ(p.result.graph.text(p.result.graph.root), "hi");
    EXPECT_TRUE(p.result.anomalies.empty());
    EXPECT_EQ(p.result.frame_rest, 0u);
  }
}

TEST(PickleParity, AFrameInsideAFrameIsRefused) {
  std::string s = "\x80\x04" + Frame(12) + "N" + Frame(1) + "0" + "N.";
  EXPECT_TRUE(Read(s, FrameMode::kStrict).diverged);
}

TEST(PickleParity, AFrameRunningPastStopIsReported) {
  std::string s = "\x80\x04" + Frame(4) + "N.NN";
  PartialParse p = Read(s, FrameMode::kStrict);
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.result.frame_rest, 2u);
}

TEST(PickleParity, ProtocolZeroTextFollowsCPython) {
  auto root_int = [](const std::string& s) {
    Graph g = Parse(B(s)).graph;
    return g.kind(g.root) == Kind::kInt ? g.at(g.root).integer : -999;
  };
  EXPECT_EQ(root_int("I1_000\n."), 1000);     // strtol stops at '_': PyLong_FromString reads it
  EXPECT_EQ(root_int("L0x10L\n."), 16);       // base 0
  EXPECT_EQ(root_int("I 7 \n."), 7);          // strtol fails on the trailing space: int() takes it
  EXPECT_THROW(Parse(B("L010L\n.")), Error);  // no leading zeros in Python
  EXPECT_THROW(Parse(B("L5LL\n.")), Error);   // one 'L' is dropped, not two
  // Memo keys: PyLong_FromString(base 10) with whitespace and underscores; GET of a negative
  // key, and a negative PUT, fail.
  Graph g = Parse(B("Np 1_0 \n0g10\n.")).graph;
  EXPECT_EQ(g.kind(g.root), Kind::kNone);
  EXPECT_THROW(Parse(B("Np-1\n.")), Error);
  EXPECT_THROW(Parse(B("Np0x1\n.")), Error);
  // FLOAT: Python's syntax, no hex, no whitespace; overflow fails, underflow is zero.
  EXPECT_DOUBLE_EQ(Parse(B("F1e-400\n.")).graph.at(0).real, 0.0);
  EXPECT_THROW(Parse(B("F1e400\n.")), Error);
  EXPECT_THROW(Parse(B("F0x1p3\n.")), Error);
  EXPECT_THROW(Parse(B("F 1.5\n.")), Error);
  EXPECT_TRUE(std::isinf(Parse(B("F-Infinity\n.")).graph.at(0).real));
  // Text cut at a NUL, as a C string.
  EXPECT_EQ(root_int("I12\0junk\n."s), 12);
  // An empty line is bad_readline.
  EXPECT_THROW(Parse(B("I\n.")), Error);
  EXPECT_THROW(Parse(B("c\nprint\n.")), Error);
}

TEST(PickleParity, TextDecodingFollowsCPython) {
  std::string out;
  // raw-unicode-escape: \u only after an odd run of backslashes; a truncated escape fails.
  ASSERT_TRUE(DecodeRawUnicodeEscape("a\\u00e9", out));
  EXPECT_EQ(out, "a\xc3\xa9");
  ASSERT_TRUE(DecodeRawUnicodeEscape("\\\\u00e9", out));
  EXPECT_EQ(out, "\\\\u00e9");
  EXPECT_FALSE(DecodeRawUnicodeEscape("\\u00e", out));
  EXPECT_FALSE(DecodeRawUnicodeEscape("\\U00110000", out));
  // GLOBAL names are strict UTF-8, INST names and PERSID ASCII; BINUNICODE allows surrogates.
  EXPECT_THROW(Parse(B("cbuilt\xffins\nprint\n.")), Error);
  EXPECT_THROW(Parse(B("(ibuilt\xc3\xa9ins\nprint\n.")), Error);
  EXPECT_NO_THROW(Parse(B("X\x03\x00\x00\x00\xed\xa0\x80."s)));
  EXPECT_THROW(Parse(B("X\x01\x00\x00\x00\xff."s)), Error);
  // 8-bit strings are decoded as torch.load asks (encoding='utf-8', strict).
  EXPECT_THROW(Parse(B("U\x01\xff.")), Error);
}

TEST(PickleParity, UnhashableKeysFailAsInCPython) {
  EXPECT_THROW(Parse(B("\x80\x02}q\x00h\x00Ns."s)), Error);       // a dict keyed by itself
  EXPECT_THROW(Parse(B("\x80\x04\x8f\x94(h\x00\x90."s)), Error);  // a set holding itself
  EXPECT_THROW(Parse(B("\x80\x02}]\x85Ns."s)), Error);            // a tuple holding a list
  EXPECT_NO_THROW(Parse(B("\x80\x02}K\x01K\x02\x86Ns."s)));       // a tuple of ints is fine
}

TEST(PickleParity, ReadOnlyBufferKeepsBytesAndRefusesTheRest) {
  // load_readonly_buffer: a memoryview of the top object. Bytes and bytearrays have one (the
  // fuzzer found a reading that refused READONLY_BUFFER where CPython goes on).
  Graph g = Parse(B("\x80\x05"
                    "C\x02hi\x98\x85."s))
                .graph;
  ASSERT_EQ(g.kind(g.root), Kind::kTuple);
  EXPECT_NO_THROW(Parse(B("\x80\x05\x96\x02\x00\x00\x00\x00\x00\x00\x00hi\x98."s)));
  EXPECT_THROW(Parse(B("\x80\x05K\x01\x98."s)), Error);  // memoryview(1) raises
  EXPECT_THROW(Parse(B("\x80\x05\x98."s)), Error);       // stack underflow
  EXPECT_THROW(Parse(B("\x80\x05"
                       "C\x02hi\x97."s)),
               Error);  // NEXT_BUFFER: no buffers given
}

TEST(PickleParity, EmptyExtendsAndNoneBuildsAreNoOps) {
  // _pickle.c returns before looking at the target when there is nothing to add, and BUILD
  // with None changes nothing on a value without __setstate__.
  EXPECT_NO_THROW(Parse(B("cos\nsystem\n(e.")));
  EXPECT_NO_THROW(Parse(B("\x80\x02K\x01Nb.")));
  EXPECT_THROW(Parse(B("cos\nsystem\n(K\x01"
                       "e."s)),
               Error);  // modifying an import: refused
}

TEST(PickleParity, AnomaliesNoPicklerWrites) {
  PartialParse p = Read("\x80\x02N\x80\x02.", FrameMode::kStrict);
  ASSERT_TRUE(p.error.empty());
  ASSERT_EQ(p.result.anomalies.size(), 1u);
  EXPECT_NE(p.result.anomalies[0].find("a PROTO opcode after the first"), std::string::npos);
  // A list holding itself once is ordinary data; again and again, an expansion attack.
  EXPECT_TRUE(Read("\x80\x02]\x94h\x00"
                   "a."s,
                   FrameMode::kStrict)
                  .result.anomalies.empty());
  EXPECT_EQ(Read("\x80\x02]\x94h\x00"
                 "ah\x00"
                 "a."s,
                 FrameMode::kStrict)
                .result.anomalies.size(),
            1u);
}

TEST(PickleParity, APatchIsAppliedToSeeWhereItLeads) {
  // BUILD sets torch._utils._rebuild_tensor = 'builtins', then 'eval'; a later STACK_GLOBAL of
  // that attribute yields the string, and STACK_GLOBAL('builtins', 'eval') is the import.
  auto u = [](const std::string& text) {  // SHORT_BINUNICODE
    return "\x8c"s + static_cast<char>(text.size()) + text;
  };
  std::string s = "\x80\x04"s + u("torch._utils") + "\x94" + u("_rebuild_tensor") + "\x94" +
                  u("torch") + u("_utils") + "\x93\x94" +  // memo 2: the module torch._utils
                  "}h\x01" + u("builtins") + "sb0" +       // BUILD: _rebuild_tensor = 'builtins'
                  "h\x00h\x01\x93"s +                      // STACK_GLOBAL: 'builtins'
                  "h\x02}h\x01" + u("eval") + "sb0" +      // BUILD: _rebuild_tensor = 'eval'
                  "h\x00h\x01\x93\x93"s +                  // 'eval'; STACK_GLOBAL(builtins, eval)
                  "X\x04\x00\x00\x00"
                  "code\x85R.";
  PartialParse refused = Read(s, FrameMode::kStrict);
  EXPECT_TRUE(refused.patched);
  PartialParse applied = ParsePartial(B(s), 0, {}, Reading{FrameMode::kStrict, true});
  EXPECT_EQ(Globals(applied.result.graph), "torch._utils builtins.eval") << applied.error;
}

}  // namespace
}  // namespace ckpt::pickle
