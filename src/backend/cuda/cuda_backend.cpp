// CudaBackend: device setup, memory and transfers, decode graphs, and the host side of the plain ops (the decode
// fusions, fused MoE, argmax and family ops are in cuda_backend_decode.cpp): validation with
// messages naming what was expected (mirroring the CPU backend's checks), then one launcher call from the
// op family's .cuh. Kernels run on one non-blocking stream; only to_host / from_host / argmax / synchronize
// wait for it, and those also report bad input that kernels flagged (see cuda_common.cuh, DeviceError).
// (src/backend/**/*.cpp is globbed into moecel_lib even without CUDA, hence the guard.)
#if defined(MOECEL_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/misc.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/norm_rope.cuh"

namespace moecel {

using cuda::FloatType;
using namespace cuda_host;

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

namespace {

// Instantiated decode steps (one or more per replay). The blocks recorded ops wrote stay reserved (`blocks`), and so
// do ids / next.
class CudaDecodeGraph final : public DecodeGraph {
 public:
  // steps: the advancing argmaxes recorded (0: none; the graph then writes `next` only).
  CudaDecodeGraph(CudaBackend::Impl* impl, cudaGraphExec_t exec, std::vector<std::shared_ptr<void>> blocks, Tensor ids,
                  Tensor next, int steps)
      : impl_(impl),
        exec_(exec),
        blocks_(std::move(blocks)),
        ids_(std::move(ids)),
        next_(std::move(next)),
        advances_(steps > 0),
        steps_(std::max(steps, 1)) {
    for (cudaEvent_t& e : done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~CudaDecodeGraph() override {
    cudaStreamSynchronize(impl_->ctx.stream);  // errors ignored: this may run while the process exits
    for (cudaEvent_t e : done_) cudaEventDestroy(e);
    cudaGraphExecDestroy(exec_);
    cudaGetLastError();
  }

  // The slot's pinned words are read (pos, id) and written (next) by the copies when they run, so a slot is reused
  // only after wait(slot).
  void launch(int32_t id, bool chain, int64_t pos, int slot) override {
    MOECEL_CHECK(pos >= 0 && (slot == 0 || slot == 1), "decode graph: bad position {} or slot {}", pos, slot);
    const cudaStream_t s = impl_->ctx.stream;
    StepIo& io = impl_->io_host[slot];
    io.pos = pos;
    io.id = id;
    // Each copy between two replays costs the chain microseconds: the position is copied only where the graph
    // before did not leave it there (its argmax advances it), and a chained id not at all where the graph reads
    // its input from the word its argmax writes (ids and next one tensor).
    if (pos != impl_->step_pos_next) {
      CUDA_CHECK(cudaMemcpyAsync(impl_->step_pos_dev, &io.pos, sizeof(int64_t), cudaMemcpyHostToDevice, s));
    }
    impl_->step_pos_next = advances_ ? pos + steps_ : pos;
    if (!chain) {
      CUDA_CHECK(cudaMemcpyAsync(ids_.data, &io.id, sizeof(int32_t), cudaMemcpyHostToDevice, s));
    } else if (ids_.data != next_.data) {
      CUDA_CHECK(cudaMemcpyAsync(ids_.data, next_.data, sizeof(int32_t), cudaMemcpyDeviceToDevice, s));
    }
    CUDA_CHECK(cudaGraphLaunch(exec_, s));
    if (!advances_) CUDA_CHECK(cudaMemcpyAsync(&io.next, next_.data, sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaEventRecord(done_[slot], s));
  }

  int32_t wait(int slot) override {
    MOECEL_CHECK(slot == 0 || slot == 1, "decode graph: bad slot {}", slot);
    CUDA_CHECK(cudaEventSynchronize(done_[slot]));
    impl_->check_flag();  // bad input flagged by the kernels so far
    return output(slot, steps_ - 1);
  }

  int steps() const override { return steps_; }

  int32_t output(int slot, int i) override {
    MOECEL_CHECK((slot == 0 || slot == 1) && i >= 0 && i < steps_, "decode graph: bad slot {} or step {}", slot, i);
    const StepIo& io = impl_->io_host[slot];
    // An advancing graph's argmaxes wrote their ids to the host words of their positions mod cuda::kNextWords (two
    // replays of up to two steps in flight cover four consecutive positions).
    return advances_ ? __atomic_load_n(&impl_->next_host[(io.pos + i) % cuda::kNextWords], __ATOMIC_ACQUIRE) : io.next;
  }

 private:
  CudaBackend::Impl* impl_;
  cudaGraphExec_t exec_;
  std::vector<std::shared_ptr<void>> blocks_;
  Tensor ids_, next_;
  cudaEvent_t done_[2] = {};
  bool advances_;  // a replay leaves step_pos_dev steps_ past its position
  int steps_;
};

cuda::GluAct glu_act(Activation act) {
  switch (act) {
    case Activation::kGeLU: return cuda::GluAct::kGeLU;
    case Activation::kReLU2: return cuda::GluAct::kReLU2;
    case Activation::kSiLU: break;
  }
  return cuda::GluAct::kSiLU;
}

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
  impl_->ctx.smem_per_sm = int(prop.sharedMemPerMultiprocessor);
  impl_->ctx.smem_reserved = int(prop.reservedSharedMemPerBlock);
  CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->ctx.stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&impl_->flag_host), cuda::kDeviceErrorWords * sizeof(unsigned),
                           cudaHostAllocMapped));
  for (int i = 0; i < cuda::kDeviceErrorWords; ++i) impl_->flag_host[i] = 0;
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl_->ctx.error_flag), impl_->flag_host, 0));
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&impl_->io_host), 2 * sizeof(StepIo), cudaHostAllocDefault));
  impl_->io_host[0] = impl_->io_host[1] = StepIo{};
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&impl_->next_host), cuda::kNextWords * sizeof(int32_t),
                           cudaHostAllocMapped));
  std::fill_n(impl_->next_host, cuda::kNextWords, 0);
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl_->next_mapped), impl_->next_host, 0));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&impl_->step_pos_dev), sizeof(int64_t)));
  CUDA_CHECK(cudaMemset(impl_->step_pos_dev, 0, sizeof(int64_t)));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&impl_->counter_dev), sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(impl_->counter_dev, 0, sizeof(unsigned)));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&impl_->route_dev), kRouteWords * sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(impl_->route_dev, 0, kRouteWords * sizeof(unsigned long long)));
#if defined(MOECEL_CUDA_PROBE)
  if (std::getenv("MOECEL_CUDA_PROBE_OUT")) impl_->probe = cuda::probe_start(1u << 23);
#endif
  impl_->ctx.block_counter = impl_->counter_dev;
  // Programmatic dependent launch (cuda_common.cuh): on unless MOECEL_CUDA_PDL=0 (for measuring its gain).
  impl_->ctx.pdl = knob_from_env("MOECEL_CUDA_PDL", 1, {0, 1}) == 1;
  impl_->ctx.gemv_rows = knob_from_env("MOECEL_CUDA_GEMV_ROWS", 0, {0, 1, 2, 4});
  impl_->ctx.gemv_bulk = knob_from_env("MOECEL_CUDA_GEMV_BULK", 2, {0, 2, 4});
  // q/k/v on int8 tensor cores, one 16-row tile per block (docs/benchmarks.md, thirty-fourth tree: two tiles slower).
  impl_->ctx.gemv_imma = knob_from_env("MOECEL_CUDA_GEMV_IMMA", 1, {0, 1, 2});
  impl_->ctx.gemv_residual_imma = knob_from_env("MOECEL_CUDA_GEMV_RESIDUAL_IMMA", 1, {0, 1});
  // Rows per warp of the gather path's bulk kernels (docs/benchmarks.md, eleventh and twelfth trees: down 4; gate +
  // up 4, OLMoE the same as 2 since the down product's copies go out before its wait, Qwen3-30B-A3B +1.6%).
  impl_->ctx.gemv_bulk_gather = knob_from_env("MOECEL_CUDA_GEMV_BULK_GATHER", 4, {0, 2, 4});
  impl_->ctx.gemv_bulk_glu = knob_from_env("MOECEL_CUDA_GEMV_BULK_GLU", 4, {0, 2, 4});
  // The gather products' copies in two stages, the second issued as the first lands; kernel A's up rows issued as its
  // gate rows land; the router reduction for its exact shape; two ring stages in the lm_head (docs/benchmarks.md,
  // thirteenth tree).
  impl_->ctx.gemv_stages = knob_from_env("MOECEL_CUDA_GEMV_STAGES", 2, {1, 2, 4, 8});
  impl_->ctx.gemv_down_stages = knob_from_env("MOECEL_CUDA_GEMV_STAGES_DOWN", 2, {1, 2, 4, 8});
  impl_->ctx.gemv_depth = knob_from_env("MOECEL_CUDA_GEMV_DEPTH", 1, {1, 2, 3, 4, 6, 8});
  // Earlier starts, bulk router inputs and cache rows into L2 (docs/benchmarks.md, twelfth tree).
  impl_->ctx.pdl_early = knob_from_env("MOECEL_CUDA_PDL_EARLY", 6, {0, 1, 2, 3, 4, 5, 6, 7});
  impl_->ctx.router_bulk = knob_from_env("MOECEL_CUDA_ROUTER_BULK", 1, {0, 1}) == 1;
  impl_->ctx.router_exact = knob_from_env("MOECEL_CUDA_ROUTER_EXACT", 1, {0, 1}) == 1;
  impl_->ctx.mma_stages = knob_from_env("MOECEL_CUDA_MMA_STAGES", 2, {2, 3, 4});
  impl_->ctx.kv_prefetch_rows = knob_from_env("MOECEL_CUDA_KV_PREFETCH", 1024, {0, 256, 1024, 4096});
  impl_->ctx.extra_launches = knob_from_env("MOECEL_CUDA_EXTRA_LAUNCHES", 0, {0, 1, 2, 4});
  impl_->ctx.skip = std::getenv("MOECEL_CUDA_SKIP");  // "list" prints every launch (name, grid) instead
  // Tensor-core matrix-vector kernels (gemv_mma.cuh): by default only for the vocabulary projection; 1 for every
  // eligible weight (slower so far, docs/benchmarks.md), 0 never.
  impl_->ctx.decode_mma = knob_from_env("MOECEL_CUDA_DECODE_MMA", 2, {0, 1, 2});
  impl_->ctx.gemv_stream = knob_from_env("MOECEL_CUDA_GEMV_STREAM", 2, {0, 2, 3, 4, 5});
  impl_->ctx.gemv_stream_mma = knob_from_env("MOECEL_CUDA_GEMV_STREAM_MMA", 1, {0, 1, 2});
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
  im.graph_steps = 0;
  im.step_pos_next = -1;  // recording ran nothing, but be safe: the next replay copies the position
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
  return std::make_unique<CudaDecodeGraph>(impl_.get(), exec, std::move(blocks), ids, next, im.graph_steps);
}

CudaBackend::~CudaBackend() = default;

size_t CudaBackend::pool_live_bytes() const {
  return impl_->pool->live_bytes();
}
size_t CudaBackend::pool_cached_bytes() const {
  return impl_->pool->cached_bytes();
}

uint64_t CudaBackend::device_free_bytes() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return uint64_t(free_b);
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
  const std::shared_ptr<void> scratch = impl_->scratch(cuda::linear_scratch_bytes(v, n));  // see gather_linear
  cuda::launch_linear(impl_->ctx, v, x.ptr<float>(), n, y.ptr<float>(), scratch.get());
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
  // Directly after the gather glu kernel of the same indices (it triggers only after its wait, and the indices'
  // writer is the kernel before it): the products may read them, and issue their weight copies, before their wait.
  const bool after_glu = (impl_->ctx.pdl_early & 4) != 0 && impl_->glu_launch == impl_->ctx.launches &&
                         impl_->glu_indices == indices.ptr<int32_t>();
  // The scratch block goes back to the pool on return while the kernels may still be queued: safe, because any
  // later user of the block is queued behind them on the same stream.
  cuda::launch_gather_linear(impl_->ctx, v, x.ptr<float>(), per_slot, indices.ptr<int32_t>(), n, k, y.ptr<float>(),
                             scratch.get(), after_glu);
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
  cuda::launch_glu(impl_->ctx, glu_act(act), gate.ptr<float>(), up.ptr<float>(), gate.numel(), out.ptr<float>());
}

void CudaBackend::gather_glu(const LinearWeight& gate, const LinearWeight& up, Activation act, const Tensor& x,
                             const Tensor& indices, Tensor& out) {
  check_f32(x, "gather_glu input");
  check_f32(out, "gather_glu output");
  check_dev(indices, "gather_glu indices");
  MOECEL_CHECK(indices.dtype == DType::kI32 && indices.ndim() == 2, "gather_glu: indices must be I32 (n_tokens, k)");
  const cuda::WeightView g = weight_view(gate, "gather_glu"), u = weight_view(up, "gather_glu");
  MOECEL_CHECK(gate.n_stack > 0 && up.n_stack > 0, "gather_glu: weights {} and {} need an experts axis", gate.name,
               up.name);
  const int64_t n = indices.dim(0), k = indices.dim(1);
  if (up.in == gate.in && up.out == gate.out) {
    check_rows(x, n, gate.in, gate.name.c_str());
    check_rows(out, n * k, gate.out, gate.name.c_str());
    check_no_overlap(x, out, "gather_glu");
    if (n <= cuda::kGemvMaxTokens) {  // decode: gate, up and the activation in one launch, else gate and up in one
      if (cuda::launch_gather_glu_gemv(impl_->ctx, g, u, glu_act(act), x.ptr<float>(), indices.ptr<int32_t>(), n, k,
                                       out.ptr<float>())) {
        impl_->glu_launch = impl_->ctx.launches;  // the down product may follow (gather_linear)
        impl_->glu_indices = indices.ptr<int32_t>();
        return;
      }
      Tensor u_out = scratch(DType::kF32, out.shape);
      const cuda::WeightView ws[] = {g, u};
      float* ys[] = {out.ptr<float>(), u_out.ptr<float>()};
      if (cuda::launch_gather_gemv_parts(impl_->ctx, ws, ys, x.ptr<float>(), indices.ptr<int32_t>(), n, k)) {
        cuda::launch_glu(impl_->ctx, glu_act(act), out.ptr<float>(), u_out.ptr<float>(), out.numel(), out.ptr<float>());
        return;
      }
    }
    const std::shared_ptr<void> scratch = impl_->scratch(cuda::gather_scratch_bytes(g, n, k));  // see gather_linear
    if (cuda::launch_gather_glu(impl_->ctx, g, u, glu_act(act), x.ptr<float>(), indices.ptr<int32_t>(), n, k,
                                out.ptr<float>(), scratch.get())) {
      return;
    }
  }
  Backend::gather_glu(gate, up, act, x, indices, out);  // the ops one by one (they check the rest)
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

namespace {

// The checks of qk_norm_rope_store's fused kernels (rot_dims > 0); returns the number of tokens.
int64_t check_qk_norm_rope(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                           const Tensor& k_norm, int n_heads, int n_kv_heads, int head_dim, int rot_dims,
                           const Tensor& k_cache, const Tensor& v_cache, int64_t pos0) {
  check_f32(q, "qk_norm_rope_store q");
  check_f32(k, "qk_norm_rope_store k");
  check_f32(v, "qk_norm_rope_store v");
  check_f32(k_cache, "qk_norm_rope_store k_cache");
  check_f32(v_cache, "qk_norm_rope_store v_cache");
  check_dev(q_norm, "qk_norm_rope_store q_norm");
  check_dev(k_norm, "qk_norm_rope_store k_norm");
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
  MOECEL_CHECK(rot_dims / 2 <= cuda::kMaxRopeHalf, "rope: rotary dims {} above the CUDA backend's limit {}", rot_dims,
               2 * cuda::kMaxRopeHalf);
  MOECEL_CHECK(n <= 65535, "qk_norm_rope_store: at most 65535 tokens per call, got {}", n);
  check_no_overlap(q, k, "qk_norm_rope_store");
  return n;
}

cuda::RopeFreqs rope_freqs(int rot_dims, float theta) {
  cuda::RopeFreqs f{};
  for (int i = 0; i < rot_dims / 2; ++i) f.inv_freq[i] = float(std::pow(double(theta), -2.0 * i / rot_dims));
  return f;
}

}  // namespace

void CudaBackend::qk_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                                     float eps, int n_heads, int n_kv_heads, int head_dim, int rot_dims, float theta,
                                     Tensor& k_cache, Tensor& v_cache, int64_t pos0) {
  const int64_t q_width = int64_t(n_heads) * head_dim, kv_width = int64_t(n_kv_heads) * head_dim;
  // Nothing to rotate, or wider rows than the fused kernel holds: the ops one by one.
  if (rot_dims == 0 || q_width > 4096 || kv_width > 4096) {
    Backend::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, n_heads, n_kv_heads, head_dim, rot_dims, theta, k_cache,
                                v_cache, pos0);
    return;
  }
  const int64_t n =
      check_qk_norm_rope(q, k, v, q_norm, k_norm, n_heads, n_kv_heads, head_dim, rot_dims, k_cache, v_cache, pos0);
  const FloatType qt = float_type(q_norm.dtype, "q_norm weight"), kt = float_type(k_norm.dtype, "k_norm weight");
  const cuda::RopeFreqs f = rope_freqs(rot_dims, theta);
  cuda::launch_qk_norm_rope_store(impl_->ctx, q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), q_norm.data, qt,
                                  k_norm.data, kt, eps, n, n_heads, n_kv_heads, head_dim, rot_dims / 2, f, pos0,
                                  k_cache.dim(0), k_cache.ptr<float>(), v_cache.ptr<float>());
}

void CudaBackend::qk_norm_rope_attention(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_norm,
                                         const Tensor& k_norm, float eps, int n_heads, int n_kv_heads, int head_dim,
                                         int rot_dims, float theta, Tensor& k_cache, Tensor& v_cache, int64_t pos0,
                                         float scale, int window, Tensor& out) {
  const int64_t q_width = int64_t(n_heads) * head_dim;
  // One decode token with rotary: one launch (attention.cu); else the two ops.
  if (!(impl_->fusions & 16) || rot_dims == 0 || head_dim <= 0 || q.numel() != q_width) {
    Backend::qk_norm_rope_attention(q, k, v, q_norm, k_norm, eps, n_heads, n_kv_heads, head_dim, rot_dims, theta,
                                    k_cache, v_cache, pos0, scale, window, out);
    return;
  }
  check_qk_norm_rope(q, k, v, q_norm, k_norm, n_heads, n_kv_heads, head_dim, rot_dims, k_cache, v_cache, pos0);
  check_f32(out, "attention output");
  check_rows(out, 1, q_width, "attention output");
  MOECEL_CHECK(window >= 0, "attention: negative window {}", window);
  check_no_overlap(out, k_cache, "qk_norm_rope_attention");
  check_no_overlap(out, v_cache, "qk_norm_rope_attention");
  const cuda::RopeFreqs f = rope_freqs(rot_dims, theta);
  cuda::QkNormRopeAttention a{};
  a.q = q.ptr<float>();
  a.k = k.ptr<float>();
  a.v = v.ptr<float>();
  a.q_norm = q_norm.data;
  a.k_norm = k_norm.data;
  a.q_wtype = float_type(q_norm.dtype, "q_norm weight");
  a.k_wtype = float_type(k_norm.dtype, "k_norm weight");
  a.eps = eps;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim;
  a.half = rot_dims / 2;
  a.freqs = &f;
  a.pos0 = pos0;
  a.capacity = k_cache.dim(0);
  a.k_cache = k_cache.ptr<float>();
  a.v_cache = v_cache.ptr<float>();
  a.scale = scale;
  a.window = window;
  a.out = out.ptr<float>();
  if (!cuda::launch_qk_norm_rope_attention(impl_->ctx, a)) {
    Backend::qk_norm_rope_attention(q, k, v, q_norm, k_norm, eps, n_heads, n_kv_heads, head_dim, rot_dims, theta,
                                    k_cache, v_cache, pos0, scale, window, out);
  }
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

namespace {

// moe_weighted_sum, and moe_weighted_sum_add when add is set (then out is the residual, updated in place).
void weighted_sum(const cuda::Ctx& ctx, const Tensor& y, const Tensor& weights, Tensor& out, bool add) {
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
  cuda::launch_moe_weighted_sum(ctx, y.ptr<float>(), weights.ptr<float>(), n, k, h, add, out.ptr<float>());
}

}  // namespace

void CudaBackend::moe_weighted_sum(const Tensor& y, const Tensor& weights, Tensor& out) {
  weighted_sum(impl_->ctx, y, weights, out, false);
}

void CudaBackend::moe_weighted_sum_add(const Tensor& y, const Tensor& weights, Tensor& residual) {
  weighted_sum(impl_->ctx, y, weights, residual, true);
}

}  // namespace moecel
#endif  // MOECEL_HAVE_CUDA
