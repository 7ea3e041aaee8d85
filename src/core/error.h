// Errors: bad input (files, config, CLI) throws moecel::Error with context; the CLI prints it and exits 1.
// Checks here stay on in release builds: never use assert() for anything input can reach.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace moecel {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The message as one printable line: control characters (a newline or escape sequence carried in from a config
// key, a tensor name or a prompt) become \n, \r, \t or \xNN, and a backslash is kept as it is. Bytes of 0x80 and
// above (UTF-8) are kept. The CLI prints every error through this, so an input cannot forge or split lines.
std::string printable_message(std::string_view message);

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
