#include "torch/name_list.h"

#include <algorithm>

#include "base/error.h"

namespace ckpt::torch {

NameList& NameList::operator=(const NameList& o) {
  if (this == &o) return *this;
  if (!o.block_) {
    block_.reset();
    return *this;
  }
  Head h = o.Header();
  h.capacity = h.used;
  block_ = std::make_unique_for_overwrite<char[]>(h.used);
  std::memcpy(block_.get(), o.block_.get(), h.used);
  std::memcpy(block_.get(), &h, sizeof h);
  return *this;
}

void NameList::push_back(std::string_view name) {
  Head h = block_ ? Header() : Head{0, sizeof(Head), 0};
  uint64_t need = uint64_t{h.used} + sizeof(uint32_t) + name.size();
  if (need > UINT32_MAX) Fail("a tensor's names take more than 4 GiB");
  uint32_t size = static_cast<uint32_t>(name.size());
  auto put = [&](char* block) {  // `name` may point into the old block: read before freeing
    std::memcpy(block + h.used, &size, sizeof size);
    if (size) std::memcpy(block + h.used + sizeof size, name.data(), size);
  };
  if (need > h.capacity) {
    // Doubling: a tensor reached by many paths gains its names in linear time.
    uint64_t capacity = std::min<uint64_t>(UINT32_MAX, std::max<uint64_t>(need, 2 * h.capacity));
    auto grown = std::make_unique_for_overwrite<char[]>(capacity);
    if (block_) std::memcpy(grown.get(), block_.get(), h.used);
    put(grown.get());
    block_ = std::move(grown);
    h.capacity = static_cast<uint32_t>(capacity);
  } else {
    put(block_.get());
  }
  h.used = static_cast<uint32_t>(need);
  ++h.count;
  std::memcpy(block_.get(), &h, sizeof h);
}

bool NameList::operator==(const NameList& o) const {
  if (size() != o.size()) return false;
  if (empty()) return true;
  Head a = Header(), b = o.Header();
  return a.used == b.used && std::memcmp(block_.get() + sizeof(Head), o.block_.get() + sizeof(Head),
                                         a.used - sizeof(Head)) == 0;
}

}  // namespace ckpt::torch
