// Prefill attention in tiles: a block takes kTileQ consecutive queries of one head (kQPerWarp per warp) and walks
// the keys in tiles of kTileK rows that all of its queries share, three in shared memory (two in flight, cp.async).
// Scores: lane l scores key l of the tile against the warp's queries (q . k from shared memory, no shuffles);
// online softmax per query; then acc += p * v with the probabilities broadcast by shuffles and each lane holding 4
// consecutive dims per 128. One key-row fetch serves kTileQ queries instead of one, which made the per-token kernel
// (attention.cu) wait on L2 for every row. Decode (one token) stays on the per-token kernel.
#include "backend/cuda/attention.cuh"
#include "backend/cuda/mma_frag.cuh"

namespace moecel::cuda {
namespace {

constexpr int kTileWarps = 8;
// 2 queries per warp: 98 us per OLMoE layer at 512 tokens on the H200, 4: 125 us (one block per SM), 1: 142 us.
constexpr int kQPerWarp = 2;
constexpr int kTileQ = kTileWarps * kQPerWarp;  // queries per block
constexpr int kTileK = 32;                      // keys per tile: one per lane
constexpr int kKvStages = 3;                    // K/V tiles in shared memory: the one in use and two in flight
constexpr int kPad = 4;                         // floats after each K row: lane l's float4 reads of row l spread banks

// Floats of dynamic shared memory: the query tile, then kKvStages K tiles and as many V tiles.
constexpr int64_t tile_smem_floats(int head_dim) {
  return int64_t(kTileQ) * head_dim + kKvStages * int64_t(kTileK) * (2 * head_dim + kPad);
}

// Loads cache rows [k0, k0 + kTileK) of one kv head (zeros past row `last`) into ks / vs with cp.async.
__device__ __forceinline__ void load_kv_tile(const float* kc, const float* vc, int64_t k0, int64_t last,
                                             int64_t kv_width, int64_t kv_off, int head_dim, float* ks, float* vs) {
  const int per_row = head_dim / 4;
  for (int i = threadIdx.x; i < kTileK * per_row; i += kTileWarps * 32) {
    const int r = i / per_row, c = (i % per_row) * 4;
    const int64_t p = k0 + r;
    const bool valid = p <= last;
    const int64_t off = (valid ? p : 0) * kv_width + kv_off + c;
    cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(ks + r * (head_dim + kPad) + c)), kc + off, valid);
    cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(vs + r * head_dim + c)), vc + off, valid);
  }
  cp_async_commit();
}

// Preconditions: blockDim.x == kTileWarps * 32; grid (n_heads, ceil(n_tokens / kTileQ)); head_dim % 4 == 0 and
// head_dim <= 32 * DPL; dynamic shared memory tile_smem_floats(head_dim) floats; cache rows [0, pos0 + n_tokens).
template <int DPL>
__global__ void __launch_bounds__(kTileWarps * 32)
    attention_tile_kernel(const float* q, const float* kc, const float* vc, int64_t pos0, const int64_t* step_pos,
                          int64_t n_tokens, int n_heads, int n_kv_heads, int head_dim, float scale, int window,
                          float* out) {
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);
  float* ks = qs + kTileQ * head_dim;
  float* vs = ks + kKvStages * kTileK * (head_dim + kPad);
  pdl_enter();
  if (step_pos) pos0 = *step_pos;
  const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t0 = int64_t(gridDim.y - 1 - blockIdx.y) * kTileQ;  // the tiles with the most keys start first
  const int nq = int(min(int64_t(kTileQ), n_tokens - t0));
  const int64_t q_width = int64_t(n_heads) * head_dim, kv_width = int64_t(n_kv_heads) * head_dim;
  const int64_t kv_off = int64_t(h / (n_heads / n_kv_heads)) * head_dim;
  const int64_t last = pos0 + t0 + nq - 1;  // the last key any query of the block sees
  const int64_t first = window > 0 ? max(int64_t(0), pos0 + t0 - window + 1) : 0;
  const int64_t k_begin = first / kTileK * kTileK;
  const int n_tiles = int((last - k_begin) / kTileK + 1);
  auto load = [&](int tile) {  // one commit group per call, empty past the last tile
    const int b = tile % kKvStages;
    if (tile < n_tiles) {
      load_kv_tile(kc, vc, k_begin + int64_t(tile) * kTileK, last, kv_width, kv_off, head_dim,
                   ks + b * kTileK * (head_dim + kPad), vs + b * kTileK * head_dim);
    } else {
      cp_async_commit();
    }
  };
  load(0);
  load(1);
  for (int i = threadIdx.x; i < kTileQ * head_dim; i += kTileWarps * 32) {
    const int qi = i / head_dim, d = i % head_dim;
    qs[i] = qi < nq ? q[(t0 + qi) * q_width + int64_t(h) * head_dim + d] : 0.0f;
  }
  float m[kQPerWarp], l[kQPerWarp], acc[kQPerWarp][DPL];  // l: per lane
  int64_t pos[kQPerWarp];
#pragma unroll
  for (int j = 0; j < kQPerWarp; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
    pos[j] = pos0 + t0 + warp * kQPerWarp + j;
#pragma unroll
    for (int u = 0; u < DPL; ++u) acc[j][u] = 0.0f;
  }
  const float* qw = qs + warp * kQPerWarp * head_dim;
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile % kKvStages;
    cp_async_wait<1>();  // this thread's copies of this tile have landed (the next tile's may be in flight)
    // This tile (and, the first time, the query tile) is in shared memory for every warp, and every warp is done
    // with the previous tile, whose buffer the load below refills.
    __syncthreads();
    load(tile + 2);
    const float* kt = ks + buf * kTileK * (head_dim + kPad);
    const float* vt = vs + buf * kTileK * head_dim;
    const int64_t key = k_begin + int64_t(tile) * kTileK + lane;
    float s[kQPerWarp];
#pragma unroll
    for (int j = 0; j < kQPerWarp; ++j) s[j] = 0.0f;
    const float* kr = kt + lane * (head_dim + kPad);
#pragma unroll 4
    for (int d = 0; d < head_dim; d += 4) {
      const float4 k4 = *reinterpret_cast<const float4*>(kr + d);
#pragma unroll
      for (int j = 0; j < kQPerWarp; ++j) {
        const float4 q4 = *reinterpret_cast<const float4*>(qw + j * head_dim + d);  // a broadcast
        s[j] = fmaf(q4.x, k4.x, s[j]);
        s[j] = fmaf(q4.y, k4.y, s[j]);
        s[j] = fmaf(q4.z, k4.z, s[j]);
        s[j] = fmaf(q4.w, k4.w, s[j]);
      }
    }
    float p[kQPerWarp];
#pragma unroll
    for (int j = 0; j < kQPerWarp; ++j) {
      const int64_t lo = window > 0 ? max(int64_t(0), pos[j] - window + 1) : 0;
      const bool valid = key <= pos[j] && key >= lo && warp * kQPerWarp + j < nq;
      const float sc = valid ? s[j] * scale : -INFINITY;
      const float m_new = fmaxf(m[j], warp_max(sc));
      if (m_new == -INFINITY) {  // no key of this query so far (uniform over the warp)
        p[j] = 0.0f;
        continue;
      }
      p[j] = valid ? expf(sc - m_new) : 0.0f;
      const float corr = m[j] == -INFINITY ? 0.0f : expf(m[j] - m_new);
      l[j] = fmaf(l[j], corr, p[j]);  // this lane's keys only: one warp sum at the end
#pragma unroll
      for (int u = 0; u < DPL; ++u) acc[j][u] *= corr;
      m[j] = m_new;
    }
#pragma unroll 4
    for (int r = 0; r < kTileK; ++r) {
      float pr[kQPerWarp];
#pragma unroll
      for (int j = 0; j < kQPerWarp; ++j) pr[j] = __shfl_sync(0xffffffffu, p[j], r);
#pragma unroll
      for (int c = 0; c < DPL / 4; ++c) {
        const int d = 128 * c + 4 * lane;
        const float4 v4 = d < head_dim ? *reinterpret_cast<const float4*>(vt + r * head_dim + d) : float4{};
#pragma unroll
        for (int j = 0; j < kQPerWarp; ++j) {
          acc[j][4 * c] = fmaf(pr[j], v4.x, acc[j][4 * c]);
          acc[j][4 * c + 1] = fmaf(pr[j], v4.y, acc[j][4 * c + 1]);
          acc[j][4 * c + 2] = fmaf(pr[j], v4.z, acc[j][4 * c + 2]);
          acc[j][4 * c + 3] = fmaf(pr[j], v4.w, acc[j][4 * c + 3]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kQPerWarp; ++j) {
    const int qi = warp * kQPerWarp + j;
    if (qi >= nq) continue;
    const float inv = 1.0f / warp_sum(l[j]);
    float* o = out + (t0 + qi) * q_width + int64_t(h) * head_dim;
#pragma unroll
    for (int c = 0; c < DPL / 4; ++c) {
      const int d = 128 * c + 4 * lane;
      if (d < head_dim) {
        *reinterpret_cast<float4*>(o + d) =
            float4{acc[j][4 * c] * inv, acc[j][4 * c + 1] * inv, acc[j][4 * c + 2] * inv, acc[j][4 * c + 3] * inv};
      }
    }
  }
}

}  // namespace

bool launch_attention_prefill(const Ctx& ctx, const float* q, const float* k_cache, const float* v_cache, int64_t pos0,
                              int64_t n_tokens, int n_heads, int n_kv_heads, int head_dim, float scale, int window,
                              float* out) {
  if (n_tokens < 2 || head_dim % 4 != 0 || head_dim > 256) return false;
  const size_t smem = size_t(tile_smem_floats(head_dim)) * sizeof(float);
  if (smem > size_t(ctx.max_smem_optin)) return false;
  const int64_t tiles = (n_tokens + kTileQ - 1) / kTileQ;
  if (tiles > 65535) return false;
  const dim3 grid{unsigned(n_heads), unsigned(tiles)};
  if (head_dim <= 128) {
    launch_k(ctx, attention_tile_kernel<4>, grid, kTileWarps * 32, smem, q, k_cache, v_cache, pos0, ctx.step_pos,
             n_tokens, n_heads, n_kv_heads, head_dim, scale, window, out);
  } else {
    launch_k(ctx, attention_tile_kernel<8>, grid, kTileWarps * 32, smem, q, k_cache, v_cache, pos0, ctx.step_pos,
             n_tokens, n_heads, n_kv_heads, head_dim, scale, window, out);
  }
  return true;
}

}  // namespace moecel::cuda
