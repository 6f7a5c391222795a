// Every command of ckptool, once: its name, its one-line help, the function that registers its
// options, and how it runs in a job of several processes. The help text, did-you-mean, the MPI
// rules (cli/run.cpp, cli/main.cpp) and the Python package's jobs (ckptool._core.commands())
// are all read from this table.
#pragma once

#include <span>
#include <string_view>

#include "cli/commands.h"

namespace ckpt::cli {

struct CommandInfo {
  const char* name;
  const char* help;
  Runner (*add)(CLI::App&);
  // Shares its work between the ranks of an MPI job itself; every other command runs on rank
  // 0 alone while the others wait for its exit code (prune decides what to delete, apply and
  // watch act on one folder's state, inspect prints one report).
  bool spreads_over_ranks;
  // Writes nothing: may run in every process of a launch (WORLD_SIZE without MPI).
  bool writes_nothing;
};

std::span<const CommandInfo> Commands();

// nullptr when no command has this name.
const CommandInfo* FindCommand(std::string_view name);

}  // namespace ckpt::cli
