// Subcommands of the ckptool CLI. Each registers its options on the CLI11 app and returns
// the function that runs it (an exit code: 0 success, 1 failure or problems found).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace ckpt::cli {

using Runner = std::function<int()>;

Runner AddInspect(CLI::App& app);
Runner AddVerify(CLI::App& app);
Runner AddShrink(CLI::App& app);

// Prints "ckptool: error: <message>" to stderr.
void PrintError(const std::string& message);

}  // namespace ckpt::cli
