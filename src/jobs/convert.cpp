#include "jobs/convert.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "checkpoint/discovery.h"
#include "checkpoint/integrity.h"
#include "checkpoint/training_state.h"
#include "io/folders.h"
#include "io/mapped_file.h"
#include "io/temp_files.h"
#include "jobs/archive_inputs.h"
#include "jobs/batch.h"
#include "jobs/result_json.h"

namespace ckpt::jobs {

namespace fs = std::filesystem;

namespace {

// Converts `path` in place: into a temp file beside it (a ckptool temp name, removed by the
// next run if this one is killed), then renamed over it when something was converted.
ConvertResult ConvertFileInPlace(const std::string& path, const ConvertOptions& co) {
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

void CheckPaths(const std::vector<std::string>& paths, const ConvertJobOptions& o) {
  if (paths.empty()) throw UsageError("give checkpoint files or model folders to convert");
  if (!o.output_file.empty() && (paths.size() != 1 || fs::is_directory(paths[0]))) {
    throw UsageError(
        "-o names one output file: give exactly one input file (--output-dir for folders and "
        "several inputs)");
  }
}

}  // namespace

size_t ConvertReport::failed() const {
  return FailedOf(files);
}

bool ConvertReport::ok() const {
  auto bad = [](const CarriedFile& c) { return !c.error.empty(); };
  return failed() == 0 && std::none_of(copies.begin(), copies.end(), bad) &&
         std::none_of(indexes.begin(), indexes.end(), bad);
}

nlohmann::ordered_json ToJson(const ConvertReport& r) {
  nlohmann::ordered_json doc = OutcomesJson(r.files, "path");
  doc["before"] = r.before;
  doc["after"] = r.after;
  doc["copied_files"] = r.copies.size();
  return doc;
}

ConvertTree PlanConvert(const std::vector<std::string>& paths, const ConvertJobOptions& o) {
  CheckPaths(paths, o);
  ConvertTree tree = PlanConvertTree(paths, o.output_dir, o.output_file, o.dtype, o.force);
  // A folder's training-only files (optimizer.pt, rng_state.pth...) are copied as they are (or
  // left out), unless training state is to be converted too. A file named on its own is
  // converted.
  if (!o.engine.include_optimizer) {
    auto training = [&](const PathPair& j) {
      return IsTrainingOnlyFile(j.input) &&
             std::find(paths.begin(), paths.end(), j.input) == paths.end();
    };
    for (const PathPair& j : tree.checkpoints) {
      if (training(j) && !o.leave_out_training_files) tree.copies.push_back(j);
    }
    std::erase_if(tree.checkpoints, training);
    if (o.leave_out_training_files) std::erase_if(tree.copies, training);
  }
  if (tree.checkpoints.empty()) {
    std::string why;
    for (const std::string& p : paths) {
      if (why.empty() && fs::is_directory(p)) why = WhyNothingToConvert(p, o.dtype);
    }
    Fail("{}", why.empty() ? "no checkpoints to convert" : "no checkpoints to convert: " + why);
  }
  return tree;
}

ConvertReport Convert(std::vector<std::string> paths, const ConvertJobOptions& o) {
  CheckPaths(paths, o);  // before any archive is restored
  ArchiveInputs archives(paths, o.output_dir.empty() ? o.output_file : o.output_dir, o.threads,
                         "-o or --output-dir");
  ConvertTree tree = PlanConvert(paths, o);
  const bool dry_run = o.engine.dry_run;
  // A folder is converted whole or not at all: a damaged file in it would leave a model folder
  // with a shard missing (its own rewrite refuses it; the files beside it are checked here).
  if (!dry_run) {
    for (const std::string& p : paths) {
      if (fs::is_directory(p)) RefuseDamaged(p, o.threads, "nothing converted");
    }
  }
  std::set<std::string> dirs;
  for (const auto* jobs : {&tree.checkpoints, &tree.copies, &tree.indexes}) {
    for (const PathPair& j : *jobs) dirs.insert(fs::path(j.output).parent_path().string());
  }
  // Folders this run makes go again if it ends (fails, is interrupted) with nothing in them.
  CreatedFolders made;
  for (const std::string& d : dirs) {
    if (!dry_run) made.Create(d, d);
  }
  std::vector<std::string> inputs;
  for (const PathPair& j : tree.checkpoints) inputs.push_back(j.input);
  Batch batch(inputs, o.threads, "convert", o.progress, SIZE_MAX, o.spread);
  ConvertOptions co = o.engine;
  co.threads = batch.threads_per_file();
  co.bytes_done = batch.bytes_done();
  std::vector<ConvertResult> results(tree.checkpoints.size());
  std::vector<std::string> errors = batch.Run<ConvertResult>(results, [&](size_t i) {
    return ConvertFile(tree.checkpoints[i].input, tree.checkpoints[i].output, co);
  });
  ConvertReport report;
  report.dry_run = dry_run;
  // Rank 0 reports for every rank, and copies the other files and rewrites the indexes,
  // which need every rank's results.
  if (!batch.reports()) {
    report.reports = false;
    return report;
  }
  std::map<std::string, uint64_t> storage_bytes;
  for (size_t i = 0; i < results.size(); ++i) {
    // An archive's restored paths are shown as the archive's.
    ConvertedFile f{archives.Shown(tree.checkpoints[i].input), archives.Shown(errors[i]),
                    std::move(results[i])};
    if (f.error.empty()) {
      ConvertResult& r = f.result;
      r.path = archives.Shown(r.path);
      for (std::string& w : r.warnings) w = archives.Shown(w);
      storage_bytes[fs::path(r.output).filename().string()] = r.storage_bytes;
      report.before += r.before;
      report.after += r.after;
    }
    report.files.push_back(std::move(f));
  }
  for (const PathPair& j : tree.copies) {
    CarriedFile c{j, "", 0};
    if (!dry_run) {
      try {
        CopyFile(j, o.dtype);
      } catch (const Error& e) {
        c.error = archives.Shown(e.what());
      }
    }
    c.files.input = archives.Shown(c.files.input);
    report.copies.push_back(std::move(c));
  }
  // Nothing is copied or rewritten in a dry run; the report counts the copies.
  if (!dry_run) {
    for (const PathPair& j : tree.indexes) {
      CarriedFile c{j, "", 0};
      try {
        c.total_size = RewriteIndex(j, storage_bytes);
      } catch (const Error& e) {
        c.error = archives.Shown(e.what());
      }
      c.files.input = archives.Shown(c.files.input);
      report.indexes.push_back(std::move(c));
    }
  }
  return report;
}

std::vector<std::string> InPlaceTargets(const std::vector<std::string>& paths,
                                        const ConvertJobOptions& o) {
  std::vector<std::string> files = ExpandInputs(paths);
  std::erase_if(files, [&](const std::string& f) {
    return (o.skip && o.skip(f)) || (!o.engine.include_optimizer && IsTrainingOnlyFile(f));
  });
  return files;
}

ConvertReport ConvertInPlace(const std::vector<std::string>& paths, const ConvertJobOptions& o) {
  std::vector<std::string> files = InPlaceTargets(paths, o);
  Batch batch(files, o.threads, "convert", o.progress, SIZE_MAX, o.spread);
  ConvertOptions co = o.engine;
  co.threads = batch.threads_per_file();
  co.bytes_done = batch.bytes_done();
  std::vector<ConvertResult> results(files.size());
  std::vector<std::string> errors =
      batch.Run<ConvertResult>(results, [&](size_t i) { return ConvertFileInPlace(files[i], co); });
  ConvertReport report;
  report.dry_run = co.dry_run;
  if (!batch.reports()) {
    report.reports = false;
    return report;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (errors[i].empty()) {
      report.before += results[i].before;
      report.after += results[i].converted ? results[i].after : results[i].before;
    }
    report.files.push_back({files[i], errors[i], std::move(results[i])});
  }
  return report;
}

}  // namespace ckpt::jobs
