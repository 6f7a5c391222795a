// `ckptool reshard CKPT --to zero --world-size M`: engines/reshard.h.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>

#include "base/error.h"
#include "deepspeed/zero_checkpoint.h"
#include "deepspeed/zero_rank_plan.h"
#include "engines/logical_export.h"
#include "engines/reshard.h"
#include "engines/reshard_folder.h"
#include "engines/strip.h"
#include "io/atomic_output.h"
#include "io/file_copy.h"
#include "io/parallel.h"
#include "writers/torch_output.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

// The default output: the root's name with "-<M>ranks" before its extension
// ("ckpt" -> "ckpt-3ranks", "epoch=1-step=9.ckpt" -> "epoch=1-step=9-3ranks.ckpt").
std::string DefaultOutput(const fs::path& root, int world) {
  fs::path name = root.filename();
  return (root.parent_path() /
          fmt::format("{}-{}ranks{}", name.stem().string(), world, name.extension().string()))
      .string();
}

// One planned file written: its tensors gathered from the checkpoint's pieces.
void WritePlanned(const deepspeed::ZeroCheckpoint& z, deepspeed::PlannedRankFile plan,
                  const fs::path& folder, const std::vector<const MappedFile*>& inputs,
                  unsigned threads) {
  std::deque<LogicalTensor> logical;  // the sources read through these
  std::vector<GraphTensor> tensors;
  tensors.reserve(plan.tensors.size());
  for (const auto& [node, t] : plan.tensors) {
    logical.push_back(deepspeed::ZeroLogicalTensor(z, t));
    TensorSource src = LogicalSource(logical.back(), t.dtype);
    src.shape = t.shape;
    tensors.push_back({node, std::move(src)});
  }
  TorchOutputOptions to;
  to.inputs = inputs;
  to.threads = threads;
  WriteTorchObject((folder / plan.name).string(), std::move(plan.graph), std::move(tensors), to);
}

}  // namespace

ReshardResult ReshardToZero(const std::string& checkpoint, const ReshardOptions& o) {
  const ReshardTeam& team = o.team;
  const bool root = team.rank == 0;
  const int world = o.world_size;
  ReshardResult r;
  deepspeed::ZeroCheckpoint z = deepspeed::OpenZeroCheckpoint(checkpoint, o.tag);
  if (z.universal)
    Fail("{}: a universal checkpoint; DeepSpeed loads it on any number of ranks as it is",
         z.folder);
  reshard::RefuseFindings(z.findings);
  r.source = z.folder;
  r.tag = z.tag;
  r.stage = z.stage;
  r.world_size = z.world_size;
  r.to_world_size = world;
  const fs::path source_root = fs::absolute(z.folder).lexically_normal().parent_path();
  const std::string fallback = DefaultOutput(source_root, world);
  const fs::path dest = reshard::Destination(o.output, fallback);
  r.output = o.output.empty() ? fallback : o.output;
  reshard::RefuseOverlap(dest, {z.folder}, r.output);
  if (fs::weakly_canonical(dest) == fs::weakly_canonical(source_root))
    Fail("{}: the output would replace the checkpoint's own folder; choose another -o", r.output);
  deepspeed::ZeroOptimizerState os = deepspeed::ConsolidateOptimizerState(z);
  deepspeed::CheckRepartition(z, os, world);
  r.keys = os.keys;
  r.parameters = os.params.size();
  std::vector<const MappedFile*> inputs;
  for (const auto& f : z.files) inputs.push_back(&f->map);
  if (team.agree) {
    std::string view = fmt::format("{} {} {}", z.folder, world, os.params.size());
    for (const MappedFile* in : inputs) view += fmt::format(" {}", in->size());
    team.agree(view,
               fmt::format("{}, {} parameters for {} ranks", z.folder, os.params.size(), world));
  }

  // Rank 0 checks the destination and the input, and lays out the folder: `latest`, the
  // recovery scripts, and (stages 1/2) the one model states file.
  reshard::OutputFolder output(dest, r.output);
  TempFolder& tmp = output.tmp;
  std::string prepared_error;
  if (root) {
    try {
      output.CheckDestination(o.force);
      output.Create(z.folder, o.threads);
      fs::create_directory(fs::path(tmp.path) / z.tag);
      AtomicOutput latest =
          AtomicOutput::Create((fs::path(tmp.path) / "latest").string(), z.tag.size());
      latest.Write(0, AsBytes(z.tag));
      latest.Commit();
      for (const auto& e : fs::directory_iterator(source_root)) {
        // DeepSpeed's recovery scripts (zero_to_fp32.py...), which it copies into every root.
        const std::string name = e.path().filename().string();
        if (e.is_regular_file() && name.starts_with("zero_to_") && name.ends_with(".py")) {
          CopyFileAtomically(MappedFile::Open(e.path().string()),
                             (fs::path(tmp.path) / e.path().filename()).string());
        }
      }
      if (z.stage <= 2) {
        WriteObjectOf(
            z.files[0]->path,
            (fs::path(tmp.path) / z.tag / fs::path(z.files[0]->path).filename()).string(),
            [world](pickle::Graph& g) { deepspeed::SetWorldSize(g, world); }, o.threads);
      }
    } catch (const std::exception& e) {
      if (!team.decide) throw;
      prepared_error = e.what();  // every rank stops at ShareFolder
    }
  }
  reshard::ShareFolder(team, tmp, prepared_error);

  // Every target rank's files (this process's share in an MPI job), ranks side by side.
  std::vector<size_t> mine;
  for (int t = 0; t < world; ++t) {
    if (t % team.size == team.rank) mine.push_back(static_cast<size_t>(t));
  }
  const fs::path folder = fs::path(tmp.path) / z.tag;
  std::atomic<uint64_t> files{0};
  std::string write_error;
  // Small files side by side; a large one (what one rank holds of the optimizer files: 64 MiB
  // or more) with every thread writing pieces of it, one file after the other.
  uint64_t optimizer_bytes = 0;
  for (size_t i = z.model_files; i < z.files.size(); ++i) optimizer_bytes += z.files[i]->map.size();
  const bool large = optimizer_bytes / static_cast<uint64_t>(world) >= (64ull << 20);
  const size_t side_by_side =
      large ? 1 : std::max<size_t>(1, std::min<size_t>(o.threads, mine.size()));
  const unsigned per_file = std::max(1u, static_cast<unsigned>(o.threads / side_by_side));
  try {
    ParallelFor(mine.size(), static_cast<unsigned>(side_by_side), [&](size_t m) {
      for (deepspeed::PlannedRankFile& plan :
           deepspeed::PlanRankFiles(z, os, world, static_cast<int>(mine[m]))) {
        WritePlanned(z, std::move(plan), folder, inputs, per_file);
        ++files;
      }
    });
  } catch (const std::exception& e) {
    if (!team.confirm) throw;
    write_error = e.what();  // rank 0 hears of it at ConfirmShares
  }
  if (!reshard::ConfirmShares(team, write_error)) {
    r.files = files;
    return r;
  }
  const reshard::TreeTotals totals = reshard::SyncTree(tmp.path);
  r.files = totals.files;
  r.bytes = totals.bytes;
  reshard::InstallFolder(tmp, dest, output.replace, inputs, r.output);
  output.created.Keep();
  return r;
}

}  // namespace ckpt
