// Finds the items of a vector by name in constant time while holding only their indices.
//
// A std::unordered_map<std::string, size_t> keeps a copy of every name and a node per item
// (~90 bytes for a 20-character name); a file of 10^5 records or storages pays that several
// times over. This table holds 8 bytes per slot (the item's index and its name's hash), at
// most half full, and asks the caller for an item's name when it must compare one: the names
// stay where they are (a record's name in its Entry, a storage's key in its Storage), so the
// vector holding them may grow or move freely.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

namespace ckpt {

class NameIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  NameIndex() = default;
  // A moved-from index is empty (its slots went with the move, so must its count).
  NameIndex(NameIndex&& o) noexcept
      : slots_(std::exchange(o.slots_, {})), size_(std::exchange(o.size_, 0)) {}
  NameIndex& operator=(NameIndex&& o) noexcept {
    slots_ = std::exchange(o.slots_, {});
    size_ = std::exchange(o.size_, 0);
    return *this;
  }
  NameIndex(const NameIndex&) = default;
  NameIndex& operator=(const NameIndex&) = default;

  void Reserve(size_t items) {
    size_t want = 16;
    while (want < 2 * items) want *= 2;
    if (want > slots_.size()) Rehash(want);
  }
  size_t size() const { return size_; }
  void Clear() {
    std::vector<Slot>().swap(slots_);
    size_ = 0;
  }

  // Adds item `index` under `name` (which name_of(index) must return from now on). If an
  // item of that name is there already, nothing is added and its index is returned;
  // otherwise `index`.
  template <typename NameOf>
  uint32_t Insert(std::string_view name, uint32_t index, const NameOf& name_of) {
    if (2 * (size_ + 1) > slots_.size()) Rehash(slots_.empty() ? 16 : 2 * slots_.size());
    uint32_t hash = Hash(name);
    size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.index == kNone) {
        s = {index, hash};
        ++size_;
        return index;
      }
      if (s.hash == hash && name_of(s.index) == name) return s.index;
    }
  }

  // The index of the item named `name`, or kNone.
  template <typename NameOf>
  uint32_t Find(std::string_view name, const NameOf& name_of) const {
    if (slots_.empty()) return kNone;
    uint32_t hash = Hash(name);
    size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.index == kNone) return kNone;
      if (s.hash == hash && name_of(s.index) == name) return s.index;
    }
  }

 private:
  struct Slot {
    uint32_t index = kNone;
    uint32_t hash = 0;
  };
  static uint32_t Hash(std::string_view name) {
    uint64_t h = std::hash<std::string_view>{}(name);
    return static_cast<uint32_t>(h ^ (h >> 32));
  }
  // Hashes are kept with the indices, so moving to a larger table reads no names.
  void Rehash(size_t count) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(count, Slot{});
    size_t mask = count - 1;
    for (const Slot& s : old) {
      if (s.index == kNone) continue;
      size_t i = s.hash & mask;
      while (slots_[i].index != kNone) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace ckpt
