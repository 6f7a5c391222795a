// What converting float32 to bfloat16/float16 did to each tensor an export wrote, gathered
// while the pieces are written (several threads may write pieces of one tensor), and the
// warning that names the tensors it changed more than by rounding.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/conversion_loss.h"

namespace ckpt {

class ConversionTally {
 public:
  explicit ConversionTally(size_t tensors) : loss_(tensors) {}

  void Add(size_t tensor, const kernels::ConversionLoss& l);

  // "" when every conversion only rounded; else one line naming (up to five of) the tensors
  // whose values overflowed, became zero or subnormal, or were whole numbers that changed.
  std::string Warning(kernels::Half to, const std::function<std::string(size_t)>& name) const;

 private:
  mutable std::mutex mu_;
  std::vector<kernels::ConversionLoss> loss_;
};

}  // namespace ckpt
