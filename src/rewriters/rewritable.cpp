#include "rewriters/rewritable.h"

#include <vector>

#include "base/error.h"
#include "checkpoint/verify.h"
#include "torch/global_policy.h"

namespace ckpt {

void CheckUndamaged(const CheckpointFile& f, unsigned threads) {
  if (!f.torch || !f.torch->archive) return;
  VerifyResult r;
  CheckRecordCrcs(f, threads, r);
  if (r.problems.empty()) return;
  Fail(
      "{}: record '{}': {}{}; refusing a damaged input: a rewrite would write fresh checksums "
      "over bytes that fail theirs, and the damage would no longer show (run ckptool verify)",
      f.path, r.problems[0].where, r.problems[0].what,
      r.problems.size() > 1 ? fmt::format(" ({} damaged records in all)", r.problems.size()) : "");
}

void CheckRewritable(const CheckpointFile& f, bool allow_unsafe_globals, const torch::Trust& trust,
                     unsigned threads) {
  const torch::Model& m = f.torch->model;
  if (!m.problems.empty()) {
    Fail("{}: {}: {} (run ckptool verify); not rewriting a damaged file", f.path,
         m.problems[0].where, m.problems[0].what);
  }
  CheckUndamaged(f, threads);
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
