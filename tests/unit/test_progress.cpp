// The load progress line (runtime/progress.h): its text, when it draws, and the per-thread load scope.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "runtime/progress.h"

namespace moecel {
namespace {

TEST(Progress, FormatsBarBytesPercentAndRate) {
  const std::string line = format_progress("loading weights", 900'000'000, 3'600'000'000, 2.0, 20);
  EXPECT_EQ(line, "loading weights  [#####---------------]     900 / 3600 MB   25%     450 MB/s");
}

TEST(Progress, NoRateAtTheStartAndFullBarAtTheEnd) {
  EXPECT_EQ(format_progress("x", 0, 1'000'000, 0.0, 4), "x  [----]       0 / 1 MB    0%");
  EXPECT_EQ(format_progress("x", 2'000'000, 1'000'000, 1.0, 4), "x  [####]       2 / 1 MB  100%       2 MB/s");
  EXPECT_EQ(format_progress("x", 5, 0, 1.0, 4).substr(0, 9), "x  [####]");  // nothing to do counts as done
  EXPECT_EQ(format_progress_done("loading weights", 3'600'000'000, 1.5),
            "loading weights  3600 MB in 1.5 s (2400 MB/s)");
}

TEST(Progress, SilentWhenSmallDisabledOrNotATerminal) {
  EXPECT_FALSE(ByteProgress("small", kProgressMinBytes - 1).active());
  setenv("MOECEL_PROGRESS", "0", 1);
  EXPECT_FALSE(ByteProgress("disabled", kProgressMinBytes * 4).active());
  unsetenv("MOECEL_PROGRESS");
  // Under ctest stderr is a pipe; run by hand in a terminal the bar is allowed to draw.
  if (isatty(STDERR_FILENO) != 1) {
    EXPECT_FALSE(ByteProgress("piped", kProgressMinBytes * 4).active());
  }
}

TEST(Progress, ScopesRouteLoadBytesToTheInnermostProgress) {
  report_load_bytes(5);  // outside any scope: ignored
  ByteProgress outer("outer", 0), inner("inner", 0);
  {
    ScopedLoadProgress a(outer);
    report_load_bytes(10);
    {
      ScopedLoadProgress b(inner);
      report_load_bytes(7);
    }
    report_load_bytes(3);
  }
  report_load_bytes(100);
  EXPECT_EQ(outer.done(), 13u);
  EXPECT_EQ(inner.done(), 7u);
}

}  // namespace
}  // namespace moecel
