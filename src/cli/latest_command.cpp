// `ckptool latest ROOT`: policy/latest.h.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/utf8.h"
#include "cli/commands.h"
#include "io/parallel.h"
#include "policy/latest.h"

namespace ckpt::cli {

namespace {

struct LatestCliOptions {
  std::string root;
  unsigned threads = DefaultThreads();
  bool json = false;
  bool quiet = false;
  bool structure = false;
};

int RunLatest(const LatestCliOptions& o) {
  policy::LatestResult r = policy::FindLatest(o.root, o.threads, !o.structure);
  if (o.json) {
    nlohmann::ordered_json j = {
        {"root", o.root},
        {"latest", r.path.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(r.path)},
        {"step", r.path.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(r.step)},
        {"checkpoints", r.candidates},
        {"skipped", nlohmann::ordered_json::array()}};
    for (const policy::Skipped& s : r.skipped)
      j["skipped"].push_back({{"name", s.name}, {"step", s.step}, {"reason", s.reason}});
    PrintJson(j);
  } else {
    if (!o.quiet) {
      for (const policy::Skipped& s : r.skipped)
        Err() << Printable(fmt::format("ckptool: skipped {}: {}", s.name, s.reason)) << "\n";
    }
    if (!r.path.empty()) Out() << Printable(r.path) << "\n";
  }
  if (r.path.empty()) {
    if (!o.json) {
      PrintError(
          r.candidates
              ? fmt::format("{}: none of its {} checkpoints is complete and intact", o.root,
                            r.candidates)
              : fmt::format("{}: no checkpoints (global_stepN, checkpoint-N, step=N...)", o.root));
    }
    return 1;
  }
  return 0;
}

}  // namespace

Runner AddLatest(CLI::App& app) {
  auto o = std::make_shared<LatestCliOptions>();
  app.add_option("root", o->root, "Folder holding the checkpoints")->required();
  app.add_option("-j,--threads", o->threads, "Threads for verifying")->capture_default_str();
  app.add_flag("--json", o->json,
               "Print {latest, step, checkpoints, skipped: [{name, step, reason}]}");
  app.add_flag("-q,--quiet", o->quiet, "Do not say what was skipped");
  app.add_flag("--structure", o->structure,
               "Check structure only (sizes, headers, ranks, chunks, shards, a manifest's names "
               "and sizes): no data byte is read, so a flipped bit goes unseen");
  app.footer(
      "Prints the path of the newest checkpoint under ROOT (by the step in its name) that is "
      "complete (its framework's marker written, no file open for writing) and verifies "
      "(nothing damaged: CRCs, sizes, shards, ranks, chunks), saying on stderr why each newer "
      "one was skipped. Exit 1 when there is none.");
  return [o] { return RunLatest(*o); };
}

}  // namespace ckpt::cli
