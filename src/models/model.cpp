// Model helpers shared by all architectures.
#include "models/model.h"

#include "core/error.h"

namespace moecel {

KvCache Model::make_cache(int64_t capacity) {
  MOECEL_CHECK(capacity >= 1, "context size must be positive, got {}", capacity);
  if (info_.max_position_embeddings > 0 && capacity > info_.max_position_embeddings) {
    fail("context of {} tokens exceeds the model's max_position_embeddings {}", capacity,
         info_.max_position_embeddings);
  }
  KvCache cache;
  cache.capacity = capacity;
  const int64_t width = info_.n_kv_heads * info_.head_dim;
  for (int64_t l = 0; l < info_.n_layers; ++l) {
    cache.k.push_back(backend_->alloc(DType::kF32, {capacity, width}));
    cache.v.push_back(backend_->alloc(DType::kF32, {capacity, width}));
  }
  return cache;
}

Tensor Model::forward_device(const Tensor&, KvCache&, bool) {
  fail("model type '{}' has no device-ids forward (decode graphs)", info_.model_type);
}

void Model::greedy_step_device(const Tensor& ids, KvCache& cache, Tensor& next) {
  backend_->argmax_to(forward_device(ids, cache, false), next);
}

}  // namespace moecel
