#include "engines/shrink.h"

#include <fmt/format.h>

#include <filesystem>

#include "base/error.h"
#include "base/human.h"
#include "checkpoint/discovery.h"
#include "file/checkpoint_file.h"
#include "io/file_copy.h"
#include "rewriters/rewritable.h"
#include "rewriters/shrink_plan.h"
#include "rewriters/torch_rewrite.h"

namespace ckpt {

bool Shrinkable(const std::string& path) {
  return FileKindOf(path) == FileKind::kTorch;
}

ShrinkResult ShrinkFile(const std::string& path, const ShrinkOptions& o) {
  ShrinkResult r;
  r.path = path;
  CheckpointFile f = OpenCheckpoint(path);
  r.before = r.after = f.map.size();
  r.output = o.output.empty() ? path : o.output;
  if (!f.torch) {
    r.note = "safetensors files hold no views: nothing to shrink";
    return r;
  }
  CheckRewritable(f, o.allow_unsafe_globals, o.trust, o.threads);
  ShrinkPlan plan = PlanShrink(*f.torch, o.materialize);
  if (!plan.changes) {
    r.note = "nothing to drop";
    if (!o.dry_run && r.output != path) CopyFileAtomically(f.map, r.output);
    return r;
  }
  TorchRewrite rewrite(f, std::move(plan.rewrite));
  if (rewrite.output_size() >= r.before) {
    // Never a bigger file: what could be dropped costs more to cut out than it holds.
    r.note = fmt::format("a rewrite would take {}, not less than its {}; left as it is",
                         HumanBytes(rewrite.output_size()), HumanBytes(r.before));
    if (!o.dry_run && r.output != path) CopyFileAtomically(f.map, r.output);
    return r;
  }
  r.after = rewrite.output_size();
  if (o.dry_run) {
    r.note = "dry run";
    return r;
  }
  WriteProgress progress;
  progress.bytes_done = o.bytes_done;
  rewrite.Write(r.output, o.threads, progress);
  r.rewritten = true;
  return r;
}

}  // namespace ckpt
