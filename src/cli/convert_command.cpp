#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "io/parallel.h"
#include "jobs/convert.h"

namespace ckpt::cli {

namespace {

// The job's options are bound to the flags directly; the rest say how the report is printed.
struct ConvertCliOptions {
  ConvertCliOptions() { job.threads = DefaultThreads(); }

  jobs::ConvertJobOptions job;
  std::vector<std::string> paths;
  bool quiet = false;
  bool json = false;
};

int RunConvert(ConvertCliOptions o) {
  jobs::ConvertJobOptions& jo = o.job;
  ReclaimPaths(jo.engine.keep, o.paths);
  ReclaimPaths(jo.engine.only, o.paths);
  jo.engine.to = *kernels::ParseHalf(jo.dtype);  // CLI11 checked it
  jo.progress = ProgressFor(!o.json);
  const bool dry_run = jo.engine.dry_run;
  jobs::ConvertReport report = jobs::Convert(o.paths, jo);
  if (!report.reports) return 0;  // rank 0 reports for every rank
  int rc = report.ok() ? 0 : 1;
  for (const jobs::ConvertedFile& f : report.files) {
    if (ReportFailure(f.error)) continue;
    const ConvertResult& r = f.result;
    for (const std::string& w : r.warnings) PrintWarning(r.path + ": " + w);
    if (o.json || o.quiet) continue;
    if (r.converted == 0 && r.kept_float32 == 0) {
      Out() << Printable(fmt::format("{} -> {}: no float32 tensors; {} unchanged", r.path, r.output,
                                     dry_run ? "would be copied" : "copied"))
            << "\n";
    } else {
      Out() << Printable(fmt::format("{} -> {}: {} -> {} ({} {}, {} float32 kept)", r.path,
                                     r.output, HumanBytes(r.before), HumanBytes(r.after),
                                     Count(r.converted, "tensor"),
                                     dry_run ? "would be converted" : "converted", r.kept_float32))
            << "\n";
    }
    if (r.kept_training && !jo.engine.include_optimizer) {
      Out() << fmt::format(
          "  kept as they are: {} of training state (optimizer, scheduler, RNG; "
          "--include-optimizer converts them)\n",
          Count(r.kept_training, "tensor"));
    }
    for (const std::string& k : r.kept) Out() << "  kept float32: " << Printable(k) << "\n";
    for (const std::string& l : r.lost_precision)
      Out() << "  lost precision: " << Printable(l) << "\n";
  }
  for (const jobs::CarriedFile& c : report.copies) {
    if (!c.error.empty()) PrintError(c.error);
  }
  for (const jobs::CarriedFile& c : report.indexes) {
    if (!c.error.empty()) {
      PrintError(c.error);
    } else if (!o.json && !o.quiet) {
      Out() << fmt::format("{} -> {}: total_size {}\n", c.files.input, c.files.output,
                           c.total_size);
    }
  }
  const size_t files = report.files.size();
  if (o.json) {
    PrintJson(jobs::ToJson(report));
  } else if (rc != 0) {
    if (files > 1)
      Err() << fmt::format("ckptool convert: {} of {} failed\n",
                           Count(report.failed(), "checkpoint"), files);
  } else if (!o.quiet) {
    Out() << fmt::format(
        "{} {} {}: {} -> {}{}{}\n", dry_run ? "Dry run:" : "Done.", Count(files, "file"),
        dry_run ? "would be converted" : "converted", HumanBytes(report.before),
        HumanBytes(report.after),
        report.copies.empty()
            ? ""
            : fmt::format(" ({} {} unchanged)", Count(report.copies.size(), "other file"),
                          dry_run ? "would be copied" : "copied"),
        dry_run ? " (nothing written)" : "");
  }
  return rc;
}

}  // namespace

Runner AddConvert(CLI::App& app) {
  auto o = std::make_shared<ConvertCliOptions>();
  app.add_option("paths", o->paths, "Checkpoint files or model folders");
  app.add_option("--dtype", o->job.dtype, "Target type for float32 tensors")
      ->required()
      ->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--output-dir", o->job.output_dir,
                 "Where outputs go (default for a folder: <folder>/bf16 or <folder>/fp16)");
  app.add_option("-o,--output", o->job.output_file, "Output file, for a single input file");
  app.add_option("--keep", o->job.engine.keep,
                 "Tensor-name globs that stay float32 (e.g. '*norm*' '*.bias')");
  app.add_option("--only", o->job.engine.only,
                 "Convert only tensors whose name matches one of these globs");
  app.add_flag("--keep-1d", o->job.engine.keep_1d, "Keep 1-D tensors (norms, biases) in float32");
  app.add_flag("--include-optimizer", o->job.engine.include_optimizer,
               "Convert training state too (optimizer moments, schedulers; never counters "
               "that would change, never DeepSpeed's fp32 master weights)");
  app.add_flag("-f,--force", o->job.force, "Write over existing outputs");
  app.add_flag("--dry-run", o->job.engine.dry_run,
               "Measure and report what would be written; write nothing");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors and warnings");
  app.add_flag("--lossy", o->job.engine.lossy,
               "Also convert tensors whose values would change beyond rounding (overflow to "
               "infinity, flush to zero, whole numbers that change); the report lists them");
  AddRewriteFlags(app, &o->job.threads, &o->json, &o->job.engine.allow_unsafe_globals,
                  &o->job.engine.trust.patterns);
  return [o] { return RunConvert(*o); };
}

}  // namespace ckpt::cli
