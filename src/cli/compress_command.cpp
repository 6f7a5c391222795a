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
#include "cluster/world.h"
#include "compress/archive.h"
#include "engines/compress.h"
#include "io/parallel.h"
#include "jobs/batch.h"
#include "jobs/result_json.h"

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

// What compress and decompress share: this rank's paths run one at a time (each with every
// thread) under one progress line; each failure is one error naming its path (in the JSON
// report too) and sets the exit code to 1. Rank 0 reports every path in input order: a single
// process as soon as each is done, an MPI job once every rank's results are in. Returns false
// on the other ranks, which have nothing to print.
template <typename R>
bool RunPaths(const std::vector<std::string>& paths, jobs::Spread& spread, const char* label,
              uint64_t total, bool progress_on, std::vector<R>& results, int& rc,
              nlohmann::ordered_json& doc, bool json,
              const std::function<R(size_t, std::atomic<uint64_t>*)>& work,
              const std::function<void(const R&)>& report_done) {
  std::vector<std::string> errors(paths.size());
  const bool live = !cluster::Distributed();
  auto report = [&](size_t i) {
    if (!errors[i].empty()) {
      rc = 1;
      PrintError(jobs::NamingFile(paths[i], errors[i]));
      if (json) doc["files"].push_back({{"input", paths[i]}, {"error", errors[i]}});
      return;
    }
    report_done(results[i]);
  };
  {
    Progress progress(label, total, progress_on);
    for (size_t i : spread.mine()) {
      try {
        results[i] = work(i, &progress.bytes_done());
        progress.FileDone();
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
      if (live) report(i);
    }
  }
  spread.Gather(errors, results);
  if (!spread.reports()) return false;
  for (size_t i = 0; i < paths.size() && !live; ++i) report(i);
  return true;
}

// The JSON report goes to stdout, or to stderr when stdout carries the data (-c).
void PrintDoc(const nlohmann::ordered_json& doc, bool to_stdout) {
  if (to_stdout) {
    Err() << doc.dump(1) << "\n";
  } else {
    PrintJson(doc);
  }
}

int CheckCommon(const std::vector<std::string>& paths, const std::string& output, bool to_stdout,
                bool remove_input) {
  if (!output.empty() && paths.size() > 1) {
    PrintError("-o names one output: give one input with it");
    return 2;
  }
  if (to_stdout && paths.size() > 1) {
    PrintError("-c streams one input: give one input with it");
    return 2;
  }
  if (to_stdout && !output.empty()) {
    PrintError("-c and -o cannot be used together");
    return 2;
  }
  if (to_stdout && remove_input) {
    PrintError("--rm cannot be used with -c");
    return 2;
  }
  if (to_stdout && Capturing()) {
    // In-process (the Python package) the bytes would go to the program's own stdout.
    PrintError("-c (stdout=True) writes to the process's standard output: give an output path");
    return 2;
  }
  return 0;
}

int RunCompress(const CompressCliOptions& o) {
  if (int rc = CheckCommon(o.paths, o.output, o.to_stdout, o.remove_input)) return rc;
  if (o.to_stdout && !o.dry_run && ::isatty(STDOUT_FILENO)) {
    PrintError("stdout is a terminal: not writing an archive to it (redirect it, or drop -c)");
    return 1;
  }
  CompressOptions co;
  co.level = o.level == "max" ? ckz::Level::kMax : ckz::Level::kFast;
  co.threads = std::max(1u, o.threads);
  co.output = o.output;
  co.to_stdout = o.to_stdout;
  co.force = o.force;
  co.remove_input = o.remove_input;
  co.dry_run = o.dry_run;
  co.allow_damaged = o.allow_damaged;
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const std::string& p : o.paths) {
    sizes.push_back(jobs::TreeBytes(p));
    total += sizes.back();
  }
  // In an MPI job each rank compresses its share of the paths, one at a time with every
  // thread; rank 0 reports.
  jobs::Spread spread(o.paths, sizes);
  std::vector<CompressResult> results(o.paths.size());
  int rc = 0;
  nlohmann::ordered_json doc = {{"files", nlohmann::ordered_json::array()}};
  uint64_t before = 0, after = 0;
  bool progress_on = ProgressWanted(!o.json && !o.quiet) && !cluster::Distributed();
  auto report = [&](const CompressResult& r) {
    before += r.before;
    after += r.after;
    for (const std::string& w : r.warnings) PrintWarning(w);
    if (o.json) {
      doc["files"].push_back(nlohmann::ordered_json(r));
    } else if (!o.quiet) {
      if (progress_on) ClearProgressLine();
      Say(o.to_stdout,
          fmt::format("{}: {} -> {} ({:.3f}x, {}){}{}{}", r.input, HumanBytes(r.before),
                      HumanBytes(r.after),
                      r.after ? static_cast<double>(r.before) / static_cast<double>(r.after) : 0.0,
                      Percent(r.after, r.before), o.to_stdout ? "" : " " + r.output,
                      r.removed ? " (original removed)" : "",
                      o.dry_run ? " (dry run: nothing written)" : ""));
    }
  };
  auto work = [&](size_t i, std::atomic<uint64_t>* bytes_done) {
    co.bytes_done = bytes_done;
    return CompressPath(o.paths[i], co);
  };
  if (!RunPaths<CompressResult>(o.paths, spread, "compress", total, progress_on, results, rc, doc,
                                o.json, work, report))
    return 0;  // rank 0 reports for every rank
  if (o.json) {
    doc["before"] = before;
    doc["after"] = after;
    PrintDoc(doc, o.to_stdout);
  }
  return rc;
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
  if (int rc = CheckCommon(o.paths, o.output, o.to_stdout, o.remove_input)) return rc;
  DecompressOptions d;
  d.threads = std::max(1u, o.threads);
  d.output = o.output;
  d.to_stdout = o.to_stdout;
  d.force = o.force;
  d.remove_input = o.remove_input;
  d.dry_run = o.dry_run;
  std::vector<uint64_t> sizes;
  for (const std::string& p : o.paths) sizes.push_back(jobs::TreeBytes(p));
  jobs::Spread spread(o.paths, sizes);
  uint64_t total = 0;
  bool progress_on = ProgressWanted(!o.json && !o.quiet) && !cluster::Distributed();
  for (size_t i : spread.mine()) {
    if (!progress_on) break;
    try {
      ckz::Archive a = ckz::Archive::Open(o.paths[i]);
      for (const ckz::Entry& e : a.index().entries) total += e.size;
    } catch (const Error&) {
      // Reported when the archive's turn comes.
    }
  }
  std::vector<DecompressResult> results(o.paths.size());
  int rc = 0;
  nlohmann::ordered_json doc = {{"files", nlohmann::ordered_json::array()}};
  auto report = [&](const DecompressResult& r) {
    if (o.json) {
      doc["files"].push_back(nlohmann::ordered_json(r));
    } else if (!o.quiet) {
      if (progress_on) ClearProgressLine();
      Say(o.to_stdout,
          fmt::format("{}: {} -> {}, {}{}{}{}", r.input, HumanBytes(r.archive_bytes),
                      HumanBytes(r.restored_bytes), Count(r.files, "file"),
                      o.to_stdout ? "" : " " + r.output, r.removed ? " (archive removed)" : "",
                      o.dry_run ? " (dry run: every chunk checked, nothing written)" : ""));
    }
  };
  auto work = [&](size_t i, std::atomic<uint64_t>* bytes_done) {
    d.bytes_done = bytes_done;
    return DecompressArchive(o.paths[i], d);
  };
  if (!RunPaths<DecompressResult>(o.paths, spread, "decompress", total, progress_on, results, rc,
                                  doc, o.json, work, report))
    return 0;  // rank 0 reports for every rank
  if (o.json) PrintDoc(doc, o.to_stdout);
  return rc;
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
