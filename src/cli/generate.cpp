// `moecel generate`: prompt in, tokens out (streamed as they are produced), with timing figures.
#include "runtime/generate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/common.h"
#include "core/error.h"
#include "models/registry.h"
#include "tokenizer/tokenizer.h"

namespace moecel::cli {
namespace {

struct GenerateArgs {
  CommonOptions common;
  std::string prompt_ids, prompt;
  int max_tokens = 64;
  SamplerParams sampling;
  bool json = false;
  bool ignore_eos = false;
};

void run_generate(const GenerateArgs& a) {
  validate(a.sampling);
  MOECEL_CHECK(a.prompt_ids.empty() != a.prompt.empty(), "give exactly one of --prompt TEXT or --prompt-ids 1,2,3");
  const std::string dir = model_dir(a.common);
  std::optional<Tokenizer> tok;
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    tok = Tokenizer::load(dir + "/tokenizer.json");
  } else {
    MOECEL_CHECK(a.prompt.empty(), "--prompt needs a tokenizer, but {} has no tokenizer.json; use --prompt-ids", dir);
  }
  std::vector<int32_t> prompt =
      a.prompt.empty() ? parse_ids(a.prompt_ids, "--prompt-ids") : tok->encode(a.prompt, true);
  auto backend = make_backend(a.common);
  auto model = load_model(dir, *backend);
  GenerateOptions opt;
  opt.max_tokens = a.max_tokens;
  opt.sampling = a.sampling;
  opt.stop_at_eos = !a.ignore_eos;
  std::optional<StreamingDecoder> stream;
  if (tok) stream.emplace(*tok, true);
  if (!a.json && tok && !a.prompt.empty()) {
    std::printf("%s", a.prompt.c_str());
    std::fflush(stdout);
  }
  auto on_token = [&](int32_t id) {
    if (!a.json) {
      if (stream) {
        std::string piece = stream->feed(id);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
      } else {
        std::printf("%d ", id);
      }
      std::fflush(stdout);
    }
    return true;
  };
  GenerateResult r = generate(*model, prompt, opt, on_token);
  const double prefill_tps = r.prefill_seconds > 0 ? double(prompt.size()) / r.prefill_seconds : 0;
  const double decode_tps = r.decode_seconds > 0 ? double(r.decode_steps) / r.decode_seconds : 0;
  if (a.json) {
    nlohmann::json j = {{"prompt_ids", prompt},
                        {"output_ids", r.output_ids},
                        {"stop_reason", r.stop_reason},
                        {"prompt_tokens", prompt.size()},
                        {"generated_tokens", r.output_ids.size()},
                        {"prefill_seconds", r.prefill_seconds},
                        {"decode_seconds", r.decode_seconds},
                        {"prefill_tokens_per_second", prefill_tps},
                        {"decode_tokens_per_second", decode_tps}};
    if (tok) j["text"] = tok->decode(r.output_ids, true);
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    if (stream) {
      std::string rest = stream->flush();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
    }
    std::printf("\n");
    std::fflush(stdout);  // keep the text and the stats line on separate lines when both go to one terminal
    std::fprintf(stderr, "prompt: %zu tokens, %.1f tok/s | generated: %zu tokens, %.1f tok/s | stop: %s\n",
                 prompt.size(), prefill_tps, r.output_ids.size(), decode_tps, r.stop_reason.c_str());
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate tokens from a prompt");
  add_common_options(sub, a->common);
  sub->add_option("-p,--prompt", a->prompt, "Prompt text (tokenized with the model's tokenizer.json)");
  sub->add_option("--prompt-ids", a->prompt_ids, "Prompt as comma-separated token ids, e.g. 1,2,3");
  sub->add_option("-n,--max-tokens", a->max_tokens, "Maximum number of tokens to generate")
      ->default_val(64)
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--temperature", a->sampling.temperature, "Sampling temperature; 0 = greedy")->default_val(0.0);
  sub->add_option("--top-k", a->sampling.top_k, "Keep the k most likely tokens (0 = off)")->default_val(0);
  sub->add_option("--top-p", a->sampling.top_p, "Nucleus sampling mass (1 = off)")->default_val(1.0);
  sub->add_option("--min-p", a->sampling.min_p, "Drop tokens below min-p times the top probability")->default_val(0.0);
  sub->add_option("--seed", a->sampling.seed, "Random seed for sampling")->default_val(0);
  sub->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-sequence tokens");
  sub->add_flag("--json", a->json, "Print one JSON object with ids and timings instead of streaming");
  sub->callback([a] { run_generate(*a); });
}

}  // namespace moecel::cli
