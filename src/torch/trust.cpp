#include "torch/trust.h"

#include <fnmatch.h>

#include "torch/global_lists.h"

namespace ckpt::torch {

namespace {

// Names that a module gets by importing from os, subprocess, shutil, builtins, pickle or
// importlib (`from os import system`): reached through a trusted module, they are still the
// functions of those modules.
constexpr std::string_view kBorrowedNames[] = {
    "system",       "popen",      "Popen",           "spawnl",        "spawnle",     "spawnlp",
    "spawnv",       "spawnve",    "spawnvp",         "execl",         "execle",      "execlp",
    "execv",        "execve",     "execvp",          "posix_spawn",   "fork",        "forkpty",
    "eval",         "exec",       "compile",         "run",           "call",        "check_call",
    "check_output", "getoutput",  "getstatusoutput", "remove",        "unlink",      "rmdir",
    "removedirs",   "rmtree",     "mkdir",           "makedirs",      "rename",      "renames",
    "replace",      "chmod",      "chown",           "kill",          "killpg",      "open",
    "fdopen",       "load",       "loads",           "import_module", "getattr",     "setattr",
    "delattr",      "putenv",     "startfile",       "write_text",    "write_bytes", "copyfile",
    "copy",         "copy2",      "copytree",        "move",          "symlink",     "link",
    "truncate",     "breakpoint", "input",           "globals",       "locals",      "vars",
    "__import__",
};

}  // namespace

bool Trust::Covers(std::string_view global) const {
  std::string text(global);
  for (const std::string& p : patterns) {
    if (p.empty()) continue;
    if (fnmatch(p.c_str(), text.c_str(), 0) == 0) return true;
    // "mypkg" and "mypkg.*" cover mypkg.x and mypkg.sub.x.
    std::string root = p.ends_with(".*") ? p.substr(0, p.size() - 2) : p;
    if (root.find_first_of("*?[") == std::string::npos && text.size() > root.size() &&
        text.starts_with(root) && text[root.size()] == '.') {
      return true;
    }
  }
  return false;
}

bool Trust::Reaches(std::string_view module, std::string_view name) const {
  if (patterns.empty() || name.empty() || name.find('.') != std::string_view::npos) return false;
  if (ClassifyGlobal(module, name) == GlobalClass::kUnsafe) return false;
  if (IsUnsafeModulePath(name) || name.starts_with("__")) return false;
  for (std::string_view b : kBorrowedNames) {
    if (b == name) return false;
  }
  return Covers(DisplayGlobal(module, name));
}

}  // namespace ckpt::torch
