#include "pickle/parser.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "base/checked.h"
#include "pickle/opcodes.h"
#include "pickle/text_codec.h"

namespace ckpt::pickle {

namespace {

class Parser {
 public:
  Parser(Bytes data, uint64_t base, const Limits& limits) : c_(data, base), limits_(limits) {
    // Text is copied out of the stream at most once per opcode: reserving the stream's size
    // (capped: a legacy file's span runs to its end) spares the doubling copies of a text of
    // many MiB. Pages never written stay address space, not memory.
    g_.strings.reserve(std::min<size_t>(data.size(), size_t{256} << 20));
  }

  ParseResult Run() {
    for (;;) {
      op_offset_ = c_.file_pos();
      uint8_t code = c_.ReadU8();
      if (code == op::kStop) break;
      Step(code);
    }
    NodeId root = Pop();
    ParseResult r;
    r.leftover = stack_.size() + marks_.size();
    r.graph = std::move(g_);
    r.graph.root = root;
    r.end = c_.pos();
    return r;
  }

 private:
  [[noreturn]] void Error(const std::string& what) {
    Fail("pickle offset {}: {}", op_offset_, what);
  }

  // ---- node creation: every new node goes through Track() for limits and depth ----
  NodeId Track(NodeId id) {
    if (g_.nodes.size() > limits_.max_nodes) {
      Error(fmt::format("more than {} objects (limit)", limits_.max_nodes));
    }
    depth_.push_back(1);
    return id;
  }
  NodeId NewNode(Kind kind) { return Track(g_.Add(kind, op_offset_)); }
  NodeId NewCompound(Kind kind) { return Track(g_.AddCompound(kind, op_offset_)); }
  Compound& C(NodeId id) { return g_.mutable_compound(id); }
  NodeId NewText(Kind kind, std::string_view text) {
    return Track(g_.AddText(kind, text, op_offset_));
  }
  NodeId NewInt(int64_t v) { return Track(g_.AddInt(v, op_offset_)); }
  NodeId NewGlobal(std::string_view module, std::string_view name) {
    if (module.empty() || name.empty()) Error("empty global name");
    if (module.find_first_of(std::string_view("\0\n", 2)) != std::string_view::npos ||
        name.find_first_of(std::string_view("\0\n", 2)) != std::string_view::npos) {
      Error("global name contains a NUL or newline");
    }
    return Track(g_.AddGlobal(module, name, op_offset_));
  }
  // A container made from `children`; its depth is one more than its deepest child.
  NodeId NewSequence(Kind kind, const std::vector<NodeId>& children) {
    if (kind == Kind::kDict && children.size() % 2) Error("DICT with an odd number of items");
    NodeId id = kind == Kind::kTuple ? Track(g_.AddTuple(children, op_offset_)) : NewCompound(kind);
    uint32_t depth = 0;
    for (NodeId ch : children) depth = std::max<uint32_t>(depth, depth_[ch]);
    SetDepth(id, depth + 1);
    if (kind == Kind::kDict) {
      g_.SetPairs(id, children);
    } else if (kind != Kind::kTuple) {
      g_.SetItems(id, children);
    }
    return id;
  }
  void SetDepth(NodeId id, uint32_t depth) {
    if (depth > limits_.max_depth) {
      Error(fmt::format("objects nested deeper than {} levels (limit)", limits_.max_depth));
    }
    depth_[id] = static_cast<uint16_t>(depth);
  }
  void Grow(NodeId target, NodeId child) {
    if (depth_[child] + 1u > depth_[target]) SetDepth(target, depth_[child] + 1u);
  }

  // ---- stack ----
  size_t FrameStart() const { return marks_.empty() ? 0 : marks_.back(); }
  void Push(NodeId id) { stack_.push_back(id); }
  NodeId Pop() {
    if (stack_.size() <= FrameStart()) Error("stack underflow");
    NodeId id = stack_.back();
    stack_.pop_back();
    return id;
  }
  NodeId Top() {
    if (stack_.size() <= FrameStart()) Error("stack underflow");
    return stack_.back();
  }
  std::vector<NodeId> PopMark() {
    if (marks_.empty()) Error("no MARK on the stack");
    size_t start = marks_.back();
    marks_.pop_back();
    std::vector<NodeId> items(stack_.begin() + static_cast<std::ptrdiff_t>(start), stack_.end());
    stack_.resize(start);
    return items;
  }

  // ---- memo ----
  // Picklers number memo entries 0, 1, 2... (MEMOIZE always does): those live in a vector
  // (4 bytes each; a hash map node costs ~30). A key far beyond the entries defined so far
  // goes to a map, so a hostile key cannot make the vector large.
  void Put(uint64_t index) {
    NodeId top = Top();
    if (index >= memo_dense_.size() && index < 2 * memo_count_ + 1024) {
      memo_dense_.resize(index + 1, kNil);
    }
    if (index < memo_dense_.size()) {
      NodeId& slot = memo_dense_[index];
      // A key put in the map before the vector reached it moves over.
      if (slot == kNil && !(!memo_sparse_.empty() && memo_sparse_.erase(index) == 1)) {
        CountMemoEntry();
      }
      slot = top;
      return;
    }
    auto [it, inserted] = memo_sparse_.try_emplace(index, top);
    if (inserted) {
      CountMemoEntry();
    } else {
      it->second = top;
    }
  }
  void CountMemoEntry() {
    if (memo_count_ >= limits_.max_memo) {
      Error(fmt::format("memo has more than {} entries (limit)", limits_.max_memo));
    }
    ++memo_count_;
  }
  void Get(uint64_t index) {
    NodeId value = kNil;
    if (index < memo_dense_.size() && memo_dense_[index] != kNil) {
      value = memo_dense_[index];
    } else if (auto it = memo_sparse_.find(index); it != memo_sparse_.end()) {
      value = it->second;
    }
    if (value == kNil) Error(fmt::format("memo key {} is not defined", index));
    Push(value);
  }

  // ---- helpers ----
  uint64_t ParseDecimal(std::string_view s) {
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size())
      Error("bad decimal '" + std::string(s) + "'");
    return v;
  }
  // INT as CPython's unpickler reads it (_pickle.c load_int): C's strtol with base 0, so
  // "010" is 8 and "0x10" is 16; two characters that say 0 or 1 ("00", "01", "+1") are the
  // protocol-0 spelling of False and True; past a long, Python's int().
  NodeId IntOpcode(std::string_view s) {
    std::string text(s);
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 0);
    if (errno == 0 && end != text.c_str() && *end == '\0') {
      if (s.size() == 2 && (v == 0 || v == 1)) return NewBool(v == 1);
      return NewInt(v);
    }
    return IntFromText(s);
  }
  NodeId IntFromText(std::string_view s) {
    while (!s.empty() && (s.back() == 'L' || s.back() == ' ' || s.back() == '\r')) {
      s.remove_suffix(1);
    }
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size()) return NewInt(v);
    // One sign at most ("+5", "-5"; "++5" is no int, as for Python's int()).
    std::string le;
    if (!DecimalToTwosComplement(s, le))
      Error("bad integer '" + std::string(s.substr(0, 40)) + "'");
    // A value that fits in 64 bits is an int whatever its spelling, as LONG1 gives it.
    if (le.size() <= 8) return IntFromBytes(AsBytes(le));
    return NewText(Kind::kBigInt, le);
  }
  NodeId IntFromBytes(Bytes b) {
    if (b.size() <= 8) {
      uint64_t u = 0;
      for (size_t i = 0; i < b.size(); ++i) u |= static_cast<uint64_t>(b[i]) << (8 * i);
      if (!b.empty() && b.size() < 8 && (b.back() & 0x80)) u |= ~0ULL << (8 * b.size());
      return NewInt(static_cast<int64_t>(u));
    }
    return NewText(Kind::kBigInt, AsText(b));
  }
  NodeId NewFloat(double v) { return Track(g_.AddFloat(v, op_offset_)); }
  NodeId NewBool(bool v) { return Track(g_.AddBool(v, op_offset_)); }
  NodeId MakeObject(Construct how, NodeId callable, NodeId args, NodeId kwargs = kNil) {
    NodeId id = NewCompound(Kind::kObject);
    Compound& c = C(id);
    c.construct = how;
    c.callable = callable;
    c.args = args;
    c.kwargs = kwargs;
    uint32_t depth = std::max(depth_[callable], depth_[args]);
    if (kwargs != kNil) depth = std::max<uint32_t>(depth, depth_[kwargs]);
    SetDepth(id, depth + 1);
    return id;
  }
  uint64_t ReadSize(uint64_t n) {
    if (n > c_.remaining()) {
      Error(fmt::format("length {} is larger than the {} bytes left", n, c_.remaining()));
    }
    return n;
  }

  void Step(uint8_t code);

  // BUILD/SETITEM/APPEND applied to an imported object itself (a module, class or
  // function): a regular unpickler would modify it for the rest of the process.
  std::string Tampering(NodeId global) const {
    return fmt::format(
        "the imported object {}: a regular unpickler would modify it in place "
        "(monkey-patching); refused",
        g_.GlobalText(global));
  }

  // APPEND(S)/ADDITEMS/SETITEM(S): add values to the container (or object) on the stack top.
  void Extend(const char* opname, Kind container, bool pairs, std::vector<NodeId> values) {
    NodeId target = Top();
    Kind k = g_.kind(target);
    if (k == Kind::kGlobal) Error(fmt::format("{} on {}", opname, Tampering(target)));
    if (k != container && k != Kind::kObject) Error(fmt::format("{} on a {}", opname, KindName(k)));
    for (NodeId v : values) {
      if (pairs) {
        g_.ids.Push(g_.mutable_lists(target).pairs, v);
      } else {
        g_.AppendItem(target, v);
      }
      Grow(target, v);
    }
  }

  ByteCursor c_;
  Limits limits_;
  Graph g_;
  std::vector<NodeId> stack_;
  std::vector<size_t> marks_;
  std::vector<uint16_t> depth_;
  std::vector<NodeId> memo_dense_;                    // memo keys below its size
  std::unordered_map<uint64_t, NodeId> memo_sparse_;  // the others
  uint64_t memo_count_ = 0;                           // keys defined (what MEMOIZE uses)
  uint64_t op_offset_ = 0;
};

void Parser::Step(uint8_t code) {
  switch (code) {
    case op::kProto: {
      uint8_t v = c_.ReadU8();
      if (v > 5) Error(fmt::format("unsupported pickle protocol {}", v));
      g_.protocol = v;
      return;
    }
    case op::kFrame:
      ReadSize(c_.ReadLE<uint64_t>());
      return;
    case op::kMark:
      if (marks_.size() >= limits_.max_depth) {
        Error(fmt::format("more than {} nested MARKs (limit)", limits_.max_depth));
      }
      marks_.push_back(stack_.size());
      return;
    case op::kPop:
      if (stack_.size() > FrameStart()) {
        stack_.pop_back();
      } else {
        PopMark();
      }
      return;
    case op::kPopMark:
      PopMark();
      return;
    case op::kDup:
      Push(Top());
      return;

    case op::kNone:
      Push(NewNode(Kind::kNone));
      return;
    case op::kNewTrue:
      Push(NewBool(true));
      return;
    case op::kNewFalse:
      Push(NewBool(false));
      return;
    case op::kInt:
      Push(IntOpcode(c_.ReadLine()));
      return;
    case op::kLong:
      Push(IntFromText(c_.ReadLine()));
      return;
    case op::kBinInt:
      Push(NewInt(c_.ReadLE<int32_t>()));
      return;
    case op::kBinInt1:
      Push(NewInt(c_.ReadU8()));
      return;
    case op::kBinInt2:
      Push(NewInt(c_.ReadLE<uint16_t>()));
      return;
    case op::kLong1:
      Push(IntFromBytes(c_.Read(c_.ReadU8())));
      return;
    case op::kLong4: {
      int32_t n = c_.ReadLE<int32_t>();
      if (n < 0) Error("negative LONG4 length");
      Push(IntFromBytes(c_.Read(ReadSize(static_cast<uint64_t>(n)))));
      return;
    }
    case op::kFloat: {
      std::string s(c_.ReadLine());
      char* end = nullptr;
      double v = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size()) Error("bad float '" + s + "'");
      Push(NewFloat(v));
      return;
    }
    case op::kBinFloat:
      Push(NewFloat(std::bit_cast<double>(c_.ReadBE<uint64_t>())));
      return;

    case op::kString: {
      std::string out;
      if (!DecodeQuotedString(c_.ReadLine(), out)) Error("bad STRING literal");
      Push(NewText(Kind::kStr, out));
      return;
    }
    case op::kBinString: {
      int32_t n = c_.ReadLE<int32_t>();
      if (n < 0) Error("negative BINSTRING length");
      Push(NewText(Kind::kStr, c_.ReadText(ReadSize(static_cast<uint64_t>(n)))));
      return;
    }
    case op::kShortBinString:
      Push(NewText(Kind::kStr, c_.ReadText(c_.ReadU8())));
      return;
    case op::kUnicode: {
      std::string out;
      DecodeRawUnicodeEscape(c_.ReadLine(), out);
      Push(NewText(Kind::kStr, out));
      return;
    }
    case op::kBinUnicode:
      Push(NewText(Kind::kStr, c_.ReadText(ReadSize(c_.ReadLE<uint32_t>()))));
      return;
    case op::kShortBinUnicode:
      Push(NewText(Kind::kStr, c_.ReadText(c_.ReadU8())));
      return;
    case op::kBinUnicode8:
      Push(NewText(Kind::kStr, c_.ReadText(ReadSize(c_.ReadLE<uint64_t>()))));
      return;
    case op::kBinBytes:
      Push(NewText(Kind::kBytes, c_.ReadText(ReadSize(c_.ReadLE<uint32_t>()))));
      return;
    case op::kShortBinBytes:
      Push(NewText(Kind::kBytes, c_.ReadText(c_.ReadU8())));
      return;
    case op::kBinBytes8:
      Push(NewText(Kind::kBytes, c_.ReadText(ReadSize(c_.ReadLE<uint64_t>()))));
      return;
    case op::kByteArray8:
      Push(NewText(Kind::kByteArray, c_.ReadText(ReadSize(c_.ReadLE<uint64_t>()))));
      return;

    case op::kEmptyTuple:
      Push(NewSequence(Kind::kTuple, {}));
      return;
    case op::kTuple:
      Push(NewSequence(Kind::kTuple, PopMark()));
      return;
    case op::kTuple1: {
      NodeId a = Pop();
      Push(NewSequence(Kind::kTuple, {a}));
      return;
    }
    case op::kTuple2: {
      NodeId b = Pop(), a = Pop();
      Push(NewSequence(Kind::kTuple, {a, b}));
      return;
    }
    case op::kTuple3: {
      NodeId cc = Pop(), b = Pop(), a = Pop();
      Push(NewSequence(Kind::kTuple, {a, b, cc}));
      return;
    }
    case op::kEmptyList:
      Push(NewSequence(Kind::kList, {}));
      return;
    case op::kList:
      Push(NewSequence(Kind::kList, PopMark()));
      return;
    case op::kEmptyDict:
      Push(NewSequence(Kind::kDict, {}));
      return;
    case op::kDict:
      Push(NewSequence(Kind::kDict, PopMark()));
      return;
    case op::kEmptySet:
      Push(NewSequence(Kind::kSet, {}));
      return;
    case op::kFrozenSet:
      Push(NewSequence(Kind::kFrozenSet, PopMark()));
      return;

    case op::kAppend:
      Extend("APPEND", Kind::kList, false, {Pop()});
      return;
    case op::kAppends:
      Extend("APPENDS", Kind::kList, false, PopMark());
      return;
    case op::kAddItems:
      Extend("ADDITEMS", Kind::kSet, false, PopMark());
      return;
    case op::kSetItem: {
      NodeId v = Pop(), k = Pop();
      Extend("SETITEM", Kind::kDict, true, {k, v});
      return;
    }
    case op::kSetItems: {
      std::vector<NodeId> kvs = PopMark();
      if (kvs.size() % 2) Error("SETITEMS with an odd number of items");
      Extend("SETITEMS", Kind::kDict, true, std::move(kvs));
      return;
    }

    case op::kGlobal: {
      std::string module(c_.ReadLine());
      std::string name(c_.ReadLine());
      Push(NewGlobal(module, name));
      return;
    }
    case op::kStackGlobal: {
      NodeId name = Pop(), module = Pop();
      if (g_.kind(name) != Kind::kStr || g_.kind(module) != Kind::kStr) {
        Error("STACK_GLOBAL needs two strings");
      }
      Push(NewGlobal(g_.text(module), g_.text(name)));
      return;
    }
    case op::kReduce: {
      NodeId args = Pop(), fn = Pop();
      Push(MakeObject(Construct::kReduce, fn, args));
      return;
    }
    case op::kNewObj: {
      NodeId args = Pop(), cls = Pop();
      Push(MakeObject(Construct::kNewObj, cls, args));
      return;
    }
    case op::kNewObjEx: {
      NodeId kwargs = Pop(), args = Pop(), cls = Pop();
      Push(MakeObject(Construct::kNewObjEx, cls, args, kwargs));
      return;
    }
    case op::kInst: {
      std::string module(c_.ReadLine());
      std::string name(c_.ReadLine());
      std::vector<NodeId> args = PopMark();
      NodeId cls = NewGlobal(module, name);
      Push(MakeObject(Construct::kInst, cls, NewSequence(Kind::kTuple, std::move(args))));
      return;
    }
    case op::kObj: {
      std::vector<NodeId> items = PopMark();
      if (items.empty()) Error("OBJ without a class");
      NodeId cls = items.front();
      items.erase(items.begin());
      Push(MakeObject(Construct::kInst, cls, NewSequence(Kind::kTuple, std::move(items))));
      return;
    }
    case op::kBuild: {
      NodeId state = Pop();
      NodeId target = Top();
      if (g_.kind(target) == Kind::kGlobal) Error("BUILD on " + Tampering(target));
      if (g_.kind(target) != Kind::kObject) {
        Error(fmt::format("BUILD on a {}", KindName(g_.kind(target))));
      }
      g_.AppendState(target, state);
      Grow(target, state);
      return;
    }
    case op::kPersId: {
      NodeId pid = NewText(Kind::kStr, c_.ReadLine());
      NodeId id = NewCompound(Kind::kPersId);
      C(id).args = pid;
      Push(id);
      return;
    }
    case op::kBinPersId: {
      NodeId pid = Pop();
      NodeId id = NewCompound(Kind::kPersId);
      C(id).args = pid;
      SetDepth(id, depth_[pid] + 1u);
      Push(id);
      return;
    }

    case op::kPut:
      Put(ParseDecimal(c_.ReadLine()));
      return;
    case op::kBinPut:
      Put(c_.ReadU8());
      return;
    case op::kLongBinPut:
      Put(c_.ReadLE<uint32_t>());
      return;
    case op::kMemoize:
      Put(memo_count_);
      return;
    case op::kGet:
      Get(ParseDecimal(c_.ReadLine()));
      return;
    case op::kBinGet:
      Get(c_.ReadU8());
      return;
    case op::kLongBinGet:
      Get(c_.ReadLE<uint32_t>());
      return;

    case op::kExt1:
    case op::kExt2:
    case op::kExt4:
      Error("EXT opcodes refer to Python's copyreg extension registry and are not supported");
    case op::kNextBuffer:
    case op::kReadOnlyBuffer:
      Error("out-of-band buffers (protocol 5 NEXT_BUFFER) are not supported");
    default:
      Error(fmt::format("unknown opcode 0x{:02x}", code));
  }
}

}  // namespace

ParseResult Parse(Bytes data, uint64_t base_offset, const Limits& limits) {
  return Parser(data, base_offset, limits).Run();
}

}  // namespace ckpt::pickle
