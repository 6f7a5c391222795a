#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "base/utf8.h"
#include "checkpoint/discovery.h"
#include "checkpoint/integrity.h"
#include "cli/batch.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "cluster/world.h"
#include "engines/shrink.h"
#include "file/checkpoint_file.h"
#include "io/parallel.h"
#include "jobs/result_json.h"

namespace ckpt::cli {

namespace {

struct ShrinkCliOptions {
  std::vector<std::string> files;
  std::string checkpoint_dir;
  std::vector<std::string> patterns;
  bool debug = false;
  bool dry_run = false;
  bool json = false;
  bool quiet = false;
  bool force = false;
  std::string output;
  std::string output_dir;
  unsigned threads = DefaultThreads();
  bool allow_unsafe_globals = false;
  std::vector<std::string> trust;
  bool materialize = false;
};

bool MatchesPatterns(const std::string& path, const std::vector<std::string>& patterns) {
  if (patterns.empty()) return true;
  return MatchesAnyGlob(patterns, std::filesystem::path(path).filename().string());
}

// The files to shrink, and for each where it goes below --output-dir: a file named on the
// command line by its name, a file found in a folder by its path from the folder's parent (from
// the folder itself for --checkpoint_dir), so that two runs' files of one name stay apart.
std::vector<std::string> CollectFiles(const ShrinkCliOptions& o, std::vector<std::string>* dcp,
                                      std::vector<std::string>* relative) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  auto add = [&](const std::string& f, const fs::path& base) {
    files.push_back(f);
    relative->push_back(base.empty() ? fs::path(f).filename().string()
                                     : fs::path(f).lexically_relative(base).string());
  };
  if (!o.checkpoint_dir.empty()) {
    if (!std::filesystem::is_directory(o.checkpoint_dir)) {
      Fail("{}: not a folder", o.checkpoint_dir);
    }
    for (const std::string& f : ExpandInputs({o.checkpoint_dir}, nullptr, dcp)) {
      if (!MatchesPatterns(f, o.patterns)) continue;
      if (Shrinkable(f)) add(f, o.checkpoint_dir);
    }
  }
  // Files named on the command line are always taken; --patterns filters what folders hold.
  for (const std::string& p : o.files) {
    if (!fs::is_directory(p)) {
      add(p, {});
      continue;
    }
    fs::path folder = fs::path(p).lexically_normal();
    if (folder.filename().empty()) folder = folder.parent_path();
    for (const std::string& f : ExpandInputs({p}, nullptr, dcp)) {
      // A bare folder name ("run") has no parent: its files are kept relative to ".".
      fs::path base = folder.parent_path().empty() ? fs::path(".") : folder.parent_path();
      if (MatchesPatterns(f, o.patterns)) add(f, base);
    }
  }
  return files;
}

int RunShrink(ShrinkCliOptions o) {
  ReclaimPaths(o.patterns, o.files);
  if (o.checkpoint_dir.empty() && o.files.empty()) {
    PrintError("give checkpoint files or --checkpoint_dir DIR");
    return 2;
  }
  if (!o.output.empty() && !o.output_dir.empty()) {
    PrintError("-o names one output file, --output-dir a folder for many: give one of them");
    return 2;
  }
  std::vector<std::string> dcp_folders, relative;
  std::vector<std::string> files = CollectFiles(o, &dcp_folders, &relative);
  if (!o.output.empty() && files.size() != 1) {
    PrintError(fmt::format("-o names one output, and there are {} to shrink: use --output-dir",
                           Count(files.size(), "file")));
    return 2;
  }
  // Where each result goes: in place, or a new file that must not exist (--force) and that
  // no other input goes to.
  std::vector<std::string> outputs(files.size());
  std::map<std::string, size_t> taken;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!o.output.empty()) outputs[i] = o.output;
    if (!o.output_dir.empty())
      outputs[i] = (std::filesystem::path(o.output_dir) / relative[i]).string();
    if (outputs[i].empty()) continue;
    std::error_code ec;
    std::string key = std::filesystem::weakly_canonical(outputs[i], ec).string();
    if (key == std::filesystem::weakly_canonical(files[i], ec).string()) {
      outputs[i].clear();  // the output is the input: in place
      continue;
    }
    if (auto [at, fresh] = taken.emplace(key, i); !fresh) {
      PrintError(fmt::format("{} and {} would both be written to {}", files[at->second], files[i],
                             outputs[i]));
      return 2;
    }
    if (!o.force && !o.dry_run && std::filesystem::exists(outputs[i])) {
      PrintError(fmt::format("{}: exists; --force replaces it", outputs[i]));
      return 1;
    }
  }
  // torch.distributed.checkpoint saves every chunk compact (a view is cloned first): there is
  // nothing for shrink to cut. A damaged one is said to be damaged, not to be fine.
  for (const std::string& d : dcp_folders) {
    if (!cluster::IsRoot()) break;
    RefuseDamaged(d, o.threads, "nothing shrunk");
    Out() << Printable(fmt::format(
                 "{}: torch.distributed.checkpoint folder: its items are already compact, "
                 "nothing to shrink (strip drops its optimizer state; export writes its model)",
                 d))
          << "\n";
  }
  if (files.empty() && !dcp_folders.empty()) return 0;
  if (files.empty()) {
    PrintError("no torch checkpoints found");
    return 1;
  }
  Batch batch(files, o.threads, "shrink", ProgressWanted(!o.json && !o.dry_run));
  ShrinkOptions so;
  so.dry_run = o.dry_run;

  so.threads = batch.threads_per_file();
  so.allow_unsafe_globals = o.allow_unsafe_globals;
  so.trust.patterns = o.trust;
  so.materialize = o.materialize;
  so.bytes_done = batch.bytes_done();
  std::vector<ShrinkResult> results(files.size());
  std::vector<std::string> errors = batch.Run<ShrinkResult>(results, [&](size_t i) {
    ShrinkOptions mine = so;
    mine.output = outputs[i];
    return ShrinkFile(files[i], mine);
  });
  if (!batch.reports()) return 0;  // rank 0 reports for every rank
  // Run as the reference script is (--checkpoint_dir), shrink prints its lines exactly (sizes
  // in MiB with two decimals); otherwise in units that fit the sizes.
  auto size = [&](uint64_t bytes) {
    return o.checkpoint_dir.empty() ? HumanBytes(bytes) : fmt::format("{:.2f}MiB", MiB(bytes));
  };
  uint64_t before = 0, after = 0;
  int rc = 0;
  size_t failed = 0;
  nlohmann::ordered_json doc = {{"files", nlohmann::ordered_json::array()}};
  for (size_t i = 0; i < files.size(); ++i) {
    if (ReportFailure(files[i], errors[i], o.json, doc["files"])) {
      rc = 1;
      ++failed;
      continue;
    }
    const ShrinkResult& r = results[i];
    before += r.before;
    after += r.after;
    if (o.json) {
      doc["files"].push_back(nlohmann::ordered_json(r));
    } else if (o.debug && !o.quiet) {
      Out() << fmt::format("{}: before {}, after {}, saved {}{}\n", r.path, size(r.before),
                           size(r.after), size(r.before - std::min(r.before, r.after)),
                           r.note.empty() ? "" : " (" + r.note + ")");
    }
  }
  uint64_t saved = before - std::min(before, after);
  if (o.json) {
    doc["before"] = before;
    doc["after"] = after;
    doc["saved"] = saved;
    doc["dry_run"] = o.dry_run;
    PrintJson(doc);
  } else if (failed) {
    // No success line after a failure: with several files, say how many failed and what the
    // others did (one file's error line says it all).
    if (files.size() > 1)
      Err() << fmt::format("ckptool shrink: {} of {} failed; the other {}: before {}, after {}\n",
                           Count(failed, "file"), files.size(), files.size() - failed,
                           HumanBytes(before), HumanBytes(after));
  } else {
    // The reference script's summary line.
    if (!o.quiet)
      Out() << fmt::format("Done. Before {}, after {}, saved {}{}\n", size(before), size(after),
                           size(saved), o.dry_run ? " (dry run: nothing written)" : "");
  }
  return rc;
}

}  // namespace

Runner AddShrink(CLI::App& app) {
  auto o = std::make_shared<ShrinkCliOptions>();
  app.add_option("files", o->files, "Checkpoint files (or folders) to shrink");
  app.add_option("--checkpoint_dir,--checkpoint-dir", o->checkpoint_dir,
                 "Shrink every torch checkpoint below this folder (recognised by content)");
  app.add_option("--patterns", o->patterns,
                 "Only files whose base name matches one of these globs (quote them: 'layer*pt')");
  app.add_flag("-d,--debug", o->debug, "Print each file's before/after/saved sizes");
  app.add_flag("--dry-run", o->dry_run, "Compute the exact savings; write nothing");
  app.add_option("-o,--output", o->output,
                 "Write the result here (one input file); leave the original untouched");
  app.add_option("--output-dir", o->output_dir,
                 "Write results here (files found in a folder keep their path below it); leave "
                 "the originals untouched");
  app.add_flag("-f,--force", o->force, "Replace existing outputs");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors");
  app.add_flag("--materialize", o->materialize,
               "Lay out non-contiguous views that share bytes with nothing else contiguously "
               "when that is smaller (their strides change; off by default)");
  AddRewriteFlags(app, &o->threads, &o->json, &o->allow_unsafe_globals, &o->trust);
  return [o] { return RunShrink(*o); };
}

}  // namespace ckpt::cli
