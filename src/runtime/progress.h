// Progress of a long byte transfer (uploading a checkpoint to a device) as one self-redrawing line on stderr:
// a bar, MB done / total and the rate. Drawn only when stderr is a terminal and the transfer is large, so pipes,
// logs and tests' captured output never see it; MOECEL_PROGRESS=0 turns it off.
// Used by: load_model (models/registry.cpp) and WeightLoader (models/weights.cpp).
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace moecel {

// Transfers smaller than this finish too fast for a bar to help.
constexpr uint64_t kProgressMinBytes = uint64_t(256) << 20;

// "loading model  [#########-----------]   1234 / 3600 MB   34%   2345 MB/s" (MB = 10^6 bytes; no rate before
// 0.05 s). The bar is `bar_width` characters wide.
std::string format_progress(const std::string& label, uint64_t done, uint64_t total, double seconds,
                            int bar_width = 30);
// "loading model  3600 MB in 1.5 s (2400 MB/s)".
std::string format_progress_done(const std::string& label, uint64_t done, double seconds);

class ByteProgress {
 public:
  // Active (draws) only when stderr is a terminal, total_bytes >= min_bytes and MOECEL_PROGRESS is not "0".
  ByteProgress(std::string label, uint64_t total_bytes, uint64_t min_bytes = kProgressMinBytes);
  ~ByteProgress();  // without finish(): ends the line (the load failed), no summary
  ByteProgress(const ByteProgress&) = delete;
  ByteProgress& operator=(const ByteProgress&) = delete;

  // Adds finished bytes; redraws at most every 100 ms. Thread-safe.
  void add(uint64_t bytes);
  // Draws the final summary line and a newline; later calls do nothing.
  void finish();
  bool active() const { return active_; }
  uint64_t done() const;

 private:
  void draw(bool final_line);

  std::string label_;
  uint64_t total_ = 0, done_ = 0;
  bool active_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  mutable std::mutex mu_;
};

// Makes `progress` the current thread's load progress for the scope: report_load_bytes() adds to it. Scopes nest
// (the innermost wins) and restore the previous one on exit.
class ScopedLoadProgress {
 public:
  explicit ScopedLoadProgress(ByteProgress& progress);
  ~ScopedLoadProgress();
  ScopedLoadProgress(const ScopedLoadProgress&) = delete;
  ScopedLoadProgress& operator=(const ScopedLoadProgress&) = delete;

 private:
  ByteProgress* previous_;
};

// Adds bytes to the current thread's load progress; does nothing outside a ScopedLoadProgress.
void report_load_bytes(uint64_t bytes);

}  // namespace moecel
