// Host side of pdl_wait()'s probe (measurement builds only: cmake -DMOECEL_CUDA_PROBE=ON): one buffer of records
// every .cu file's kernels append to, written to MOECEL_CUDA_PROBE_OUT when the backend closes.
#if defined(MOECEL_HAVE_CUDA) && defined(MOECEL_CUDA_PROBE)
#include <cstdio>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {
namespace {
std::vector<cudaError_t (*)(ProbeBuffer*)>& setters() {
  static std::vector<cudaError_t (*)(ProbeBuffer*)> v;
  return v;
}
}  // namespace

void probe_register(cudaError_t (*set)(ProbeBuffer*)) {
  setters().push_back(set);
}

ProbeBuffer* probe_start(unsigned cap) {
  ProbeBuffer* p = nullptr;
  const size_t bytes = sizeof(ProbeBuffer) + size_t(cap) * sizeof(ProbeRecord);
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), bytes));
  CUDA_CHECK(cudaMemset(p, 0, bytes));
  CUDA_CHECK(cudaMemcpy(&p->cap, &cap, sizeof cap, cudaMemcpyHostToDevice));
  for (auto set : setters()) CUDA_CHECK(set(p));
  return p;
}

void probe_dump(ProbeBuffer* p, const char* path) {
  unsigned head[2] = {0, 0};
  if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(head, p, sizeof head, cudaMemcpyDeviceToHost)) return;
  const unsigned n = head[0] < head[1] ? head[0] : head[1];
  std::vector<ProbeRecord> rec(n);
  if (n && cudaMemcpy(rec.data(), p->rec, n * sizeof(ProbeRecord), cudaMemcpyDeviceToHost) != cudaSuccess) return;
  if (FILE* f = std::fopen(path, "wb")) {
    std::fwrite(rec.data(), sizeof(ProbeRecord), n, f);
    std::fclose(f);
  }
  std::fprintf(stderr, "probe: %u of %u records written to %s\n", n, head[0], path);
}
}  // namespace moecel::cuda
#endif
