// SmallVector<T, N>: a vector of trivially copyable elements that keeps up to N of them inline
// and moves to the heap only beyond that. Plans hold hundreds of thousands of ops whose cost uses
// two to six resources each; inline storage saves an allocation and a free per op when a plan is
// built, copied and destroyed.
//
//   sim::SmallVector<ResourceUse, 4> uses = {{sm, 1.0}, {hbm, 0.5}};
//   uses.push_back({nic, 1.0});
//
// The interface is the part of std::vector the project uses: construction from a list, an
// iterator range or a std::vector, push_back/emplace_back, size, indexing, iteration, clear,
// reserve, resize, insert and erase of ranges, and equality.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <type_traits>
#include <vector>

namespace offsim::sim {

template <class T, std::size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "SmallVector holds trivially copyable elements");
  static_assert(N > 0, "SmallVector needs inline room for at least one element");

 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using pointer = T*;
  using const_pointer = const T*;
  using iterator = T*;
  using const_iterator = const T*;

  SmallVector() noexcept = default;
  SmallVector(std::initializer_list<T> list) { assign(list.begin(), list.end()); }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  SmallVector(It first, It last) {
    assign(first, last);
  }
  // Implicit, so that code building a std::vector can hand it over (also when it gives it up:
  // the elements are copied either way, the inline storage cannot take over its block).
  SmallVector(const std::vector<T>& v) { assign(v.begin(), v.end()); }
  SmallVector(std::vector<T>&& v) { assign(v.begin(), v.end()); }
  SmallVector(const SmallVector& o) { assign(o.begin(), o.end()); }
  SmallVector(SmallVector&& o) noexcept { take(o); }
  ~SmallVector() { release(); }

  SmallVector& operator=(const SmallVector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  SmallVector& operator=(std::initializer_list<T> list) {
    assign(list.begin(), list.end());
    return *this;
  }
  SmallVector& operator=(const std::vector<T>& v) {
    assign(v.begin(), v.end());
    return *this;
  }
  SmallVector& operator=(std::vector<T>&& v) {
    assign(v.begin(), v.end());
    return *this;
  }

  template <class It>
  void assign(It first, It last) {
    const auto n = static_cast<size_type>(std::distance(first, last));
    size_ = 0;
    reserve(n);
    std::copy(first, last, data());
    size_ = n;
  }

  size_type size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_type capacity() const noexcept { return heap_ != nullptr ? capacity_ : N; }
  T* data() noexcept { return heap_ != nullptr ? heap_ : inline_data(); }
  const T* data() const noexcept { return heap_ != nullptr ? heap_ : inline_data(); }

  iterator begin() noexcept { return data(); }
  iterator end() noexcept { return data() + size_; }
  const_iterator begin() const noexcept { return data(); }
  const_iterator end() const noexcept { return data() + size_; }
  const_iterator cbegin() const noexcept { return begin(); }
  const_iterator cend() const noexcept { return end(); }

  T& operator[](size_type i) noexcept { return data()[i]; }
  const T& operator[](size_type i) const noexcept { return data()[i]; }
  T& front() noexcept { return data()[0]; }
  const T& front() const noexcept { return data()[0]; }
  T& back() noexcept { return data()[size_ - 1]; }
  const T& back() const noexcept { return data()[size_ - 1]; }

  void reserve(size_type n) {
    if (n <= capacity()) return;
    const size_type grown = std::max(n, 2 * capacity());
    T* fresh = static_cast<T*>(::operator new(grown * sizeof(T)));
    if (size_ > 0) std::memcpy(static_cast<void*>(fresh), data(), size_ * sizeof(T));
    release();
    heap_ = fresh;
    capacity_ = grown;
  }

  void push_back(const T& v) {
    if (size_ == capacity()) {
      const T copy = v;  // v may live in this vector
      reserve(size_ + 1);
      data()[size_++] = copy;
      return;
    }
    data()[size_++] = v;
  }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    push_back(T{std::forward<Args>(args)...});
    return back();
  }
  void pop_back() noexcept { --size_; }
  void clear() noexcept { size_ = 0; }
  void resize(size_type n, const T& v = T{}) {
    const T fill = v;  // v may live in this vector
    reserve(n);
    for (size_type i = size_; i < n; ++i) data()[i] = fill;
    size_ = n;
  }

  // Inserts [first, last) before pos (which must not point into [first, last)).
  template <class It>
  iterator insert(const_iterator pos, It first, It last) {
    const auto at = static_cast<size_type>(pos - begin());
    const auto n = static_cast<size_type>(std::distance(first, last));
    reserve(size_ + n);
    T* p = data();
    std::memmove(static_cast<void*>(p + at + n), p + at, (size_ - at) * sizeof(T));
    std::copy(first, last, p + at);
    size_ += n;
    return p + at;
  }
  iterator insert(const_iterator pos, const T& v) {
    const T copy = v;
    return insert(pos, &copy, &copy + 1);
  }
  iterator erase(const_iterator first, const_iterator last) {
    T* p = data();
    const auto at = static_cast<size_type>(first - p);
    const auto n = static_cast<size_type>(last - first);
    std::memmove(static_cast<void*>(p + at), p + at + n, (size_ - at - n) * sizeof(T));
    size_ -= n;
    return p + at;
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }

  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  T* inline_data() noexcept { return std::launder(reinterpret_cast<T*>(inline_)); }
  const T* inline_data() const noexcept {
    return std::launder(reinterpret_cast<const T*>(inline_));
  }
  void release() noexcept {
    if (heap_ != nullptr) ::operator delete(heap_);
    heap_ = nullptr;
    capacity_ = 0;
  }
  // Takes o's elements (its heap block, or a copy of its inline ones) and leaves it empty.
  void take(SmallVector& o) noexcept {
    if (o.heap_ != nullptr) {
      heap_ = o.heap_;
      capacity_ = o.capacity_;
      o.heap_ = nullptr;
      o.capacity_ = 0;
    } else if (o.size_ > 0) {
      std::memcpy(inline_, o.inline_, o.size_ * sizeof(T));
    }
    size_ = o.size_;
    o.size_ = 0;
  }

  T* heap_ = nullptr;  // the elements when they do not fit inline
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;  // of heap_
  alignas(T) unsigned char inline_[N * sizeof(T)];
};

}  // namespace offsim::sim
