// The steps every ckptool run goes through in an MPI job: on every rank, in this order,
// whatever happens on each rank.
//
//   1. Agree    each rank's view of the work (a fingerprint of the inputs it found and of
//               the plan) or the error that stopped it; rank 0 compares them and says go or
//               stop. Ranks that see other files (a node with another mount, a file still
//               growing) stop the job before anything is written.
//   2. Collect  each rank's results to rank 0, which prints the one report.
//   3. Decide   rank 0's decision on what was collected, to every rank (sharded export:
//               which shards to put into place).
//   4. Confirm  each rank's outcome of acting on it, to rank 0 (then: write the index).
//   5. Finish   the exit code: the largest over all ranks, the same on every rank.
//
// The per-file commands use Agree and Collect; sharded export all of them.
//
// A rank that leaves a command early (an error, a command only rank 0 runs, nothing to
// share) passes the steps it skipped in Finish(), sending its error along, so no rank ever
// waits at a step another will not reach. Errors printed on other ranks are not printed
// there: rank 0 prints them, "rank K of N: ..." in front, unless it printed the same itself.
// In a single process every step is a no-op.
#pragma once

#include <string>
#include <vector>

namespace ckpt::cluster {

// Thrown by Agree() on every rank when the job stops there; rank 0 has said why.
struct Stopped {
  int rc;
};

// Step 1. `view` must come out equal on every rank; `summary` says what it is in words
// ("12 files, 3.4 GiB") for the message when it does not.
void Agree(const std::string& view, const std::string& summary);

// Step 2. Rank 0 gets one entry per rank (index = rank); other ranks an empty vector.
struct RankResult {
  bool ok = true;       // false: the rank failed before it had results
  std::string payload;  // what the rank sent
  std::string error;    // why it failed (rank 0 has printed it)
};
std::vector<RankResult> Collect(const std::string& payload);

// Step 3. `value` is rank 0's; every rank returns it.
std::string Decide(const std::string& value);

// Step 4. Rank 0 gets "" when every rank says "", else the first error (lowest rank);
// other ranks get "".
std::string Confirm(const std::string& error);

// Step 5, called once by main() with this rank's exit code: passes the steps this rank
// skipped, then returns the exit code of the job.
int Finish(int rc);

// For a process that runs one command after another (the Python package; never under MPI):
// the next command's steps start again from step 1.
void BeginCommand();

// Error messages go through here on every rank: true when the caller prints it (rank 0),
// false when it is kept to be sent to rank 0 (every other rank).
bool ShouldPrintError(const std::string& message);

}  // namespace ckpt::cluster
