// A tensor's sizes or strides: up to four dimensions held inline (no allocation for almost
// every tensor of a checkpoint; 40 bytes against a vector's 24 plus a 32-byte block), more on
// the heap.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

namespace ckpt::torch {

class Dims {
 public:
  static constexpr uint32_t kInline = 4;

  Dims() = default;
  Dims(std::initializer_list<int64_t> values) { assign(values.begin(), values.end()); }
  explicit Dims(std::span<const int64_t> values) { assign(values.begin(), values.end()); }
  Dims(const Dims& o) { assign(o.begin(), o.end()); }
  Dims& operator=(const Dims& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  Dims(Dims&& o) noexcept { Take(o); }
  Dims& operator=(Dims&& o) noexcept {
    if (this != &o) {
      Release();
      Take(o);
    }
    return *this;
  }
  ~Dims() { Release(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const int64_t* data() const { return capacity_ > kInline ? heap_ : inline_; }
  int64_t* data() { return capacity_ > kInline ? heap_ : inline_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + size_; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t back() const { return data()[size_ - 1]; }

  void clear() { size_ = 0; }
  void push_back(int64_t v) {
    if (size_ == capacity_) Grow(2 * capacity_);
    data()[size_++] = v;
  }
  template <typename It>
  void assign(It first, It last) {
    clear();
    for (; first != last; ++first) push_back(*first);
  }

  operator std::span<const int64_t>() const { return {data(), size_}; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  operator std::vector<int64_t>() const { return vec(); }

  friend bool operator==(const Dims& a, const Dims& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const Dims& a, const std::vector<int64_t>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void Grow(uint32_t capacity) {
    capacity = std::max(capacity, 2 * kInline);
    int64_t* grown = new int64_t[capacity];
    std::copy(begin(), end(), grown);
    Release();
    heap_ = grown;
    capacity_ = capacity;
  }
  void Release() {
    if (capacity_ > kInline) delete[] heap_;
    capacity_ = kInline;
  }
  // Leaves `o` empty.
  void Take(Dims& o) {
    if (o.capacity_ > kInline) {
      heap_ = o.heap_;
    } else {
      std::copy(o.inline_, o.inline_ + o.size_, inline_);
    }
    capacity_ = o.capacity_;
    size_ = o.size_;
    o.capacity_ = kInline;
    o.size_ = 0;
  }

  union {
    int64_t inline_[kInline] = {};
    int64_t* heap_;  // when capacity_ > kInline
  };
  uint32_t size_ = 0;
  uint32_t capacity_ = kInline;
};
static_assert(sizeof(Dims) == 40);

}  // namespace ckpt::torch
