// safetensors reader/writer and WeightStore: round trips, every malformed-file case we could think of (each
// must fail with a specific message, never crash), misaligned tensors, and sharded folders with an index.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/half.h"
#include "expect_error.h"
#include "io/safetensors.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("moecel-st-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// A raw file: 8-byte little-endian length (`len_field`, default the header's size), header, data.
void write_raw(const std::string& path, const std::string& header, const std::string& data = "",
               std::optional<uint64_t> len_field = std::nullopt) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = len_field.value_or(header.size());
  for (int i = 0; i < 8; ++i) f.put(char((n >> (8 * i)) & 0xff));
  f << header << data;
}

Tensor f32_tensor(Shape shape, float start) {
  Tensor t = make_host_tensor(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = start + float(i);
  return t;
}

Tensor u32_tensor(Shape shape, uint32_t start) {
  Tensor t = make_host_tensor(DType::kU32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint32_t>()[i] = start * 1000u + uint32_t(i);
  return t;
}

TEST(Safetensors, RoundTripAllDtypesAndMetadata) {
  TempDir dir;
  Tensor bf = make_host_tensor(DType::kBF16, {3});
  for (int i = 0; i < 3; ++i) bf.ptr<uint16_t>()[i] = f32_to_bf16(1.5f * float(i));
  Tensor hf = make_host_tensor(DType::kF16, {});  // scalar
  hf.ptr<uint16_t>()[0] = f32_to_f16(-2.25f);
  Tensor u8 = make_host_tensor(DType::kU8, {5});
  for (int i = 0; i < 5; ++i) u8.ptr<uint8_t>()[i] = uint8_t(250 + i);
  Tensor i32 = make_host_tensor(DType::kI32, {2});
  i32.ptr<int32_t>()[0] = -7;
  i32.ptr<int32_t>()[1] = 1 << 30;
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"u8", u8},  // written first in the list: the writer must still keep everything aligned
      {"a.weight", f32_tensor({2, 3}, 1.0f)},
      {"b.bf16", bf},
      {"c.scalar", hf},
      {"d.packed", u32_tensor({2, 2}, 7)},
      {"e.empty", make_host_tensor(DType::kF32, {0, 4})},
      {"f.i32", i32},
  };
  write_safetensors(dir.file("x.safetensors"), ts, {{"format", "mlx"}, {"note", "round trip"}});
  auto f = SafetensorsFile::open(dir.file("x.safetensors"));
  ASSERT_EQ(f->tensors().size(), ts.size());
  EXPECT_EQ(f->metadata().at("format"), "mlx");
  EXPECT_EQ(f->metadata().at("note"), "round trip");
  for (const auto& [name, t] : ts) {
    const Tensor& got = f->tensors().at(name);
    EXPECT_EQ(got.dtype, t.dtype) << name;
    EXPECT_EQ(got.shape, t.shape) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data) % dtype_size(got.dtype), 0u) << name;
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(got.data, t.data, t.nbytes()), 0) << name;
    }
  }
  EXPECT_EQ(f->tensors().at("c.scalar").shape, Shape{});
  EXPECT_EQ(f16_to_f32(f->tensors().at("c.scalar").ptr<uint16_t>()[0]), -2.25f);
  // The writer pads the header so data starts 8-aligned, and leaves no holes: header + data == file size.
  uint64_t header_len = 0, data_bytes = 0;
  std::ifstream(dir.file("x.safetensors"), std::ios::binary).read(reinterpret_cast<char*>(&header_len), 8);
  for (const auto& [name, t] : ts) data_bytes += t.nbytes();
  EXPECT_EQ((8 + header_len) % 8, 0u);
  EXPECT_EQ(fs::file_size(dir.file("x.safetensors")), 8 + header_len + data_bytes);
  EXPECT_FALSE(fs::exists(dir.file("x.safetensors.tmp")));
}

TEST(Safetensors, TensorsOutliveTheFileObject) {
  TempDir dir;
  write_safetensors(dir.file("x.safetensors"), {{"w", f32_tensor({4, 4}, 3.0f)}});
  Tensor keep;
  {
    auto f = SafetensorsFile::open(dir.file("x.safetensors"));
    keep = f->tensors().at("w");
  }
  EXPECT_EQ(keep.ptr<float>()[15], 18.0f);  // the mapping is kept alive by the tensor
}

TEST(Safetensors, HeaderOnlyFileHasNoTensors) {
  TempDir dir;
  write_raw(dir.file("e.safetensors"), "{}");
  EXPECT_TRUE(SafetensorsFile::open(dir.file("e.safetensors"))->tensors().empty());
  write_raw(dir.file("m.safetensors"), R"({"__metadata__": {"format": "pt"}})");
  EXPECT_EQ(SafetensorsFile::open(dir.file("m.safetensors"))->metadata().at("format"), "pt");
}

TEST(Safetensors, MisalignedTensorsAreCopiedToAlignedMemory) {
  TempDir dir;
  // One space of padding makes the data area start at 8 + N with (8 + N) % 4 == 1: both tensors misaligned,
  // as MLX's own writer commonly produces.
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U32","shape":[1],)"
                       R"("data_offsets":[8,12]},"c":{"dtype":"U8","shape":[3],"data_offsets":[12,15]}})";
  while ((8 + header.size()) % 4 != 1) header += ' ';
  std::string data(15, '\0');
  float a[2] = {1.25f, -3.5f};
  uint32_t b = 0xdeadbeef;
  std::memcpy(&data[0], a, 8);
  std::memcpy(&data[8], &b, 4);
  data[12] = 1, data[13] = 2, data[14] = 3;
  write_raw(dir.file("m.safetensors"), header, data);
  auto f = SafetensorsFile::open(dir.file("m.safetensors"));
  const Tensor& ta = f->tensors().at("a");
  const Tensor& tb = f->tensors().at("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta.data) % 4, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tb.data) % 4, 0u);
  EXPECT_EQ(ta.ptr<float>()[0], 1.25f);
  EXPECT_EQ(ta.ptr<float>()[1], -3.5f);
  EXPECT_EQ(tb.ptr<uint32_t>()[0], 0xdeadbeefu);
  EXPECT_EQ(f->tensors().at("c").ptr<uint8_t>()[2], 3);  // U8 is always aligned: a view
}

// One tensor entry as JSON text.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

struct Malformed {
  const char* what;
  std::string header;
  size_t data_bytes;
  const char* error;
};

TEST(Safetensors, MalformedHeadersAreRejectedWithSpecificErrors) {
  TempDir dir;
  const std::vector<Malformed> cases = {
      {"non-JSON header", "{\"a\": nope}", 0, "invalid JSON"},
      {"non-object header", "[1, 2, 3]", 0, "header must be a JSON object"},
      {"string header", "\"hello\"", 0, "header must be a JSON object"},
      {"entry not an object", "{\"a\": 5}", 0, "tensor 'a': expected an object"},
      {"unknown dtype", "{" + entry("a", "F64", "[2]", 0, 16) + "}", 16, "unsupported dtype 'F64'"},
      {"dtype not a string", R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4,
       "missing string field 'dtype'"},
      {"missing shape", R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4, "missing array field 'shape'"},
      {"negative dim", "{" + entry("a", "F32", "[-1,2]", 0, 8) + "}", 8, "must hold non-negative integers"},
      {"fractional dim", "{" + entry("a", "F32", "[2.5]", 0, 8) + "}", 8, "must hold non-negative integers"},
      {"bool dim", "{" + entry("a", "F32", "[true]", 0, 4) + "}", 4, "must hold non-negative integers"},
      {"dim beyond int64", "{" + entry("a", "U8", "[18446744073709551615]", 0, 4) + "}", 4,
       "must hold non-negative integers"},
      {"absurd shape", "{" + entry("a", "F32", "[4611686018427387904,4611686018427387904]", 0, 4) + "}", 4,
       "overflows"},
      {"element bytes overflow", "{" + entry("a", "F32", "[4611686018427387904]", 0, 4) + "}", 4, "overflows"},
      {"too many dims", "{" + entry("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) + "}", 4, "9 dims"},
      {"offsets out of range", "{" + entry("a", "F32", "[4]", 0, 16) + "}", 8, "exceed the data area of 8 bytes"},
      {"end < begin", "{" + entry("a", "F32", "[0]", 8, 4) + "}", 8, "end < begin"},
      {"size mismatch", "{" + entry("a", "F32", "[2,3]", 0, 20) + "}", 24, "but F32 x (2, 3) needs 24 bytes"},
      {"offsets not a pair", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "'data_offsets' must be"},
      {"negative offset", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4, "'data_offsets' must be"},
      {"missing offsets", R"({"a":{"dtype":"F32","shape":[1]}})", 4, "'data_offsets' must be"},
      {"unexpected key", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4, "unexpected key 'x'"},
      {"overlap", "{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("b", "F32", "[2]", 8, 16) + "}", 16, "overlap"},
      {"identical ranges", "{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "U32", "[2]", 0, 8) + "}", 8,
       "overlap"},
      {"duplicate names", "{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("a", "F32", "[1]", 4, 8) + "}", 8,
       "duplicate key 'a'"},
      {"duplicate key inside an entry", R"({"a":{"dtype":"F32","dtype":"U8","shape":[1],"data_offsets":[0,4]}})", 4,
       "duplicate key 'dtype'"},
      {"metadata not an object", R"({"__metadata__": [1]})", 0, "__metadata__ must be an object of strings"},
      {"metadata value not a string", R"({"__metadata__": {"k": 1}})", 0, "__metadata__['k'] must be a string"},
      {"empty name", "{" + entry("", "F32", "[1]", 0, 4) + "}", 4, "empty name"},
      {"deep nesting", std::string(200, '[') + std::string(200, ']'), 0, "nested deeper than"},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = dir.file("bad.safetensors");
    write_raw(path, c.header, std::string(c.data_bytes, '\x01'));
    expect_error([&] { SafetensorsFile::open(path); }, c.error);
  }
}

TEST(Safetensors, MalformedFilesAreRejected) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  { std::ofstream(path, std::ios::binary); }
  expect_error([&] { SafetensorsFile::open(path); }, "too small for a safetensors header");
  { std::ofstream(path, std::ios::binary) << "abc"; }
  expect_error([&] { SafetensorsFile::open(path); }, "file is 3 bytes, too small");
  write_raw(path, "{}", "", uint64_t(100));  // header length past the end of the file
  expect_error([&] { SafetensorsFile::open(path); }, "header length 100 runs past the end of the 10 byte file");
  write_raw(path, "{}", "", uint64_t(1) << 40);  // absurd header length
  expect_error([&] { SafetensorsFile::open(path); }, "exceeds the 104857600 byte limit");
  write_raw(path, "{}", "", ~uint64_t(0));  // would overflow 8 + N
  expect_error([&] { SafetensorsFile::open(path); }, "exceeds the 104857600 byte limit");
  // Truncated: a valid header whose data was cut short.
  write_safetensors(path, {{"w", f32_tensor({16}, 0.0f)}});
  fs::resize_file(path, fs::file_size(path) - 4);
  expect_error([&] { SafetensorsFile::open(path); }, "exceed the data area of 60 bytes (truncated file?)");
  // Truncated inside the header.
  write_safetensors(path, {{"w", f32_tensor({16}, 0.0f)}});
  fs::resize_file(path, 20);
  expect_error([&] { SafetensorsFile::open(path); }, "runs past the end of the 20 byte file");
  expect_error([&] { SafetensorsFile::open(dir.file("missing.safetensors")); }, "cannot open");
  expect_error([&] { SafetensorsFile::open(dir.str()); }, "not a regular file");
}

TEST(Safetensors, ErrorsNameTheFileAndTensor) {
  TempDir dir;
  const std::string path = dir.file("named.safetensors");
  write_raw(path, "{" + entry("model.layers.3.mlp.gate.weight", "BF16", "[4]", 0, 6) + "}", std::string(6, 'x'));
  expect_error([&] { SafetensorsFile::open(path); }, path + ": tensor 'model.layers.3.mlp.gate.weight': data_offsets");
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  Tensor t = f32_tensor({2}, 0.0f);
  expect_error(
      [&] {
        write_safetensors(dir.file("w.safetensors"), {{"a", t}, {"a", t}});
      },
      "duplicate tensor name 'a'");
  expect_error([&] { write_safetensors(dir.file("w.safetensors"), {{"__metadata__", t}}); }, "invalid tensor name");
  expect_error([&] { write_safetensors(dir.str() + "/no/such/dir/w.safetensors", {{"a", t}}); }, "cannot create");
}

// ---- WeightStore ----

TEST(SafetensorsFolder, SingleFile) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), {{"a", f32_tensor({2}, 1.0f)}, {"b", f32_tensor({3}, 5.0f)}});
  WeightStore ws = WeightStore::open_folder(dir.str());
  EXPECT_TRUE(ws.has("a"));
  EXPECT_FALSE(ws.has("c"));
  EXPECT_EQ(ws.all().size(), 2u);
  EXPECT_EQ(ws.unused(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ws.get("b").ptr<float>()[2], 7.0f);
  EXPECT_EQ(ws.unused(), (std::vector<std::string>{"a"}));
  EXPECT_EQ(ws.file_of("a"), dir.file("model.safetensors"));
  expect_error([&] { ws.get("model.norm.weight"); }, "missing tensor model.norm.weight in " + dir.str());
}

void write_index(const TempDir& dir, const std::string& weight_map) {
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"metadata": {"total_size": 1}, "weight_map": {)" << weight_map << "}}";
}

void write_two_shards(const TempDir& dir) {
  write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                    {{"a", f32_tensor({2}, 1.0f)}, {"b", f32_tensor({2}, 3.0f)}});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"c", u32_tensor({2}, 1)}});
}

const char* kGoodMap =
    R"("a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
       "c": "model-00002-of-00002.safetensors")";

TEST(SafetensorsFolder, ShardedWithIndex) {
  TempDir dir;
  write_two_shards(dir);
  write_index(dir, kGoodMap);
  // A stray single file must be ignored when the index exists.
  write_safetensors(dir.file("model.safetensors"), {{"zzz", f32_tensor({1}, 0.0f)}});
  WeightStore ws = WeightStore::open_folder(dir.str());
  EXPECT_EQ(ws.all().size(), 3u);
  EXPECT_EQ(ws.get("c").ptr<uint32_t>()[1], 1001u);
  EXPECT_EQ(ws.file_of("c"), dir.file("model-00002-of-00002.safetensors"));
  EXPECT_FALSE(ws.has("zzz"));
}

TEST(SafetensorsFolder, IndexErrors) {
  TempDir dir;
  write_two_shards(dir);
  auto open = [&] { WeightStore::open_folder(dir.str()); };
  write_index(dir, R"("a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                      "c": "model-00003-of-00002.safetensors")");
  expect_error(open, "shard 'model-00003-of-00002.safetensors' (holding 1 tensors, e.g. c) does not exist");
  write_index(dir, R"("a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                      "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors")");
  expect_error(open, "assigns tensor d to shard 'model-00002-of-00002.safetensors', which does not contain it");
  write_index(dir, R"("a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors")");
  expect_error(open, "shard 'model-00001-of-00002.safetensors' holds tensor b, which the index does not list");
  write_index(dir, R"("a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                      "c": "model-00002-of-00002.safetensors")");
  expect_error(open, "holds tensor b, which the index assigns to 'model-00002-of-00002.safetensors'");
  write_index(dir, R"("a": "../model-00001-of-00002.safetensors")");
  expect_error(open, "must be a plain file name in the model folder");
  write_index(dir, R"("a": 3)");
  expect_error(open, "weight_map['a'] must be a file name string");
  write_index(dir, R"("a": "x.safetensors", "a": "y.safetensors")");
  expect_error(open, "duplicate key 'a'");
  write_index(dir, "");
  expect_error(open, "'weight_map' lists no tensors");
  std::ofstream(dir.file("model.safetensors.index.json")) << R"({"metadata": {}})";
  expect_error(open, "missing object field 'weight_map'");
  std::ofstream(dir.file("model.safetensors.index.json")) << "{not json";
  expect_error(open, "model.safetensors.index.json: invalid JSON");
  std::ofstream(dir.file("model.safetensors.index.json")) << "[]";
  expect_error(open, "must be a JSON object");
  // A shard that is itself corrupt is reported by its own path.
  write_index(dir, kGoodMap);
  write_raw(dir.file("model-00002-of-00002.safetensors"), "{oops");
  expect_error(open, "model-00002-of-00002.safetensors: header: invalid JSON");
}

TEST(SafetensorsFolder, GlobWithoutIndexAndFolderErrors) {
  TempDir dir;
  expect_error([&] { WeightStore::open_folder(dir.str()); }, "has no model.safetensors");
  expect_error([&] { WeightStore::open_folder(dir.file("nope")); }, "does not exist");
  write_two_shards(dir);
  WeightStore ws = WeightStore::open_folder(dir.str());
  EXPECT_EQ(ws.all().size(), 3u);
  write_safetensors(dir.file("extra.safetensors"), {{"b", f32_tensor({1}, 0.0f)}});
  expect_error([&] { WeightStore::open_folder(dir.str()); }, "tensor b appears in both");
}

}  // namespace
}  // namespace moecel
