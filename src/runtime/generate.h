// The generation loop: batched prefill of the prompt, then token-by-token decode with the KV cache,
// stopping at an end-of-sequence id or after max_tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/moe_dispatch.h"
#include "runtime/sampler.h"

namespace moecel {

struct GenerateOptions {
  int max_tokens = 64;
  SamplerParams sampling;
  bool stop_at_eos = true;
};

struct GenerateResult {
  std::vector<int32_t> output_ids;  // generated ids (the eos id, when hit, is included)
  std::string stop_reason;          // "eos" or "length"
  double prefill_seconds = 0, decode_seconds = 0;
  int decode_steps = 0;  // forward passes of one token
};

// Greedy single-token decode steps on one KV cache. When the backend records decode graphs (CUDA) and the model
// has a device-ids forward, the first step records the step once and every step replays it (no per-op launch
// cost); otherwise each step is forward + argmax. Both give the same ids. MOECEL_CUDA_GRAPH=0 in the
// environment turns graphs off, =1 on. A replay may also run two steps, the second fed the first's token on the
// device (one replay boundary per two tokens; MOECEL_CUDA_GRAPH_STEPS=1 or 2). The stepper must not outlive `cache`
// or the model.
class GreedyStepper {
 public:
  GreedyStepper(Model& model, KvCache& cache);
  ~GreedyStepper();
  GreedyStepper(const GreedyStepper&) = delete;
  GreedyStepper& operator=(const GreedyStepper&) = delete;

  // Runs `id` at position cache.length, appends it to the cache and returns the argmax of the next token. With a
  // decode graph, unless `more` is false (the caller needs no token after this one), the replay after it is enqueued
  // before the wait, fed the returned token on the device: the host's turnaround (reading the token, launching the
  // next replay) then overlaps the device's work. The next call takes that replay (or a step a two-step replay ran
  // beyond this one) when it passes the token it was fed; work nobody takes is discarded (the cache rows it wrote are
  // rewritten before any step reads them).
  int32_t step(int32_t id, bool more = true);
  bool uses_graph() const { return graphs_[0] != nullptr; }
  bool uses_two_step_graph() const { return graphs_[1] != nullptr; }

 private:
  // Records the graph of `steps` decode steps (1 or 2) at the current position; false if the backend has none.
  bool record(int steps);
  // The graph a replay starting at `pos` takes: two steps where allowed, they fit the cache and more are wanted.
  DecodeGraph* pick(int64_t pos, bool more);

  Model& model_;
  KvCache& cache_;
  bool want_graph_;
  int max_steps_;  // decode steps per replay at most (MOECEL_CUDA_GRAPH_STEPS)
  // The graphs' input token and, written by each step's argmax, its output: one (1,) I32 on the backend, so a
  // chained replay or step needs no copy.
  Tensor ids_;
  std::unique_ptr<DecodeGraph> graphs_[2];  // one step, two steps
  moe_trace::Counts graph_dispatches_;      // MoE dispatches of one recorded step (counted once per step taken)
  struct Ahead {                            // the replay enqueued ahead, if any
    int slot;
    int64_t pos;
    int32_t input;  // the token it was fed on the device
    DecodeGraph* graph;
  };
  std::optional<Ahead> ahead_;
  struct Beyond {  // the second step of the last two-step replay waited for, not taken yet
    int64_t pos;
    int32_t input, next;
  };
  std::optional<Beyond> beyond_;
};

// Whether decode graphs are on: MOECEL_CUDA_GRAPH ("0" off, "1" on), else the default.
bool decode_graphs_enabled();

// on_token is called with each new id as soon as it is chosen; returning false stops generation.
GenerateResult generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<bool(int32_t)>& on_token = {});

// Continues a conversation held in `cache`: `tokens` are what cache.length does not hold yet (at least one).
// The last generated id is not fed back, so the cache ends one token short of prompt + output.
GenerateResult generate_into(Model& model, KvCache& cache, std::span<const int32_t> tokens, const GenerateOptions& opt,
                             const std::function<bool(int32_t)>& on_token = {});

}  // namespace moecel
