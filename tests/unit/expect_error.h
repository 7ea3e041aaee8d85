// expect_error(f, substring): f must throw moecel::Error whose message contains substring.
// Shared by the format and quantization tests.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace moecel {

template <class F>
void expect_error(F&& f, const std::string& substring) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << substring << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)
        << "error was: " << e.what() << "\nexpected it to contain: " << substring;
  }
}

}  // namespace moecel
