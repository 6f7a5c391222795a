// Which rank of an MPI job handles which item (file, folder, output shard).
//
// Balanced by bytes, deterministic: items are taken largest first (equal sizes: lower index
// first), each given to the rank with the fewest bytes so far (equal loads: lower rank).
// Every item counts one byte more than its size, so empty files spread round-robin instead
// of piling onto one rank. The greedy (LPT) rule keeps the largest load within 4/3 of the
// best possible split, and within one item of the mean when no item dominates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ckpt::cluster {

// owner[i] = the rank that handles item i.
std::vector<int> PartitionByBytes(const std::vector<uint64_t>& bytes, int ranks);

// The items `rank` owns, in input order.
std::vector<size_t> ItemsOf(const std::vector<int>& owner, int rank);

}  // namespace ckpt::cluster
