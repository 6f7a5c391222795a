#include "policy/apply.h"

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
#include "compress/archive.h"
#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "file/checkpoint_file.h"
#include "io/folders.h"
#include "io/parallel.h"
#include "io/temp_files.h"
#include "ops/compress.h"
#include "ops/convert.h"
#include "ops/convert_tree.h"
#include "ops/dcp_report.h"
#include "ops/dcp_strip.h"
#include "ops/discovery.h"
#include "ops/export.h"
#include "ops/output_set.h"
#include "ops/prune.h"
#include "ops/shrink.h"
#include "ops/strip.h"
#include "ops/verify.h"
#include "policy/completeness.h"
#include "policy/ledger.h"

namespace ckpt {

namespace fs = std::filesystem;
using policy::Fingerprint;
using policy::Policy;
using policy::Step;
using policy::StepName;

namespace {

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

struct StepContext {
  const std::string& root;
  const Entry& e;
  const Policy& p;
  unsigned threads;
  bool dry_run;
  // The ledger knew this checkpoint before this pass (a step interrupted, options or files
  // changed): the outputs its steps wrote then are replaced. A checkpoint seen for the first
  // time finds its output places free, or the step fails rather than write over them.
  bool replace_outputs;
  std::vector<std::string> outputs_inside;  // absolute
};

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
    MappedFile m = MappedFile::Open(f);
    std::optional<Format> format = DetectFormat(m.bytes());
    if (format && *format != Format::kSafetensors) files.push_back(f);
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
        fs::remove(f, ec);
        if (ec) Fail("{}: could not delete this training-only file: {}", f, ec.message());
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
  if (!c.e.folder || deepspeed::LooksLikeZeroCheckpoint(c.e.path) ||
      dcp::LooksLikeDcpCheckpoint(c.e.path)) {
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
      MappedFile m = MappedFile::Open(f.string());
      std::optional<Format> format = DetectFormat(m.bytes());
      if (format == Format::kSafetensors) safetensors = true;
      if (format && *format != Format::kSafetensors) sources.push_back(f.string());
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
  StepOutcome o;
  std::vector<std::string> dcp;
  std::vector<std::string> files = CheckpointFiles(c, &dcp);
  if (c.dry_run) {
    o.message = fmt::format("would verify {}{}", Count(files.size(), "file"),
                            dcp.empty() ? "" : fmt::format(" and {} DCP folders", dcp.size()));
    return o;
  }
  std::vector<std::string> problems(files.size());
  std::mutex mu;
  std::vector<std::string> found;
  ForFiles(files, c.threads, [&](size_t i, unsigned per_file) {
    std::vector<std::string> mine;
    try {
      CheckpointFile f = OpenCheckpoint(files[i]);
      VerifyResult r = Verify(f, per_file, torch::Trust{c.p.trust});
      for (const auto& p : r.problems)
        mine.push_back(fmt::format("{}: {}: {}", files[i], p.where, p.what));
    } catch (const Error& e) {
      mine.push_back(e.what());
    }
    std::lock_guard<std::mutex> lock(mu);
    found.insert(found.end(), mine.begin(), mine.end());
  });
  if (deepspeed::LooksLikeZeroCheckpoint(c.e.path)) {
    try {
      deepspeed::OpenZeroCheckpoint(c.e.path);
    } catch (const Error& e) {
      found.push_back(e.what());
    }
  }
  for (const std::string& folder : dcp) {
    try {
      dcp::Checkpoint d = dcp::OpenDcp(folder);
      DcpVerifyResult r = VerifyDcp(d, c.threads);
      for (const auto& p : r.problems)
        found.push_back(fmt::format("{}: {}: {}", folder, p.where, p.what));
    } catch (const Error& e) {
      found.push_back(e.what());
    }
  }
  std::sort(found.begin(), found.end());
  if (!found.empty()) {
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(found.size(), 5); ++i) list += "; " + found[i];
    Fail("{} problem(s){}{}", found.size(), list, found.size() > 5 ? "; ..." : "");
  }
  o.message = fmt::format("{}{} OK", Count(files.size(), "file"),
                          dcp.empty() ? "" : fmt::format(" and {} DCP folders", dcp.size()));
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
    case Step::kStrip:
      return RunStrip(c);
    case Step::kCompress:
      return RunCompress(c);
  }
  Fail("internal: unknown step");
}

// Options as the ledger keeps them (read back, their keys come in another order).
bool SameOptions(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
  return nlohmann::json(a) == nlohmann::json(b);
}

// Is `step` due on a checkpoint of this rank (1 = newest)?
bool Due(const Policy& p, Step step, uint64_t rank) {
  if (!p.Has(step)) return false;
  if (step == Step::kStrip) return rank > p.strip->older_than_newest;
  if (step == Step::kCompress) return rank > p.compress->older_than_newest;
  return true;
}

}  // namespace

uint64_t KillAtSave() {
  const char* v = std::getenv("CKPTOOL_TEST_KILL_AT_SAVE");
  return v ? std::strtoull(v, nullptr, 10) : 0;
}

struct Applier::State {
  std::string root;
  Policy policy;
  ApplyOptions o;
  std::optional<policy::RootLock> lock;  // a dry run takes none and creates nothing
  policy::Ledger ledger;
  policy::Completeness completeness;
  std::map<std::string, std::string> waiting_logged;  // watch: log a wait once per reason
  std::set<std::string> failure_logged;
  bool dirty = false;
  uint64_t saves = 0;
  uint64_t kill_at_save = KillAtSave();

  State(std::string r, Policy p, ApplyOptions opt)
      : root(std::move(r)),
        policy(std::move(p)),
        o(std::move(opt)),
        completeness(root, CompletenessOptions()) {
    if (!o.dry_run) lock.emplace(root);
    ledger = policy::Ledger::Load(root);
  }

  policy::Completeness::Options CompletenessOptions() {
    policy::Completeness::Options co;
    co.layout = policy.layout;
    co.settle_seconds = o.settle_seconds;
    co.observe = o.observe;
    co.outputs_inside = [this](const std::string& name) {
      Entry e;
      e.name = name;
      e.path = (fs::path(root) / name).string();
      std::error_code ec;
      e.folder = fs::is_directory(fs::symlink_status(e.path, ec));
      e.step = StepFromName(name);
      return OutputsInside(policy, e);
    };
    co.recorded = [this](const std::string& name) -> const Fingerprint* {
      auto it = ledger.checkpoints().find(name);
      if (it == ledger.checkpoints().end() || it->second.running) return nullptr;
      return &it->second.files;
    };
    co.interrupted = [this](const std::string& name) {
      auto it = ledger.checkpoints().find(name);
      return it != ledger.checkpoints().end() && it->second.running.has_value();
    };
    return co;
  }

  void Log(ApplyEvent ev) {
    ev.dry_run = o.dry_run;
    if (o.log) o.log(ev);
  }

  void Save() {
    if (o.dry_run) return;
    // Test hook (tests/integration/test_policy.py): CKPTOOL_TEST_KILL_AT_SAVE=N dies of SIGKILL
    // right before the N-th ledger write, so that a run killed at every step boundary (after a
    // step's work, before the ledger knows) is shown to resume to the same end state.
    if (kill_at_save && ++saves == kill_at_save) ::kill(::getpid(), SIGKILL);
    ledger.Save();
    dirty = false;
  }

  bool Stopping() const { return o.stop && o.stop->load(); }

  void Retention(PruneResult& plan, PassResult& result);
  bool CompressFinished(const std::string& name, policy::CheckpointRecord& rec);
  void Process(const Entry& e, PassResult& result);
};

Applier::Applier(std::string root, Policy policy, ApplyOptions options) {
  if (!fs::is_directory(root)) Fail("{}: not a folder", root);
  s_ = std::make_unique<State>(std::move(root), std::move(policy), std::move(options));
}

Applier::~Applier() = default;

// A run stopped inside the compress step after the original went (it goes only once its
// archive is written and verified) and before the ledger knew: the checkpoint is NAME.ckz.
bool Applier::State::CompressFinished(const std::string& name, policy::CheckpointRecord& rec) {
  if (rec.running_step != StepName(Step::kCompress) || !rec.running) return false;
  std::string archive = name + std::string(ckz::kArchiveSuffix);
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(fs::path(root) / archive, ec))) return false;
  policy::StepRecord done = *rec.running;
  done.before = policy::TotalBytes(rec.files);
  done.note = "the archive was written and verified before the run was stopped";
  auto node = ledger.checkpoints().extract(name);
  ledger.checkpoints().erase(archive);
  node.key() = archive;
  policy::CheckpointRecord& moved = node.mapped();
  moved.running.reset();
  moved.running_step.clear();
  moved.files = policy::StatCheckpoint(root, archive, {});
  policy::HashFiles(root, moved.files);
  done.after = policy::TotalBytes(moved.files);
  moved.steps[StepName(Step::kCompress)] = done;
  ledger.checkpoints().insert(std::move(node));
  Log({"resume", archive, StepName(Step::kCompress),
       fmt::format("{} was compressed into {} when the run was stopped: recorded", name, archive)});
  dirty = true;
  return true;
}

void Applier::State::Retention(PruneResult& plan, PassResult& result) {
  for (PruneEntry& pe : plan.entries) {
    if (pe.keep) continue;
    if (Stopping()) {
      result.stopped = true;
      return;
    }
    result.bytes_freed += pe.bytes;
    ApplyEvent ev{"delete", pe.name, "retention", pe.reason};
    ev.before = pe.bytes;
    auto rec = ledger.checkpoints().find(pe.name);
    std::vector<std::string> outputs;
    if (rec != ledger.checkpoints().end()) {
      for (const std::string& out : rec->second.outputs) {
        if (!Inside(out, pe.name)) outputs.push_back(out);
      }
    }
    if (!outputs.empty()) ev.details["outputs"] = outputs;
    if (o.dry_run) {
      ev.message = fmt::format("would delete ({}, {})", HumanBytes(pe.bytes), pe.reason);
      Log(ev);
      ++result.deleted;
      continue;
    }
    if (!o.yes && !policy.retention->delete_confirmed) {
      result.bytes_freed -= pe.bytes;
      ev.kind = "keep";
      ev.message = fmt::format(
          "would delete ({}, {}): deleting needs --yes, or delete = true in [retention]",
          HumanBytes(pe.bytes), pe.reason);
      Log(ev);
      ++result.not_confirmed;
      continue;
    }
    // Its outputs elsewhere first, then the checkpoint, then the ledger: a run killed in
    // between finds the same plan and finishes it.
    // Whatever another process (the trainer's own rotation) deleted meanwhile is done.
    auto trash = [](const std::string& abs) {
      fs::path a(abs);
      try {
        TrashEntry(a.parent_path().string(), a.filename().string());
        return true;
      } catch (const Error&) {
        std::error_code ec;
        if (fs::exists(fs::symlink_status(a, ec))) throw;
        return false;
      }
    };
    for (const std::string& out : outputs) trash(Abs(root, out));
    for (const std::string& a : pe.also) trash((fs::path(root) / a).string());
    bool ours = trash((fs::path(root) / pe.name).string());
    ev.message = fmt::format("{} ({}, {})", ours ? "deleted" : "already deleted by another process",
                             HumanBytes(pe.bytes), pe.reason);
    Log(ev);
    ++result.deleted;
    if (rec != ledger.checkpoints().end()) ledger.checkpoints().erase(rec);
    ledger.removed().push_back(
        {pe.name, static_cast<int64_t>(pe.step), pe.bytes, policy::UtcNow(), pe.reason});
    Save();
  }
}

void Applier::State::Process(const Entry& e, PassResult& result) {
  // A compressed checkpoint: retention counts and deletes it; no step runs on an archive
  // (decompress it to work on it again).
  if (e.archive) return;
  const Fingerprint* stat = completeness.StatOf(e.name);
  if (!stat) return;
  std::vector<Step> due;
  for (Step s : policy::kAllSteps) {
    if (Due(policy, s, e.rank)) due.push_back(s);
  }
  auto& records = ledger.checkpoints();
  auto it = records.find(e.name);
  Fingerprint now = *stat;
  const bool known = it != records.end();
  if (it == records.end()) {
    if (due.empty()) return;
    policy::CheckpointRecord r;
    r.step = e.step;
    r.layout = completeness.LayoutOf(e.name);
    policy::HashFiles(root, now);
    r.files = now;
    it = records.emplace(e.name, std::move(r)).first;
    dirty = true;
  } else if (it->second.running) {
    Log({"resume", e.name, it->second.running_step,
         fmt::format("{} was interrupted: it runs again", it->second.running_step)});
    it->second.running.reset();
    it->second.running_step.clear();
    policy::HashFiles(root, now, &it->second.files);
    it->second.files = now;
    dirty = true;
  } else {
    std::string what;
    if (!policy::SameCheckpoint(root, now, it->second.files, &what)) {
      if (!it->second.steps.empty() || it->second.failed) {
        Log({"changed", e.name, "",
             fmt::format("changed since it was processed ({}): its steps run again", what)});
      }
      it->second.steps.clear();
      it->second.failed.reset();
      failure_logged.erase(e.name);
      policy::HashFiles(root, now, &it->second.files);
      it->second.files = now;
      it->second.layout = completeness.LayoutOf(e.name);
      dirty = true;
    } else if (!policy::SameStat(now, it->second.files)) {
      it->second.files = now;  // moved or copied back with its times: same content
      dirty = true;
    }
  }
  policy::CheckpointRecord& rec = it->second;
  // A step that failed on these very files with these options is not tried again.
  if (rec.failed) {
    bool same = false;
    for (Step s : due) {
      if (StepName(s) == rec.failed->step && SameOptions(policy.Options(s), rec.failed->options))
        same = true;
    }
    if (same && !o.retry_failed) {
      ++result.failures;
      if (failure_logged.insert(e.name).second) {
        Log({"failed", e.name, rec.failed->step,
             fmt::format("failed at {} and not retried (files and options unchanged; "
                         "--retry-failed tries again): {}",
                         rec.failed->at, rec.failed->error)});
      }
      if (dirty) Save();
      return;
    }
    rec.failed.reset();
    dirty = true;
  }
  StepContext c{root, e, policy, o.threads, o.dry_run, known, {}};
  for (const std::string& out : OutputsInside(policy, e))
    c.outputs_inside.push_back(Abs(root, out));
  for (Step s : due) {
    std::string name = StepName(s);
    nlohmann::ordered_json options = policy.Options(s);
    auto done = rec.steps.find(name);
    if (done != rec.steps.end() && SameOptions(done->second.options, options)) continue;
    if (Stopping()) {
      result.stopped = true;
      break;
    }
    policy::StepRecord running{options, policy::UtcNow(), 0, 0, ""};
    if (!o.dry_run) {
      rec.running = running;
      rec.running_step = name;
      Save();
    }
    StepOutcome out;
    std::string error;
    try {
      out = WithContext(e.name, [&] { return RunStep(s, c); });
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    ++result.steps_run;
    if (o.dry_run) {
      if (!error.empty()) {
        Log({"failed", e.name, name, error});
        ++result.failures;
        break;
      }
      ApplyEvent ev{"step", e.name, name, out.message};
      ev.before = out.before;
      ev.after = out.after;
      result.bytes_freed += out.before - std::min(out.before, out.after);
      Log(ev);
      continue;
    }
    if (error.empty() && !out.became.empty()) {
      // The checkpoint is its archive now: the record moves to the new name, with the outputs
      // that retention deletes with it.
      auto node = records.extract(e.name);
      records.erase(out.became);
      node.key() = out.became;
      records.insert(std::move(node));
    }
    // The checkpoint as the step left it.
    const std::string& now_name = out.became.empty() ? e.name : out.became;
    Fingerprint after = policy::StatCheckpoint(root, now_name, [&] {
      std::vector<std::string> rel = OutputsInside(policy, e);
      return rel;
    }());
    policy::HashFiles(root, after, &rec.files);
    rec.files = after;
    rec.running.reset();
    rec.running_step.clear();
    for (const std::string& w : out.warnings) Log({"note", e.name, name, "warning: " + w});
    if (!error.empty()) {
      rec.failed = policy::FailedRecord{name, options, policy::UtcNow(), error};
      failure_logged.insert(e.name);
      Save();
      ++result.failures;
      Log({"failed", e.name, name, error});
      return;
    }
    for (const std::string& x : out.outputs) {
      if (std::find(rec.outputs.begin(), rec.outputs.end(), x) == rec.outputs.end())
        rec.outputs.push_back(x);
    }
    policy::StepRecord done_rec{options, policy::UtcNow(), out.before, out.after, out.message};
    rec.steps[name] = done_rec;
    Save();
    result.bytes_freed += out.before - std::min(out.before, out.after);
    ApplyEvent ev{"step", e.name, name, out.message};
    ev.before = out.before;
    ev.after = out.after;
    if (out.written) ev.details["written"] = out.written;
    if (!out.outputs.empty()) ev.details["outputs"] = out.outputs;
    if (!out.became.empty()) ev.details["became"] = out.became;
    Log(ev);
    if (!out.became.empty()) return;  // the entry e names is gone
  }
  if (dirty) Save();
}

PassResult Applier::RunPass() {
  State& s = *s_;
  PassResult result;
  if (!s.o.dry_run) {
    // Temp files and folders of a run that was killed outright (they would make a checkpoint
    // look incomplete), and the trash of a deletion that was killed: finish them.
    std::error_code ec;
    RemoveStaleTempsIn(s.root);
    for (fs::recursive_directory_iterator it(s.root, ec), end; !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (!it->is_directory(ec) || it->is_symlink(ec)) continue;
      if (it.depth() == 0 && (name == ".ckptool" || IsTrashName(name))) {
        if (IsTrashName(name)) fs::remove_all(it->path(), ec);
        it.disable_recursion_pending();
        ec.clear();
        continue;
      }
      RemoveStaleTempsIn(it->path().string());
    }
  }
  s.completeness.BeginPass();
  PruneOptions po;
  po.keep_last = s.policy.retention ? s.policy.retention->keep_last : UINT64_MAX;
  if (s.policy.retention) {
    po.keep_every = s.policy.retention->keep_every;
    po.keep = s.policy.retention->keep;
  }
  PruneResult plan = PlanPrune(s.root, po, [&](const std::string& path, std::string* why) {
    return s.completeness.Complete(path, why);
  });
  // Ledger entries whose checkpoint is gone (the trainer rotated it away).
  std::set<std::string> present;
  for (const PruneEntry& pe : plan.entries) present.insert(pe.name);
  std::vector<std::string> recorded;
  for (const auto& [name, rec] : s.ledger.checkpoints()) recorded.push_back(name);
  for (const std::string& name : recorded) {
    std::error_code ec;
    if (present.count(name) || fs::exists(fs::symlink_status(fs::path(s.root) / name, ec)))
      continue;
    auto it = s.ledger.checkpoints().find(name);
    if (it == s.ledger.checkpoints().end()) continue;
    if (s.CompressFinished(name, it->second)) continue;
    ApplyEvent ev{"gone", name, "", "deleted by someone else: forgotten"};
    if (!it->second.outputs.empty()) {
      ev.details["outputs"] = it->second.outputs;
      ev.message += "; its outputs are left where they are";
    }
    s.Log(ev);
    s.ledger.checkpoints().erase(it);
    s.dirty = true;
  }
  if (s.dirty) s.Save();
  if (s.policy.retention) s.Retention(plan, result);
  // Ranks: 1 = the newest complete checkpoint kept.
  uint64_t rank = 0;
  std::vector<Entry> entries;
  for (size_t i = plan.entries.size(); i-- > 0;) {
    const PruneEntry& pe = plan.entries[i];
    if (!pe.complete) {
      ++result.waiting;
      std::string why = pe.reason;
      auto& logged = s.waiting_logged[pe.name];
      if (logged != why) {
        logged = why;
        s.Log({"wait", pe.name, "", why});
      }
      continue;
    }
    s.waiting_logged.erase(pe.name);
    if (!pe.keep) continue;
    Entry e;
    e.name = pe.name;
    e.path = (fs::path(s.root) / pe.name).string();
    e.step = pe.latest_copy ? -1 : static_cast<int64_t>(pe.step);
    std::error_code ec;
    e.folder = fs::is_directory(fs::symlink_status(e.path, ec));
    e.archive = pe.archive;
    // Lightning's last.ckpt copy ranks with the newest checkpoint, without pushing it back.
    e.rank = pe.latest_copy ? 1 : ++rank;
    entries.push_back(e);
  }
  std::reverse(entries.begin(), entries.end());  // oldest first
  for (const Entry& e : entries) {
    if (s.Stopping() || result.stopped) {
      result.stopped = true;
      break;
    }
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(e.path, ec))) continue;  // deleted under us
    s.Process(e, result);
  }
  result.next_settle = s.completeness.NextSettle();
  return result;
}

}  // namespace ckpt
