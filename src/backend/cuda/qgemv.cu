// Matrix-vector kernels (decode and other few-token products): a warp computes RPW output rows (1, 2 or 4), 8
// warps per 256-thread block, grid (blocks of every part, n_pairs). The block stages its x row in shared memory;
// lanes stride the rows' packed words (a quantized lane step is one 32-value chunk = exactly `bits` words, 16-byte
// loads for 4 and 8 bits), accumulate in f32 and reduce with warp shuffles. A launch may cover up to three weights
// of the same input (q, k, v) and fuse the input's RMSNorm, a residual add or a router top-k (GemvFusion).
// Under PDL each block loads its first weight chunks and norm weights before waiting for the previous kernel.
// Used by: launch_linear, launch_gather_linear (qmatmul.cu) and launch_gemv_fused (CudaBackend's decode fusions).
#include <algorithm>
#include <cstdint>
#include <utility>

#include "backend/cuda/qgemv.cuh"

namespace moecel::cuda {
namespace {

using namespace gemv;

// Preconditions (checked by launch_gemv): blockDim.x == kThreads; w.in % 32 == 0; w.group_size % 32 == 0;
// w.w 16-byte aligned; dynamic shared memory (in / 32) * kChunkPad floats; every part has the same in.
// Each warp computes RPW consecutive rows: every x chunk read from shared memory serves RPW rows (one row per warp
// needs 8 bytes of shared-memory reads per byte of 4-bit weights, more than shared memory delivers at DRAM speed).
// SHARE: the block also computes its RouterShare (a.f.share; a variant of its own, so that the plain kernels keep
// their registers).
template <int BITS, typename ST, int RPW, bool SHARE = false>
__global__ void __launch_bounds__(kThreads) qgemv_kernel(GemvArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const unsigned long long t_entry = probe_entry();
  const int64_t p = blockIdx.y;
  if (a.map.indices) pdl_wait();  // the indices come from an earlier kernel
  const Part pt = block_part(a);
  const int64_t expert = pair_expert(a, pt, p, RPW);
  if (expert < 0) return;
  const int64_t in = pt.w.in, out = pt.w.out, n_chunks = in / kChunk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (pt.block * kWarps + warp) * RPW;
  const bool live = row0 < out;
  const int64_t groups = in / pt.w.group_size;
  const int gshift = __ffs(pt.w.group_size / kChunk) - 1;  // chunk -> group: a shift (group sizes 32, 64, 128)
  const uint32_t* wrow[RPW];
  const ST* srow[RPW];
  const ST* brow[RPW];
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    const int64_t r = expert * out + (row0 + i < out ? row0 + i : 0);  // a clamped row's result is dropped
    wrow[i] = static_cast<const uint32_t*>(pt.w.w) + r * n_chunks * BITS;
    srow[i] = static_cast<const ST*>(pt.w.scales) + r * groups;
    brow[i] = pt.w.biases ? static_cast<const ST*>(pt.w.biases) + r * groups : nullptr;
  }
  // The lane's first kPrefetch chunks (words, scale, bias) of each row are loaded before waiting for the previous
  // kernel and staging x, so their latency overlaps both; they are consumed first, in the loop's order (same sums).
  constexpr int kPrefetch = 2;
  uint32_t pw[kPrefetch][RPW][BITS];
  ST ps[kPrefetch][RPW], pb[kPrefetch][RPW];  // raw: converted after the wait (a conversion waits for its load)
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    const int64_t c = lane + 32 * k;
    if (live && c < n_chunks) {
      const int64_t g = c >> gshift;
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        load_chunk<BITS>(wrow[i] + c * BITS, pw[k][i]);
        ps[k][i] = srow[i][g];
        pb[k][i] = brow[i] ? brow[i][g] : ST(0.0f);
      }
    }
  }
  float nw[kNormRegs];
  if constexpr (!SHARE) load_norm(a, in, nw);  // a share's launch has no input norm (linear_residual_norm_router)
  constexpr int kRows = kWarps * RPW;          // the block's rows
  ShareSmem share{};
  if constexpr (SHARE) {
    share = share_smem(xs + n_chunks * kChunkPad, a.f.share.w.out, kRows, a.f.share.w.bits);
    share_load(a.f.share, pt.block * kRows, kRows, share);
  }
  pdl_enter();
  probe_entry_mark(3, t_entry);
  stage_chunks(pair_x(a, in, p), in, xs);
  __syncthreads();
  if constexpr (!SHARE) {
    if (a.f.norm_w) normalize_staged(a, in, p, xs, nw);
  }
  stage_xsums(xs, n_chunks);
  __syncthreads();

  if (live) {
    float acc[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < kPrefetch; ++k) {
      const int64_t c = lane + 32 * k;
      if (c < n_chunks) {
        const float xsum = staged_xsum(xs + c * kChunkPad);
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
          const float qx = chunk_qx<BITS>(pw[k][i], xs + c * kChunkPad, xsum);
          acc[i] = chunk_fma(to_f32(ps[k][i]), to_f32(pb[k][i]), qx, xsum, acc[i]);
        }
      }
    }
    for (int64_t c = lane + 32 * kPrefetch; c < n_chunks; c += 32) {
      const int64_t g = c >> gshift;
      uint32_t wd[RPW][BITS];
      float sc[RPW], bi[RPW];
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        load_chunk<BITS>(wrow[i] + c * BITS, wd[i]);
        sc[i] = to_f32(srow[i][g]);
        bi[i] = brow[i] ? to_f32(brow[i][g]) : 0.0f;
      }
      const float xsum = staged_xsum(xs + c * kChunkPad);
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        const float qx = chunk_qx<BITS>(wd[i], xs + c * kChunkPad, xsum);
        acc[i] = chunk_fma(sc[i], bi[i], qx, xsum, acc[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < RPW; ++i) acc[i] = warp_sum(acc[i]);
    if (lane == 0) {
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        const int64_t row = row0 + i;
        if (row < out) {
          float* y = pt.y + p * out + row;
          const float v = a.f.residual ? a.f.residual[p * out + row] + acc[i] : acc[i];  // residual may be y
          *y = v;
          if constexpr (SHARE) {  // the launch covers whole blocks of rows then (launch_gemv_fused)
            share.yn[warp * RPW + i] = v * share.norm_w[warp * RPW + i];
            ss = fmaf(v, v, ss);
          }
        }
      }
      if constexpr (SHARE) share.ssq[warp] = ss;
    }
  }
  if constexpr (SHARE) share_store(a.f.share, kRows, p, blockIdx.x, gridDim.x, share);
  if constexpr (!SHARE) {  // nor a router epilogue (the share variant carries neither's code: 116 -> 98 registers)
    if (a.f.router.k > 0) router_epilogue(a);
  }
}

// Dense weights. Preconditions: blockDim.x == kThreads; dynamic shared memory `in` floats (16-byte aligned);
// vec only when in * sizeof(WT) % 16 == 0 and w.w is 16-byte aligned (then every row is).
template <typename WT>
__global__ void __launch_bounds__(kThreads) dense_gemv_kernel(GemvArgs a, bool vec) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  pdl_enter();
  const int64_t p = blockIdx.y;
  const Part pt = block_part(a);
  const int64_t expert = pair_expert(a, pt, p, 1);
  if (expert < 0) return;
  const int64_t in = pt.w.in, out = pt.w.out;
  const float* x = pair_x(a, in, p);
  for (int64_t i = threadIdx.x; i < in; i += kThreads) xs[i] = x[i];
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = pt.block * kWarps + warp;
  if (row >= out) return;
  const WT* wrow = static_cast<const WT*>(pt.w.w) + (expert * out + row) * in;
  float acc = 0.0f;
  if (vec) {
    constexpr int kV = 16 / int(sizeof(WT));  // values per 16-byte load: 4 (F32) or 8 (F16/BF16)
    const int64_t n_vec = in / kV;
    for (int64_t c = lane; c < n_vec; c += 32) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wrow) + c);
      const WT* wv = reinterpret_cast<const WT*>(&raw);
#pragma unroll
      for (int u = 0; u < kV; u += 4) {
        const float4 xv = *reinterpret_cast<const float4*>(xs + c * kV + u);
        acc = fmaf(to_f32(wv[u]), xv.x, acc);
        acc = fmaf(to_f32(wv[u + 1]), xv.y, acc);
        acc = fmaf(to_f32(wv[u + 2]), xv.z, acc);
        acc = fmaf(to_f32(wv[u + 3]), xv.w, acc);
      }
    }
  } else {
    for (int64_t i = lane; i < in; i += 32) acc = fmaf(to_f32(wrow[i]), xs[i], acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) pt.y[p * out + row] = acc;
}

template <class Kernel, class... Args>
void launch(const Ctx& ctx, Kernel kernel, dim3 grid, size_t smem, const Args&... args) {
  launch_k(ctx, kernel, grid, kThreads, smem, args...);
}

template <int BITS, int RPW, bool SHARE = false>
void launch_quant(const Ctx& ctx, dim3 grid, size_t smem, const GemvArgs& a) {
  switch (a.w[0].stype) {
    case FloatType::kF32: launch(ctx, qgemv_kernel<BITS, float, RPW, SHARE>, grid, smem, a); break;
    case FloatType::kF16: launch(ctx, qgemv_kernel<BITS, __half, RPW, SHARE>, grid, smem, a); break;
    case FloatType::kBF16: launch(ctx, qgemv_kernel<BITS, __nv_bfloat16, RPW, SHARE>, grid, smem, a); break;
  }
}

// Blocks of qgemv_kernel<BITS, ST, RPW> that fit on one SM at once.
template <int BITS, int RPW>
int blocks_per_sm(FloatType st, size_t smem) {
  switch (st) {
    case FloatType::kF32: return resident_per_sm(qgemv_kernel<BITS, float, RPW>, kThreads, smem);
    case FloatType::kF16: return resident_per_sm(qgemv_kernel<BITS, __half, RPW>, kThreads, smem);
    default: return resident_per_sm(qgemv_kernel<BITS, __nv_bfloat16, RPW>, kThreads, smem);
  }
}

int64_t grid_blocks(const GemvArgs& a, int64_t n_pairs, int rpw) {
  int64_t blocks = 0;
  for (int i = 0; i < a.n_parts; ++i) blocks += (a.w[i].out + kWarps * rpw - 1) / (kWarps * rpw);
  return blocks * n_pairs;
}

// Rows per warp for 4- and 8-bit weights: the fewest (most blocks, fewest registers) with which the whole grid is
// resident at once, so that every block's weights are loaded before the wait for the previous kernel (a second
// wave would load only after the first finished); 4 for products too large for one wave. MOECEL_CUDA_GEMV_ROWS
// forces 1, 2 or 4. Results do not depend on it: each row's sum is the same.
template <int BITS>
int rows_per_warp(const Ctx& ctx, const GemvArgs& a, int64_t n_pairs, size_t smem) {
  if constexpr (BITS != 4 && BITS != 8) {
    return 1;
  } else {
    if (ctx.gemv_rows > 0) return ctx.gemv_rows;
    const int64_t sms = std::max(ctx.sm_count, 1);
    if (grid_blocks(a, n_pairs, 1) <= blocks_per_sm<BITS, 1>(a.w[0].stype, smem) * sms) return 1;
    if (grid_blocks(a, n_pairs, 2) <= blocks_per_sm<BITS, 2>(a.w[0].stype, smem) * sms) return 2;
    return 4;
  }
}

template <int BITS>
void launch_quant_rows(const Ctx& ctx, dim3 grid, size_t smem, const GemvArgs& a, int rpw) {
  if constexpr (BITS == 4 || BITS == 8) {
    if (a.f.share.parts && rpw == 2) return launch_quant<BITS, 2, true>(ctx, grid, smem, a);
    if (a.f.share.parts) return launch_quant<BITS, 1, true>(ctx, grid, smem, a);
    if (rpw == 2) return launch_quant<BITS, 2>(ctx, grid, smem, a);
    if (rpw == 4) return launch_quant<BITS, 4>(ctx, grid, smem, a);
  }
  launch_quant<BITS, 1>(ctx, grid, smem, a);
}

bool launch_gemv_args(const Ctx& ctx, GemvArgs& a, int64_t n_pairs) {
  const WeightView& w = a.w[0];
  CUDA_REQUIRE(w.in > 0 && n_pairs > 0 && n_pairs <= 65535, "gemv: bad in / pair count");
  if (a.map.indices && w.bits != 0 && launch_gemv_bulk(ctx, a, n_pairs)) return true;
  const bool quant = w.bits != 0, share = a.f.share.parts != nullptr;
  if (quant && !share && launch_gemv_mma(ctx, a, n_pairs)) return true;
  size_t smem = quant ? size_t(w.in / kChunk) * kChunkPad * sizeof(float) : size_t(w.in) * sizeof(float);
  if (share) smem += size_t(share_floats(a.f.share.w.out, share_rows(w.in), a.f.share.w.bits)) * 4;
  if (smem > size_t(ctx.max_smem_optin)) return false;  // x does not fit: the tiled kernel takes it
  int rpw = 1;
  if (w.bits == 4) rpw = rows_per_warp<4>(ctx, a, n_pairs, smem);
  if (w.bits == 8) rpw = rows_per_warp<8>(ctx, a, n_pairs, smem);
  if (share) rpw = share_rows(w.in) / kWarps;  // the caller sized the parts for it
  int64_t blocks = 0;
  for (int i = 0; i < a.n_parts; ++i) {
    CUDA_REQUIRE(a.w[i].in == w.in && a.w[i].bits == w.bits && a.w[i].stype == w.stype && a.w[i].wtype == w.wtype,
                 "gemv: the parts of one launch must share in, bits and types");
    blocks += (a.w[i].out + kWarps * rpw - 1) / (kWarps * rpw);
    CUDA_REQUIRE(blocks < (int64_t(1) << 31), "gemv: too many output rows");
    a.part_end[i] = unsigned(blocks);
  }
  if (blocks == 0) return true;
  const dim3 grid{unsigned(blocks), unsigned(n_pairs)};
  if (quant) {
    CUDA_REQUIRE(w.in % kChunk == 0 && w.group_size % kChunk == 0 && w.group_size > 0 &&
                     ((w.group_size / kChunk) & (w.group_size / kChunk - 1)) == 0,
                 "gemv: quantized rows need in a multiple of 32 and group_size 32 * 2^n");
    for (int i = 0; i < a.n_parts; ++i) {
      CUDA_REQUIRE(reinterpret_cast<uintptr_t>(a.w[i].w) % 16 == 0, "gemv: packed weight not 16-byte aligned");
      CUDA_REQUIRE(a.w[i].group_size == w.group_size, "gemv: the parts of one launch must share the group size");
    }
    switch (w.bits) {
      case 2: launch_quant_rows<2>(ctx, grid, smem, a, rpw); break;
      case 3: launch_quant_rows<3>(ctx, grid, smem, a, rpw); break;
      case 4: launch_quant_rows<4>(ctx, grid, smem, a, rpw); break;
      case 5: launch_quant_rows<5>(ctx, grid, smem, a, rpw); break;
      case 6: launch_quant_rows<6>(ctx, grid, smem, a, rpw); break;
      case 8: launch_quant_rows<8>(ctx, grid, smem, a, rpw); break;
      default: CUDA_REQUIRE(false, "gemv: unsupported bits " + std::to_string(w.bits));
    }
    return true;
  }
  CUDA_REQUIRE(!a.f.active(), "gemv: the decode fusions need quantized weights");
  const size_t wsize = w.wtype == FloatType::kF32 ? 4 : 2;
  bool vec = (size_t(w.in) * wsize) % 16 == 0;
  for (int i = 0; i < a.n_parts; ++i) vec = vec && reinterpret_cast<uintptr_t>(a.w[i].w) % 16 == 0;
  switch (w.wtype) {
    case FloatType::kF32: launch(ctx, dense_gemv_kernel<float>, grid, smem, a, vec); break;
    case FloatType::kF16: launch(ctx, dense_gemv_kernel<__half>, grid, smem, a, vec); break;
    case FloatType::kBF16: launch(ctx, dense_gemv_kernel<__nv_bfloat16>, grid, smem, a, vec); break;
  }
  return true;
}

// The arguments of a launch over weights ws (one output each) sharing x.
GemvArgs parts_args(const Ctx& ctx, std::span<const WeightView> ws, std::span<float* const> ys, const float* x,
                    const PairMap& map) {
  CUDA_REQUIRE(!ws.empty() && ws.size() <= size_t(kMaxGemvParts) && ys.size() == ws.size(),
               "gemv: 1 to 3 weights, one output each");
  GemvArgs a{};
  a.n_parts = int(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    a.w[i] = ws[i];
    a.y[i] = ys[i];
  }
  a.x = x;
  a.map = map;
  a.err = ctx.error_flag;
  return a;
}

}  // namespace

bool launch_gemv(const Ctx& ctx, const WeightView& w, const float* x, const PairMap& map, int64_t n_pairs, float* y) {
  if (n_pairs == 0 || w.out == 0) return true;
  GemvArgs a = parts_args(ctx, std::span(&w, 1), std::span(&y, 1), x, map);
  return launch_gemv_args(ctx, a, n_pairs);
}

bool launch_gather_gemv_parts(const Ctx& ctx, std::span<const WeightView> ws, std::span<float* const> ys,
                              const float* x, const int32_t* indices, int64_t n_tokens, int64_t k) {
  GemvArgs a = parts_args(ctx, ws, ys, x, PairMap{indices, k, false});
  return n_tokens * k == 0 || launch_gemv_args(ctx, a, n_tokens * k);
}

bool launch_gather_glu_gemv(const Ctx& ctx, const WeightView& gate, const WeightView& up, GluAct act, const float* x,
                            const int32_t* indices, int64_t n_tokens, int64_t k, float* y) {
  const WeightView ws[] = {gate, up};
  float* ys[] = {y, y};  // up's rows are never stored
  GemvArgs a = parts_args(ctx, ws, ys, x, PairMap{indices, k, false});
  a.glu = int(act);
  return launch_gemv_bulk(ctx, a, n_tokens * k);  // false for 0 or more than 65535 pairs
}

bool launch_gemv_fused(const Ctx& ctx, std::span<const WeightView> ws, std::span<float* const> ys, const float* x,
                       int64_t n_tokens, const GemvFusion& f, const ArgmaxTail* tail) {
  GemvArgs a = parts_args(ctx, ws, ys, x, PairMap{nullptr, 1, true});
  CUDA_REQUIRE(!(f.residual || f.router.k > 0) || ws.size() == 1, "gemv: residual and router need one weight");
  if (n_tokens == 0) return true;
  if (n_tokens > kGemvMaxTokens || ws[0].bits == 0) return false;
  if (f.router.k > 0) {
    CUDA_REQUIRE(f.counter != nullptr && ws[0].out <= kWarpRouterExperts && f.router.k >= 1 && f.router.k <= 32 &&
                     f.router.k <= ws[0].out,
                 "gemv: the router epilogue takes up to 256 experts and k <= min(32, n_experts)");
  }
  if (f.share.parts) {
    const int rows = share_rows(ws[0].in);
    const RouterShare& s = f.share;
    CUDA_REQUIRE(ws.size() == 1 && (ws[0].bits == 4 || ws[0].bits == 8) && ws[0].out % rows == 0 &&
                     s.w.in == ws[0].out && (s.w.bits == 4 || s.w.bits == 8) && s.w.out >= 1 &&
                     s.w.out <= kWarpRouterExperts && s.w.group_size % rows == 0 && s.w.n_stack == 1 &&
                     s.rows == rows && !f.norm_w && f.router.k == 0,
                 "gemv: a router share needs one 4/8-bit weight of whole 16-row blocks and a 4/8-bit router over "
                 "its rows (<= 256 experts, group size a multiple of 16), with no input norm or router epilogue");
  }
  a.f = f;
  if (tail) {
    CUDA_REQUIRE(n_tokens == 1 && ws.size() == 1 && tail->out && tail->max_parts > 0,
                 "gemv: the argmax tail takes one token and one weight");
    return launch_gemv_stream(ctx, a, tail);
  }
  // Only the int8 kernel adds into the route's words; another kernel would leave kernel B waiting for its slots.
  if (f.share.route.words) return n_tokens == 1 && f.share.rows == 16 && launch_gemv_residual_imma(ctx, a);
  if (n_tokens == 1 && (launch_gemv_residual_imma(ctx, a) || launch_gemv_stream(ctx, a) || launch_gemv_bulk(ctx, a, 1)))
    return true;
  return launch_gemv_args(ctx, a, n_tokens);
}

}  // namespace moecel::cuda
