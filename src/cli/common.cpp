// Shared CLI helpers.
#include "cli/common.h"

#include <charconv>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/thread_pool.h"
#include "models/moe_dispatch.h"

namespace moecel::cli {

void add_common_options(CLI::App* sub, CommonOptions& o, bool with_model) {
  if (with_model) {
    sub->add_option("-m,--model", o.model,
                    "Model folder (config.json, *.safetensors, tokenizer.json); default: the bundled model");
  }
  sub->add_option("--backend", o.backend, "Compute backend: cpu or cuda")->default_val("cpu");
  sub->add_option("-t,--threads", o.threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 1024));
  sub->add_option("--fused-moe", o.fused_moe,
                  "Fused single-token decode-MoE path: on or off (default on; env MOECEL_FUSED_MOE)");
}

std::unique_ptr<Backend> make_backend(const CommonOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  // Read MOECEL_FUSED_MOE* now, so a bad value stops the command before it loads or prints anything
  // (the first MoE layer would otherwise read them mid-generation).
  FusedMoeSettings s = fused_moe_settings();
  if (!o.fused_moe.empty()) {
    s.enabled = parse_on_off(o.fused_moe.c_str(), "--fused-moe");
    set_fused_moe_settings(s);
  }
  return moecel::make_backend(o.backend);
}

std::string model_dir(const CommonOptions& o) {
  if (!o.model.empty()) return o.model;
  if (const char* env = std::getenv("MOECEL_MODEL_DIR"); env && *env) return env;
  const std::string bundled = std::string(MOECEL_SOURCE_DIR) + "/models/default";
  MOECEL_CHECK(std::filesystem::exists(bundled + "/config.json"),
               "no --model given and no bundled model at {}: pass --model DIR", bundled);
  return bundled;
}

std::vector<int32_t> parse_ids(const std::string& text, const std::string& option) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    MOECEL_CHECK(!item.empty() && ec == std::errc() && p == item.data() + item.size() && v >= 0 && v <= INT32_MAX,
                 "{}: '{}' is not a token id (expected comma-separated non-negative integers like 1,2,3)", option,
                 item);
    ids.push_back(int32_t(v));
    pos = end + 1;
  }
  return ids;
}

}  // namespace moecel::cli
