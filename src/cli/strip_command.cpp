#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "checkpoint/integrity.h"
#include "cli/archive_inputs.h"
#include "cli/batch.h"
#include "cli/commands.h"
#include "cli/output_place.h"
#include "cli/progress.h"
#include "dcp/dcp_checkpoint.h"
#include "engines/dcp_strip.h"
#include "engines/strip.h"
#include "file/checkpoint_file.h"
#include "io/atomic_output.h"
#include "io/parallel.h"
#include "io/temp_files.h"
#include "jobs/result_json.h"

namespace ckpt::cli {

namespace {

// The engine's options are bound to the flags directly (its output is set below: where the
// command writes may be a temp place); the rest say where and how.
struct StripCliOptions {
  StripOptions so;
  std::vector<std::string> paths;
  std::string output;
  bool delete_files = false;
  bool force = false;
  bool quiet = false;
  bool json = false;
  unsigned threads = DefaultThreads();
};

int RunStrip(StripCliOptions o) {
  StripOptions& so = o.so;
  ReclaimPaths(so.drop, o.paths);
  ReclaimPaths(so.keep, o.paths);
  if (o.paths.empty()) {
    PrintError("give checkpoint files or folders to strip");
    return 2;
  }
  if (!o.output.empty() && o.paths.size() != 1) {
    PrintError("-o names one output: give exactly one input (a file or a folder)");
    return 2;
  }
  ArchiveInputs archives(o.paths, o.output, o.threads, "-o");
  // A folder (not a torch.distributed.checkpoint one, which strips as a whole) with -o: a
  // stripped copy of it, training-only files left out.
  const bool folder_copy = !o.output.empty() && std::filesystem::is_directory(o.paths[0]) &&
                           !dcp::LooksLikeDcpCheckpoint(o.paths[0]);
  if (folder_copy && o.delete_files) {
    PrintError("--delete-files deletes in place; a copy (-o) leaves training-only files out");
    return 2;
  }
  // The copy carries its other files over byte for byte: none may be damaged either (the
  // stripped ones are checked as they are read).
  if (folder_copy) RefuseDamaged(o.paths[0], o.threads, "no copy written");
  so.output = o.output;
  StripTargets targets = CollectStripTargets(o.paths);
  std::vector<std::string>& files = targets.files;
  const std::vector<std::string>& training_files = targets.training_files;
  // The output goes into place whole: a file by its atomic writer, a folder (the copy, or a
  // torch.distributed.checkpoint folder's) through a temp folder; never over an existing one
  // without --force.
  const bool folder_output = folder_copy || (!o.output.empty() && !targets.dcp_folders.empty());
  std::optional<SharedPlace> place;
  if (!o.output.empty() && so.dry_run) {
    OutputPlace::Check(o.output, o.force, OutputPlace::Kind::kFolder);
  } else if (folder_output) {
    place = MakeSharedPlace(o.output, o.force, OutputPlace::Kind::kFolder, true);
    if (!place) return 1;  // rank 0 reports why
    so.output = place->write_to;
  } else if (!o.output.empty() && !o.force && std::filesystem::exists(o.output)) {
    PrintError(fmt::format("{}: exists; --force replaces it", o.output));
    return 1;
  }
  const std::string source_root = folder_copy ? o.paths[0] : "";
  auto output_of = [&](const std::string& input) {
    if (!folder_copy) return so.output;
    return (std::filesystem::path(so.output) /
            std::filesystem::path(input).lexically_relative(source_root))
        .string();
  };
  // torch.distributed.checkpoint folders after the files: one at a time, each with every
  // thread.
  const size_t plain_files = files.size();
  files.insert(files.end(), targets.dcp_folders.begin(), targets.dcp_folders.end());
  Batch batch(files, o.threads, "strip", ProgressWanted(!o.json && !so.dry_run), plain_files);
  so.threads = batch.threads_per_file();
  StripOptions dso = so;
  dso.threads = o.threads;
  std::vector<StripResult> results(files.size());
  std::vector<std::string> errors = batch.Run<StripResult>(results, [&](size_t i) {
    StripOptions mine = i < plain_files ? so : dso;
    if (!o.output.empty() && !so.dry_run) mine.output = output_of(files[i]);
    return i < plain_files ? StripFile(files[i], mine) : StripDcp(files[i], mine);
  });
  if (!batch.reports()) return 0;  // rank 0 reports for every rank
  int rc = 0;
  size_t copied = 0;
  const bool all_ok =
      std::all_of(errors.begin(), errors.end(), [](const std::string& e) { return e.empty(); });
  if (place && place->place && all_ok) {
    if (folder_copy) copied = CopyRestOfFolder(source_root, so.output, files, training_files);
    place->place->Commit({});
    for (size_t i = 0; i < results.size(); ++i) {
      results[i].output = folder_copy
                              ? (std::filesystem::path(o.output) /
                                 std::filesystem::path(files[i]).lexically_relative(source_root))
                                    .string()
                              : o.output;
    }
  }
  // An archive's restored paths are shown as the archive's.
  for (size_t i = 0; i < files.size(); ++i) {
    files[i] = archives.Shown(files[i]);
    errors[i] = archives.Shown(errors[i]);
    results[i].path = archives.Shown(results[i].path);
  }
  uint64_t before = 0, after = 0;
  nlohmann::ordered_json doc = {{"files", nlohmann::ordered_json::array()}};
  for (size_t i = 0; i < files.size(); ++i) {
    if (ReportFailure(files[i], errors[i], o.json, doc["files"])) {
      rc = 1;
      continue;
    }
    const StripResult& r = results[i];
    before += r.before;
    after += r.after;
    for (const DroppedEntry& d : r.dropped) {
      if (!o.json && !o.quiet)
        Out() << Printable(fmt::format("{}: {} {} ({})", r.path,
                                       r.rewritten ? "dropped" : "would drop", d.path,
                                       HumanBytes(d.bytes)))
              << "\n";
    }
    if (o.json) {
      doc["files"].push_back(nlohmann::ordered_json(r));
    } else if (!o.quiet) {
      std::string why = r.dropped.empty() ? " (nothing to drop)"
                        : !r.note.empty() ? " (" + r.note + ")"
                        : so.dry_run      ? " (dry run)"
                                          : "";
      std::string where = r.output != r.path ? " in " + r.output : "";
      Out() << Printable(fmt::format("{}: {} -> {}{}{}", r.path, HumanBytes(r.before),
                                     HumanBytes(r.after), where, why))
            << "\n";
    }
  }
  nlohmann::ordered_json tfiles = nlohmann::ordered_json::array();
  for (const std::string& t : training_files) {
    std::error_code ec;
    uint64_t size = std::filesystem::file_size(t, ec);
    nlohmann::ordered_json row = {{"path", archives.Shown(t)}, {"bytes", size}, {"deleted", false}};
    std::string state = "kept; --delete-files removes it";
    if (folder_copy) {
      state = so.dry_run ? "would be left out of the copy" : "left out of the copy";
    } else if (o.delete_files && !so.dry_run) {
      NoteChanging();
      if (RemoveOutputFile(t, ec)) {
        row["deleted"] = true;
        state = "deleted";
      } else {
        // A file that could not be deleted is a failure, not a suggestion.
        std::string why =
            ec == std::errc::no_such_file_or_directory ? "it was gone already" : ec.message();
        row["error"] = why;
        PrintError(
            Printable(fmt::format("{}: could not delete this training-only file: {}", t, why)));
        rc = 1;
        state = "NOT deleted: " + why;
      }
    } else if (so.dry_run && o.delete_files) {
      state = "dry run; --delete-files would remove it";
    }
    tfiles.push_back(row);
    if (!o.json && !o.quiet)
      Out() << Printable(fmt::format("{}: training-only file, {} ({})", archives.Shown(t),
                                     HumanBytes(size), state))
            << "\n";
  }
  if (o.json) {
    doc["training_only_files"] = tfiles;
    doc["before"] = before;
    doc["after"] = after;
    if (folder_copy) doc["copied_files"] = copied;
    PrintJson(doc);
  } else if (folder_copy && rc == 0 && !o.quiet) {
    std::string what =
        so.dry_run ? fmt::format(
                         "Would write {}: {} stripped, {} left out, the rest copied "
                         "unchanged (dry run: nothing written)",
                         o.output, Count(files.size(), "file"),
                         Count(training_files.size(), "training-only file"))
                   : fmt::format("Wrote {}: {} stripped, {} copied unchanged, {} left out",
                                 o.output, Count(files.size(), "file"), Count(copied, "other file"),
                                 Count(training_files.size(), "training-only file"));
    Out() << Printable(what) << "\n";
  } else if (folder_copy && rc != 0) {
    PrintError(fmt::format("{}: not written (nothing of the copy is left)", o.output));
  }
  return rc;
}

}  // namespace

Runner AddStrip(CLI::App& app) {
  auto o = std::make_shared<StripCliOptions>();
  app.add_option("paths", o->paths, "Checkpoint files or folders");
  app.add_option("-o,--output", o->output,
                 "Write here instead of in place: a file, or for a folder a stripped copy of it "
                 "(training-only files left out)");
  app.add_option("--drop", o->so.drop,
                 "Key-path globs to remove (default: optimizer, scheduler, scaler and RNG state)");
  app.add_option("--keep", o->so.keep, "Key-path globs never removed");
  app.add_flag("--dry-run", o->so.dry_run, "Show what would go; write nothing");
  app.add_flag("--delete-files", o->delete_files,
               "In folders, delete training-only files (optimizer.pt, *optim_states.pt...)");
  app.add_flag("-f,--force", o->force, "Replace an existing output");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors");
  AddRewriteFlags(app, &o->threads, &o->json, &o->so.allow_unsafe_globals, &o->so.trust.patterns);
  return [o] { return RunStrip(*o); };
}

}  // namespace ckpt::cli
