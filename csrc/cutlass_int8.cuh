// CUTLASS int8 GEMM with a fused LLM.int8() dequantize epilogue (kernelbench._cutlass).
//
// Compiled for sm_80 / sm_90a against the CUTLASS 4.2 headers; unverified on a GPU (the
// backends' verified devices say where it has run).
//
// out (m, n) fp16/bf16 = float(a (m, k) int8 @ b (n, k)^T int8, int32 accumulation)
//                        * row_scale[i] * col_scale[j] + bias[j] + outlier[i, j]
// where row_scale = the activation row absmax (m floats), col_scale = the weight column absmax
// already multiplied by 1/127^2 (n floats), bias (n floats, optional) and outlier (m x n floats,
// row-major, optional) are fp32. The int32 product never leaves the registers.
//
// Layout: a row-major (m, k), b row-major (n, k) (nn.Linear layout, i.e. column-major k x n),
// out row-major (m, n). Rules (checked again in kernelbench/cutlass_ext.py): k % 16 == 0,
// n % 16 == 0, every pointer 16-byte aligned, m, n, k < 2^31.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "kb_dtype.h"

namespace kb {
namespace cutlass_int8 {

// Output element type codes: kb::DType (kb_dtype.h), the codes of every kernelbench extension.
constexpr int kOutFloat16 = dtype_code(DType::F16);
constexpr int kOutBFloat16 = dtype_code(DType::BF16);

// Tile configurations. kAuto picks by m (see select_tile in cutlass_int8.cu).
enum Tile : int { kAuto = -1, kSmallM = 0, kLarge = 1 };

struct Problem {
  const int8_t* a = nullptr;
  const int8_t* b = nullptr;
  const float* row_scale = nullptr;  // (m)
  const float* col_scale = nullptr;  // (n), absmax / 127^2
  const float* bias = nullptr;       // (n) or null
  const float* outlier = nullptr;    // (m, n) or null
  void* out = nullptr;               // (m, n) fp16 / bf16
  int m = 0;
  int n = 0;
  int k = 0;
  cudaStream_t stream = nullptr;
};

// Each returns normally or throws std::runtime_error / std::invalid_argument with the reason.
// The sm80 entry point runs on compute capability 8.x only, the sm90 one on 9.0 only (their
// kernels are compiled as empty bodies for the other architecture).
void run_sm80(const Problem& p, int out_dtype, int tile);
void run_sm90(const Problem& p, int out_dtype, int tile);

// Human-readable list of the compiled instances, for cutlass_info().
const char* sm80_instances();
const char* sm90_instances();

// Every pointer, size and the stream equal: a kernel initialized for one can be launched again for
// the other as it is (same parameters, sm90 TMA descriptors included).
inline bool same_problem(const Problem& x, const Problem& y) {
  return x.a == y.a && x.b == y.b && x.row_scale == y.row_scale && x.col_scale == y.col_scale &&
         x.bias == y.bias && x.outlier == y.outlier && x.out == y.out && x.m == y.m &&
         x.n == y.n && x.k == y.k && x.stream == y.stream;
}

// The last initialized kernel of one instance on one host thread, with its workspace: a call with
// the same problem only launches it (no parameter or TMA descriptor rebuild, no
// cudaFuncSetAttribute), which keeps that host work out of the timed region of repeated calls.
template <class Gemm>
struct InitializedGemm {
  Gemm gemm;
  Problem problem;
  bool valid = false;
  void* workspace = nullptr;
  cudaStream_t workspace_stream = nullptr;
};

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " +
                             cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

// The one dispatch of every architecture's instances: checks the tile and the output type code
// and runs Launch<Half or BFloat16, whether an outlier product is added>::run(p, tile). The
// element types come from the caller (they are CUTLASS types; this header does not need CUTLASS).
template <template <class, bool> class Launch, class ElementD>
void run_outlier_variant(const Problem& p, int tile) {
  if (p.outlier) {
    Launch<ElementD, true>::run(p, tile);
  } else {
    Launch<ElementD, false>::run(p, tile);
  }
}

template <template <class, bool> class Launch, class Half, class BFloat16>
void run_dispatched(const char* arch, const Problem& p, int out_dtype, int tile) {
  if (tile != kSmallM && tile != kLarge) {
    throw std::invalid_argument(std::string(arch) + ": unknown tile");
  }
  if (out_dtype == kOutFloat16) {
    run_outlier_variant<Launch, Half>(p, tile);
  } else if (out_dtype == kOutBFloat16) {
    run_outlier_variant<Launch, BFloat16>(p, tile);
  } else {
    throw std::invalid_argument(std::string(arch) + ": out dtype must be float16 or bfloat16");
  }
}

}  // namespace cutlass_int8
}  // namespace kb
