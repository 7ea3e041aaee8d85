// Error reporting of the CUDA backend (CUDA runtime failures and broken launch preconditions become
// moecel::Error with the failing expression and its file:line) and the MOECEL_CUDA_SKIP measurement knob.
// (src/backend/**/*.cpp is globbed into moecel_lib even without CUDA, hence the guard.)
#if defined(MOECEL_HAVE_CUDA)
#include "backend/cuda/cuda_common.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace moecel::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  fail("CUDA error at {}:{}: {} ({}: {})", file, line, expr, cudaGetErrorName(err), cudaGetErrorString(err));
}

void throw_precondition(const char* cond, const std::string& what, const char* file, int line) {
  fail("CUDA backend: {} (launch precondition `{}` failed at {}:{})", what, cond, file, line);
}

bool skip_launch(const char* spec, const void* kernel, dim3 grid) {
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kernel) != cudaSuccess || !name) return false;
  if (std::strcmp(spec, "list") == 0) {  // MOECEL_CUDA_SKIP=list: name every launch, skip none
    std::fprintf(stderr, "launch %s grid %u x %u\n", name, grid.x, grid.y);
    return false;
  }
  for (const char* p = spec; *p;) {
    const char* end = std::strchr(p, ',');
    const std::string entry(p, end ? size_t(end - p) : std::strlen(p));
    const size_t colon = entry.find(':');
    const std::string part = entry.substr(0, colon);
    const bool grid_ok = colon == std::string::npos || std::strtoul(entry.c_str() + colon + 1, nullptr, 10) == grid.x;
    if (!part.empty() && std::strstr(name, part.c_str()) && grid_ok) return true;
    if (!end) break;
    p = end + 1;
  }
  return false;
}

}  // namespace moecel::cuda
#endif  // MOECEL_HAVE_CUDA
