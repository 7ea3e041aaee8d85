// Progress line on stderr for long byte transfers (see progress.h).
#include "runtime/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace moecel {
namespace {

thread_local ByteProgress* g_load_progress = nullptr;

constexpr double kMegabyte = 1e6;
constexpr auto kRedrawEvery = std::chrono::milliseconds(100);

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::string format_progress(const std::string& label, uint64_t done, uint64_t total, double seconds, int bar_width) {
  const double frac = total > 0 ? std::min(1.0, double(done) / double(total)) : 1.0;
  const int filled = int(frac * bar_width);
  std::string bar(size_t(std::max(bar_width, 0)), '-');
  std::fill_n(bar.begin(), std::min(filled, bar_width), '#');
  char buf[160];
  int n = std::snprintf(buf, sizeof buf, "  [%s] %7.0f / %.0f MB %4d%%", bar.c_str(), double(done) / kMegabyte,
                        double(total) / kMegabyte, int(frac * 100.0));
  std::string line = label + std::string(buf, size_t(std::max(n, 0)));
  if (seconds >= 0.05) {
    n = std::snprintf(buf, sizeof buf, " %7.0f MB/s", double(done) / kMegabyte / seconds);
    line.append(buf, size_t(std::max(n, 0)));
  }
  return line;
}

std::string format_progress_done(const std::string& label, uint64_t done, double seconds) {
  char buf[128];
  const double rate = seconds > 0 ? double(done) / kMegabyte / seconds : 0.0;
  const int n =
      std::snprintf(buf, sizeof buf, "  %.0f MB in %.1f s (%.0f MB/s)", double(done) / kMegabyte, seconds, rate);
  return label + std::string(buf, size_t(std::max(n, 0)));
}

ByteProgress::ByteProgress(std::string label, uint64_t total_bytes, uint64_t min_bytes)
    : label_(std::move(label)), total_(total_bytes) {
  const char* env = std::getenv("MOECEL_PROGRESS");
  const bool disabled = env && std::strcmp(env, "0") == 0;
  active_ = !disabled && total_bytes >= min_bytes && isatty(STDERR_FILENO) == 1;
  start_ = last_draw_ = std::chrono::steady_clock::now();
  if (active_) draw(false);
}

ByteProgress::~ByteProgress() {
  // Not finished (an error unwinds the load): end the bar's line so the error message starts on its own.
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

void ByteProgress::add(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ += bytes;
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < kRedrawEvery) return;
  last_draw_ = now;
  draw(false);
}

void ByteProgress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
  draw(true);
  active_ = false;
}

uint64_t ByteProgress::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

// Called with mu_ held. "\r" returns to the line start and "\x1b[K" clears what a longer previous line left.
void ByteProgress::draw(bool final_line) {
  const double s = seconds_since(start_);
  const std::string line =
      final_line ? format_progress_done(label_, done_, s) : format_progress(label_, done_, total_, s);
  std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), final_line ? "\n" : "");
  std::fflush(stderr);
}

ScopedLoadProgress::ScopedLoadProgress(ByteProgress& progress) : previous_(g_load_progress) {
  g_load_progress = &progress;
}

ScopedLoadProgress::~ScopedLoadProgress() {
  g_load_progress = previous_;
}

void report_load_bytes(uint64_t bytes) {
  if (g_load_progress) g_load_progress->add(bytes);
}

}  // namespace moecel
