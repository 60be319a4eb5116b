// Result<T> and Error: expected failures returned across module boundaries.
//
// Shaped like C++23 std::expected (GCC 12 has none). An Error carries a code and a message that
// names the input and says what was expected. Exceptions never cross module APIs.
//
//   sim::Result<Plan> load(const std::string& path) {
//     if (!exists) return sim::fail(sim::ErrorCode::kNotFound, "{}: no such file", path);
//     return plan;
//   }
//   auto r = load("p.json");
//   if (!r) { fmt::print(stderr, "{}\n", r.error().message); return 2; }
#pragma once

#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "sim/core/check.h"

namespace offsim::sim {

enum class ErrorCode {
  kInvalidInput,   // malformed or impossible input: parse errors, unknown keys, bad values
  kNotFound,       // a file, model, system or name that does not exist
  kIo,             // reading or writing a file failed
  kUnsupported,    // a feature not built in (no CUDA, no NCCL, no Qt) or not modelled
  kNoDevice,       // no GPU, or the driver is missing
  kDevice,         // a CUDA/NCCL/cuBLAS error at run time
  kLimitExceeded,  // a size, time or memory limit was hit
  kCancelled,      // stopped on request
  kInternal,       // a bug: an invariant that should have been checked earlier
};

const char* to_string(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

// Wraps an Error so that `return Unexpected{...}` converts to any Result<T>.
struct Unexpected {
  Error error;
};

template <class... Args>
Unexpected fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Unexpected{Error{code, fmt::format(format, std::forward<Args>(args)...)}};
}

inline Unexpected fail(Error error) { return Unexpected{std::move(error)}; }

template <class T>
class [[nodiscard]] Result {
 public:
  using value_type = T;

  Result(const T& value)
      : state_(std::in_place_index<0>, value) {}  // NOLINT(google-explicit-constructor)
  Result(T&& value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  template <class U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, T> &&
           !std::is_same_v<std::decay_t<U>, Unexpected> && !std::is_same_v<std::decay_t<U>, Result>)
      Result(U&& value)
      : state_(std::in_place_index<0>, T(std::forward<U>(value))) {}            // NOLINT
  Result(Unexpected u) : state_(std::in_place_index<1>, std::move(u.error)) {}  // NOLINT

  bool has_value() const { return state_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & {
    OFFSIM_CHECK_MSG(has_value(), "value() on an error: {}", std::get<1>(state_).message);
    return std::get<0>(state_);
  }
  const T& value() const& {
    OFFSIM_CHECK_MSG(has_value(), "value() on an error: {}", std::get<1>(state_).message);
    return std::get<0>(state_);
  }
  T&& value() && {
    OFFSIM_CHECK_MSG(has_value(), "value() on an error: {}", std::get<1>(state_).message);
    return std::get<0>(std::move(state_));
  }
  const Error& error() const {
    OFFSIM_CHECK(!has_value());
    return std::get<1>(state_);
  }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Error> state_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  using value_type = void;
  Result() = default;
  Result(Unexpected u) : error_(std::move(u.error)), ok_(false) {}  // NOLINT

  bool has_value() const { return ok_; }
  explicit operator bool() const { return ok_; }
  void value() const { OFFSIM_CHECK_MSG(ok_, "value() on an error: {}", error_.message); }
  const Error& error() const {
    OFFSIM_CHECK(!ok_);
    return error_;
  }

 private:
  Error error_;
  bool ok_ = true;
};

using Status = Result<void>;

inline Status ok() { return {}; }

// Prefixes an error's message with context ("scenario.yaml: ").
inline Error with_context(Error error, const std::string& context) {
  error.message = context + error.message;
  return error;
}

}  // namespace offsim::sim

// Evaluates a Result/Status expression and returns its error from the enclosing function.
#define OFFSIM_RETURN_IF_ERROR(expr)                                         \
  do {                                                                       \
    auto offsim_status_ = (expr);                                            \
    if (!offsim_status_) return ::offsim::sim::fail(offsim_status_.error()); \
  } while (false)

#define OFFSIM_CONCAT_INNER_(a, b) a##b
#define OFFSIM_CONCAT_(a, b) OFFSIM_CONCAT_INNER_(a, b)
// Declares (or assigns) `lhs` from a Result's value, or returns its error. It expands to several
// statements: never use it as the body of an unbraced if/for.
#define OFFSIM_ASSIGN_OR_RETURN(lhs, expr) \
  OFFSIM_ASSIGN_OR_RETURN_IMPL_(OFFSIM_CONCAT_(offsim_result_, __COUNTER__), lhs, expr)
#define OFFSIM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp) return ::offsim::sim::fail(tmp.error());  \
  lhs = std::move(tmp).value()
