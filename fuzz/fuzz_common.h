// Helpers shared by the fuzz targets: a per-process scratch folder (in /dev/shm when available, so writing the
// input to a file each run stays cheap) and the rule that moecel::Error is the only allowed way to reject input.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace moecel::fuzz {

inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    std::filesystem::path d = base / ("moecel-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  static const bool cleanup = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
    return true;
  }();
  (void)cleanup;
  return dir;
}

inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Reads every byte of a buffer so that a view pointing outside its mapping faults (ASan does not track mmap).
inline uint64_t touch(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += b[i];
  return sum;
}

}  // namespace moecel::fuzz
