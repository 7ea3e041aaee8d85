// Error reporting of the CUDA backend: CUDA runtime failures and broken launch preconditions become
// moecel::Error with the failing expression and its file:line.
// (src/backend/**/*.cpp is globbed into moecel_lib even without CUDA, hence the guard.)
#if defined(MOECEL_HAVE_CUDA)
#include "backend/cuda/cuda_common.cuh"

#include "core/error.h"

namespace moecel::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  fail("CUDA error at {}:{}: {} ({}: {})", file, line, expr, cudaGetErrorName(err), cudaGetErrorString(err));
}

void throw_precondition(const char* cond, const std::string& what, const char* file, int line) {
  fail("CUDA backend: {} (launch precondition `{}` failed at {}:{})", what, cond, file, line);
}

}  // namespace moecel::cuda
#endif  // MOECEL_HAVE_CUDA
