#include "ops/rewritable.h"

#include <vector>

#include "base/error.h"
#include "torch/global_policy.h"

namespace ckpt {

void CheckRewritable(const CheckpointFile& f, bool allow_unsafe_globals,
                     const torch::Trust& trust) {
  const torch::Model& m = f.torch->model;
  if (!m.problems.empty()) {
    Fail("{}: {}: {} (run ckptool verify); not rewriting a damaged file", f.path,
         m.problems[0].where, m.problems[0].what);
  }
  if (!m.notes.empty())
    Fail("{}: {}; not rewriting what ckptool does not fully understand", f.path, m.notes[0]);
  if (allow_unsafe_globals) return;
  std::vector<torch::UnsafeFinding> unsafe = torch::FindUnsafe(m.graph, trust);
  if (unsafe.empty()) return;
  if (!unsafe[0].called.empty()) {
    Fail(
        "{}: the pickle {} when loaded, which is on no allowlist, so it runs code the file "
        "chooses; not rewriting it (--trust MODULE or --allow-unsafe-globals overrides)",
        f.path, unsafe[0].what);
  }
  Fail(
      "{}: the pickle {}, which can run code when loaded; not rewriting it "
      "(--allow-unsafe-globals overrides)",
      f.path, unsafe[0].what);
}

}  // namespace ckpt
