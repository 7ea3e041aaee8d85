// safetensors reading (mmap + full validation), writing, and the model folder's shard set (WeightStore).
// Alignment: safetensors does not align data offsets, and MLX's writer (mlx-community checkpoints) leaves the
// header length unpadded, so tensors are often not aligned to their element size. Such a tensor is copied once
// into an owned 64-byte aligned buffer (kernels may then use aligned loads); aligned tensors (files written
// here or by the Python safetensors library) stay zero-copy views into the mapping.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "io/json_parse.h"
#include "io/memory_check.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Real checkpoints have headers of a few MB (tens of thousands of tensors); anything past this is corrupt.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr size_t kMaxRank = 8;

std::string json_brief(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// A JSON value that must be a non-negative integer (not a float, not a bool).
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = uint64_t(v.get<int64_t>());
    return true;
  }
  return false;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

Entry parse_entry(const std::string& path, const std::string& name, const json& v) {
  auto bad = [&](const std::string& what) { fail("{}: tensor '{}': {}", path, name, what); };
  if (name.empty()) fail("{}: header has a tensor with an empty name", path);
  // Names go into one-line error messages; no real checkpoint has a newline or other control character in one.
  if (std::any_of(name.begin(), name.end(), [](char c) { return uint8_t(c) < 0x20 || c == 0x7f; })) {
    fail("{}: tensor name {} contains a control character", path, json(name).dump());
  }
  if (!v.is_object()) bad(fmt::format("expected an object {{dtype, shape, data_offsets}}, got {}", json_brief(v)));
  for (const auto& [key, _] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") bad(fmt::format("unexpected key '{}'", key));
  }
  Entry e{name, DType::kF32, {}, 0, 0};
  auto it = v.find("dtype");
  if (it == v.end() || !it->is_string()) bad("missing string field 'dtype'");
  auto dt = dtype_from_name(it->get<std::string>());
  if (!dt) {
    bad(fmt::format("unsupported dtype '{}' (supported: F32, F16, BF16, U32, I32, U8)", it->get<std::string>()));
  }
  e.dtype = *dt;

  it = v.find("shape");
  if (it == v.end() || !it->is_array()) bad("missing array field 'shape'");
  if (it->size() > kMaxRank) bad(fmt::format("shape has {} dims (at most {} supported)", it->size(), kMaxRank));
  uint64_t numel = 1;
  for (const json& d : *it) {
    uint64_t n;
    if (!as_u64(d, &n) || n > uint64_t(std::numeric_limits<int64_t>::max())) {
      bad(fmt::format("shape {} must hold non-negative integers", json_brief(*it)));
    }
    e.shape.push_back(int64_t(n));
    if (__builtin_mul_overflow(numel, n, &numel)) bad(fmt::format("shape {} overflows", json_brief(*it)));
  }
  uint64_t nbytes;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &nbytes)) {
    bad(fmt::format("shape {} overflows", json_brief(*it)));
  }

  it = v.find("data_offsets");
  if (it == v.end() || !it->is_array() || it->size() != 2 || !as_u64((*it)[0], &e.begin) || !as_u64((*it)[1], &e.end)) {
    bad(fmt::format("'data_offsets' must be [begin, end] with non-negative integers, got {}",
                    it == v.end() ? std::string("nothing") : json_brief(*it)));
  }
  if (e.end < e.begin) bad(fmt::format("data_offsets [{}, {}]: end < begin", e.begin, e.end));
  if (e.end - e.begin != nbytes) {
    bad(fmt::format("data_offsets [{}, {}] span {} bytes, but {} x {} needs {} bytes", e.begin, e.end, e.end - e.begin,
                    dtype_name(e.dtype), shape_str(e.shape), nbytes));
  }
  return e;
}

// Owns an mmap'd region; tensors share it through Tensor::owner.
std::shared_ptr<void> map_file(const std::string& path, size_t* size_out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open ({})", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot stat ({})", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  size_t size = size_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("{}: file is {} bytes, too small for a safetensors header (truncated?)", path, size);
  }
  // Read-only: weights are never modified in place (a write would fault rather than corrupt the file).
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) fail("{}: mmap of {} bytes failed ({})", path, size, std::strerror(err));
  *size_out = size;
  return std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
}

// A 64-byte aligned owned copy (no zero-fill: every byte is overwritten).
void* copy_aligned(const void* src, size_t n, std::shared_ptr<void>* owner) {
  const size_t bytes = std::max<size_t>(64, (n + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, bytes);
  if (!p) fail("out of memory copying a {} byte tensor", n);
  std::memcpy(p, src, n);
  *owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return p;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  size_t file_size = 0;
  std::shared_ptr<void> mapping = map_file(path, &file_size);
  const auto* base = static_cast<const unsigned char*>(mapping.get());

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    fail("{}: header length {} exceeds the {} byte limit (not a safetensors file, or corrupt)", path, header_len,
         kMaxHeaderBytes);
  }
  if (header_len > file_size - 8) {
    fail("{}: header length {} runs past the end of the {} byte file (truncated?)", path, header_len, file_size);
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  json header = parse_json_strict(std::string_view(reinterpret_cast<const char*>(base + 8), size_t(header_len)),
                                  path + ": header");
  if (!header.is_object()) fail("{}: header must be a JSON object, got {}", path, json_brief(header));

  auto file = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ must be an object of strings, got {}", path, json_brief(v));
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail("{}: __metadata__['{}'] must be a string, got {}", path, k, json_brief(s));
        file->metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    Entry e = parse_entry(path, name, v);
    if (e.end > data_size) {
      fail("{}: tensor '{}': data_offsets [{}, {}] exceed the data area of {} bytes (truncated file?)", path, name,
           e.begin, e.end, data_size);
    }
    entries.push_back(std::move(e));
  }

  // Overlaps: sort non-empty ranges by start; each must begin at or after the previous one's end.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& a = *by_offset[i - 1];
    const Entry& b = *by_offset[i];
    if (b.begin < a.end) {
      fail("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", path, a.name, a.begin, a.end, b.name, b.begin, b.end);
    }
  }

  // Misaligned tensors are copied below: a file whose copies cannot fit fails here, before allocating.
  uint64_t copy_bytes = 0;
  for (const Entry& e : entries) {
    if ((data_start + e.begin) % dtype_size(e.dtype) != 0) copy_bytes += e.end - e.begin;  // <= file size
  }
  if (copy_bytes > 0) check_memory_fits(copy_bytes, fmt::format("{}: copying its misaligned tensors", path));

  for (const Entry& e : entries) {
    Tensor t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    const uint64_t offset = data_start + e.begin;
    void* src = const_cast<unsigned char*>(base) + offset;  // the mapping is read-only (PROT_READ)
    if (offset % dtype_size(e.dtype) != 0) {
      t.data = copy_aligned(src, size_t(e.end - e.begin), &t.owner);  // misaligned for its element type
    } else {
      t.data = src;
      t.owner = mapping;
    }
    file->tensors_.emplace(e.name, std::move(t));
  }
  // The mapping lives as long as any tensor view of it; with no tensors it is released on return.
  file->map_ = file->tensors_.empty() ? nullptr : mapping.get();
  file->map_size_ = file->tensors_.empty() ? 0 : file_size;
  return file;
}

// The mapping is owned by the tensor views (shared owner), so tensors outlive the file object safely.
SafetensorsFile::~SafetensorsFile() = default;

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Largest elements first keeps every tensor aligned to its element size (the data area starts 8-aligned).
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype) > dtype_size(tensors[b].second.dtype);
  });

  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    MOECEL_CHECK(!name.empty() && name != "__metadata__", "{}: invalid tensor name '{}'", path, name);
    MOECEL_CHECK(!header.contains(name), "{}: duplicate tensor name '{}'", path, name);
    MOECEL_CHECK(t.device == Device::kCpu, "{}: tensor '{}' must be on the host to be written", path, name);
    for (int64_t d : t.shape) MOECEL_CHECK(d >= 0, "{}: tensor '{}' has a negative dim {}", path, name, d);
    MOECEL_CHECK(t.data != nullptr || t.numel() == 0, "{}: tensor '{}' has no data", path, name);
    const uint64_t n = t.nbytes();
    header[name] = {
        {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // spaces are valid JSON padding

  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("{}: cannot create ({})", tmp, std::strerror(errno));
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(text.data(), std::streamsize(text.size()));
    for (size_t i : order) {
      const Tensor& t = tensors[i].second;
      if (t.nbytes() > 0) f.write(static_cast<const char*>(t.data), std::streamsize(t.nbytes()));
    }
    f.close();
    if (!f) fail("{}: write failed (disk full?)", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("{}: cannot rename {} into place ({})", path, tmp, ec.message());
}

namespace {

const char* kIndexName = "model.safetensors.index.json";

void add_file(std::vector<std::shared_ptr<SafetensorsFile>>& files, std::map<std::string, Tensor>& tensors,
              std::map<std::string, std::string>& file_of, std::shared_ptr<SafetensorsFile> f) {
  for (const auto& [name, t] : f->tensors()) {
    auto it = file_of.find(name);
    if (it != file_of.end()) fail("tensor {} appears in both {} and {}", name, it->second, f->path());
    tensors.emplace(name, t);
    file_of.emplace(name, f->path());
  }
  files.push_back(std::move(f));
}

}  // namespace

WeightStore WeightStore::open_folder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("model folder {} does not exist or is not a directory", dir);
  WeightStore ws;
  ws.dir_ = dir;
  const fs::path root(dir);
  const fs::path index_path = root / kIndexName;

  if (fs::exists(index_path, ec)) {
    const std::string ip = index_path.string();
    json index = parse_json_strict(read_text_file(ip), ip);
    if (!index.is_object()) fail("{}: must be a JSON object", ip);
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) fail("{}: missing object field 'weight_map'", ip);
    if (wm->empty()) fail("{}: 'weight_map' lists no tensors", ip);
    // shard file -> tensors the index assigns to it
    std::map<std::string, std::set<std::string>> assigned;
    for (const auto& [name, v] : wm->items()) {
      if (!v.is_string()) fail("{}: weight_map['{}'] must be a file name string, got {}", ip, name, json_brief(v));
      const std::string file = v.get<std::string>();
      // Shards live next to the index; a path could escape the model folder.
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
          file.find('\\') != std::string::npos) {
        fail("{}: weight_map['{}'] = '{}' must be a plain file name in the model folder", ip, name, file);
      }
      assigned[file].insert(name);
    }
    for (const auto& [file, names] : assigned) {
      const fs::path p = root / file;
      if (!fs::is_regular_file(p, ec)) {
        fail("{}: shard '{}' (holding {} tensors, e.g. {}) does not exist in {}", ip, file, names.size(),
             *names.begin(), dir);
      }
      auto f = SafetensorsFile::open(p.string());
      for (const auto& [name, t] : f->tensors()) {
        if (!names.count(name)) {
          auto other = wm->find(name);
          if (other == wm->end()) {
            fail("{}: shard '{}' holds tensor {}, which the index does not list", ip, file, name);
          }
          fail("{}: shard '{}' holds tensor {}, which the index assigns to '{}'", ip, file, name,
               other->get<std::string>());
        }
      }
      for (const std::string& name : names) {
        if (!f->tensors().count(name)) {
          fail("{}: the index assigns tensor {} to shard '{}', which does not contain it", ip, name, file);
        }
      }
      add_file(ws.files_, ws.tensors_, ws.file_of_, std::move(f));
    }
    return ws;
  }

  const fs::path single = root / "model.safetensors";
  if (fs::exists(single, ec)) {
    add_file(ws.files_, ws.tensors_, ws.file_of_, SafetensorsFile::open(single.string()));
    return ws;
  }
  std::vector<fs::path> found;
  for (const auto& de : fs::directory_iterator(root, ec)) {
    if (de.is_regular_file() && de.path().extension() == ".safetensors") found.push_back(de.path());
  }
  if (ec) fail("model folder {}: cannot list ({})", dir, ec.message());
  if (found.empty()) fail("model folder {} has no model.safetensors, {} or *.safetensors file", dir, kIndexName);
  std::sort(found.begin(), found.end());
  for (const fs::path& p : found) add_file(ws.files_, ws.tensors_, ws.file_of_, SafetensorsFile::open(p.string()));
  return ws;
}

const Tensor& WeightStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("missing tensor {} in {}", name, dir_);
  used_.insert(name);
  return it->second;
}

std::vector<std::string> WeightStore::unused() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : tensors_) {
    if (!used_.count(name)) out.push_back(name);
  }
  return out;
}

const std::string& WeightStore::file_of(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) fail("missing tensor {} in {}", name, dir_);
  return it->second;
}

}  // namespace moecel
