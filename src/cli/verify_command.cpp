#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "checkpoint/discovery.h"
#include "checkpoint/verify.h"
#include "cli/commands.h"
#include "cluster/world.h"
#include "io/parallel.h"
#include "jobs/batch.h"
#include "jobs/result_json.h"
#include "jobs/verify.h"

namespace ckpt::cli {

namespace {

struct VerifyCliOptions {
  std::vector<std::string> paths;
  unsigned threads = DefaultThreads();
  bool quiet = false;
  bool json = false;
  bool structure = false;
  std::vector<std::string> trust;
};

int RunVerify(const VerifyCliOptions& o) {
  // Archives, files, ZeRO folders, DCP folders: the order the report lists them in.
  std::vector<Located> items = jobs::VerifyTargets(o.paths);
  if (items.empty()) {
    PrintError("no checkpoint files found in the given paths");
    return 1;
  }
  std::vector<std::string> keys;
  std::vector<uint64_t> bytes;
  for (const Located& it : items) {
    keys.push_back(it.path);
    bytes.push_back(jobs::TreeBytes(it.path));
  }
  // Each rank verifies its share one checkpoint at a time, each with every thread.
  jobs::Spread spread(keys, bytes);
  std::vector<jobs::CheckpointVerdict> found(items.size());
  std::vector<std::string> errors(items.size());
  size_t bad = 0, problems = 0;
  nlohmann::ordered_json doc = {{"checkpoints", nlohmann::ordered_json::array()}};
  // Rank 0 reports each checkpoint, in input order: a single process as soon as it is
  // verified, an MPI job once every rank's results are in. False: the run stops there.
  auto report = [&](size_t i) {
    const jobs::CheckpointVerdict& f = found[i];
    if (f.internal) {
      PrintError(f.failed);
      return false;
    }
    if (o.json) {
      nlohmann::ordered_json row = {{"path", items[i].path},
                                    {"ok", f.failed.empty() && f.outcome.problems.empty()}};
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      if (!f.failed.empty()) list.push_back({{"where", ""}, {"what", f.failed}, {"unsafe", false}});
      for (const auto& p : f.outcome.problems)
        list.push_back({{"where", p.where}, {"what", p.what}, {"unsafe", p.unsafe}});
      row["problems"] = list;
      row["notes"] = f.outcome.notes;
      doc["checkpoints"].push_back(std::move(row));
      problems += list.size();
      if (!list.empty()) ++bad;
      return true;
    }
    if (!f.failed.empty()) {
      Out() << Printable(f.failed) << "\n";
      ++bad;
      ++problems;
      return true;
    }
    const VerifyOutcome& r = f.outcome;
    for (const auto& p : r.problems) {
      Out() << Printable(fmt::format("{}: {}: {}", items[i].path, p.where, p.what)) << "\n";
    }
    problems += r.problems.size();
    if (!r.problems.empty()) {
      ++bad;
    } else if (!o.quiet) {
      Out() << Printable(r.ok) << "\n";
    }
    if (!o.quiet) {
      for (const std::string& n : r.notes) Out() << "  note: " << Printable(n) << "\n";
    }
    return true;
  };
  const bool live = !cluster::Distributed();
  const jobs::VerifyOptions vo{o.threads, o.structure, torch::Trust{o.trust}};
  for (size_t i : spread.mine()) {
    found[i] = jobs::VerifyCheckpoint(items[i], vo);
    if (live && !report(i)) return 1;
    if (found[i].internal) break;
  }
  spread.Gather(errors, found);
  if (!spread.reports()) return 0;  // rank 0 reports for every rank
  for (size_t i = 0; i < found.size() && !live; ++i) {
    if (!report(i)) return 1;
  }
  // Checks of a whole checkpoint beyond its files: counted, and reported as one row of the
  // JSON report (under `json_path`) or as problem lines under `path`.
  auto report_whole = [&](const std::string& path, const std::string& json_path,
                          const std::vector<torch::Problem>& found_here) {
    problems += found_here.size();
    if (!found_here.empty()) ++bad;
    if (o.json) {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const auto& q : found_here)
        list.push_back({{"where", q.where}, {"what", q.what}, {"unsafe", false}});
      doc["checkpoints"].push_back({{"path", json_path},
                                    {"ok", found_here.empty()},
                                    {"problems", list},
                                    {"notes", nlohmann::ordered_json::array()}});
      return;
    }
    for (const auto& q : found_here)
      Out() << Printable(fmt::format("{}: {}: {}", path, q.where, q.what)) << "\n";
  };
  // What each folder given promises beyond its files, and each checkpoint with a manifest.
  size_t checked = items.size();
  for (const jobs::FolderVerdict& v : jobs::VerifyFolders(o.paths, vo)) {
    if (v.manifest) ++checked;
    if (!v.problems.empty() || v.manifest) report_whole(v.path, v.json_path, v.problems);
    if (v.manifest && v.problems.empty() && !o.json && !o.quiet) {
      Out() << Printable(o.structure ? fmt::format("{}: OK (matches {}: names and sizes)", v.path,
                                                   v.json_path)
                                     : fmt::format("{}: OK (matches {}: {} SHA-256-checked)",
                                                   v.path, v.json_path, HumanBytes(v.hashed)))
            << "\n";
    }
  }
  if (o.json) {
    doc["problems"] = problems;
    PrintJson(doc);
  }
  Out().flush();
  if (bad) {
    Err() << fmt::format("ckptool verify: {} in {} of {}\n", Count(problems, "problem"), bad,
                         Count(checked, "checkpoint"));
    return 1;
  }
  return 0;
}

}  // namespace

Runner AddVerify(CLI::App& app) {
  auto o = std::make_shared<VerifyCliOptions>();
  app.add_option("paths", o->paths, "Checkpoint files or folders")->required();
  app.add_option("-j,--threads", o->threads, "Threads for CRC checking")->capture_default_str();
  app.add_flag("-q,--quiet", o->quiet, "Print only problems");
  app.add_flag("--json", o->json,
               "Print one JSON document: each checkpoint, its problems and notes");
  app.add_flag("--structure", o->structure,
               "Check structure only: sizes, headers, directories, ZeRO ranks and partitions, DCP "
               "chunks, index shards, a manifest's names and sizes; no data byte is read (no CRC, "
               "no SHA-256), so a flipped bit goes unseen");
  AddTrustFlag(app, &o->trust);
  return [o] { return RunVerify(*o); };
}

}  // namespace ckpt::cli
