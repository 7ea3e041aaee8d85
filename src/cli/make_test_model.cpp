// `moecel make-test-model`: writes a random checkpoint in the exact mlx-community layout (HF layout when
// unquantized) for tests and benchmarks.
#include <cstdio>
#include <memory>

#include "cli/common.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "models/registry.h"
#include "models/test_model.h"

namespace moecel::cli {
namespace {

struct MakeArgs {
  TestModelOptions opt;
  std::string dtype = "bf16", out, set_json;
  std::vector<std::string> overrides;
  int threads = 0;
};

// "SUFFIX=BITS" or "SUFFIX=BITS/GROUP"
std::pair<std::string, QuantSpec> parse_override(const std::string& s, int default_group) {
  const size_t eq = s.find('=');
  MOECEL_CHECK(eq != std::string::npos && eq > 0, "--override '{}': expected MODULE_SUFFIX=BITS[/GROUP_SIZE]", s);
  QuantSpec spec{0, default_group};
  const std::string v = s.substr(eq + 1);
  const size_t slash = v.find('/');
  try {
    spec.bits = std::stoi(v.substr(0, slash));
    if (slash != std::string::npos) spec.group_size = std::stoi(v.substr(slash + 1));
  } catch (const std::exception&) {
    fail("--override '{}': expected MODULE_SUFFIX=BITS[/GROUP_SIZE]", s);
  }
  return {s.substr(0, eq), spec};
}

void run_make(MakeArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  if (a.dtype == "bf16") {
    a.opt.dtype = DType::kBF16;
  } else if (a.dtype == "f16") {
    a.opt.dtype = DType::kF16;
  } else if (a.dtype == "f32") {
    a.opt.dtype = DType::kF32;
  } else {
    fail("--dtype must be bf16, f16 or f32, got '{}'", a.dtype);
  }
  for (const std::string& s : a.overrides) a.opt.overrides.push_back(parse_override(s, a.opt.group_size));
  if (!a.set_json.empty()) {
    a.opt.config_overrides = nlohmann::json::parse(a.set_json, nullptr, false);
    MOECEL_CHECK(a.opt.config_overrides.is_object(),
                 "--set must be a JSON object, e.g. '{{\"intermediate_size\": 256}}'");
  }
  const size_t bytes = write_test_model(a.opt, a.out);
  std::fprintf(stderr, "wrote %s (%s preset %s, %.1f MB)\n", a.out.c_str(), a.opt.arch.c_str(), a.opt.preset.c_str(),
               double(bytes) / 1e6);
}

}  // namespace

void register_make_test_model(CLI::App& app) {
  auto a = std::make_shared<MakeArgs>();
  CLI::App* sub = app.add_subcommand("make-test-model", "Write a random checkpoint (mlx-community layout) for tests");
  sub->add_option("--arch", a->opt.arch, "Architecture (model_type)")->default_val("olmoe");
  sub->add_option("--preset", a->opt.preset, "Shape preset: tiny, or a real model's shape (e.g. olmoe-1b-7b)")
      ->default_val("tiny");
  sub->add_option("--bits", a->opt.bits, "Quantization bits (2, 3, 4, 5, 6, 8; 0 = unquantized HF layout)")
      ->default_val(4);
  sub->add_option("--group-size", a->opt.group_size, "Quantization group size (32, 64, 128)")->default_val(64);
  sub->add_option("--dtype", a->dtype, "Float dtype of dense weights, norms, scales and biases: bf16, f16, f32")
      ->default_val("bf16");
  sub->add_option("--override", a->overrides,
                  "Per-module quantization, MODULE_SUFFIX=BITS[/GROUP_SIZE], e.g. mlp.gate=8 or "
                  "layers.1.mlp.switch_mlp.down_proj=6 (repeatable)");
  sub->add_option("--set", a->set_json, "JSON object of config.json fields replacing the preset's");
  sub->add_option("--seed", a->opt.seed, "Random seed")->default_val(0);
  sub->add_option("-o,--out", a->out, "Output folder")->required();
  sub->add_option("-t,--threads", a->threads, "CPU threads")->check(CLI::Range(0, 1024));
  sub->callback([a] { run_make(*a); });
}

}  // namespace moecel::cli
