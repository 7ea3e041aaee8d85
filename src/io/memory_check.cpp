// Available memory from /proc/meminfo (MemAvailable counts free memory plus reclaimable page cache, which is
// what the kernel can hand to a new allocation or mapping) or the MOECEL_MEMORY_LIMIT_BYTES override.
#include "io/memory_check.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"

namespace moecel {

AvailableMemory available_memory() {
  if (const char* env = std::getenv("MOECEL_MEMORY_LIMIT_BYTES"); env && *env) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (*end != '\0' || errno != 0 || env[0] == '-') {
      fail("MOECEL_MEMORY_LIMIT_BYTES must be a byte count (a non-negative integer), got '{}'", env);
    }
    return {uint64_t(v), "MOECEL_MEMORY_LIMIT_BYTES"};
  }
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    std::string key, unit;
    uint64_t kib = 0;
    if (ss >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB") {
      return {kib * 1024, "MemAvailable in /proc/meminfo"};
    }
  }
  return {std::numeric_limits<uint64_t>::max(), "unknown"};
}

std::string format_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{} bytes", bytes);
  return fmt::format("{:.2f} {} ({} bytes)", v, kUnits[u], bytes);
}

void check_memory_fits(uint64_t needed_bytes, const std::string& what) {
  const AvailableMemory avail = available_memory();
  if (needed_bytes <= avail.bytes) return;
  fail("{} needs {} of memory, but only {} are available ({}); free memory or use a smaller checkpoint", what,
       format_bytes(needed_bytes), format_bytes(avail.bytes), avail.source);
}

void check_device_memory_fits(uint64_t needed_bytes, uint64_t device_free, const std::string& device,
                              const std::string& what) {
  AvailableMemory avail{device_free, "free on the device"};
  if (const char* env = std::getenv("MOECEL_MEMORY_LIMIT_BYTES"); env && *env) {
    const AvailableMemory limit = available_memory();  // parses and validates the variable
    if (limit.bytes < avail.bytes) avail = limit;
  }
  if (needed_bytes <= avail.bytes) return;
  fail(
      "{} needs {} of {} memory for its weights, but only {} are free ({}); use a smaller checkpoint or another "
      "backend",
      what, format_bytes(needed_bytes), device, format_bytes(avail.bytes), avail.source);
}

uint64_t store_tensor_bytes(const WeightStore& store) {
  uint64_t total = 0;
  for (const auto& [name, t] : store.all()) {
    // Each tensor's size was checked against its file, so only the sum over many shards could overflow.
    if (__builtin_add_overflow(total, uint64_t(t.nbytes()), &total)) return std::numeric_limits<uint64_t>::max();
  }
  return total;
}

}  // namespace moecel
