// The steps of a policy (ckptool.toml) on one checkpoint, each calling the op its command
// runs (shrink, strip, convert, export, verify, compress), and where their outputs go.
// Private to policy/: Applier (policy/apply.h) runs them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy/policy.h"

namespace ckpt::apply_steps {

// A checkpoint of this pass.
struct Entry {
  std::string name;  // in ROOT
  std::string path;  // ROOT/name
  int64_t step = -1;
  bool folder = false;
  bool archive = false;  // NAME.ckz: a compressed checkpoint (only retention applies)
  uint64_t rank = 0;     // 1 = the newest complete checkpoint retention keeps
};

// What a step did (or, in a dry run, would do).
struct StepOutcome {
  uint64_t before = 0;  // the checkpoint's bytes before and after (in-place steps)
  uint64_t after = 0;
  uint64_t written = 0;  // bytes of outputs written (copies)
  std::string message;
  std::vector<std::string> outputs;  // relative to ROOT
  std::vector<std::string> warnings;
  std::string became;  // the checkpoint's new entry name (compress: NAME.ckz replaced it)
};

struct StepContext {
  const std::string& root;
  const Entry& e;
  const policy::Policy& p;
  unsigned threads;
  bool dry_run;
  // The ledger knew this checkpoint before this pass (a step interrupted, options or files
  // changed): the outputs its steps wrote then are replaced. A checkpoint seen for the first
  // time finds its output places free, or the step fails rather than write over them.
  bool replace_outputs;
  std::vector<std::string> outputs_inside;  // absolute
};

// Is `rel` (relative to ROOT) `dir` or below it?
bool Inside(const std::string& rel, const std::string& dir);
// The policy's outputs that lie inside the checkpoint folder (not part of the checkpoint).
std::vector<std::string> OutputsInside(const policy::Policy& p, const Entry& e);
std::string Abs(const std::string& root, const std::string& rel);

// Runs `step` on c.e; throws ckpt::Error when it fails.
StepOutcome RunStep(policy::Step step, const StepContext& c);

}  // namespace ckpt::apply_steps
