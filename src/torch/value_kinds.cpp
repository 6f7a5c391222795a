#include "torch/value_kinds.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "torch/global_lists.h"
#include "torch/signatures.h"

namespace ckpt::torch {

namespace {

using pickle::Construct;
using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;

bool IsEmptyTuple(const Graph& g, NodeId id) {
  return id != kNil && g.kind(id) == Kind::kTuple && g.items(id).empty();
}

bool IsEmptyDictOrNil(const Graph& g, NodeId id) {
  return id == kNil || (g.kind(id) == Kind::kDict && g.pairs(id).empty());
}

bool IsDunder(std::string_view s) {
  return s.size() > 4 && s.starts_with("__") && s.ends_with("__");
}

bool IsIdentifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char ch : s) {
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_';
    if (!ok) return false;
  }
  return true;
}

const char* KindWord(uint16_t k) {
  switch (k) {
    case kVNone:
      return "None";
    case kVBool:
      return "bool";
    case kVInt:
      return "int";
    case kVFloat:
      return "float";
    case kVStr:
      return "str";
    case kVBytes:
      return "bytes";
    case kVTuple:
      return "tuple";
    case kVList:
      return "list";
    case kVDict:
      return "dict";
    case kVSet:
      return "set";
    case kVStorage:
      return "storage";
    case kVTensor:
      return "tensor";
    case kVInstance:
      return "instance";
    case kVConst:
      return "constant";
    case kVCallable:
      return "callable";
    case kVOpaque:
      return "unknown value";
    default:
      return "value";
  }
}

// A refusal whose cause is reported elsewhere.
const char* const kSilent = "-";

std::string Ordinal(size_t i) {
  return fmt::format("argument {}", i + 1);
}

}  // namespace

bool MakesWithoutCall(const Graph& g, NodeId call) {
  const pickle::Compound& c = g.compound(call);
  return (c.construct == Construct::kNewObj || c.construct == Construct::kNewObjEx) &&
         (c.args == kNil || IsEmptyTuple(g, c.args)) && IsEmptyDictOrNil(g, c.kwargs);
}

ValueKinds::ValueKinds(const Graph& g, const Trust& trust)
    : g_(g),
      trust_(trust),
      kind_(g.nodes.size()),
      impure_(g.nodes.size()),
      refused_(g.nodes.size()),
      use_(g.nodes.size()),
      witness_(g.nodes.size(), kNil) {
  InitLeaves();
  BuildParents();
  DecideGetattr();
  // What the leaves make impure first, then each call in stream order with its consequences
  // spread before the next: a refusal names its own cause, not a consequence of another.
  Spread();
  for (NodeId id = 0; id < g_.nodes.size(); ++id) {
    if (g_.kind(id) != Kind::kObject) continue;
    frontier_ = id + 1;
    JudgeObject(id);
    Spread();
  }
  std::stable_sort(refusals_.begin(), refusals_.end(),
                   [](const Refusal& a, const Refusal& b) { return a.node < b.node; });
}

const ValueKinds::GlobalInfo& ValueKinds::Info(NodeId global) {
  auto [it, fresh] = info_.try_emplace(global);
  if (fresh) {
    GlobalInfo& i = it->second;
    std::string_view module = g_.global_module(global), name = g_.global_name(global);
    i.name = DisplayGlobal(module, name);
    i.cls = ClassifyGlobal(module, name);
    i.listed = i.cls == GlobalClass::kTorchAllowed || IsAllowedGlobal(module, name);
    if (i.listed) i.sig = SignatureOf(i.name);
  }
  return it->second;
}

// A getattr global is judged by its reads when every use of it is a call of read shape:
// getattr(G, 'S') by REDUCE with a global and a non-empty string, no keywords, whose result is
// neither called nor given state or items. Any other use makes it the unsafe import it is.
void ValueKinds::DecideGetattr() {
  bool any = false;
  for (NodeId id = 0; id < g_.nodes.size() && !any; ++id) any = use_[id] & kReadsOnly;
  if (!any) return;
  std::vector<uint8_t> called_node(g_.nodes.size());
  for (NodeId id = 0; id < g_.nodes.size(); ++id) {
    if (g_.kind(id) != Kind::kObject) continue;
    NodeId fn = g_.compound(id).callable;
    if (fn != kNil) called_node[fn] = 1;
  }
  std::vector<uint8_t> other_use(g_.nodes.size());
  for (NodeId id = 0; id < g_.nodes.size(); ++id) {
    if (g_.kind(id) != Kind::kObject) continue;
    const pickle::Compound& c = g_.compound(id);
    if (c.callable == kNil || !(use_[c.callable] & kReadsOnly)) continue;
    NodeId target = g_.Arg(id, 0), attr = g_.Arg(id, 1);
    bool shape = c.construct == Construct::kReduce && c.kwargs == kNil && g_.ArgCount(id) == 2 &&
                 g_.kind(target) == Kind::kGlobal && g_.kind(attr) == Kind::kStr &&
                 !g_.text(attr).empty() && !called_node[id] && g_.items(id).empty() &&
                 g_.pairs(id).empty() && g_.states(id).empty();
    if (!shape) other_use[c.callable] = 1;
  }
  for (NodeId id = 0; id < g_.nodes.size(); ++id) {
    if (!(use_[id] & kReadsOnly)) continue;
    bool child = first_[id + 1] > first_[id];
    if (other_use[id] || child || g_.root == id) {
      use_[id] &= ~kReadsOnly;
      refusals_.push_back({id, "imports " + Name(id), ""});
    }
  }
}

std::string ValueKinds::Name(NodeId global) const {
  return DisplayGlobal(g_.global_module(global), g_.global_name(global));
}

void ValueKinds::InitLeaves() {
  for (NodeId id = 0; id < g_.nodes.size(); ++id) {
    uint16_t k = 0;
    switch (g_.kind(id)) {
      case Kind::kNone:
        k = kVNone;
        break;
      case Kind::kBool:
        k = kVBool;
        break;
      case Kind::kInt:
      case Kind::kBigInt:
        k = kVInt;
        break;
      case Kind::kFloat:
        k = kVFloat;
        break;
      case Kind::kStr:
        k = kVStr;
        break;
      case Kind::kBytes:
      case Kind::kByteArray:
        k = kVBytes;
        break;
      case Kind::kTuple:
        k = kVTuple;
        break;
      case Kind::kList:
        k = kVList;
        break;
      case Kind::kDict:
        k = kVDict;
        break;
      case Kind::kSet:
      case Kind::kFrozenSet:
        k = kVSet;
        break;
      case Kind::kObject:
        k = kVInstance;  // until judged
        break;
      case Kind::kPersId: {
        // torch's persistent_load reads ('storage', type, key, location, numel[, view]) and
        // takes type.dtype: anything but a storage type there has an attribute read on it
        // (a module's __getattr__, a descriptor) whether or not the storage is used. The
        // legacy ('module', class, source_file, source) runs inspect.getsource on the class.
        if (std::string why = JudgePersistentId(id); !why.empty()) {
          k = kVOpaque;
          refused_[id] = 1;
          refusals_.push_back({id, std::move(why), ""});
        } else {
          k = kVStorage;
        }
        break;
      }
      case Kind::kGlobal: {
        std::string_view module = g_.global_module(id), name = g_.global_name(id);
        std::string display = DisplayGlobal(module, name);
        GlobalClass cls = ClassifyGlobal(module, name);
        if (cls == GlobalClass::kUnsafe) {
          k = kVOpaque;
          refused_[id] = 1;
          if (display == "builtins.getattr") {
            use_[id] |= kReadsOnly;  // until shown otherwise
          } else {
            refusals_.push_back({id, "imports " + display, ""});
          }
        } else if (cls == GlobalClass::kTorchAllowed || IsAllowedGlobal(module, name)) {
          k = IsAllowedConstant(display) ? kVConst : kVCallable;
        } else if (trust_.Reaches(module, name)) {
          k = kVCallable;
          use_[id] |= kTrustedUse;
        } else {
          k = kVOpaque;
          refused_[id] = 1;  // never imported by ckptool.load
        }
        break;
      }
    }
    kind_[id] = k;
    if (k == kVCallable || k == kVOpaque) {
      impure_[id] = 1;
      witness_[id] = id;
      work_.push_back(id);
    }
  }
}

std::string ValueKinds::JudgePersistentId(NodeId id) {
  NodeId pid = g_.compound(id).args;
  if (pid == kNil || g_.kind(pid) != Kind::kTuple || g_.items(pid).empty() ||
      g_.kind(g_.items(pid)[0]) != Kind::kStr) {
    return "gives torch's persistent_load an id that is no ('storage', ...) tuple";
  }
  auto items = g_.items(pid);
  std::string_view type = g_.text(items[0]);
  if (type != "storage") {
    return fmt::format(
        "gives torch's persistent_load a '{}' id: torch reads the class it names (the legacy "
        "'module' id runs inspect.getsource on it)",
        type);
  }
  auto is = [&](size_t i, Kind k) { return i < items.size() && g_.kind(items[i]) == k; };
  bool storage_type = is(1, Kind::kGlobal) && IsAllowedConstant(Info(items[1]).name);
  if (!storage_type) {
    return fmt::format(
        "gives torch's persistent_load {} as the storage type: torch reads its .dtype",
        items.size() > 1 ? WhatIs(items[1]) : std::string("nothing"));
  }
  bool numel = is(4, Kind::kInt) || is(4, Kind::kBigInt);
  bool view =
      items.size() == 5 || (items.size() == 6 && (is(5, Kind::kNone) || is(5, Kind::kTuple)));
  if (!is(2, Kind::kStr) || !is(3, Kind::kStr) || !numel || !view) {
    return "gives torch's persistent_load a storage id that is not (type, key, location, numel)";
  }
  return "";
}

void ValueKinds::BuildParents() {
  const size_t n = g_.nodes.size();
  auto for_children = [&](NodeId p, auto&& fn) {
    Kind k = g_.kind(p);
    if (k == Kind::kPersId || !g_.has_compound(p)) return;
    for (NodeId c : g_.items(p)) fn(c);
    for (NodeId c : g_.pairs(p)) fn(c);
    for (NodeId c : g_.states(p)) fn(c);
    if (k == Kind::kObject) {
      const pickle::Compound& c = g_.compound(p);
      if (c.args != kNil) fn(c.args);
      if (c.kwargs != kNil) fn(c.kwargs);
    }
  };
  first_.assign(n + 1, 0);
  for (NodeId p = 0; p < n; ++p) {
    for_children(p, [&](NodeId c) {
      if (c < n) ++first_[c + 1];
    });
  }
  for (size_t i = 0; i < n; ++i) first_[i + 1] += first_[i];
  parents_.resize(first_[n]);
  std::vector<uint32_t> fill(first_.begin(), first_.end() - 1);
  for (NodeId p = 0; p < n; ++p) {
    for_children(p, [&](NodeId c) {
      if (c < n) parents_[fill[c]++] = p;
    });
  }
}

void ValueKinds::MarkImpure(NodeId id, NodeId witness) {
  if (impure_[id]) return;
  impure_[id] = 1;
  witness_[id] = witness;
  work_.push_back(id);
}

void ValueKinds::Refuse(NodeId id, std::string why, std::string called) {
  refused_[id] = 1;
  kind_[id] = kVOpaque;
  if (!why.empty()) refusals_.push_back({id, std::move(why), std::move(called)});
  impure_[id] = 0;  // MarkImpure names this node as the cause
  MarkImpure(id, id);
}

void ValueKinds::Spread() {
  while (!work_.empty()) {
    NodeId x = work_.back();
    work_.pop_back();
    for (uint32_t i = first_[x]; i < first_[x + 1]; ++i) {
      NodeId p = parents_[i];
      if (g_.kind(p) != Kind::kObject) {
        MarkImpure(p, witness_[x]);
        continue;
      }
      if (refused_[p]) continue;
      if (p >= frontier_) continue;  // judged in its turn, with all that is known then
      const pickle::Compound& c = g_.compound(p);
      auto states = g_.states(p);
      if (x == c.args || x == c.kwargs ||
          std::find(states.begin(), states.end(), x) != states.end()) {
        JudgeObject(p);
      } else {
        MarkImpure(p, witness_[x]);  // an instance holding what it was given
      }
    }
  }
}

void ValueKinds::JudgeObject(NodeId id) {
  if (refused_[id] || (use_[id] & kAttributeRead)) return;
  std::string called;
  std::string why = JudgeCall(id);
  if (why.empty() && !refused_[id]) why = JudgeApplied(id);
  if (refused_[id]) return;  // refused silently (a denied global, reported as an import)
  if (why == kSilent) return Refuse(id, "");
  if (!why.empty()) {
    // "calls X" and "makes X" carry the global trust would accept after a '\n'.
    size_t cut = why.find('\n');
    if (cut != std::string::npos) {
      called = why.substr(cut + 1);
      why.resize(cut);
    }
    Refuse(id, std::move(why), std::move(called));
    return;
  }
  for (NodeId c : g_.items(id)) {
    if (impure_[c]) return MarkImpure(id, witness_[c]);
  }
  for (NodeId c : g_.pairs(id)) {
    if (impure_[c]) return MarkImpure(id, witness_[c]);
  }
}

std::string ValueKinds::WhatIs(NodeId id) const {
  NodeId w = witness_[id] == kNil ? id : witness_[id];
  std::string what;
  switch (g_.kind(w)) {
    case Kind::kGlobal:
      what = kind_[w] == kVCallable ? Name(w) + " (a callable)" : Name(w);
      break;
    case Kind::kObject: {
      NodeId maker = g_.CalledGlobal(w);
      what = maker != kNil ? fmt::format("what {} returned", Name(maker)) : "a computed value";
      break;
    }
    case Kind::kPersId:
      what = "a persistent id that is no storage";
      break;
    default:
      what = "an unknown value";
  }
  if (w == id) return what;
  return fmt::format("a {} holding {}", pickle::KindName(g_.kind(id)), what);
}

std::string ValueKinds::Fits(NodeId arg, const Param& p, const std::string& callee,
                             size_t position) {
  if (arg == kNil) return "";
  bool global = g_.kind(arg) == Kind::kGlobal;
  if (p.callables != CallableSet::kNone && global) {
    const std::string& name = Info(arg).name;
    bool class_set =
        p.callables == CallableSet::kClasses || p.callables == CallableSet::kTensorClasses;
    if (kind_[arg] == kVCallable) {
      if (InCallableSet(p.callables, name)) return "";
      if (trusted(arg) && class_set) return "";
    }
    if (p.callables == CallableSet::kClasses && !Info(arg).listed &&
        Info(arg).cls != GlobalClass::kUnsafe) {
      // An unlisted class copyreg would instantiate without calling it.
      use_[arg] |= kRebuilt;
      return fmt::format(
          "makes {} without calling it ({}): not on the allowlist, and its __setstate__ runs "
          "when loaded\n{}",
          name, callee, name);
    }
    return fmt::format("passes {} to {} as its {}, where it takes only {}: {} would call it", name,
                       callee, Ordinal(position), CallableSetName(p.callables), callee);
  }
  if (p.kinds == kVAny) return "";
  if (impure_[arg]) {
    NodeId w = witness_[arg];
    // Made impure by a call refused on its own: that refusal names the cause already.
    if (w != kNil && g_.kind(w) == Kind::kObject && refused_[w]) return kSilent;
    return fmt::format(
        "calls {} with {} as its {}, where only data may go: a callable passed as data is "
        "called by what receives it",
        callee, WhatIs(arg), Ordinal(position));
  }
  if (!(kind_[arg] & p.kinds)) {
    if (p.kinds == 0) {
      return fmt::format("calls {} with a {} as its {}, where it takes only {}", callee,
                         KindWord(kind_[arg]), Ordinal(position), CallableSetName(p.callables));
    }
    return fmt::format("calls {} with a {} as its {}, which its declared signature does not take",
                       callee, KindWord(kind_[arg]), Ordinal(position));
  }
  return "";
}

std::string ValueKinds::JudgeCall(NodeId id) {
  const pickle::Compound& c = g_.compound(id);
  NodeId fn = c.callable;
  if (fn == kNil) return "calls nothing";
  if (g_.kind(fn) != Kind::kGlobal) {
    NodeId maker = g_.CalledGlobal(fn);
    return maker != kNil ? fmt::format("calls what {} returned", Name(maker))
                         : fmt::format("calls a computed {}", pickle::KindName(g_.kind(fn)));
  }
  const GlobalInfo& info = Info(fn);
  const std::string& name = info.name;
  if (name == "builtins.getattr") {
    if (use_[fn] & kReadsOnly) return JudgeAttributeRead(id);
    Refuse(id, "");  // reported as the import of getattr
    return "";
  }
  if (info.cls == GlobalClass::kUnsafe) {
    Refuse(id, "");  // reported as the import
    return "";
  }
  bool listed = info.listed;
  bool trusted = !listed && this->trusted(fn);
  bool newobj = c.construct == Construct::kNewObj || c.construct == Construct::kNewObjEx;
  if (!listed && !trusted) {
    if (MakesWithoutCall(g_, id)) {
      use_[fn] |= kRebuilt;
      return fmt::format(
          "makes {} without calling it (NEWOBJ): not on the allowlist, and its __setstate__ runs "
          "when loaded\n{}",
          name, name);
    }
    use_[fn] |= kCalled;
    return fmt::format("calls {}\n{}", name, name);
  }
  if (kind_[fn] == kVConst) return fmt::format("calls {}, which is a value", name);
  if (c.args != kNil && g_.kind(c.args) != Kind::kTuple) {
    return fmt::format("calls {} with arguments that are not a tuple", name);
  }
  if (c.kwargs != kNil && (g_.kind(c.kwargs) != Kind::kDict || impure_[c.kwargs])) {
    return fmt::format("calls {} with keyword arguments that are not plain data", name);
  }
  std::span<const NodeId> args = c.args == kNil ? std::span<const NodeId>() : g_.items(c.args);
  if (trusted || newobj) {
    // cls.__new__(cls, *args), or the user's own callable: data in, an instance out.
    if (newobj && !trusted && !IsAllowedClass(name))
      return fmt::format("instantiates {} (NEWOBJ), which is no class", name);
    Param data;
    for (size_t i = 0; i < args.size(); ++i) {
      if (std::string why = Fits(args[i], data, name, i); !why.empty()) return why;
    }
    kind_[id] = kVInstance;
    return "";
  }
  const Signature& sig = info.sig;
  if (c.kwargs != kNil && !sig.keywords && !g_.pairs(c.kwargs).empty())
    return fmt::format("calls {} with keyword arguments it does not take", name);
  for (size_t i = 0; i < args.size(); ++i) {
    Param p;
    if (i < sig.count) {
      p = sig.params[i];
    } else if (!sig.variadic) {
      return fmt::format("calls {} with {} arguments; its declared signature takes {}", name,
                         args.size(), sig.count);
    }
    if (std::string why = Fits(args[i], p, name, i); !why.empty()) return why;
  }
  switch (sig.returns) {
    case Returns::kTensor:
      kind_[id] = kVTensor;
      break;
    case Returns::kInstance:
      kind_[id] = kVInstance;
      break;
    case Returns::kData:
      kind_[id] = kVData & ~(kVInstance | kVTensor | kVStorage);  // no instance BUILD may touch
      break;
    case Returns::kCombined: {
      kind_[id] = kVConst;
      for (NodeId a : args) {
        if (impure_[a]) {
          kind_[id] = kVOpaque;
          MarkImpure(id, witness_[a]);
        }
      }
      break;
    }
  }
  return "";
}

// The states numpy's dtype.__reduce__ writes (numpy/_core/src/multiarray/descriptor.c,
// arraydescr_reduce) for the dtypes of plain arrays, given the name the call passed:
//   builtin types ('i4', 'f8', 'b1', 'c16'):  (3, order, None, None, None, -1, -1, 0)
//   objects ('O8'):                             (3, '|', None, None, None, -1, -1, 63)
//   bytes, void ('S2', 'V12'):                  (3, '|', None, None, None, N, 1, 0)
//   str ('U3'):                                 (3, order, None, None, None, 4N, 4, 8)
//   datetime, timedelta ('M8', 'm8'):           (4, order, None, None, None, -1, -1, 0,
//                                                (None, (unit bytes, num, 1, 1)))
// Structured and subarray dtypes, whose states carry sizes and offsets that __setstate__ takes
// as given, and any other combination, are refused: the semantic oracle's numpy segfaulted on
// a crafted state.
bool ValueKinds::PlainDtypeState(NodeId call, NodeId s) const {
  if (g_.kind(s) != Kind::kTuple || g_.ArgCount(call) < 1) return false;
  NodeId name_node = g_.Arg(call, 0);
  if (g_.kind(name_node) != Kind::kStr) return false;
  std::string_view name = g_.text(name_node);
  auto it = g_.items(s);
  auto is_int = [&](NodeId n, int64_t v) {
    return g_.kind(n) == Kind::kInt && g_.at(n).integer == v;
  };
  auto none = [&](size_t i) { return g_.kind(it[i]) == Kind::kNone; };
  if (it.size() < 8 || !none(2) || !none(3) || !none(4)) return false;
  std::string_view order = g_.kind(it[1]) == Kind::kStr ? g_.text(it[1]) : std::string_view();
  if (order.size() != 1 || std::string_view("<>|=").find(order[0]) == std::string_view::npos)
    return false;
  auto sized = [&](int64_t elsize, int64_t align, int64_t flags) {
    return it.size() == 8 && is_int(it[0], 3) && is_int(it[5], elsize) && is_int(it[6], align) &&
           is_int(it[7], flags);
  };
  if (name.empty()) return false;
  char type = name[0];
  std::string_view digits = name.substr(1);
  int64_t n = 0;
  bool number = !digits.empty() && digits.size() <= 9 &&
                digits.find_first_not_of("0123456789") == std::string_view::npos;
  if (number) {
    for (char c : digits) n = n * 10 + (c - '0');
  }
  if (name == "M8" || name == "m8") {
    if (it.size() != 9 || !is_int(it[0], 4) || !is_int(it[5], -1) || !is_int(it[6], -1) ||
        !is_int(it[7], 0) || g_.kind(it[8]) != Kind::kTuple)
      return false;
    auto meta = g_.items(it[8]);
    if (meta.size() != 2 || g_.kind(meta[0]) != Kind::kNone || g_.kind(meta[1]) != Kind::kTuple)
      return false;
    auto unit = g_.items(meta[1]);
    // The unit's bytes: BINBYTES, or _codecs.encode(str, 'latin1') in protocol 2.
    auto short_bytes = [&](NodeId b) {
      if (g_.kind(b) == Kind::kBytes) return g_.text(b).size() <= 2;
      if (!g_.IsCallOf(b, "_codecs", "encode") || g_.ArgCount(b) < 1) return false;
      NodeId t = g_.Arg(b, 0);
      return g_.kind(t) == Kind::kStr && g_.text(t).size() <= 2;
    };
    return unit.size() == 4 && !unit.empty() && short_bytes(unit[0]) &&
           g_.kind(unit[1]) == Kind::kInt && g_.at(unit[1]).integer >= 1 &&
           g_.at(unit[1]).integer <= (1 << 20) && is_int(unit[2], 1) && is_int(unit[3], 1);
  }
  if (!number) return false;
  switch (type) {
    case 'b':
    case 'i':
    case 'u':
    case 'f':
    case 'c':
      return sized(-1, -1, 0);
    case 'O':
      return order == "|" && sized(-1, -1, 63);
    case 'S':
    case 'V':
      return order == "|" && n > 0 && sized(n, 1, 0);
    case 'U':
      return n > 0 && sized(4 * n, 4, 8);
    default:
      return false;
  }
}

std::string ValueKinds::JudgeApplied(NodeId id) {
  auto states = g_.states(id);
  bool applied = !states.empty() || !g_.items(id).empty() || !g_.pairs(id).empty();
  if (!applied) return "";
  NodeId maker = g_.CalledGlobal(id);
  std::string made = maker != kNil ? Name(maker) : std::string("a computed callable");
  if (!(kind_[id] & (kVInstance | kVTensor))) {
    return fmt::format("applies BUILD, APPEND or SETITEM to what {} returned, which is no instance",
                       made);
  }
  // On a tensor, _pickle.c's APPEND(S), ADDITEMS and SETITEM(S) call the tensor's own methods
  // (append/extend/add/__setitem__), which dispatch on their arguments (reading
  // __torch_function__ of each: the semantic oracle found Parameter().add(numpy.lib), a module's
  // attribute read). torch.save never writes them on a tensor.
  const bool tensor = (kind_[id] & kVTensor) ||
                      (maker != kNil && InCallableSet(CallableSet::kTensorClasses, Name(maker)));
  if (tensor && (!g_.items(id).empty() || !g_.pairs(id).empty())) {
    return fmt::format(
        "applies APPEND, ADDITEMS or SETITEM to the tensor {} made: the tensor's own methods "
        "run on what the pickle gives them",
        made);
  }
  if (states.size() > 1) {
    return fmt::format(
        "BUILD twice on what {} made: the first state can plant a __setstate__ in the instance "
        "that the second BUILD calls",
        made);
  }
  if (states.empty()) return "";
  NodeId s = states[0];
  if (impure_[s]) {
    return fmt::format(
        "BUILD gives what {} made a state holding {}: planted as an attribute, it is called "
        "by whatever looks that method up",
        made, WhatIs(s));
  }
  auto check_keys = [&](NodeId dict) -> std::string {
    if (dict == kNil) return "";
    Kind k = g_.kind(dict);
    if (k != Kind::kDict && k != Kind::kObject) return "";
    auto p = g_.pairs(dict);
    for (size_t i = 0; i < p.size(); i += 2) {
      if (g_.kind(p[i]) != Kind::kStr) {
        return fmt::format("BUILD sets an attribute of what {} made under a {} key", made,
                           pickle::KindName(g_.kind(p[i])));
      }
      if (IsDunder(g_.text(p[i]))) {
        return fmt::format(
            "BUILD sets '{}' on what {} made: a dunder attribute planted in the instance",
            g_.text(p[i]), made);
      }
    }
    return "";
  };
  if (maker != kNil && Name(maker) == "numpy.dtype" && !PlainDtypeState(id, s)) {
    return fmt::format(
        "BUILD gives what {} made a state numpy writes for no plain dtype: dtype.__setstate__ "
        "trusts its fields (sizes, byte order, fields), and a crafted state crashed Python",
        made);
  }
  if (g_.kind(s) == Kind::kTuple && g_.items(s).size() == 2) {
    for (NodeId part : g_.items(s)) {
      if (std::string why = check_keys(part); !why.empty()) return why;
    }
    return "";
  }
  return check_keys(s);
}

std::string ValueKinds::JudgeAttributeRead(NodeId id) {
  // DecideGetattr made sure of the shape: getattr(G, 'S').
  NodeId target = g_.Arg(id, 0), attr = g_.Arg(id, 1);
  std::string_view a = g_.text(attr);
  std::string path = fmt::format("{}.{}", Name(target), a);
  // Refused: a private or dunder name, a denied target, an attribute named like a denied
  // module (torch._utils_internal.os), and a target that is a module whose attribute is denied
  // (getattr(torch.serialization, 'load')).
  if (!IsIdentifier(a) || a.starts_with('_') ||
      ClassifyGlobal(g_.global_module(target), g_.global_name(target)) == GlobalClass::kUnsafe ||
      IsUnsafeModulePath(a) || ClassifyGlobal(Name(target), a) == GlobalClass::kUnsafe) {
    return fmt::format("reads {} (getattr)", path);
  }
  // Only an allowlisted Enum's (or a trusted module's class's) members are read: on anything
  // else the lookup itself runs code the file aims (a module's __getattr__, a metaclass's, a
  // descriptor's __get__), and what it returns may be a method (pathlib.Path.write_text). The
  // semantic oracle found getattr(torch._tensor._C, 'read'): torch._C is a module.
  if (!IsAllowedEnum(Name(target)) && !trusted(target)) {
    return fmt::format("reads {} (getattr)\n{}", path, Name(target));
  }
  use_[id] |= kAttributeRead;
  kind_[id] = kVConst;
  return "";
}

}  // namespace ckpt::torch
