// A corpus of broken checkpoints, each made from a valid tiny checkpoint by one defect, run through
// `moecel generate` and `moecel inspect`: every case must exit 1 with exactly one "error: ..." line naming the
// file, tensor or field at fault, and never crash, abort or trip a sanitizer. Every case prints its message.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_edit.h"
#include "cli_runner.h"
#include "io/safetensors.h"
#include "models/test_model.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace test;  // checkpoint_edit.h, cli_runner.h
const char* kQProj = "model.layers.0.self_attn.q_proj";

struct BrokenCase {
  std::string name;
  std::function<void(const std::string& dir)> make;  // breaks a copy of the valid checkpoint in dir
  std::vector<std::string> needles;                  // the message must contain each
  std::string base = "m";                            // which valid checkpoint to start from
  std::string env;                                   // NAME=VALUE set for the CLI run
  bool generate_only = false;                        // e.g. tokenizer.json, which inspect does not read
};

// gtest prints a parameter on failure: the case name, not its bytes.
void PrintTo(const BrokenCase& c, std::ostream* os) {
  *os << c.name;
}

std::vector<BrokenCase> cases() {
  std::vector<BrokenCase> c;
  // --- safetensors framing
  c.push_back({"truncated_data",
               [](const std::string& d) { fs::resize_file(d + "/" + kSt, fs::file_size(d + "/" + kSt) - 100); },
               {kSt, "exceed the data area", "truncated"}});
  c.push_back({"truncated_in_header",
               [](const std::string& d) { fs::resize_file(d + "/" + kSt, 200); },
               {kSt, "runs past the end"}});
  c.push_back({"file_shorter_than_length_field",
               [](const std::string& d) { fs::resize_file(d + "/" + kSt, 5); },
               {kSt, "too small"}});
  c.push_back({"empty_file", [](const std::string& d) { fs::resize_file(d + "/" + kSt, 0); }, {kSt, "too small"}});
  c.push_back({"header_length_beyond_file",
               [](const std::string& d) {
                 StParts p = read_st(d + "/" + kSt);
                 write_raw(d + "/" + kSt, p.header.dump(), p.data, fs::file_size(d + "/" + kSt));
               },
               {kSt, "runs past the end"}});
  c.push_back({"header_claims_over_100mb",
               [](const std::string& d) {
                 StParts p = read_st(d + "/" + kSt);
                 write_raw(d + "/" + kSt, p.header.dump(), p.data, (uint64_t(100) << 20) + 1);
               },
               {kSt, "exceeds the 104857600 byte limit"}});
  c.push_back({"header_of_100mb_zero_bytes",
               [](const std::string& d) {
                 write_raw(d + "/" + kSt, "", "", uint64_t(100) << 20);
                 fs::resize_file(d + "/" + kSt, 8 + (uint64_t(100) << 20));  // sparse
               },
               {kSt, "invalid JSON"}});
  c.push_back({"header_not_json",
               [](const std::string& d) { write_raw(d + "/" + kSt, "this is not JSON", ""); },
               {kSt, "invalid JSON"}});
  c.push_back({"header_not_utf8",
               [](const std::string& d) {
                 write_raw(d + "/" + kSt, "{\"w\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                           std::string(4, '\0'));
               },
               {kSt, "invalid JSON", "ill-formed UTF-8", "\\xFF"}});
  c.push_back({"header_deeply_nested",
               [](const std::string& d) {
                 write_raw(d + "/" + kSt, "{\"__metadata__\":" + nested('[', ']', 100000) + "}", "");
               },
               {kSt, "nested deeper than"}});
  c.push_back({"header_not_an_object",
               [](const std::string& d) { write_raw(d + "/" + kSt, "[1, 2, 3]", ""); },
               {kSt, "must be a JSON object"}});
  c.push_back({"header_duplicate_tensor",
               [](const std::string& d) {
                 write_raw(d + "/" + kSt,
                           "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                           "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                           "xy");
               },
               {kSt, "duplicate key 'a'"}});
  c.push_back({"tensor_name_with_newline",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) {
                   h["model.norm.weight\nerror: forged second line"] = h["model.norm.weight"];
                   h.erase("model.norm.weight");
                 });
               },
               {kSt, "\"model.norm.weight\\nerror: forged second line\" contains a control character"}});
  c.push_back({"metadata_not_strings",
               [](const std::string& d) { edit_header(d, [](json& h, std::string&) { h["__metadata__"]["n"] = 5; }); },
               {kSt, "__metadata__['n'] must be a string"}});
  // --- offsets, dtypes, shapes
  c.push_back({"offsets_out_of_range",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string& data) {
                   h["model.norm.weight"]["data_offsets"] = {data.size(), data.size() + 256};
                 });
               },
               {kSt, "model.norm.weight", "exceed the data area"}});
  c.push_back({"offsets_huge",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) {
                   h["model.norm.weight"]["data_offsets"] = {UINT64_MAX - 256, UINT64_MAX};
                 });
               },
               {kSt, "model.norm.weight", "exceed the data area"}});
  c.push_back({"offsets_reversed",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) {
                   json& o = h["model.norm.weight"]["data_offsets"];
                   o = {o[1], o[0]};
                 });
               },
               {kSt, "model.norm.weight", "end < begin"}});
  c.push_back(
      {"offsets_overlap",
       [](const std::string& d) {
         edit_header(d, [](json& h, std::string&) {
           h["model.layers.0.post_attention_layernorm.weight"]["data_offsets"] =
               h["model.layers.0.input_layernorm.weight"]["data_offsets"];
         });
       },
       {kSt, "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight", "overlap"}});
  c.push_back({"offsets_not_integers",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) { h["model.norm.weight"]["data_offsets"][1] = "256"; });
               },
               {kSt, "model.norm.weight", "data_offsets"}});
  c.push_back({"dtype_size_mismatch",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) { h["model.norm.weight"]["dtype"] = "F32"; });
               },
               {kSt, "model.norm.weight", "span 256 bytes, but F32 x (128,) needs 512 bytes"}});
  c.push_back({"shape_size_mismatch",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) { h["model.norm.weight"]["shape"] = {129}; });
               },
               {kSt, "model.norm.weight", "span 256 bytes"}});
  c.push_back({"unknown_dtype",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) { h["model.norm.weight"]["dtype"] = "Q4_K"; });
               },
               {kSt, "model.norm.weight", "unsupported dtype 'Q4_K'"}});
  c.push_back({"negative_dim",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) { h["model.norm.weight"]["shape"] = {-128}; });
               },
               {kSt, "model.norm.weight", "non-negative integers"}});
  c.push_back({"shape_overflow",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) {
                   h["model.norm.weight"]["shape"] = {uint64_t(1) << 62, uint64_t(1) << 62};
                 });
               },
               {kSt, "model.norm.weight", "overflows"}});
  c.push_back({"norm_with_integer_dtype",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) {
                   h["model.norm.weight"]["dtype"] = "U8";
                   h["model.norm.weight"]["shape"] = {256};
                 });
               },
               {"model.norm.weight", "expected a float vector (128,), got U8 (256,)"}});
  c.push_back({"norm_wrong_length",
               [](const std::string& d) {
                 edit_tensors(d, [](TensorList& l) { replace(l, "model.norm.weight", zeros(DType::kBF16, {64})); });
               },
               {"model.norm.weight", "expected a float vector (128,), got BF16 (64,)"}});
  c.push_back({"packed_weight_not_u32",
               [](const std::string& d) {
                 edit_header(d, [](json& h, std::string&) { h[std::string(kQProj) + ".weight"]["dtype"] = "F32"; });
               },
               {"model.layers.0.self_attn.q_proj.weight", "expected dtype U32"}});
  // --- quantization
  c.push_back({"scales_rows_inconsistent",
               [](const std::string& d) {
                 edit_tensors(d, [](TensorList& l) {
                   replace(l, std::string(kQProj) + ".scales", zeros(DType::kBF16, {64, 2}));
                   replace(l, std::string(kQProj) + ".biases", zeros(DType::kBF16, {64, 2}));
                 });
               },
               {"model.layers.0.self_attn.q_proj.scales", "expected (128, 2)", "got (64, 2)"}});
  c.push_back({"scales_groups_inconsistent",
               [](const std::string& d) {
                 edit_tensors(d, [](TensorList& l) {
                   replace(l, std::string(kQProj) + ".scales", zeros(DType::kBF16, {128, 4}));
                   replace(l, std::string(kQProj) + ".biases", zeros(DType::kBF16, {128, 4}));
                 });
               },
               {"model.layers.0.self_attn.q_proj.scales", "expected (128, 2), got (128, 4)"}});
  c.push_back({"biases_dtype_differs",
               [](const std::string& d) {
                 edit_tensors(d, [](TensorList& l) {
                   replace(l, std::string(kQProj) + ".biases", zeros(DType::kF32, {128, 2}));
                 });
               },
               {"model.layers.0.self_attn.q_proj.biases", "same as scales"}});
  c.push_back({"biases_missing",
               [](const std::string& d) {
                 edit_tensors(d, [](TensorList& l) { erase_tensor(l, std::string(kQProj) + ".biases"); });
               },
               {"model.layers.0.self_attn.q_proj.biases", "missing"}});
  c.push_back({"bits_not_allowed_in_config",
               [](const std::string& d) {
                 edit_config(d, [](json& j) { j["quantization"]["bits"] = j["quantization_config"]["bits"] = 7; });
               },
               {"config.json", "quantization.bits", "got 7"}});
  c.push_back({"bits_not_allowed_by_shapes",
               [](const std::string& d) {
                 edit_tensors(d, [](TensorList& l) {
                   replace(l, std::string(kQProj) + ".weight", zeros(DType::kU32, {128, 28}));  // 7 bits x 128
                 });
               },
               {"model.layers.0.self_attn.q_proj.weight", "packed width 28 does not fit bits 4"}});
  c.push_back({"group_size_not_allowed",
               [](const std::string& d) {
                 edit_config(
                     d, [](json& j) { j["quantization"]["group_size"] = j["quantization_config"]["group_size"] = 48; });
               },
               {"config.json", "quantization.group_size", "32, 64, 128", "got 48"}});
  // Base "m96": intermediate_size 96 quantized at group 64, with down_proj (width 96) at group 32 by override.
  // Dropping the override applies group 64, which does not divide 96.
  c.push_back({"group_size_not_dividing_width",
               [](const std::string& d) {
                 edit_config(d, [](json& j) {
                   for (const char* b : {"quantization", "quantization_config"}) {
                     for (int l = 0; l < 2; ++l) j[b].erase(fmt::format("model.layers.{}.mlp.switch_mlp.down_proj", l));
                   }
                 });
               },
               {"model.layers.0.mlp.switch_mlp.down_proj", "does not fit bits 4 with group_size 64"},
               "m96"});
  c.push_back({"quantized_weights_unquantized_config",
               [](const std::string& d) {
                 edit_config(d, [](json& j) {
                   j.erase("quantization");
                   j.erase("quantization_config");
                 });
               },
               {"model.embed_tokens.scales", "config.json has no quantization"}});
  c.push_back({"foreign_quant_method",
               [](const std::string& d) {
                 edit_config(d, [](json& j) {
                   j.erase("quantization");
                   j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
                 });
               },
               {"config.json", "quantization_config.quant_method", "gptq"}});
  c.push_back({"override_bits_not_integer",
               [](const std::string& d) {
                 edit_config(d, [](json& j) { j["quantization"]["model.layers.0.mlp.gate"] = {{"bits", 3.5}}; });
               },
               {"config.json", "quantization.model.layers.0.mlp.gate.bits"}});
  // --- missing and extra tensors
  c.push_back({"missing_tensor",
               [](const std::string& d) {
                 edit_tensors(d, [](TensorList& l) { erase_tensor(l, "model.layers.1.self_attn.k_norm.weight"); });
               },
               {"missing tensor model.layers.1.self_attn.k_norm.weight"}});
  c.push_back({"missing_experts",
               [](const std::string& d) {
                 edit_tensors(d, [](TensorList& l) {
                   std::erase_if(
                       l, [](const auto& p) { return p.first.find("layers.1.mlp.switch_mlp") != std::string::npos; });
                 });
               },
               {"missing experts of model.layers.1.mlp"}});
  c.push_back({"extra_tensor",
               [](const std::string& d) {
                 edit_tensors(d, [](TensorList& l) {
                   l.emplace_back("model.layers.2.input_layernorm.weight", zeros(DType::kBF16, {128}));
                 });
               },
               {"unexpected tensor model.layers.2.input_layernorm.weight", kSt}});
  // --- config.json
  c.push_back(
      {"config_missing", [](const std::string& d) { fs::remove(d + "/config.json"); }, {"config.json", "cannot open"}});
  c.push_back({"config_not_json",
               [](const std::string& d) { std::ofstream(d + "/config.json") << "{model_type: olmoe"; },
               {"config.json", "invalid JSON"}});
  c.push_back({"config_not_utf8",
               [](const std::string& d) { std::ofstream(d + "/config.json") << "{\"model_type\": \"olmoe\xff\"}"; },
               {"config.json", "invalid JSON", "ill-formed UTF-8", "\\xFF"}});
  c.push_back({"config_deeply_nested",
               [](const std::string& d) {
                 std::ofstream(d + "/config.json")
                     << "{\"model_type\": \"olmoe\", \"x\": " + nested('[', ']', 100000) + "}";
               },
               {"config.json", "nested deeper than"}});
  c.push_back({"config_not_an_object",
               [](const std::string& d) { std::ofstream(d + "/config.json") << "[1]"; },
               {"config.json", "must be a JSON object"}});
  c.push_back({"config_duplicate_key",
               [](const std::string& d) {
                 std::string t = read_text(d + "/config.json");
                 t.insert(1, "\"hidden_size\": 64,");
                 std::ofstream(d + "/config.json") << t;
               },
               {"config.json", "duplicate key 'hidden_size'"}});
  c.push_back({"model_type_missing",
               [](const std::string& d) { edit_config(d, [](json& j) { j.erase("model_type"); }); },
               {"config.json", "'model_type'"}});
  c.push_back({"model_type_wrong_type",
               [](const std::string& d) { edit_config(d, [](json& j) { j["model_type"] = 42; }); },
               {"config.json", "'model_type' must be a string"}});
  c.push_back({"model_type_with_control_characters",  // printed escaped: no forged second line, no terminal codes
               [](const std::string& d) {
                 edit_config(d, [](json& j) { j["model_type"] = "olmoe\nerror: forged\x1b[2J\tend"; });
               },
               {"unknown model_type 'olmoe\\nerror: forged\\x1B[2J\\tend'"}});
  c.push_back({"hidden_size_string",
               [](const std::string& d) { edit_config(d, [](json& j) { j["hidden_size"] = "128"; }); },
               {"config.json", "'hidden_size' must be an integer", "\"128\""}});
  c.push_back({"num_experts_fractional",
               [](const std::string& d) { edit_config(d, [](json& j) { j["num_experts"] = 8.5; }); },
               {"config.json", "'num_experts' must be an integer"}});
  c.push_back({"num_experts_zero",
               [](const std::string& d) { edit_config(d, [](json& j) { j["num_experts"] = 0; }); },
               {"config.json", "'num_experts' must be an integer in [1,", "got 0"}});
  c.push_back({"top_k_above_num_experts",
               [](const std::string& d) { edit_config(d, [](json& j) { j["num_experts_per_tok"] = 9; }); },
               {"config.json", "'num_experts_per_tok' must be an integer in [1, 8], got 9"}});
  c.push_back({"vocab_size_zero",
               [](const std::string& d) { edit_config(d, [](json& j) { j["vocab_size"] = 0; }); },
               {"config.json", "'vocab_size'", "got 0"}});
  c.push_back({"vocab_size_absurd",
               [](const std::string& d) { edit_config(d, [](json& j) { j["vocab_size"] = int64_t(1) << 40; }); },
               {"config.json", "'vocab_size'", "got 1099511627776"}});
  c.push_back({"hidden_size_absurd",
               [](const std::string& d) { edit_config(d, [](json& j) { j["hidden_size"] = 1e300; }); },
               {"config.json", "'hidden_size'"}});
  c.push_back({"num_layers_absurd",
               [](const std::string& d) { edit_config(d, [](json& j) { j["num_hidden_layers"] = 1000000; }); },
               {"config.json", "'num_hidden_layers'", "got 1000000"}});
  c.push_back({"head_dim_not_dividing_hidden",
               [](const std::string& d) {
                 edit_config(d, [](json& j) {
                   j["num_attention_heads"] = 3;
                   j["num_key_value_heads"] = 3;
                 });
               },
               {"config.json", "hidden_size 128 is not divisible by num_attention_heads 3"}});
  c.push_back({"config_shape_disagrees_with_tensors",
               [](const std::string& d) { edit_config(d, [](json& j) { j["vocab_size"] = 1024; }); },
               {"model.embed_tokens.weight", "expected logical shape (1024, 128)"}});
  c.push_back({"rope_theta_negative",
               [](const std::string& d) { edit_config(d, [](json& j) { j["rope_theta"] = -1.0; }); },
               {"config.json", "'rope_theta' must be a positive number"}});
  // --- shards
  c.push_back({"index_names_missing_shard",
               [](const std::string& d) {
                 write_index(d, shard(d));
                 fs::remove(d + "/model-00002-of-00002.safetensors");
               },
               {"model.safetensors.index.json", "model-00002-of-00002.safetensors", "does not exist"}});
  c.push_back({"index_path_escapes_folder",
               [](const std::string& d) {
                 json wm = shard(d);
                 wm["model.norm.weight"] = "../model-00001-of-00002.safetensors";
                 write_index(d, wm);
               },
               {"model.safetensors.index.json", "model.norm.weight", "must be a plain file name"}});
  c.push_back({"index_misses_a_tensor",
               [](const std::string& d) {
                 json wm = shard(d);
                 wm.erase("model.norm.weight");
                 write_index(d, wm);
               },
               {"model.safetensors.index.json", "model.norm.weight", "does not list"}});
  c.push_back({"index_not_json",
               [](const std::string& d) {
                 shard(d);
                 std::ofstream(d + "/model.safetensors.index.json") << "{\"weight_map\": {";
               },
               {"model.safetensors.index.json", "invalid JSON"}});
  c.push_back({"index_without_weight_map",
               [](const std::string& d) {
                 shard(d);
                 std::ofstream(d + "/model.safetensors.index.json") << "{\"metadata\": {}}";
               },
               {"model.safetensors.index.json", "weight_map"}});
  c.push_back({"tensor_in_two_shards",
               [](const std::string& d) {
                 shard(d);
                 write_safetensors(d + "/model-00003-of-00003.safetensors",
                                   {{"model.norm.weight", zeros(DType::kBF16, {128})}});
               },
               {"model.norm.weight", "appears in both"}});
  c.push_back(
      {"no_weights_at_all", [](const std::string& d) { fs::remove(d + "/" + kSt); }, {"has no model.safetensors"}});
  c.push_back({"weights_file_is_a_directory",
               [](const std::string& d) {
                 fs::remove(d + "/" + kSt);
                 fs::create_directory(d + "/" + kSt);
               },
               {kSt, "not a regular file"}});
  // --- resource limits
  c.push_back({"tensor_claims_1tib",
               [](const std::string& d) { add_huge_tensor(d, false); },
               {"needs 1.00 TiB (", "of memory, but only", "are available"}});
  c.push_back({"misaligned_tensor_claims_1tib",
               [](const std::string& d) { add_huge_tensor(d, true); },
               {kSt, "copying its misaligned tensors needs 1.00 TiB", "are available"}});
  c.push_back({"memory_limit_below_model",
               [](const std::string&) {},
               {"needs", "of memory, but only 1000 bytes are available (MOECEL_MEMORY_LIMIT_BYTES)"},
               "m",
               "MOECEL_MEMORY_LIMIT_BYTES=1000"});
  c.push_back({"memory_limit_invalid",
               [](const std::string&) {},
               {"MOECEL_MEMORY_LIMIT_BYTES must be a byte count", "'lots'"},
               "m",
               "MOECEL_MEMORY_LIMIT_BYTES=lots"});
  // --- tokenizer.json (read by generate only)
  c.push_back({"tokenizer_not_json",
               [](const std::string& d) { std::ofstream(d + "/tokenizer.json") << "{\"model\": [1, 2"; },
               {"tokenizer.json"},
               "m",
               "",
               true});
  c.push_back({"tokenizer_not_utf8",
               [](const std::string& d) { std::ofstream(d + "/tokenizer.json") << "{\"model\": \"\xc3\x28\"}"; },
               {"tokenizer.json", "ill-formed UTF-8", "\\xC3"},
               "m",
               "",
               true});
  return c;
}

class BrokenCorpus : public ::testing::TestWithParam<BrokenCase> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("broken-corpus");
    TestModelOptions opt;
    opt.seed = 5;
    write_test_model(opt, dir_->str() + "/m");
    TestModelOptions o96;
    o96.overrides = {{"down_proj", QuantSpec{4, 32}}};
    o96.config_overrides = {{"intermediate_size", 96}};
    write_test_model(o96, dir_->str() + "/m96");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static ScratchDir* dir_;
};
ScratchDir* BrokenCorpus::dir_ = nullptr;

TEST_P(BrokenCorpus, FailsWithOneClearMessage) {
  const BrokenCase& bc = GetParam();
  const std::string base = dir_->str() + "/" + bc.base, d = dir_->str() + "/case-" + bc.name;
  fs::copy(base, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  bc.make(d);

  std::string env_name, env_value;
  if (!bc.env.empty()) {
    env_name = bc.env.substr(0, bc.env.find('='));
    env_value = bc.env.substr(bc.env.find('=') + 1);
    ::setenv(env_name.c_str(), env_value.c_str(), 1);
  }
  std::vector<std::string> commands = {"generate --model '" + d + "' --prompt-ids 1,2 --max-tokens 2"};
  if (!bc.generate_only) commands.push_back("inspect --model '" + d + "'");
  for (const std::string& cmd : commands) {
    const test::CliResult r = run_cli(cmd);
    const std::string sub = cmd.substr(0, cmd.find(' '));
    std::printf("[broken-corpus] %-38s %-8s exit %d: %s", bc.name.c_str(), sub.c_str(), r.exit_code, r.err.c_str());
    if (r.err.empty() || r.err.back() != '\n') std::printf("\n");
    EXPECT_EQ(r.exit_code, 1) << sub << " should fail with exit code 1 (>128 means a signal)\n" << r.err;
    EXPECT_TRUE(r.err.starts_with("error: ")) << sub << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << sub << ": expected exactly one line:\n" << r.err;
    EXPECT_TRUE(valid_utf8(r.err)) << sub << ": the message is not valid UTF-8";
    for (const std::string& needle : bc.needles) {
      EXPECT_NE(r.err.find(needle), std::string::npos) << sub << ": message lacks '" << needle << "':\n" << r.err;
    }
    for (const char* bad : {"Sanitizer", "runtime error", "terminate called", "Aborted"}) {
      EXPECT_EQ(r.err.find(bad), std::string::npos) << sub << ": " << r.err;
    }
  }
  if (!env_name.empty()) ::unsetenv(env_name.c_str());
  std::error_code ec;
  fs::remove_all(d, ec);
}

INSTANTIATE_TEST_SUITE_P(Cases, BrokenCorpus, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<BrokenCase>& info) { return info.param.name; });

}  // namespace
}  // namespace moecel
