// Helpers that break a valid checkpoint folder in one place: safetensors header and data edits at the byte
// level, config.json edits, tensor list rewrites through the project's writer, shard splitting, sparse huge
// tensors. Used by test_broken_corpus.cpp.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli_runner.h"
#include "io/safetensors.h"

namespace moecel::test {

inline const char* kSt = "model.safetensors";

// A safetensors file split into its parts: header JSON and the data area.
struct StParts {
  nlohmann::json header;
  std::string data;
};

inline StParts read_st(const std::string& path) {
  const std::string bytes = read_text(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

// Writes an 8-byte length (the real one unless `claimed_len` is given), the header text and the data.
inline void write_raw(const std::string& path, const std::string& header, const std::string& data,
                      std::optional<uint64_t> claimed_len = std::nullopt) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = claimed_len.value_or(header.size());
  for (int i = 0; i < 8; ++i) f.put(char(uint8_t(n >> (8 * i))));
  f << header << data;
}

inline void write_st(const std::string& path, const StParts& p) {
  std::string h = p.header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data area 8-aligned like the writer does
  write_raw(path, h, p.data);
}

inline void edit_header(const std::string& dir, const std::function<void(nlohmann::json&, std::string&)>& edit) {
  StParts p = read_st(dir + "/" + kSt);
  edit(p.header, p.data);
  write_st(dir + "/" + kSt, p);
}

inline void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_text(dir + "/config.json"));
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(1);
}

using TensorList = std::vector<std::pair<std::string, Tensor>>;

// Rewrites the folder's tensors through the project's writer after `edit` changed the list.
inline void edit_tensors(const std::string& dir, const std::function<void(TensorList&)>& edit) {
  TensorList list;
  {
    WeightStore store = WeightStore::open_folder(dir);
    for (const auto& [name, t] : store.all()) {
      Tensor copy = make_host_tensor(t.dtype, t.shape);
      std::memcpy(copy.data, t.data, t.nbytes());
      list.emplace_back(name, copy);
    }
  }
  edit(list);
  write_safetensors(dir + "/" + kSt, list);
}

inline Tensor zeros(DType dtype, Shape shape) {
  Tensor t = make_host_tensor(dtype, shape);
  std::memset(t.data, 0, t.nbytes());
  return t;
}

inline void replace(TensorList& list, const std::string& name, Tensor t) {
  for (auto& [n, v] : list) {
    if (n == name) v = t;
  }
}

inline void erase_tensor(TensorList& list, const std::string& name) {
  std::erase_if(list, [&](const auto& p) { return p.first == name; });
}

inline std::string nested(char open, char close, int depth) {
  return std::string(size_t(depth), open) + std::string(size_t(depth), close);
}

// Splits the folder's tensors over two shards and writes the index; returns the weight map.
inline nlohmann::json shard(const std::string& dir) {
  TensorList a, b;
  {
    WeightStore store = WeightStore::open_folder(dir);
    for (const auto& [name, t] : store.all()) {
      Tensor copy = make_host_tensor(t.dtype, t.shape);
      std::memcpy(copy.data, t.data, t.nbytes());
      (name.find("layers.1.") == std::string::npos ? a : b).emplace_back(name, copy);
    }
  }
  std::filesystem::remove(dir + "/" + kSt);
  nlohmann::json wm = nlohmann::json::object();
  write_safetensors(dir + "/model-00001-of-00002.safetensors", a);
  write_safetensors(dir + "/model-00002-of-00002.safetensors", b);
  for (const auto& [n, _] : a) wm[n] = "model-00001-of-00002.safetensors";
  for (const auto& [n, _] : b) wm[n] = "model-00002-of-00002.safetensors";
  return wm;
}

inline void write_index(const std::string& dir, const nlohmann::json& wm) {
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", wm}};
}

// Appends a tensor that claims 1 TiB, backed by a sparse hole at the end of the file (no disk space used).
// `misalign` places it at an odd offset so that loading would have to copy it.
inline void add_huge_tensor(const std::string& dir, bool misalign) {
  StParts p = read_st(dir + "/" + kSt);
  const uint64_t begin = p.data.size() + (misalign ? 1 : 0), size = uint64_t(1) << 40;
  p.header["model.layers.0.mlp.huge.weight"] = {{"dtype", misalign ? "BF16" : "U8"},
                                                {"shape", {misalign ? size / 2 : size}},
                                                {"data_offsets", {begin, begin + size}}};
  write_st(dir + "/" + kSt, p);
  std::filesystem::resize_file(dir + "/" + kSt,
                               std::filesystem::file_size(dir + "/" + kSt) + (begin - p.data.size()) + size);
}

// Whether s is well-formed UTF-8 (a message must never carry raw bytes from a broken file).
inline bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = uint8_t(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((uint8_t(s[i + k]) >> 6) != 2) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace moecel::test
