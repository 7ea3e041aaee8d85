// Errors: bad input (files, config, CLI) throws moecel::Error with context; the CLI prints it and exits 1.
// Checks here stay on in release builds: never use assert() for anything input can reach.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moecel {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace moecel

// MOECEL_CHECK(cond, "fmt", args...): throws moecel::Error with the formatted message when cond is false.
#define MOECEL_CHECK(cond, ...)               \
  do {                                        \
    if (!(cond)) ::moecel::fail(__VA_ARGS__); \
  } while (0)
