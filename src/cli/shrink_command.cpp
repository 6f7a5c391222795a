#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/human.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "io/parallel.h"
#include "jobs/shrink.h"

namespace ckpt::cli {

namespace {

struct ShrinkCliOptions {
  ShrinkCliOptions() { job.threads = DefaultThreads(); }

  jobs::ShrinkJobOptions job;
  bool debug = false;
  bool json = false;
  bool quiet = false;
};

int RunShrink(ShrinkCliOptions o) {
  jobs::ShrinkJobOptions& jo = o.job;
  ReclaimPaths(jo.patterns, jo.files);
  jo.progress = ProgressFor(!o.json && !jo.engine.dry_run);
  jobs::ShrinkReport report = jobs::Shrink(jo);
  if (!report.reports) return 0;  // rank 0 reports for every rank
  for (const std::string& d : report.dcp_folders) {
    Out() << Printable(fmt::format(
                 "{}: torch.distributed.checkpoint folder: its items are already compact, "
                 "nothing to shrink (strip drops its optimizer state; export writes its model)",
                 d))
          << "\n";
  }
  if (report.files.empty() && !report.dcp_folders.empty()) return 0;
  if (report.files.empty()) {
    PrintError("no torch checkpoints found");
    return 1;
  }
  // Run as the reference script is (--checkpoint_dir), shrink prints its lines exactly (sizes
  // in MiB with two decimals); otherwise in units that fit the sizes.
  auto size = [&](uint64_t bytes) {
    return jo.checkpoint_dir.empty() ? HumanBytes(bytes) : fmt::format("{:.2f}MiB", MiB(bytes));
  };
  for (const jobs::ShrunkFile& f : report.files) {
    if (ReportFailure(f.error)) continue;
    const ShrinkResult& r = f.result;
    if (!o.json && o.debug && !o.quiet) {
      Out() << fmt::format("{}: before {}, after {}, saved {}{}\n", r.path, size(r.before),
                           size(r.after), size(r.before - std::min(r.before, r.after)),
                           r.note.empty() ? "" : " (" + r.note + ")");
    }
  }
  const size_t failed = report.failed(), files = report.files.size();
  if (o.json) {
    PrintJson(jobs::ToJson(report));
  } else if (failed) {
    // No success line after a failure: with several files, say how many failed and what the
    // others did (one file's error line says it all).
    if (files > 1)
      Err() << fmt::format("ckptool shrink: {} of {} failed; the other {}: before {}, after {}\n",
                           Count(failed, "file"), files, files - failed, HumanBytes(report.before),
                           HumanBytes(report.after));
  } else {
    // The reference script's summary line.
    if (!o.quiet)
      Out() << fmt::format("Done. Before {}, after {}, saved {}{}\n", size(report.before),
                           size(report.after), size(report.saved()),
                           report.dry_run ? " (dry run: nothing written)" : "");
  }
  return failed ? 1 : 0;
}

}  // namespace

Runner AddShrink(CLI::App& app) {
  auto o = std::make_shared<ShrinkCliOptions>();
  app.add_option("files", o->job.files, "Checkpoint files (or folders) to shrink");
  app.add_option("--checkpoint_dir,--checkpoint-dir", o->job.checkpoint_dir,
                 "Shrink every torch checkpoint below this folder (recognised by content)");
  app.add_option("--patterns", o->job.patterns,
                 "Only files whose base name matches one of these globs (quote them: 'layer*pt')");
  app.add_flag("-d,--debug", o->debug, "Print each file's before/after/saved sizes");
  app.add_flag("--dry-run", o->job.engine.dry_run, "Compute the exact savings; write nothing");
  app.add_option("-o,--output", o->job.output,
                 "Write the result here (one input file); leave the original untouched");
  app.add_option("--output-dir", o->job.output_dir,
                 "Write results here (files found in a folder keep their path below it); leave "
                 "the originals untouched");
  app.add_flag("-f,--force", o->job.force, "Replace existing outputs");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors");
  app.add_flag("--materialize", o->job.engine.materialize,
               "Lay out non-contiguous views that share bytes with nothing else contiguously "
               "when that is smaller (their strides change; off by default)");
  AddRewriteFlags(app, &o->job.threads, &o->json, &o->job.engine.allow_unsafe_globals,
                  &o->job.engine.trust.patterns);
  return [o] { return RunShrink(*o); };
}

}  // namespace ckpt::cli
