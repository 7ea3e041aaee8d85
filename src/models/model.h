// The model interface the runtime drives: one forward over a run of tokens that extends a KV cache.
// Architectures implement it in one file each (olmoe.cpp, ...) and register a factory in registry.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace moecel {

struct ModelInfo {
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_moe_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  std::vector<int32_t> eos_token_ids;
  size_t weight_bytes = 0;            // all weights as stored
  size_t active_bytes_per_token = 0;  // weights read by one decode step (top-k experts only)
};

// Per-layer K and V rows (capacity, n_kv_heads * head_dim) on the backend; `length` tokens are filled.
struct KvCache {
  std::vector<Tensor> k, v;
  int64_t length = 0;
  int64_t capacity = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelInfo& info() const { return info_; }
  Backend& backend() const { return *backend_; }

  KvCache make_cache(int64_t capacity);
  // Runs ids at positions [cache.length, cache.length + n) and appends them to the cache.
  // Returns F32 logits on the backend: (n, vocab_size) when all_logits, else (1, vocab_size) of the last token.
  virtual Tensor forward(std::span<const int32_t> ids, KvCache& cache, bool all_logits) = 0;
  // The same with the ids already on the backend ((n,) I32, trusted to be in the vocabulary): never waits for
  // the host, so a backend can record it as a decode graph. Models without it say false (plain forward only).
  virtual bool has_device_forward() const { return false; }
  virtual Tensor forward_device(const Tensor& ids, KvCache& cache, bool all_logits);
  // A greedy decode step on the device: forward_device of one token, then its argmax written to next ((1,) I32).
  // A model may hand the backend its vocabulary projection and the argmax as one op.
  virtual void greedy_step_device(const Tensor& ids, KvCache& cache, Tensor& next);

 protected:
  explicit Model(Backend& backend) : backend_(&backend) {}
  ModelInfo info_;
  Backend* backend_;
};

}  // namespace moecel
