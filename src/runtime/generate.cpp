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

namespace {

// MOECEL_CUDA_GRAPH_STEPS: decode steps per graph replay at most (1 or 2; unset: 2).
int graph_steps_from_env() {
  const char* v = std::getenv("MOECEL_CUDA_GRAPH_STEPS");
  if (v == nullptr || *v == '\0') return 2;
  MOECEL_CHECK(std::strcmp(v, "1") == 0 || std::strcmp(v, "2") == 0, "MOECEL_CUDA_GRAPH_STEPS must be 1 or 2, got '{}'",
               v);
  return v[0] - '0';
}

}  // namespace

GreedyStepper::GreedyStepper(Model& model, KvCache& cache)
    : model_(model),
      cache_(cache),
      want_graph_(decode_graphs_enabled() && model.has_device_forward()),
      max_steps_(graph_steps_from_env()) {}

GreedyStepper::~GreedyStepper() {
  if (!ahead_) return;
  try {
    ahead_->graph->wait(ahead_->slot);
  } catch (const std::exception&) {  // a replay nobody asked for: its errors are not the caller's
  }
}

bool GreedyStepper::record(int steps) {
  Backend& be = model_.backend();
  if (!ids_.data) ids_ = be.alloc(DType::kI32, {1});
  const int64_t len = cache_.length;
  std::optional<moe_trace::Recording> recording;  // one step's MoE dispatches, counted once per step taken
  if (steps == 1) recording.emplace();
  std::unique_ptr<DecodeGraph> g = be.capture_decode(
      [&] {
        for (int s = 0; s < steps; ++s) model_.greedy_step_device(ids_, cache_, ids_);
      },
      ids_, ids_);
  cache_.length = len;  // recording ran nothing
  if (!g) return false;
  MOECEL_CHECK(g->steps() == steps, "decode graph: recorded {} steps, expected {}", g->steps(), steps);
  if (recording) graph_dispatches_ = recording->counts();
  graphs_[steps - 1] = std::move(g);
  return true;
}

DecodeGraph* GreedyStepper::pick(int64_t pos, bool more) {
  // pos >= cache_.length, so the cache also holds both steps from its current length, where recording validates.
  const bool two = max_steps_ == 2 && more && pos + 2 <= cache_.capacity;
  if (two && !graphs_[1]) record(2);
  return two && graphs_[1] ? graphs_[1].get() : graphs_[0].get();
}

int32_t GreedyStepper::step(int32_t id, bool more) {
  const ModelInfo& info = model_.info();
  MOECEL_CHECK(id >= 0 && id < info.vocab_size, "token id {} is outside the vocabulary [0, {})", id, info.vocab_size);
  MOECEL_CHECK(cache_.length + 1 <= cache_.capacity, "context of {} tokens exceeds the KV cache capacity {}",
               cache_.length + 1, cache_.capacity);
  Backend& be = model_.backend();
  if (want_graph_ && !graphs_[0] && !record(1)) want_graph_ = false;  // the backend has no graphs
  if (graphs_[0]) {
    const int64_t pos = cache_.length;
    if (beyond_ && beyond_->pos == pos && beyond_->input == id) {  // the last replay's second step ran this one
      const int32_t next = beyond_->next;
      beyond_.reset();
      moe_trace::replayed_step(graph_dispatches_);
      cache_.length += 1;
      return next;
    }
    beyond_.reset();
    int slot = 0;
    DecodeGraph* g = nullptr;
    if (ahead_ && ahead_->pos == pos && ahead_->input == id) {
      slot = ahead_->slot;  // already running
      g = ahead_->graph;
    } else {
      if (ahead_) ahead_->graph->wait(ahead_->slot);  // not the replay wanted (another token or position): discarded
      g = pick(pos, more);
      g->launch(id, false, pos, slot);
    }
    ahead_.reset();
    const int64_t after = pos + g->steps();  // where the next replay starts
    const bool go_ahead = more && after + 1 <= cache_.capacity;
    DecodeGraph* ga = go_ahead ? pick(after, true) : nullptr;
    if (go_ahead) ga->launch(0, true, after, 1 - slot);
    const int32_t last = g->wait(slot);
    const int32_t next = g->output(slot, 0);
    if (g->steps() == 2) beyond_ = Beyond{pos + 1, next, last};
    if (go_ahead) ahead_ = Ahead{1 - slot, after, last, ga};
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
