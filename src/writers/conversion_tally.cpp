#include "writers/conversion_tally.h"

#include <fmt/format.h>

#include "base/human.h"

namespace ckpt {

void ConversionTally::Add(size_t tensor, const kernels::ConversionLoss& l) {
  std::lock_guard<std::mutex> lock(mu_);
  loss_[tensor].Add(l);
}

std::string ConversionTally::Warning(kernels::Half to,
                                     const std::function<std::string(size_t)>& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> shown;
  size_t changed = 0;
  for (size_t i = 0; i < loss_.size(); ++i) {
    std::string why = loss_[i].Reason(to);
    if (why.empty()) continue;
    if (++changed <= 5) shown.push_back(fmt::format("{}: {}", name(i), why));
  }
  if (!changed) return "";
  std::string text = fmt::format(
      "converting to {} changed more than rounding in {} (written converted, as --dtype asks; "
      "ckptool convert keeps such tensors float32): {}",
      kernels::OptionName(to), Count(changed, "tensor"), fmt::join(shown, "; "));
  if (changed > shown.size()) text += fmt::format("; and {} more", changed - shown.size());
  return text;
}

}  // namespace ckpt
