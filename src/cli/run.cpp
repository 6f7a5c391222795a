// The command line: the shared conventions and RunCommandLine (cli/run.h).
#include <malloc.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "base/error.h"
#include "base/interrupt.h"
#include "base/names.h"
#include "base/perf.h"
#include "base/utf8.h"
#include "checkpoint/manifest.h"
#include "cli/command_table.h"
#include "cli/commands.h"
#include "cli/run.h"
#include "cluster/steps.h"
#include "cluster/world.h"
#include "io/temp_files.h"

namespace ckpt::cli {

void ReclaimPaths(std::vector<std::string>& globs, std::vector<std::string>& paths) {
  std::vector<std::string> kept;
  for (std::string& g : globs) {
    std::error_code ec;
    if (std::filesystem::exists(g, ec)) {
      paths.push_back(std::move(g));
    } else {
      kept.push_back(std::move(g));
    }
  }
  globs = std::move(kept);
}

void AddRewriteFlags(CLI::App& app, unsigned* threads, bool* json, bool* allow_unsafe_globals,
                     std::vector<std::string>* trust) {
  app.add_option("-j,--threads", *threads, "Threads")->capture_default_str();
  app.add_flag("--json", *json, "Print a JSON report");
  app.add_flag("--allow-unsafe-globals", *allow_unsafe_globals,
               "Rewrite files whose pickle imports code-execution globals (they are never run)");
  AddTrustFlag(app, trust);
}

void AddTrustFlag(CLI::App& app, std::vector<std::string>* trust) {
  app.add_option("--trust", *trust,
                 "Accept calls into these modules when loaded (globs: 'myproject', "
                 "'myproject.*', 'pkg.mod.Class'); never lifts the deny list")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void PrintJson(const nlohmann::ordered_json& doc) {
  Out() << doc.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

void PrintError(const std::string& message) {
  if (!cluster::ShouldPrintError(message)) return;  // another rank: rank 0 prints it
  SayError(message);
}

void PrintWarning(const std::string& message) {
  SayWarning(message);
}

bool ReportFailure(const std::string& error) {
  if (error.empty()) return false;
  PrintError(error);
  return true;
}

}  // namespace ckpt::cli

namespace ckpt::cli {

// Memory at 10^5 tensors. glibc raises its mmap threshold each time a large block is freed, after
// which the big temporary arrays of a run over 10^5 tensors (the pickle writer's memo, a second
// model read back for verification) come from the heap, whose top is not given back: peak RSS grew
// by the largest of them. A fixed threshold keeps blocks of 1 MiB and more in mappings of their
// own, returned to the system when freed. Fast bins are off: a model of 10^5 tensors frees millions
// of small blocks, and every large request then ran malloc_consolidate over them (a third of
// inspect's time at 160k tensors; without them 1.8 s -> 1.2 s).
void TuneMalloc() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_MXFAST, 0);
#endif
}

// Sharded checkpoints are folders of many files, each kept open and mapped while it is read
// (a 1024-rank torch.distributed.checkpoint holds 1024+ .distcp files): the soft limit on
// open files, often 1024, goes up to the hard limit.
void RaiseOpenFileLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

namespace {

std::string VersionText() {
  std::string mpi = ckpt::cluster::MpiBuiltIn() ? ckpt::cluster::MpiLibrary() : "not built in";
  return std::string("ckptool " CKPT_VERSION "\nMPI: ") + mpi;
}

}  // namespace

// The command the arguments name: the first one that is not an option ("" when none).
std::string CommandOf(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (!a.starts_with("-")) return std::string(a);
  }
  return "";
}

// Commands that write nothing: they may run in every process of a launch (WORLD_SIZE).
bool WritesNothing(const std::string& command) {
  if (command.empty() || command == "help" || command == "version") return true;
  const CommandInfo* c = FindCommand(command);
  return c && c->writes_nothing;
}

namespace {

// "(did you mean --dry-run?)" for the options in a CLI11 error that `sub` does not know.
std::vector<std::string> OptionNames(const CLI::App& sub, const CLI::App& app) {
  std::vector<std::string> known;
  for (const CLI::App* a : {&sub, &app}) {
    for (const CLI::Option* o : a->get_options()) {
      for (const std::string& n : o->get_lnames()) known.push_back("--" + n);
      for (const std::string& n : o->get_snames()) known.push_back("-" + n);
    }
  }
  return known;
}

// Names an option the parser did not know, with the nearest known one, for words of its
// message that are options; a known option (a bad value, a missing one) gets no suggestion.
std::string SuggestOptions(const CLI::App& sub, const CLI::App& app, const std::string& error) {
  std::vector<std::string> known = OptionNames(sub, app);
  std::string out;
  std::istringstream words(error);
  for (std::string w; words >> w;) {
    while (!w.empty() && (w.back() == ',' || w.back() == '.' || w.back() == ':')) w.pop_back();
    if (!w.starts_with("-")) continue;
    w = w.substr(0, w.find('='));
    if (std::find(known.begin(), known.end(), w) != known.end()) continue;
    std::string best = ckpt::ClosestName(known, w);
    if (!best.empty() && best != w) out += fmt::format(" (did you mean {}?)", best);
  }
  return out;
}

// The first word of the command line that looks like an option and is none of the command's
// (a misspelt --dtpye): named before any other error, such as the option it misspells being
// required. "--" ends the options; "-" and negative numbers are values.
std::string UnknownOption(const CLI::App& sub, const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> known = OptionNames(sub, app);
  for (int i = 1; i < argc; ++i) {
    std::string w = argv[i];
    if (w == "--") break;
    if (w.size() < 2 || w[0] != '-') continue;
    if (w[1] == '.' || (w[1] >= '0' && w[1] <= '9')) continue;
    std::string name = w.starts_with("--") ? w.substr(0, w.find('=')) : w.substr(0, 2);
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string best = ckpt::ClosestName(known, name);
    return fmt::format("unknown option {}{}", name,
                       best.empty() ? "" : fmt::format(" (did you mean {}?)", best));
  }
  return "";
}

}  // namespace

int RunCommandLine(int argc, char** argv) {
  CLI::App app{
      "ckptool: inspect, verify and shrink ML checkpoints (torch .pt/.pth/.bin/.ckpt, "
      "safetensors) without executing them"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] { return VersionText(); });
  bool perf = false;
  app.add_flag("--perf", perf, "Print a timing tree of the phases to stderr (rank 0's under MPI)");
  struct Command {
    CLI::App* app;
    ckpt::cli::Runner run;
  };
  std::vector<Command> commands;
  for (const CommandInfo& info : Commands()) {
    CLI::App* sub = app.add_subcommand(info.name, info.help);
    commands.push_back({sub, info.add(*sub)});
  }
  app.footer(
      "ckptool help COMMAND: a command's options. ckptool version: the version.\n"
      "Exit codes: 0 success, 1 a problem found or a job failed, 2 a usage error, 130 "
      "interrupted.");

  const bool root = ckpt::cluster::IsRoot();
  std::vector<std::string> names;
  for (const Command& c : commands) names.push_back(c.app->get_name());
  const std::string command = CommandOf(argc, argv);
  if (command == "version") {
    if (root) Out() << VersionText() << "\n";
    return 0;
  }
  if (command == "help") {
    std::string topic;
    for (int i = 1, seen = 0; i < argc; ++i) {
      if (argv[i][0] != '-' && seen++ == 1) topic = argv[i];
    }
    CLI::App* sub = nullptr;
    for (const Command& c : commands) {
      if (c.app->get_name() == topic) sub = c.app;
    }
    if (!topic.empty() && !sub) {
      std::string best = ckpt::ClosestName(names, topic);
      ckpt::cli::PrintError(
          fmt::format("no command '{}'{}; `ckptool help` lists them", topic,
                      best.empty() ? "" : fmt::format(" (did you mean {}?)", best)));
      return 2;
    }
    if (root) Out() << (sub ? sub->help() : app.help());
    return 0;
  }
  if (!command.empty() && std::find(names.begin(), names.end(), command) == names.end()) {
    std::string best = ckpt::ClosestName(names, command);
    ckpt::cli::PrintError(
        fmt::format("unknown command '{}'{}; `ckptool help` lists the commands", command,
                    best.empty() ? "" : fmt::format(" (did you mean {}?)", best)));
    return 2;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help, the version and command-line errors: once, from rank 0.
    if (e.get_exit_code() == 0) {
      std::ostringstream quiet;
      return root ? app.exit(e) : app.exit(e, quiet, quiet);
    }
    const CLI::App* sub = &app;
    for (const Command& c : commands) {
      if (c.app->get_name() == command) sub = c.app;
    }
    if (command.empty()) {
      ckpt::cli::PrintError("no command given; `ckptool help` lists the commands");
    } else if (std::string unknown = UnknownOption(*sub, app, argc, argv); !unknown.empty()) {
      ckpt::cli::PrintError(
          fmt::format("{}; `ckptool help {}` lists its options", unknown, command));
    } else {
      ckpt::cli::PrintError(fmt::format("{}{}; `ckptool help {}` lists its options", e.what(),
                                        SuggestOptions(*sub, app, e.what()), command));
    }
    return 2;
  }
  if (perf && ckpt::cluster::IsRoot()) ckpt::EnablePerf();
  ckpt::InstallInterruptHandlers();
  ckpt::InstallManifestHooks();
  try {
    for (const Command& c : commands) {
      if (!c.app->parsed()) continue;
      if (!ckpt::cluster::IsRoot() && !FindCommand(c.app->get_name())->spreads_over_ranks) return 0;
      int rc;
      {
        ckpt::PerfTimer timer(c.app->get_name().c_str());
        rc = c.run();
      }
      Out().flush();
      ckpt::PrintPerf(stderr);
      return rc;
    }
  } catch (const ckpt::cluster::Stopped& s) {
    return s.rc;  // every rank stopped at the same step; rank 0 said why
  } catch (const ckpt::Interrupted&) {
    return 130;  // a job run in-process, stopped by its caller: every temp output is gone
  } catch (const ckpt::UsageError& e) {
    ckpt::cli::PrintError(e.what());
    return 2;
  } catch (const ckpt::Error& e) {
    ckpt::cli::PrintError(e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A folder walk or file operation the system refused: name the path and the reason.
    ckpt::cli::PrintError(fmt::format("{}: {}", e.path1().string(), e.code().message()));
    return 1;
  } catch (const std::exception& e) {
    ckpt::cli::PrintError(std::string("internal error: ") + e.what());
    return 1;
  }
  return 2;
}

}  // namespace ckpt::cli
