#include "pickle/graph_compare.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>
#include <vector>

namespace ckpt::pickle {

namespace {

class Comparer {
 public:
  Comparer(const Graph& a, const Graph& b, const std::function<bool(NodeId)>& skip)
      : a_(a), b_(b), skip_(skip), a_to_b_(a.nodes.size(), kNil), b_to_a_(b.nodes.size(), kNil) {}

  std::string Run(NodeId x, NodeId y) {
    std::vector<std::pair<NodeId, NodeId>> work{{x, y}};
    while (!work.empty()) {
      auto [p, q] = work.back();
      work.pop_back();
      if (p == kNil || q == kNil) {
        if (p != q) return "one side is missing a value";
        continue;
      }
      if (skip_ && skip_(p)) continue;
      if (a_to_b_[p] != kNil || b_to_a_[q] != kNil) {
        if (a_to_b_[p] != q || b_to_a_[q] != p) {
          return fmt::format("sharing differs at pickle offset {}", a_.at(p).stream_offset);
        }
        continue;
      }
      a_to_b_[p] = q;
      b_to_a_[q] = p;
      std::string diff = Shallow(p, q);
      if (!diff.empty()) return fmt::format("{} (pickle offset {})", diff, a_.at(p).stream_offset);
      if (!a_.has_compound(p)) continue;
      const Compound& c = a_.compound(p);
      const Compound& d = b_.compound(q);
      std::span<const NodeId> ci = a_.items(p), di = b_.items(q);
      std::span<const NodeId> cp = a_.pairs(p), dp = b_.pairs(q);
      std::span<const NodeId> cs = a_.states(p), ds = b_.states(q);
      if (ci.size() != di.size() || cp.size() != dp.size() || cs.size() != ds.size() ||
          c.construct != d.construct) {
        return fmt::format("{} differs in size (pickle offset {})", KindName(a_.kind(p)),
                           a_.at(p).stream_offset);
      }
      for (size_t i = 0; i < ci.size(); ++i) work.emplace_back(ci[i], di[i]);
      for (size_t i = 0; i < cp.size(); ++i) work.emplace_back(cp[i], dp[i]);
      for (size_t i = 0; i < cs.size(); ++i) work.emplace_back(cs[i], ds[i]);
      work.emplace_back(c.callable, d.callable);
      work.emplace_back(c.args, d.args);
      work.emplace_back(c.kwargs, d.kwargs);
    }
    return "";
  }

 private:
  std::string Shallow(NodeId p, NodeId q) {
    const Node& x = a_.at(p);
    const Node& y = b_.at(q);
    if (x.kind != y.kind) return fmt::format("{} became {}", KindName(x.kind), KindName(y.kind));
    switch (x.kind) {
      case Kind::kBool:
        if (x.boolean != y.boolean) return "bool differs";
        break;
      case Kind::kInt:
        if (x.integer != y.integer) return fmt::format("int {} became {}", x.integer, y.integer);
        break;
      case Kind::kFloat:
        if (std::memcmp(&x.real, &y.real, sizeof x.real) != 0) return "float differs";
        break;
      case Kind::kGlobal:
        if (a_.GlobalText(p) != b_.GlobalText(q)) {
          return fmt::format("global {} became {}", a_.GlobalText(p), b_.GlobalText(q));
        }
        break;
      case Kind::kBigInt:
      case Kind::kStr:
      case Kind::kBytes:
      case Kind::kByteArray:
        if (a_.text(p) != b_.text(q)) return fmt::format("{} differs", KindName(x.kind));
        break;
      default:
        break;
    }
    return "";
  }

  const Graph& a_;
  const Graph& b_;
  const std::function<bool(NodeId)>& skip_;
  std::vector<NodeId> a_to_b_;
  std::vector<NodeId> b_to_a_;
};

}  // namespace

std::string CompareGraphs(const Graph& a, NodeId a_root, const Graph& b, NodeId b_root,
                          const std::function<bool(NodeId)>& skip) {
  return Comparer(a, b, skip).Run(a_root, b_root);
}

}  // namespace ckpt::pickle
