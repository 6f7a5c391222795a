#include "policy/apply_steps.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "checkpoint/discovery.h"
#include "checkpoint/manifest.h"
#include "compress/archive.h"
#include "engines/convert_tree.h"
#include "engines/prune.h"
#include "engines/shrink.h"
#include "io/folders.h"
#include "io/temp_files.h"
#include "jobs/batch.h"
#include "jobs/compress.h"
#include "jobs/convert.h"
#include "jobs/export.h"
#include "jobs/shrink.h"
#include "jobs/strip.h"
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
// The steps. Each runs its command's job (jobs/).

uint64_t FileSize(const std::string& path) {
  std::error_code ec;
  uint64_t n = fs::file_size(path, ec);
  return ec ? 0 : n;
}

// The torch.distributed.checkpoint folders of the entry, as every command discovers them
// (ExpandInputs), outputs left out.
std::vector<std::string> DcpFoldersOf(const StepContext& c) {
  std::vector<std::string> folders;
  ExpandInputs({c.e.path}, nullptr, &folders);
  std::erase_if(folders, [&](const std::string& f) { return Under(f, c.outputs_inside); });
  return folders;
}

StepOutcome RunShrink(const StepContext& c) {
  // The shrink job as `ckptool shrink --checkpoint_dir` runs it, in place, without the
  // policy's own outputs inside the checkpoint.
  const policy::ShrinkStep& s = *c.p.shrink;
  jobs::ShrinkJobOptions jo;
  jo.engine.dry_run = c.dry_run;
  jo.engine.allow_unsafe_globals = s.allow_unsafe_globals;
  jo.engine.trust.patterns = c.p.trust;
  jo.engine.materialize = s.materialize;
  jo.patterns = s.patterns;
  jo.skip = [&](const std::string& f) { return Under(f, c.outputs_inside); };
  if (c.e.folder) {
    jo.checkpoint_dir = c.e.path;
  } else if (MatchesAnyGlob(s.patterns.empty() ? std::vector<std::string>{"*"} : s.patterns,
                            fs::path(c.e.path).filename().string()) &&
             Shrinkable(c.e.path)) {
    jo.files = {c.e.path};
  }
  jo.check_dcp_folders = false;  // [verify] checks them
  jo.threads = c.threads;
  jo.spread = false;  // apply runs on one rank
  StepOutcome o;
  if (jo.files.empty() && jo.checkpoint_dir.empty()) {
    o.message = "no torch files to shrink";
    return o;
  }
  jobs::ShrinkReport r = jobs::Shrink(jo);
  size_t rewritten = 0;
  for (const jobs::ShrunkFile& f : r.files) {
    if (!f.error.empty()) Fail("{}", f.error);
    o.before += f.result.before;
    o.after += std::min(f.result.before, f.result.after);
    if (f.result.rewritten || (c.dry_run && f.result.after < f.result.before)) ++rewritten;
  }
  const size_t files = r.files.size();
  o.message = files == 0  ? "no torch files to shrink"
              : rewritten ? fmt::format("{} of {} {}: {} -> {}", rewritten, Count(files, "file"),
                                        c.dry_run ? "would be rewritten" : "rewritten",
                                        HumanBytes(o.before), HumanBytes(o.after))
                          : fmt::format("{}, nothing to drop", Count(files, "file"));
  return o;
}

StepOutcome RunStrip(const StepContext& c) {
  // The strip job as `ckptool strip [--delete-files] CHECKPOINT` runs it, in place, without
  // the policy's own outputs inside the checkpoint.
  const policy::StripStep& s = *c.p.strip;
  jobs::StripJobOptions jo;
  jo.engine.drop = s.drop;
  jo.engine.keep = s.keep;
  jo.engine.dry_run = c.dry_run;
  jo.engine.allow_unsafe_globals = s.allow_unsafe_globals;
  jo.engine.trust.patterns = c.p.trust;
  jo.paths = {c.e.path};
  jo.delete_files = s.delete_files;
  jo.skip = [&](const std::string& f) { return Under(f, c.outputs_inside); };
  jo.threads = c.threads;
  jo.spread = false;  // apply runs on one rank
  jobs::StripReport r = jobs::Strip(jo);
  StepOutcome o;
  size_t dropped = 0;
  for (const jobs::StrippedFile& f : r.files) {
    if (!f.error.empty()) Fail("{}", f.error);
    o.before += f.result.before;
    o.after += std::min(f.result.before, f.result.after);
    dropped += f.result.dropped.size();
  }
  uint64_t training = 0;
  if (s.delete_files) {
    for (const jobs::TrainingFile& t : r.training_files) {
      if (!t.error.empty())
        Fail("{}: could not delete this training-only file: {}", t.path, t.error);
      training += t.bytes;
      o.before += t.bytes;
    }
  }
  std::string files_part =
      s.delete_files && !r.training_files.empty()
          ? fmt::format("; {} {} ({})", Count(r.training_files.size(), "training-only file"),
                        c.dry_run ? "would be deleted" : "deleted", HumanBytes(training))
          : "";
  o.message = fmt::format("{} {} from {}{}: {} -> {}", Count(dropped, "entry"),
                          c.dry_run ? "would be dropped" : "dropped", Count(r.files.size(), "file"),
                          files_part, HumanBytes(o.before), HumanBytes(o.after));
  return o;
}

StepOutcome RunConvert(const StepContext& c) {
  const policy::ConvertStep& s = *c.p.convert;
  StepOutcome o;
  if (c.e.folder && !DcpFoldersOf(c).empty()) {
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
    // The convert job's in-place form, on the checkpoint's files (the policy's outputs left
    // out).
    jobs::ConvertJobOptions jo;
    jo.engine = co;
    jo.dtype = s.dtype_name;
    jo.skip = [&](const std::string& f) { return Under(f, c.outputs_inside); };
    jo.threads = c.threads;
    jo.spread = false;
    if (c.dry_run) {
      std::vector<std::string> files = jobs::InPlaceTargets({c.e.path}, jo);
      for (const std::string& f : files) o.before += FileSize(f);
      o.after = o.before;
      o.message = fmt::format("would convert float32 tensors of {} to {} in place",
                              Count(files.size(), "file"), s.dtype_name);
      return o;
    }
    jobs::ConvertReport r = jobs::ConvertInPlace({c.e.path}, jo);
    uint64_t converted = 0;
    for (const jobs::ConvertedFile& f : r.files) {
      if (!f.error.empty()) Fail("{}", f.error);
      o.before += f.result.before;
      o.after += f.result.converted ? f.result.after : f.result.before;
      converted += f.result.converted;
      for (const std::string& w : f.result.warnings) o.warnings.push_back(f.result.path + ": " + w);
    }
    o.message =
        fmt::format("{} to {} in place in {}: {} -> {}", Count(converted, "tensor"), s.dtype_name,
                    Count(r.files.size(), "file"), HumanBytes(o.before), HumanBytes(o.after));
    return o;
  }
  std::string out_rel = ConvertOutput(c.p, c.e);
  std::string out = Abs(c.root, out_rel);
  // The convert job as `ckptool convert` runs it. A folder's copy goes to <folder>/<dtype>/;
  // a file's to ROOT/<dtype>/<file>, as the command does for the folder holding it.
  jobs::ConvertJobOptions jo;
  jo.engine = co;
  jo.dtype = s.dtype_name;
  jo.output_dir = c.e.folder ? out : fs::path(out).parent_path().string();
  jo.force = c.replace_outputs;
  jo.leave_out_training_files = !s.training_files;
  jo.threads = c.threads;
  jo.spread = false;  // apply runs on one rank
  o.outputs.push_back(out_rel);
  if (c.dry_run) {
    ConvertTree tree = jobs::PlanConvert({c.e.path}, jo);
    o.message = fmt::format("would write a {} copy of {} to {}", s.dtype_name,
                            Count(tree.checkpoints.size() + tree.copies.size(), "file"), out_rel);
    return o;
  }
  jobs::ConvertReport r = jobs::Convert({c.e.path}, jo);
  for (const jobs::ConvertedFile& f : r.files) {
    if (!f.error.empty()) Fail("{}", f.error);
  }
  for (const auto* carried : {&r.copies, &r.indexes}) {
    for (const jobs::CarriedFile& f : *carried) {
      if (!f.error.empty()) Fail("{}", f.error);
      o.written += FileSize(f.files.output);
    }
  }
  uint64_t converted = 0;
  for (const jobs::ConvertedFile& f : r.files) {
    o.written += f.result.after;
    converted += f.result.converted;
    for (const std::string& w : f.result.warnings) o.warnings.push_back(f.result.path + ": " + w);
  }
  o.message = fmt::format("{} copy in {}: {} ({} converted, {}), {}", s.dtype_name, out_rel,
                          Count(r.files.size(), "file"), Count(converted, "tensor"),
                          Count(r.copies.size(), "other file"), HumanBytes(o.written));
  return o;
}

StepOutcome RunExport(const StepContext& c) {
  // The export job as `ckptool export CHECKPOINT --to OUT --force` runs it: a file, a model
  // folder's model files, a ZeRO or DCP folder consolidated; a model that is safetensors
  // already is not exported again.
  const policy::ExportStep& s = *c.p.export_;
  StepOutcome o;
  std::string out_rel = ExportOutput(c.p, c.e);
  jobs::ExportJobOptions jo;
  jo.engine.select = s.select;
  jo.engine.to = kernels::ParseHalf(s.dtype);
  jo.engine.max_shard_size = s.max_shard_size;
  jo.engine.threads = c.threads;
  jo.engine.exclude_frozen = s.exclude_frozen;
  jo.engine.dry_run = c.dry_run;
  jo.sources = {c.e.path};
  jo.to = Abs(c.root, out_rel);
  jo.force = c.replace_outputs;  // a new set replaces the old as a whole
  jo.spread = false;             // apply runs on one rank
  jo.skip_safetensors_model = true;
  if (c.dry_run) {
    o.outputs.push_back(out_rel);
    o.message = fmt::format("would export to {}", out_rel);
    return o;
  }
  jobs::ExportReport r = jobs::Export(jo);
  if (r.already_safetensors) {
    o.message = "the model is already safetensors: nothing to export";
    return o;
  }
  o.outputs.push_back(out_rel);
  for (const std::string& f : r.result.files) o.written += FileSize(f);
  o.warnings = r.result.warnings;
  o.message = fmt::format(
      "{} ({}) to {}{}", Count(r.result.tensors, "tensor"), HumanBytes(r.result.bytes), out_rel,
      r.result.aliases ? fmt::format(", {} tied names as aliases", r.result.aliases) : "");
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
  // The compress job as `ckptool compress CHECKPOINT -o NAME.ckz --force` runs it.
  jobs::CompressJobOptions jo;
  jo.engine.level = s.level == "max" ? ckz::Level::kMax : ckz::Level::kFast;
  jo.engine.threads = c.threads;
  jo.engine.output = out;
  jo.engine.force = true;  // an archive left by a run stopped before the original was removed
  jo.paths = {c.e.path};
  jo.spread = false;  // apply runs on one rank
  jobs::CompressReport report = jobs::Compress(jo);
  const jobs::PathOutcome<CompressResult>& done = report.paths.at(0);
  if (!done.error.empty()) Fail("{}", jobs::NamingFile(done.input, done.error));
  const CompressResult& r = done.result;
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
