#include "torch/global_policy.h"

#include <fmt/format.h>

#include <fnmatch.h>
#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace ckpt::torch {

namespace {

using pickle::Construct;
using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;

// Reading attribute `attr` of the imported global module.name (see the header).
GlobalClass ClassifyAttribute(std::string_view module, std::string_view name,
                              std::string_view attr) {
  if (attr.empty() || attr.starts_with("__") || attr.find('.') != std::string_view::npos) {
    return GlobalClass::kUnsafe;
  }
  if (ClassifyGlobal(module, name) == GlobalClass::kUnsafe) return GlobalClass::kUnsafe;
  // A module's attribute may be another module it imported (torch._utils_internal.os).
  if (IsUnsafeModulePath(attr)) return GlobalClass::kUnsafe;
  // The global may itself be a module (GLOBAL 'torch serialization'): its attribute is then
  // a global of that module.
  if (ClassifyGlobal(DisplayGlobal(module, name), attr) == GlobalClass::kUnsafe) {
    return GlobalClass::kUnsafe;
  }
  return GlobalClass::kOther;
}

bool IsGetattr(const pickle::Graph& g, pickle::NodeId id) {
  return g.kind(id) == pickle::Kind::kGlobal &&
         DisplayGlobal(g.global_module(id), g.global_name(id)) == "builtins.getattr";
}

// How every node is used by the others: as the callable of some object, or in any other
// place (an element, a key or value, an argument tuple, a BUILD state, the root).
struct Uses {
  std::vector<uint8_t> called;
  std::vector<uint8_t> elsewhere;

  explicit Uses(const pickle::Graph& g) : called(g.nodes.size()), elsewhere(g.nodes.size()) {
    auto mark = [&](pickle::NodeId id) {
      if (id != pickle::kNil && id < elsewhere.size()) elsewhere[id] = 1;
    };
    // Every child of every node: tuples keep their items in the node, the others in a
    // Compound.
    for (pickle::NodeId n = 0; n < g.nodes.size(); ++n) {
      if (!g.has_compound(n)) continue;
      for (pickle::NodeId id : g.items(n)) mark(id);
      for (pickle::NodeId id : g.pairs(n)) mark(id);
      for (pickle::NodeId id : g.states(n)) mark(id);
      const pickle::Compound& c = g.compound(n);
      mark(c.args);
      mark(c.kwargs);
      if (c.callable != pickle::kNil && c.callable < called.size()) called[c.callable] = 1;
    }
    mark(g.root);
  }
};

// A call getattr(G, 'S') whose result is only ever read: its attribute path, else nil.
struct AttributeRead {
  pickle::NodeId global = pickle::kNil;
  pickle::NodeId attr = pickle::kNil;
};

AttributeRead AsAttributeRead(const pickle::Graph& g, const Uses& uses, pickle::NodeId call) {
  const pickle::Compound& c = g.compound(call);
  if (c.construct != pickle::Construct::kReduce || c.kwargs != pickle::kNil || uses.called[call] ||
      !g.items(call).empty() || !g.pairs(call).empty() || !g.states(call).empty() ||
      g.ArgCount(call) != 2) {
    return {};
  }
  pickle::NodeId target = g.Arg(call, 0), attr = g.Arg(call, 1);
  if (g.kind(target) != pickle::Kind::kGlobal || g.kind(attr) != pickle::Kind::kStr ||
      g.text(attr).empty()) {
    return {};
  }
  return {target, attr};
}

bool IsEmptyTuple(const Graph& g, NodeId id) {
  return id != kNil && g.kind(id) == Kind::kTuple && g.items(id).empty();
}

bool IsEmptyDict(const Graph& g, NodeId id) {
  return id != kNil && g.kind(id) == Kind::kDict && g.pairs(id).empty();
}

std::string Display(const Graph& g, NodeId global) {
  return DisplayGlobal(g.global_module(global), g.global_name(global));
}

// The analysis both ScanPickle and DescribeEffects read: per node, how each global is used
// (called, instantiated without a call) and which calls are getattr attribute reads.
struct Analysis {
  explicit Analysis(const Graph& g);

  const Graph& g;
  Uses uses;
  std::vector<uint8_t> called;        // globals called
  std::vector<uint8_t> rebuilt;       // classes instantiated without a call
  std::vector<NodeId> first_call;     // the first call of each called global
  std::vector<uint8_t> reads_only;    // getattr globals excused as attribute reads
  std::vector<NodeId> getattr_calls;  // every call of a getattr global, in node order

 private:
  void Call(NodeId global, NodeId at) {
    if (global == kNil || g.kind(global) != Kind::kGlobal) return;
    if (!called[global]) first_call[global] = at;
    called[global] = 1;
  }
  void Rebuild(NodeId global) {
    if (global != kNil && g.kind(global) == Kind::kGlobal) rebuilt[global] = 1;
  }
  void JudgeCall(NodeId obj, NodeId callable);
};

Analysis::Analysis(const Graph& graph)
    : g(graph),
      uses(graph),
      called(graph.nodes.size()),
      rebuilt(graph.nodes.size()),
      first_call(graph.nodes.size(), kNil),
      reads_only(graph.nodes.size()) {
  const size_t n = g.nodes.size();
  for (NodeId id = 0; id < n; ++id) {
    if (IsGetattr(g, id)) reads_only[id] = uses.called[id] && !uses.elsewhere[id];
  }
  for (NodeId id = 0; id < n; ++id) {
    if (g.kind(id) != Kind::kObject) continue;
    NodeId callable = g.compound(id).callable;
    if (callable == kNil || g.kind(callable) != Kind::kGlobal) continue;
    if (IsGetattr(g, callable)) {
      getattr_calls.push_back(id);
      if (AsAttributeRead(g, uses, id).global == kNil) reads_only[callable] = 0;
      continue;
    }
    JudgeCall(id, callable);
  }
  // A getattr that is not only read from is an unsafe import; its calls count as calls.
  for (NodeId id : getattr_calls) {
    NodeId callable = g.compound(id).callable;
    if (!reads_only[callable]) Call(callable, id);
  }
}

// The forms of _pickle.c: REDUCE calls; NEWOBJ/NEWOBJ_EX call cls.__new__ (with no arguments
// that is how a class is instantiated without being called); INST/OBJ call the class (or
// function) they name. copyreg's helpers are those forms spelled as REDUCE.
void Analysis::JudgeCall(NodeId obj, NodeId callable) {
  const pickle::Compound& c = g.compound(obj);
  bool no_args = IsEmptyTuple(g, c.args);
  switch (c.construct) {
    case Construct::kNewObj:
      no_args ? Rebuild(callable) : Call(callable, obj);
      return;
    case Construct::kNewObjEx:
      no_args&& IsEmptyDict(g, c.kwargs) ? Rebuild(callable) : Call(callable, obj);
      return;
    case Construct::kInst:
      Call(callable, obj);
      return;
    case Construct::kReduce:
      break;
  }
  Call(callable, obj);
  std::string name = Display(g, callable);
  size_t argc = g.ArgCount(obj);
  if (name == "copyreg.__newobj__") {
    argc == 1 ? Rebuild(g.Arg(obj, 0)) : Call(g.Arg(obj, 0), obj);
    return;
  }
  if (name == "copyreg.__newobj_ex__") {
    bool bare = argc == 3 && IsEmptyTuple(g, g.Arg(obj, 1)) && IsEmptyDict(g, g.Arg(obj, 2));
    bare ? Rebuild(g.Arg(obj, 0)) : Call(g.Arg(obj, 0), obj);
    return;
  }
  ArgUse use = ArgUseOf(g.global_module(callable), g.global_name(callable));
  for (size_t i = 0; i < argc && i < 8; ++i) {
    NodeId arg = g.Arg(obj, i);
    if (arg == kNil || g.kind(arg) != Kind::kGlobal) continue;
    uint8_t bit = static_cast<uint8_t>(1u << i);
    if (use.calls & bit) Call(arg, obj);
    if (use.reconstructs & bit) Rebuild(arg);
    if ((use.calls_unless_object & bit) && Display(g, arg) != "builtins.object") Call(arg, obj);
  }
}

Verdict VerdictOf(const Analysis& a, NodeId global, const Trust& trust, std::string* display) {
  const Graph& g = a.g;
  std::string_view module = g.global_module(global), name = g.global_name(global);
  *display = DisplayGlobal(module, name);
  GlobalClass cls = ClassifyGlobal(module, name);
  if (cls == GlobalClass::kUnsafe) return Verdict::kUnsafe;
  if (cls == GlobalClass::kTorchAllowed) return Verdict::kWeightsOnly;
  if (IsAllowedGlobal(module, name)) return Verdict::kAllowed;
  if (trust.Covers(*display)) return Verdict::kTrusted;
  if (a.called[global]) return Verdict::kCalls;
  if (a.rebuilt[global]) return Verdict::kReconstructed;
  return Verdict::kReferenced;
}

}  // namespace

bool Trust::Covers(std::string_view global) const {
  std::string text(global);
  for (const std::string& p : patterns) {
    if (p.empty()) continue;
    if (fnmatch(p.c_str(), text.c_str(), 0) == 0) return true;
    // "mypkg" and "mypkg.*" cover mypkg.x and mypkg.sub.x.
    std::string root = p.ends_with(".*") ? p.substr(0, p.size() - 2) : p;
    if (root.find_first_of("*?[") == std::string::npos && text.size() > root.size() &&
        text.starts_with(root) && text[root.size()] == '.') {
      return true;
    }
  }
  return false;
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kWeightsOnly:
      return "weights_only";
    case Verdict::kAllowed:
      return "allowed";
    case Verdict::kTrusted:
      return "trusted";
    case Verdict::kReferenced:
      return "referenced";
    case Verdict::kReconstructed:
      return "reconstructed";
    case Verdict::kCalls:
      return "calls";
    case Verdict::kUnsafe:
      return "unsafe";
  }
  return "?";
}

PickleScan ScanPickle(const Graph& graph, const Trust& trust) {
  PickleScan scan;
  const size_t n = graph.nodes.size();
  Analysis a(graph);

  std::map<std::string, size_t> listed;  // name -> index in scan.names
  auto add_name = [&](ImportedName name) {
    auto [it, fresh] = listed.try_emplace(name.name, scan.names.size());
    if (fresh) {
      scan.names.push_back(std::move(name));
    } else {
      ImportedName& old = scan.names[it->second];
      old.verdict = std::max(old.verdict, name.verdict);
    }
  };
  std::vector<uint8_t> call_reported(n);
  size_t next_read = 0;
  for (NodeId id = 0; id < n; ++id) {
    Kind kind = graph.kind(id);
    if (kind == Kind::kGlobal) {
      if (a.reads_only[id]) continue;  // judged by its reads below
      std::string display;
      Verdict v = VerdictOf(a, id, trust, &display);
      if (v == Verdict::kUnsafe) scan.findings.push_back({id, "imports " + display, ""});
      add_name({display, graph.GlobalText(id),
                ClassifyGlobal(graph.global_module(id), graph.global_name(id)), false, v});
      continue;
    }
    if (kind != Kind::kObject) continue;
    NodeId callable = graph.compound(id).callable;
    if (next_read < a.getattr_calls.size() && a.getattr_calls[next_read] == id) {
      ++next_read;
      if (a.reads_only[callable]) {
        AttributeRead read = AsAttributeRead(graph, a.uses, id);
        std::string_view module = graph.global_module(read.global),
                         name = graph.global_name(read.global);
        std::string_view attr = graph.text(read.attr);
        GlobalClass cls = ClassifyAttribute(module, name, attr);
        std::string path = fmt::format("{}.{}", DisplayGlobal(module, name), attr);
        Verdict v = Verdict::kReferenced;
        if (cls == GlobalClass::kUnsafe) {
          v = Verdict::kUnsafe;
          scan.findings.push_back({id, fmt::format("reads {} (getattr)", path), ""});
        } else if (IsAllowedGlobal(module, name)) {
          v = Verdict::kAllowed;
        } else if (trust.Covers(DisplayGlobal(module, name))) {
          v = Verdict::kTrusted;
        }
        add_name({path + " (getattr)", fmt::format("{}.{}", graph.GlobalText(read.global), attr),
                  cls, true, v});
        continue;
      }
    }
    if (callable == kNil) continue;
    if (graph.kind(callable) != Kind::kGlobal) {
      NodeId maker = graph.CalledGlobal(callable);
      scan.findings.push_back(
          {id,
           maker != kNil
               ? fmt::format("calls what {} returned", Display(graph, maker))
               : fmt::format("calls a computed {}", pickle::KindName(graph.kind(callable))),
           ""});
    }
  }
  // "calls X": at the first call of each global judged kCalls (arguments called by an allowed
  // constructor count), in node order with the other findings.
  for (NodeId id = 0; id < n; ++id) {
    if (graph.kind(id) != Kind::kGlobal || !a.called[id] || a.reads_only[id]) continue;
    std::string display;
    if (VerdictOf(a, id, trust, &display) != Verdict::kCalls) continue;
    NodeId at = a.first_call[id];
    if (call_reported[at]) continue;
    call_reported[at] = 1;
    scan.findings.push_back({at, "calls " + display, display});
  }
  std::stable_sort(scan.findings.begin(), scan.findings.end(),
                   [](const UnsafeFinding& x, const UnsafeFinding& y) { return x.node < y.node; });
  std::sort(scan.names.begin(), scan.names.end(),
            [](const ImportedName& x, const ImportedName& y) { return x.name < y.name; });
  return scan;
}

std::string ExplainFinding(const UnsafeFinding& u) {
  if (u.called.empty()) return u.what + ", which can run code or reach the system when unpickled";
  std::string_view module = std::string_view(u.called).substr(0, u.called.rfind('.'));
  return fmt::format(
      "{} when loaded: not on torch's weights_only list nor on ckptool's allowlist of data "
      "constructors, so it runs code the file chooses (--trust {} accepts a module you trust)",
      u.what, module);
}

std::vector<UnsafeFinding> FindUnsafe(const Graph& graph, const Trust& trust) {
  return ScanPickle(graph, trust).findings;
}

std::string DescribeEffects(const Graph& graph, size_t max_items) {
  Analysis a(graph);
  std::vector<std::string> items;
  std::map<std::string, bool> said;
  auto say = [&](std::string item) {
    if (said.emplace(item, true).second) items.push_back(std::move(item));
  };
  auto tag = [](Verdict v, bool called) {
    if (v == Verdict::kUnsafe) return " (UNSAFE)";
    if (v == Verdict::kCalls && called) return " (UNSAFE: not on the allowlist)";
    return "";
  };
  const Trust none;
  for (NodeId id = 0; id < graph.nodes.size(); ++id) {
    Kind kind = graph.kind(id);
    if (kind == Kind::kGlobal) {
      std::string display;
      Verdict v = VerdictOf(a, id, none, &display);
      say(fmt::format("imports {}{}", display, tag(v, false)));
      continue;
    }
    if (kind != Kind::kObject) continue;
    NodeId callable = graph.compound(id).callable;
    if (callable == kNil) continue;
    if (graph.kind(callable) != Kind::kGlobal) {
      say("calls an object the pickle computed (UNSAFE)");
      continue;
    }
    std::string display;
    Verdict v = VerdictOf(a, callable, none, &display);
    const pickle::Compound& c = graph.compound(id);
    bool rebuilds = (c.construct == Construct::kNewObj || c.construct == Construct::kNewObjEx) &&
                    IsEmptyTuple(graph, c.args);
    say(fmt::format("{} {}{}", rebuilds ? "makes" : "calls", display, tag(v, !rebuilds)));
  }
  std::string out;
  for (size_t i = 0; i < items.size() && i < max_items; ++i) {
    out += (i ? ", " : "") + items[i];
  }
  if (items.size() > max_items) out += fmt::format(" and {} more", items.size() - max_items);
  return out;
}

}  // namespace ckpt::torch
