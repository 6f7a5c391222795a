// What the user trusts (--trust, `trust = [...]` in ckptool.toml, ckptool.load(trust=...)):
// module globs whose own callables a pickle may call.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ckpt::torch {

// "mypkg" trusts mypkg and its submodules, "mypkg.*" likewise, "mypkg.models.Config" one name.
struct Trust {
  std::vector<std::string> patterns;
  // Does a pattern match `global` ("module.name")?
  bool Covers(std::string_view global) const;
  // Does trust reach the imported global module.name? Trust covers what a trusted module
  // defines, never what it merely imported: a name spelled like a module of the deny list
  // ("mypkg.os"), like a function that runs or loads code or touches files ("mypkg.system",
  // "mypkg.Popen", "mypkg.load"), or an attribute path ("mypkg.a.b" as one name) is not
  // trusted, whatever the patterns say. The deny list is judged before trust, always.
  bool Reaches(std::string_view module, std::string_view name) const;
};

}  // namespace ckpt::torch
