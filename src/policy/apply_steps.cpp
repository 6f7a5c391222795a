#include "policy/apply_steps.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "checkpoint/discovery.h"
#include "checkpoint/manifest.h"
#include "checkpoint/verify.h"
#include "compress/archive.h"
#include "engines/compress.h"
#include "engines/convert.h"
#include "engines/convert_tree.h"
#include "engines/dcp_strip.h"
#include "engines/export.h"
#include "engines/prune.h"
#include "engines/shrink.h"
#include "engines/strip.h"
#include "file/checkpoint_file.h"
#include "io/atomic_output.h"
#include "io/folders.h"
#include "io/parallel.h"
#include "io/temp_files.h"
#include "jobs/verify.h"
#include "policy/completeness.h"
#include "policy/ledger.h"
#include "writers/output_set.h"

namespace ckpt::apply_steps {

namespace fs = std::filesystem;
using policy::Fingerprint;
using policy::Policy;
using policy::Step;
using policy::StepName;

// ---------------------------------------------------------------------------------------------
// Where outputs go.

std::string Stem(const Entry& e) {
  return e.folder ? e.name : fs::path(e.name).stem().string();
}

std::string ExpandTemplate(const std::string& t, const Entry& e) {
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '{') {
      size_t end = t.find('}', i);
      std::string key = t.substr(i + 1, end - i - 1);
      if (key == "name") out += e.name;
      if (key == "stem") out += Stem(e);
      if (key == "step") out += e.step >= 0 ? std::to_string(e.step) : Stem(e);
      i = end;
    } else {
      out += t[i];
    }
  }
  return fs::path(out).lexically_normal().string();
}

// Relative to ROOT (or absolute, when the policy says so).
std::string ConvertOutput(const Policy& p, const Entry& e) {
  if (!p.convert || p.convert->in_place) return "";
  return e.folder ? e.name + "/" + p.convert->dtype_name : p.convert->dtype_name + "/" + e.name;
}

std::string ExportOutput(const Policy& p, const Entry& e) {
  if (!p.export_) return "";
  if (!p.export_->to.empty()) return ExpandTemplate(p.export_->to, e);
  return e.folder ? e.name + "/export" : "export/" + Stem(e);
}

bool Inside(const std::string& rel, const std::string& dir) {
  return rel.size() > dir.size() && rel.compare(0, dir.size(), dir) == 0 && rel[dir.size()] == '/';
}

// The policy's outputs that lie inside the checkpoint folder (not part of the checkpoint).
std::vector<std::string> OutputsInside(const Policy& p, const Entry& e) {
  std::vector<std::string> out;
  if (!e.folder) return out;
  for (const std::string& o : {ConvertOutput(p, e), ExportOutput(p, e)}) {
    if (!o.empty() && Inside(o, e.name)) out.push_back(o);
  }
  // The manifest step's file: kept up to date by the steps after it, not a change of the
  // checkpoint's own files.
  if (p.manifest) out.push_back((fs::path(e.name) / kManifestName).string());
  return out;
}

std::string Abs(const std::string& root, const std::string& rel) {
  return fs::path(rel).is_absolute() ? rel : (fs::path(root) / rel).string();
}

// Is `file` at or below one of the folders `dirs` (absolute paths)?
bool Under(const std::string& file, const std::vector<std::string>& dirs) {
  for (const std::string& d : dirs) {
    if (file == d || Inside(file, d)) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// The steps. Each calls the op its command runs.

uint64_t FileSize(const std::string& path) {
  std::error_code ec;
  uint64_t n = fs::file_size(path, ec);
  return ec ? 0 : n;
}

// Checkpoint files of the entry, as every command discovers them (ExpandInputs: by content;
// torch.distributed.checkpoint folders apart), outputs left out.
std::vector<std::string> CheckpointFiles(const StepContext& c, std::vector<std::string>* dcp) {
  std::vector<std::string> folders;
  std::vector<std::string> files = ExpandInputs({c.e.path}, nullptr, &folders);
  std::erase_if(files, [&](const std::string& f) { return Under(f, c.outputs_inside); });
  std::erase_if(folders, [&](const std::string& f) { return Under(f, c.outputs_inside); });
  if (dcp) *dcp = folders;
  return files;
}

// Runs fn on every file, files spread over threads and the rest of the budget given to each.
template <typename Fn>
void ForFiles(const std::vector<std::string>& files, unsigned threads, Fn&& fn) {
  unsigned workers = static_cast<unsigned>(
      std::max<size_t>(1, std::min<size_t>(std::max(1u, threads), files.size())));
  unsigned per_file = std::max(1u, threads / workers);
  ParallelFor(files.size(), workers,
              [&](size_t i) { WithContext(files[i], [&] { fn(i, per_file); }); });
}

StepOutcome RunShrink(const StepContext& c) {
  const policy::ShrinkStep& s = *c.p.shrink;
  std::vector<std::string> files;
  for (const std::string& f : CheckpointFiles(c, nullptr)) {
    if (!s.patterns.empty() && !MatchesAnyGlob(s.patterns, fs::path(f).filename().string()))
      continue;
    if (Shrinkable(f)) files.push_back(f);
  }
  std::vector<ShrinkResult> results(files.size());
  ForFiles(files, c.threads, [&](size_t i, unsigned per_file) {
    ShrinkOptions so;
    so.dry_run = c.dry_run;
    so.threads = per_file;
    so.allow_unsafe_globals = s.allow_unsafe_globals;
    so.trust.patterns = c.p.trust;
    so.materialize = s.materialize;
    results[i] = ShrinkFile(files[i], so);
  });
  StepOutcome o;
  size_t rewritten = 0;
  for (const ShrinkResult& r : results) {
    o.before += r.before;
    o.after += std::min(r.before, r.after);
    if (r.rewritten || (c.dry_run && r.after < r.before)) ++rewritten;
  }
  o.message = files.empty() ? "no torch files to shrink"
              : rewritten
                  ? fmt::format("{} of {} {}: {} -> {}", rewritten, Count(files.size(), "file"),
                                c.dry_run ? "would be rewritten" : "rewritten",
                                HumanBytes(o.before), HumanBytes(o.after))
                  : fmt::format("{}, nothing to drop", Count(files.size(), "file"));
  return o;
}

StepOutcome RunStrip(const StepContext& c) {
  const policy::StripStep& s = *c.p.strip;
  StripTargets t = CollectStripTargets({c.e.path});
  std::erase_if(t.files, [&](const std::string& f) { return Under(f, c.outputs_inside); });
  std::erase_if(t.dcp_folders, [&](const std::string& f) { return Under(f, c.outputs_inside); });
  std::erase_if(t.training_files, [&](const std::string& f) { return Under(f, c.outputs_inside); });
  StripOptions so;
  so.drop = s.drop;
  so.keep = s.keep;
  so.dry_run = c.dry_run;
  so.allow_unsafe_globals = s.allow_unsafe_globals;
  so.trust.patterns = c.p.trust;
  std::vector<StripResult> results(t.files.size());
  ForFiles(t.files, c.threads, [&](size_t i, unsigned per_file) {
    StripOptions fo = so;
    fo.threads = per_file;
    results[i] = StripFile(t.files[i], fo);
  });
  for (const std::string& folder : t.dcp_folders) {
    StripOptions fo = so;
    fo.threads = c.threads;
    results.push_back(WithContext(folder, [&] { return StripDcp(folder, fo); }));
  }
  StepOutcome o;
  size_t dropped = 0;
  for (const StripResult& r : results) {
    o.before += r.before;
    o.after += std::min(r.before, r.after);
    dropped += r.dropped.size();
  }
  uint64_t training = 0;
  if (s.delete_files) {
    for (const std::string& f : t.training_files) {
      uint64_t size = FileSize(f);
      if (!c.dry_run) {
        std::error_code ec;
        if (!RemoveOutputFile(f, ec))
          Fail("{}: could not delete this training-only file: {}", f, ec.message());
      }
      training += size;
      o.before += size;
    }
  }
  std::string files_part =
      s.delete_files && !t.training_files.empty()
          ? fmt::format("; {} {} ({})", Count(t.training_files.size(), "training-only file"),
                        c.dry_run ? "would be deleted" : "deleted", HumanBytes(training))
          : "";
  o.message = fmt::format("{} {} from {}{}: {} -> {}", Count(dropped, "entry"),
                          c.dry_run ? "would be dropped" : "dropped", Count(results.size(), "file"),
                          files_part, HumanBytes(o.before), HumanBytes(o.after));
  return o;
}

// Converts `path` in place: into a temp file beside it (a ckptool temp name, removed by the
// next run if this one is killed), then renamed over it when something was converted.
ConvertResult ConvertInPlace(const std::string& path, const ConvertOptions& co) {
  std::string temp = TempPathFor(path);
  int slot = RegisterTempFile(temp);
  MappedFile::Stamp stamp = MappedFile::Open(path).stamp();
  ConvertResult r;
  try {
    r = ConvertFile(path, temp, co);
    if (r.converted == 0) {
      fs::remove(temp);
    } else {
      if (stamp.ChangedOnDisk()) Fail("changed on disk while it was converted; left as it was");
      fs::rename(temp, path);
      SyncFolder(fs::path(path).parent_path().string());
    }
  } catch (...) {
    std::error_code ec;
    fs::remove(temp, ec);
    UnregisterTempFile(slot);
    throw;
  }
  UnregisterTempFile(slot);
  r.output = path;
  return r;
}

StepOutcome RunConvert(const StepContext& c) {
  const policy::ConvertStep& s = *c.p.convert;
  StepOutcome o;
  if (c.e.folder) {
    std::vector<std::string> dcp;
    CheckpointFiles(c, &dcp);
    if (!dcp.empty())
      Fail("torch.distributed.checkpoint folders are not converted: use [export] with dtype");
  }
  ConvertOptions co;
  co.to = s.dtype;
  co.keep = s.keep;
  co.only = s.only;
  co.keep_1d = s.keep_1d;
  co.include_optimizer = s.training_files;
  co.lossy = s.lossy;
  co.allow_unsafe_globals = s.allow_unsafe_globals;
  co.trust.patterns = c.p.trust;
  if (s.in_place) {
    std::vector<std::string> files = CheckpointFiles(c, nullptr);
    if (!s.training_files)
      std::erase_if(files, [](const std::string& f) { return IsTrainingOnlyFile(f); });
    if (c.dry_run) {
      for (const std::string& f : files) o.before += FileSize(f);
      o.after = o.before;
      o.message = fmt::format("would convert float32 tensors of {} to {} in place",
                              Count(files.size(), "file"), s.dtype_name);
      return o;
    }
    std::vector<ConvertResult> results(files.size());
    ForFiles(files, c.threads, [&](size_t i, unsigned per_file) {
      ConvertOptions fo = co;
      fo.threads = per_file;
      results[i] = ConvertInPlace(files[i], fo);
    });
    uint64_t converted = 0;
    for (const ConvertResult& r : results) {
      o.before += r.before;
      o.after += r.converted ? r.after : r.before;
      converted += r.converted;
      for (const std::string& w : r.warnings) o.warnings.push_back(r.path + ": " + w);
    }
    o.message =
        fmt::format("{} to {} in place in {}: {} -> {}", Count(converted, "tensor"), s.dtype_name,
                    Count(files.size(), "file"), HumanBytes(o.before), HumanBytes(o.after));
    return o;
  }
  std::string out_rel = ConvertOutput(c.p, c.e);
  std::string out = Abs(c.root, out_rel);
  // A folder's copy goes to <folder>/<dtype>/; a file's to ROOT/<dtype>/<file>, as
  // `ckptool convert` does for the folder holding it.
  std::string out_dir = c.e.folder ? out : fs::path(out).parent_path().string();
  ConvertTree tree = PlanConvertTree({c.e.path}, out_dir, "", s.dtype_name, c.replace_outputs);
  auto training = [&](const PathPair& j) {
    return !s.training_files && IsTrainingOnlyFile(j.input);
  };
  std::erase_if(tree.checkpoints, training);
  std::erase_if(tree.copies, training);
  if (tree.checkpoints.empty()) Fail("no checkpoint files to convert at its top level");
  o.outputs.push_back(out_rel);
  if (c.dry_run) {
    o.message = fmt::format("would write a {} copy of {} to {}", s.dtype_name,
                            Count(tree.checkpoints.size() + tree.copies.size(), "file"), out_rel);
    return o;
  }
  fs::create_directories(out_dir);
  std::vector<std::string> inputs;
  for (const PathPair& j : tree.checkpoints) inputs.push_back(j.input);
  std::vector<ConvertResult> results(inputs.size());
  ForFiles(inputs, c.threads, [&](size_t i, unsigned per_file) {
    ConvertOptions fo = co;
    fo.threads = per_file;
    results[i] = ConvertFile(tree.checkpoints[i].input, tree.checkpoints[i].output, fo);
  });
  std::map<std::string, uint64_t> storage_bytes;
  uint64_t converted = 0;
  for (const ConvertResult& r : results) {
    storage_bytes[fs::path(r.output).filename().string()] = r.storage_bytes;
    o.written += r.after;
    converted += r.converted;
    for (const std::string& w : r.warnings) o.warnings.push_back(r.path + ": " + w);
  }
  for (const PathPair& j : tree.copies) {
    CopyFile(j, s.dtype_name);
    o.written += FileSize(j.output);
  }
  for (const PathPair& j : tree.indexes) {
    RewriteIndex(j, storage_bytes);
    o.written += FileSize(j.output);
  }
  o.message = fmt::format("{} copy in {}: {} ({} converted, {}), {}", s.dtype_name, out_rel,
                          Count(results.size(), "file"), Count(converted, "tensor"),
                          Count(tree.copies.size(), "other file"), HumanBytes(o.written));
  return o;
}

StepOutcome RunExport(const StepContext& c) {
  const policy::ExportStep& s = *c.p.export_;
  StepOutcome o;
  std::string out_rel = ExportOutput(c.p, c.e);
  std::string out = Abs(c.root, out_rel);
  std::vector<std::string> sources;
  if (ContainerOf(c.e.path) != Container::kModelFolder) {  // a file, ZeRO or DCP folder
    sources.push_back(c.e.path);
  } else {
    // The model files at the folder's top level: torch files that are not training-only.
    bool safetensors = false;
    std::vector<fs::path> top;
    for (const auto& d : fs::directory_iterator(c.e.path)) {
      if (d.is_regular_file() && !d.is_symlink()) top.push_back(d.path());
    }
    std::sort(top.begin(), top.end());
    for (const fs::path& f : top) {
      if (IsTrainingOnlyFile(f.string()) || f.filename() == "training_args.bin") continue;
      std::optional<FileKind> kind = FileKindOf(f.string());
      if (kind == FileKind::kSafetensors) safetensors = true;
      if (kind == FileKind::kTorch) sources.push_back(f.string());
    }
    if (sources.empty() && safetensors) {
      o.message = "the model is already safetensors: nothing to export";
      return o;
    }
    if (sources.empty()) Fail("no model files to export at its top level");
  }
  o.outputs.push_back(out_rel);
  if (c.dry_run) {
    o.message = fmt::format("would export to {}", out_rel);
    return o;
  }
  ExportOptions eo;
  eo.select = s.select;
  eo.to = kernels::ParseHalf(s.dtype);
  eo.max_shard_size = s.max_shard_size;
  eo.threads = c.threads;
  eo.exclude_frozen = s.exclude_frozen;
  OutputPlace place(out, c.replace_outputs);  // a new set replaces the old as a whole
  ExportResult r;
  try {
    r = Export(sources, place.write_to(), eo);
  } catch (const Error& e) {
    if (place.Unmasked(e.what()) == e.what()) throw;
    throw Error(place.Unmasked(e.what()));
  }
  r.files = place.Commit(r.files);
  for (const std::string& f : r.files) o.written += FileSize(f);
  o.warnings = r.warnings;
  o.message =
      fmt::format("{} ({}) to {}{}", Count(r.tensors, "tensor"), HumanBytes(r.bytes), out_rel,
                  r.aliases ? fmt::format(", {} tied names as aliases", r.aliases) : "");
  return o;
}

StepOutcome RunVerify(const StepContext& c) {
  // The verify job (jobs/verify.h) as `ckptool verify CHECKPOINT` runs it (every kind of
  // checkpoint, archives, what folders promise, a manifest), without the policy's own outputs
  // inside the checkpoint.
  StepOutcome o;
  std::vector<Located> items = jobs::VerifyTargets(
      {c.e.path}, [&](const std::string& p) { return Under(p, c.outputs_inside); });
  if (c.dry_run) {
    o.message = fmt::format("would verify {}", Count(items.size(), "checkpoint"));
    return o;
  }
  const jobs::VerifyOptions vo{c.threads, false, torch::Trust{c.p.trust}};
  std::vector<std::string> found;
  for (const Located& item : items) {
    jobs::CheckpointVerdict v = jobs::VerifyCheckpoint(item, vo);
    if (!v.failed.empty()) found.push_back(v.failed);  // internal errors too: the step fails
    for (const auto& p : v.outcome.problems)
      found.push_back(fmt::format("{}: {}: {}", item.path, p.where, p.what));
  }
  size_t manifests = 0;
  for (const jobs::FolderVerdict& v : jobs::VerifyFolders({c.e.path}, vo)) {
    manifests += v.manifest;
    for (const auto& p : v.problems)
      found.push_back(fmt::format("{}: {}: {}", v.path, p.where, p.what));
  }
  if (!found.empty()) {
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(found.size(), 5); ++i) list += "; " + found[i];
    Fail("{} problem(s){}{}", found.size(), list, found.size() > 5 ? "; ..." : "");
  }
  o.message = fmt::format("{} OK{}", Count(items.size(), "checkpoint"),
                          manifests ? ", matching its manifest" : "");
  return o;
}

// ---- manifest ----------------------------------------------------------------------------
// ckptool manifest on the checkpoint (checkpoint/manifest.h): written once; a run after it was
// written (another policy, the step's options changed) writes it again only while the checkpoint
// still matches it.

StepOutcome RunManifest(const StepContext& c) {
  StepOutcome o;
  Fingerprint files = policy::StatCheckpoint(c.root, c.e.name, {});
  for (const auto& [name, f] : files) o.before += f.size;
  o.after = o.before;
  const std::string at = ManifestPathOf(c.e.path);
  if (c.dry_run) {
    o.message = fmt::format("would write {}", fs::path(at).lexically_relative(c.root).string());
    return o;
  }
  ManifestOptions mo;
  mo.threads = c.threads;
  mo.tensors = c.p.manifest->tensors;
  mo.force = true;  // refused anyway when the checkpoint no longer matches it
  ManifestResult r = WriteManifest(c.e.path, mo);
  for (const std::string& n : r.notes) o.warnings.push_back(n);
  // A file checkpoint's manifest sits beside it: an output, deleted with it.
  if (!c.e.folder) o.outputs.push_back(fs::path(at).lexically_relative(c.root).string());
  o.message = fmt::format("{} ({}, {}, {} tensor digests)",
                          fs::path(at).lexically_relative(c.root).string(), Count(r.files, "file"),
                          HumanBytes(r.bytes), r.tensors);
  return o;
}

// ---- compress ----------------------------------------------------------------------------
// The checkpoint becomes NAME.ckz beside it (ckptool compress, the level of the policy). The
// archive is written through a temp file, renamed into place, then read back from disk and
// every chunk decoded and checked; only then does the original go, renamed to a trash name
// first, so the checkpoint exists under one of its two names at every moment. From then on
// NAME.ckz is the checkpoint: its ledger record moves to that name (Process), retention counts
// and deletes it, no other step runs on it. keep_original: the archive is an output instead.

std::string ArchiveName(const Entry& e) {
  return e.name + std::string(ckz::kArchiveSuffix);
}

StepOutcome RunCompress(const StepContext& c) {
  const policy::CompressStep& s = *c.p.compress;
  StepOutcome o;
  std::string rel = ArchiveName(c.e);
  std::string out = Abs(c.root, rel);
  Fingerprint files = policy::StatCheckpoint(c.root, c.e.name, {});
  for (const auto& [name, f] : files) o.before += f.size;
  if (c.dry_run) {
    o.after = o.before;
    o.message =
        fmt::format("would compress {} ({}) into {}{} (its size is known once it is compressed)",
                    c.e.folder ? "the folder" : "the file", HumanBytes(o.before), rel,
                    s.keep_original ? "" : ", replacing it once the archive is verified");
    return o;
  }
  CompressOptions co;
  co.level = s.level == "max" ? ckz::Level::kMax : ckz::Level::kFast;
  co.threads = c.threads;
  co.output = out;
  co.force = true;  // an archive left by a run stopped before the original was removed
  CompressResult r = CompressPath(c.e.path, co);
  for (const std::string& w : r.warnings) o.warnings.push_back(w);
  try {
    ckz::Archive back = ckz::Archive::Open(out);
    ArchiveVerifyResult v = VerifyArchive(back, c.threads);
    if (!v.problems.empty()) Fail("{}", v.problems[0].what);
  } catch (const std::exception& ex) {
    std::error_code ec;
    fs::remove(out, ec);
    Fail(
        "{}: reading the new archive back failed ({}); it was removed, the checkpoint is "
        "untouched",
        rel, ex.what());
  }
  std::string ratio =
      r.after ? fmt::format("{:.2f}x", static_cast<double>(r.before) / r.after) : "-";
  if (s.keep_original) {
    o.after = o.before;
    o.written = r.after;
    o.outputs.push_back(rel);
    o.message = fmt::format("{} ({}) into {} ({}, {}), the original kept", Count(r.files, "file"),
                            HumanBytes(r.before), rel, HumanBytes(r.after), ratio);
    return o;
  }
  TrashEntry(c.root, c.e.name);
  o.after = r.after;
  o.became = rel;
  o.message = fmt::format("{} ({}) into {} ({}, {}); the original removed", Count(r.files, "file"),
                          HumanBytes(r.before), rel, HumanBytes(r.after), ratio);
  return o;
}

StepOutcome RunStep(Step step, const StepContext& c) {
  switch (step) {
    case Step::kShrink:
      return RunShrink(c);
    case Step::kConvert:
      return RunConvert(c);
    case Step::kExport:
      return RunExport(c);
    case Step::kVerify:
      return RunVerify(c);
    case Step::kManifest:
      return RunManifest(c);
    case Step::kStrip:
      return RunStrip(c);
    case Step::kCompress:
      return RunCompress(c);
  }
  Fail("internal: unknown step");
}

}  // namespace ckpt::apply_steps
