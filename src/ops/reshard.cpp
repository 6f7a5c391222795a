#include "ops/reshard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "deepspeed/zero_checkpoint.h"
#include "io/atomic_output.h"
#include "io/file_copy.h"
#include "io/folders.h"
#include "io/parallel.h"
#include "io/temp_files.h"
#include "io/text_file.h"
#include "ops/integrity.h"
#include "ops/logical_export.h"
#include "ops/strip.h"
#include "ops/torch_output.h"

namespace ckpt {

namespace fs = std::filesystem;
using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;

namespace {

NodeId Lookup(const Graph& g, NodeId node, std::string_view key) {
  if (node == kNil || !g.has_compound(node)) return kNil;
  std::span<const NodeId> pairs = g.pairs(node);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (g.kind(pairs[i]) == Kind::kStr && g.text(pairs[i]) == key) return pairs[i + 1];
  }
  return kNil;
}

// optimizer_state.pt: rank 0's optimizer_state_dict without what is partitioned (stages 1/2:
// base_optimizer_state, param_slice_mappings, single_partition_of_fp32_groups; stage 3 keeps
// everything), and `param_groups` (stages 1/2: base_optimizer_state's; stage 3: the inner
// optimizer_state_dict's, the same object), as ds_to_universal's _save_optimizer_state does.
void OptimizerStateRoot(Graph& g, int stage) {
  NodeId osd = Lookup(g, g.root, "optimizer_state_dict");
  if (osd == kNil || !g.has_compound(osd)) Fail("no optimizer_state_dict");
  NodeId inner = Lookup(g, osd, stage <= 2 ? "base_optimizer_state" : "optimizer_state_dict");
  NodeId groups = Lookup(g, inner, "param_groups");
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

uint64_t FileBytes(const std::string& path) {
  std::error_code ec;
  uint64_t n = fs::file_size(path, ec);
  return ec ? 0 : n;
}

}  // namespace

ReshardResult ReshardToUniversal(const std::string& checkpoint, const ReshardOptions& o) {
  ReshardResult r;
  deepspeed::ZeroCheckpoint z = deepspeed::OpenZeroCheckpoint(checkpoint, o.tag);
  r.source = z.folder;
  r.stage = z.stage;
  r.world_size = z.world_size;
  fs::path dest =
      fs::absolute(o.output.empty() ? fs::path(z.folder + "_universal") : fs::path(o.output))
          .lexically_normal();
  if (dest.filename().empty()) dest = dest.parent_path();
  r.output = o.output.empty() ? z.folder + "_universal" : o.output;
  const fs::path latest = dest.parent_path() / "latest_universal";
  r.latest_universal = (fs::path(r.output).parent_path() / "latest_universal").string();
  std::error_code ec;
  const bool replace = fs::exists(dest, ec);
  if (replace && !o.force) Fail("{}: exists (use --force to write it again)", r.output);
  if (replace && !fs::is_directory(dest, ec)) Fail("{}: exists and is not a folder", r.output);
  if (fs::exists(latest, ec) && !o.force &&
      ReadMarkerFile(latest.string()) != dest.filename().string()) {
    Fail("{}: exists and names '{}' (use --force to point it at {})", latest.string(),
         ReadMarkerFile(latest.string()), dest.filename().string());
  }
  // Only verified bytes go into the new files (their CRCs would vouch for them).
  RefuseDamaged(z.folder, o.threads, "nothing written");
  deepspeed::ZeroOptimizerState os = deepspeed::ConsolidateOptimizerState(z);
  r.keys = os.keys;
  for (const deepspeed::ZeroOptimizerState::Param& p : os.params)
    CheckParameterName(z.tensors[p.tensor].name);
  for (const std::string& k : os.keys) {
    if (k == "fp32" || k == "step") Fail("optimizer state key '{}' would clash with a file", k);
    CheckParameterName(k);
  }

  CreatedFolders created;
  created.Create(dest.parent_path().string(), r.output);
  TempFolder tmp{TempPathFor(dest.string())};
  fs::create_directory(tmp.path);
  const fs::path zero = fs::path(tmp.path) / "zero";
  fs::create_directory(zero);
  std::vector<const MappedFile*> inputs;
  for (const auto& f : z.files) inputs.push_back(&f->map);

  // The model states files, as they are: stages 1/2 rank 0's, stage 3 every rank's.
  size_t copies = z.stage <= 2 ? 1 : z.model_files;
  for (size_t i = 0; i < copies; ++i) {
    CopyFileAtomically(z.files[i]->map,
                       (fs::path(tmp.path) / fs::path(z.files[i]->path).filename()).string());
  }
  // optimizer_state.pt, and each group's step (stages 1/2) once, copied into each folder.
  const std::string rank0 = z.files[os.step_file]->path;
  WriteObjectOf(
      rank0, (zero / "optimizer_state.pt").string(),
      [&](Graph& g) { OptimizerStateRoot(g, z.stage); }, o.threads);
  std::vector<std::string> step_bytes(os.steps.size());
  if (z.stage <= 2) {
    for (size_t gi = 0; gi < os.steps.size(); ++gi) {
      if (os.steps[gi] == kNil) continue;
      std::string file = (fs::path(tmp.path) / fmt::format("step-{}.pt", gi)).string();
      NodeId step = os.steps[gi];
      WriteObjectOf(
          rank0, file, [step](Graph& g) { g.root = step; }, 1);
      std::ifstream in(file, std::ios::binary);
      step_bytes[gi].assign(std::istreambuf_iterator<char>(in), {});
      fs::remove(file);
    }
  }

  // Every parameter's files, parameters side by side.
  const auto root_kind =
      z.stage <= 2 ? TorchOutputOptions::Root::kUniversalParam : TorchOutputOptions::Root::kTensor;
  std::atomic<uint64_t> files{0};
  ParallelFor(os.params.size(), o.threads, [&](size_t i) {
    const deepspeed::ZeroOptimizerState::Param& p = os.params[i];
    const deepspeed::ZeroTensor& fp32 = z.tensors[p.tensor];
    const fs::path folder = zero / fp32.name;
    fs::create_directory(folder);
    auto write = [&](const deepspeed::ZeroTensor& t, const std::string& file) {
      LogicalTensor lt = deepspeed::ZeroLogicalTensor(z, t);
      TensorSource src = LogicalSource(lt, t.dtype);
      src.name = "param";
      // Stage 3 files hold the flat tensor (ds_to_universal: torch.cat of the 1-D fragments).
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
    const std::string& step = step_bytes[static_cast<size_t>(p.group)];
    if (!step.empty()) {
      std::string path = (folder / "step.pt").string();
      AtomicOutput out = AtomicOutput::Create(path, step.size());
      out.Write(0, AsBytes(step));
      out.Commit();
      ++files;
    }
  });
  r.parameters = os.params.size();
  r.files = files + copies + 1;
  for (const auto& e : fs::recursive_directory_iterator(tmp.path)) {
    if (e.is_regular_file()) r.bytes += FileBytes(e.path().string());
  }
  SyncFolder(zero.string());
  SyncFolder(tmp.path);

  // Into place: a new folder renamed, an old one (--force) swapped out and removed.
  for (const MappedFile* in : inputs) {
    if (in->stamp().ChangedOnDisk())
      Fail("{}: the file changed while it was being read; nothing was written", in->path());
  }
  if (replace) {
    if (::renameat2(AT_FDCWD, tmp.path.c_str(), AT_FDCWD, dest.c_str(), RENAME_EXCHANGE) != 0)
      Fail("{}: cannot swap in the new folder: {} (nothing was replaced)", r.output,
           std::strerror(errno));
  } else {
    fs::rename(tmp.path, dest);
    tmp.keep = true;
  }
  created.Keep();
  LogCommitForTests(dest.string());
  SyncFolder(dest.parent_path().string());
  const std::string name = dest.filename().string();
  AtomicOutput marker = AtomicOutput::Create(latest.string(), name.size());
  marker.Write(0, AsBytes(name));
  marker.Commit();
  return r;
}

}  // namespace ckpt
