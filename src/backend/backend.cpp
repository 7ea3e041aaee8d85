// Backend selection and the helpers shared by all backends.
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#ifdef MOECEL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "core/error.h"

namespace moecel {

LinearWeight Backend::to_device(const LinearWeight& w) {
  LinearWeight d = w;
  d.weight = to_device(w.weight);
  if (w.quantized()) {
    d.scales = to_device(w.scales);
    d.biases = to_device(w.biases);
  }
  return d;
}

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
#ifdef MOECEL_HAVE_CUDA
  if (name == "cuda") return std::make_unique<CudaBackend>();  // throws when no CUDA device is found
#else
  if (name == "cuda")
    fail("--backend cuda: this build has no CUDA backend (nvcc was not found at configure time); use --backend cpu");
#endif
  fail("unknown backend '{}': expected 'cpu' or 'cuda'", name);
}

}  // namespace moecel
