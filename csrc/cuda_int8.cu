// LLM.int8() activation quantization and dequantization kernels (kernelbench._cuda).
//
// Compiled for sm_80 and sm_90a; unverified on a GPU (the backends' verified devices say where
// it has run).
//
// Math (kernelbench/quant.py, which the GPU tests compare against):
//   outlier columns  j with max_i |x_ij| > alpha (or >= alpha), plus the weight's kept rows
//   row absmax       a_i = max over non-outlier j of |x_ij|   (stored as the absmax itself)
//   int8             q_ij = clamp(rint(x_ij * (127 / a_i)), -127, 127), 0 for outlier columns,
//                    0 for the whole row when a_i == 0; rint is round-half-to-even. When
//                    127 / a_i could overflow float32 (a_i < 2^-64; it does below about
//                    3.7e-37), x and a_i are both scaled by 2^64 first (exact), so the row
//                    quantizes as with an unbounded exponent range, never to +-127 everywhere.
//   dequantize       y_ij = acc_ij * (a_i * (b_j * 1/127^2)) + bias_j + outlier_ij, in fp32
//                    with the same operation order as quant.dequantize (no FMA contraction).
//                    A row whose absmax is outside [2^-32, 2^32] (every row, when some column's
//                    is) takes the scale product in fp64, rounded once to fp32, as
//                    quant.dequantize_outer does: in fp32 it could underflow or overflow.
//
// Stages:
//   detect_outliers  per-column max |x| (atomicMax on the float bits, values are >= 0), the
//                    threshold mask, the kept rows OR-ed in, and a one-block stream compaction
//                    into sorted column indices; the count is the one host sync of the path.
//   quantize_rows    one block per row: absmax without outlier columns, round, pack int8 with
//                    outlier columns zeroed, gather the outlier columns' 16-bit values (m, c).
//   dequantize       one fused elementwise pass, 16-byte accesses when everything is aligned.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include <pybind11/pybind11.h>

#include "kb_cuda.cuh"

namespace py = pybind11;

namespace kb {
namespace {

constexpr int kThreads = 256;
constexpr int kCompactThreads = 1024;

__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// 127 / absmax overflows float32 below about 3.7e-37: rows with an absmax below 2^-64 are
// scaled by 2^64 (exact; results as with an unbounded exponent range). kernelbench.quant and
// the Triton quantize kernel use the same two constants.
constexpr float kTinyAbsmax = 0x1p-64f;
constexpr float kTinyScale = 0x1p64f;

__device__ __forceinline__ int8_t quant1(float v, float inv) {
  int q = __float2int_rn(__fmul_rn(v, inv));  // round half to even
  q = min(127, max(-127, q));
  return static_cast<int8_t>(q);
}

// Max over the block; every thread gets the result.
__device__ float block_max(float v) {
  __shared__ float partial[32];
  __shared__ float result;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? partial[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) result = v;
  }
  __syncthreads();
  return result;
}

// --- outlier detection ------------------------------------------------------------------------

template <typename T>
__global__ void colmax_kernel(const T* __restrict__ x, int64_t m, int64_t k,
                              int64_t rows_per_block, float* __restrict__ colmax) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_block;
  const int64_t r1 = min(m, r0 + rows_per_block);
  float mx = 0.f;
  for (int64_t r = r0; r < r1; ++r) mx = fmaxf(mx, fabsf(to_f(x[r * k + j])));
  // Non-negative floats order like their bit patterns as signed ints.
  atomicMax(reinterpret_cast<int*>(colmax + j), __float_as_int(mx));
}

// Grid-stride loops: the grid is capped (blocks_for), any k or r is covered.
__global__ void threshold_kernel(const float* __restrict__ colmax, int64_t k, float alpha, int ge,
                                 uint8_t* __restrict__ mask) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k;
       j += stride) {
    const float v = colmax[j];
    mask[j] = static_cast<uint8_t>(ge ? (v >= alpha) : (v > alpha));
  }
}

__global__ void mark_kept_kernel(const int64_t* __restrict__ kept, int64_t r, int64_t k,
                                 uint8_t* __restrict__ mask) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < r;
       i += stride) {
    const int64_t j = kept[i];
    if (j >= 0 && j < k) mask[j] = 1;
  }
}

// One block: sorted indices of the set mask entries, and their count.
__global__ void compact_kernel(const uint8_t* __restrict__ mask, int64_t k,
                               int64_t* __restrict__ cols, int32_t* __restrict__ count) {
  __shared__ int warp_sums[32];
  __shared__ int64_t base_s;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  if (threadIdx.x == 0) base_s = 0;
  __syncthreads();
  for (int64_t start = 0; start < k; start += blockDim.x) {
    const int64_t j = start + threadIdx.x;
    const int flag = (j < k && mask[j]) ? 1 : 0;
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    const int within = __popc(ballot & ((1u << lane) - 1u));
    if (lane == 0) warp_sums[warp] = __popc(ballot);
    __syncthreads();
    int warp_off = 0;
    int total = 0;
    for (int w = 0; w < nwarps; ++w) {
      const int s = warp_sums[w];
      if (w < warp) warp_off += s;
      total += s;
    }
    const int64_t base = base_s;
    if (flag) cols[base + warp_off + within] = j;
    __syncthreads();
    if (threadIdx.x == 0) base_s = base + total;
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = static_cast<int32_t>(base_s);
}

// --- fused row quantization -------------------------------------------------------------------

// Elements 8v .. 8v+7 of a row in one 16-byte load, and their mask bytes in one 8-byte load
// (all 0 without a mask).
template <typename T>
struct Eight {
  uint4 raw;
  uint2 mask_raw;
  __device__ __forceinline__ Eight(const T* row, const uint8_t* mask, int64_t v)
      : raw(reinterpret_cast<const uint4*>(row)[v]),
        mask_raw(mask ? reinterpret_cast<const uint2*>(mask)[v] : make_uint2(0u, 0u)) {}
  __device__ __forceinline__ float value(int i) const {
    return to_f(reinterpret_cast<const T*>(&raw)[i]);
  }
  __device__ __forceinline__ bool masked(int i) const {
    return reinterpret_cast<const uint8_t*>(&mask_raw)[i] != 0;
  }
};

// VEC: k % 8 == 0, x and q 16-byte aligned, mask (if any) 8-byte aligned.
template <typename T, bool VEC>
__global__ void quantize_rows_kernel(const T* __restrict__ x, int64_t k,
                                     const uint8_t* __restrict__ mask,
                                     const int64_t* __restrict__ cols, int64_t c,
                                     int8_t* __restrict__ q, float* __restrict__ absmax,
                                     T* __restrict__ outvals) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * k;
  int8_t* qr = q + row * k;
  float mx = 0.f;
  if (VEC) {
    const int64_t nv = k / 8;
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
      const Eight<T> in(xr, mask, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (!in.masked(i)) mx = fmaxf(mx, fabsf(in.value(i)));
      }
    }
  } else {
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      if (!(mask && mask[j])) mx = fmaxf(mx, fabsf(to_f(xr[j])));
    }
  }
  mx = block_max(mx);
  if (threadIdx.x == 0) absmax[row] = mx;
  // A tiny absmax: scale x and the absmax by 2^64 (exact) so that 127 / absmax stays finite.
  const float pre = mx < kTinyAbsmax ? kTinyScale : 1.0f;
  const float inv = mx > 0.f ? __fdiv_rn(127.0f, __fmul_rn(mx, pre)) : 0.f;
  if (VEC) {
    const int64_t nv = k / 8;
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
      const Eight<T> in(xr, mask, v);
      uint2 packed;
      int8_t* pb = reinterpret_cast<int8_t*>(&packed);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        pb[i] = in.masked(i) ? int8_t(0) : quant1(__fmul_rn(in.value(i), pre), inv);
      }
      reinterpret_cast<uint2*>(qr)[v] = packed;
    }
  } else {
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      qr[j] = (mask && mask[j]) ? int8_t(0) : quant1(__fmul_rn(to_f(xr[j]), pre), inv);
    }
  }
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) outvals[row * c + i] = xr[cols[i]];
}

// --- fused dequantization ---------------------------------------------------------------------

// Absmax scales (or 0) whose fp32 scale product cannot underflow or overflow
// (kernelbench.quant.SCALE_SAFE).
constexpr float kScaleSafeLo = 0x1p-32f;
constexpr float kScaleSafeHi = 0x1p32f;

__device__ __forceinline__ bool scale_safe(float a) {
  return a == 0.f || (a >= kScaleSafeLo && a <= kScaleSafeHi);
}

// acc * (row * (col * 1/127^2)), then + bias, then + outlier: quant.dequantize's order; `wide`
// rows take the scale product in fp64.
__device__ __forceinline__ float deq_scaled(int32_t a, float r, float cj, bool wide) {
  if (wide) {
    constexpr double kDeq64 = 1.0 / (127.0 * 127.0);
    const double scale = __dmul_rn(static_cast<double>(r), __dmul_rn(cj, kDeq64));
    return __double2float_rn(__dmul_rn(static_cast<double>(a), scale));
  }
  constexpr float kDeq = static_cast<float>(1.0 / (127.0 * 127.0));
  return __fmul_rn(__int2float_rn(a), __fmul_rn(r, __fmul_rn(cj, kDeq)));
}

__device__ __forceinline__ float deq1(int32_t a, float r, float cj, bool wide, const float* bias,
                                      const float* outl, int64_t j, int64_t idx) {
  float y = deq_scaled(a, r, cj, wide);
  if (bias) y = __fadd_rn(y, bias[j]);
  if (outl) y = __fadd_rn(y, outl[idx]);
  return y;
}

template <typename T>
__global__ void dequant_scalar_kernel(const int32_t* __restrict__ acc, int64_t m, int64_t n,
                                      const float* __restrict__ row, const float* __restrict__ col,
                                      const float* __restrict__ bias,
                                      const float* __restrict__ outl, int cols_safe,
                                      T* __restrict__ out) {
  const int64_t total = m * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t i = idx / n;
    const int64_t j = idx - i * n;
    const bool wide = !cols_safe || !scale_safe(row[i]);
    out[idx] = from_f<T>(deq1(acc[idx], row[i], col[j], wide, bias, outl, j, idx));
  }
}

// n % 8 == 0; acc, col, bias, outl, out 16-byte aligned: 8 outputs per thread per step.
template <typename T>
__global__ void dequant_vec_kernel(const int32_t* __restrict__ acc, int64_t m, int64_t n,
                                   const float* __restrict__ row, const float* __restrict__ col,
                                   const float* __restrict__ bias, const float* __restrict__ outl,
                                   int cols_safe, T* __restrict__ out) {
  const int64_t total8 = m * n / 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < total8;
       v += stride) {
    const int64_t base = v * 8;
    const int64_t i = base / n;
    const int64_t j = base - i * n;
    int32_t a[8];
    float cj[8], bj[8], oj[8];
    reinterpret_cast<int4*>(a)[0] = reinterpret_cast<const int4*>(acc + base)[0];
    reinterpret_cast<int4*>(a)[1] = reinterpret_cast<const int4*>(acc + base)[1];
    reinterpret_cast<float4*>(cj)[0] = reinterpret_cast<const float4*>(col + j)[0];
    reinterpret_cast<float4*>(cj)[1] = reinterpret_cast<const float4*>(col + j)[1];
    if (bias) {
      reinterpret_cast<float4*>(bj)[0] = reinterpret_cast<const float4*>(bias + j)[0];
      reinterpret_cast<float4*>(bj)[1] = reinterpret_cast<const float4*>(bias + j)[1];
    }
    if (outl) {
      reinterpret_cast<float4*>(oj)[0] = reinterpret_cast<const float4*>(outl + base)[0];
      reinterpret_cast<float4*>(oj)[1] = reinterpret_cast<const float4*>(outl + base)[1];
    }
    const float r = row[i];
    const bool wide = !cols_safe || !scale_safe(r);  // the 8 outputs share row i (n % 8 == 0)
    uint4 packed;
    T* pb = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float y = deq_scaled(a[e], r, cj[e], wide);
      if (bias) y = __fadd_rn(y, bj[e]);
      if (outl) y = __fadd_rn(y, oj[e]);
      pb[e] = from_f<T>(y);
    }
    reinterpret_cast<uint4*>(out + base)[0] = packed;
  }
}

// --- host side --------------------------------------------------------------------------------

bool aligned(std::uintptr_t p, std::uintptr_t a) { return p % a == 0; }

unsigned blocks_for(int64_t work, int threads) {
  const int64_t b = (work + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(b, int64_t(1) << 20)));
}

void require(bool cond, const char* msg) {
  if (!cond) throw std::invalid_argument(msg);
}

template <typename T>
void launch_colmax(std::uintptr_t x, int64_t m, int64_t k, float* colmax, cudaStream_t s) {
  const int64_t rows_per_block = std::max<int64_t>(64, (m + 65534) / 65535);
  const dim3 grid(static_cast<unsigned>((k + kThreads - 1) / kThreads),
                  static_cast<unsigned>((m + rows_per_block - 1) / rows_per_block));
  colmax_kernel<T><<<grid, kThreads, 0, s>>>(as_ptr<const T>(x), m, k, rows_per_block, colmax);
  launch_check("colmax_kernel");
}

int64_t detect_outliers(std::uintptr_t x, int64_t m, int64_t k, int dtype, double alpha, bool ge,
                        std::uintptr_t kept, int64_t r, std::uintptr_t colmax,
                        std::uintptr_t mask, std::uintptr_t cols, std::uintptr_t count,
                        std::uintptr_t stream) {
  require(m >= 0 && k > 0 && r >= 0, "detect_outliers: bad sizes");
  require(k <= INT32_MAX, "detect_outliers: k must fit in int32");
  require(colmax && mask && cols && count, "detect_outliers: null output pointer");
  require(m == 0 || x, "detect_outliers: null x");
  require(r == 0 || kept, "detect_outliers: null kept-rows pointer");
  const cudaStream_t s = as_stream(stream);
  float* cm = as_ptr<float>(colmax);
  cuda_check(cudaMemsetAsync(cm, 0, sizeof(float) * k, s), "cudaMemsetAsync(colmax)");
  if (m > 0) {
    if (dtype == kFloat16) {
      launch_colmax<__half>(x, m, k, cm, s);
    } else if (dtype == kBFloat16) {
      launch_colmax<__nv_bfloat16>(x, m, k, cm, s);
    } else {
      throw std::invalid_argument("detect_outliers: x must be float16 or bfloat16");
    }
  }
  uint8_t* mk = as_ptr<uint8_t>(mask);
  threshold_kernel<<<blocks_for(k, kThreads), kThreads, 0, s>>>(cm, k, static_cast<float>(alpha),
                                                                 ge ? 1 : 0, mk);
  launch_check("threshold_kernel");
  if (r > 0) {
    mark_kept_kernel<<<blocks_for(r, kThreads), kThreads, 0, s>>>(as_ptr<const int64_t>(kept), r,
                                                                   k, mk);
    launch_check("mark_kept_kernel");
  }
  compact_kernel<<<1, kCompactThreads, 0, s>>>(mk, k, as_ptr<int64_t>(cols),
                                               as_ptr<int32_t>(count));
  launch_check("compact_kernel");
  int32_t host_count = 0;
  cuda_check(cudaMemcpyAsync(&host_count, as_ptr<int32_t>(count), sizeof(int32_t),
                             cudaMemcpyDeviceToHost, s),
             "cudaMemcpyAsync(outlier count)");
  cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize(outlier count)");
  return host_count;
}

template <typename T>
void launch_quantize(std::uintptr_t x, int64_t m, int64_t k, std::uintptr_t mask,
                     std::uintptr_t cols, int64_t c, std::uintptr_t q, std::uintptr_t absmax,
                     std::uintptr_t outvals, cudaStream_t s) {
  const bool vec = k % 8 == 0 && aligned(x, 16) && aligned(q, 16) && aligned(mask, 8);
  const auto* xp = as_ptr<const T>(x);
  const auto* mp = as_ptr<const uint8_t>(mask);
  const auto* cp = as_ptr<const int64_t>(cols);
  if (vec) {
    quantize_rows_kernel<T, true><<<static_cast<unsigned>(m), kThreads, 0, s>>>(
        xp, k, mp, cp, c, as_ptr<int8_t>(q), as_ptr<float>(absmax), as_ptr<T>(outvals));
  } else {
    quantize_rows_kernel<T, false><<<static_cast<unsigned>(m), kThreads, 0, s>>>(
        xp, k, mp, cp, c, as_ptr<int8_t>(q), as_ptr<float>(absmax), as_ptr<T>(outvals));
  }
  launch_check("quantize_rows_kernel");
}

void quantize_rows(std::uintptr_t x, int64_t m, int64_t k, int dtype, std::uintptr_t mask,
                   std::uintptr_t cols, int64_t c, std::uintptr_t q, std::uintptr_t absmax,
                   std::uintptr_t outvals, std::uintptr_t stream) {
  require(m >= 0 && k > 0 && c >= 0 && c <= k, "quantize_rows: bad sizes");
  require(m <= INT32_MAX, "quantize_rows: m must fit in int32 (one block per row)");
  if (m == 0) return;  // nothing to write: the (empty) outputs may be null pointers
  require(c == 0 || (cols && outvals && mask), "quantize_rows: outlier columns need mask, "
                                               "cols and outvals pointers");
  require(x && q && absmax, "quantize_rows: null pointer");
  const cudaStream_t s = as_stream(stream);
  if (dtype == kFloat16) {
    launch_quantize<__half>(x, m, k, mask, cols, c, q, absmax, outvals, s);
  } else if (dtype == kBFloat16) {
    launch_quantize<__nv_bfloat16>(x, m, k, mask, cols, c, q, absmax, outvals, s);
  } else {
    throw std::invalid_argument("quantize_rows: x must be float16 or bfloat16");
  }
}

template <typename T>
void launch_dequant(const int32_t* acc, int64_t m, int64_t n, const float* row, const float* col,
                    const float* bias, const float* outl, int cols_safe, T* out, bool vec,
                    cudaStream_t s) {
  if (vec) {
    dequant_vec_kernel<T><<<blocks_for(m * n / 8, kThreads), kThreads, 0, s>>>(
        acc, m, n, row, col, bias, outl, cols_safe, out);
  } else {
    dequant_scalar_kernel<T><<<blocks_for(m * n, kThreads), kThreads, 0, s>>>(
        acc, m, n, row, col, bias, outl, cols_safe, out);
  }
  launch_check("dequantize kernel");
}

void dequantize(std::uintptr_t acc, int64_t m, int64_t n, std::uintptr_t row, std::uintptr_t col,
                std::uintptr_t bias, std::uintptr_t outl, std::uintptr_t out, int out_dtype,
                bool cols_safe, std::uintptr_t stream) {
  require(m >= 0 && n > 0, "dequantize: bad sizes");
  if (m == 0) return;
  require(acc && row && col && out, "dequantize: null pointer");
  const bool vec = n % 8 == 0 && aligned(acc, 16) && aligned(col, 16) && aligned(bias, 16) &&
                   aligned(outl, 16) && aligned(out, 16);
  const cudaStream_t s = as_stream(stream);
  const auto* a = as_ptr<const int32_t>(acc);
  const auto* r = as_ptr<const float>(row);
  const auto* c = as_ptr<const float>(col);
  const auto* b = as_ptr<const float>(bias);
  const auto* o = as_ptr<const float>(outl);
  if (out_dtype == kFloat16) {
    launch_dequant<__half>(a, m, n, r, c, b, o, cols_safe, as_ptr<__half>(out), vec, s);
  } else if (out_dtype == kBFloat16) {
    launch_dequant<__nv_bfloat16>(a, m, n, r, c, b, o, cols_safe, as_ptr<__nv_bfloat16>(out), vec,
                                  s);
  } else {
    throw std::invalid_argument("dequantize: output must be float16 or bfloat16");
  }
}

py::dict runtime_info() {
  int runtime = 0;
  int driver = 0;
  cuda_check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  cuda_check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  py::dict d;
  d["cuda_runtime"] = runtime;
  d["cuda_driver"] = driver;
  return d;
}

}  // namespace
}  // namespace kb

PYBIND11_MODULE(_cuda, m) {
  m.doc() =
      "kernelbench CUDA kernels (LLM.int8() quantize/dequantize, cuBLASLt int8 GEMM). "
      "Unverified on a GPU until a backend lists a verified CUDA device. Raw device pointers as ints.";
  m.attr("FLOAT16") = static_cast<int>(kb::kFloat16);
  m.attr("BFLOAT16") = static_cast<int>(kb::kBFloat16);
  m.attr("FLOAT32") = static_cast<int>(kb::kFloat32);
  m.def("detect_outliers", &kb::detect_outliers, py::arg("x"), py::arg("m"), py::arg("k"),
        py::arg("dtype"), py::arg("alpha"), py::arg("ge"), py::arg("kept"), py::arg("r"),
        py::arg("colmax"), py::arg("mask"), py::arg("cols"), py::arg("count"), py::arg("stream"),
        "Outlier columns of x (m, k): writes colmax (k f32), mask (k u8), cols (k i64, first "
        "`count` used, sorted), count (i32); returns the count (one stream sync).");
  m.def("quantize_rows", &kb::quantize_rows, py::arg("x"), py::arg("m"), py::arg("k"),
        py::arg("dtype"), py::arg("mask"), py::arg("cols"), py::arg("c"), py::arg("q"),
        py::arg("absmax"), py::arg("outvals"), py::arg("stream"),
        "Row absmax without masked columns, int8 (masked columns 0), gather of the c columns.");
  m.def("dequantize", &kb::dequantize, py::arg("acc"), py::arg("m"), py::arg("n"), py::arg("row"),
        py::arg("col"), py::arg("bias"), py::arg("outlier"), py::arg("out"), py::arg("out_dtype"),
        py::arg("cols_safe"), py::arg("stream"),
        "out = acc * row * col / 127^2 (+ bias f32 (n)) (+ outlier f32 (m, n)); 0 = absent. "
        "cols_safe: every col in [2^-32, 2^32] or 0 (else every row takes an fp64 scale).");
  m.def("runtime_info", &kb::runtime_info, "CUDA runtime and driver versions.");
  kb::register_cublaslt(m);
}
