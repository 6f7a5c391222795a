#include "ops/shrink.h"

#include <filesystem>

#include "base/error.h"
#include "io/atomic_output.h"
#include "ops/checkpoint_file.h"
#include "ops/shrink_plan.h"
#include "ops/torch_rewrite.h"
#include "torch/global_policy.h"

namespace ckpt {

namespace {

// Refuses files whose rewrite could lose something or launder something.
void CheckRewritable(const CheckpointFile& f, const ShrinkOptions& o) {
  const torch::Model& m = f.torch->model;
  if (!m.problems.empty()) {
    Fail("{}: {}: {} (run ckptool verify); not rewriting a damaged file", f.path,
         m.problems[0].where, m.problems[0].what);
  }
  if (!m.notes.empty()) Fail("{}: {}; not rewriting what ckptool does not fully understand", f.path, m.notes[0]);
  if (o.allow_unsafe_globals) return;
  for (pickle::NodeId id = 0; id < m.graph.nodes.size(); ++id) {
    if (m.graph.kind(id) == pickle::Kind::kGlobal &&
        torch::ClassifyGlobal(m.graph.global_module(id), m.graph.global_name(id)) ==
            torch::GlobalClass::kUnsafe) {
      Fail("{}: the pickle imports {}, which can run code when loaded; not rewriting it "
           "(--allow-unsafe-globals overrides)", f.path, m.graph.GlobalText(id));
    }
  }
}

void CopyUnchanged(const CheckpointFile& f, const std::string& dest) {
  AtomicOutput out = AtomicOutput::Create(dest, f.map.size());
  out.CopyFrom(f.map.fd(), 0, 0, f.map.size());
  out.SetMode(f.map.mode(), f.map.uid(), f.map.gid());
  out.Commit();
}

}  // namespace

ShrinkResult ShrinkFile(const std::string& path, const ShrinkOptions& o) {
  ShrinkResult r;
  r.path = path;
  CheckpointFile f = OpenCheckpoint(path);
  r.before = r.after = f.map.size();
  r.output = o.output_dir.empty()
                 ? path
                 : (std::filesystem::path(o.output_dir) / std::filesystem::path(path).filename()).string();
  if (!f.torch) {
    r.note = "safetensors files hold no views: nothing to shrink";
    return r;
  }
  CheckRewritable(f, o);
  ShrinkPlan plan = PlanShrink(*f.torch, o.materialize);
  if (!plan.changes) {
    r.note = "nothing to drop";
    if (!o.dry_run && r.output != path) CopyUnchanged(f, r.output);
    return r;
  }
  TorchRewrite rewrite(f, std::move(plan.rewrite));
  r.after = rewrite.output_size();
  if (o.dry_run) {
    r.note = "dry run";
    return r;
  }
  WriteStats stats;
  stats.bytes_done = o.bytes_done;
  rewrite.Write(r.output, o.threads, stats);
  r.rewritten = true;
  return r;
}

}  // namespace ckpt
