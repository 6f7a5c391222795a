// Subcommands of the ckptool CLI. Each registers its options on the CLI11 app and returns
// the function that runs it (an exit code: 0 success, 1 failure or problems found).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cli/console.h"

namespace ckpt::cli {

using Runner = std::function<int()>;

Runner AddInspect(CLI::App& app);
Runner AddVerify(CLI::App& app);
Runner AddShrink(CLI::App& app);
Runner AddConvert(CLI::App& app);
Runner AddExport(CLI::App& app);
Runner AddStrip(CLI::App& app);
Runner AddPrune(CLI::App& app);
Runner AddCompress(CLI::App& app);
Runner AddDecompress(CLI::App& app);
Runner AddApply(CLI::App& app);
Runner AddWatch(CLI::App& app);
Runner AddLatest(CLI::App& app);
Runner AddManifest(CLI::App& app);
Runner AddReshard(CLI::App& app);

// Multi-value options (--keep A B, --patterns A B) swallow the positionals after them;
// values that name an existing file or folder are moved back to `paths`.
void ReclaimPaths(std::vector<std::string>& globs, std::vector<std::string>& paths);

// Flags every rewriting command shares: -j, --json, --allow-unsafe-globals, --trust.
void AddRewriteFlags(CLI::App& app, unsigned* threads, bool* json, bool* allow_unsafe_globals,
                     std::vector<std::string>* trust);

// --trust MODULE_GLOB...: calls into these modules are accepted (verify, inspect, rewriters).
void AddTrustFlag(CLI::App& app, std::vector<std::string>* trust);

// Bytes in MiB (2^20), as the reference tool prints them.
inline double MiB(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// Prints a report to stdout; text from the file that is not valid UTF-8 shows as U+FFFD.
void PrintJson(const nlohmann::ordered_json& doc);

// Prints "ckptool: error: <message>" to stderr.
void PrintError(const std::string& message);
// Prints "ckptool: warning: <message>" to stderr.
void PrintWarning(const std::string& message);

// For one file of a job: prints `error` when it is set; true when the file failed. (The job's
// ToJson lists the failures in --json's report.)
bool ReportFailure(const std::string& error);

}  // namespace ckpt::cli
