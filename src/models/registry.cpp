// model_type -> architecture. Adding a family: one file in src/models/ and one line here.
#include "models/registry.h"

#include <fmt/ranges.h>

#include <filesystem>

#include "core/error.h"

namespace moecel {

const Architecture& olmoe_architecture();

namespace {

const std::vector<const Architecture*>& all() {
  static const std::vector<const Architecture*> archs = {&olmoe_architecture()};
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
  return arch.load(ModelContext{config, store, backend});
}

}  // namespace moecel
