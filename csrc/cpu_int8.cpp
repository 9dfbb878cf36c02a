// kernelbench._cpu: the CPU half of the `custom` backend.
//
// One fused pass quantizes x (row absmax without the outlier columns, round half to even, pack
// int8 with the outlier columns zeroed, gather the outlier columns' 16-bit values); an int8 GEMM
// with int32 accumulation on a packed weight layout; one fused pass dequantizes (outer product of
// the scales / 127^2, + bias, + the outlier product of the few outlier columns). Each kernel has
// a scalar reference here and an AVX2 version (cpu_int8_avx2.cpp); the GEMM also has an
// AVX512-VNNI version (cpu_int8_avx512.cpp). The kernel set (a table of function pointers,
// KernelSet) is picked once at import: "avx512vnni" (AVX2 kernels + the VNNI GEMM), "avx2" or
// "scalar".
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <pybind11/pybind11.h>
#if defined(__linux__)
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_int8.h"

namespace kb {
namespace {

inline float load_scalar(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16: {
      uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DType::F16: {
      // IEEE half -> float, handles subnormals, inf and NaN.
      const uint16_t h = static_cast<const uint16_t*>(p)[i];
      const uint32_t sign = (h & 0x8000u) << 16;
      const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
      uint32_t u;
      if (exp == 0) {
        if (man == 0) {
          u = sign;
        } else {  // subnormal: normalise
          int e = -1;
          uint32_t m = man;
          do { ++e; m <<= 1; } while ((m & 0x400u) == 0);
          u = sign | ((127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
        }
      } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
      } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
      }
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
  }
  return 0.f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline uint16_t float_to_f16(float f) {
  // Round-to-nearest-even float -> IEEE half (overflow to inf).
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
  if (u < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    float af;
    std::memcpy(&af, &u, 4);
    const float scaled = af * 16777216.0f;  // 2^24: half subnormal step is 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  const uint32_t rounded = u + 0xfffu + ((u >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

inline void store_scalar(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::F32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::BF16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
      break;
    case DType::F16:
      static_cast<uint16_t*>(p)[i] = float_to_f16(v);
      break;
  }
}

inline size_t dtype_size(DType dt) { return dt == DType::F32 ? 4 : 2; }

}  // namespace

namespace scalar {

bool detect_outliers(const void* x, DType dt, int64_t m, int64_t k, float alpha, bool ge,
                     uint8_t* mask) {
  std::vector<float> colmax(k, 0.f);
  bool finite = true;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const float v = load_scalar(x, dt, r * k + j);
      if (!std::isfinite(v)) finite = false;
      colmax[j] = std::max(colmax[j], std::fabs(v));
    }
  for (int64_t j = 0; j < k; ++j) mask[j] = ge ? colmax[j] >= alpha : colmax[j] > alpha;
  return finite;
}

bool quantize_rows(const void* x, DType dt, int64_t m, int64_t k, const uint8_t* mask,
                   const int64_t* cols, int64_t c, int8_t* q, float* absmax, void* outlier_vals) {
  bool finite = true;
  const size_t es = dtype_size(dt);
  for (int64_t r = 0; r < m; ++r) {
    float amax = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const float v = load_scalar(x, dt, r * k + j);
      if (!std::isfinite(v)) finite = false;
      if (!mask || !mask[j]) amax = std::max(amax, std::fabs(v));
    }
    absmax[r] = amax;
    const float p = quant_prescale(amax), s = quant_scale(amax);
    for (int64_t j = 0; j < k; ++j) {
      const float v = (mask && mask[j]) ? 0.f : load_scalar(x, dt, r * k + j);
      const float t = std::nearbyint((v * p) * s);
      q[r * k + j] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, t)));
    }
    for (int64_t i = 0; i < c; ++i)
      std::memcpy(static_cast<char*>(outlier_vals) + (r * c + i) * es,
                  static_cast<const char*>(x) + (r * k + cols[i]) * es, es);
  }
  return finite;
}

void dequantize_block(const Epilogue& e, const int32_t* acc, int64_t ld, int64_t r0, int64_t rows,
                      int64_t j0, int64_t j1) {
  const DequantArgs& d = e.d;
  std::vector<float> wide;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = r0 + i;
    const int32_t* ar = acc + i * ld;
    const bool fast = e.cols_safe && scale_is_safe(d.row_absmax[r]);
    if (!fast) {
      wide.resize(j1 - j0);
      dequantize_row_wide(ar, r, j0, j1, d, e.n, wide.data());
    }
    for (int64_t j = j0; j < j1; ++j) {
      float v;
      if (fast) {
        v = static_cast<float>(ar[j - j0]) * (d.row_absmax[r] * e.col_scale[j]);
        if (d.bias) v += d.bias[j];
        for (int64_t o = 0; o < d.c; ++o)
          v = std::fma(d.outlier_x[r * d.c + o], d.outlier_w[o * e.n + j], v);
      } else {
        v = wide[j - j0];
      }
      store_scalar(e.out, e.out_dt, r * e.n + j, v);
    }
  }
}

void gemm_s8s8s32(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                  int32_t* c, const Epilogue* ep) {
  const PackedLayout L(n, k);
  auto dot = [&](int64_t r, int64_t col) {
    int32_t sum = 0;
    for (int64_t kidx = 0; kidx < k; ++kidx)
      sum += static_cast<int32_t>(a[r * k + kidx]) * packed_b[L.offset(col, kidx)];
    return sum;
  };
  if (!ep) {
#pragma omp parallel for schedule(static)
    for (int64_t col = 0; col < n; ++col)
      for (int64_t r = 0; r < m; ++r) c[r * n + col] = dot(r, col);
    return;
  }
#pragma omp parallel
  {
    std::vector<int32_t> row(n);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t col = 0; col < n; ++col) row[col] = dot(r, col);
      dequantize_block(*ep, row.data(), n, r, 1, 0, n);
    }
  }
}

void dequantize(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                DType out_dt) {
  dequantize_rows(acc, m, n, d, out, out_dt, dequantize_block);
}

}  // namespace scalar

namespace {
std::atomic<int64_t> g_stream_rows{kDefaultStreamRows};
}  // namespace

int64_t stream_rows() { return g_stream_rows.load(std::memory_order_relaxed); }
void set_stream_rows(int64_t rows) { g_stream_rows.store(rows, std::memory_order_relaxed); }

// AMD family 26 (Zen 5) takes kL1, measured there; every other processor kL2, measured on Zen 4
// (family 25) and not on any other.
DecodePrefetch default_decode_prefetch() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return DecodePrefetch::kL2;
  const bool amd = ebx == 0x68747541 && edx == 0x69746e65 && ecx == 0x444d4163;  // AuthenticAMD
  if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return DecodePrefetch::kL2;
  const unsigned base = (eax >> 8) & 0xf;
  const unsigned family = base == 0xf ? base + ((eax >> 20) & 0xff) : base;
  return family == 26 ? DecodePrefetch::kL1 : DecodePrefetch::kL2;
}

namespace {
std::atomic<DecodePrefetch> g_decode_prefetch{default_decode_prefetch()};
}  // namespace

DecodePrefetch decode_prefetch() { return g_decode_prefetch.load(std::memory_order_relaxed); }
void set_decode_prefetch(DecodePrefetch hint) {
  g_decode_prefetch.store(hint, std::memory_order_relaxed);
}

namespace {
// The last-level cache of cpu0 from sysfs ("32768K"): glibc's sysconf(_SC_LEVEL3_CACHE_SIZE)
// reported 320 MB on a 2-vCPU Zen 4 VM whose sysfs says 32 MB.
int64_t default_streaming_store_bytes() {
  int64_t llc = 0;
  for (int index = 3; index >= 2 && llc == 0; --index) {
    const std::string path =
        "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size";
    if (std::FILE* f = std::fopen(path.c_str(), "r")) {
      long long value = 0;
      char unit = 0;
      if (std::fscanf(f, "%lld%c", &value, &unit) >= 1 && value > 0)
        llc = value << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
      std::fclose(f);
    }
  }
  return llc > 0 ? llc / 2 : int64_t{16} << 20;
}
std::atomic<int64_t> g_streaming_store_bytes{default_streaming_store_bytes()};
}  // namespace

int64_t streaming_store_bytes() {
  return g_streaming_store_bytes.load(std::memory_order_relaxed);
}
void set_streaming_store_bytes(int64_t bytes) {
  g_streaming_store_bytes.store(bytes, std::memory_order_relaxed);
}

void dequantize_rows(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                     DType out_dt, DequantizeBlockFn block) {
  std::vector<float> col_scale;
  const Epilogue e = make_epilogue(d, n, out, out_dt, col_scale);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) block(e, acc + r * n, n, r, 1, 0, n);
}

void dequantize_row_wide(const int32_t* acc_row, int64_t r, int64_t j0, int64_t j1,
                         const DequantArgs& d, int64_t n, float* out) {
  constexpr double kInv = 1.0 / (127.0 * 127.0);
  const double row = d.row_absmax[r];
  for (int64_t j = j0; j < j1; ++j) {
    const double scale = row * (static_cast<double>(d.col_absmax[j]) * kInv);
    float v = static_cast<float>(static_cast<double>(acc_row[j - j0]) * scale);
    if (d.bias) v += d.bias[j];
    for (int64_t i = 0; i < d.c; ++i)
      v = std::fma(d.outlier_x[r * d.c + i], d.outlier_w[i * n + j], v);
    out[j - j0] = v;
  }
}

void pack_b(const int8_t* b, int64_t n, int64_t k, int8_t* packed) {
  const PackedLayout L(n, k);
  const int64_t cols = L.panels * PackedLayout::kPanelCols, ks = L.pairs * 2;
#pragma omp parallel for schedule(static)
  for (int64_t col = 0; col < cols; ++col) {
    int32_t sum = 0;
    for (int64_t kidx = 0; kidx < ks; ++kidx) {
      const int8_t v = (col < n && kidx < k) ? b[col * k + kidx] : int8_t{0};
      packed[L.offset(col, kidx)] = v;
      sum += v;
    }
    const int32_t x128 = sum * 128;
    std::memcpy(packed + L.sums_offset() + col * sizeof(int32_t), &x128, sizeof(int32_t));
  }
}

void gather_packed_columns(const int8_t* packed, int64_t n, int64_t k, const int64_t* cols,
                           int64_t c, int8_t* out) {
  const PackedLayout L(n, k);
  for (int64_t col = 0; col < n; ++col)
    for (int64_t i = 0; i < c; ++i) out[col * c + i] = packed[L.offset(col, cols[i])];
}

}  // namespace kb

// --- Python bindings --------------------------------------------------------------------------

namespace py = pybind11;
using kb::DType;
using kb::KernelSet;

namespace {

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512vnni() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}

bool cpu_has_clflushopt() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 23));
}

__attribute__((target("clflushopt"))) void flush_lines_opt(const char* p, const char* end) {
  for (; p < end; p += 64) _mm_clflushopt(const_cast<char*>(p));
}

void flush_lines_plain(const char* p, const char* end) {
  for (; p < end; p += 64) _mm_clflush(p);
}

// Below this many bytes one thread flushes; above, the OpenMP team splits the lines: a
// flush is bound by each core's rate of flushes, not by the bus (64 MB of clean lines took
// 2.3-2.7 ms on one thread of a 2-vCPU Xeon VM, before every cold call of a sweep).
constexpr int64_t kParallelFlushBytes = int64_t{1} << 20;

// Writes back and invalidates every cache line of [begin, begin + nbytes) in every cache of the
// coherence domain (all cores, all levels): the next read of those bytes comes from memory.
void flush_cache_lines(uintptr_t begin, int64_t nbytes) {
  if (nbytes <= 0) return;
  static const bool opt = cpu_has_clflushopt();
  const uintptr_t first = begin & ~uintptr_t{63};
  const uintptr_t last = begin + static_cast<uintptr_t>(nbytes);
  // the lines [first, last) of one thread, flushed and fenced: done before it goes on
  auto flush = [](uintptr_t from, uintptr_t to) {
    const char* p = reinterpret_cast<const char*>(from);
    const char* end = reinterpret_cast<const char*>(to);
    if (opt) flush_lines_opt(p, end); else flush_lines_plain(p, end);
    _mm_mfence();
  };
  const int team = nbytes < kParallelFlushBytes ? 1 : omp_get_max_threads();
  if (team <= 1) {  // no team for small spans (a call's scales, bias, activations)
    flush(first, last);
    return;
  }
  const int64_t lines = static_cast<int64_t>((last - first + 63) / 64);
#pragma omp parallel num_threads(team)
  {
    const int64_t n = omp_get_num_threads(), t = omp_get_thread_num();
    flush(first + 64 * static_cast<uintptr_t>(lines * t / n),
          std::min<uintptr_t>(last, first + 64 * static_cast<uintptr_t>(lines * (t + 1) / n)));
  }
}

// The round trip of one cache line between the first two threads of an OpenMP team, in ns:
// thread 0 writes a counter, thread 1 answers, `rounds` times in `batches` batches; the fastest
// batch's mean (a batch the OS interrupted does not count). On a VM whose two vCPUs the host
// places now on one core complex (shared L3) and now on two, this reads 50-70 or 300 ns: a
// reading of where the threads run, taken without touching memory. -1 with fewer than two
// threads.
double thread_round_trip_ns(int rounds, int batches) {
  if (rounds < 1 || batches < 1) throw std::invalid_argument("rounds and batches must be >= 1");
  alignas(64) std::atomic<int64_t> counter{0};
  double best = -1.0;
#pragma omp parallel num_threads(2)
  {
    if (omp_get_num_threads() == 2) {
      const int64_t total = int64_t{rounds} * batches;
      if (omp_get_thread_num() == 0) {
        int64_t next = 0;
        for (int b = 0; b < batches; ++b) {
          const auto t0 = std::chrono::steady_clock::now();
          for (int r = 0; r < rounds; ++r, next += 2) {
            counter.store(next + 1, std::memory_order_release);
            while (counter.load(std::memory_order_acquire) != next + 2) _mm_pause();
          }
          const double ns =
              std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0)
                  .count() / rounds;
          if (best < 0 || ns < best) best = ns;
        }
      } else {
        for (int64_t next = 0; next < 2 * total; next += 2) {
          while (counter.load(std::memory_order_acquire) != next + 1) _mm_pause();
          counter.store(next + 2, std::memory_order_release);
        }
      }
    }
  }
  return best;
}

// How fast the cores run right now: each of the first two threads of an OpenMP team runs
// `iters` steps of a dependent integer chain (a multiply-add and a shift-xor a step, in
// registers: no memory), once, and the slower thread's time is returned, in ns. A core that
// the host shares out (its other hardware thread busy, or the vCPU time-sliced finer than the
// steal count shows: not told apart) reads slower: on a 2-vCPU Xeon VM 50000 steps read about
// 13-17 us, or 22-35 us in the slow state,
// and bf16 GEMMs ran 2.4x and int8 ones 1.8x slower in the slow reading (an 8-chain FMA loop
// taking its fastest of two batches did not see it). -1 with fewer than two threads.
double core_probe_ns(int iters) {
  if (iters < 1) throw std::invalid_argument("iters must be >= 1");
  double slowest = -1.0;
  int team = 0;
#pragma omp parallel num_threads(2) reduction(max : slowest)
  {
    if (omp_get_thread_num() == 0) team = omp_get_num_threads();
    uint64_t x = 12345u + static_cast<uint64_t>(omp_get_thread_num()), y = 67890u;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      y ^= x >> 13;
    }
    slowest =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    volatile uint64_t keep = x ^ y;
    (void)keep;
  }
  return team == 2 ? slowest : -1.0;
}

// The kernel sets, best first; the avx512vnni set is the AVX2 kernels with the VNNI GEMM.
const KernelSet kScalar{"scalar", kb::scalar::detect_outliers, kb::scalar::quantize_rows,
                        kb::scalar::gemm_s8s8s32, kb::scalar::dequantize};
const KernelSet kAvx2{"avx2", kb::avx2::detect_outliers, kb::avx2::quantize_rows,
                      kb::avx2::gemm_s8s8s32, kb::avx2::dequantize};
const KernelSet kAvx512Vnni{"avx512vnni", kb::avx2::detect_outliers, kb::avx2::quantize_rows,
                            kb::avx512vnni::gemm_s8s8s32, kb::avx512vnni::dequantize};

const KernelSet* best_kernel_set() {
  return cpu_has_avx512vnni() ? &kAvx512Vnni : cpu_has_avx2() ? &kAvx2 : &kScalar;
}

// Chosen once at import (set_isa changes it for tests); every binding calls through it.
const KernelSet* g_kernels = best_kernel_set();

void set_kernel_set(const std::string& name) {
  if (name == "scalar") {
    g_kernels = &kScalar;
  } else if (name == "avx2") {
    if (!cpu_has_avx2()) throw std::runtime_error("this CPU lacks AVX2/FMA/F16C");
    g_kernels = &kAvx2;
  } else if (name == "avx512vnni") {
    if (!cpu_has_avx512vnni())
      throw std::runtime_error("this CPU lacks AVX512F/BW/VNNI (or AVX2/FMA/F16C)");
    g_kernels = &kAvx512Vnni;
  } else {
    throw std::invalid_argument("isa must be avx512vnni|avx2|scalar, got '" + name + "'");
  }
}

// What quantize_kept found.
enum KeptQuantization : int { kNonFinite = 0, kQuantized = 1, kOutlierOutsideKept = 2 };

// llm_int8's quantization in one pass over x when the outlier columns are known ahead of the
// call (the dims kept in 16-bit, cols: c sorted unique indices): each row's absmax over the
// other columns, its int8 codes and its values at cols, from the row while it is in cache. A
// column outside cols is an outlier exactly when some row's absmax over the other columns
// passes alpha, so that absmax also decides whether the result stands; when it does not
// (kOutlierOutsideKept), the outputs are to be discarded and the caller detects first.
int quantize_kept(const void* x, DType dt, int64_t m, int64_t k, float alpha, bool ge,
                  const int64_t* cols, int64_t c, int8_t* q, float* absmax, void* vals) {
  std::vector<uint8_t> mask;
  if (c) {
    mask.assign(static_cast<size_t>(k), 0);
    for (int64_t i = 0; i < c; ++i) mask[cols[i]] = 1;
  }
  if (!g_kernels->quantize_rows(x, dt, m, k, c ? mask.data() : nullptr, cols, c, q, absmax,
                                vals))
    return kNonFinite;
  for (int64_t r = 0; r < m; ++r)
    if (ge ? absmax[r] >= alpha : absmax[r] > alpha) return kOutlierOutsideKept;
  return kQuantized;
}

// A whole llm_int8 (or vectorwise: c = 0, alpha = inf) layer in one call when the outlier
// columns are the kept dims: quantize_kept's pass into scratch that lives for the call, then the
// GEMM with the dequantization and the outlier product (x[:, cols] in float32 times kept_t32,
// the kept dims' weights, (c, n) float32) fused into its tiles. The numbers of the stages bit for
// bit; one call instead of several, each of which allocates and, between two calls of a layer
// with other work in between, runs from cold caches. Returns what quantize_kept returns; out is
// written only with kQuantized.
int linear_kept(const void* x, DType dt, int64_t m, int64_t k, float alpha, bool ge,
                const int64_t* cols, int64_t c, const float* kept_t32, const int8_t* packed,
                int64_t n, const float* col_absmax, const float* bias, void* out, DType out_dt) {
  std::unique_ptr<int8_t[]> q(new int8_t[static_cast<size_t>(m * k)]);
  std::unique_ptr<float[]> absmax(new float[static_cast<size_t>(m)]);
  std::unique_ptr<char[]> vals(new char[static_cast<size_t>(m * c) * kb::dtype_size(dt)]);
  const int status =
      quantize_kept(x, dt, m, k, alpha, ge, cols, c, q.get(), absmax.get(), vals.get());
  if (status != kQuantized || m == 0) return status;
  std::vector<float> outlier_x(static_cast<size_t>(m * c));
  for (int64_t i = 0; i < m * c; ++i) outlier_x[i] = kb::load_scalar(vals.get(), dt, i);
  const kb::DequantArgs args{absmax.get(), col_absmax, bias, c ? outlier_x.data() : nullptr,
                             c ? kept_t32 : nullptr, c};
  std::vector<float> col_scale;
  const kb::Epilogue ep = kb::make_epilogue(args, n, out, out_dt, col_scale);
  g_kernels->gemm_s8s8s32(q.get(), m, k, packed, n, nullptr, &ep);
  return kQuantized;
}

template <typename T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

DType to_dtype(int code) {
  if (code != kb::dtype_code(DType::F32) && code != kb::dtype_code(DType::F16) &&
      code != kb::dtype_code(DType::BF16))
    throw std::invalid_argument("unknown dtype code " + std::to_string(code));
  return static_cast<DType>(code);
}

}  // namespace

PYBIND11_MODULE(_cpu, m) {
  m.doc() = "kernelbench CPU int8 kernels (raw pointers; validated by kernelbench.cpu_ext)";
  m.attr("FLOAT32") = kb::dtype_code(DType::F32);
  m.attr("FLOAT16") = kb::dtype_code(DType::F16);
  m.attr("BFLOAT16") = kb::dtype_code(DType::BF16);
  m.attr("PANEL_COLS") = kb::PackedLayout::kPanelCols;
  m.def("isa", [] { return std::string(g_kernels->name); },
        "Kernel set in use: 'avx512vnni', 'avx2' or 'scalar'.");
  m.def("set_isa", &set_kernel_set, "Force the kernel set (tests compare them).");
  m.def("stream_rows", &kb::stream_rows,
        "Up to this many rows of A, the GEMMs' decode path (weights streamed once per call).");
  m.def("set_stream_rows", [](int64_t rows) {
    if (rows < 0) throw std::invalid_argument("stream_rows must be >= 0");
    kb::set_stream_rows(rows);
  }, "Set the decode path's row limit (0: always the blocked path); for tests and tuning.");
  m.def("decode_prefetch", [] { return static_cast<int>(kb::decode_prefetch()); },
        "Where the VNNI decode path prefetches its weights: 0 L2, 1 L1 (one-row tiles: none).");
  m.def("default_decode_prefetch", [] { return static_cast<int>(kb::default_decode_prefetch()); },
        "The decode prefetch chosen for this processor.");
  m.def("set_decode_prefetch", [](int hint) {
    if (hint != 0 && hint != 1) throw std::invalid_argument("decode prefetch must be 0 or 1");
    kb::set_decode_prefetch(static_cast<kb::DecodePrefetch>(hint));
  }, "Set the decode path's prefetch hint (0 L2, 1 L1); for tests and tuning.");
  m.def("streaming_store_bytes", &kb::streaming_store_bytes,
        "From this many bytes of int32 product on, the VNNI GEMM stores it non-temporally.");
  m.def("set_streaming_store_bytes", [](int64_t bytes) {
    if (bytes < 0) throw std::invalid_argument("streaming_store_bytes must be >= 0");
    kb::set_streaming_store_bytes(bytes);
  }, "Set the streamed-store threshold (0: every eligible product); for tests and tuning.");
  m.def("flush_cache_lines", [](uintptr_t begin, int64_t nbytes) {
    py::gil_scoped_release nogil;
    flush_cache_lines(begin, nbytes);
  }, "Evict these bytes from every cache level (clflushopt, or clflush where it is missing).");
  m.def("thread_round_trip_ns", [](int rounds, int batches) {
    py::gil_scoped_release nogil;
    return thread_round_trip_ns(rounds, batches);
  }, "ns a cache line takes to go between two OpenMP threads and back (-1: one thread).");
  m.def("core_probe_ns", [](int iters) {
    py::gil_scoped_release nogil;
    return core_probe_ns(iters);
  }, "ns the slower of two OpenMP threads takes for `iters` integer steps (-1: one thread).");
  m.def("set_num_threads", [](int n) { omp_set_num_threads(n); });
  m.def("get_max_threads", [] { return omp_get_max_threads(); });
  m.def("packed_bytes", [](int64_t n, int64_t k) { return kb::PackedLayout(n, k).bytes(); });
  m.def("pack_b", [](uintptr_t b, int64_t n, int64_t k, uintptr_t packed) {
    py::gil_scoped_release nogil;
    kb::pack_b(ptr<const int8_t>(b), n, k, ptr<int8_t>(packed));
  });
  m.def("gather_packed_columns", [](uintptr_t packed, int64_t n, int64_t k, uintptr_t cols,
                                    int64_t c, uintptr_t out) {
    py::gil_scoped_release nogil;
    kb::gather_packed_columns(ptr<const int8_t>(packed), n, k, ptr<const int64_t>(cols), c,
                              ptr<int8_t>(out));
  });
  m.def("detect_outliers", [](uintptr_t x, int dt, int64_t m, int64_t k, float alpha, bool ge,
                              uintptr_t mask) {
    const DType d = to_dtype(dt);
    py::gil_scoped_release nogil;
    return g_kernels->detect_outliers(ptr<const void>(x), d, m, k, alpha, ge, ptr<uint8_t>(mask));
  });
  m.def("quantize_rows", [](uintptr_t x, int dt, int64_t m, int64_t k, uintptr_t mask,
                            uintptr_t cols, int64_t c, uintptr_t q, uintptr_t absmax,
                            uintptr_t outlier_vals) {
    const DType d = to_dtype(dt);
    py::gil_scoped_release nogil;
    return g_kernels->quantize_rows(ptr<const void>(x), d, m, k, ptr<const uint8_t>(mask),
                                    ptr<const int64_t>(cols), c, ptr<int8_t>(q),
                                    ptr<float>(absmax), ptr<void>(outlier_vals));
  });
  m.def("quantize_kept", [](uintptr_t x, int dt, int64_t m, int64_t k, float alpha, bool ge,
                            uintptr_t cols, int64_t c, uintptr_t q, uintptr_t absmax,
                            uintptr_t vals) {
    const DType d = to_dtype(dt);
    py::gil_scoped_release nogil;
    return quantize_kept(ptr<const void>(x), d, m, k, alpha, ge, ptr<const int64_t>(cols), c,
                         ptr<int8_t>(q), ptr<float>(absmax), ptr<void>(vals));
  }, "0: x is not finite; 1: quantized, the outliers all in cols; 2: an outlier outside cols.");
  m.def("linear_kept", [](uintptr_t x, int dt, int64_t m, int64_t k, float alpha, bool ge,
                          uintptr_t cols, int64_t c, uintptr_t kept_t32, uintptr_t packed,
                          int64_t n, uintptr_t col_absmax, uintptr_t bias, uintptr_t out,
                          int out_dt) {
    const DType d = to_dtype(dt), od = to_dtype(out_dt);
    py::gil_scoped_release nogil;
    return linear_kept(ptr<const void>(x), d, m, k, alpha, ge, ptr<const int64_t>(cols), c,
                       ptr<const float>(kept_t32), ptr<const int8_t>(packed), n,
                       ptr<const float>(col_absmax), ptr<const float>(bias), ptr<void>(out), od);
  }, "quantize_kept + the fused GEMM in one call; the same return codes.");
  m.def("gemm_s8s8s32", [](uintptr_t a, int64_t m, int64_t k, uintptr_t packed, int64_t n,
                           uintptr_t c) {
    py::gil_scoped_release nogil;
    g_kernels->gemm_s8s8s32(ptr<const int8_t>(a), m, k, ptr<const int8_t>(packed), n,
                            ptr<int32_t>(c), nullptr);
  });
  m.def("linear", [](uintptr_t a, int64_t m, int64_t k, uintptr_t packed, int64_t n,
                     uintptr_t row_absmax, uintptr_t col_absmax, uintptr_t bias,
                     uintptr_t outlier_x, uintptr_t outlier_w, int64_t c, uintptr_t out,
                     int out_dt) {
    const DType d = to_dtype(out_dt);
    py::gil_scoped_release nogil;
    const kb::DequantArgs args{ptr<const float>(row_absmax), ptr<const float>(col_absmax),
                               ptr<const float>(bias),       ptr<const float>(outlier_x),
                               ptr<const float>(outlier_w),  c};
    std::vector<float> col_scale;
    const kb::Epilogue ep = kb::make_epilogue(args, n, ptr<void>(out), d, col_scale);
    g_kernels->gemm_s8s8s32(ptr<const int8_t>(a), m, k, ptr<const int8_t>(packed), n, nullptr,
                            &ep);
  }, "The int8 GEMM with the dequantization fused into it (no int32 product in memory).");
  m.def("dequantize", [](uintptr_t acc, int64_t m, int64_t n, uintptr_t row_absmax,
                         uintptr_t col_absmax, uintptr_t bias, uintptr_t outlier_x,
                         uintptr_t outlier_w, int64_t c, uintptr_t out, int out_dt) {
    const DType d = to_dtype(out_dt);
    py::gil_scoped_release nogil;
    const kb::DequantArgs args{ptr<const float>(row_absmax), ptr<const float>(col_absmax),
                               ptr<const float>(bias),       ptr<const float>(outlier_x),
                               ptr<const float>(outlier_w),  c};
    g_kernels->dequantize(ptr<const int32_t>(acc), m, n, args, ptr<void>(out), d);
  });
}
