// The generation loop: batched prefill of the prompt, then token-by-token decode with the KV cache,
// stopping at an end-of-sequence id or after max_tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "models/model.h"
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

// on_token is called with each new id as soon as it is chosen; returning false stops generation.
GenerateResult generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<bool(int32_t)>& on_token = {});

// Continues a conversation held in `cache`: `tokens` are what cache.length does not hold yet (at least one).
// The last generated id is not fed back, so the cache ends one token short of prompt + output.
GenerateResult generate_into(Model& model, KvCache& cache, std::span<const int32_t> tokens,
                             const GenerateOptions& opt, const std::function<bool(int32_t)>& on_token = {});

}  // namespace moecel
