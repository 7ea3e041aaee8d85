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
  cap /= kProbeSms;  // per SM
  const size_t bytes = sizeof(ProbeBuffer) + size_t(cap) * kProbeSms * sizeof(ProbeRecord);
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), bytes));
  CUDA_CHECK(cudaMemset(p, 0, bytes));
  CUDA_CHECK(cudaMemcpy(&p->cap, &cap, sizeof cap, cudaMemcpyHostToDevice));
  for (auto set : setters()) CUDA_CHECK(set(p));
  return p;
}

void probe_dump(ProbeBuffer* p, const char* path) {
  unsigned count[kProbeSms], cap = 0;
  if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(count, p->count, sizeof count, cudaMemcpyDeviceToHost) ||
      cudaMemcpy(&cap, &p->cap, sizeof cap, cudaMemcpyDeviceToHost)) {
    return;
  }
  std::vector<ProbeRecord> rec, sm(cap);
  unsigned claimed = 0;
  for (int s = 0; s < kProbeSms; ++s) {
    const unsigned n = count[s] < cap ? count[s] : cap;
    claimed += count[s];
    if (n && cudaMemcpy(sm.data(), p->rec + size_t(s) * cap, n * sizeof(ProbeRecord), cudaMemcpyDeviceToHost)) return;
    rec.insert(rec.end(), sm.begin(), sm.begin() + n);
  }
  if (FILE* f = std::fopen(path, "wb")) {
    std::fwrite(rec.data(), sizeof(ProbeRecord), rec.size(), f);
    std::fclose(f);
  }
  std::fprintf(stderr, "probe: %zu of %u records written to %s\n", rec.size(), claimed, path);
}
}  // namespace moecel::cuda
#endif
