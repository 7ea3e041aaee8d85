// `moecel chat`: an interactive, streaming, multi-turn chat using the model's chat template. The KV cache is
// kept across turns: each turn renders the whole conversation and only the tokens past the longest common
// prefix with what the cache holds are run.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/common.h"
#include "core/error.h"
#include "models/registry.h"
#include "runtime/generate.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moecel::cli {
namespace {

struct ChatArgs {
  CommonOptions common;
  std::string system;
  int max_tokens = 512;
  int64_t ctx_size = 4096;
  SamplerParams sampling;
};

void run_chat(const ChatArgs& a) {
  validate(a.sampling);
  const std::string dir = model_dir(a.common);
  MOECEL_CHECK(std::filesystem::exists(dir + "/tokenizer.json"), "{} has no tokenizer.json: chat needs one", dir);
  MOECEL_CHECK(ChatTemplate::available(dir),
               "{} has no chat_template in tokenizer_config.json: use `moecel generate --prompt` instead", dir);
  Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
  ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(dir + "/tokenizer_config.json");
  auto backend = make_backend(a.common);
  auto model = load_model(dir, *backend);
  const int64_t max_pos = model->info().max_position_embeddings;
  KvCache cache = model->make_cache(max_pos > 0 ? std::min(a.ctx_size, max_pos) : a.ctx_size);
  std::vector<int32_t> cached;  // the ids whose K/V rows the cache holds
  std::vector<ChatMessage> messages;
  if (!a.system.empty()) messages.push_back({"system", a.system});
  std::fprintf(stderr, "chat with %s (empty line or Ctrl-D to quit)\n", dir.c_str());
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    messages.push_back({"user", line});
    std::vector<int32_t> ids = tok.encode(tmpl.render(messages, true), false);
    size_t common = 0;
    while (common < cached.size() && common < ids.size() && cached[common] == ids[common]) ++common;
    if (common == ids.size()) --common;  // at least one token must run to get logits
    cache.length = int64_t(common);
    GenerateOptions opt;
    opt.sampling = a.sampling;
    opt.max_tokens = int(std::min<int64_t>(a.max_tokens, cache.capacity - int64_t(ids.size())));
    MOECEL_CHECK(opt.max_tokens > 0, "the conversation ({} tokens) fills the context of {} tokens", ids.size(),
                 cache.capacity);
    StreamingDecoder stream(tok, true);
    GenerateResult r = generate_into(*model, cache, std::span(ids).subspan(common), opt, [&](int32_t id) {
      std::string piece = stream.feed(id);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::string rest = stream.flush();
    std::printf("%s\n", rest.c_str());
    std::vector<int32_t> reply = r.output_ids;
    if (r.stop_reason == "eos" && !reply.empty()) reply.pop_back();
    messages.push_back({"assistant", tok.decode(reply, true)});
    cached = ids;
    cached.insert(cached.end(), r.output_ids.begin(), r.output_ids.end());
    cached.resize(size_t(cache.length));  // the last generated id was never run
    std::fprintf(stderr, "[%zu tokens, %.1f tok/s]\n", r.output_ids.size(),
                 r.decode_seconds > 0 ? r.decode_steps / r.decode_seconds : 0.0);
  }
}

}  // namespace

void register_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* sub = app.add_subcommand("chat", "Interactive multi-turn chat with the model's chat template");
  add_common_options(sub, a->common);
  sub->add_option("--system", a->system, "System message");
  sub->add_option("-n,--max-tokens", a->max_tokens, "Maximum tokens per reply")
      ->default_val(512)
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("-c,--ctx-size", a->ctx_size, "Context size in tokens")
      ->default_val(4096)
      ->check(CLI::Range(16, 1 << 24));
  sub->add_option("--temperature", a->sampling.temperature, "Sampling temperature; 0 = greedy")->default_val(0.7);
  sub->add_option("--top-k", a->sampling.top_k, "Keep the k most likely tokens (0 = off)")->default_val(40);
  sub->add_option("--top-p", a->sampling.top_p, "Nucleus sampling mass (1 = off)")->default_val(0.95);
  sub->add_option("--min-p", a->sampling.min_p, "Drop tokens below min-p times the top probability")->default_val(0.05);
  sub->add_option("--seed", a->sampling.seed, "Random seed")->default_val(0);
  sub->callback([a] { run_chat(*a); });
}

}  // namespace moecel::cli
