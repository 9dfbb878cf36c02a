// Shared declarations of the CPU int8 kernels (scalar reference in cpu_int8.cpp, AVX2 in
// cpu_int8_avx2.cpp, the AVX512-VNNI GEMM in cpu_int8_avx512.cpp). Pointers are raw; the Python
// wrapper (kernelbench/cpu_ext.py) validates shapes, dtypes, contiguity and devices first.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kb_dtype.h"

namespace kb {

// The packed weight layout read by every GEMM path (and by kernelbench.cpu_ext through
// packed_bytes / gather_packed_columns): panels of 16 output columns; inside a panel, for each
// pair of k values (kk = 0..pairs-1), 16 columns x 2 int8 (the two k values of the pair). Zero
// padding past n and k, so it keeps one byte per weight. After the panels, one int32 per
// (padded) column: 128 x the column's sum over k, the correction of the VNNI GEMM (computed
// once by pack_b instead of on every call).
struct PackedLayout {
  static constexpr int64_t kPanelCols = 16;
  static constexpr int64_t kPairBytes = kPanelCols * 2;  // one k pair of one panel
  int64_t n, k, panels, pairs;

  PackedLayout(int64_t n_, int64_t k_)
      : n(n_), k(k_), panels((n_ + kPanelCols - 1) / kPanelCols), pairs((k_ + 1) / 2) {}
  int64_t panel_bytes() const { return pairs * kPairBytes; }
  int64_t sums_offset() const { return panels * panel_bytes(); }
  size_t bytes() const {
    return static_cast<size_t>(sums_offset() + panels * kPanelCols * sizeof(int32_t));
  }
  // Byte offset of weight (col, kidx), i.e. w[col][kidx] of the (n, k) row-major original.
  int64_t offset(int64_t col, int64_t kidx) const {
    return (col / kPanelCols) * panel_bytes() + (kidx / 2) * kPairBytes +
           (col % kPanelCols) * 2 + kidx % 2;
  }
};

// Absmax scales in [2^-32, 2^32] (or 0) take the float32 dequantization, acc * (row * (col /
// 127^2)), whose intermediates then neither underflow nor overflow; a row with another scale,
// or every row when some column has one, takes the float64-scale path (dequantize_row_wide).
constexpr float kScaleSafeLo = 0x1p-32f, kScaleSafeHi = 0x1p32f;
inline bool scale_is_safe(float a) {
  return a == 0.f || (a >= kScaleSafeLo && a <= kScaleSafeHi);
}

// Row absmax below 2^-64 is quantized as (x * 2^64) * (127 / (absmax * 2^64)): 127 / absmax
// would overflow float32 below ~3.7e-37, and the power-of-two rescale is exact.
constexpr float kTinyAbsmax = 0x1p-64f, kTinyRescale = 0x1p64f;
inline float quant_prescale(float amax) { return amax < kTinyAbsmax ? kTinyRescale : 1.f; }
inline float quant_scale(float amax) {
  return amax > 0.f ? 127.f / (amax * quant_prescale(amax)) : 0.f;
}

// Up to this many rows of A (a decode step or a small batch) the GEMMs of the AVX2 and VNNI sets
// take their decode path: each thread streams its panels of the weights once, whole, with
// software prefetch, every row of A multiplying a panel while it is in cache; above it, the
// blocked (prefill) path. Both give the same exact int32 sums. set_stream_rows changes it (0:
// always the blocked path), for tests that compare the two paths and for measuring the crossover.
constexpr int64_t kDefaultStreamRows = 32;
int64_t stream_rows();
void set_stream_rows(int64_t rows);

// Where the VNNI set's decode path prefetches the weight stream, a tuning per processor (paired
// in one process, cold weights, two threads). kL2: into L2 (Zen 4, where it beat L1 by 5-14% at
// m = 1-8). kL1: into L1, and one-row tiles none at all, left to the hardware prefetcher (Zen 5,
// where against kL2 this took 0.85-0.88x the time at m = 1, 0.82-0.97x at m = 2-12, 0.95-0.99x at
// m = 16-32, d = 1536-12288: tests/bench/ab_decode.py --other-prefetch l2). The default is
// chosen from the processor (default_decode_prefetch); set_decode_prefetch changes it, for tests
// (the sums do not depend on it) and for measuring.
enum class DecodePrefetch { kL2 = 0, kL1 = 1 };
DecodePrefetch default_decode_prefetch();
DecodePrefetch decode_prefetch();
void set_decode_prefetch(DecodePrefetch hint);

// An int32 product (no epilogue) of at least this many bytes is stored past the caches
// (non-temporal stores, VNNI set): it cannot stay cached beside the operands anyway, and ordinary
// stores read each line of it first. Smaller ones stay cached for whatever reads them next.
// Default: half the last-level cache (sysfs; 16 MiB when unknown). set_streaming_store_bytes
// changes it (0: every eligible product streamed), for tests that compare the two stores.
int64_t streaming_store_bytes();
void set_streaming_store_bytes(int64_t bytes);

// Passes over fewer elements than this (a decode step's activations) run on the calling thread:
// an OpenMP team costs a fork and a barrier, and on a busy machine a barrier waits for a
// descheduled thread.
constexpr int64_t kSerialElems = int64_t{1} << 16;

// The blocked GEMMs take A's rows in groups whose A (rows x k bytes) is kAGroupBytes, a multiple
// of the micro-kernel's mr rows (at least mr): the group's A stays in the cache while all of a
// thread's panel chunks pass, so A is read from memory once, not once per chunk. With all m rows
// instead, at 2048 x 16384 x 4096 and 2048 x 49152 x 12288 the VNNI path took 1.13-1.21x
// oneDNN's time, 0.99-1.06x with 4 MiB groups on a 2-core Zen 5 (2 MiB: the same within the
// noise; 8 MiB: 1.03-1.15x). On a 2-vCPU Zen 4 VM, 2 MiB groups took 0.975-0.996x the time of
// 4 MiB ones, or of one group of all m rows within one k block, at 2048 tokens and d =
// 2048-12288 (paired, one process; the AVX2 set 0.945-0.968x).
constexpr int64_t kAGroupBytes = int64_t{2} << 20;
inline int64_t row_group_rows(int64_t m, int64_t k, int64_t mr,
                              int64_t group_bytes = kAGroupBytes) {
  const int64_t rows = group_bytes / k / mr * mr;
  return rows > mr ? rows : mr;
}

struct DequantArgs {
  const float* row_absmax;   // (m,)
  const float* col_absmax;   // (n,)
  const float* bias;         // (n,) or null
  const float* outlier_x;    // (m, c) fp32 or null: x at the outlier columns
  const float* outlier_w;    // (c, n) fp32 or null: the weights of those dims, transposed
  int64_t c;                 // number of outlier columns
};

// The dequantization of a GEMM's output, prepared once per call: the GEMM applies it to each
// finished tile of int32 sums while they are in cache (the full int32 product never reaches
// memory), writing out (m, n) in out_dt.
struct Epilogue {
  DequantArgs d;
  int64_t n;
  void* out;
  DType out_dt;
  const float* col_scale;  // (n,): col_absmax * (1 / 127^2), float32
  bool cols_safe;          // every col_absmax passes scale_is_safe
};

// The epilogue of a plain dequantization call; col_scale is its storage (n floats).
inline Epilogue make_epilogue(const DequantArgs& d, int64_t n, void* out, DType out_dt,
                              std::vector<float>& col_scale) {
  constexpr float kInv = 1.0f / (127.0f * 127.0f);
  col_scale.resize(static_cast<size_t>(n));
  bool safe = true;
  for (int64_t j = 0; j < n; ++j) {
    col_scale[j] = d.col_absmax[j] * kInv;
    safe = safe && scale_is_safe(d.col_absmax[j]);
  }
  return Epilogue{d, n, out, out_dt, col_scale.data(), safe};
}

// Columns [j0, j1) of row r on the exact (float64-scale) path, as floats; acc_row points at the
// int32 sum of column j0. Shared by every kernel set so that they agree bit for bit.
void dequantize_row_wide(const int32_t* acc_row, int64_t r, int64_t j0, int64_t j1,
                         const DequantArgs& d, int64_t n, float* out);

// One kernel set: the functions the Python bindings call, chosen once (kernel_set()).
struct KernelSet {
  const char* name;
  bool (*detect_outliers)(const void* x, DType dt, int64_t m, int64_t k, float alpha, bool ge,
                          uint8_t* mask);
  bool (*quantize_rows)(const void* x, DType dt, int64_t m, int64_t k, const uint8_t* mask,
                        const int64_t* cols, int64_t c, int8_t* q, float* absmax,
                        void* outlier_vals);
  // c (m, n) int32 when ep is null; else c is unused and ep's output is written.
  void (*gemm_s8s8s32)(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                       int32_t* c, const Epilogue* ep);
  void (*dequantize)(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                     DType out_dt);
};

// The functions of one kernel set (declared once for each namespace below). dequantize_block
// writes rows [r0, r0 + rows) x columns [j0, j1) of e's output from acc (row r0, column j0
// first; ld int32 apart): the tile epilogue of the GEMMs.
#define KB_KERNEL_SET_FUNCTIONS                                                                  \
  bool detect_outliers(const void* x, DType dt, int64_t m, int64_t k, float alpha, bool ge,     \
                       uint8_t* mask);                                                          \
  bool quantize_rows(const void* x, DType dt, int64_t m, int64_t k, const uint8_t* mask,       \
                     const int64_t* cols, int64_t c, int8_t* q, float* absmax,                  \
                     void* outlier_vals);                                                       \
  void gemm_s8s8s32(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,  \
                    int32_t* c, const Epilogue* ep);                                            \
  void dequantize(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,   \
                  DType out_dt);                                                                \
  void dequantize_block(const Epilogue& e, const int32_t* acc, int64_t ld, int64_t r0,         \
                        int64_t rows, int64_t j0, int64_t j1);

// Scalar reference kernels (any x86/ARM CPU).
namespace scalar {
KB_KERNEL_SET_FUNCTIONS
}  // namespace scalar

// AVX2 + FMA + F16C kernels; call only when the CPU reports those features.
namespace avx2 {
KB_KERNEL_SET_FUNCTIONS
}  // namespace avx2

#undef KB_KERNEL_SET_FUNCTIONS

using DequantizeBlockFn = void (*)(const Epilogue& e, const int32_t* acc, int64_t ld, int64_t r0,
                                   int64_t rows, int64_t j0, int64_t j1);

// A plain dequantization call of any kernel set: its dequantize_block over all rows, in parallel.
void dequantize_rows(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                     DType out_dt, DequantizeBlockFn block);

// The last step of a GEMM tile: rows [r0, r0 + rows) x columns [j0, j1) of the finished int32
// sums in acc (ld apart) either go through the epilogue ep (dequantized by block) or, without
// one, are copied to the int32 product c (m, n). Both GEMM paths thus share one blocking.
inline void finish_tile(const Epilogue* ep, DequantizeBlockFn block, int32_t* c, int64_t n,
                        const int32_t* acc, int64_t ld, int64_t r0, int64_t rows, int64_t j0,
                        int64_t j1) {
  if (ep) {
    block(*ep, acc, ld, r0, rows, j0, j1);
    return;
  }
  const size_t row_bytes = static_cast<size_t>(j1 - j0) * sizeof(int32_t);
  for (int64_t i = 0; i < rows; ++i) std::memcpy(c + (r0 + i) * n + j0, acc + i * ld, row_bytes);
}

// AVX512-VNNI GEMM and dequantization (AVX512F + BW + VNNI); the set's other kernels are the
// AVX2 ones.
namespace avx512vnni {
void gemm_s8s8s32(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                  int32_t* c, const Epilogue* ep);
void dequantize(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                DType out_dt);
void dequantize_block(const Epilogue& e, const int32_t* acc, int64_t ld, int64_t r0,
                      int64_t rows, int64_t j0, int64_t j1);
}  // namespace avx512vnni

void pack_b(const int8_t* b, int64_t n, int64_t k, int8_t* packed);
// out (n, c) int8 = the original w[:, cols] read back from the packed layout.
void gather_packed_columns(const int8_t* packed, int64_t n, int64_t k, const int64_t* cols,
                           int64_t c, int8_t* out);

}  // namespace kb
