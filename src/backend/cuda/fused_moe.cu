// Fused decode-MoE kernels. One warp per output row (rows_per_warp rows in kernel A), 8 warps per block;
// lanes stride the row's 32-value chunks exactly as the gather path's matrix-vector kernel does (qdot.cuh), so
// every dot product, the activation and the slot-ordered weighted sum are bit-for-bit the gather path's.
// Each block stages its vector (x, or the act rows of a batch of slots) in shared memory in the padded chunk
// layout, after issuing its first weight loads so the two latencies overlap. (Reading the vector straight from
// global memory, lane-strided 128 bytes apart, measured slower than the gather path.)
#include <algorithm>

#include "backend/cuda/fused_moe.cuh"
#include "backend/cuda/fused_moe_dot.cuh"

namespace moecel::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// R rows of NV weights (row i belongs to weight i / (R / NV)) as 32-bit row indices into the flattened
// (n_experts * out) rows: a few registers per row instead of three 64-bit pointers, which kept occupancy low.
template <int BITS, typename ST, int R, int NV>
struct RowSet {
  const uint32_t* w[NV];
  const ST* s[NV];
  const ST* b[NV];
  int64_t words_per_row = 0, groups = 0;
  uint32_t row[R];
  // Loads chunk c (group g) of every row: all loads of a step are issued before any is used.
  __device__ __forceinline__ void load(int64_t c, int64_t g, uint32_t (&wd)[R][BITS], float (&sc)[R],
                                       float (&bi)[R]) const {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      constexpr int kPer = R / NV;
      const int v = i / kPer;
      const int64_t r = row[i];
      load_chunk<BITS>(w[v] + r * words_per_row + c * BITS, wd[i]);
      sc[i] = to_f32(s[v][r * groups + g]);
      bi[i] = to_f32(b[v][r * groups + g]);
    }
  }
};

template <int BITS, typename ST, int R, int NV>
__device__ __forceinline__ void bind(RowSet<BITS, ST, R, NV>& rs, int v, const WeightView& wv) {
  rs.w[v] = static_cast<const uint32_t*>(wv.w);
  rs.s[v] = static_cast<const ST*>(wv.scales);
  rs.b[v] = static_cast<const ST*>(wv.biases);
  rs.words_per_row = wv.in / kChunk * BITS;
  rs.groups = wv.in / wv.group_size;
}

// Grid (ceil(ffn / (kWarps * RPW)), k); dynamic shared memory: x staged, (hidden / 32) * kChunkPad floats.
// act[j, r] = glu(gate[e_j][r] . x, up[e_j][r] . x).
template <int BITS, typename ST, GluAct ACT, int RPW>
__global__ void __launch_bounds__(kThreads) fused_gate_up_kernel(FusedMoeArgs a, unsigned* err) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  pdl_enter();  // the indices and x come from the kernels before
  const int j = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t ffn = a.gate.out, hidden = a.gate.in;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * RPW;
  const bool live = row0 < ffn;
  const int32_t e = a.indices[j];
  if (!valid_expert(e, a.gate.n_stack)) {  // uniform over the block: returning before the barrier is safe
    if (lane == 0 && live) {
      raise_device_error(err, kErrExpertIndex);
      for (int i = 0; i < RPW; ++i)
        if (row0 + i < ffn) a.act[j * ffn + row0 + i] = __int_as_float(0x7fc00000);
    }
    return;
  }
  const int64_t n_chunks = hidden / kChunk;
  const int gshift = __ffs(a.gate.group_size / kChunk) - 1;  // chunk -> group: a shift
  constexpr int R = 2 * RPW;                                 // gate rows, then up rows
  RowSet<BITS, ST, R, 2> rows;
  bind(rows, 0, a.gate);
  bind(rows, 1, a.up);
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    const int64_t r = e * ffn + (row0 + i < ffn ? row0 + i : ffn - 1);  // a clamped row's result is dropped
    rows.row[i] = rows.row[RPW + i] = uint32_t(r);
  }
  // The first kPrefetch steps' weights (all of a 2048-wide 4-bit row) are loaded before x is staged, so one
  // memory latency covers them and the staging.
  constexpr int kPrefetch = 2;
  uint32_t wd[kPrefetch][R][BITS];
  float sc[kPrefetch][R], bi[kPrefetch][R];
#pragma unroll
  for (int p = 0; p < kPrefetch; ++p) {
    const int64_t c = lane + 32 * p;
    if (live && c < n_chunks) rows.load(c, c >> gshift, wd[p], sc[p], bi[p]);
  }
  stage_chunks(a.x, hidden, xs);
  __syncthreads();
  stage_xsums(xs, n_chunks);
  __syncthreads();
  if (!live) return;
  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
  auto x_of = [&](int) { return xs; };
#pragma unroll
  for (int p = 0; p < kPrefetch; ++p) {
    const int64_t c = lane + 32 * p;
    if (c < n_chunks) dot_step<BITS, R, true>(wd[p], sc[p], bi[p], c, x_of, acc);
  }
  for (int64_t c = lane + 32 * kPrefetch; c < n_chunks; c += 32) {
    rows.load(c, c >> gshift, wd[0], sc[0], bi[0]);
    dot_step<BITS, R, true>(wd[0], sc[0], bi[0], c, x_of, acc);
  }
  write_act<ACT, RPW>(acc, a.act, j, ffn, row0, lane);
}

// Kernel A as a software pipeline: a grid sized to fill the GPU once, each warp walking rows n = gw, gw + W, ...
// of the (k * ffn) (slot, row) pairs and loading row n + W's weights while it computes row n, so memory latency
// is paid once per warp rather than once per row. x is staged once per block. Same per-row arithmetic.
template <int BITS, typename ST, GluAct ACT>
struct PairRows {
  static constexpr int kPre = 2;  // chunk steps held in registers per row: all of a row up to 2048 wide
  uint32_t wd[kPre][2][BITS];
  float sc[kPre][2], bi[kPre][2];
};

template <int BITS, typename ST, GluAct ACT>
__device__ __forceinline__ bool pair_load(const FusedMoeArgs& a, const RowSet<BITS, ST, 2, 2>& base, int64_t n,
                                          int lane, int64_t n_chunks, int cpg_shift, PairRows<BITS, ST, ACT>& pr,
                                          uint32_t& row) {
  const int64_t ffn = a.gate.out;
  const int32_t e = a.indices[n / ffn];
  if (!valid_expert(e, a.gate.n_stack)) return false;
  row = uint32_t(int64_t(e) * ffn + n % ffn);
  RowSet<BITS, ST, 2, 2> rs = base;
  rs.row[0] = rs.row[1] = row;
#pragma unroll
  for (int p = 0; p < PairRows<BITS, ST, ACT>::kPre; ++p) {
    const int64_t c = lane + 32 * p;
    if (c < n_chunks) rs.load(c, c >> cpg_shift, pr.wd[p], pr.sc[p], pr.bi[p]);
  }
  return true;
}

template <int BITS, typename ST, GluAct ACT>
__device__ __forceinline__ void pair_finish(const FusedMoeArgs& a, const RowSet<BITS, ST, 2, 2>& base, int64_t n,
                                            bool valid, uint32_t row, int lane, int64_t n_chunks, int cpg_shift,
                                            const float* xs, PairRows<BITS, ST, ACT>& pr, unsigned* err) {
  float acc[2] = {0.0f, 0.0f};
  if (valid) {
    auto x_of = [&](int) { return xs; };
#pragma unroll
    for (int p = 0; p < PairRows<BITS, ST, ACT>::kPre; ++p) {
      const int64_t c = lane + 32 * p;
      if (c < n_chunks) dot_step<BITS, 2, true>(pr.wd[p], pr.sc[p], pr.bi[p], c, x_of, acc);
    }
    RowSet<BITS, ST, 2, 2> rs = base;
    rs.row[0] = rs.row[1] = row;
    for (int64_t c = lane + 32 * PairRows<BITS, ST, ACT>::kPre; c < n_chunks; c += 32) {  // rows over 2048 wide
      rs.load(c, c >> cpg_shift, pr.wd[0], pr.sc[0], pr.bi[0]);
      dot_step<BITS, 2, true>(pr.wd[0], pr.sc[0], pr.bi[0], c, x_of, acc);
    }
  }
  acc[0] = warp_sum(acc[0]);
  acc[1] = warp_sum(acc[1]);
  if (lane == 0) {
    if (!valid) raise_device_error(err, kErrExpertIndex);
    a.act[n] = valid ? glu_value<ACT>(acc[0], acc[1]) : __int_as_float(0x7fc00000);  // act is (k, ffn): index n
  }
}

template <int BITS, typename ST, GluAct ACT>
__global__ void __launch_bounds__(kThreads) fused_gate_up_pipelined_kernel(FusedMoeArgs a, unsigned* err) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  pdl_enter();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t hidden = a.gate.in, total = int64_t(a.k) * a.gate.out;
  const int64_t n_chunks = hidden / kChunk, W = int64_t(gridDim.x) * kWarps;
  const int cpg_shift = __ffs(a.gate.group_size / kChunk) - 1;
  RowSet<BITS, ST, 2, 2> base;
  bind(base, 0, a.gate);
  bind(base, 1, a.up);
  PairRows<BITS, ST, ACT> buf0, buf1;
  uint32_t row0 = 0, row1 = 0;
  int64_t n = int64_t(blockIdx.x) * kWarps + warp;
  bool v0 = n < total && pair_load(a, base, n, lane, n_chunks, cpg_shift, buf0, row0);
  stage_chunks(a.x, hidden, xs);
  __syncthreads();
  stage_xsums(xs, n_chunks);
  __syncthreads();
  // Two register buffers used alternately (static indexing keeps them in registers).
  while (n < total) {
    const int64_t n1 = n + W;
    const bool v1 = n1 < total && pair_load(a, base, n1, lane, n_chunks, cpg_shift, buf1, row1);
    pair_finish(a, base, n, v0, row0, lane, n_chunks, cpg_shift, xs, buf0, err);
    if (n1 >= total) break;
    const int64_t n2 = n1 + W;
    v0 = n2 < total && pair_load(a, base, n2, lane, n_chunks, cpg_shift, buf0, row0);
    pair_finish(a, base, n1, v1, row1, lane, n_chunks, cpg_shift, xs, buf1, err);
    n = n2;
  }
}

// Grid (ceil(hidden / (kWarps * RPW))); dynamic shared memory: KB act rows staged, KB * (ffn / 32) * kChunkPad
// floats. out[r] = sum over j in order of weights[j] * (down[e_j][r] . act[j]); slots are taken KB at a time.
template <int BITS, typename ST, int KB, int RPW>
__global__ void __launch_bounds__(kThreads) fused_down_kernel(FusedMoeArgs a, unsigned* err) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  if (!a.b_prefetch) pdl_enter();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t hidden = a.down.out, ffn = a.down.in;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * RPW;
  const bool live = row0 < hidden;
  const int64_t n_chunks = ffn / kChunk;
  const int gshift = __ffs(a.down.group_size / kChunk) - 1;  // chunk -> group: a shift
  constexpr int R = KB * RPW;                                // row i of slot s is entry s * RPW + i
  auto x_of = [&](int n) { return xs + (n / RPW) * n_chunks * kChunkPad; };
  float out[RPW];
#pragma unroll
  for (int i = 0; i < RPW; ++i) out[i] = 0.0f;
  for (int j0 = 0; j0 < a.k; j0 += KB) {
    const int nb = min(KB, a.k - j0);
    RowSet<BITS, ST, R, 1> rows;
    bind(rows, 0, a.down);
    bool valid[KB];
#pragma unroll
    for (int sl = 0; sl < KB; ++sl) {
      // Read through L2 before pdl_wait: the indices come from the kernel before kernel A, which had finished
      // when kernel A passed its pdl_wait and let this kernel start (kernel A triggers only after its wait).
      const int32_t e = sl < nb ? __ldcg(a.indices + j0 + sl) : 0;
      valid[sl] = sl < nb && valid_expert(e, a.down.n_stack);
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        const int64_t row = row0 + i < hidden ? row0 + i : hidden - 1;  // a clamped row's result is dropped
        rows.row[sl * RPW + i] = uint32_t((valid[sl] ? int64_t(e) : 0) * hidden + row);
      }
    }
    uint32_t wd[R][BITS];
    float sc[R], bi[R];
    if (live && lane < n_chunks) rows.load(lane, lane >> gshift, wd, sc, bi);
    if (j0 == 0 && a.b_prefetch) pdl_enter();  // the first slots' weights are in flight: wait for kernel A's act
    if (j0 > 0) __syncthreads();               // every warp is done with the previous slots' act
    stage_chunks(a.act + j0 * ffn, nb * ffn, xs);
    __syncthreads();
    stage_xsums(xs, nb * n_chunks);
    __syncthreads();
    if (!live) continue;
    float acc[R];
#pragma unroll
    for (int n = 0; n < R; ++n) acc[n] = 0.0f;
    if (lane < n_chunks) dot_step<BITS, R>(wd, sc, bi, lane, x_of, acc);
    for (int64_t c = lane + 32; c < n_chunks; c += 32) {
      rows.load(c, c >> gshift, wd, sc, bi);
      dot_step<BITS, R>(wd, sc, bi, c, x_of, acc);
    }
#pragma unroll
    for (int sl = 0; sl < KB; ++sl) {
      if (sl >= nb) break;
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        const float d = warp_sum(acc[sl * RPW + i]);
        if (!valid[sl]) {
          if (lane == 0 && row0 == 0 && i == 0) raise_device_error(err, kErrExpertIndex);
          out[i] = __int_as_float(0x7fc00000);
        } else {
          out[i] = fmaf(a.weights[j0 + sl], d, out[i]);  // the gather path's weighted sum, same order
        }
      }
    }
  }
  if (live && lane == 0) {
#pragma unroll
    for (int i = 0; i < RPW; ++i)
      if (row0 + i < hidden) a.out[row0 + i] = a.residual ? a.residual[row0 + i] + out[i] : out[i];
  }
}

template <class Kernel>
void launch_kernel(const Ctx& ctx, Kernel kernel, dim3 grid, size_t smem, const FusedMoeArgs& a) {
  launch_k(ctx, kernel, grid, kThreads, smem, a, ctx.error_flag);
}

size_t staged_bytes(int64_t n_floats) {
  return size_t(n_floats / kChunk) * kChunkPad * sizeof(float);
}

template <int BITS, typename ST, GluAct ACT>
void launch_a_rows(const Ctx& ctx, const FusedMoeArgs& a) {
  const int64_t ffn = a.gate.out;
  const int rpw = a.rows_per_warp;
  const size_t smem = staged_bytes(a.gate.in);
  CUDA_REQUIRE(smem <= size_t(ctx.max_smem_optin), "fused_moe: hidden size too large to stage x");
  if (rpw == 0) {  // the pipelined kernel: as many blocks as fit on the GPU at once
    auto kernel = fused_gate_up_pipelined_kernel<BITS, ST, ACT>;
    const int per_sm = resident_per_sm(kernel, kThreads, smem);
    const int64_t want = (int64_t(a.k) * ffn + kWarps - 1) / kWarps;
    const dim3 g{unsigned(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(std::max(per_sm, 1)) * ctx.sm_count)))};
    return launch_kernel(ctx, kernel, g, smem, a);
  }
  const dim3 grid{unsigned((ffn + kWarps * rpw - 1) / (kWarps * rpw)), unsigned(a.k)};
  switch (rpw) {
    case 1: launch_kernel(ctx, fused_gate_up_kernel<BITS, ST, ACT, 1>, grid, smem, a); break;
    case 2: launch_kernel(ctx, fused_gate_up_kernel<BITS, ST, ACT, 2>, grid, smem, a); break;
    case 4: launch_kernel(ctx, fused_gate_up_kernel<BITS, ST, ACT, 4>, grid, smem, a); break;
    default: CUDA_REQUIRE(false, "fused_moe: rows_per_warp must be 0 (pipelined), 1, 2 or 4");
  }
}

template <int BITS, typename ST>
void launch_a(const Ctx& ctx, const FusedMoeArgs& a) {
  switch (a.glu) {
    case GluAct::kSiLU: launch_a_rows<BITS, ST, GluAct::kSiLU>(ctx, a); break;
    case GluAct::kGeLU: launch_a_rows<BITS, ST, GluAct::kGeLU>(ctx, a); break;
    case GluAct::kReLU2: launch_a_rows<BITS, ST, GluAct::kReLU2>(ctx, a); break;
  }
}

template <int BITS, typename ST, int KB>
void launch_b_rows(const Ctx& ctx, const FusedMoeArgs& a, size_t smem) {
  // Two rows per warp only up to 4 slots: with 8 the row set spills registers.
  if constexpr (KB <= 4) {
    if (a.down_rows_per_warp == 2) {
      const dim3 grid{unsigned((a.down.out + kWarps * 2 - 1) / (kWarps * 2))};
      return launch_kernel(ctx, fused_down_kernel<BITS, ST, KB, 2>, grid, smem, a);
    }
  }
  const dim3 grid{unsigned((a.down.out + kWarps - 1) / kWarps)};
  launch_kernel(ctx, fused_down_kernel<BITS, ST, KB, 1>, grid, smem, a);
}

// Kernel B with the largest slot batch whose act rows fit in shared memory.
template <int BITS, typename ST>
void launch_b(const Ctx& ctx, const FusedMoeArgs& a) {
  const size_t per_slot = staged_bytes(a.down.in), limit = size_t(ctx.max_smem_optin);
  int want = a.k > 4 ? 8 : a.k > 2 ? 4 : a.k > 1 ? 2 : 1;
  want = std::min(want, a.max_slot_batch);
  if (want >= 8 && 8 * per_slot <= limit) return launch_b_rows<BITS, ST, 8>(ctx, a, 8 * per_slot);
  if (want >= 4 && 4 * per_slot <= limit) return launch_b_rows<BITS, ST, 4>(ctx, a, 4 * per_slot);
  if (want >= 2 && 2 * per_slot <= limit) return launch_b_rows<BITS, ST, 2>(ctx, a, 2 * per_slot);
  CUDA_REQUIRE(per_slot <= limit, "fused_moe: moe_intermediate_size too large to stage one expert's activations");
  launch_b_rows<BITS, ST, 1>(ctx, a, per_slot);
}

template <typename ST>
void launch_typed(const Ctx& ctx, FusedMoeArgs a) {
  if (!launch_fused_gate_up_mma(ctx, a)) {
    a.act_staged = nullptr;  // only the tensor-core kernel A stages act for kernel B
    if (launch_fused_gate_up_bulk(ctx, a)) {
    } else if (a.gate.bits == 4) {
      launch_a<4, ST>(ctx, a);
    } else {
      launch_a<8, ST>(ctx, a);
    }
  }
  if (launch_fused_down_mma(ctx, a) || launch_fused_down_bulk(ctx, a)) return;
  switch (a.down.bits) {
    case 4: launch_b<4, ST>(ctx, a); break;
    case 6: launch_b<6, ST>(ctx, a); break;
    default: launch_b<8, ST>(ctx, a); break;
  }
}

}  // namespace

void launch_fused_moe(const Ctx& ctx, const FusedMoeArgs& a) {
  const WeightView &g = a.gate, &u = a.up, &d = a.down;
  CUDA_REQUIRE(g.bits == u.bits && (g.bits == 4 || g.bits == 8), "fused_moe: gate/up bits must be equal, 4 or 8");
  CUDA_REQUIRE(d.bits == 4 || d.bits == 6 || d.bits == 8, "fused_moe: down bits must be 4, 6 or 8");
  CUDA_REQUIRE(g.group_size == u.group_size && g.group_size == d.group_size && g.group_size % kChunk == 0 &&
                   ((g.group_size / kChunk) & (g.group_size / kChunk - 1)) == 0,
               "fused_moe: one group size (32 * 2^n) for gate, up and down");
  CUDA_REQUIRE(g.stype == u.stype && g.stype == d.stype, "fused_moe: one scale type for gate, up and down");
  CUDA_REQUIRE(g.biases && u.biases && d.biases, "fused_moe: quantized weights with biases");
  CUDA_REQUIRE(g.in % kChunk == 0 && g.out % kChunk == 0 && u.out == g.out && u.in == g.in && d.out == g.in &&
                   d.in == g.out && u.n_stack == g.n_stack && d.n_stack == g.n_stack,
               "fused_moe: shapes must be (E, ffn, hidden) x2 and (E, hidden, ffn), multiples of 32");
  for (const void* p : {g.w, u.w, d.w})
    CUDA_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0, "fused_moe: packed weights must be 16-byte aligned");
  CUDA_REQUIRE(a.k >= 1 && a.k <= kMaxTopK, "fused_moe: k must be in [1, 64]");
  if (g.in == 0 || g.out == 0) return;
  switch (g.stype) {
    case FloatType::kF32: launch_typed<float>(ctx, a); break;
    case FloatType::kF16: launch_typed<__half>(ctx, a); break;
    case FloatType::kBF16: launch_typed<__nv_bfloat16>(ctx, a); break;
  }
}

}  // namespace moecel::cuda
