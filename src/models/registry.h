// The architecture registry: model_type -> loader and test-model preset maker. This is the only place that
// knows which architectures exist; nothing else switches on the architecture.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "models/model.h"

namespace moecel {

struct ModelContext {
  const ModelConfig& config;
  const WeightStore& store;
  Backend& backend;
};

// A random checkpoint's recipe: config.json and the tensors with their init scale.
struct TestTensor {
  std::string name;    // for linear layers the module path (".weight" etc. are added); else the tensor name
  Shape shape;         // logical (n_experts?, out, in) for linear layers
  bool linear = true;  // quantizable linear layer (also embeddings and lm_head)
  float std = 0.02f;   // spread of the random values (norm weights: around 1)
};
struct TestModelSpec {
  nlohmann::json config;
  std::vector<TestTensor> tensors;
};

struct Architecture {
  std::string model_type;
  std::unique_ptr<Model> (*load)(const ModelContext& ctx);
  // preset: "tiny" or a real model's shape name (throws listing the presets for anything else);
  // overrides: config.json fields replacing the preset's.
  TestModelSpec (*test_model)(const std::string& preset, const nlohmann::json& overrides);
  std::vector<std::string> presets;
};

const Architecture& find_architecture(const std::string& model_type);  // throws listing the known ones
std::vector<std::string> architecture_names();

// Loads DIR (config.json + safetensors) onto the backend with the architecture its model_type names.
std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend);

}  // namespace moecel
