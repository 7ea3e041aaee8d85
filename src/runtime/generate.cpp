// Generation loop. Greedy decoding asks the backend for the argmax so logits need not leave the device.
#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace moecel {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GenerateResult generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<bool(int32_t)>& on_token) {
  MOECEL_CHECK(!prompt.empty(), "the prompt is empty: give at least one token");
  MOECEL_CHECK(opt.max_tokens >= 0, "--max-tokens must be >= 0, got {}", opt.max_tokens);
  const ModelInfo& info = model.info();
  const int64_t capacity = int64_t(prompt.size()) + std::max(opt.max_tokens, 1);
  MOECEL_CHECK(info.max_position_embeddings <= 0 || capacity <= info.max_position_embeddings,
               "prompt ({} tokens) plus --max-tokens ({}) exceeds the model's context of {} tokens", prompt.size(),
               opt.max_tokens, info.max_position_embeddings);
  KvCache cache = model.make_cache(capacity);
  return generate_into(model, cache, prompt, opt, on_token);
}

GenerateResult generate_into(Model& model, KvCache& cache, std::span<const int32_t> tokens,
                             const GenerateOptions& opt, const std::function<bool(int32_t)>& on_token) {
  MOECEL_CHECK(!tokens.empty(), "nothing to run: give at least one new token");
  const ModelInfo& info = model.info();
  MOECEL_CHECK(cache.length + int64_t(tokens.size()) + std::max(opt.max_tokens, 1) - 1 <= cache.capacity,
               "context full: {} cached + {} new + {} to generate exceeds {} tokens", cache.length, tokens.size(),
               opt.max_tokens, cache.capacity);
  Backend& be = model.backend();
  Sampler sampler(opt.sampling);
  GenerateResult res;
  res.stop_reason = "length";
  if (opt.max_tokens == 0) return res;

  std::vector<float> host_logits(static_cast<size_t>(info.vocab_size));
  auto pick = [&](const Tensor& logits) {
    if (sampler.greedy()) return be.argmax(logits)[0];
    be.to_host(logits, host_logits.data());
    return sampler.sample(host_logits);
  };

  auto t0 = std::chrono::steady_clock::now();
  int32_t next = pick(model.forward(tokens, cache, false));
  be.synchronize();
  res.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (;;) {
    res.output_ids.push_back(next);
    if (on_token && !on_token(next)) break;
    if (opt.stop_at_eos && std::find(info.eos_token_ids.begin(), info.eos_token_ids.end(), next) !=
                               info.eos_token_ids.end()) {
      res.stop_reason = "eos";
      break;
    }
    if (int(res.output_ids.size()) >= opt.max_tokens) break;
    const int32_t id = next;
    next = pick(model.forward(std::span<const int32_t>(&id, 1), cache, false));
    ++res.decode_steps;
  }
  be.synchronize();
  res.decode_seconds = seconds_since(t0);
  return res;
}

}  // namespace moecel
