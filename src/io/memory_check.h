// Resource limits for loading: a checkpoint whose weights need more memory than the machine has fails early,
// before anything is allocated, with a message saying how much it needs and how much is available.
// MOECEL_MEMORY_LIMIT_BYTES (a byte count) replaces the detected amount, for tests and for capping a process.
#pragma once
#include <cstdint>
#include <string>

namespace moecel {

class WeightStore;

struct AvailableMemory {
  uint64_t bytes = 0;
  std::string source;  // where the number came from, for messages
};

// MOECEL_MEMORY_LIMIT_BYTES when set (an invalid value throws naming it), else MemAvailable from
// /proc/meminfo; when neither is known, bytes is UINT64_MAX (no limit).
AvailableMemory available_memory();

// "1.50 GiB (1610612736 bytes)".
std::string format_bytes(uint64_t bytes);

// Throws "WHAT needs N of memory ..., but only M are available (SOURCE)" when needed_bytes exceeds the
// available memory.
void check_memory_fits(uint64_t needed_bytes, const std::string& what);

// The same for weights that go to a device: `device_free` bytes free there (from the backend), capped by
// MOECEL_MEMORY_LIMIT_BYTES when set. Throws "WHAT needs N of DEVICE memory ..., but only M are free (SOURCE)".
void check_device_memory_fits(uint64_t needed_bytes, uint64_t device_free, const std::string& device,
                              const std::string& what);

// Sum of the byte sizes of every tensor in the store: what the weights take once resident.
uint64_t store_tensor_bytes(const WeightStore& store);

}  // namespace moecel
