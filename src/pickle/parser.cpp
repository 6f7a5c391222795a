#include "pickle/parser.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "base/checked.h"
#include "base/utf8.h"
#include "pickle/opcodes.h"
#include "pickle/text_codec.h"

namespace ckpt::pickle {

namespace {

class Parser {
 public:
  Parser(Bytes data, uint64_t base, const Limits& limits, const Reading& reading)
      : r_(data, base, reading.frames), limits_(limits), apply_patches_(reading.apply_patches) {
    // Text is copied out of the stream at most once per opcode: reserving the stream's size
    // (capped: a legacy file's span runs to its end) spares the doubling copies of a text of
    // many MiB. Pages never written stay address space, not memory.
    g_.strings.reserve(std::min<size_t>(data.size(), size_t{256} << 20));
  }

  PartialParse Run() {
    PartialParse out;
    try {
      for (;;) {
        op_offset_ = r_.file_pos();
        r_.BeginOpcode();
        ++opcodes_;
        uint8_t code = r_.ReadU8();
        if (code == op::kStop) break;
        Step(code);
      }
      NodeId root = Pop();
      out.result.leftover = stack_.size() + marks_.size();
      out.result.frame_rest = r_.frame_left();
      out.result.graph.root = root;
    } catch (const FrameDivergence& e) {
      out.error = e.what();
      out.diverged = true;
    } catch (const Tampered& e) {
      out.error = e.what();
      out.patched = true;
    } catch (const ckpt::Error& e) {
      out.error = e.what();
    }
    out.result.anomalies = std::move(anomalies_);
    out.result.max_memo_key = max_memo_key_;
    for (std::string& a : r_.anomalies()) out.result.anomalies.push_back(std::move(a));
    NodeId root = out.result.graph.root;
    out.result.graph = std::move(g_);
    out.result.graph.root = root;
    out.result.end = r_.pos();
    return out;
  }

 private:
  [[noreturn]] void Error(const std::string& what) {
    Fail("pickle offset {}: {}", op_offset_, what);
  }
  // Modifying an imported object: refused, or applied in the apply_patches reading.
  class Tampered : public ckpt::Error {
   public:
    using ckpt::Error::Error;
  };
  [[noreturn]] void Refuse(const std::string& what) {
    throw Tampered(fmt::format("pickle offset {}: {}", op_offset_, what));
  }
  void Anomaly(const std::string& what) {
    if (anomalies_.size() < 16)
      anomalies_.push_back(fmt::format("pickle offset {}: {}", op_offset_, what));
  }

  // ---- node creation: every new node goes through Track() for limits and depth ----
  NodeId Track(NodeId id) {
    if (g_.nodes.size() > limits_.max_nodes) {
      Error(fmt::format("more than {} objects (limit)", limits_.max_nodes));
    }
    depth_.push_back(1);
    unhashable_.push_back(0);
    return id;
  }
  NodeId NewNode(Kind kind) { return Track(g_.Add(kind, op_offset_)); }
  NodeId NewCompound(Kind kind) { return Track(g_.AddCompound(kind, op_offset_)); }
  Compound& C(NodeId id) { return g_.mutable_compound(id); }
  static std::string_view Text(Bytes b) { return AsText(b); }
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
    if (kind == Kind::kDict) {
      for (size_t i = 0; i < children.size(); i += 2) NeedHashable(children[i], "DICT key");
    } else if (kind == Kind::kFrozenSet) {
      for (NodeId ch : children) NeedHashable(ch, "FROZENSET item");
    }
    NodeId id = kind == Kind::kTuple ? Track(g_.AddTuple(children, op_offset_)) : NewCompound(kind);
    // Python's hash: lists, dicts, sets and bytearrays have none; a tuple has one when all its
    // items do. (Objects of other classes are assumed hashable: their class decides.)
    if (kind == Kind::kList || kind == Kind::kDict || kind == Kind::kSet) {
      unhashable_[id] = 1;
    } else if (kind == Kind::kTuple) {
      for (NodeId ch : children) unhashable_[id] |= unhashable_[ch];
    }
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
    max_memo_key_ = std::max(max_memo_key_, index);
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
  // A line of a protocol-0 opcode: _pickle.c refuses an empty one (bad_readline).
  std::string_view Line() {
    std::string_view line = r_.ReadLine();
    if (line.empty()) Error("empty line where a value was expected (pickle data was truncated)");
    return line;
  }
  // INT (_pickle.c load_int): C's strtol(s, &end, 0) when it takes the whole line, where a
  // two-character line of value 0 or 1 ("00", "01", " 1") is the protocol-0 bool; else
  // PyLong_FromString(s, NULL, 0).
  NodeId IntOpcode(std::string_view line) {
    int64_t v = 0;
    if (CStrtol(line, v)) {
      if (line.size() == 2 && (v == 0 || v == 1)) return NewBool(v == 1);
      return NewInt(v);
    }
    return PyLong(CString(line), 0, "INT");
  }
  NodeId PyLong(std::string_view text, int base, const char* opname) {
    std::string le;
    if (!PyLongFromString(text, base, le)) {
      Error(fmt::format("{} argument '{}' is not an integer as Python reads it", opname,
                        text.substr(0, 40)));
    }
    return IntFromBytes(AsBytes(le));
  }
  // PUT and GET (_pickle.c load_put, load_get): PyLong_FromString(s, NULL, 10), then
  // PyLong_AsSsize_t.
  uint64_t MemoKey(std::string_view line, const char* opname) {
    std::string le;
    if (!PyLongFromString(CString(line), 10, le) || le.size() > 8) {
      Error(fmt::format("{} argument '{}' is not a memo index", opname, line.substr(0, 40)));
    }
    uint64_t u = 0;
    for (size_t i = 0; i < le.size(); ++i)
      u |= static_cast<uint64_t>(static_cast<uint8_t>(le[i])) << (8 * i);
    if (!le.empty() && (le.back() & 0x80)) {
      Error(fmt::format("negative {} argument", opname));
    }
    return u;
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
    if (n > r_.remaining()) {
      Error(fmt::format("length {} is larger than the {} bytes left", n, r_.remaining()));
    }
    return n;
  }
  // Text of a str: BINUNICODE and friends are decoded as UTF-8 with "surrogatepass";
  // STRING/BINSTRING as torch.load's encoding="utf-8" (strict).
  std::string_view Unicode(std::string_view text) {
    if (!ValidUtf8SurrogatePass(text)) Error("string is not UTF-8 (_pickle.c fails to decode it)");
    return text;
  }
  std::string_view Utf8(std::string_view text) {
    if (!ValidUtf8(text)) {
      Error("8-bit string is not UTF-8: torch.load (encoding='utf-8') fails to decode it");
    }
    return text;
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
  // _pickle.c hashes dict keys and set items (PyDict_SetItem, PySet_Add): an unhashable one
  // raises TypeError there.
  void NeedHashable(NodeId id, const char* what) {
    if (unhashable_[id]) {
      Error(fmt::format("{} is an unhashable {}: torch.load fails here (TypeError)", what,
                        KindName(g_.kind(id))));
    }
  }
  // A module, class or function named `module.name`, or, in the apply_patches reading, the
  // value an earlier BUILD on that module set as that attribute.
  NodeId Resolve(std::string_view module, std::string_view name) {
    if (!patches_.empty()) {
      auto it = patches_.find(fmt::format("{}.{}", module, name));
      if (it != patches_.end()) return it->second;
    }
    return NewGlobal(module, name);
  }
  // BUILD on an imported object, applied as _pickle.c's load_build does without __setstate__:
  // a dict state (or the slot state of a (state, slotstate) pair) sets attributes.
  void ApplyPatch(NodeId global, NodeId state) {
    std::string prefix = g_.GlobalText(global);
    auto apply = [&](NodeId dict) {
      if (dict == kNil || g_.kind(dict) != Kind::kDict) return;
      const auto& p = g_.pairs(dict);
      for (size_t i = 0; i + 1 < p.size(); i += 2) {
        if (g_.kind(p[i]) == Kind::kStr)
          patches_[prefix + "." + std::string(g_.text(p[i]))] = p[i + 1];
      }
    };
    if (g_.kind(state) == Kind::kTuple && g_.items(state).size() == 2) {
      apply(g_.items(state)[0]);
      apply(g_.items(state)[1]);
    } else {
      apply(state);
    }
  }

  // APPEND(S)/ADDITEMS/SETITEM(S): add values to the container (or object) on the stack top.
  void Extend(const char* opname, Kind container, bool pairs, std::vector<NodeId> values) {
    NodeId target = Top();
    if (values.empty()) return;  // _pickle.c do_append/do_setitems/load_additems: nothing to do
    Kind k = g_.kind(target);
    if (k == Kind::kGlobal) Refuse(fmt::format("{} on {}", opname, Tampering(target)));
    if (k != container && k != Kind::kObject) Error(fmt::format("{} on a {}", opname, KindName(k)));
    for (size_t i = 0; i < values.size(); ++i) {
      NodeId v = values[i];
      if (k == Kind::kDict && i % 2 == 0) NeedHashable(v, "dict key");
      if (k == Kind::kSet) NeedHashable(v, "set item");
      // One reference cycle is ordinary Python data; a container holding itself again and
      // again is the shape of a memory-expansion attack on code that walks the result.
      if (v == target && (k == Kind::kList || k == Kind::kDict) && ++self_refs_[target] == 2) {
        Anomaly(
            fmt::format("a {} that holds itself more than once: the shape of a memory-"
                        "expansion attack on code that walks the object; no state dict has one",
                        KindName(k)));
      }
      if (pairs) {
        g_.ids.Push(g_.mutable_lists(target).pairs, v);
      } else {
        g_.AppendItem(target, v);
      }
      Grow(target, v);
    }
  }

  StreamReader r_;
  Limits limits_;
  Graph g_;
  std::vector<NodeId> stack_;
  std::vector<size_t> marks_;
  std::vector<uint16_t> depth_;
  std::vector<uint8_t> unhashable_;  // per node: Python could not hash it
  bool apply_patches_ = false;
  std::unordered_map<std::string, NodeId> patches_;  // "module.attr" -> value BUILD set
  std::vector<std::string> anomalies_;
  std::unordered_map<NodeId, uint32_t> self_refs_;  // containers that hold themselves
  uint64_t opcodes_ = 0;
  uint64_t max_memo_key_ = 0;
  std::vector<NodeId> memo_dense_;                    // memo keys below its size
  std::unordered_map<uint64_t, NodeId> memo_sparse_;  // the others
  uint64_t memo_count_ = 0;                           // keys defined (what MEMOIZE uses)
  uint64_t op_offset_ = 0;
};

void Parser::Step(uint8_t code) {
  switch (code) {
    case op::kProto: {
      if (opcodes_ > 1) Anomaly("a PROTO opcode after the first opcode: no pickler writes one");
      uint8_t v = r_.ReadU8();
      if (v > 5) Error(fmt::format("unsupported pickle protocol {}", v));
      g_.protocol = v;
      return;
    }
    case op::kFrame: {
      uint64_t n = r_.ReadLE<uint64_t>();
      if (n > static_cast<uint64_t>(INT64_MAX)) Error("FRAME length exceeds the maximum");
      r_.StartFrame(n);
      return;
    }
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
      Push(IntOpcode(Line()));
      return;
    case op::kLong: {
      // _pickle.c load_long: one 'L' before the newline is dropped, then base-0 int().
      std::string_view line = Line();
      if (line.back() == 'L') line.remove_suffix(1);
      Push(PyLong(CString(line), 0, "LONG"));
      return;
    }
    case op::kBinInt:
      Push(NewInt(r_.ReadLE<int32_t>()));
      return;
    case op::kBinInt1:
      Push(NewInt(r_.ReadU8()));
      return;
    case op::kBinInt2:
      Push(NewInt(r_.ReadLE<uint16_t>()));
      return;
    case op::kLong1:
      Push(IntFromBytes(r_.Read(r_.ReadU8())));
      return;
    case op::kLong4: {
      int32_t n = r_.ReadLE<int32_t>();
      if (n < 0) Error("negative LONG4 length");
      Push(IntFromBytes(r_.Read(ReadSize(static_cast<uint64_t>(n)))));
      return;
    }
    case op::kFloat: {
      std::string_view line = Line();
      double v = 0;
      if (!PyStringToDouble(line, v)) {
        Error(fmt::format("bad FLOAT '{}' (_pickle.c fails on it)", line.substr(0, 40)));
      }
      Push(NewFloat(v));
      return;
    }
    case op::kBinFloat:
      Push(NewFloat(std::bit_cast<double>(r_.ReadBE<uint64_t>())));
      return;

    case op::kString: {
      std::string out;
      if (!DecodeQuotedString(r_.ReadLine(), out)) Error("bad STRING literal");
      Push(NewText(Kind::kStr, Utf8(out)));
      return;
    }
    case op::kBinString: {
      int32_t n = r_.ReadLE<int32_t>();
      if (n < 0) Error("negative BINSTRING length");
      Push(NewText(Kind::kStr, Utf8(Text(r_.Read(ReadSize(static_cast<uint64_t>(n)))))));
      return;
    }
    case op::kShortBinString:
      Push(NewText(Kind::kStr, Utf8(Text(r_.Read(r_.ReadU8())))));
      return;
    case op::kUnicode: {
      std::string out;
      if (!DecodeRawUnicodeEscape(r_.ReadLine(), out)) {
        Error("UNICODE has a malformed \\u escape (_pickle.c fails on it)");
      }
      Push(NewText(Kind::kStr, out));
      return;
    }
    case op::kBinUnicode:
      Push(NewText(Kind::kStr, Unicode(Text(r_.Read(ReadSize(r_.ReadLE<uint32_t>()))))));
      return;
    case op::kShortBinUnicode:
      Push(NewText(Kind::kStr, Unicode(Text(r_.Read(r_.ReadU8())))));
      return;
    case op::kBinUnicode8:
      Push(NewText(Kind::kStr, Unicode(Text(r_.Read(ReadSize(r_.ReadLE<uint64_t>()))))));
      return;
    // The bytes payloads are read with _Unpickler_ReadInto (see stream_reader.h).
    case op::kBinBytes:
      Push(NewText(Kind::kBytes, Text(r_.ReadInto(ReadSize(r_.ReadLE<uint32_t>())))));
      return;
    case op::kShortBinBytes:
      Push(NewText(Kind::kBytes, Text(r_.ReadInto(r_.ReadU8()))));
      return;
    case op::kBinBytes8:
      Push(NewText(Kind::kBytes, Text(r_.ReadInto(ReadSize(r_.ReadLE<uint64_t>())))));
      return;
    case op::kByteArray8: {
      NodeId id = NewText(Kind::kByteArray, Text(r_.ReadInto(ReadSize(r_.ReadLE<uint64_t>()))));
      unhashable_[id] = 1;
      Push(id);
      return;
    }

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
      // _pickle.c load_global: two non-empty lines, each strict UTF-8.
      std::string module(Line());
      std::string name(Line());
      if (!ValidUtf8(module) || !ValidUtf8(name)) {
        Error("GLOBAL name is not UTF-8 (_pickle.c fails on it)");
      }
      Push(Resolve(module, name));
      return;
    }
    case op::kStackGlobal: {
      NodeId name = Pop(), module = Pop();
      if (g_.kind(name) != Kind::kStr || g_.kind(module) != Kind::kStr) {
        Error("STACK_GLOBAL needs two strings");
      }
      Push(Resolve(g_.text(module), g_.text(name)));
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
      // _pickle.c load_inst: the MARK first, then two non-empty ASCII lines.
      std::vector<NodeId> args = PopMark();
      std::string module(Line());
      std::string name(Line());
      if (!IsAscii(module) || !IsAscii(name))
        Error("INST name is not ASCII (_pickle.c fails on it)");
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
      if (g_.kind(target) == Kind::kGlobal) {
        if (!apply_patches_) Refuse("BUILD on " + Tampering(target));
        ApplyPatch(target, state);
        return;
      }
      // _pickle.c load_build: without __setstate__, a None state changes nothing; no value of
      // the built-in kinds has a __setstate__.
      if (g_.kind(target) != Kind::kObject && g_.kind(target) != Kind::kPersId &&
          g_.kind(state) == Kind::kNone) {
        return;
      }
      if (g_.kind(target) != Kind::kObject) {
        Error(fmt::format("BUILD on a {}", KindName(g_.kind(target))));
      }
      g_.AppendState(target, state);
      Grow(target, state);
      return;
    }
    case op::kPersId: {
      std::string_view text = r_.ReadLine();
      if (!IsAscii(text)) Error("persistent IDs in protocol 0 must be ASCII strings");
      NodeId pid = NewText(Kind::kStr, text);
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

    case op::kPut: {
      std::string_view line = Line();
      Top();  // _pickle.c checks the stack before the key
      Put(MemoKey(line, "PUT"));
      return;
    }
    case op::kBinPut:
      Put(r_.ReadU8());
      return;
    case op::kLongBinPut:
      Put(r_.ReadLE<uint32_t>());
      return;
    case op::kMemoize:
      Put(memo_count_);
      return;
    case op::kGet:
      Get(MemoKey(Line(), "GET"));
      return;
    case op::kBinGet:
      Get(r_.ReadU8());
      return;
    case op::kLongBinGet:
      Get(r_.ReadLE<uint32_t>());
      return;

    case op::kExt1:
    case op::kExt2:
    case op::kExt4:
      Error("EXT opcodes refer to Python's copyreg extension registry and are not supported");
    case op::kNextBuffer:  // load_next_buffer: torch.load passes no buffers
      Error("NEXT_BUFFER refers to out-of-band data (protocol 5) and torch.load gives none");
    case op::kReadOnlyBuffer: {
      // load_readonly_buffer: a memoryview of the top object, made read-only. Bytes stay as
      // they are; a bytearray becomes a read-only view of the same bytes; anything without
      // the buffer protocol makes memoryview() raise.
      Kind k = g_.kind(Top());
      if (k != Kind::kBytes && k != Kind::kByteArray) {
        Error(fmt::format("READONLY_BUFFER of a {}: not a bytes-like object", KindName(k)));
      }
      return;
    }
    default:
      Error(fmt::format("unknown opcode 0x{:02x}", code));
  }
}

}  // namespace

PartialParse ParsePartial(Bytes data, uint64_t base_offset, const Limits& limits,
                          const Reading& reading) {
  return Parser(data, base_offset, limits, reading).Run();
}

ParseResult Parse(Bytes data, uint64_t base_offset, const Limits& limits, const Reading& reading) {
  PartialParse p = ParsePartial(data, base_offset, limits, reading);
  if (p.diverged) throw FrameDivergence(p.error);
  if (!p.error.empty()) throw Error(p.error);
  return std::move(p.result);
}

}  // namespace ckpt::pickle
