// The names of one tensor (one per path that reaches it; almost always one) in a single heap
// block: a file of 10^5 tensors holds 10^5 of these, and a vector of strings costs three
// allocations and ~100 bytes more per tensor.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::torch {

class NameList {
 public:
  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = std::string_view;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = std::string_view;

    iterator() = default;
    std::string_view operator*() const { return {p_ + sizeof(uint32_t), Size()}; }
    iterator& operator++() {
      p_ += sizeof(uint32_t) + Size();
      return *this;
    }
    iterator operator++(int) {
      iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const iterator& o) const { return p_ == o.p_; }

   private:
    friend class NameList;
    explicit iterator(const char* p) : p_(p) {}
    uint32_t Size() const {
      uint32_t n;
      std::memcpy(&n, p_, sizeof n);
      return n;
    }
    const char* p_ = nullptr;
  };

  NameList() = default;
  NameList(std::initializer_list<std::string_view> names) {
    for (std::string_view n : names) push_back(n);
  }
  NameList(const NameList& o) { *this = o; }
  NameList& operator=(const NameList& o);
  NameList(NameList&&) noexcept = default;
  NameList& operator=(NameList&&) noexcept = default;

  size_t size() const { return block_ ? Header().count : 0; }
  bool empty() const { return size() == 0; }
  iterator begin() const { return iterator(block_ ? block_.get() + sizeof(Head) : nullptr); }
  iterator end() const { return iterator(block_ ? block_.get() + Header().used : nullptr); }
  std::string_view front() const { return *begin(); }
  // Name i: the first is found at once, later ones by walking (tied tensors have a few).
  std::string_view operator[](size_t i) const {
    iterator it = begin();
    while (i--) ++it;
    return *it;
  }
  void push_back(std::string_view name);
  std::vector<std::string> strings() const { return {begin(), end()}; }

  bool operator==(const NameList& o) const;

 private:
  struct Head {
    uint32_t count;
    uint32_t used;  // bytes of the block in use, this header included
    uint32_t capacity;
  };
  Head Header() const {
    Head h;
    std::memcpy(&h, block_.get(), sizeof h);
    return h;
  }

  std::unique_ptr<char[]> block_;  // Head, then per name: u32 size and its bytes
};

}  // namespace ckpt::torch
