#include "engines/reshard.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "cluster/partition.h"
#include "deepspeed/zero_checkpoint.h"
#include "engines/logical_export.h"
#include "engines/reshard_folder.h"
#include "engines/strip.h"
#include "io/atomic_output.h"
#include "io/file_copy.h"
#include "io/folders.h"
#include "io/parallel.h"
#include "io/text_file.h"
#include "writers/torch_output.h"

namespace ckpt {

namespace fs = std::filesystem;
using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;

namespace {

// optimizer_state.pt: rank 0's optimizer_state_dict without what is partitioned (stages 1/2:
// base_optimizer_state, param_slice_mappings, single_partition_of_fp32_groups; stage 3 keeps
// everything), and `param_groups` (stages 1/2: base_optimizer_state's; stage 3: the inner
// optimizer_state_dict's, the same object), as ds_to_universal's _save_optimizer_state does.
void OptimizerStateRoot(Graph& g, int stage) {
  NodeId osd = g.ValueAt(g.root, "optimizer_state_dict");
  if (osd == kNil || !g.has_compound(osd)) Fail("no optimizer_state_dict");
  NodeId inner = g.ValueAt(osd, stage <= 2 ? "base_optimizer_state" : "optimizer_state_dict");
  NodeId groups = g.ValueAt(inner, "param_groups");
  if (groups == kNil) Fail("no param_groups in the optimizer state");
  std::vector<NodeId> kept;
  std::span<const NodeId> pairs = g.pairs(osd);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (g.kind(pairs[i]) == Kind::kStr && stage <= 2) {
      std::string_view k = g.text(pairs[i]);
      if (k == "base_optimizer_state" || k == "param_slice_mappings" ||
          k == "single_partition_of_fp32_groups" || k == "param_groups")
        continue;
    }
    kept.push_back(pairs[i]);
    kept.push_back(pairs[i + 1]);
  }
  kept.push_back(g.AddText(Kind::kStr, "param_groups"));
  kept.push_back(groups);
  g.SetPairs(osd, kept);
  g.root = osd;
}

// A parameter's folder name: its dotted name, which must stay one path component inside zero/.
void CheckParameterName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos || name.size() > 255)
    Fail("parameter name '{}' cannot be a folder name in zero/", name);
}

}  // namespace

ReshardResult ReshardToUniversal(const std::string& checkpoint, const ReshardOptions& o) {
  const ReshardTeam& team = o.team;
  const bool root = team.rank == 0;
  ReshardResult r;
  deepspeed::ZeroCheckpoint z = deepspeed::OpenZeroCheckpoint(checkpoint, o.tag);
  if (z.universal) Fail("{}: a universal checkpoint already", z.folder);
  reshard::RefuseFindings(z.findings);
  r.source = z.folder;
  r.stage = z.stage;
  r.world_size = z.world_size;
  const fs::path dest = reshard::Destination(o.output, z.folder + "_universal");
  r.output = o.output.empty() ? z.folder + "_universal" : o.output;
  reshard::RefuseOverlap(dest, {z.folder}, r.output);
  const fs::path latest = dest.parent_path() / "latest_universal";
  r.latest_universal = (fs::path(r.output).parent_path() / "latest_universal").string();
  deepspeed::ZeroOptimizerState os = deepspeed::ConsolidateOptimizerState(z);
  r.keys = os.keys;
  for (const deepspeed::ZeroOptimizerState::Param& p : os.params)
    CheckParameterName(z.tensors[p.tensor].name);
  for (const std::string& k : os.keys) {
    if (k == "fp32" || k == "step") Fail("optimizer state key '{}' would clash with a file", k);
    CheckParameterName(k);
  }
  std::vector<const MappedFile*> inputs;
  std::vector<uint64_t> param_bytes;
  for (const auto& f : z.files) inputs.push_back(&f->map);
  for (const deepspeed::ZeroOptimizerState::Param& p : os.params) {
    param_bytes.push_back(z.tensors[p.tensor].numel * 4 * (1 + os.keys.size()));
  }
  if (team.agree) {
    std::string view = fmt::format("{} {} {}", z.folder, os.params.size(), os.keys.size());
    for (const MappedFile* in : inputs) view += fmt::format(" {}", in->size());
    team.agree(view, fmt::format("{}, {} parameters, {} files", z.folder, os.params.size(),
                                 inputs.size()));
  }

  // Rank 0 checks the destination and the input, and lays out the folder: the model states
  // files, optimizer_state.pt, each group's step (stages 1/2) once.
  std::error_code ec;
  reshard::OutputFolder output(dest, r.output);
  TempFolder& tmp = output.tmp;
  std::string prepared_error;
  if (root) {
    try {
      output.CheckDestination(o.force);
      if (fs::exists(latest, ec) && !o.force &&
          ReadMarkerFile(latest.string()) != dest.filename().string()) {
        Fail("{}: exists and names '{}' (use --force to point it at {})", latest.string(),
             ReadMarkerFile(latest.string()), dest.filename().string());
      }
      output.Create(z.folder, o.threads);
      fs::create_directory(fs::path(tmp.path) / "zero");
      size_t copies = z.stage <= 2 ? 1 : z.model_files;
      for (size_t i = 0; i < copies; ++i) {
        CopyFileAtomically(z.files[i]->map,
                           (fs::path(tmp.path) / fs::path(z.files[i]->path).filename()).string());
      }
      const std::string rank0 = z.files[os.step_file]->path;
      WriteObjectOf(
          rank0, (fs::path(tmp.path) / "zero" / "optimizer_state.pt").string(),
          [&](Graph& g) { OptimizerStateRoot(g, z.stage); }, o.threads);
      for (size_t gi = 0; z.stage <= 2 && gi < os.steps.size(); ++gi) {
        if (os.steps[gi] == kNil) continue;
        NodeId step = os.steps[gi];
        WriteObjectOf(
            rank0, (fs::path(tmp.path) / fmt::format("step-{}.pt", gi)).string(),
            [step](Graph& g) { g.root = step; }, 1);
      }
    } catch (const std::exception& e) {
      if (!team.decide) throw;
      prepared_error = e.what();  // every rank stops at ShareFolder
    }
  }
  reshard::ShareFolder(team, tmp, prepared_error);
  const fs::path zero = fs::path(tmp.path) / "zero";
  std::vector<std::string> step_bytes(os.steps.size());
  for (size_t gi = 0; z.stage <= 2 && gi < os.steps.size(); ++gi) {
    if (os.steps[gi] == kNil) continue;
    std::ifstream in(fs::path(tmp.path) / fmt::format("step-{}.pt", gi), std::ios::binary);
    step_bytes[gi].assign(std::istreambuf_iterator<char>(in), {});
    if (step_bytes[gi].empty()) Fail("{}: the step of group {} was not written", tmp.path, gi);
  }

  // Every parameter's files (this rank's share in an MPI job), parameters side by side.
  const auto root_kind =
      z.stage <= 2 ? TorchOutputOptions::Root::kUniversalParam : TorchOutputOptions::Root::kTensor;
  std::vector<size_t> mine;
  if (team.size > 1) {
    mine = cluster::ItemsOf(cluster::PartitionByBytes(param_bytes, team.size), team.rank);
  } else {
    for (size_t i = 0; i < os.params.size(); ++i) mine.push_back(i);
  }
  std::atomic<uint64_t> files{0};
  std::string write_error;
  try {
    ParallelFor(mine.size(), o.threads, [&](size_t m) {
      const deepspeed::ZeroOptimizerState::Param& p = os.params[mine[m]];
      const deepspeed::ZeroTensor& fp32 = z.tensors[p.tensor];
      const fs::path folder = zero / fp32.name;
      fs::create_directory(folder);
      auto write = [&](const deepspeed::ZeroTensor& t, const std::string& file) {
        LogicalTensor lt = deepspeed::ZeroLogicalTensor(z, t);
        TensorSource src = LogicalSource(lt, t.dtype);
        src.name = "param";
        // Stage 3 files hold the flat tensor (ds_to_universal: torch.cat of the 1-D pieces).
        if (z.stage == 3) src.shape = {static_cast<int64_t>(t.numel)};
        TorchOutputOptions to;
        to.inputs = inputs;
        to.root = root_kind;
        WriteTorchModel((folder / file).string(), {std::move(src)}, {}, to);
        ++files;
      };
      write(fp32, "fp32.pt");
      for (size_t k = 0; k < os.keys.size(); ++k) {
        deepspeed::ZeroTensor t = fp32;
        t.stored = t.dtype = os.dtypes[k];
        t.pieces = p.pieces[k];
        write(t, os.keys[k] + ".pt");
      }
      if (p.group < 0 || static_cast<size_t>(p.group) >= step_bytes.size())
        Fail("internal: parameter '{}' is in no group", fp32.name);
      const std::string& step = step_bytes[static_cast<size_t>(p.group)];
      if (!step.empty()) {
        std::string path = (folder / "step.pt").string();
        AtomicOutput out = AtomicOutput::Create(path, step.size());
        out.Write(0, AsBytes(step));
        out.Commit();
        ++files;
      }
    });
  } catch (const std::exception& e) {
    if (!team.confirm) throw;
    write_error = e.what();  // rank 0 hears of it at ConfirmShares
  }
  if (!reshard::ConfirmShares(team, write_error)) {
    r.parameters = mine.size();
    r.files = files;
    return r;
  }
  for (size_t gi = 0; gi < os.steps.size(); ++gi)
    fs::remove(fs::path(tmp.path) / fmt::format("step-{}.pt", gi), ec);
  r.parameters = os.params.size();
  const reshard::TreeTotals totals = reshard::SyncTree(tmp.path);
  r.files = totals.files;
  r.bytes = totals.bytes;
  reshard::InstallFolder(tmp, dest, output.replace, inputs, r.output);
  output.created.Keep();
  const std::string name = dest.filename().string();
  AtomicOutput marker = AtomicOutput::Create(latest.string(), name.size());
  marker.Write(0, AsBytes(name));
  marker.Commit();
  return r;
}

}  // namespace ckpt
