// InlineString: an immutable-size string that keeps up to kInlineCapacity characters inside the
// object and moves to the heap only beyond that. A plan names every op ("mb124.l20.out_proj.bwd.
// tp_allgather"): a large step holds hundreds of thousands of them, nearly all 16 to 35
// characters, one heap block each in a std::string (whose inline buffer holds 15). Kept inline
// they cost no allocation when a plan is built and no free when it is destroyed.
//
//   sim::InlineString name = fmt::format("mb{}.l{}.qkv.fwd", mb, l);
//   std::string_view v = name;           // implicit
//   std::string s = name;                // implicit copy
//   if (name.starts_with("mb0.")) ...
//
// The interface is the read-only part of std::string the project uses on names (size, data,
// c_str, find, rfind, substr, starts_with, ends_with, comparison, iteration), conversions to
// std::string_view and std::string, assignment from any string, and formatting with fmt and
// iostreams.
#pragma once

#include <cstddef>
#include <cstring>
#include <ostream>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace offsim::sim {

class InlineString {
 public:
  static constexpr std::size_t kInlineCapacity = 38;  // the object is 40 bytes

  InlineString() noexcept { set_inline(0); }
  InlineString(std::string_view s) { assign(s); }               // NOLINT: implicit by design
  InlineString(const std::string& s) { assign(s); }             // NOLINT
  InlineString(const char* s) { assign(std::string_view(s)); }  // NOLINT
  InlineString(const InlineString& o) { assign(o.view()); }
  InlineString(InlineString&& o) noexcept {
    std::memcpy(static_cast<void*>(this), static_cast<const void*>(&o), sizeof(InlineString));
    o.set_inline(0);
  }
  ~InlineString() { release(); }

  InlineString& operator=(const InlineString& o) {
    if (this != &o) {
      release();
      assign(o.view());
    }
    return *this;
  }
  InlineString& operator=(InlineString&& o) noexcept {
    if (this != &o) {
      release();
      std::memcpy(static_cast<void*>(this), static_cast<const void*>(&o), sizeof(InlineString));
      o.set_inline(0);
    }
    return *this;
  }
  InlineString& operator=(std::string_view s) {
    InlineString fresh(s);  // s may point into this string
    return *this = std::move(fresh);
  }
  InlineString& operator=(const std::string& s) { return *this = std::string_view(s); }
  InlineString& operator=(const char* s) { return *this = std::string_view(s); }

  std::size_t size() const noexcept { return on_heap() ? heap_size() : tag_; }
  std::size_t length() const noexcept { return size(); }
  bool empty() const noexcept { return size() == 0; }
  const char* data() const noexcept { return on_heap() ? heap_ptr() : buf_; }
  const char* c_str() const noexcept { return data(); }  // NUL-terminated
  std::string_view view() const noexcept { return {data(), size()}; }
  std::string str() const { return std::string(view()); }
  operator std::string_view() const noexcept { return view(); }  // NOLINT: implicit by design
  operator std::string() const { return str(); }                 // NOLINT: implicit by design

  const char* begin() const noexcept { return data(); }
  const char* end() const noexcept { return data() + size(); }
  char operator[](std::size_t i) const noexcept { return data()[i]; }
  char front() const noexcept { return data()[0]; }
  char back() const noexcept { return data()[size() - 1]; }

  std::size_t find(std::string_view s, std::size_t pos = 0) const noexcept {
    return view().find(s, pos);
  }
  std::size_t find(char c, std::size_t pos = 0) const noexcept { return view().find(c, pos); }
  std::size_t rfind(std::string_view s, std::size_t pos = std::string_view::npos) const noexcept {
    return view().rfind(s, pos);
  }
  std::size_t rfind(char c, std::size_t pos = std::string_view::npos) const noexcept {
    return view().rfind(c, pos);
  }
  std::string substr(std::size_t pos, std::size_t n = std::string_view::npos) const {
    return std::string(view().substr(pos, n));
  }
  bool starts_with(std::string_view s) const noexcept { return view().starts_with(s); }
  bool starts_with(char c) const noexcept { return view().starts_with(c); }
  bool ends_with(std::string_view s) const noexcept { return view().ends_with(s); }
  bool ends_with(char c) const noexcept { return view().ends_with(c); }
  int compare(std::string_view s) const noexcept { return view().compare(s); }

  // One overload per kind of right-hand side, so that none needs a user-defined conversion
  // that another could take instead (the reversed forms follow in C++20).
  friend bool operator==(const InlineString& a, const InlineString& b) noexcept {
    return a.view() == b.view();
  }
  friend bool operator==(const InlineString& a, std::string_view b) noexcept {
    return a.view() == b;
  }
  friend bool operator==(const InlineString& a, const std::string& b) noexcept {
    return a.view() == std::string_view(b);
  }
  friend bool operator==(const InlineString& a, const char* b) noexcept {
    return a.view() == std::string_view(b);
  }
  friend auto operator<=>(const InlineString& a, const InlineString& b) noexcept {
    return a.view() <=> b.view();
  }
  friend auto operator<=>(const InlineString& a, std::string_view b) noexcept {
    return a.view() <=> b;
  }
  friend auto operator<=>(const InlineString& a, const std::string& b) noexcept {
    return a.view() <=> std::string_view(b);
  }
  friend auto operator<=>(const InlineString& a, const char* b) noexcept {
    return a.view() <=> std::string_view(b);
  }
  friend std::string operator+(const InlineString& a, std::string_view b) {
    std::string s(a.view());
    s.append(b);
    return s;
  }
  friend std::string operator+(std::string_view a, const InlineString& b) {
    std::string s(a);
    s.append(b.view());
    return s;
  }
  friend std::ostream& operator<<(std::ostream& os, const InlineString& s) {
    return os << s.view();
  }

 private:
  static constexpr unsigned char kHeapTag = 0xFF;

  bool on_heap() const noexcept { return tag_ == kHeapTag; }
  char* heap_ptr() const noexcept {
    char* p = nullptr;
    std::memcpy(static_cast<void*>(&p), buf_, sizeof(p));
    return p;
  }
  std::size_t heap_size() const noexcept {
    std::size_t n = 0;
    std::memcpy(&n, buf_ + sizeof(char*), sizeof(n));
    return n;
  }
  void set_inline(std::size_t n) noexcept {
    tag_ = static_cast<unsigned char>(n);
    buf_[n] = '\0';
  }
  void assign(std::string_view s) {
    if (s.size() <= kInlineCapacity) {
      if (!s.empty()) std::memcpy(buf_, s.data(), s.size());
      set_inline(s.size());
      return;
    }
    char* p = new char[s.size() + 1];
    std::memcpy(p, s.data(), s.size());
    p[s.size()] = '\0';
    const std::size_t n = s.size();
    std::memcpy(buf_, static_cast<const void*>(&p), sizeof(p));
    std::memcpy(buf_ + sizeof(char*), &n, sizeof(n));
    tag_ = kHeapTag;
  }
  void release() noexcept {
    if (on_heap()) delete[] heap_ptr();
    set_inline(0);
  }

  char buf_[kInlineCapacity + 1];  // inline: the characters and a NUL; heap: pointer and size
  unsigned char tag_ = 0;          // inline: the size; kHeapTag: on the heap
};

static_assert(sizeof(InlineString) == InlineString::kInlineCapacity + 2);

}  // namespace offsim::sim

template <>
struct fmt::formatter<offsim::sim::InlineString> : fmt::formatter<std::string_view> {
  template <class FormatContext>
  auto format(const offsim::sim::InlineString& s, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(s.view(), ctx);
  }
};
