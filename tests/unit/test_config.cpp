// config.json access: typed fields with errors naming the field, rope settings in both forms, and the MLX
// quantization block with per-module overrides (as mlx-lm writes it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "expect_error.h"
#include "io/config.h"

namespace moecel {
namespace {

using nlohmann::json;

ModelConfig cfg(const char* text) {
  return ModelConfig::from_json(json::parse(text));
}

TEST(ModelConfig, TypedFields) {
  ModelConfig c =
      cfg(R"({"model_type": "olmoe", "hidden_size": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
                          "num_experts_per_tok": 8, "max_position_embeddings": 4096.0, "pad": null, "eps_int": 1})");
  EXPECT_EQ(c.model_type(), "olmoe");
  EXPECT_EQ(c.get_int("hidden_size"), 2048);
  EXPECT_EQ(c.get_int("max_position_embeddings"), 4096);  // integral floats are accepted
  EXPECT_DOUBLE_EQ(c.get_float("rms_norm_eps"), 1e-5);
  EXPECT_DOUBLE_EQ(c.get_float("eps_int"), 1.0);
  EXPECT_FALSE(c.get_bool("tie_word_embeddings"));
  EXPECT_TRUE(c.has("hidden_size"));
  EXPECT_FALSE(c.has("pad"));  // null counts as absent
  EXPECT_FALSE(c.has("nope"));
  EXPECT_EQ(c.get_int_or("pad", 7), 7);
  EXPECT_EQ(c.get_int_or("nope", 3), 3);
  EXPECT_EQ(c.get_int_or("hidden_size", 3), 2048);
  EXPECT_DOUBLE_EQ(c.get_float_or("nope", 0.5), 0.5);
  EXPECT_TRUE(c.get_bool_or("nope", true));
  EXPECT_FALSE(c.quantized());
  EXPECT_FALSE(c.quant_for("model.layers.0.mlp.gate").has_value());
  EXPECT_EQ(c.source(), "config.json");
}

TEST(ModelConfig, FieldErrorsNameTheField) {
  ModelConfig c = cfg(R"({"num_experts_per_tok": 70, "hidden_size": "big", "flag": 1, "name": 3, "eps": "x",
                          "frac": 2.5, "neg": -1, "huge": 18446744073709551615})");
  expect_error([&] { c.get_int("num_experts_per_tok", 1, 64); },
               "config.json: field 'num_experts_per_tok' must be an integer in [1, 64], got 70");
  expect_error([&] { c.get_int("hidden_size"); },
               "field 'hidden_size' must be an integer in [1, 1099511627776], got \"big\"");
  expect_error([&] { c.get_int("frac"); }, "field 'frac' must be an integer in [1, 1099511627776], got 2.5");
  expect_error([&] { c.get_int("neg"); }, "got -1");
  expect_error([&] { c.get_int("huge"); }, "got 18446744073709551615");
  expect_error([&] { c.get_int("missing_field"); }, "config.json: missing required field 'missing_field'");
  expect_error([&] { c.get_bool("flag"); }, "field 'flag' must be true or false, got 1");
  expect_error([&] { c.get_string("name"); }, "field 'name' must be a string, got 3");
  expect_error([&] { c.get_float("eps"); }, "field 'eps' must be a number, got \"x\"");
  expect_error([&] { c.get_int_or("hidden_size", 1); }, "field 'hidden_size' must be an integer");
  expect_error([&] { c.get_bool_or("flag", false); }, "field 'flag' must be true or false");
  expect_error([&] { c.get_float_or("eps", 1.0); }, "field 'eps' must be a number");
  expect_error([&] { c.model_type(); }, "missing required field 'model_type'");
}

TEST(ModelConfig, RopeThetaInEitherForm) {
  EXPECT_DOUBLE_EQ(cfg(R"({"rope_theta": 500000})").rope_theta(), 500000.0);
  ModelConfig newer = cfg(R"({"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}})");
  EXPECT_DOUBLE_EQ(newer.rope_theta(), 1e6);
  EXPECT_EQ(newer.rope_type(), "default");
  EXPECT_DOUBLE_EQ(cfg("{}").rope_theta(), 10000.0);
  EXPECT_DOUBLE_EQ(cfg("{}").rope_theta(25.0), 25.0);
  EXPECT_EQ(cfg("{}").rope_type(), "default");
  EXPECT_DOUBLE_EQ(cfg(R"({"rope_parameters": {"rope_type": "default"}})").rope_theta(123.0), 123.0);
  // Top-level wins when both are present.
  EXPECT_DOUBLE_EQ(cfg(R"({"rope_theta": 10.0, "rope_parameters": {"rope_theta": 20.0}})").rope_theta(), 10.0);
  EXPECT_EQ(cfg(R"({"rope_scaling": {"type": "linear", "factor": 2.0}})").rope_type(), "linear");
  EXPECT_EQ(cfg(R"({"rope_parameters": {"rope_type": "yarn"}})").rope_type(), "yarn");
  expect_error([] { cfg(R"({"rope_theta": "big"})").rope_theta(); }, "field 'rope_theta' must be a number");
  expect_error([] { cfg(R"({"rope_theta": 0})").rope_theta(); }, "field 'rope_theta' must be a positive number");
  expect_error([] { cfg(R"({"rope_parameters": 5})").rope_theta(); }, "field 'rope_parameters' must be an object");
  expect_error([] { cfg(R"({"rope_parameters": {"rope_theta": -1}})").rope_theta(); },
               "field 'rope_parameters.rope_theta' must be a positive number");
  expect_error([] { cfg(R"({"rope_parameters": {"rope_type": 1}})").rope_type(); },
               "field 'rope_parameters.rope_type' must be a string");
}

// The config mlx-lm writes for a mixed-precision quantized MoE model.
const char* kMlxQuantized = R"({
  "model_type": "olmoe",
  "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                   "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
                   "model.layers.1.mlp.gate": false,
                   "model.layers.2.mlp.gate": true,
                   "model.layers.3.mlp.switch_mlp.down_proj": {"bits": 6},
                   "lm_head": {"group_size": 128, "bits": 8, "mode": "affine"}},
  "quantization_config": {"group_size": 64, "bits": 4, "mode": "affine",
                          "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}}
})";

TEST(ModelConfig, QuantizationBlockAndOverrides) {
  ModelConfig c = cfg(kMlxQuantized);
  ASSERT_TRUE(c.quantized());
  EXPECT_EQ(c.default_quant()->bits, 4);
  EXPECT_EQ(c.default_quant()->group_size, 64);
  auto q = c.quant_for("model.layers.5.self_attn.q_proj");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->bits, 4);
  q = c.quant_for("model.layers.0.mlp.gate");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->bits, 8);
  EXPECT_EQ(q->group_size, 64);
  EXPECT_FALSE(c.quant_for("model.layers.1.mlp.gate").has_value());  // false: left dense
  q = c.quant_for("model.layers.2.mlp.gate");                        // true: the default spec
  ASSERT_TRUE(q);
  EXPECT_EQ(q->bits, 4);
  q = c.quant_for("model.layers.3.mlp.switch_mlp.down_proj");  // missing group_size falls back to the default
  ASSERT_TRUE(q);
  EXPECT_EQ(q->bits, 6);
  EXPECT_EQ(q->group_size, 64);
  q = c.quant_for("lm_head");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->group_size, 128);
  EXPECT_EQ(q->bits, 8);

  // quantization_config alone (some exporters write only the HF-named mirror); mode defaults to affine.
  ModelConfig only = cfg(R"({"quantization_config": {"group_size": 32, "bits": 3}})");
  ASSERT_TRUE(only.quantized());
  EXPECT_EQ(only.quant_for("x")->bits, 3);
  EXPECT_EQ(only.quant_for("x")->group_size, 32);
  EXPECT_FALSE(cfg(R"({"quantization": null})").quantized());
}

TEST(ModelConfig, QuantizationErrors) {
  expect_error([] { cfg(R"({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}})"); },
               "field 'quantization.mode' is 'mxfp4', but only 'affine' quantization is supported");
  expect_error([] { cfg(R"({"quantization": {"group_size": 64, "bits": 4, "mode": 1}})"); },
               "field 'quantization.mode' must be a string");
  expect_error([] { cfg(R"({"quantization": {"group_size": 48, "bits": 4}})"); },
               "field 'quantization.group_size' must be one of 32, 64, 128, got 48");
  expect_error([] { cfg(R"({"quantization": {"group_size": 64, "bits": 7}})"); },
               "field 'quantization.bits' must be one of 2, 3, 4, 5, 6, 8, got 7");
  expect_error([] { cfg(R"({"quantization": {"group_size": 64, "bits": "4"}})"); },
               "field 'quantization.bits' must be an integer");
  expect_error([] { cfg(R"({"quantization": {"group_size": 64}})"); }, "missing field 'quantization.bits'");
  expect_error([] { cfg(R"({"quantization": {"bits": 4}})"); }, "missing field 'quantization.group_size'");
  expect_error([] { cfg(R"({"quantization": 4})"); }, "field 'quantization' must be an object, got 4");
  expect_error(
      [] { cfg(R"({"quantization": {"group_size": 64, "bits": 4, "model.layers.0.mlp.gate": {"bits": 9}}})"); },
      "field 'quantization.model.layers.0.mlp.gate.bits' must be one of 2, 3, 4, 5, 6, 8, got 9");
  expect_error(
      [] {
        cfg(R"({"quantization": {"group_size": 64, "bits": 4, "lm_head": {"group_size": 64, "bits": 4, "mode": "nvfp4"}}})");
      },
      "field 'quantization.lm_head.mode' is 'nvfp4'");
  expect_error([] { cfg(R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}})"); },
               "field 'quantization_config.quant_method' is \"gptq\": only MLX affine quantization");
  expect_error(
      [] {
        cfg(R"({"quantization": {"group_size": 64, "bits": 4},
                           "quantization_config": {"group_size": 64, "bits": 8}})");
      },
      "'quantization' (bits 4, group_size 64) and 'quantization_config' (bits 8, group_size 64) disagree");
}

TEST(ModelConfig, NotAnObjectOrNotJson) {
  expect_error([] { ModelConfig::from_json(json::parse("[1, 2]")); }, "config.json: must be a JSON object, got [1,2]");
  expect_error([] { ModelConfig::from_json(json::parse("\"x\""), "/m/config.json"); },
               "/m/config.json: must be a JSON object");

  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("moecel-cfg-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  expect_error(
      [&] {
        fs::remove(path);
        ModelConfig::load(dir.string());
      },
      path + ": cannot open");
  std::ofstream(path) << "{\"hidden_size\": 12,";
  expect_error([&] { ModelConfig::load(dir.string()); }, path + ": invalid JSON");
  std::ofstream(path) << "[]";
  expect_error([&] { ModelConfig::load(dir.string()); }, path + ": must be a JSON object");
  std::ofstream(path) << R"({"hidden_size": 12, "hidden_size": 14})";
  expect_error([&] { ModelConfig::load(dir.string()); }, "duplicate key 'hidden_size'");
  std::ofstream(path) << kMlxQuantized;
  ModelConfig c = ModelConfig::load(dir.string());
  EXPECT_EQ(c.source(), path);
  EXPECT_EQ(c.model_type(), "olmoe");
  EXPECT_EQ(c.quant_for("model.layers.0.mlp.gate")->bits, 8);
  std::ofstream(path) << R"({"num_experts_per_tok": 70})";
  expect_error([&] { ModelConfig::load(dir.string()).get_int("num_experts_per_tok", 1, 64); },
               path + ": field 'num_experts_per_tok' must be an integer in [1, 64], got 70");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moecel
