#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "cli/batch.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "dcp/dcp_checkpoint.h"
#include "io/parallel.h"
#include "ops/checkpoint_file.h"
#include "ops/dcp_strip.h"
#include "ops/result_json.h"
#include "ops/strip.h"

namespace ckpt::cli {

namespace {

struct StripCliOptions {
  std::vector<std::string> paths;
  std::string output;
  std::vector<std::string> drop;
  std::vector<std::string> keep;
  bool dry_run = false;
  bool delete_files = false;
  bool json = false;
  unsigned threads = DefaultThreads();
  bool allow_unsafe_globals = false;
  std::vector<std::string> trust;
};

int RunStrip(StripCliOptions o) {
  ReclaimPaths(o.drop, o.paths);
  ReclaimPaths(o.keep, o.paths);
  if (o.paths.empty()) {
    PrintError("give checkpoint files or folders to strip");
    return 2;
  }
  if (!o.output.empty() && (o.paths.size() != 1 || (std::filesystem::is_directory(o.paths[0]) &&
                                                    !dcp::LooksLikeDcpCheckpoint(o.paths[0])))) {
    PrintError(
        "-o names one output: give exactly one input file or torch.distributed.checkpoint folder");
    return 2;
  }
  StripOptions so;
  so.drop = o.drop;
  so.keep = o.keep;
  so.dry_run = o.dry_run;
  so.output = o.output;
  so.allow_unsafe_globals = o.allow_unsafe_globals;
  so.trust.patterns = o.trust;
  StripTargets targets = CollectStripTargets(o.paths);
  std::vector<std::string>& files = targets.files;
  const std::vector<std::string>& training_files = targets.training_files;
  // torch.distributed.checkpoint folders after the files: one at a time, each with every
  // thread.
  const size_t plain_files = files.size();
  files.insert(files.end(), targets.dcp_folders.begin(), targets.dcp_folders.end());
  Batch batch(files, o.threads, "strip", !o.json && !o.dry_run && StderrIsTerminal(), plain_files);
  so.threads = batch.threads_per_file();
  StripOptions dso = so;
  dso.threads = o.threads;
  std::vector<StripResult> results(files.size());
  std::vector<std::string> errors = batch.Run<StripResult>(results, [&](size_t i) {
    return i < plain_files ? StripFile(files[i], so) : StripDcp(files[i], dso);
  });
  if (!batch.reports()) return 0;  // rank 0 reports for every rank
  int rc = 0;
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
    nlohmann::ordered_json dropped = nlohmann::ordered_json::array();
    for (const DroppedEntry& d : r.dropped) {
      dropped.push_back({{"path", d.path}, {"bytes", d.bytes}});
      if (!o.json)
        std::cout << Printable(fmt::format("{}: {} {} ({})", r.path,
                                           r.rewritten ? "dropped" : "would drop", d.path,
                                           HumanBytes(d.bytes)))
                  << "\n";
    }
    if (o.json) {
      doc["files"].push_back({{"path", r.path},
                              {"output", r.output},
                              {"before", r.before},
                              {"after", r.after},
                              {"dropped", dropped},
                              {"rewritten", r.rewritten},
                              {"note", r.note}});
    } else {
      std::string why = r.dropped.empty() ? " (nothing to drop)"
                        : !r.note.empty() ? " (" + r.note + ")"
                        : o.dry_run       ? " (dry run)"
                                          : "";
      std::cout << Printable(fmt::format("{}: {} -> {}{}", r.path, HumanBytes(r.before),
                                         HumanBytes(r.after), why))
                << "\n";
    }
  }
  nlohmann::ordered_json tfiles = nlohmann::ordered_json::array();
  for (const std::string& t : training_files) {
    std::error_code ec;
    uint64_t size = std::filesystem::file_size(t, ec);
    nlohmann::ordered_json row = {{"path", t}, {"bytes", size}, {"deleted", false}};
    std::string state = "kept; --delete-files removes it";
    if (o.delete_files && !o.dry_run) {
      if (std::filesystem::remove(t, ec)) {
        row["deleted"] = true;
        state = "deleted";
      } else {
        // A file that could not be deleted is a failure, not a suggestion.
        std::string why = ec ? ec.message() : "it was gone already";
        row["error"] = why;
        PrintError(
            Printable(fmt::format("{}: could not delete this training-only file: {}", t, why)));
        rc = 1;
        state = "NOT deleted: " + why;
      }
    } else if (o.dry_run && o.delete_files) {
      state = "dry run; --delete-files would remove it";
    }
    tfiles.push_back(row);
    if (!o.json)
      std::cout << Printable(
                       fmt::format("{}: training-only file, {} ({})", t, HumanBytes(size), state))
                << "\n";
  }
  if (o.json) {
    doc["training_only_files"] = tfiles;
    doc["before"] = before;
    doc["after"] = after;
    PrintJson(doc);
  }
  return rc;
}

}  // namespace

Runner AddStrip(CLI::App& app) {
  auto o = std::make_shared<StripCliOptions>();
  app.add_option("paths", o->paths, "Checkpoint files or folders");
  app.add_option("-o,--output", o->output, "Write here instead of replacing the file");
  app.add_option("--drop", o->drop,
                 "Key-path globs to remove (default: optimizer, scheduler, scaler and RNG state)");
  app.add_option("--keep", o->keep, "Key-path globs never removed");
  app.add_flag("--dry-run", o->dry_run, "Show what would go; write nothing");
  app.add_flag("--delete-files", o->delete_files,
               "In folders, delete training-only files (optimizer.pt, *optim_states.pt...)");
  AddRewriteFlags(app, &o->threads, &o->json, &o->allow_unsafe_globals, &o->trust);
  return [o] { return RunStrip(*o); };
}

}  // namespace ckpt::cli
