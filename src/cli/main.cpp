// moecel: the command-line entry point. Each subcommand lives in its own file and registers itself here.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/error.h"
#include "models/moe_dispatch.h"

namespace moecel::cli {
void register_generate(CLI::App& app);
void register_logits(CLI::App& app);
void register_inspect(CLI::App& app);
void register_make_test_model(CLI::App& app);
void register_bench(CLI::App& app);
void register_chat(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_detokenize(CLI::App& app);
}  // namespace moecel::cli

int main(int argc, char** argv) {
  CLI::App app{"moecel: fast batch-1 inference for Mixture-of-Experts language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moecel 0.1.0");
  using namespace moecel::cli;
  register_generate(app);
  register_logits(app);
  register_inspect(app);
  register_make_test_model(app);
  register_bench(app);
  register_chat(app);
  register_tokenize(app);
  register_detokenize(app);
  try {
    moecel::moe_trace::install_from_env();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {  // moecel::Error and anything else: one printable line
    std::fprintf(stderr, "error: %s\n", moecel::printable_message(e.what()).c_str());
    return 1;
  }
  return 0;
}
