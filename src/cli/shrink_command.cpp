#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "base/utf8.h"
#include "cli/batch.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "cluster/world.h"
#include "io/parallel.h"
#include "ops/checkpoint_file.h"
#include "ops/result_json.h"
#include "ops/shrink.h"

namespace ckpt::cli {

namespace {

struct ShrinkCliOptions {
  std::vector<std::string> files;
  std::string checkpoint_dir;
  std::vector<std::string> patterns;
  bool debug = false;
  bool dry_run = false;
  bool json = false;
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

std::vector<std::string> CollectFiles(const ShrinkCliOptions& o, std::vector<std::string>* dcp) {
  std::vector<std::string> files;
  if (!o.checkpoint_dir.empty()) {
    if (!std::filesystem::is_directory(o.checkpoint_dir)) {
      Fail("{}: not a folder", o.checkpoint_dir);
    }
    for (const std::string& f : ExpandInputs({o.checkpoint_dir}, nullptr, dcp)) {
      if (!MatchesPatterns(f, o.patterns)) continue;
      MappedFile m = MappedFile::Open(f);
      std::optional<Format> format = DetectFormat(m.bytes());
      if (format && *format != Format::kSafetensors) files.push_back(f);
    }
  }
  // Files named on the command line are always taken; --patterns filters what folders hold.
  for (const std::string& p : o.files) {
    if (!std::filesystem::is_directory(p)) {
      files.push_back(p);
      continue;
    }
    for (const std::string& f : ExpandInputs({p}, nullptr, dcp)) {
      if (MatchesPatterns(f, o.patterns)) files.push_back(f);
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
  if (!o.output_dir.empty() && !o.dry_run) std::filesystem::create_directories(o.output_dir);
  std::vector<std::string> dcp_folders;
  std::vector<std::string> files = CollectFiles(o, &dcp_folders);
  // torch.distributed.checkpoint saves every chunk compact (a view is cloned first): there is
  // nothing for shrink to cut.
  for (const std::string& d : dcp_folders) {
    if (!cluster::IsRoot()) break;
    std::cout << Printable(fmt::format(
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
  Batch batch(files, o.threads, "shrink", !o.json && !o.dry_run && StderrIsTerminal());
  ShrinkOptions so;
  so.dry_run = o.dry_run;
  so.output_dir = o.output_dir;
  so.threads = batch.threads_per_file();
  so.allow_unsafe_globals = o.allow_unsafe_globals;
  so.trust.patterns = o.trust;
  so.materialize = o.materialize;
  so.bytes_done = batch.bytes_done();
  std::vector<ShrinkResult> results(files.size());
  std::vector<std::string> errors =
      batch.Run<ShrinkResult>(results, [&](size_t i) { return ShrinkFile(files[i], so); });
  if (!batch.reports()) return 0;  // rank 0 reports for every rank
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
      doc["files"].push_back({{"path", r.path},
                              {"output", r.output},
                              {"before", r.before},
                              {"after", r.after},
                              {"saved", r.before - std::min(r.before, r.after)},
                              {"rewritten", r.rewritten},
                              {"note", r.note}});
    } else if (o.debug) {
      std::cout << fmt::format("{}: before {:.2f}MiB, after {:.2f}MiB, saved {:.2f}MiB{}\n", r.path,
                               MiB(r.before), MiB(r.after),
                               MiB(r.before - std::min(r.before, r.after)),
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
      std::cerr << fmt::format(
          "ckptool shrink: {} of {} failed; the other {}: before {}, after {}\n",
          Count(failed, "file"), files.size(), files.size() - failed, HumanBytes(before),
          HumanBytes(after));
  } else {
    // The reference script's summary line, in its units.
    std::cout << fmt::format("Done. Before {:.2f}MiB, after {:.2f}MiB, saved {:.2f}MiB{}\n",
                             MiB(before), MiB(after), MiB(saved),
                             o.dry_run ? " (dry run: nothing written)" : "");
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
  app.add_option("--output-dir", o->output_dir,
                 "Write results here; leave the originals untouched");
  app.add_flag("--materialize", o->materialize,
               "Lay out non-contiguous views that share bytes with nothing else contiguously "
               "when that is smaller (their strides change; off by default)");
  AddRewriteFlags(app, &o->threads, &o->json, &o->allow_unsafe_globals, &o->trust);
  return [o] { return RunShrink(*o); };
}

}  // namespace ckpt::cli
