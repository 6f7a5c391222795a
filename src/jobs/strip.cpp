#include "jobs/strip.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/error.h"
#include "checkpoint/integrity.h"
#include "cluster/steps.h"
#include "dcp/dcp_checkpoint.h"
#include "engines/dcp_strip.h"
#include "io/atomic_output.h"
#include "io/temp_files.h"
#include "jobs/archive_inputs.h"
#include "jobs/batch.h"
#include "jobs/output_place.h"
#include "jobs/result_json.h"

namespace ckpt::jobs {

namespace fs = std::filesystem;

size_t StripReport::failed() const {
  return FailedOf(files);
}

bool StripReport::ok() const {
  return failed() == 0 && std::none_of(training_files.begin(), training_files.end(),
                                       [](const TrainingFile& t) { return !t.error.empty(); });
}

nlohmann::ordered_json ToJson(const StripReport& r) {
  nlohmann::ordered_json doc = OutcomesJson(r.files, "path");
  nlohmann::ordered_json training = nlohmann::ordered_json::array();
  for (const TrainingFile& t : r.training_files) {
    nlohmann::ordered_json row = {{"path", t.path}, {"bytes", t.bytes}, {"deleted", t.deleted}};
    if (!t.error.empty()) row["error"] = t.error;
    training.push_back(row);
  }
  doc["training_only_files"] = training;
  doc["before"] = r.before;
  doc["after"] = r.after;
  if (r.folder_copy) doc["copied_files"] = r.copied;
  return doc;
}

StripReport Strip(const StripJobOptions& o) {
  std::vector<std::string> paths = o.paths;
  if (paths.empty()) throw UsageError("give checkpoint files or folders to strip");
  if (!o.output.empty() && paths.size() != 1)
    throw UsageError("-o names one output: give exactly one input (a file or a folder)");
  StripOptions so = o.engine;
  ArchiveInputs archives(paths, o.output, o.threads, "-o");
  // A folder (not a torch.distributed.checkpoint one, which strips as a whole) with an output:
  // a stripped copy of it, training-only files left out.
  StripReport report;
  report.dry_run = so.dry_run;
  report.folder_copy =
      !o.output.empty() && fs::is_directory(paths[0]) && !dcp::LooksLikeDcpCheckpoint(paths[0]);
  if (report.folder_copy && o.delete_files) {
    throw UsageError("--delete-files deletes in place; a copy (-o) leaves training-only files out");
  }
  // The copy carries its other files over byte for byte: none may be damaged either (the
  // stripped ones are checked as they are read).
  if (report.folder_copy) RefuseDamaged(paths[0], o.threads, "no copy written");
  so.output = o.output;
  StripTargets targets = CollectStripTargets(paths);
  if (o.skip) {
    std::erase_if(targets.files, o.skip);
    std::erase_if(targets.dcp_folders, o.skip);
    std::erase_if(targets.training_files, o.skip);
  }
  std::vector<std::string>& files = targets.files;
  // The output goes into place whole: a file by its atomic writer, a folder (the copy, or a
  // torch.distributed.checkpoint folder's) through a temp folder; never over an existing one
  // without `force`.
  const bool folder_output =
      report.folder_copy || (!o.output.empty() && !targets.dcp_folders.empty());
  std::optional<SharedPlace> place;
  if (!o.output.empty() && so.dry_run) {
    OutputPlace::Check(o.output, o.force, OutputPlace::Kind::kFolder);
  } else if (folder_output) {
    place = MakeSharedPlace(o.output, o.force, OutputPlace::Kind::kFolder, o.spread);
    if (!place) throw cluster::Stopped{1};  // rank 0 says why
    so.output = place->write_to;
  } else if (!o.output.empty() && !o.force && fs::exists(o.output)) {
    Fail("{}: exists; --force replaces it", o.output);
  }
  const std::string source_root = report.folder_copy ? paths[0] : "";
  auto output_of = [&](const std::string& input, const std::string& root) {
    if (!report.folder_copy) return root;
    return (fs::path(root) / fs::path(input).lexically_relative(source_root)).string();
  };
  // torch.distributed.checkpoint folders after the files: one at a time, each with every
  // thread.
  const size_t plain_files = files.size();
  files.insert(files.end(), targets.dcp_folders.begin(), targets.dcp_folders.end());
  Batch batch(files, o.threads, "strip", o.progress, plain_files, o.spread);
  so.threads = batch.threads_per_file();
  StripOptions dso = so;
  dso.threads = o.threads;
  std::vector<StripResult> results(files.size());
  std::vector<std::string> errors = batch.Run<StripResult>(results, [&](size_t i) {
    StripOptions mine = i < plain_files ? so : dso;
    if (!o.output.empty() && !so.dry_run) mine.output = output_of(files[i], so.output);
    return i < plain_files ? StripFile(files[i], mine) : StripDcp(files[i], mine);
  });
  if (!batch.reports()) {
    report.reports = false;
    return report;
  }
  const bool all_ok =
      std::all_of(errors.begin(), errors.end(), [](const std::string& e) { return e.empty(); });
  if (place && place->place && all_ok) {
    if (report.folder_copy)
      report.copied = CopyRestOfFolder(source_root, so.output, files, targets.training_files);
    place->place->Commit({});
    for (size_t i = 0; i < results.size(); ++i) results[i].output = output_of(files[i], o.output);
  }
  for (size_t i = 0; i < files.size(); ++i) {
    // An archive's restored paths are shown as the archive's.
    StrippedFile f{archives.Shown(files[i]), archives.Shown(errors[i]), std::move(results[i])};
    if (f.error.empty()) {
      f.result.path = archives.Shown(f.result.path);
      report.before += f.result.before;
      report.after += f.result.after;
    }
    report.files.push_back(std::move(f));
  }
  for (const std::string& t : targets.training_files) {
    std::error_code ec;
    TrainingFile row{archives.Shown(t), fs::file_size(t, ec), false, ""};
    if (ec) row.bytes = 0;
    if (!report.folder_copy && o.delete_files && !so.dry_run) {
      NoteChanging();
      if (RemoveOutputFile(t, ec)) {
        row.deleted = true;
      } else {
        // A file that could not be deleted is a failure, not a suggestion.
        row.error =
            ec == std::errc::no_such_file_or_directory ? "it was gone already" : ec.message();
      }
    }
    report.training_files.push_back(std::move(row));
  }
  return report;
}

}  // namespace ckpt::jobs
