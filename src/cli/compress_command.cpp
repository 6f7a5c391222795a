#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "compress/archive.h"
#include "io/parallel.h"
#include "jobs/batch.h"
#include "jobs/compress.h"

namespace ckpt::cli {

namespace {

struct CompressCliOptions {
  std::vector<std::string> paths;
  std::string output;
  bool to_stdout = false;
  bool force = false;
  bool remove_input = false;
  bool dry_run = false;
  bool allow_damaged = false;
  unsigned threads = DefaultThreads();
  std::string level = "fast";
  bool json = false;
  bool quiet = false;
};

// Results go to stdout, or to stderr when stdout carries the data (-c).
void Say(bool to_stderr, const std::string& line) {
  if (to_stderr) {
    Err() << Printable(line) << "\n";
  } else {
    Out() << Printable(line) << "\n";
  }
}

// The JSON report goes to stdout, or to stderr when stdout carries the data (-c).
void PrintDoc(const nlohmann::ordered_json& doc, bool to_stdout) {
  if (to_stdout) {
    Err() << doc.dump(1) << "\n";
  } else {
    PrintJson(doc);
  }
}

// What the command line refuses before a job runs: -c in-process (the Python package), where
// the bytes would go to the program's own stdout.
bool StdoutRefused(bool to_stdout) {
  if (to_stdout && Capturing()) {
    PrintError("-c (stdout=True) writes to the process's standard output: give an output path");
    return true;
  }
  return false;
}

int RunCompress(const CompressCliOptions& o) {
  jobs::CompressJobOptions jo;
  CompressOptions& co = jo.engine;
  co.level = o.level == "max" ? ckz::Level::kMax : ckz::Level::kFast;
  co.threads = o.threads;
  co.output = o.output;
  co.to_stdout = o.to_stdout;
  co.force = o.force;
  co.remove_input = o.remove_input;
  co.dry_run = o.dry_run;
  co.allow_damaged = o.allow_damaged;
  jo.paths = o.paths;
  jo.progress = ProgressFor(!o.json && !o.quiet);
  jobs::CheckPaths(o.paths, o.output, o.to_stdout, o.remove_input);
  if (StdoutRefused(o.to_stdout)) return 2;
  if (o.to_stdout && !o.dry_run && ::isatty(STDOUT_FILENO)) {
    PrintError("stdout is a terminal: not writing an archive to it (redirect it, or drop -c)");
    return 1;
  }
  const bool progress_on = static_cast<bool>(jo.progress);
  auto done = [&](const jobs::PathOutcome<CompressResult>& p) {
    if (!p.error.empty()) {
      PrintError(jobs::NamingFile(p.input, p.error));
      return;
    }
    const CompressResult& r = p.result;
    for (const std::string& w : r.warnings) PrintWarning(w);
    if (o.json || o.quiet) return;
    if (progress_on) ClearProgressLine();
    Say(o.to_stdout,
        fmt::format("{}: {} -> {} ({:.3f}x, {}){}{}{}", r.input, HumanBytes(r.before),
                    HumanBytes(r.after),
                    r.after ? static_cast<double>(r.before) / static_cast<double>(r.after) : 0.0,
                    Percent(r.after, r.before), o.to_stdout ? "" : " " + r.output,
                    r.removed ? " (original removed)" : "",
                    o.dry_run ? " (dry run: nothing written)" : ""));
  };
  jobs::CompressReport report = jobs::Compress(jo, done);
  if (!report.reports) return 0;  // rank 0 reports for every rank
  if (o.json) PrintDoc(jobs::ToJson(report), o.to_stdout);
  return report.ok() ? 0 : 1;
}

struct DecompressCliOptions {
  std::vector<std::string> paths;
  std::string output;
  bool to_stdout = false;
  bool force = false;
  bool remove_input = false;
  bool dry_run = false;
  unsigned threads = DefaultThreads();
  bool json = false;
  bool quiet = false;
};

int RunDecompress(const DecompressCliOptions& o) {
  jobs::DecompressJobOptions jo;
  DecompressOptions& d = jo.engine;
  d.threads = o.threads;
  d.output = o.output;
  d.to_stdout = o.to_stdout;
  d.force = o.force;
  d.remove_input = o.remove_input;
  d.dry_run = o.dry_run;
  jo.paths = o.paths;
  jo.progress = ProgressFor(!o.json && !o.quiet);
  jobs::CheckPaths(o.paths, o.output, o.to_stdout, o.remove_input);
  if (StdoutRefused(o.to_stdout)) return 2;
  const bool progress_on = static_cast<bool>(jo.progress);
  auto done = [&](const jobs::PathOutcome<DecompressResult>& p) {
    if (!p.error.empty()) {
      PrintError(jobs::NamingFile(p.input, p.error));
      return;
    }
    if (o.json || o.quiet) return;
    const DecompressResult& r = p.result;
    if (progress_on) ClearProgressLine();
    Say(o.to_stdout,
        fmt::format("{}: {} -> {}, {}{}{}{}", r.input, HumanBytes(r.archive_bytes),
                    HumanBytes(r.restored_bytes), Count(r.files, "file"),
                    o.to_stdout ? "" : " " + r.output, r.removed ? " (archive removed)" : "",
                    o.dry_run ? " (dry run: every chunk checked, nothing written)" : ""));
  };
  jobs::DecompressReport report = jobs::Decompress(jo, done);
  if (!report.reports) return 0;  // rank 0 reports for every rank
  if (o.json) PrintDoc(jobs::ToJson(report), o.to_stdout);
  return report.ok() ? 0 : 1;
}

void AddOutputFlags(CLI::App& app, std::string* output, bool* to_stdout, bool* force,
                    bool* remove_input, bool* dry_run, unsigned* threads, bool* json, bool* quiet) {
  app.add_option("-o,--output", *output, "Output path (one input only)");
  app.add_flag("-c,--stdout", *to_stdout, "Write to stdout (one input only)");
  app.add_flag("-f,--force", *force, "Replace an existing output");
  app.add_flag("--rm", *remove_input,
               "Remove the input once the output is written, fsynced and verified");
  app.add_flag("--dry-run", *dry_run,
               "Do all the work (code or check every chunk) and report sizes; write nothing");
  app.add_option("-j,--threads", *threads, "Threads")->capture_default_str();
  app.add_flag("--json", *json, "Print a JSON report");
  app.add_flag("-q,--quiet", *quiet, "Print only errors");
}

}  // namespace

Runner AddCompress(CLI::App& app) {
  auto o = std::make_shared<CompressCliOptions>();
  app.add_option("paths", o->paths, "Files or folders; each becomes PATH.ckz")->required();
  AddOutputFlags(app, &o->output, &o->to_stdout, &o->force, &o->remove_input, &o->dry_run,
                 &o->threads, &o->json, &o->quiet);
  app.add_option("--level", o->level,
                 "fast: Huffman-coded planes (GB/s); max: also LZ on every plane and plain "
                 "zstd -19 on every chunk, the smallest kept (slow)")
      ->check(CLI::IsMember({"fast", "max"}))
      ->capture_default_str();
  app.add_flag("--allow-damaged", o->allow_damaged,
               "Archive a checkpoint that fails verify, its damage kept as it is (otherwise "
               "refused)");
  return [o] { return RunCompress(*o); };
}

Runner AddDecompress(CLI::App& app) {
  auto o = std::make_shared<DecompressCliOptions>();
  app.add_option("archives", o->paths, ".ckz archives; X.ckz becomes X")->required();
  AddOutputFlags(app, &o->output, &o->to_stdout, &o->force, &o->remove_input, &o->dry_run,
                 &o->threads, &o->json, &o->quiet);
  return [o] { return RunDecompress(*o); };
}

}  // namespace ckpt::cli
