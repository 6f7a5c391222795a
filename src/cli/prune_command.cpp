#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "engines/prune.h"
#include "io/parallel.h"

namespace ckpt::cli {

namespace {

struct PruneCliOptions {
  std::string root;
  PruneOptions p;
  bool json = false;
  bool quiet = false;
  bool dry_run = false;  // the default; said explicitly
};

int RunPrune(PruneCliOptions o) {
  PruneResult r = Prune(o.root, o.p);
  // A damaged checkpoint is kept and not counted; said on stderr whatever the output form.
  for (const PruneEntry& e : r.entries) {
    if (e.damaged)
      PrintWarning(
          fmt::format("{}: {}", (std::filesystem::path(o.root) / e.name).string(), e.reason));
  }
  if (o.json) {
    nlohmann::ordered_json j = {{"root", o.root},
                                {"dry_run", !o.p.yes},
                                {"bytes_freed", r.bytes_freed},
                                {"entries", nlohmann::ordered_json::array()},
                                {"notes", r.notes}};
    for (const PruneEntry& e : r.entries) {
      j["entries"].push_back({{"name", e.name},
                              {"step", e.step},
                              {"bytes", e.bytes},
                              {"keep", e.keep},
                              {"complete", e.complete},
                              {"damaged", e.damaged},
                              {"reason", e.reason},
                              {"archive", e.archive},
                              {"also", e.also},
                              {"stripped", e.stripped}});
    }
    PrintJson(j);
    return 0;
  }
  if (o.quiet) return 0;
  for (const std::string& n : r.notes) Out() << "note: " << Printable(n) << "\n";
  Out() << fmt::format("{:>10}  {:<40} {:>12}  {}\n", "step", "checkpoint", "size", "decision");
  for (const PruneEntry& e : r.entries) {
    std::string name = e.name;
    for (const std::string& a : e.also) name += " + " + a;
    Out() << fmt::format("{:>10}  {:<40} {:>12}  {}: {}\n", e.step, Printable(name),
                         HumanBytes(e.bytes), e.keep ? "keep" : (o.p.yes ? "deleted" : "delete"),
                         e.reason);
  }
  Out() << fmt::format("{} {}{}\n", o.p.yes ? "Freed" : "Would free", HumanBytes(r.bytes_freed),
                       o.p.yes ? "" : " (dry run: add --yes to delete)");
  return 0;
}

}  // namespace

Runner AddPrune(CLI::App& app) {
  auto o = std::make_shared<PruneCliOptions>();
  app.add_option("root", o->root, "Folder holding the checkpoints")->required();
  app.add_option("--keep-last", o->p.keep_last, "Keep the newest N checkpoints (N >= 1)")
      ->required();
  app.add_option("--keep-every", o->p.keep_every,
                 "Also keep every checkpoint whose step is a multiple of K");
  app.add_option("--keep", o->p.keep, "Names (globs) always kept");
  app.add_option("--strip-older", o->p.strip_older,
                 "Keep the newest M whole; strip optimizer state from older kept checkpoints");
  CLI::Option* yes = app.add_flag("--yes", o->p.yes, "Really delete (without it: a dry run)");
  app.add_flag("--dry-run", o->dry_run, "Only say what would be deleted (the default)")
      ->excludes(yes);
  app.add_flag("--json", o->json, "Print a JSON report");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors");
  app.add_flag("--checksums", o->p.checksums,
               "Also read every byte of the checkpoints that would count among the newest N "
               "against its CRC32 (without it: their structure, which a cut or missing file "
               "fails)");
  app.add_option("-j,--threads", o->p.threads, "Threads for verifying and --strip-older")
      ->default_val(DefaultThreads());
  return [o] { return RunPrune(*o); };
}

}  // namespace ckpt::cli
