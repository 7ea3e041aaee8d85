// Small ops of the CUDA backend: embedding lookup (dense or quantized table), add, clamp and argmax.
// Used by: CudaBackend::embedding, add, clamp, argmax.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {

// ids (n_tokens,) -> out (n_tokens, table.in): row ids[t] of slice 0 of the table, dequantized exactly like
// dequantize_row (s * q then + b, two f32 roundings). An id outside [0, table.out) raises kErrTokenId and
// gives a NaN row.
void launch_embedding(const Ctx& ctx, const WeightView& table, const int32_t* ids, int64_t n_tokens, float* out);

// out = a + b over n elements (out may alias either).
void launch_add(const Ctx& ctx, const float* a, const float* b, int64_t n, float* out);

// x = clamp(x, -limit, limit) over n elements, with std::clamp's NaN behaviour (NaN stays NaN).
void launch_clamp(const Ctx& ctx, float* x, int64_t n, float limit);

// k, v (n_tokens, width) -> rows [pos0, pos0 + n_tokens) of k_cache, v_cache (capacity, width); pos0 is read
// from ctx.step_pos when set (decode graphs). Rows past the capacity are not written.
void launch_kv_store(const Ctx& ctx, const float* k, const float* v, int64_t n_tokens, int64_t width, int64_t pos0,
                     int64_t capacity, float* k_cache, float* v_cache);

// logits (n_rows, vocab) -> out (n_rows,) device I32: the index of each row's maximum, the lowest on ties.
// `scratch` holds argmax_scratch_bytes(n_rows) bytes of device memory; uses ctx.block_counter.
size_t argmax_scratch_bytes(int64_t n_rows);
// advance (optional): a device word the last block increments once the ids are written (a decode graph's step
// position, so the next step needs no copy of it); with one row, host_out (kNextWords mapped pinned words, optional)
// also receives the id, in word (*advance % kNextWords) read before the increment (so the host needs no copy back
// either).
void launch_argmax(const Ctx& ctx, const float* logits, int64_t n_rows, int64_t vocab, int32_t* out, void* scratch,
                   int64_t* advance = nullptr, int32_t* host_out = nullptr);

}  // namespace moecel::cuda
