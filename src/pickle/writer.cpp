#include "pickle/writer.h"

#include <bit>
#include <vector>

#include "base/endian.h"
#include "base/error.h"
#include "pickle/opcodes.h"

namespace ckpt::pickle {

namespace {

constexpr size_t kBatch = 1000;  // items per APPENDS/SETITEMS, as CPython
constexpr uint32_t kMaxDepth = 4096;

class Writer {
 public:
  Writer(Graph& g, const WriteOptions& o)
      : g_(g), o_(o), memo_(g.nodes.size(), kNil), refs_(g.nodes.size(), 0) {}

  std::string Run(NodeId root) {
    if (o_.protocol < 2 || o_.protocol > 5) Fail("cannot write pickle protocol {}", o_.protocol);
    CountRefs(root);
    out_.reserve(o_.reserve);
    Op(op::kProto);
    out_.push_back(static_cast<char>(o_.protocol));
    Save(root, 0);
    Op(op::kStop);
    return std::move(out_);
  }

 private:
  void Op(uint8_t code) { out_.push_back(static_cast<char>(code)); }

  // In-degree of every reachable node (0, 1, or 2 for more), so nodes referenced twice get
  // a memo slot. A node is counted when a reference to it is seen and walked once, at its
  // first: the stack holds only compounds not walked yet.
  void CountRefs(NodeId root) {
    std::vector<NodeId> stack;
    auto see = [&](NodeId x) {
      if (x == kNil) return;
      if (refs_[x] < 2) ++refs_[x];
      if (refs_[x] == 1 && g_.has_compound(x)) stack.push_back(x);
    };
    see(root);
    while (!stack.empty()) {
      NodeId n = stack.back();
      stack.pop_back();
      const Compound& c = g_.compound(n);
      for (NodeId x : g_.items(n)) see(x);
      for (NodeId x : g_.pairs(n)) see(x);
      for (NodeId x : g_.states(n)) see(x);
      for (NodeId x : {c.callable, c.args, c.kwargs}) see(x);
    }
  }

  bool AlwaysMemo(Kind k) const {
    return k == Kind::kList || k == Kind::kDict || k == Kind::kSet || k == Kind::kObject;
  }

  void Put(NodeId n) {
    uint32_t index = next_memo_++;
    memo_[n] = index;
    if (index < 256) {
      Op(op::kBinPut);
      out_.push_back(static_cast<char>(index));
    } else {
      Op(op::kLongBinPut);
      AppendLE<uint32_t>(out_, index);
    }
  }
  void MaybePut(NodeId n) {
    if (refs_[n] > 1 || AlwaysMemo(g_.kind(n))) Put(n);
  }
  void Get(uint32_t index) {
    if (index < 256) {
      Op(op::kBinGet);
      out_.push_back(static_cast<char>(index));
    } else {
      Op(op::kLongBinGet);
      AppendLE<uint32_t>(out_, index);
    }
  }

  void SaveInt(int64_t v) {
    if (v >= 0 && v < 256) {
      Op(op::kBinInt1);
      out_.push_back(static_cast<char>(v));
    } else if (v >= 0 && v < 65536) {
      Op(op::kBinInt2);
      AppendLE<uint16_t>(out_, static_cast<uint16_t>(v));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      Op(op::kBinInt);
      AppendLE<int32_t>(out_, static_cast<int32_t>(v));
    } else {
      // Minimal two's complement little-endian, as LONG1 wants.
      std::string le;
      uint64_t u = static_cast<uint64_t>(v);
      for (int i = 0; i < 8; ++i) le.push_back(static_cast<char>((u >> (8 * i)) & 0xFF));
      while (le.size() > 1) {
        uint8_t last = static_cast<uint8_t>(le.back()),
                prev = static_cast<uint8_t>(le[le.size() - 2]);
        if ((last == 0 && !(prev & 0x80)) || (last == 0xFF && (prev & 0x80))) {
          le.pop_back();
        } else {
          break;
        }
      }
      SaveLong(le);
    }
  }
  void SaveLong(std::string_view le) {
    if (le.size() < 256) {
      Op(op::kLong1);
      out_.push_back(static_cast<char>(le.size()));
    } else {
      Op(op::kLong4);
      AppendLE<uint32_t>(out_, static_cast<uint32_t>(le.size()));
    }
    out_.append(le);
  }
  void SaveSized(uint8_t short_op, uint8_t op32, uint8_t op64, std::string_view s) {
    if (short_op && s.size() < 256) {
      Op(short_op);
      out_.push_back(static_cast<char>(s.size()));
    } else if (s.size() <= UINT32_MAX) {
      Op(op32);
      AppendLE<uint32_t>(out_, static_cast<uint32_t>(s.size()));
    } else {
      Op(op64);
      AppendLE<uint64_t>(out_, s.size());
    }
    out_.append(s);
  }

  void Batched(std::span<const NodeId> v, size_t step, uint8_t one, uint8_t many, uint32_t depth) {
    for (size_t i = 0; i < v.size(); i += kBatch * step) {
      size_t n = std::min(kBatch * step, v.size() - i);
      if (n == step && one) {
        for (size_t k = 0; k < n; ++k) Save(v[i + k], depth);
        Op(one);
        continue;
      }
      Op(op::kMark);
      for (size_t k = 0; k < n; ++k) Save(v[i + k], depth);
      Op(many);
    }
  }

  void Fill(NodeId n, uint32_t depth) {
    std::span<const NodeId> items = g_.items(n);
    std::span<const NodeId> pairs = g_.pairs(n);
    if (!items.empty()) {
      if (g_.kind(n) == Kind::kSet) {
        Batched(items, 1, 0, op::kAddItems, depth);
      } else {
        Batched(items, 1, op::kAppend, op::kAppends, depth);
      }
    }
    if (!pairs.empty()) Batched(pairs, 2, op::kSetItem, op::kSetItems, depth);
    for (NodeId s : g_.states(n)) {
      Save(s, depth);
      Op(op::kBuild);
    }
  }

  // Saves `items` then, if the enclosing node got memoized meanwhile (a cycle through a
  // mutable child), discards them and fetches the memoized node instead.
  bool SavedMeanwhile(NodeId n, size_t pushed, bool marked) {
    if (memo_[n] == kNil) return false;
    if (marked) {
      Op(op::kPopMark);
    } else {
      for (size_t i = 0; i < pushed; ++i) Op(op::kPop);
    }
    Get(memo_[n]);
    return true;
  }

  void Save(NodeId n, uint32_t depth) {
    if (n == kNil) Fail("pickle writer: dangling reference");
    if (memo_[n] != kNil) {
      Get(memo_[n]);
      return;
    }
    if (++depth > kMaxDepth) Fail("object nested deeper than {} levels", kMaxDepth);
    const Node& node = g_.at(n);
    switch (node.kind) {
      case Kind::kNone:
        Op(op::kNone);
        break;
      case Kind::kBool:
        Op(node.boolean ? op::kNewTrue : op::kNewFalse);
        break;
      case Kind::kInt:
        SaveInt(node.integer);
        break;
      case Kind::kBigInt:
        SaveLong(g_.text(n));
        break;
      case Kind::kFloat: {
        Op(op::kBinFloat);  // big-endian IEEE double
        uint64_t bits = std::bit_cast<uint64_t>(node.real);
        for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
        break;
      }
      case Kind::kStr:
        SaveSized(0, op::kBinUnicode, op::kBinUnicode8, g_.text(n));
        break;
      case Kind::kBytes:
        if (o_.protocol < 3) Fail("bytes need pickle protocol 3 or later");
        SaveSized(op::kShortBinBytes, op::kBinBytes, op::kBinBytes8, g_.text(n));
        break;
      case Kind::kByteArray:
        if (o_.protocol < 5) Fail("bytearray needs pickle protocol 5");
        Op(op::kByteArray8);
        AppendLE<uint64_t>(out_, g_.text(n).size());
        out_.append(g_.text(n));
        break;
      case Kind::kGlobal:
        Op(op::kGlobal);
        out_.append(g_.global_module(n));
        out_.push_back('\n');
        out_.append(g_.global_name(n));
        out_.push_back('\n');
        break;
      case Kind::kTuple: {
        const auto& items = g_.items(n);
        if (items.empty()) {
          Op(op::kEmptyTuple);
          break;
        }
        bool marked = items.size() > 3;
        if (marked) Op(op::kMark);
        for (NodeId x : items) Save(x, depth);
        if (SavedMeanwhile(n, items.size(), marked)) return;
        Op(marked ? op::kTuple : static_cast<uint8_t>(op::kTuple1 + items.size() - 1));
        break;
      }
      case Kind::kFrozenSet: {
        if (o_.protocol < 4) Fail("frozenset needs pickle protocol 4 or later");
        Op(op::kMark);
        for (NodeId x : g_.items(n)) Save(x, depth);
        if (SavedMeanwhile(n, 0, true)) return;
        Op(op::kFrozenSet);
        break;
      }
      case Kind::kList:
        Op(op::kEmptyList);
        Put(n);
        Fill(n, depth);
        return;
      case Kind::kDict:
        Op(op::kEmptyDict);
        Put(n);
        Fill(n, depth);
        return;
      case Kind::kSet:
        if (o_.protocol < 4) Fail("set literals need pickle protocol 4 or later");
        Op(op::kEmptySet);
        Put(n);
        Fill(n, depth);
        return;
      case Kind::kObject: {
        const Compound& c = g_.compound(n);
        switch (c.construct) {
          case Construct::kReduce:
            Save(c.callable, depth);
            Save(c.args, depth);
            Op(op::kReduce);
            break;
          case Construct::kNewObj:
            Save(c.callable, depth);
            Save(c.args, depth);
            Op(op::kNewObj);
            break;
          case Construct::kNewObjEx:
            if (o_.protocol < 4) Fail("NEWOBJ_EX needs pickle protocol 4 or later");
            Save(c.callable, depth);
            Save(c.args, depth);
            Save(c.kwargs, depth);
            Op(op::kNewObjEx);
            break;
          case Construct::kInst:
            Op(op::kMark);
            Save(c.callable, depth);
            if (c.args != kNil) {
              for (NodeId x : g_.items(c.args)) Save(x, depth);
            }
            Op(op::kObj);
            break;
        }
        Put(n);
        Fill(n, depth);
        return;
      }
      case Kind::kPersId: {
        if (o_.before_persid) o_.before_persid(n);
        Save(g_.compound(n).args, depth);
        Op(op::kBinPersId);
        break;
      }
    }
    MaybePut(n);
  }

  Graph& g_;
  const WriteOptions& o_;
  std::vector<uint32_t> memo_;
  std::vector<uint8_t> refs_;  // saturates at 2
  uint32_t next_memo_ = 0;
  std::string out_;
};

}  // namespace

std::string Write(Graph& graph, NodeId root, const WriteOptions& options) {
  return Writer(graph, options).Run(root);
}

}  // namespace ckpt::pickle
