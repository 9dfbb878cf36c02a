// AVX2 + FMA + F16C versions of the CPU int8 kernels (compiled with -mavx2 -mfma -mf16c; only
// called after a run-time CPU check). See cpu_int8.h for the packed weight layout.
//
// The GEMM sign-extends the packed int8 weights to int16 as it loads them and multiplies int16
// pairs with vpmaddwd (exact for every int8 value, -128 included: no saturating vpmaddubsw),
// accumulating in int32. Blocking: each thread owns a
// range of 16-column panels; within it, chunks of kNC columns x kKC k-values of the packed
// weights stay in L2 while 6-row slices of A (converted to int16 once per chunk) sweep past
// (in groups of rows whose A stays in the cache); the
// first slice, which pulls the chunk from memory, prefetches it ahead (at 4096 x 16384 weights
// on one AVX2 core, as run on a Zen 5: 0.54, 0.80, 0.89, 0.95x the time at m = 8, 32, 64, 128).
// Up to stream_rows() rows (decode) the weights are streamed instead: each panel read once, whole, with
// software prefetch (gemm_small_m).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_int8.h"

namespace kb {
namespace avx2 {
namespace {

constexpr int kMR = 6;      // rows of A per micro-kernel call
constexpr int kKC = 512;    // k values per block (even)
constexpr int kNCp = 8;     // panels (of 16 columns) per L2 chunk
constexpr int64_t kPrefetchBytes = 4096;  // how far ahead the decode path prefetches weights

template <DType D>
inline __m256 load8(const void* base, int64_t i) {
  if constexpr (D == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else if constexpr (D == DType::F16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i)));
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType D>
inline float load1(const void* base, int64_t i) {
  if constexpr (D == DType::F32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (D == DType::F16) {
    return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
  } else {
    uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
}

// float -> bf16, round to nearest even (finite inputs; NaN is kept a NaN).
inline __m128i cvt_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  r = _mm256_srli_epi32(r, 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
  const __m256i packed = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0xD8));
}

template <DType D>
inline void store8(void* base, int64_t i, __m256 v) {
  if constexpr (D == DType::F32) {
    _mm256_storeu_ps(static_cast<float*>(base) + i, v);
  } else if constexpr (D == DType::F16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(base) + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(base) + i), cvt_bf16(v));
  }
}

template <DType D>
inline void store1(void* base, int64_t i, float v) {
  alignas(32) float tmp[8] = {v};
  alignas(16) uint16_t h[8];
  if constexpr (D == DType::F32) {
    static_cast<float*>(base)[i] = v;
  } else if constexpr (D == DType::F16) {
    _mm_store_si128(reinterpret_cast<__m128i*>(h),
                    _mm256_cvtps_ph(_mm256_load_ps(tmp), _MM_FROUND_TO_NEAREST_INT));
    static_cast<uint16_t*>(base)[i] = h[0];
  } else {
    _mm_store_si128(reinterpret_cast<__m128i*>(h), cvt_bf16(_mm256_load_ps(tmp)));
    static_cast<uint16_t*>(base)[i] = h[0];
  }
}

inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// NaN or Inf anywhere in v -> the returned mask has bits set (v*0 is NaN exactly then).
inline __m256 nonfinite8(__m256 v) {
  const __m256 z = _mm256_mul_ps(v, _mm256_setzero_ps());
  return _mm256_cmp_ps(z, z, _CMP_UNORD_Q);
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// ---- outlier detection -----------------------------------------------------------------------

template <DType D>
bool detect_impl(const void* x, int64_t m, int64_t k, float alpha, bool ge, uint8_t* mask) {
  const int nt = std::max(1, omp_get_max_threads());
  std::vector<float> colmax(static_cast<size_t>(nt) * k, 0.f);
  int bad_any = 0;
#pragma omp parallel num_threads(nt) reduction(| : bad_any) if (m * k > kSerialElems)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    float* cm = colmax.data() + static_cast<size_t>(t) * k;
    __m256 bad = _mm256_setzero_ps();
    const int64_t r0 = m * t / T, r1 = m * (t + 1) / T;
    for (int64_t r = r0; r < r1; ++r) {
      int64_t j = 0;
      for (; j + 8 <= k; j += 8) {
        const __m256 v = load8<D>(x, r * k + j);
        bad = _mm256_or_ps(bad, nonfinite8(v));
        _mm256_storeu_ps(cm + j, _mm256_max_ps(_mm256_loadu_ps(cm + j), abs8(v)));
      }
      for (; j < k; ++j) {
        const float v = load1<D>(x, r * k + j);
        if (!std::isfinite(v)) bad_any = 1;
        cm[j] = std::max(cm[j], std::fabs(v));
      }
    }
    if (_mm256_movemask_ps(bad)) bad_any = 1;
  }
  for (int64_t j = 0; j < k; ++j) {
    float mx = 0.f;
    for (int t = 0; t < nt; ++t) mx = std::max(mx, colmax[static_cast<size_t>(t) * k + j]);
    mask[j] = ge ? mx >= alpha : mx > alpha;
  }
  return bad_any == 0;
}

// ---- fused quantization ----------------------------------------------------------------------

// 32 floats (already scaled) -> 32 int8, rounding half to even (MXCSR default) and saturating.
inline void pack32(int8_t* dst, __m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256i ia = _mm256_cvtps_epi32(a), ib = _mm256_cvtps_epi32(b);
  const __m256i ic = _mm256_cvtps_epi32(c), id = _mm256_cvtps_epi32(d);
  const __m256i ab = _mm256_packs_epi32(ia, ib), cd = _mm256_packs_epi32(ic, id);
  __m256i q = _mm256_packs_epi16(ab, cd);
  q = _mm256_max_epi8(q, _mm256_set1_epi8(-127));
  q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), q);
}

template <DType D>
bool quantize_impl(const void* x, int64_t m, int64_t k, const uint8_t* mask, const int64_t* cols,
                   int64_t c, int8_t* q, float* absmax, void* outlier_vals) {
  // keep[j] = all-ones bits for regular columns, zero for outlier columns.
  std::vector<uint32_t> keep(k, 0xffffffffu);
  if (mask)
    for (int64_t j = 0; j < k; ++j) keep[j] = mask[j] ? 0u : 0xffffffffu;
  const float* keepf = reinterpret_cast<const float*>(keep.data());
  const size_t es = D == DType::F32 ? 4 : 2;
  int bad_any = 0;
#pragma omp parallel for schedule(static) reduction(| : bad_any) if (m * k > kSerialElems)
  for (int64_t r = 0; r < m; ++r) {
    const int64_t base = r * k;
    __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
      const __m256 v = load8<D>(x, base + j);
      bad = _mm256_or_ps(bad, nonfinite8(v));
      mx = _mm256_max_ps(mx, _mm256_and_ps(abs8(v), _mm256_loadu_ps(keepf + j)));
    }
    float amax = hmax8(mx);
    for (; j < k; ++j) {
      const float v = load1<D>(x, base + j);
      if (!std::isfinite(v)) bad_any = 1;
      if (keep[j]) amax = std::max(amax, std::fabs(v));
    }
    if (_mm256_movemask_ps(bad)) bad_any = 1;
    absmax[r] = amax;
    const float p = quant_prescale(amax), s = quant_scale(amax);
    const __m256 vp = _mm256_set1_ps(p), vs = _mm256_set1_ps(s);
    int8_t* qr = q + base;
    j = 0;
    for (; j + 32 <= k; j += 32) {
      __m256 v[4];
      for (int u = 0; u < 4; ++u)
        v[u] = _mm256_mul_ps(_mm256_mul_ps(_mm256_and_ps(load8<D>(x, base + j + 8 * u),
                                                         _mm256_loadu_ps(keepf + j + 8 * u)),
                                           vp),
                             vs);
      pack32(qr + j, v[0], v[1], v[2], v[3]);
    }
    for (; j < k; ++j) {
      const float v = keep[j] ? load1<D>(x, base + j) : 0.f;
      const float t = std::nearbyint((v * p) * s);
      qr[j] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, t)));
    }
    for (int64_t i = 0; i < c; ++i)
      std::memcpy(static_cast<char*>(outlier_vals) + (r * c + i) * es,
                  static_cast<const char*>(x) + (base + cols[i]) * es, es);
  }
  return bad_any == 0;
}

// ---- GEMM ------------------------------------------------------------------------------------

// Stores the R x 16 int32 tile (acc[r][h]: 8 int32 each), adding to C when accumulating.
template <int R>
inline void store_tile(const __m256i (&acc)[kMR][2], int32_t* c, int64_t ldc, int ncols,
                       bool accumulate) {
  for (int r = 0; r < R; ++r) {
    int32_t* cr = c + r * ldc;
    if (ncols == 16) {
      __m256i* c0 = reinterpret_cast<__m256i*>(cr);
      __m256i* c1 = reinterpret_cast<__m256i*>(cr + 8);
      __m256i v0 = acc[r][0], v1 = acc[r][1];
      if (accumulate) {
        v0 = _mm256_add_epi32(v0, _mm256_loadu_si256(c0));
        v1 = _mm256_add_epi32(v1, _mm256_loadu_si256(c1));
      }
      _mm256_storeu_si256(c0, v0);
      _mm256_storeu_si256(c1, v1);
    } else {
      alignas(32) int32_t tmp[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), acc[r][0]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp + 8), acc[r][1]);
      for (int j = 0; j < ncols; ++j) cr[j] = accumulate ? cr[j] + tmp[j] : tmp[j];
    }
  }
}

// R x 16 tile += A rows (int16 pairs, lda_pairs apart) x one packed panel, over kp pairs.
// The accumulators are named variables (not an array) so that GCC keeps all 12 in registers.
// Stream: the panel is read once, front to back, and the data kPrefetchBytes ahead is
// prefetched (the decode path, where the weights stream from memory and the hardware
// prefetcher stops at every 4 KiB page).
template <int R, bool Stream = false>
inline void micro_kernel(const int32_t* a, int64_t lda_pairs, const int8_t* bp, int64_t kp,
                         int32_t* c, int64_t ldc, int ncols, bool accumulate) {
  const __m256i z = _mm256_setzero_si256();
  __m256i a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z;
  __m256i a30 = z, a31 = z, a40 = z, a41 = z, a50 = z, a51 = z;
  const int32_t* a0 = a;
  const int32_t* a1 = a + lda_pairs;
  const int32_t* a2 = a + 2 * lda_pairs;
  const int32_t* a3 = a + 3 * lda_pairs;
  const int32_t* a4 = a + 4 * lda_pairs;
  const int32_t* a5 = a + 5 * lda_pairs;
#define KB_ROW(r, A0, A1)                                          \
  if constexpr (R > r) {                                           \
    const __m256i av = _mm256_set1_epi32(a##r[kk]);                \
    A0 = _mm256_add_epi32(A0, _mm256_madd_epi16(av, b0));          \
    A1 = _mm256_add_epi32(A1, _mm256_madd_epi16(av, b1));          \
  }
  for (int64_t kk = 0; kk < kp; ++kk) {
    if constexpr (Stream) _mm_prefetch(reinterpret_cast<const char*>(bp + kk * 32 + kPrefetchBytes),
                                       _MM_HINT_T0);
    const __m256i b0 =
        _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(bp + kk * 32)));
    const __m256i b1 =
        _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(bp + kk * 32 + 16)));
    KB_ROW(0, a00, a01)
    KB_ROW(1, a10, a11)
    KB_ROW(2, a20, a21)
    KB_ROW(3, a30, a31)
    KB_ROW(4, a40, a41)
    KB_ROW(5, a50, a51)
  }
#undef KB_ROW
  const __m256i acc[kMR][2] = {{a00, a01}, {a10, a11}, {a20, a21},
                               {a30, a31}, {a40, a41}, {a50, a51}};
  store_tile<R>(acc, c, ldc, ncols, accumulate);
}

using KernelFn = void (*)(const int32_t*, int64_t, const int8_t*, int64_t, int32_t*, int64_t,
                          int, bool);
constexpr KernelFn kKernels[kMR + 1] = {nullptr,         micro_kernel<1>, micro_kernel<2>,
                                        micro_kernel<3>, micro_kernel<4>, micro_kernel<5>,
                                        micro_kernel<6>};
// The kernels that prefetch the panel ahead: for whichever row slice first reads weights from
// memory.
constexpr KernelFn kStream[kMR + 1] = {nullptr,
                                       micro_kernel<1, true>, micro_kernel<2, true>,
                                       micro_kernel<3, true>, micro_kernel<4, true>,
                                       micro_kernel<5, true>, micro_kernel<6, true>};

// Sign-extend rows [r0, r0+R) x k-range [k0, k0+kc) of A into int16 pairs (odd tail padded 0).
inline void convert_a(const int8_t* a, int64_t k, int64_t r0, int R, int64_t k0, int64_t kc,
                      int16_t* dst, int64_t ld) {
  for (int r = 0; r < R; ++r) {
    const int8_t* src = a + (r0 + r) * k + k0;
    int16_t* d = dst + r * ld;
    int64_t j = 0;
    for (; j + 16 <= kc; j += 16)
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(d + j),
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
    for (; j < kc; ++j) d[j] = src[j];
    for (; j < ld; ++j) d[j] = 0;
  }
}

}  // namespace

bool detect_outliers(const void* x, DType dt, int64_t m, int64_t k, float alpha, bool ge,
                     uint8_t* mask) {
  switch (dt) {
    case DType::F32: return detect_impl<DType::F32>(x, m, k, alpha, ge, mask);
    case DType::F16: return detect_impl<DType::F16>(x, m, k, alpha, ge, mask);
    default: return detect_impl<DType::BF16>(x, m, k, alpha, ge, mask);
  }
}

bool quantize_rows(const void* x, DType dt, int64_t m, int64_t k, const uint8_t* mask,
                   const int64_t* cols, int64_t c, int8_t* q, float* absmax, void* outlier_vals) {
  switch (dt) {
    case DType::F32: return quantize_impl<DType::F32>(x, m, k, mask, cols, c, q, absmax, outlier_vals);
    case DType::F16: return quantize_impl<DType::F16>(x, m, k, mask, cols, c, q, absmax, outlier_vals);
    default: return quantize_impl<DType::BF16>(x, m, k, mask, cols, c, q, absmax, outlier_vals);
  }
}

// Decode (m <= stream_rows()): the weights stream from memory, each used by few rows. A is
// converted to int16 once, whole; each thread reads its panels whole, one after the other (a
// single sequential stream, prefetched ahead), every 6-row slice of A multiplying a panel while
// it is in cache, and finishes kNCp panels at a time. The int32 sums are those of the blocked
// path: the same exact integers. Measured against the blocked path on 2 AVX2 cores (4096x16384
// and 12288x49152 weights): 1.24-1.54x faster at m = 1-8, 1.06-1.08x at 32, 1.00 at 48, 0.99
// at 64.
static void gemm_small_m(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b,
                         int64_t n, int32_t* c, const Epilogue* ep) {
  const PackedLayout L(n, k);
  const int64_t ld = L.pairs * 2;  // int16 values per converted row (k rounded up to even)
  std::vector<int16_t> abuf(static_cast<size_t>(m * ld));
  for (int64_t r0 = 0; r0 < m; r0 += kMR)
    convert_a(a, k, r0, static_cast<int>(std::min<int64_t>(kMR, m - r0)), 0, k,
              abuf.data() + r0 * ld, ld);
  const int32_t* a32 = reinterpret_cast<const int32_t*>(abuf.data());
  constexpr int64_t sld = kNCp * PackedLayout::kPanelCols;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t p0 = L.panels * t / T, p1 = L.panels * (t + 1) / T;
    std::vector<int32_t> tile(static_cast<size_t>(m * sld));
    for (int64_t pc0 = p0; pc0 < p1; pc0 += kNCp) {
      const int64_t pc1 = std::min(p1, pc0 + kNCp);
      for (int64_t p = pc0; p < pc1; ++p) {
        const int ncols = static_cast<int>(std::min<int64_t>(16, n - p * 16));
        for (int64_t r0 = 0; r0 < m; r0 += kMR) {
          const int R = static_cast<int>(std::min<int64_t>(kMR, m - r0));
          kStream[R](a32 + r0 * ld / 2, ld / 2, packed_b + p * L.panel_bytes(), L.pairs,
                     tile.data() + r0 * sld + (p - pc0) * 16, sld, ncols, false);
        }
      }
      finish_tile(ep, dequantize_block, c, n, tile.data(), sld, 0, m, pc0 * 16,
                  std::min(n, pc1 * 16));
    }
  }
}

void gemm_s8s8s32(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                  int32_t* c, const Epilogue* ep) {
  if (m > 0 && m <= stream_rows()) return gemm_small_m(a, m, k, packed_b, n, c, ep);
  const PackedLayout L(n, k);
  const int64_t panels = L.panels;
  // The rows go in groups whose A stays in the cache (row_group_rows). Each thread sums into a
  // scratch of its current panel chunk (kMR rows when k is one block, else the group's rows),
  // finished (dequantized, or copied to c) as soon as a row slice's last k block is in.
  const int64_t mc = row_group_rows(m, k, kMR);
  const int64_t sld = kNCp * PackedLayout::kPanelCols, srows = k > kKC ? std::min(mc, m) : kMR;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t p0 = panels * t / T, p1 = panels * (t + 1) / T;
    alignas(32) int16_t abuf[kMR * kKC];
    std::vector<int32_t> scratch(static_cast<size_t>(srows * sld));
    for (int64_t g0 = 0; g0 < m; g0 += mc) {
      const int64_t g1 = std::min(m, g0 + mc);
      for (int64_t pc0 = p0; pc0 < p1; pc0 += kNCp) {
        const int64_t pc1 = std::min(p1, pc0 + kNCp);
        for (int64_t k0 = 0; k0 < k; k0 += kKC) {
          const int64_t kc = std::min<int64_t>(kKC, k - k0), kp = (kc + 1) / 2;
          for (int64_t r0 = g0; r0 < g1; r0 += kMR) {
            const int R = static_cast<int>(std::min<int64_t>(kMR, g1 - r0));
            convert_a(a, k, r0, R, k0, kc, abuf, kKC);
            int32_t* tile = scratch.data() + (srows == kMR ? 0 : r0 - g0) * sld;
            for (int64_t p = pc0; p < pc1; ++p) {
              const int8_t* bp = packed_b + L.offset(p * PackedLayout::kPanelCols, k0);
              const int ncols = static_cast<int>(std::min<int64_t>(16, n - p * 16));
              (r0 == g0 ? kStream : kKernels)[R](reinterpret_cast<const int32_t*>(abuf), kKC / 2,
                                                 bp, kp, tile + (p - pc0) * 16, sld, ncols, k0 > 0);
            }
            if (k0 + kKC >= k)
              finish_tile(ep, dequantize_block, c, n, tile, sld, r0, R, pc0 * 16,
                          std::min(n, pc1 * 16));
          }
        }
      }
    }
  }
}

template <DType D>
void dequant_block_impl(const Epilogue& e, const int32_t* acc, int64_t ld, int64_t r0,
                        int64_t rows, int64_t j0, int64_t j1) {
  const DequantArgs& d = e.d;
  const int64_t n = e.n;
  const float* cs = e.col_scale;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = r0 + i;
    const int32_t* ar = acc + i * ld - j0;  // ar[j] for j in [j0, j1)
    if (!(e.cols_safe && scale_is_safe(d.row_absmax[r]))) {  // the float64-scale path
      std::vector<float> wide(j1 - j0);
      dequantize_row_wide(ar + j0, r, j0, j1, d, n, wide.data());
      int64_t j = j0;
      for (; j + 8 <= j1; j += 8) store8<D>(e.out, r * n + j, _mm256_loadu_ps(&wide[j - j0]));
      for (; j < j1; ++j) store1<D>(e.out, r * n + j, wide[j - j0]);
      continue;
    }
    const __m256 rs = _mm256_set1_ps(d.row_absmax[r]);
    const float* ox = d.outlier_x ? d.outlier_x + r * d.c : nullptr;
    int64_t j = j0;
    for (; j + 8 <= j1; j += 8) {
      const __m256 scale = _mm256_mul_ps(rs, _mm256_loadu_ps(cs + j));
      __m256 v = _mm256_mul_ps(
          _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar + j))),
          scale);
      if (d.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(d.bias + j));
      for (int64_t o = 0; o < d.c; ++o)
        v = _mm256_fmadd_ps(_mm256_set1_ps(ox[o]), _mm256_loadu_ps(d.outlier_w + o * n + j), v);
      store8<D>(e.out, r * n + j, v);
    }
    for (; j < j1; ++j) {
      float v = static_cast<float>(ar[j]) * (d.row_absmax[r] * cs[j]);
      if (d.bias) v += d.bias[j];
      for (int64_t o = 0; o < d.c; ++o) v = std::fma(ox[o], d.outlier_w[o * n + j], v);
      store1<D>(e.out, r * n + j, v);
    }
  }
}

void dequantize_block(const Epilogue& e, const int32_t* acc, int64_t ld, int64_t r0, int64_t rows,
                      int64_t j0, int64_t j1) {
  switch (e.out_dt) {
    case DType::F32: return dequant_block_impl<DType::F32>(e, acc, ld, r0, rows, j0, j1);
    case DType::F16: return dequant_block_impl<DType::F16>(e, acc, ld, r0, rows, j0, j1);
    default: return dequant_block_impl<DType::BF16>(e, acc, ld, r0, rows, j0, j1);
  }
}

void dequantize(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                DType out_dt) {
  dequantize_rows(acc, m, n, d, out, out_dt, dequantize_block);
}

}  // namespace avx2
}  // namespace kb
