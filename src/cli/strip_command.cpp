#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "base/human.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "io/parallel.h"
#include "jobs/strip.h"

namespace ckpt::cli {

namespace {

// The job's options are bound to the flags directly; the rest say how the report is printed.
struct StripCliOptions {
  StripCliOptions() { job.threads = DefaultThreads(); }

  jobs::StripJobOptions job;
  bool quiet = false;
  bool json = false;
};

int RunStrip(StripCliOptions o) {
  jobs::StripJobOptions& jo = o.job;
  ReclaimPaths(jo.engine.drop, jo.paths);
  ReclaimPaths(jo.engine.keep, jo.paths);
  const bool dry_run = jo.engine.dry_run;
  jo.progress = ProgressFor(!o.json && !dry_run);
  jobs::StripReport report = jobs::Strip(jo);
  if (!report.reports) return 0;  // rank 0 reports for every rank
  for (const jobs::StrippedFile& f : report.files) {
    if (ReportFailure(f.error)) continue;
    if (o.json || o.quiet) continue;
    const StripResult& r = f.result;
    for (const DroppedEntry& d : r.dropped) {
      Out() << Printable(fmt::format("{}: {} {} ({})", r.path,
                                     r.rewritten ? "dropped" : "would drop", d.path,
                                     HumanBytes(d.bytes)))
            << "\n";
    }
    std::string why = r.dropped.empty() ? " (nothing to drop)"
                      : !r.note.empty() ? " (" + r.note + ")"
                      : dry_run         ? " (dry run)"
                                        : "";
    std::string where = r.output != r.path ? " in " + r.output : "";
    Out() << Printable(fmt::format("{}: {} -> {}{}{}", r.path, HumanBytes(r.before),
                                   HumanBytes(r.after), where, why))
          << "\n";
  }
  for (const jobs::TrainingFile& t : report.training_files) {
    std::string state = "kept; --delete-files removes it";
    if (report.folder_copy) {
      state = dry_run ? "would be left out of the copy" : "left out of the copy";
    } else if (t.deleted) {
      state = "deleted";
    } else if (!t.error.empty()) {
      PrintError(Printable(
          fmt::format("{}: could not delete this training-only file: {}", t.path, t.error)));
      state = "NOT deleted: " + t.error;
    } else if (dry_run && jo.delete_files) {
      state = "dry run; --delete-files would remove it";
    }
    if (!o.json && !o.quiet)
      Out() << Printable(fmt::format("{}: training-only file, {} ({})", t.path, HumanBytes(t.bytes),
                                     state))
            << "\n";
  }
  const int rc = report.ok() ? 0 : 1;
  if (o.json) {
    PrintJson(jobs::ToJson(report));
  } else if (report.folder_copy && rc == 0 && !o.quiet) {
    const size_t files = report.files.size(), training = report.training_files.size();
    std::string what =
        dry_run ? fmt::format(
                      "Would write {}: {} stripped, {} left out, the rest copied "
                      "unchanged (dry run: nothing written)",
                      jo.output, Count(files, "file"), Count(training, "training-only file"))
                : fmt::format("Wrote {}: {} stripped, {} copied unchanged, {} left out", jo.output,
                              Count(files, "file"), Count(report.copied, "other file"),
                              Count(training, "training-only file"));
    Out() << Printable(what) << "\n";
  } else if (report.folder_copy && rc != 0) {
    PrintError(fmt::format("{}: not written (nothing of the copy is left)", jo.output));
  }
  return rc;
}

}  // namespace

Runner AddStrip(CLI::App& app) {
  auto o = std::make_shared<StripCliOptions>();
  app.add_option("paths", o->job.paths, "Checkpoint files or folders");
  app.add_option("-o,--output", o->job.output,
                 "Write here instead of in place: a file, or for a folder a stripped copy of it "
                 "(training-only files left out)");
  app.add_option("--drop", o->job.engine.drop,
                 "Key-path globs to remove (default: optimizer, scheduler, scaler and RNG state)");
  app.add_option("--keep", o->job.engine.keep, "Key-path globs never removed");
  app.add_flag("--dry-run", o->job.engine.dry_run, "Show what would go; write nothing");
  app.add_flag("--delete-files", o->job.delete_files,
               "In folders, delete training-only files (optimizer.pt, *optim_states.pt...)");
  app.add_flag("-f,--force", o->job.force, "Replace an existing output");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors");
  AddRewriteFlags(app, &o->job.threads, &o->json, &o->job.engine.allow_unsafe_globals,
                  &o->job.engine.trust.patterns);
  return [o] { return RunStrip(*o); };
}

}  // namespace ckpt::cli
