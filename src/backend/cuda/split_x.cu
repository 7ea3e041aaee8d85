// The f16 split of x for the tensor-core prefill kernel (qgemm_mma.cu), done once per row of x instead of once in
// every block that reads the row: the row scaled by the power of two 2^e that puts its largest magnitude in
// [2^14, 2^15) (exact), split into hi + lo f16 terms in the MMA fragment order, and its per-group sums.
// Used by: launch_gemm_mma, launch_gemm_mma_parts.
#include "backend/cuda/mma_frag.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row

size_t align256(size_t b) {
  return (b + 255) / 256 * 256;
}

// Preconditions: in % 32 == 0, group_size % 32 == 0, in % group_size == 0, x 16-byte aligned.
// planes (rows, in / 32, 2, 32) f16: per 32-slice hi then lo, each 8-value chunk in (k0,k4,k1,k5,k2,k6,k3,k7) order;
// scale (rows,) (2^e, 2^-e); gsum (rows, in / group_size): sums of the scaled row over each group.
// A row of zeros or whose largest magnitude is infinite keeps 1 (fmaxf skips NaN; NaN and infinity then propagate as
// in f32).
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    split_x_kernel(const float* x, int64_t rows, int64_t in, int group_size, unsigned char* planes, float2* scale,
                   float* gsum) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const float* xr = x + row * in;
  float m = 0.0f;
  for (int64_t i = lane; i < in / 4; i += 32) {
    const float4 v = reinterpret_cast<const float4*>(xr)[i];
    m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  m = warp_max(m);
  int e = 0;
  if (m > 0.0f && isfinite(m)) {
    int ex;
    frexpf(m, &ex);  // m = f * 2^ex, f in [0.5, 1)
    e = min(max(15 - ex, -126), 126);
  }
  const float sc = ldexpf(1.0f, e);
  if (lane == 0) scale[row] = make_float2(sc, ldexpf(1.0f, -e));
  unsigned char* pr = planes + row * in * 4;
  for (int64_t ch = lane; ch < in / 8; ch += 32) {  // 8 values: one 16-byte chunk of each term
    const float4 a = reinterpret_cast<const float4*>(xr)[2 * ch];
    const float4 b = reinterpret_cast<const float4*>(xr)[2 * ch + 1];
    const float v[8] = {a.x * sc, a.y * sc, a.z * sc, a.w * sc, b.x * sc, b.y * sc, b.z * sc, b.w * sc};
    uint32_t h[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) split2_f16(v[j], v[j + 4], h[j], l[j]);
    unsigned char* dst = pr + (ch / 4) * 128 + (ch % 4) * 16;
    *reinterpret_cast<uint4*>(dst) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(dst + 64) = make_uint4(l[0], l[1], l[2], l[3]);
  }
  const int64_t groups = in / group_size;
  for (int64_t g = lane; g < groups; g += 32) {  // the row is in L1 from the passes above
    const float4* src = reinterpret_cast<const float4*>(xr + g * group_size);
    float s = 0.0f;
    for (int i = 0; i < group_size / 4; ++i) {
      const float4 v = src[i];
      s += ((v.x * sc + v.y * sc) + (v.z * sc + v.w * sc));
    }
    gsum[row * groups + g] = s;
  }
}

}  // namespace

size_t gemm_scratch_bytes(int64_t x_rows, int64_t in) {
  const size_t rows = size_t(std::max<int64_t>(x_rows, 1)), n = size_t(std::max<int64_t>(in, 0));
  return align256(rows * n * 4) + align256(rows * 8) + align256(rows * (n / 32) * 4);
}

SplitX launch_split_x(const Ctx& ctx, const float* x, int64_t rows, int64_t in, int group_size, void* scratch) {
  CUDA_REQUIRE(scratch != nullptr, "gemm (mma): no scratch for the split x");
  CUDA_REQUIRE(in % 32 == 0 && group_size % 32 == 0 && in % group_size == 0, "gemm (mma): bad split-x shape");
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  CUDA_REQUIRE(blocks < (int64_t(1) << 31), "gemm (mma): too many x rows");
  // gemm_scratch_bytes' layout: planes, then scales, then group sums.
  auto* planes = static_cast<unsigned char*>(scratch);
  auto* scale = reinterpret_cast<float2*>(planes + align256(size_t(rows) * size_t(in) * 4));
  auto* gsum = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(scale) + align256(size_t(rows) * 8));
  split_x_kernel<<<unsigned(blocks), 32 * kRowsPerBlock, 0, ctx.stream>>>(x, rows, in, group_size, planes, scale, gsum);
  CUDA_CHECK_LAUNCH();
  return SplitX{planes, scale, gsum};
}

}  // namespace moecel::cuda
