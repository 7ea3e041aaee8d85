// `moecel inspect`: what a checkpoint holds: architecture, sizes, quantization per tensor group, bytes,
// and the bytes one decode step reads.
#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "models/registry.h"

namespace moecel::cli {
namespace {

struct InspectArgs {
  CommonOptions common;
  bool json = false;
};

// "model.layers.12.mlp.experts.3.up_proj.weight" -> "model.layers.*.mlp.experts.*.up_proj.weight"
std::string group_of(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size();) {
    const bool seg_start = i == 0 || name[i - 1] == '.';
    size_t j = i;
    while (j < name.size() && std::isdigit(uint8_t(name[j]))) ++j;
    if (seg_start && j > i && (j == name.size() || name[j] == '.')) {
      out += '*';
      i = j;
    } else {
      out += name[i++];
    }
  }
  return out;
}

struct Group {
  int64_t count = 0;
  size_t bytes = 0;
  std::string dtype, shape, quant;
};

void run_inspect(const InspectArgs& a) {
  const std::string dir = model_dir(a.common);
  ModelConfig config = ModelConfig::load(dir);
  WeightStore store = WeightStore::open_folder(dir);
  std::map<std::string, Group> groups;  // by module group (without the .weight/.scales/.biases suffix)
  size_t file_bytes = 0;
  for (const auto& [name, t] : store.all()) {
    const size_t dot = name.rfind('.');
    const std::string module = name.substr(0, dot), part = name.substr(dot + 1);
    Group& g = groups[group_of(module)];
    g.bytes += t.nbytes();
    file_bytes += t.nbytes();
    if (part == "weight") {
      ++g.count;
      g.dtype = std::string(dtype_name(t.dtype));
      g.shape = shape_str(t.shape);
      if (store.has(module + ".scales")) {
        auto spec = config.quant_for(module);
        g.quant = spec ? fmt::format("{}-bit g{}", spec->bits, spec->group_size) : "?";
      } else {
        g.quant = "dense";
      }
    } else if (part != "scales" && part != "biases") {
      ++g.count;
      g.dtype = std::string(dtype_name(t.dtype));
      g.shape = shape_str(t.shape);
      g.quant = "dense";
    }
  }
  auto backend = make_backend(a.common);  // CPU tensors are mmap views: loading is cheap
  auto model = load_model(dir, *backend);
  const ModelInfo& info = model->info();
  if (a.json) {
    nlohmann::json j = {{"model_type", info.model_type},   {"vocab_size", info.vocab_size},
                        {"hidden_size", info.hidden_size}, {"num_hidden_layers", info.n_layers},
                        {"moe_layers", info.n_moe_layers}, {"weight_bytes", info.weight_bytes},
                        {"file_tensor_bytes", file_bytes}, {"active_bytes_per_token", info.active_bytes_per_token}};
    for (const auto& [name, g] : groups) {
      j["groups"].push_back({{"name", name},
                             {"count", g.count},
                             {"dtype", g.dtype},
                             {"shape", g.shape},
                             {"quant", g.quant},
                             {"bytes", g.bytes}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("model:        %s\n", dir.c_str());
  std::printf("architecture: %s\n", info.model_type.c_str());
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                          "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "num_experts",
                          "num_experts_per_tok", "norm_topk_prob", "max_position_embeddings", "rope_theta"}) {
    if (config.has(key)) std::printf("  %-24s %s\n", key, config.json()[key].dump().c_str());
  }
  if (auto q = config.default_quant())
    std::printf("quantization: affine %d-bit, group size %d\n", q->bits, q->group_size);
  std::printf("\n%-52s %6s %-6s %-22s %-10s %12s\n", "tensor group", "count", "dtype", "shape", "quant", "bytes");
  for (const auto& [name, g] : groups) {
    std::printf("%-52s %6lld %-6s %-22s %-10s %12zu\n", name.c_str(), (long long)g.count, g.dtype.c_str(),
                g.shape.c_str(), g.quant.c_str(), g.bytes);
  }
  std::printf("\nweights:                %.1f MB\n", double(info.weight_bytes) / 1e6);
  std::printf("active bytes per token: %.1f MB (top-%s experts of each MoE layer, attention, router, lm_head)\n",
              double(info.active_bytes_per_token) / 1e6,
              config.has("num_experts_per_tok") ? config.json()["num_experts_per_tok"].dump().c_str() : "k");
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* sub = app.add_subcommand("inspect", "Describe a checkpoint: architecture, sizes, quantization, bytes");
  add_common_options(sub, a->common);
  sub->add_flag("--json", a->json, "Print JSON instead of a table");
  sub->callback([a] { run_inspect(*a); });
}

}  // namespace moecel::cli
