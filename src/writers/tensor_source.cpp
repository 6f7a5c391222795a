#include "writers/tensor_source.h"

#include <string_view>
#include <unordered_set>

#include "base/error.h"

namespace ckpt {

void RequireDistinctNames(const std::vector<TensorSource>& tensors,
                          const std::map<std::string, std::string>& aliases) {
  if (tensors.empty()) Fail("no tensors to export");
  std::unordered_set<std::string_view> names;
  for (const TensorSource& t : tensors) {
    if (!names.insert(t.name).second) Fail("two different tensors are both named '{}'", t.name);
  }
  for (const auto& [alias, kept] : aliases) {
    if (!names.insert(alias).second) Fail("alias '{}' is also a tensor's name", alias);
  }
}

}  // namespace ckpt
