// tilelab::Error: errors a caller can fix (bad argument, bad configuration), and TILELAB_CHECK for
// internal invariants.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tilelab {

// What kind of mistake an Error reports; Python maps invalid_type to TypeError and everything else
// to ValueError.
enum class ErrorKind { invalid_value, invalid_type, internal };

// Thrown for anything a caller can fix. The message names the argument (or configuration key), what
// was given and what is allowed, e.g. "q: expected rank 4 [B, Hq, M, D], got rank 3".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorKind kind = ErrorKind::invalid_value)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
// Collects a message with operator<< and throws when it goes out of scope; used by the macros below
// so that the message is only formatted when the check fails.
class ErrorBuilder {
 public:
  ErrorBuilder(ErrorKind kind, const char* prefix) : kind_(kind) { stream_ << prefix; }
  template <typename T>
  ErrorBuilder& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  [[noreturn]] ~ErrorBuilder() noexcept(false) { throw Error(stream_.str(), kind_); }

 private:
  ErrorKind kind_;
  std::ostringstream stream_;
};
}  // namespace detail

}  // namespace tilelab

// TILELAB_REQUIRE(cond) << "q: expected ..."; throws tilelab::Error(invalid_value) when cond fails.
#define TILELAB_REQUIRE(cond) \
  if (cond) {                 \
  } else                      \
    ::tilelab::detail::ErrorBuilder(::tilelab::ErrorKind::invalid_value, "")

// TILELAB_REQUIRE_TYPE(cond) << "q: expected dtype ..."; throws tilelab::Error(invalid_type).
#define TILELAB_REQUIRE_TYPE(cond) \
  if (cond) {                      \
  } else                           \
    ::tilelab::detail::ErrorBuilder(::tilelab::ErrorKind::invalid_type, "")

// TILELAB_CHECK(cond) << "context"; an internal invariant (a bug in tilelab if it fails).
#define TILELAB_CHECK(cond) \
  if (cond) {               \
  } else                    \
    ::tilelab::detail::ErrorBuilder(::tilelab::ErrorKind::internal, "internal error: " #cond ": ")
