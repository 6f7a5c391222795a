#include "torch/global_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "torch/signatures.h"
#include "torch/value_kinds.h"

namespace ckpt::torch {

namespace {

using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;

std::string Display(const Graph& g, NodeId global) {
  return DisplayGlobal(g.global_module(global), g.global_name(global));
}

Verdict VerdictOf(const Graph& g, const ValueKinds& k, NodeId global) {
  std::string_view module = g.global_module(global), name = g.global_name(global);
  GlobalClass cls = ClassifyGlobal(module, name);
  if (cls == GlobalClass::kUnsafe) return Verdict::kUnsafe;
  if (cls == GlobalClass::kTorchAllowed) return Verdict::kWeightsOnly;
  if (IsAllowedGlobal(module, name)) return Verdict::kAllowed;
  if (k.trusted(global)) return Verdict::kTrusted;
  if (k.called(global)) return Verdict::kCalls;
  if (k.rebuilt(global)) return Verdict::kReconstructed;
  return Verdict::kReferenced;
}

// getattr(G, 'S') with exactly a global and a string: the attribute path it reads.
bool AsAttributePath(const Graph& g, NodeId call, NodeId* target, NodeId* attr) {
  if (g.ArgCount(call) != 2) return false;
  *target = g.Arg(call, 0);
  *attr = g.Arg(call, 1);
  return g.kind(*target) == Kind::kGlobal && g.kind(*attr) == Kind::kStr;
}

}  // namespace

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
  ValueKinds k(graph, trust);

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
  scan.accepted.resize(n);
  for (NodeId id = 0; id < n; ++id) {
    scan.accepted[id] = k.accepted(id);
    Kind kind = graph.kind(id);
    if (kind == Kind::kGlobal) {
      if (k.reads_only(id)) continue;  // judged by its reads below
      add_name({Display(graph, id), graph.GlobalText(id),
                ClassifyGlobal(graph.global_module(id), graph.global_name(id)), false,
                VerdictOf(graph, k, id)});
      continue;
    }
    if (kind != Kind::kObject) continue;
    NodeId fn = graph.compound(id).callable;
    NodeId target = kNil, attr = kNil;
    if (fn == kNil || graph.kind(fn) != Kind::kGlobal || Display(graph, fn) != "builtins.getattr" ||
        !AsAttributePath(graph, id, &target, &attr)) {
      continue;
    }
    std::string path = fmt::format("{}.{}", Display(graph, target), graph.text(attr));
    Verdict v = Verdict::kUnsafe;
    if (k.is_attribute_read(id) && k.accepted(id)) {
      v = IsAllowedEnum(Display(graph, target)) ? Verdict::kAllowed : Verdict::kTrusted;
    }
    add_name({path + " (getattr)", fmt::format("{}.{}", graph.GlobalText(target), graph.text(attr)),
              GlobalClass::kOther, true, v});
  }
  for (const Refusal& r : k.refusals()) scan.findings.push_back({r.node, r.what, r.called});
  std::sort(scan.names.begin(), scan.names.end(),
            [](const ImportedName& x, const ImportedName& y) { return x.name < y.name; });
  return scan;
}

std::string ExplainFinding(const UnsafeFinding& u) {
  if (u.called.empty()) {
    if (u.what.starts_with("imports ") || u.what.starts_with("reads ") ||
        u.what.starts_with("calls what ") || u.what.starts_with("calls a computed ")) {
      return u.what + ", which can run code or reach the system when unpickled";
    }
    return u.what;
  }
  std::string_view module = std::string_view(u.called).substr(0, u.called.rfind('.'));
  if (u.what.starts_with("calls ")) {
    return fmt::format(
        "{} when loaded: not on torch's weights_only list nor on ckptool's allowlist of data "
        "constructors, so it runs code the file chooses (--trust {} accepts a module you trust)",
        u.what, module);
  }
  if (u.what.starts_with("reads ")) {
    return fmt::format(
        "{}: only members of allowlisted Enums are read this way (--trust {} accepts a module "
        "you trust)",
        u.what, module);
  }
  return fmt::format("{} (--trust {} accepts a module you trust)", u.what, module);
}

std::vector<UnsafeFinding> FindUnsafe(const Graph& graph, const Trust& trust) {
  return ScanPickle(graph, trust).findings;
}

std::string DescribeEffects(const Graph& graph, size_t max_items) {
  const Trust none;
  ValueKinds k(graph, none);
  std::vector<std::string> items;
  std::map<std::string, bool> said;
  auto say = [&](std::string item) {
    if (said.emplace(item, true).second) items.push_back(std::move(item));
  };
  for (NodeId id = 0; id < graph.nodes.size(); ++id) {
    Kind kind = graph.kind(id);
    if (kind == Kind::kGlobal) {
      bool unsafe =
          ClassifyGlobal(graph.global_module(id), graph.global_name(id)) == GlobalClass::kUnsafe;
      say(fmt::format("imports {}{}", Display(graph, id), unsafe ? " (UNSAFE)" : ""));
      continue;
    }
    if (kind != Kind::kObject) continue;
    NodeId callable = graph.compound(id).callable;
    if (callable == kNil) continue;
    if (graph.kind(callable) != Kind::kGlobal) {
      say("calls an object the pickle computed (UNSAFE)");
      continue;
    }
    bool rebuilds = MakesWithoutCall(graph, id);
    Verdict v = VerdictOf(graph, k, callable);
    const char* tag = "";
    if (v == Verdict::kUnsafe) {
      tag = " (UNSAFE)";
    } else if (v == Verdict::kCalls || v == Verdict::kReconstructed) {
      tag = " (UNSAFE: not on the allowlist)";
    } else if (!k.accepted(id)) {
      tag = " (UNSAFE)";
    }
    say(fmt::format("{} {}{}", rebuilds ? "makes" : "calls", Display(graph, callable), tag));
  }
  std::string out;
  for (size_t i = 0; i < items.size() && i < max_items; ++i) {
    out += (i ? ", " : "") + items[i];
  }
  if (items.size() > max_items) out += fmt::format(" and {} more", items.size() - max_items);
  return out;
}

}  // namespace ckpt::torch
