// Generation loop. Greedy decoding asks the backend for the argmax so logits need not leave the device.
#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "models/moe_dispatch.h"

namespace moecel {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool decode_graphs_enabled() {
  constexpr bool kDefault = true;
  const char* v = std::getenv("MOECEL_CUDA_GRAPH");
  if (v == nullptr || *v == '\0') return kDefault;
  return std::strcmp(v, "0") != 0;
}

GreedyStepper::GreedyStepper(Model& model, KvCache& cache)
    : model_(model), cache_(cache), want_graph_(decode_graphs_enabled() && model.has_device_forward()) {}

GreedyStepper::~GreedyStepper() {
  if (!ahead_) return;
  try {
    graph_->wait(ahead_->slot);
  } catch (const std::exception&) {  // a step nobody asked for: its errors are not the caller's
  }
}

int32_t GreedyStepper::step(int32_t id, bool more) {
  const ModelInfo& info = model_.info();
  MOECEL_CHECK(id >= 0 && id < info.vocab_size, "token id {} is outside the vocabulary [0, {})", id, info.vocab_size);
  MOECEL_CHECK(cache_.length + 1 <= cache_.capacity, "context of {} tokens exceeds the KV cache capacity {}",
               cache_.length + 1, cache_.capacity);
  Backend& be = model_.backend();
  if (want_graph_ && !graph_) {
    ids_ = be.alloc(DType::kI32, {1});
    const int64_t len = cache_.length;
    moe_trace::Recording recording;  // the graph's MoE dispatches, counted once per replay
    graph_ = be.capture_decode(
        [&] {
          Tensor logits = model_.forward_device(ids_, cache_, false);  // (1, vocab_size)
          be.argmax_to(logits, ids_);
        },
        ids_, ids_);
    cache_.length = len;  // recording ran nothing
    graph_dispatches_ = recording.counts();
    if (!graph_) want_graph_ = false;  // the backend has no graphs
  }
  if (graph_) {
    const int64_t pos = cache_.length;
    int slot = 0;
    if (ahead_ && ahead_->pos == pos && ahead_->input == id) {
      slot = ahead_->slot;  // already running
    } else {
      if (ahead_) graph_->wait(ahead_->slot);  // not the step wanted (another token or position): discarded
      graph_->launch(id, false, pos, slot);
    }
    ahead_.reset();
    const bool go_ahead = more && pos + 2 <= cache_.capacity;
    if (go_ahead) graph_->launch(0, true, pos + 1, 1 - slot);
    const int32_t next = graph_->wait(slot);
    if (go_ahead) ahead_ = Ahead{1 - slot, pos + 1, next};
    moe_trace::replayed_step(graph_dispatches_);
    cache_.length += 1;
    return next;
  }
  moe_trace::DecodeStep step;
  return be.argmax(model_.forward(std::span<const int32_t>(&id, 1), cache_, false))[0];
}

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

GenerateResult generate_into(Model& model, KvCache& cache, std::span<const int32_t> tokens, const GenerateOptions& opt,
                             const std::function<bool(int32_t)>& on_token) {
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

  GreedyStepper stepper(model, cache);
  auto t0 = std::chrono::steady_clock::now();
  int32_t next = pick(model.forward(tokens, cache, false));
  be.synchronize();
  res.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (;;) {
    res.output_ids.push_back(next);
    if (on_token && !on_token(next)) break;
    if (opt.stop_at_eos &&
        std::find(info.eos_token_ids.begin(), info.eos_token_ids.end(), next) != info.eos_token_ids.end()) {
      res.stop_reason = "eos";
      break;
    }
    if (int(res.output_ids.size()) >= opt.max_tokens) break;
    const int32_t id = next;
    if (sampler.greedy()) {
      next = stepper.step(id, int(res.output_ids.size()) + 1 < opt.max_tokens);
    } else {
      moe_trace::DecodeStep step;
      next = pick(model.forward(std::span<const int32_t>(&id, 1), cache, false));
    }
    ++res.decode_steps;
  }
  be.synchronize();
  res.decode_seconds = seconds_since(t0);
  return res;
}

}  // namespace moecel
