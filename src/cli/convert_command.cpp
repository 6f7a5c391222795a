#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "checkpoint/integrity.h"
#include "checkpoint/training_state.h"
#include "cli/archive_inputs.h"
#include "cli/batch.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "engines/convert.h"
#include "engines/convert_tree.h"
#include "io/folders.h"
#include "io/parallel.h"
#include "jobs/result_json.h"

namespace ckpt::cli {

namespace {

// The engine's options are bound to the flags directly; the rest say where the output goes
// and how the result is printed.
struct ConvertCliOptions {
  ConvertOptions co;
  std::vector<std::string> paths;
  std::string dtype;
  std::string output_dir;
  std::string output_file;
  bool force = false;
  bool quiet = false;
  unsigned threads = DefaultThreads();
  bool json = false;
};

int RunConvert(ConvertCliOptions o) {
  ConvertOptions& co = o.co;
  ReclaimPaths(co.keep, o.paths);
  ReclaimPaths(co.only, o.paths);
  if (o.paths.empty()) {
    PrintError("give checkpoint files or model folders to convert");
    return 2;
  }
  if (!o.output_file.empty() &&
      (o.paths.size() != 1 || std::filesystem::is_directory(o.paths[0]))) {
    PrintError(
        "-o names one output file: give exactly one input file (--output-dir for folders and "
        "several inputs)");
    return 2;
  }
  co.to = *kernels::ParseHalf(o.dtype);  // CLI11 checked it
  ArchiveInputs archives(o.paths, o.output_dir.empty() ? o.output_file : o.output_dir, o.threads,
                         "-o or --output-dir");
  ConvertTree tree = PlanConvertTree(o.paths, o.output_dir, o.output_file, o.dtype, o.force);
  // A folder's training-only files (optimizer.pt, rng_state.pth...) are copied as they are,
  // unless training state is to be converted too. A file named on its own is converted.
  if (!co.include_optimizer) {
    auto training = [&](const PathPair& j) {
      return IsTrainingOnlyFile(j.input) &&
             std::find(o.paths.begin(), o.paths.end(), j.input) == o.paths.end();
    };
    for (const PathPair& j : tree.checkpoints) {
      if (training(j)) tree.copies.push_back(j);
    }
    std::erase_if(tree.checkpoints, training);
  }
  if (tree.checkpoints.empty()) {
    std::string why;
    for (const std::string& p : o.paths) {
      if (why.empty() && std::filesystem::is_directory(p)) why = WhyNothingToConvert(p, o.dtype);
    }
    PrintError(why.empty() ? "no checkpoints to convert" : "no checkpoints to convert: " + why);
    return 1;
  }
  // A folder is converted whole or not at all: a damaged file in it would leave a model folder
  // with a shard missing (its own rewrite refuses it; the files beside it are checked here).
  if (!co.dry_run) {
    for (const std::string& p : o.paths) {
      if (std::filesystem::is_directory(p)) RefuseDamaged(p, o.threads, "nothing converted");
    }
  }
  std::set<std::string> dirs;
  for (const auto* jobs : {&tree.checkpoints, &tree.copies, &tree.indexes}) {
    for (const PathPair& j : *jobs)
      dirs.insert(std::filesystem::path(j.output).parent_path().string());
  }
  // Folders this run makes go again if it ends (fails, is interrupted) with nothing in them.
  CreatedFolders made;
  for (const std::string& d : dirs) {
    if (!co.dry_run) made.Create(d, d);
  }
  std::vector<std::string> inputs;
  for (const PathPair& j : tree.checkpoints) inputs.push_back(j.input);
  Batch batch(inputs, o.threads, "convert", ProgressWanted(!o.json));
  co.threads = batch.threads_per_file();
  co.bytes_done = batch.bytes_done();
  std::vector<ConvertResult> results(tree.checkpoints.size());
  std::vector<std::string> errors = batch.Run<ConvertResult>(results, [&](size_t i) {
    return ConvertFile(tree.checkpoints[i].input, tree.checkpoints[i].output, co);
  });
  // Rank 0 reports for every rank, and copies the other files and rewrites the indexes,
  // which need every rank's results.
  if (!batch.reports()) return 0;
  // An archive's restored paths are shown as the archive's.
  for (size_t i = 0; i < results.size(); ++i) {
    tree.checkpoints[i].input = archives.Shown(tree.checkpoints[i].input);
    errors[i] = archives.Shown(errors[i]);
    results[i].path = archives.Shown(results[i].path);
    for (std::string& w : results[i].warnings) w = archives.Shown(w);
  }
  int rc = 0;
  size_t failed = 0;
  std::map<std::string, uint64_t> storage_bytes;
  nlohmann::ordered_json doc = {{"files", nlohmann::ordered_json::array()}};
  uint64_t before = 0, after = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (ReportFailure(tree.checkpoints[i].input, errors[i], o.json, doc["files"])) {
      rc = 1;
      ++failed;
      continue;
    }
    const ConvertResult& r = results[i];
    storage_bytes[std::filesystem::path(r.output).filename().string()] = r.storage_bytes;
    before += r.before;
    after += r.after;
    for (const std::string& w : r.warnings) PrintWarning(r.path + ": " + w);
    if (o.json) {
      doc["files"].push_back(nlohmann::ordered_json(r));
    } else if (!o.quiet) {
      if (r.converted == 0 && r.kept_float32 == 0) {
        Out() << Printable(fmt::format("{} -> {}: no float32 tensors; {} unchanged", r.path,
                                       r.output, co.dry_run ? "would be copied" : "copied"))
              << "\n";
      } else {
        Out() << Printable(fmt::format(
                     "{} -> {}: {} -> {} ({} {}, {} float32 kept)", r.path, r.output,
                     HumanBytes(r.before), HumanBytes(r.after), Count(r.converted, "tensor"),
                     co.dry_run ? "would be converted" : "converted", r.kept_float32))
              << "\n";
      }
      if (r.kept_training && !co.include_optimizer) {
        Out() << fmt::format(
            "  kept as they are: {} of training state (optimizer, scheduler, RNG; "
            "--include-optimizer converts them)\n",
            Count(r.kept_training, "tensor"));
      }
      for (const std::string& k : r.kept) Out() << "  kept float32: " << Printable(k) << "\n";
      for (const std::string& l : r.lost_precision)
        Out() << "  lost precision: " << Printable(l) << "\n";
    }
  }
  if (co.dry_run) {
    tree.indexes.clear();  // nothing is copied or rewritten; the summary counts the copies
  }
  for (const PathPair& j : tree.copies) {
    if (co.dry_run) break;
    try {
      CopyFile(j, o.dtype);
    } catch (const Error& e) {
      PrintError(archives.Shown(e.what()));
      rc = 1;
    }
  }
  for (const PathPair& j : tree.indexes) {
    try {
      uint64_t t = RewriteIndex(j, storage_bytes);
      if (!o.json && !o.quiet)
        Out() << fmt::format("{} -> {}: total_size {}\n", archives.Shown(j.input), j.output, t);
    } catch (const Error& e) {
      PrintError(archives.Shown(e.what()));
      rc = 1;
    }
  }
  if (o.json) {
    doc["before"] = before;
    doc["after"] = after;
    doc["copied_files"] = tree.copies.size();
    PrintJson(doc);
  } else if (rc != 0) {
    if (tree.checkpoints.size() > 1)
      Err() << fmt::format("ckptool convert: {} of {} failed\n", Count(failed, "checkpoint"),
                           tree.checkpoints.size());
  } else if (!o.quiet) {
    Out() << fmt::format(
        "{} {} {}: {} -> {}{}{}\n", co.dry_run ? "Dry run:" : "Done.",
        Count(tree.checkpoints.size(), "file"), co.dry_run ? "would be converted" : "converted",
        HumanBytes(before), HumanBytes(after),
        tree.copies.empty()
            ? ""
            : fmt::format(" ({} {} unchanged)", Count(tree.copies.size(), "other file"),
                          co.dry_run ? "would be copied" : "copied"),
        co.dry_run ? " (nothing written)" : "");
  }
  return rc;
}

}  // namespace

Runner AddConvert(CLI::App& app) {
  auto o = std::make_shared<ConvertCliOptions>();
  app.add_option("paths", o->paths, "Checkpoint files or model folders");
  app.add_option("--dtype", o->dtype, "Target type for float32 tensors")
      ->required()
      ->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--output-dir", o->output_dir,
                 "Where outputs go (default for a folder: <folder>/bf16 or <folder>/fp16)");
  app.add_option("-o,--output", o->output_file, "Output file, for a single input file");
  app.add_option("--keep", o->co.keep,
                 "Tensor-name globs that stay float32 (e.g. '*norm*' '*.bias')");
  app.add_option("--only", o->co.only,
                 "Convert only tensors whose name matches one of these globs");
  app.add_flag("--keep-1d", o->co.keep_1d, "Keep 1-D tensors (norms, biases) in float32");
  app.add_flag("--include-optimizer", o->co.include_optimizer,
               "Convert training state too (optimizer moments, schedulers; never counters "
               "that would change, never DeepSpeed's fp32 master weights)");
  app.add_flag("-f,--force", o->force, "Write over existing outputs");
  app.add_flag("--dry-run", o->co.dry_run,
               "Measure and report what would be written; write nothing");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors and warnings");
  app.add_flag("--lossy", o->co.lossy,
               "Also convert tensors whose values would change beyond rounding (overflow to "
               "infinity, flush to zero, whole numbers that change); the report lists them");
  AddRewriteFlags(app, &o->threads, &o->json, &o->co.allow_unsafe_globals, &o->co.trust.patterns);
  return [o] { return RunConvert(*o); };
}

}  // namespace ckpt::cli
