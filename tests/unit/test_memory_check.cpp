// Resource limits: available memory (MemAvailable or the MOECEL_MEMORY_LIMIT_BYTES override), the early
// failure with needed and available amounts, and that an oversized checkpoint fails before anything is allocated.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "expect_error.h"
#include "io/memory_check.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "models/test_model.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;

// Sets an environment variable for the scope of one test.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("moecel-memcheck-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A safetensors file with one tensor of `bytes` bytes at data offset `offset`, the data a sparse hole.
void write_sparse_tensor(const std::string& path, const char* dtype, uint64_t bytes, uint64_t offset) {
  const uint64_t elems = bytes / (std::string(dtype) == "U8" ? 1 : 2);
  std::string h =
      nlohmann::json{{"t", {{"dtype", dtype}, {"shape", {elems}}, {"data_offsets", {offset, offset + bytes}}}}}.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  {
    std::ofstream f(path, std::ios::binary);
    for (int i = 0; i < 8; ++i) f.put(char(uint8_t(uint64_t(h.size()) >> (8 * i))));
    f << h;
  }
  fs::resize_file(path, 8 + h.size() + offset + bytes);
}

TEST(MemoryCheck, EnvOverride) {
  ScopedEnv env("MOECEL_MEMORY_LIMIT_BYTES", "123456");
  AvailableMemory m = available_memory();
  EXPECT_EQ(m.bytes, 123456u);
  EXPECT_EQ(m.source, "MOECEL_MEMORY_LIMIT_BYTES");
}

TEST(MemoryCheck, EnvOverrideRejectsGarbage) {
  for (const char* bad : {"lots", "-5", "12k", "99999999999999999999999"}) {
    ScopedEnv env("MOECEL_MEMORY_LIMIT_BYTES", bad);
    expect_error([] { available_memory(); }, "MOECEL_MEMORY_LIMIT_BYTES must be a byte count");
  }
}

TEST(MemoryCheck, MemAvailableFromProc) {
  ::unsetenv("MOECEL_MEMORY_LIMIT_BYTES");
  AvailableMemory m = available_memory();
  if (!fs::exists("/proc/meminfo")) GTEST_SKIP() << "no /proc/meminfo here";
  EXPECT_EQ(m.source, "MemAvailable in /proc/meminfo");
  EXPECT_GT(m.bytes, uint64_t(1) << 20);  // any machine running this has more than 1 MiB available
}

TEST(MemoryCheck, FormatBytes) {
  EXPECT_EQ(format_bytes(1000), "1000 bytes");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB (1536 bytes)");
  EXPECT_EQ(format_bytes(uint64_t(1) << 40), "1.00 TiB (1099511627776 bytes)");
}

TEST(MemoryCheck, MessageSaysNeededAndAvailable) {
  ScopedEnv env("MOECEL_MEMORY_LIMIT_BYTES", "1000");
  check_memory_fits(1000, "fits exactly");
  expect_error([] { check_memory_fits(2048, "model folder X"); },
               "model folder X needs 2.00 KiB (2048 bytes) of memory, but only 1000 bytes are available "
               "(MOECEL_MEMORY_LIMIT_BYTES)");
}

// Weights for a device backend are checked against the device's free memory (capped by the override).
TEST(MemoryCheck, DeviceMessageSaysNeededAndFree) {
  ::unsetenv("MOECEL_MEMORY_LIMIT_BYTES");
  check_device_memory_fits(4096, 4096, "cuda device", "fits exactly");
  expect_error([] { check_device_memory_fits(uint64_t(3) << 30, uint64_t(1) << 30, "cuda device", "model folder X"); },
               "model folder X needs 3.00 GiB (3221225472 bytes) of cuda device memory for its weights, but only "
               "1.00 GiB (1073741824 bytes) are free (free on the device)");
  ScopedEnv env("MOECEL_MEMORY_LIMIT_BYTES", "1000");
  expect_error([] { check_device_memory_fits(2048, uint64_t(1) << 30, "cuda device", "model folder Y"); },
               "only 1000 bytes are free (MOECEL_MEMORY_LIMIT_BYTES)");
  check_device_memory_fits(900, uint64_t(1) << 30, "cuda device", "under the cap");
}

// A misaligned tensor must be copied at open; a 1 TiB one fails before the copy is attempted (without the check
// the allocation would fail or, with overcommit, the copy would be killed by the OOM killer).
TEST(MemoryCheck, MisalignedHugeTensorFailsBeforeCopy) {
  TempDir d;
  const std::string p = (d.path / "huge.safetensors").string();
  write_sparse_tensor(p, "BF16", uint64_t(1) << 40, 1);
  ScopedEnv env("MOECEL_MEMORY_LIMIT_BYTES", "1000000000");
  expect_error([&] { SafetensorsFile::open(p); },
               "huge.safetensors: copying its misaligned tensors needs 1.00 TiB (1099511627776 bytes) of memory");
}

// An aligned huge tensor is only mapped at open (nothing is allocated), and load_model refuses it.
TEST(MemoryCheck, LoadModelRefusesCheckpointLargerThanMemory) {
  TempDir d;
  TestModelOptions opt;
  write_test_model(opt, d.path.string());
  {
    auto f = SafetensorsFile::open((d.path / "model.safetensors").string());
    size_t total = 0;
    for (const auto& [n, t] : f->tensors()) total += t.nbytes();
    ScopedEnv env("MOECEL_MEMORY_LIMIT_BYTES", std::to_string(total - 1).c_str());
    auto be = make_backend("cpu");
    expect_error([&] { load_model(d.path.string(), *be); }, fmt::format("needs {} of memory, but only {} are available",
                                                                        format_bytes(total), format_bytes(total - 1)));
    ScopedEnv enough("MOECEL_MEMORY_LIMIT_BYTES", std::to_string(total).c_str());
    EXPECT_NO_THROW(load_model(d.path.string(), *be));
  }
  write_sparse_tensor((d.path / "model.safetensors").string(), "U8", uint64_t(1) << 40, 0);
  auto f = SafetensorsFile::open((d.path / "model.safetensors").string());  // mapped, not copied
  EXPECT_EQ(f->tensors().at("t").nbytes(), uint64_t(1) << 40);
  ::unsetenv("MOECEL_MEMORY_LIMIT_BYTES");
  if (available_memory().bytes >= (uint64_t(1) << 40)) GTEST_SKIP() << "this machine has 1 TiB available";
  auto be = make_backend("cpu");
  expect_error([&] { load_model(d.path.string(), *be); }, "needs 1.00 TiB (1099511627776 bytes) of memory");
}

}  // namespace
}  // namespace moecel
