// Fuzzes the safetensors reader and the tensor validation built on it. The input is written to a file and
// opened like a checkpoint; every tensor handed out is read in full, and tensor triples (weight, scales, biases)
// go through LinearWeight's checked factories with every allowed (bits, group size). An input starting with '{'
// is instead a model.safetensors.index.json for a folder of two fixed shards.
// Anything but moecel::Error escaping, any sanitizer report or any fault is a finding.
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "fuzz_common.h"
#include "io/safetensors.h"
#include "quant/qweight.h"

using namespace moecel;

namespace {

volatile uint64_t g_sink;

const std::string& shard_dir() {
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/sharded";
    std::filesystem::create_directories(d);
    Tensor a = make_host_tensor(DType::kF32, {2, 3}), b = make_host_tensor(DType::kBF16, {4});
    Tensor c = make_host_tensor(DType::kU32, {2, 2});
    std::memset(a.data, 0, a.nbytes());
    std::memset(b.data, 0, b.nbytes());
    std::memset(c.data, 0, c.nbytes());
    write_safetensors(d + "/model-00001-of-00002.safetensors", {{"a.weight", a}, {"b", b}});
    write_safetensors(d + "/model-00002-of-00002.safetensors", {{"c.weight", c}});
    return d;
  }();
  return dir;
}

void validate(const std::map<std::string, Tensor>& tensors) {
  for (const auto& [name, t] : tensors) g_sink = g_sink + fuzz::touch(t.data, t.nbytes());
  for (const auto& [name, t] : tensors) {
    const bool has_suffix = name.size() > 7 && name.ends_with(".weight");
    if (!has_suffix) continue;
    const std::string prefix = name.substr(0, name.size() - 7);
    for (bool stacked : {false, true}) {
      try {
        LinearWeight w = LinearWeight::dense_from(prefix, t, stacked);
        g_sink = g_sink + w.total_bytes() + w.bytes_per_slice();
      } catch (const Error&) {
      }
    }
    auto s = tensors.find(prefix + ".scales"), b = tensors.find(prefix + ".biases");
    if (s == tensors.end() || b == tensors.end()) continue;
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      for (int gs : {32, 64, 128}) {
        for (bool stacked : {false, true}) {
          try {
            LinearWeight w = LinearWeight::quantized_from(prefix, t, s->second, b->second, {bits, gs}, stacked);
            g_sink = g_sink + w.total_bytes() + w.bytes_per_slice();
          } catch (const Error&) {
          }
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    if (size > 0 && data[0] == '{') {
      const std::string& dir = shard_dir();
      fuzz::write_file(dir + "/model.safetensors.index.json", bytes);
      WeightStore ws = WeightStore::open_folder(dir);
      validate(ws.all());
      for (const auto& [name, _] : ws.all()) g_sink = g_sink + ws.file_of(name).size();
    } else {
      const std::string path = fuzz::scratch_dir() + "/input.safetensors";
      fuzz::write_file(path, bytes);
      auto f = SafetensorsFile::open(path);
      validate(f->tensors());
      for (const auto& [k, v] : f->metadata()) g_sink = g_sink + k.size() + v.size();
    }
  } catch (const Error&) {
  }
  return 0;
}
