// Shared declarations of the CPU int8 kernels (scalar reference in cpu_int8.cpp, AVX2 in
// cpu_int8_avx2.cpp, the AVX512-VNNI GEMM in cpu_int8_avx512.cpp). Pointers are raw; the Python
// wrapper (kernelbench/cpu_ext.py) validates shapes, dtypes, contiguity and devices first.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kb {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

// Packed weight layout shared by every GEMM path: panels of 16 output columns; inside a panel,
// for each pair of k (kk = 0..ceil(k/2)-1), 16 columns x 2 int8 (the two k values of the pair).
// Zero padding past n and k, so it keeps one byte per weight. Size in bytes:
inline size_t packed_b_bytes(int64_t n, int64_t k) {
  const int64_t panels = (n + 15) / 16, pairs = (k + 1) / 2;
  return static_cast<size_t>(panels * pairs * 16 * 2);
}

struct DequantArgs {
  const float* row_absmax;   // (m,)
  const float* col_absmax;   // (n,)
  const float* bias;         // (n,) or null
  const float* outlier_x;    // (m, c) fp32 or null: x at the outlier columns
  const float* outlier_w;    // (c, n) fp32 or null: the weights of those dims, transposed
  int64_t c;                 // number of outlier columns
};

// Scalar reference kernels (any x86/ARM CPU).
namespace scalar {
bool detect_outliers(const void* x, DType dt, int64_t m, int64_t k, float alpha, bool ge,
                     uint8_t* mask);
bool quantize_rows(const void* x, DType dt, int64_t m, int64_t k, const uint8_t* mask,
                   const int64_t* cols, int64_t c, int8_t* q, float* absmax, void* outlier_vals);
void gemm_s8s8s32(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                  int32_t* c);
void dequantize(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                DType out_dt);
}  // namespace scalar

// AVX2 + FMA + F16C kernels; call only when the CPU reports those features.
namespace avx2 {
bool detect_outliers(const void* x, DType dt, int64_t m, int64_t k, float alpha, bool ge,
                     uint8_t* mask);
bool quantize_rows(const void* x, DType dt, int64_t m, int64_t k, const uint8_t* mask,
                   const int64_t* cols, int64_t c, int8_t* q, float* absmax, void* outlier_vals);
void gemm_s8s8s32(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                  int32_t* c);
void dequantize(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                DType out_dt);
}  // namespace avx2

// AVX512-VNNI GEMM (AVX512F + BW + VNNI); the other kernels of that set are the AVX2 ones.
namespace avx512vnni {
void gemm_s8s8s32(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                  int32_t* c);
}  // namespace avx512vnni

void pack_b(const int8_t* b, int64_t n, int64_t k, int8_t* packed);

}  // namespace kb
