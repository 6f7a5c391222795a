#include "base/names.h"

#include <fnmatch.h>

namespace ckpt {

bool MatchesAnyGlob(const std::vector<std::string>& globs, const std::string& name) {
  for (const std::string& g : globs) {
    if (::fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

bool IsBelowKeyPath(std::string_view name, std::string_view path) {
  return name.size() > path.size() && name.starts_with(path) && name[path.size()] == '.';
}

}  // namespace ckpt
