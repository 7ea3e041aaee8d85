// CudaBackend: device setup, memory and transfers, and the host side of every op: validation with
// messages naming what was expected (mirroring the CPU backend's checks), then one launcher call from the
// op family's .cuh. Kernels run on one non-blocking stream; only to_host / from_host / argmax / synchronize
// wait for it, and those also report bad input that kernels flagged (see cuda_common.cuh, DeviceError).
// (src/backend/**/*.cpp is globbed into moecel_lib even without CUDA, hence the guard.)
#if defined(MOECEL_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/bias_ops.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_memory.h"
#include "backend/cuda/fused_moe.cuh"
#include "backend/cuda/misc.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/norm_rope.cuh"
#include "backend/cuda/qmatmul.cuh"
#include "backend/cuda/router_grouped.cuh"
#include "core/error.h"

namespace moecel {
namespace {

using cuda::FloatType;

FloatType float_type(DType t, const std::string& what) {
  switch (t) {
    case DType::kF32: return FloatType::kF32;
    case DType::kF16: return FloatType::kF16;
    case DType::kBF16: return FloatType::kBF16;
    default: fail("{}: expected an F32, F16 or BF16 tensor, got {}", what, dtype_name(t));
  }
}

void check_dev(const Tensor& t, const char* what) {
  MOECEL_CHECK(t.device == Device::kCuda,
               "{}: tensor {} is in host memory; the CUDA backend needs it on the device "
               "(alloc / to_device)",
               what, shape_str(t.shape));
  MOECEL_CHECK(t.data != nullptr || t.numel() == 0, "{}: tensor {} has no data", what, shape_str(t.shape));
}

void check_f32(const Tensor& t, const char* what) {
  check_dev(t, what);
  MOECEL_CHECK(t.dtype == DType::kF32, "{}: expected an F32 tensor, got {}", what, dtype_name(t.dtype));
}

void check_rows(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  MOECEL_CHECK(t.numel() == rows * cols, "{}: expected {} elements ({} x {}), got shape {}", what, rows * cols, rows,
               cols, shape_str(t.shape));
}

// Kernels that stage inputs in shared memory must not write their own input.
void check_no_overlap(const Tensor& a, const Tensor& b, const char* what) {
  const char* pa = static_cast<const char*>(a.data);
  const char* pb = static_cast<const char*>(b.data);
  const bool overlap = a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
  MOECEL_CHECK(!overlap, "{}: the output must not overlap the input", what);
}

// The CPU backend's weight checks (cpu/matmul.cpp), for device weights, turned into raw pointers.
cuda::WeightView weight_view(const LinearWeight& w, const char* op) {
  const std::string& n = w.name;
  MOECEL_CHECK(w.weight.device == Device::kCuda, "{}: weight {} is in host memory; upload it with to_device", op, n);
  MOECEL_CHECK(w.out >= 0 && w.in > 0, "{}: weight {} has bad shape out={} in={}", op, n, w.out, w.in);
  MOECEL_CHECK(w.n_stack >= 0, "{}: weight {} has n_stack {}", op, n, w.n_stack);
  const Shape lead = w.n_stack > 0 ? Shape{w.n_stack} : Shape{};
  auto expect = [&](const Tensor& t, const char* what, int64_t cols) {
    Shape want = lead;
    want.push_back(w.out);
    want.push_back(cols);
    MOECEL_CHECK(t.shape == want, "{}: {}.{}: expected shape {}, got {}", op, n, what, shape_str(want),
                 shape_str(t.shape));
    MOECEL_CHECK(t.numel() == 0 || t.data != nullptr, "{}: {}.{} has no data", op, n, what);
    MOECEL_CHECK(t.device == Device::kCuda, "{}: {}.{} is in host memory; upload it with to_device", op, n, what);
  };
  cuda::WeightView v;
  v.n_stack = std::max<int64_t>(1, w.n_stack);
  v.out = w.out;
  v.in = w.in;
  v.w = w.weight.data;
  if (!w.quantized()) {
    v.wtype = float_type(w.weight.dtype, fmt::format("{}: dense weight {}", op, n));
    expect(w.weight, "weight", w.in);
    return v;
  }
  MOECEL_CHECK(valid_bits(w.bits) && valid_group_size(w.group_size),
               "{}: weight {}: unsupported quantization bits={} group_size={}", op, n, w.bits, w.group_size);
  MOECEL_CHECK(w.in % w.group_size == 0 && (w.in * w.bits) % 32 == 0,
               "{}: weight {}: in={} is not a multiple of group_size {} and 32/bits", op, n, w.in, w.group_size);
  MOECEL_CHECK(w.weight.dtype == DType::kU32, "{}: {}.weight must be U32 packed, got {}", op, n,
               dtype_name(w.weight.dtype));
  expect(w.weight, "weight", w.in * w.bits / 32);
  MOECEL_CHECK(reinterpret_cast<uintptr_t>(w.weight.data) % 16 == 0,
               "{}: {}.weight is not 16-byte aligned on the device (upload it with to_device)", op, n);
  v.stype = float_type(w.scales.dtype, fmt::format("{}: {}.scales", op, n));
  expect(w.scales, "scales", w.in / w.group_size);
  v.scales = w.scales.data;
  if (w.biases.data != nullptr) {
    MOECEL_CHECK(w.biases.dtype == w.scales.dtype, "{}: {}.biases dtype {} differs from scales dtype {}", op, n,
                 dtype_name(w.biases.dtype), dtype_name(w.scales.dtype));
    expect(w.biases, "biases", w.in / w.group_size);
    v.biases = w.biases.data;
  }
  v.bits = w.bits;
  v.group_size = w.group_size;
  return v;
}

}  // namespace

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = fmt::format("cudaGetDeviceCount: {}: {}", cudaGetErrorName(err), cudaGetErrorString(err));
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount reports 0 devices";
  return n;
}

// Host <-> device words of a decode-graph replay (pinned, so the async copies read / write them directly).
struct StepIo {
  int64_t pos;
  int32_t id, next;
};

// Launch-width knobs of the fused path, read once per backend (results do not depend on them):
// MOECEL_CUDA_FUSED_ROWS (rows per warp of kernel A: 1, 2, 4; 0 = the pipelined grid-stride kernel A),
// MOECEL_CUDA_FUSED_DOWN_ROWS (kernel B: 1, 2) and MOECEL_CUDA_FUSED_SLOTS (slots kernel B stages at once: 1, 2, 4, 8).
int knob_from_env(const char* name, int fallback, std::initializer_list<int> allowed) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  std::string list;
  for (int a : allowed) {
    if (std::to_string(a) == v) return a;
    list += (list.empty() ? "" : ", ") + std::to_string(a);
  }
  fail("{}='{}': expected one of {}", name, v, list);
}

struct CudaBackend::Impl {
  cuda::Ctx ctx;
  int fused_rows_per_warp = knob_from_env("MOECEL_CUDA_FUSED_ROWS", 2, {0, 1, 2, 4});
  int fused_down_rows_per_warp = knob_from_env("MOECEL_CUDA_FUSED_DOWN_ROWS", 1, {1, 2});
  int fused_slot_batch = knob_from_env("MOECEL_CUDA_FUSED_SLOTS", 4, {1, 2, 4, 8});
  // Decode-step fusions (bit 1: rms_norm_linears, 2: linear_residual, 4: rms_norm_router's norm, 8: its top-k in
  // the same launch); for measuring what each saves. Results do not depend on them.
  int fusions = knob_from_env("MOECEL_CUDA_FUSIONS", 7, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  bool fused_b_prefetch = knob_from_env("MOECEL_CUDA_FUSED_B_PREFETCH", 1, {0, 1}) == 1;
  std::shared_ptr<cuda::DevicePool> pool = std::make_shared<cuda::DevicePool>();
  unsigned* flag_host = nullptr;    // mapped pinned word the kernels raise DeviceError bits in
  int64_t* step_pos_dev = nullptr;  // the device step position decode graphs read (ctx.step_pos while recording)
  unsigned* counter_dev = nullptr;  // ctx.block_counter
  StepIo* io_host = nullptr;        // pinned
  bool capturing = false;
  std::vector<std::shared_ptr<void>> captured;  // blocks handed out while recording: reserved for the graph

  ~Impl() {  // errors ignored: this may run while the process exits
    if (ctx.stream) {
      cudaStreamSynchronize(ctx.stream);
      cudaStreamDestroy(ctx.stream);
    }
    if (flag_host) cudaFreeHost(flag_host);
    if (io_host) cudaFreeHost(io_host);
    if (step_pos_dev) cudaFree(step_pos_dev);
    if (counter_dev) cudaFree(counter_dev);
    cudaGetLastError();
  }

  void sync() {
    MOECEL_CHECK(!capturing, "CUDA backend: an op waited for the device while a decode graph was being recorded");
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    const unsigned e = __atomic_exchange_n(flag_host, 0u, __ATOMIC_SEQ_CST);
    if (e == 0) return;
    std::string what;
    if (e & cuda::kErrTokenId) what += "a token id outside the vocabulary (embedding)";
    if (e & cuda::kErrExpertIndex)
      what += std::string(what.empty() ? "" : "; ") + "an expert index outside [0, n_experts) (gather_linear)";
    fail("CUDA backend: a kernel was given bad input: {}; the affected outputs are NaN", what);
  }

  // Every device block of an op goes through here: while recording, the graph keeps it.
  std::shared_ptr<void> get(size_t bytes) {
    std::shared_ptr<void> p = pool->get(bytes);
    if (capturing) captured.push_back(p);
    return p;
  }
  std::shared_ptr<void> scratch(size_t bytes) { return get(std::max<size_t>(bytes, 16)); }
};

namespace {

// One instantiated decode step. The blocks recorded ops wrote stay reserved (`blocks`), and so do ids / next.
class CudaDecodeGraph final : public DecodeGraph {
 public:
  CudaDecodeGraph(CudaBackend::Impl* impl, cudaGraphExec_t exec, std::vector<std::shared_ptr<void>> blocks, Tensor ids,
                  Tensor next)
      : impl_(impl), exec_(exec), blocks_(std::move(blocks)), ids_(std::move(ids)), next_(std::move(next)) {}
  ~CudaDecodeGraph() override {
    cudaGraphExecDestroy(exec_);  // errors ignored: this may run while the process exits
    cudaGetLastError();
  }

  int32_t run(int32_t id, int64_t pos) override {
    MOECEL_CHECK(pos >= 0, "decode graph: negative position {}", pos);
    const cudaStream_t s = impl_->ctx.stream;
    impl_->io_host->pos = pos;
    impl_->io_host->id = id;
    CUDA_CHECK(cudaMemcpyAsync(impl_->step_pos_dev, &impl_->io_host->pos, sizeof(int64_t), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(ids_.data, &impl_->io_host->id, sizeof(int32_t), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaGraphLaunch(exec_, s));
    CUDA_CHECK(cudaMemcpyAsync(&impl_->io_host->next, next_.data, sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    impl_->sync();  // also reports bad input flagged by the kernels; the pinned words are free again after it
    return impl_->io_host->next;
  }

 private:
  CudaBackend::Impl* impl_;
  cudaGraphExec_t exec_;
  std::vector<std::shared_ptr<void>> blocks_;
  Tensor ids_, next_;
};

}  // namespace

CudaBackend::CudaBackend(int device) : impl_(std::make_unique<Impl>()) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) fail("--backend cuda: no CUDA device found ({})", why);
  MOECEL_CHECK(device >= 0 && device < n, "--backend cuda: CUDA device {} does not exist ({} found)", device, n);
  CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  // The kernels are built for sm_90a only (-gencode=arch=compute_90a,code=sm_90a), which runs on CC 9.0 alone.
  MOECEL_CHECK(prop.major == 9 && prop.minor == 0,
               "--backend cuda: device {} ({}) has compute capability {}.{}; this build's kernels are for sm_90a "
               "(Hopper, 9.0) only",
               device, prop.name, prop.major, prop.minor);
  impl_->ctx.sm_count = prop.multiProcessorCount;
  impl_->ctx.max_smem_optin = int(prop.sharedMemPerBlockOptin);
  CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->ctx.stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&impl_->flag_host), sizeof(unsigned), cudaHostAllocMapped));
  *impl_->flag_host = 0;
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl_->ctx.error_flag), impl_->flag_host, 0));
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&impl_->io_host), sizeof(StepIo), cudaHostAllocDefault));
  *impl_->io_host = StepIo{};
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&impl_->step_pos_dev), sizeof(int64_t)));
  CUDA_CHECK(cudaMemset(impl_->step_pos_dev, 0, sizeof(int64_t)));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&impl_->counter_dev), sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(impl_->counter_dev, 0, sizeof(unsigned)));
  impl_->ctx.block_counter = impl_->counter_dev;
  // Programmatic dependent launch (cuda_common.cuh): on unless MOECEL_CUDA_PDL=0 (for measuring its gain).
  impl_->ctx.pdl = knob_from_env("MOECEL_CUDA_PDL", 1, {0, 1}) == 1;
  impl_->ctx.gemv_rows = knob_from_env("MOECEL_CUDA_GEMV_ROWS", 0, {0, 1, 2, 4});
  impl_->ctx.extra_launches = knob_from_env("MOECEL_CUDA_EXTRA_LAUNCHES", 0, {0, 1, 2, 4});
}

std::unique_ptr<DecodeGraph> CudaBackend::capture_decode(const std::function<void()>& record, const Tensor& ids,
                                                         const Tensor& next) {
  check_dev(ids, "decode graph ids");
  check_dev(next, "decode graph next");
  MOECEL_CHECK(ids.dtype == DType::kI32 && ids.numel() == 1 && next.dtype == DType::kI32 && next.numel() == 1,
               "decode graph: ids and next must be I32 (1,) tensors");
  MOECEL_CHECK(!impl_->capturing, "decode graph: already recording");
  impl_->sync();  // nothing of earlier work may be left on the stream
  Impl& im = *impl_;
  im.captured.clear();
  // Relaxed: the caching allocator may cudaMalloc a new block while the stream is recorded.
  CUDA_CHECK(cudaStreamBeginCapture(im.ctx.stream, cudaStreamCaptureModeRelaxed));
  im.capturing = true;
  im.ctx.step_pos = im.step_pos_dev;
  cudaGraph_t graph = nullptr;
  try {
    record();
  } catch (...) {
    im.capturing = false;
    im.ctx.step_pos = nullptr;
    im.captured.clear();
    cudaStreamEndCapture(im.ctx.stream, &graph);  // errors ignored: the first error is the one reported
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  im.capturing = false;
  im.ctx.step_pos = nullptr;
  std::vector<std::shared_ptr<void>> blocks = std::move(im.captured);
  im.captured.clear();
  CUDA_CHECK(cudaStreamEndCapture(im.ctx.stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(err);
  return std::make_unique<CudaDecodeGraph>(impl_.get(), exec, std::move(blocks), ids, next);
}

CudaBackend::~CudaBackend() = default;

size_t CudaBackend::pool_live_bytes() const {
  return impl_->pool->live_bytes();
}
size_t CudaBackend::pool_cached_bytes() const {
  return impl_->pool->cached_bytes();
}

void CudaBackend::synchronize() {
  impl_->sync();
}

// ---- memory ----

Tensor CudaBackend::alloc(DType dtype, Shape shape) {
  Tensor t = scratch(dtype, std::move(shape));
  if (t.data) CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), impl_->ctx.stream));
  return t;
}

Tensor CudaBackend::scratch(DType dtype, Shape shape) {
  for (int64_t d : shape) MOECEL_CHECK(d >= 0, "cuda alloc: negative dimension in {}", shape_str(shape));
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.device = Device::kCuda;
  const size_t bytes = t.nbytes();
  if (bytes == 0) return t;
  t.owner = impl_->get(bytes);
  t.data = t.owner.get();
  return t;
}

Tensor CudaBackend::to_device(const Tensor& host) {
  if (host.device == Device::kCuda) return host;
  Tensor t = host;
  t.device = Device::kCuda;
  t.owner.reset();
  t.data = nullptr;
  const size_t bytes = host.nbytes();
  if (bytes == 0 || host.data == nullptr) return t;
  // Weights live for the whole run: exact-size allocations, outside the activation cache.
  void* p = cuda::device_malloc(bytes, impl_->pool.get(), "a weight tensor");
  t.owner = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  t.data = p;
  CUDA_CHECK(cudaMemcpyAsync(p, host.data, bytes, cudaMemcpyHostToDevice, impl_->ctx.stream));
  impl_->sync();
  return t;
}

void CudaBackend::to_host(const Tensor& src, void* dst) {
  const size_t bytes = src.nbytes();
  if (bytes == 0) return;
  if (src.device == Device::kCpu) {
    std::memcpy(dst, src.data, bytes);
    return;
  }
  check_dev(src, "to_host");
  CUDA_CHECK(cudaMemcpyAsync(dst, src.data, bytes, cudaMemcpyDeviceToHost, impl_->ctx.stream));
  impl_->sync();
}

void CudaBackend::from_host(const void* src, Tensor& dst) {
  const size_t bytes = dst.nbytes();
  if (bytes == 0) return;
  if (dst.device == Device::kCpu) {
    std::memcpy(dst.data, src, bytes);
    return;
  }
  check_dev(dst, "from_host");
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src, bytes, cudaMemcpyHostToDevice, impl_->ctx.stream));
  impl_->sync();  // the caller's buffer may go away after we return
}

// ---- ops ----

void CudaBackend::embedding(const LinearWeight& table, const Tensor& ids, Tensor& out) {
  check_f32(out, "embedding output");
  check_dev(ids, "embedding ids");
  MOECEL_CHECK(ids.dtype == DType::kI32, "embedding: ids must be I32, got {}", dtype_name(ids.dtype));
  const int64_t n = ids.numel();
  check_rows(out, n, table.in, "embedding output");
  const cuda::WeightView v = weight_view(table, "embedding");
  cuda::launch_embedding(impl_->ctx, v, ids.ptr<int32_t>(), n, out.ptr<float>());
}

void CudaBackend::linear(const LinearWeight& w, const Tensor& x, Tensor& y) {
  check_f32(x, "linear input");
  check_f32(y, "linear output");
  const cuda::WeightView v = weight_view(w, "linear");
  const int64_t n = x.numel() / std::max<int64_t>(1, w.in);
  check_rows(x, n, w.in, w.name.c_str());
  check_rows(y, n, w.out, w.name.c_str());
  check_no_overlap(x, y, "linear");
  cuda::launch_linear(impl_->ctx, v, x.ptr<float>(), n, y.ptr<float>());
}

void CudaBackend::gather_linear(const LinearWeight& w, const Tensor& x, const Tensor& indices, Tensor& y) {
  check_f32(x, "gather_linear input");
  check_f32(y, "gather_linear output");
  check_dev(indices, "gather_linear indices");
  MOECEL_CHECK(indices.dtype == DType::kI32 && indices.ndim() == 2, "gather_linear: indices must be I32 (n_tokens, k)");
  const cuda::WeightView v = weight_view(w, "gather_linear");
  MOECEL_CHECK(w.n_stack > 0, "gather_linear: weight {} has no experts axis", w.name);
  const int64_t n = indices.dim(0), k = indices.dim(1);
  const bool per_slot = k > 1 && x.numel() == n * k * w.in;  // else one x row shared by the k slots
  if (!per_slot) check_rows(x, n, w.in, w.name.c_str());
  check_rows(y, n * k, w.out, w.name.c_str());
  check_no_overlap(x, y, "gather_linear");
  if (n * k == 0 || w.out == 0) return;
  const std::shared_ptr<void> scratch = impl_->scratch(cuda::gather_scratch_bytes(v, n, k));
  // The scratch block goes back to the pool on return while the kernels may still be queued: safe, because any
  // later user of the block is queued behind them on the same stream.
  cuda::launch_gather_linear(impl_->ctx, v, x.ptr<float>(), per_slot, indices.ptr<int32_t>(), n, k, y.ptr<float>(),
                             scratch.get());
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  check_f32(x, "rms_norm input");
  check_f32(y, "rms_norm output");
  check_dev(weight, "rms_norm weight");
  const FloatType wt = float_type(weight.dtype, "rms_norm weight");
  const int64_t d = weight.numel();
  MOECEL_CHECK(d > 0, "rms_norm: empty weight");
  const int64_t n = x.numel() / d;
  check_rows(x, n, d, "rms_norm input");
  check_rows(y, n, d, "rms_norm output");
  if (x.data != y.data) check_no_overlap(x, y, "rms_norm");  // in place is fine, a partial overlap is not
  cuda::launch_rms_norm(impl_->ctx, x.ptr<float>(), weight.data, wt, n, d, eps, y.ptr<float>());
}

void CudaBackend::rope(Tensor& x, int64_t pos0, int n_heads, int head_dim, int rot_dims, float theta) {
  check_f32(x, "rope input");
  MOECEL_CHECK(n_heads > 0 && head_dim > 0, "rope: bad n_heads {} / head_dim {}", n_heads, head_dim);
  const int64_t width = int64_t(n_heads) * head_dim;
  const int64_t n = x.numel() / width;
  check_rows(x, n, width, "rope input");
  MOECEL_CHECK(rot_dims % 2 == 0 && rot_dims >= 0 && rot_dims <= head_dim, "rope: bad rotary dims {}", rot_dims);
  const int half = rot_dims / 2;
  MOECEL_CHECK(half <= cuda::kMaxRopeHalf, "rope: rotary dims {} above the CUDA backend's limit {}", rot_dims,
               2 * cuda::kMaxRopeHalf);
  MOECEL_CHECK(pos0 >= 0, "rope: negative position {}", pos0);
  cuda::RopeFreqs f{};
  // Exactly the CPU backend's frequencies: pow in double, then rounded to f32.
  for (int i = 0; i < half; ++i) f.inv_freq[i] = float(std::pow(double(theta), -2.0 * i / rot_dims));
  cuda::launch_rope(impl_->ctx, x.ptr<float>(), n, pos0, n_heads, head_dim, half, f);
}

void CudaBackend::kv_store(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache, int64_t pos0) {
  check_f32(k, "kv_store k");
  check_f32(v, "kv_store v");
  check_f32(k_cache, "kv_store k_cache");
  check_f32(v_cache, "kv_store v_cache");
  MOECEL_CHECK(k_cache.ndim() == 2 && v_cache.shape == k_cache.shape,
               "kv_store: caches must both be "
               "(max_positions, n_kv_heads * head_dim), got {} and {}",
               shape_str(k_cache.shape), shape_str(v_cache.shape));
  const int64_t width = k_cache.dim(-1);
  const int64_t n = k.numel() / width;
  check_rows(k, n, width, "kv_store k");
  check_rows(v, n, width, "kv_store v");
  MOECEL_CHECK(pos0 >= 0 && pos0 + n <= k_cache.dim(0), "context length {} exceeds the KV cache size {}", pos0 + n,
               k_cache.dim(0));
  const size_t bytes = size_t(n * width) * sizeof(float);
  if (bytes == 0) return;
  if (impl_->ctx.step_pos) {  // recording a decode graph: the row comes from the device step position
    cuda::launch_kv_store(impl_->ctx, k.ptr<float>(), v.ptr<float>(), n, width, pos0, k_cache.dim(0),
                          k_cache.ptr<float>(), v_cache.ptr<float>());
    return;
  }
  CUDA_CHECK(
      cudaMemcpyAsync(k_cache.ptr<float>() + pos0 * width, k.data, bytes, cudaMemcpyDeviceToDevice, impl_->ctx.stream));
  CUDA_CHECK(
      cudaMemcpyAsync(v_cache.ptr<float>() + pos0 * width, v.data, bytes, cudaMemcpyDeviceToDevice, impl_->ctx.stream));
}

void CudaBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t pos0, int n_heads,
                            int n_kv_heads, int head_dim, float scale, int window, Tensor& out) {
  check_f32(q, "attention q");
  check_f32(k_cache, "attention k_cache");
  check_f32(v_cache, "attention v_cache");
  check_f32(out, "attention output");
  MOECEL_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
               "attention: n_heads {} not a multiple of n_kv_heads {}", n_heads, n_kv_heads);
  MOECEL_CHECK(head_dim > 0 && head_dim <= cuda::kMaxHeadDim,
               "attention: head_dim {} outside the CUDA backend's "
               "range [1, {}]",
               head_dim, cuda::kMaxHeadDim);
  const int64_t q_width = int64_t(n_heads) * head_dim, kv_width = int64_t(n_kv_heads) * head_dim;
  const int64_t n = q.numel() / q_width;
  check_rows(q, n, q_width, "attention q");
  check_rows(out, n, q_width, "attention output");
  MOECEL_CHECK(k_cache.ndim() == 2 && k_cache.dim(1) == kv_width && v_cache.shape == k_cache.shape,
               "attention: caches must be (max_positions, {}), got {} and {}", kv_width, shape_str(k_cache.shape),
               shape_str(v_cache.shape));
  MOECEL_CHECK(pos0 >= 0 && pos0 + n <= k_cache.dim(0), "attention: positions up to {} exceed the KV cache size {}",
               pos0 + n, k_cache.dim(0));
  MOECEL_CHECK(window >= 0, "attention: negative window {}", window);
  MOECEL_CHECK(n <= 65535, "attention: at most 65535 tokens per call, got {}", n);
  check_no_overlap(q, out, "attention");
  cuda::launch_attention(impl_->ctx, q.ptr<float>(), k_cache.ptr<float>(), v_cache.ptr<float>(), pos0, n, n_heads,
                         n_kv_heads, head_dim, scale, window, out.ptr<float>());
}

void CudaBackend::glu(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) {
  check_f32(gate, "glu gate");
  check_f32(up, "glu up");
  check_f32(out, "glu output");
  MOECEL_CHECK(gate.numel() == up.numel() && gate.numel() == out.numel(), "glu: shapes {}, {} and {} differ",
               shape_str(gate.shape), shape_str(up.shape), shape_str(out.shape));
  cuda::GluAct a = cuda::GluAct::kSiLU;
  switch (act) {
    case Activation::kSiLU: a = cuda::GluAct::kSiLU; break;
    case Activation::kGeLU: a = cuda::GluAct::kGeLU; break;
    case Activation::kReLU2: a = cuda::GluAct::kReLU2; break;
  }
  cuda::launch_glu(impl_->ctx, a, gate.ptr<float>(), up.ptr<float>(), gate.numel(), out.ptr<float>());
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_f32(a, "add input");
  check_f32(b, "add input");
  check_f32(out, "add output");
  MOECEL_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: shapes {} and {} differ", shape_str(a.shape),
               shape_str(b.shape));
  cuda::launch_add(impl_->ctx, a.ptr<float>(), b.ptr<float>(), a.numel(), out.ptr<float>());
}

void CudaBackend::add_rms_norm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& weight, float eps,
                               Tensor& y) {
  check_f32(a, "add_rms_norm input");
  check_f32(b, "add_rms_norm input");
  check_f32(sum, "add_rms_norm sum");
  check_f32(y, "add_rms_norm output");
  check_dev(weight, "add_rms_norm weight");
  const FloatType wt = float_type(weight.dtype, "add_rms_norm weight");
  MOECEL_CHECK(a.numel() == b.numel() && a.numel() == sum.numel() && a.numel() == y.numel(),
               "add_rms_norm: shapes {}, {}, {} and {} differ", shape_str(a.shape), shape_str(b.shape),
               shape_str(sum.shape), shape_str(y.shape));
  const int64_t d = weight.numel();
  MOECEL_CHECK(d > 0, "add_rms_norm: empty weight");
  const int64_t n = a.numel() / d;
  check_rows(a, n, d, "add_rms_norm input");
  check_no_overlap(a, y, "add_rms_norm");
  check_no_overlap(b, y, "add_rms_norm");
  check_no_overlap(sum, y, "add_rms_norm");
  cuda::launch_add_rms_norm(impl_->ctx, a.ptr<float>(), b.ptr<float>(), sum.ptr<float>(), weight.data, wt, n, d, eps,
                            y.ptr<float>());
}

void CudaBackend::qk_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                                     float eps, int n_heads, int n_kv_heads, int head_dim, int rot_dims, float theta,
                                     Tensor& k_cache, Tensor& v_cache, int64_t pos0) {
  if (rot_dims == 0) {  // nothing to rotate: the plain ops
    Backend::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, n_heads, n_kv_heads, head_dim, rot_dims, theta, k_cache,
                                v_cache, pos0);
    return;
  }
  check_f32(q, "qk_norm_rope_store q");
  check_f32(k, "qk_norm_rope_store k");
  check_f32(v, "qk_norm_rope_store v");
  check_f32(k_cache, "qk_norm_rope_store k_cache");
  check_f32(v_cache, "qk_norm_rope_store v_cache");
  check_dev(q_norm, "qk_norm_rope_store q_norm");
  check_dev(k_norm, "qk_norm_rope_store k_norm");
  const FloatType qt = float_type(q_norm.dtype, "q_norm weight"), kt = float_type(k_norm.dtype, "k_norm weight");
  MOECEL_CHECK(n_heads > 0 && n_kv_heads > 0 && head_dim > 0, "qk_norm_rope_store: bad heads {} / {} / head_dim {}",
               n_heads, n_kv_heads, head_dim);
  const int64_t q_width = int64_t(n_heads) * head_dim, kv_width = int64_t(n_kv_heads) * head_dim;
  const int64_t n = q.numel() / q_width;
  check_rows(q, n, q_width, "qk_norm_rope_store q");
  check_rows(k, n, kv_width, "qk_norm_rope_store k");
  check_rows(v, n, kv_width, "qk_norm_rope_store v");
  MOECEL_CHECK(q_norm.numel() == q_width && k_norm.numel() == kv_width,
               "qk_norm_rope_store: norm weights of {} and {} elements, expected {} and {}", q_norm.numel(),
               k_norm.numel(), q_width, kv_width);
  MOECEL_CHECK(k_cache.ndim() == 2 && k_cache.dim(1) == kv_width && v_cache.shape == k_cache.shape,
               "kv_store: caches must both be (max_positions, {}), got {} and {}", kv_width, shape_str(k_cache.shape),
               shape_str(v_cache.shape));
  MOECEL_CHECK(pos0 >= 0 && pos0 + n <= k_cache.dim(0), "context length {} exceeds the KV cache size {}", pos0 + n,
               k_cache.dim(0));
  MOECEL_CHECK(rot_dims % 2 == 0 && rot_dims > 0 && rot_dims <= head_dim, "rope: bad rotary dims {}", rot_dims);
  const int half = rot_dims / 2;
  MOECEL_CHECK(half <= cuda::kMaxRopeHalf, "rope: rotary dims {} above the CUDA backend's limit {}", rot_dims,
               2 * cuda::kMaxRopeHalf);
  MOECEL_CHECK(n <= 65535, "qk_norm_rope_store: at most 65535 tokens per call, got {}", n);
  if (q_width > 4096 || kv_width > 4096) {  // wider rows than the fused kernel holds: the ops one by one
    return Backend::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, n_heads, n_kv_heads, head_dim, rot_dims, theta,
                                       k_cache, v_cache, pos0);
  }
  check_no_overlap(q, k, "qk_norm_rope_store");
  cuda::RopeFreqs f{};
  for (int i = 0; i < half; ++i) f.inv_freq[i] = float(std::pow(double(theta), -2.0 * i / rot_dims));
  cuda::launch_qk_norm_rope_store(impl_->ctx, q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), q_norm.data, qt,
                                  k_norm.data, kt, eps, n, n_heads, n_kv_heads, head_dim, half, f, pos0, k_cache.dim(0),
                                  k_cache.ptr<float>(), v_cache.ptr<float>());
}

void CudaBackend::clamp(Tensor& x, float limit) {
  check_f32(x, "clamp");
  cuda::launch_clamp(impl_->ctx, x.ptr<float>(), x.numel(), limit);
}

void CudaBackend::router_topk(const Tensor& logits, RouterScoring scoring, int k, bool renormalize, Tensor& indices,
                              Tensor& weights) {
  check_f32(logits, "router logits");
  check_dev(indices, "router indices");
  check_f32(weights, "router weights");
  MOECEL_CHECK(logits.ndim() == 2, "router: logits must be (n_tokens, n_experts), got {}", shape_str(logits.shape));
  MOECEL_CHECK(indices.dtype == DType::kI32, "router: indices must be I32, got {}", dtype_name(indices.dtype));
  const int64_t n = logits.dim(0), n_experts = logits.dim(1);
  MOECEL_CHECK(k >= 1 && k <= n_experts, "router: top-k {} must be in [1, {}]", k, n_experts);
  MOECEL_CHECK(k <= cuda::kMaxTopK && n_experts <= cuda::kMaxRouterExperts,
               "router: the CUDA backend supports top-k <= {} of <= {} experts, got {} of {}", cuda::kMaxTopK,
               cuda::kMaxRouterExperts, k, n_experts);
  check_rows(indices, n, k, "router indices");
  check_rows(weights, n, k, "router weights");
  cuda::launch_router_topk(impl_->ctx, logits.ptr<float>(), n, int(n_experts), k,
                           scoring == RouterScoring::kTopKSoftmax, renormalize, indices.ptr<int32_t>(),
                           weights.ptr<float>());
}

void CudaBackend::moe_weighted_sum(const Tensor& y, const Tensor& weights, Tensor& out) {
  check_f32(y, "moe_weighted_sum input");
  check_f32(weights, "moe_weighted_sum weights");
  check_f32(out, "moe_weighted_sum output");
  MOECEL_CHECK(weights.ndim() == 2, "moe_weighted_sum: weights must be (n_tokens, k), got {}",
               shape_str(weights.shape));
  const int64_t n = weights.dim(0), k = weights.dim(1);
  if (n == 0) return;
  const int64_t h = out.numel() / n;
  check_rows(out, n, h, "moe_weighted_sum output");
  check_rows(y, n * k, h, "moe_weighted_sum input");
  check_no_overlap(y, out, "moe_weighted_sum");
  cuda::launch_moe_weighted_sum(impl_->ctx, y.ptr<float>(), weights.ptr<float>(), n, k, h, out.ptr<float>());
}

namespace {

// fused_moe, and fused_moe_add when residual is set (then out is the residual, updated in place).
void run_fused_moe(CudaBackend& be, CudaBackend::Impl& im, const LinearWeight& gate, const LinearWeight& up,
                   const LinearWeight& down, Activation act, const Tensor& x, const Tensor& indices,
                   const Tensor& weights, Tensor& out, bool residual) {
  check_f32(x, "fused_moe input");
  check_f32(out, "fused_moe output");
  check_f32(weights, "fused_moe weights");
  check_dev(indices, "fused_moe indices");
  cuda::FusedMoeArgs a;
  a.gate = weight_view(gate, "fused_moe");
  a.up = weight_view(up, "fused_moe");
  a.down = weight_view(down, "fused_moe");
  MOECEL_CHECK(gate.quantized() && gate.n_stack > 0, "fused_moe: {} must be quantized experts", gate.name);
  const int64_t k = indices.numel();
  MOECEL_CHECK(indices.dtype == DType::kI32 && weights.numel() == k && k >= 1,
               "fused_moe: indices must be I32 (1, k) with k >= 1 and weights (1, k)");
  check_rows(x, 1, gate.in, "fused_moe input");
  check_rows(out, 1, gate.in, "fused_moe output");
  check_no_overlap(x, out, "fused_moe");
  Tensor act_buf = be.scratch(DType::kF32, {k, gate.out});  // (k, ffn)
  a.x = x.ptr<float>();
  a.indices = indices.ptr<int32_t>();
  a.weights = weights.ptr<float>();
  a.act = act_buf.ptr<float>();
  a.out = out.ptr<float>();
  a.residual = residual ? out.ptr<float>() : nullptr;
  a.k = int(k);
  a.glu = act == Activation::kSiLU   ? cuda::GluAct::kSiLU
          : act == Activation::kGeLU ? cuda::GluAct::kGeLU
                                     : cuda::GluAct::kReLU2;
  a.rows_per_warp = im.fused_rows_per_warp;
  a.down_rows_per_warp = im.fused_down_rows_per_warp;
  a.max_slot_batch = im.fused_slot_batch;
  a.b_prefetch = im.fused_b_prefetch;
  cuda::launch_fused_moe(im.ctx, a);
}

}  // namespace

void CudaBackend::fused_moe(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                            const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& out) {
  run_fused_moe(*this, *impl_, gate, up, down, act, x, indices, weights, out, false);
}

void CudaBackend::fused_moe_add(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down,
                                Activation act, const Tensor& x, const Tensor& indices, const Tensor& weights,
                                Tensor& residual) {
  run_fused_moe(*this, *impl_, gate, up, down, act, x, indices, weights, residual, true);
}

// ---- decode-step fusions: one matrix-vector launch (qmatmul.cuh, launch_gemv_fused) where it applies, else the
// Backend defaults (the ops one by one) ----

namespace {

// The weights of one fused launch: quantized, sharing in, bits, group size and scale type.
bool fusable(std::span<const LinearWeight* const> ws, int64_t in) {
  if (ws.empty() || ws.size() > size_t(cuda::kMaxGemvParts)) return false;
  for (const LinearWeight* w : ws) {
    if (!w->quantized() || w->n_stack != 0 || w->in != in || w->bits != ws[0]->bits ||
        w->group_size != ws[0]->group_size || w->scales.dtype != ws[0]->scales.dtype) {
      return false;
    }
  }
  return true;
}

cuda::GemvFusion norm_fusion(const Tensor& norm_weight, float eps, int64_t d) {
  check_dev(norm_weight, "rms_norm weight");
  MOECEL_CHECK(norm_weight.numel() == d, "rms_norm: weight of {} elements for rows of {}", norm_weight.numel(), d);
  cuda::GemvFusion f;
  f.norm_w = norm_weight.data;
  f.norm_type = float_type(norm_weight.dtype, "rms_norm weight");
  f.eps = eps;
  return f;
}

}  // namespace

void CudaBackend::rms_norm_linears(const Tensor& x, const Tensor& norm_weight, float eps,
                                   std::span<const LinearWeight* const> ws, std::span<Tensor* const> ys,
                                   Tensor* xn_out) {
  MOECEL_CHECK(ws.size() == ys.size(), "rms_norm_linears: {} weights but {} outputs", ws.size(), ys.size());
  const int64_t d = norm_weight.numel();
  if (!(impl_->fusions & 1) || d == 0 || !fusable(ws, d) || x.numel() % d != 0 ||
      x.numel() / d > cuda::kGemvMaxTokens) {
    return Backend::rms_norm_linears(x, norm_weight, eps, ws, ys, xn_out);
  }
  check_f32(x, "rms_norm_linears input");
  const int64_t n = x.numel() / d;
  cuda::WeightView views[cuda::kMaxGemvParts];
  float* outs[cuda::kMaxGemvParts];
  for (size_t i = 0; i < ws.size(); ++i) {
    views[i] = weight_view(*ws[i], "rms_norm_linears");
    check_f32(*ys[i], "rms_norm_linears output");
    check_rows(*ys[i], n, ws[i]->out, ws[i]->name.c_str());
    check_no_overlap(x, *ys[i], "rms_norm_linears");
    outs[i] = ys[i]->ptr<float>();
  }
  cuda::GemvFusion f = norm_fusion(norm_weight, eps, d);
  if (xn_out) {
    check_f32(*xn_out, "rms_norm_linears normalized output");
    check_rows(*xn_out, n, d, "rms_norm_linears normalized output");
    check_no_overlap(x, *xn_out, "rms_norm_linears");
    f.xn_out = xn_out->ptr<float>();
  }
  if (!cuda::launch_gemv_fused(impl_->ctx, std::span(views, ws.size()), std::span(outs, ws.size()), x.ptr<float>(), n,
                               f)) {
    Backend::rms_norm_linears(x, norm_weight, eps, ws, ys, xn_out);
  }
}

void CudaBackend::linear_residual(const LinearWeight& w, const Tensor& x, Tensor& residual) {
  const LinearWeight* ws[] = {&w};
  const int64_t n = x.numel() / std::max<int64_t>(1, w.in);
  if (!(impl_->fusions & 2) || !fusable(ws, w.in) || n > cuda::kGemvMaxTokens)
    return Backend::linear_residual(w, x, residual);
  check_f32(x, "linear input");
  check_f32(residual, "linear residual");
  check_rows(x, n, w.in, w.name.c_str());
  check_rows(residual, n, w.out, w.name.c_str());
  check_no_overlap(x, residual, "linear_residual");
  const cuda::WeightView v = weight_view(w, "linear");
  float* y = residual.ptr<float>();
  cuda::GemvFusion f;
  f.residual = y;
  if (!cuda::launch_gemv_fused(impl_->ctx, std::span(&v, 1), std::span(&y, 1), x.ptr<float>(), n, f)) {
    Backend::linear_residual(w, x, residual);
  }
}

void CudaBackend::rms_norm_router(const Tensor& x, const Tensor& norm_weight, float eps, const LinearWeight& router,
                                  RouterScoring scoring, int k, bool renormalize, Tensor& xn, Tensor& logits,
                                  Tensor& indices, Tensor& weights) {
  const LinearWeight* ws[] = {&router};
  const int64_t d = norm_weight.numel(), n_experts = router.out;
  const bool fits = d > 0 && x.numel() % d == 0 && x.numel() / d <= cuda::kGemvMaxTokens && k >= 1 && k <= n_experts;
  if (!(impl_->fusions & 4) || !fits || !fusable(ws, d)) {
    return Backend::rms_norm_router(x, norm_weight, eps, router, scoring, k, renormalize, xn, logits, indices, weights);
  }
  const int64_t n = x.numel() / d;
  check_f32(x, "router input");
  check_f32(xn, "router normalized input");
  check_f32(logits, "router logits");
  check_f32(weights, "router weights");
  check_dev(indices, "router indices");
  MOECEL_CHECK(indices.dtype == DType::kI32, "router: indices must be I32, got {}", dtype_name(indices.dtype));
  check_rows(xn, n, d, "router normalized input");
  check_rows(logits, n, n_experts, "router logits");
  check_rows(indices, n, k, "router indices");
  check_rows(weights, n, k, "router weights");
  check_no_overlap(x, xn, "rms_norm_router");
  check_no_overlap(x, logits, "rms_norm_router");
  const cuda::WeightView v = weight_view(router, "router");
  cuda::GemvFusion f = norm_fusion(norm_weight, eps, d);
  f.xn_out = xn.ptr<float>();
  // The top-k in the launch's last block (bit 8 of MOECEL_CUDA_FUSIONS) measured slower on the H200 than a
  // separate one-warp kernel started early by PDL (OLMoE tg128 852 vs 872 tok/s), so by default it is separate.
  const bool epilogue = (impl_->fusions & 8) && k <= 32 && n_experts <= cuda::kWarpRouterExperts;
  if (epilogue) {
    f.router.k = k;
    f.router.topk_softmax = scoring == RouterScoring::kTopKSoftmax;
    f.router.renormalize = renormalize;
    f.router.indices = indices.ptr<int32_t>();
    f.router.weights = weights.ptr<float>();
    f.counter = impl_->ctx.block_counter;
  }
  float* y = logits.ptr<float>();
  if (!cuda::launch_gemv_fused(impl_->ctx, std::span(&v, 1), std::span(&y, 1), x.ptr<float>(), n, f)) {
    return Backend::rms_norm_router(x, norm_weight, eps, router, scoring, k, renormalize, xn, logits, indices, weights);
  }
  if (!epilogue) router_topk(logits, scoring, k, renormalize, indices, weights);
}

std::vector<int32_t> CudaBackend::argmax(const Tensor& logits) {
  check_f32(logits, "argmax");
  MOECEL_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 0, "argmax: empty rows in {}", shape_str(logits.shape));
  const int64_t v = logits.dim(-1), n = logits.numel() / v;
  std::vector<int32_t> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const std::shared_ptr<void> buf = impl_->scratch(size_t(n) * sizeof(int32_t));
  const std::shared_ptr<void> part = impl_->scratch(cuda::argmax_scratch_bytes(n));
  cuda::launch_argmax(impl_->ctx, logits.ptr<float>(), n, v, static_cast<int32_t*>(buf.get()), part.get());
  CUDA_CHECK(
      cudaMemcpyAsync(out.data(), buf.get(), size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, impl_->ctx.stream));
  impl_->sync();
  return out;
}

void CudaBackend::argmax_to(const Tensor& logits, Tensor& ids) {
  check_f32(logits, "argmax");
  check_dev(ids, "argmax ids");
  MOECEL_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 0, "argmax: empty rows in {}", shape_str(logits.shape));
  const int64_t v = logits.dim(-1), n = logits.numel() / v;
  MOECEL_CHECK(ids.dtype == DType::kI32 && ids.numel() == n, "argmax: ids must be I32 with {} elements, got {} {}", n,
               dtype_name(ids.dtype), shape_str(ids.shape));
  const std::shared_ptr<void> part = impl_->scratch(cuda::argmax_scratch_bytes(n));
  cuda::launch_argmax(impl_->ctx, logits.ptr<float>(), n, v, ids.ptr<int32_t>(), part.get());
}

// ---- ops of the qwen2_moe / qwen3_moe / dots1 blocks (bias_ops.cu, router_grouped.cu) ----

void CudaBackend::add_bias(Tensor& x, const Tensor& bias) {
  check_f32(x, "add_bias input");
  check_dev(bias, "add_bias bias");
  const FloatType bt = float_type(bias.dtype, "add_bias bias");
  MOECEL_CHECK(bias.ndim() == 1, "add_bias: bias must be a vector, got {}", shape_str(bias.shape));
  const int64_t d = bias.numel();
  MOECEL_CHECK(d > 0 && x.numel() % d == 0, "add_bias: input {} is not rows of the bias width {}", shape_str(x.shape),
               d);
  cuda::launch_add_bias(impl_->ctx, x.ptr<float>(), x.numel() / d, d, bias.data, bt);
}

void CudaBackend::add_sigmoid_gated(const Tensor& a, const Tensor& gate, const Tensor& b, Tensor& out) {
  check_f32(a, "add_sigmoid_gated input");
  check_f32(gate, "add_sigmoid_gated gate");
  check_f32(b, "add_sigmoid_gated input");
  check_f32(out, "add_sigmoid_gated output");
  const int64_t n = gate.numel();
  MOECEL_CHECK(n > 0 && a.numel() == b.numel() && a.numel() == out.numel() && a.numel() % n == 0,
               "add_sigmoid_gated: shapes {}, {} and {} with gate {} (one gate per row) do not match",
               shape_str(a.shape), shape_str(b.shape), shape_str(out.shape), shape_str(gate.shape));
  check_no_overlap(gate, out, "add_sigmoid_gated");  // a and b may alias out (elementwise)
  cuda::launch_add_sigmoid_gated(impl_->ctx, a.ptr<float>(), gate.ptr<float>(), b.ptr<float>(), n, a.numel() / n,
                                 out.ptr<float>());
}

void CudaBackend::router_grouped_topk(const Tensor& logits, const Tensor& correction_bias, int n_group, int topk_group,
                                      int k, bool renormalize, float scale, Tensor& indices, Tensor& weights) {
  check_f32(logits, "router logits");
  check_dev(correction_bias, "router correction bias");
  check_dev(indices, "router indices");
  check_f32(weights, "router weights");
  const FloatType bt = float_type(correction_bias.dtype, "router correction bias");
  MOECEL_CHECK(logits.ndim() == 2, "router: logits must be (n_tokens, n_experts), got {}", shape_str(logits.shape));
  MOECEL_CHECK(indices.dtype == DType::kI32, "router: indices must be I32, got {}", dtype_name(indices.dtype));
  const int64_t n = logits.dim(0), n_experts = logits.dim(1);
  MOECEL_CHECK(correction_bias.numel() == n_experts, "router: correction bias must have {} values, got {}", n_experts,
               shape_str(correction_bias.shape));
  MOECEL_CHECK(n_experts <= cuda::kMaxGroupedExperts && n_group >= 1 && n_group <= cuda::kMaxGroups,
               "router: the CUDA backend's grouped router takes <= {} experts in <= {} groups, got {} in {}",
               cuda::kMaxGroupedExperts, cuda::kMaxGroups, n_experts, n_group);
  MOECEL_CHECK(n_experts % n_group == 0, "router: {} experts do not split into {} groups", n_experts, n_group);
  MOECEL_CHECK(topk_group >= 1, "router: topk_group must be at least 1, got {}", topk_group);
  const int64_t kept = std::min(topk_group, n_group) * (n_experts / n_group);
  MOECEL_CHECK(k >= 1 && k <= kept && k <= cuda::kMaxGroupedTopK,
               "router: top-k {} must be in [1, {}] (kept experts; the CUDA backend takes at most {})", k, kept,
               cuda::kMaxGroupedTopK);
  check_rows(indices, n, k, "router indices");
  check_rows(weights, n, k, "router weights");
  cuda::launch_router_grouped_topk(impl_->ctx, logits.ptr<float>(), correction_bias.data, bt, n, int(n_experts),
                                   n_group, topk_group, k, renormalize, scale, indices.ptr<int32_t>(),
                                   weights.ptr<float>());
}

}  // namespace moecel
#endif  // MOECEL_HAVE_CUDA
