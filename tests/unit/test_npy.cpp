// .npy float32 files: files written by NumPy (tests/golden/npy, from tools/reference/npy_goldens.py) read
// correctly, our files round trip, and malformed files fail with specific messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "expect_error.h"
#include "io/npy.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;

std::string golden(const std::string& name) {
  return std::string(MOECEL_SOURCE_DIR) + "/tests/golden/npy/" + name;
}

std::string temp_file(const std::string& name) {
  static std::atomic<int> counter{0};
  return (fs::temp_directory_path() /
          ("moecel-npy-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + "-" + name))
      .string();
}

TEST(Npy, ReadsFilesWrittenByNumpy) {
  NpyArray a = read_npy(golden("f32_2x3.npy"));
  EXPECT_EQ(a.shape, (Shape{2, 3}));
  EXPECT_EQ(a.data, (std::vector<float>{-0.625f, -0.375f, -0.125f, 0.125f, 0.375f, 0.625f}));
  for (const char* v : {"f32_v2.npy", "f32_v3.npy"}) {
    NpyArray b = read_npy(golden(v));
    EXPECT_EQ(b.shape, a.shape) << v;
    EXPECT_EQ(b.data, a.data) << v;
  }
  NpyArray d1 = read_npy(golden("f32_1d.npy"));
  EXPECT_EQ(d1.shape, (Shape{4}));
  EXPECT_EQ(d1.data, (std::vector<float>{1.0f, -2.0f, 3.5f, 1e-30f}));
  NpyArray s = read_npy(golden("f32_scalar.npy"));
  EXPECT_EQ(s.shape, Shape{});
  EXPECT_EQ(s.data, std::vector<float>{7.25f});
  NpyArray e = read_npy(golden("f32_empty.npy"));
  EXPECT_EQ(e.shape, (Shape{0, 5}));
  EXPECT_TRUE(e.data.empty());
  NpyArray t = read_npy(golden("f32_3d.npy"));
  EXPECT_EQ(t.shape, (Shape{2, 3, 4}));
  EXPECT_EQ(t.data[23], 23.0f);
}

TEST(Npy, RejectsOtherDtypesAndOrders) {
  expect_error([] { read_npy(golden("f64.npy")); }, "dtype '<f8' is not supported (expected '<f4', float32)");
  expect_error([] { read_npy(golden("f32_big_endian.npy")); }, "dtype '>f4' is not supported");
  expect_error([] { read_npy(golden("f32_fortran.npy")); }, "fortran_order True is not supported");
}

TEST(Npy, RoundTrip) {
  const std::string p = temp_file("rt.npy");
  std::vector<float> m = {1.5f, -2.0f, 0.0f, 3.25f, 1e-20f, -7.0f};
  write_npy(p, {2, 3}, m.data());
  NpyArray a = read_npy(p);
  EXPECT_EQ(a.shape, (Shape{2, 3}));
  EXPECT_EQ(a.data, m);
  EXPECT_EQ(fs::file_size(p), 128u + 24u);  // header padded to 64 bytes, as NumPy does
  write_npy(p, NpyArray{{6}, m});
  a = read_npy(p);
  EXPECT_EQ(a.shape, (Shape{6}));
  EXPECT_EQ(a.data, m);
  // The bytes match what NumPy writes for the same array.
  write_npy(p, {2, 3}, read_npy(golden("f32_2x3.npy")).data.data());
  std::ifstream mine(p, std::ios::binary), theirs(golden("f32_2x3.npy"), std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(mine), {}),
            std::string(std::istreambuf_iterator<char>(theirs), {}));
  expect_error([&] { write_npy(p, NpyArray{{4}, m}); }, "shape (4,) needs 4 floats, got 6");
  expect_error([&] { write_npy(p, {-1, 2}, m.data()); }, "cannot write negative shape");
  fs::remove(p);
}

// A .npy file with the given version, header text (padded as given) and data length.
void write_custom(const std::string& path, int major, const std::string& header, size_t data_bytes,
                  const std::string& magic = "\x93NUMPY") {
  std::ofstream f(path, std::ios::binary);
  f << magic;
  f.put(char(major));
  f.put(0);
  const uint32_t n = uint32_t(header.size());
  f.put(char(n & 0xff));
  f.put(char((n >> 8) & 0xff));
  if (major >= 2) {
    f.put(char((n >> 16) & 0xff));
    f.put(char(n >> 24));
  }
  f << header << std::string(data_bytes, '\0');
}

TEST(Npy, MalformedFiles) {
  const std::string p = temp_file("bad.npy");
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
  write_custom(p, 1, good, 24);
  EXPECT_EQ(read_npy(p).shape, (Shape{2, 3}));  // the helper itself writes valid files

  write_custom(p, 1, good, 20);
  expect_error([&] { read_npy(p); }, "shape (2, 3) needs 24 bytes of data, the file has 20");
  write_custom(p, 1, good, 28);
  expect_error([&] { read_npy(p); }, "needs 24 bytes of data, the file has 28");
  write_custom(p, 1, good, 24, "\x93NUMPX");
  expect_error([&] { read_npy(p); }, "not a .npy file (bad magic)");
  write_custom(p, 4, good, 24);
  expect_error([&] { read_npy(p); }, "unsupported .npy version 4.0");
  write_custom(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }\n", 24);
  expect_error([&] { read_npy(p); }, "malformed .npy shape '(-2, 3)'");
  write_custom(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5), }\n", 20);
  expect_error([&] { read_npy(p); }, "malformed .npy shape '(5)'");
  write_custom(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", 4);
  expect_error([&] { read_npy(p); }, "malformed .npy shape");
  write_custom(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }\n", 4);
  expect_error([&] { read_npy(p); }, "overflows");
  write_custom(p, 1, "{'descr': '<f4', 'fortran_order': False}\n", 4);
  expect_error([&] { read_npy(p); }, "header lacks 'shape'");
  write_custom(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}\n", 4);
  expect_error([&] { read_npy(p); }, "unexpected keys");
  write_custom(p, 1, "{'descr': '<f4', 'descr': '<f4', 'shape': (1,)}\n", 4);
  expect_error([&] { read_npy(p); }, "duplicate key 'descr'");
  write_custom(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)\n", 4);
  expect_error([&] { read_npy(p); }, "malformed .npy header");
  write_custom(p, 1, "not a dict", 4);
  expect_error([&] { read_npy(p); }, "malformed .npy header at offset 0: expected '{'");
  write_custom(p, 2, good, 24);
  fs::resize_file(p, 40);  // cut inside the header
  expect_error([&] { read_npy(p); }, "runs past the end of the 40 byte file");
  { std::ofstream(p, std::ios::binary) << "\x93NUM"; }
  expect_error([&] { read_npy(p); }, "too short to be a .npy file (4 bytes)");
  expect_error([&] { read_npy(p + ".missing"); }, "cannot open");
  fs::remove(p);
}

}  // namespace
}  // namespace moecel
