// Shared declarations of the kernelbench CUDA extension (kernelbench._cuda).
//
// GPU-side code compiled for sm_80 / sm_90a; its verification status is data (the backends'
// verified devices). Functions take raw device pointers as integers (from
// torch.Tensor.data_ptr()), sizes, and a cudaStream_t as an integer, so the module needs no
// torch headers. Errors become C++ exceptions, which pybind11 turns into Python RuntimeError.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "kb_dtype.h"

namespace kb {

// Element type codes (kb_dtype.h), as ints: the extension functions take the code.
constexpr int kFloat32 = dtype_code(DType::F32);
constexpr int kFloat16 = dtype_code(DType::F16);
constexpr int kBFloat16 = dtype_code(DType::BF16);

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) +
                             ": " + cudaGetErrorString(err));
  }
}

// After a kernel launch: launch-configuration errors and sticky errors from earlier work.
inline void launch_check(const char* what) { cuda_check(cudaGetLastError(), what); }

inline cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

template <typename T>
inline T* as_ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

}  // namespace kb

#include <pybind11/pybind11.h>

namespace kb {
// Defined in cublaslt_int8.cu; called from the module definition in cuda_int8.cu.
void register_cublaslt(pybind11::module_& m);
}  // namespace kb
