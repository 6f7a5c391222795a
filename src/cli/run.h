// The command line as a function: parses ckptool's arguments and runs the command, for the
// executable (cli/main.cpp) and the Python package (python/), which run the same commands.
#pragma once

#include <string>

namespace ckpt::cli {

// Parses the command line and runs the command; returns its exit code (0 success, 1 a
// problem found or a job failed, 2 a usage error). Errors are printed on rank 0 only
// (cluster/steps.h: the other ranks' go to rank 0).
int RunCommandLine(int argc, char** argv);

// The command the arguments name: the first one that is not an option ("" when none).
std::string CommandOf(int argc, char** argv);

// Commands that write nothing: they may run in every process of a launch (WORLD_SIZE).
bool WritesNothing(const std::string& command);

// Sharded checkpoints are folders of many files, each kept open and mapped while it is read:
// the soft limit on open files goes up to the hard limit.
void RaiseOpenFileLimit();

// Memory at 10^5 tensors: large blocks in mappings of their own, no fast bins (run.cpp).
void TuneMalloc();

}  // namespace ckpt::cli
