#include "cluster/partition.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

namespace ckpt::cluster {

std::vector<int> PartitionByBytes(const std::vector<uint64_t>& bytes, int ranks) {
  ranks = std::max(1, ranks);
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  // (load, rank), least loaded on top; equal loads give the lower rank.
  using Load = std::pair<uint64_t, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> loads;
  for (int r = 0; r < ranks; ++r) loads.push({0, r});
  std::vector<int> owner(bytes.size(), 0);
  for (size_t i : order) {
    Load least = loads.top();
    loads.pop();
    owner[i] = least.second;
    least.first += bytes[i] + 1;
    loads.push(least);
  }
  return owner;
}

std::vector<size_t> ItemsOf(const std::vector<int>& owner, int rank) {
  std::vector<size_t> mine;
  for (size_t i = 0; i < owner.size(); ++i) {
    if (owner[i] == rank) mine.push_back(i);
  }
  return mine;
}

}  // namespace ckpt::cluster
