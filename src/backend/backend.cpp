// Backend selection and the helpers shared by all backends.
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
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
  if (name == "cuda") fail("--backend cuda: this build has no CUDA backend yet; use --backend cpu");
  fail("unknown backend '{}': expected 'cpu' or 'cuda'", name);
}

}  // namespace moecel
