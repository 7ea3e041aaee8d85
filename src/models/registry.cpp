// model_type -> architecture. Adding a family: one file in src/models/ and one line here.
#include "models/registry.h"

#include <fmt/ranges.h>

#include <filesystem>

#include "core/error.h"
#include "io/memory_check.h"
#include "runtime/progress.h"

namespace moecel {

const Architecture& olmoe_architecture();
const Architecture& qwen2_moe_architecture();
const Architecture& qwen3_moe_architecture();
const Architecture& mixtral_architecture();
const Architecture& dots1_architecture();

namespace {

const std::vector<const Architecture*>& all() {
  static const std::vector<const Architecture*> archs = {&olmoe_architecture(), &qwen2_moe_architecture(),
                                                         &qwen3_moe_architecture(), &mixtral_architecture(),
                                                         &dots1_architecture()};
  return archs;
}

}  // namespace

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const Architecture* a : all()) names.push_back(a->model_type);
  return names;
}

const Architecture& find_architecture(const std::string& model_type) {
  for (const Architecture* a : all()) {
    if (a->model_type == model_type) return *a;
  }
  fail("unknown model_type '{}': supported are {}", model_type, fmt::join(architecture_names(), ", "));
}

std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend) {
  MOECEL_CHECK(std::filesystem::is_directory(dir), "model folder {} does not exist or is not a directory", dir);
  ModelConfig config = ModelConfig::load(dir);
  const Architecture& arch = find_architecture(config.model_type());
  WeightStore store = WeightStore::open_folder(dir);
  // CPU weights stay resident (mmap views or aligned copies); a device backend copies them to its memory.
  const uint64_t weight_bytes = store_tensor_bytes(store);
  if (backend.device() == Device::kCpu) {
    check_memory_fits(weight_bytes, "model folder " + dir);
  } else {
    check_device_memory_fits(weight_bytes, backend.device_free_bytes(), std::string(backend.name()) + " device",
                             "model folder " + dir);
  }
  // Uploading a large checkpoint to a device takes seconds: a progress line on stderr (terminals only).
  ByteProgress progress("loading weights", backend.device() == Device::kCpu ? 0 : weight_bytes);
  ScopedLoadProgress scope(progress);
  std::unique_ptr<Model> model = arch.load(ModelContext{config, store, backend});
  progress.finish();
  return model;
}

}  // namespace moecel
