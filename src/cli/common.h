// Options and helpers shared by the subcommands: backend/threads/model options, id lists, the default model.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace moecel::cli {

struct CommonOptions {
  std::string model;  // empty = the bundled default model
  std::string backend = "cpu";
  int threads = 0;        // 0 = all cores
  std::string fused_moe;  // --fused-moe: "on", "off" (bench: a comma-separated list); empty = MOECEL_FUSED_MOE
};

// Adds --model (when with_model), --backend and --threads to a subcommand.
void add_common_options(CLI::App* sub, CommonOptions& o, bool with_model = true);
// Applies --threads and --fused-moe (a single on/off value) and creates the backend.
std::unique_ptr<Backend> make_backend(const CommonOptions& o);
// --model, or the bundled default model (MOECEL_MODEL_DIR, then models/default next to the sources).
std::string model_dir(const CommonOptions& o);
// "1,2,3" -> {1, 2, 3}; throws naming the option for anything that is not a comma-separated list of ints.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& option);

}  // namespace moecel::cli
