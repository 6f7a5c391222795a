// One error type for the whole engine. Parsers throw ckpt::Error with a message that
// names what is wrong; callers at the API boundary add the file name (see WithContext).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace ckpt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// An input file changed while it was being read (truncated by another process): the whole
// command fails, it is not a finding about one record.
class InputChanged : public Error {
 public:
  using Error::Error;
};

// A job asked for something it cannot do as asked (no inputs, one output named for several):
// the command line's usage error, exit code 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void Fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Throws `e` again with the message `what`, as the same kind of error (a usage error stays one).
[[noreturn]] inline void Rethrow(const Error& e, const std::string& what) {
  if (dynamic_cast<const UsageError*>(&e) != nullptr) throw UsageError(what);
  throw Error(what);
}

// Runs fn(); if it throws ckpt::Error, rethrows with "context: " prepended.
template <typename Fn>
auto WithContext(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    Rethrow(e, context + ": " + e.what());
  }
}

}  // namespace ckpt
