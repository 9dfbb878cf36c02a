// kernelbench._cpu: the CPU half of the `custom` backend.
//
// One fused pass quantizes x (row absmax without the outlier columns, round half to even, pack
// int8 with the outlier columns zeroed, gather the outlier columns' 16-bit values); an int8 GEMM
// with int32 accumulation on a packed weight layout; one fused pass dequantizes (outer product of
// the scales / 127^2, + bias, + the outlier product of the few outlier columns). Each kernel has
// a scalar reference here and an AVX2 version (cpu_int8_avx2.cpp); the GEMM also has an
// AVX512-VNNI version (cpu_int8_avx512.cpp). The kernel set is picked at run time:
// "avx512vnni" (AVX2 kernels + the VNNI GEMM), "avx2" or "scalar".
#include <omp.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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
    const float s = amax > 0.f ? 127.f / amax : 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const float v = (mask && mask[j]) ? 0.f : load_scalar(x, dt, r * k + j);
      const float t = std::nearbyint(v * s);
      q[r * k + j] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, t)));
    }
    for (int64_t i = 0; i < c; ++i)
      std::memcpy(static_cast<char*>(outlier_vals) + (r * c + i) * es,
                  static_cast<const char*>(x) + (r * k + cols[i]) * es, es);
  }
  return finite;
}

void gemm_s8s8s32(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                  int32_t* c) {
  const int64_t pairs = (k + 1) / 2;
#pragma omp parallel for schedule(static)
  for (int64_t col = 0; col < n; ++col) {
    const int8_t* panel = packed_b + (col / 16) * pairs * 32;
    const int64_t j = col % 16;
    for (int64_t r = 0; r < m; ++r) {
      int32_t sum = 0;
      for (int64_t kk = 0; kk < pairs; ++kk) {
        const int32_t b0 = panel[kk * 32 + j * 2], b1 = panel[kk * 32 + j * 2 + 1];
        const int32_t a0 = a[r * k + 2 * kk];
        const int32_t a1 = (2 * kk + 1 < k) ? a[r * k + 2 * kk + 1] : 0;
        sum += a0 * b0 + a1 * b1;
      }
      c[r * n + col] = sum;
    }
  }
}

void dequantize(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                DType out_dt) {
  constexpr float kInv = 1.0f / (127.0f * 127.0f);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      float v = static_cast<float>(acc[r * n + j]) * (d.row_absmax[r] * (d.col_absmax[j] * kInv));
      if (d.bias) v += d.bias[j];
      for (int64_t i = 0; i < d.c; ++i) v += d.outlier_x[r * d.c + i] * d.outlier_w[i * n + j];
      store_scalar(out, out_dt, r * n + j, v);
    }
}

}  // namespace scalar

void pack_b(const int8_t* b, int64_t n, int64_t k, int8_t* packed) {
  const int64_t panels = (n + 15) / 16, pairs = (k + 1) / 2;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t kk = 0; kk < pairs; ++kk)
      for (int64_t j = 0; j < 16; ++j)
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t col = p * 16 + j, kidx = 2 * kk + h;
          packed[((p * pairs + kk) * 16 + j) * 2 + h] =
              (col < n && kidx < k) ? b[col * k + kidx] : int8_t{0};
        }
}

}  // namespace kb

// --- Python bindings --------------------------------------------------------------------------

namespace py = pybind11;
using kb::DType;

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

std::string best_isa() {
  return cpu_has_avx512vnni() ? "avx512vnni" : cpu_has_avx2() ? "avx2" : "scalar";
}

std::string g_isa = best_isa();

bool use_avx2() { return g_isa != "scalar"; }  // the avx512vnni set uses the AVX2 kernels too

using GemmFn = void (*)(const int8_t*, int64_t, int64_t, const int8_t*, int64_t, int32_t*);

GemmFn gemm_fn() {
  if (g_isa == "avx512vnni") return kb::avx512vnni::gemm_s8s8s32;
  return g_isa == "avx2" ? kb::avx2::gemm_s8s8s32 : kb::scalar::gemm_s8s8s32;
}

template <typename T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

DType to_dtype(int code) {
  if (code < 0 || code > 2) throw std::invalid_argument("unknown dtype code " + std::to_string(code));
  return static_cast<DType>(code);
}

}  // namespace

PYBIND11_MODULE(_cpu, m) {
  m.doc() = "kernelbench CPU int8 kernels (raw pointers; validated by kernelbench.cpu_ext)";
  m.def("isa", [] { return g_isa; }, "Kernel set in use: 'avx512vnni', 'avx2' or 'scalar'.");
  m.def("cpu_has_avx2", &cpu_has_avx2);
  m.def(
      "set_isa",
      [](const std::string& isa) {
        if (isa != "scalar" && isa != "avx2" && isa != "avx512vnni")
          throw std::invalid_argument("isa must be avx512vnni|avx2|scalar, got '" + isa + "'");
        if (isa == "avx2" && !cpu_has_avx2()) throw std::runtime_error("this CPU lacks AVX2/FMA/F16C");
        if (isa == "avx512vnni" && !cpu_has_avx512vnni())
          throw std::runtime_error("this CPU lacks AVX512F/BW/VNNI (or AVX2/FMA/F16C)");
        g_isa = isa;
      },
      "Force the kernel set (tests compare them).");
  m.def("set_num_threads", [](int n) { omp_set_num_threads(n); });
  m.def("get_max_threads", [] { return omp_get_max_threads(); });
  m.def("packed_b_bytes", [](int64_t n, int64_t k) { return kb::packed_b_bytes(n, k); });
  m.def("pack_b", [](uintptr_t b, int64_t n, int64_t k, uintptr_t packed) {
    py::gil_scoped_release nogil;
    kb::pack_b(ptr<const int8_t>(b), n, k, ptr<int8_t>(packed));
  });
  m.def("detect_outliers", [](uintptr_t x, int dt, int64_t m, int64_t k, float alpha, bool ge,
                              uintptr_t mask) {
    py::gil_scoped_release nogil;
    const auto f = use_avx2() ? kb::avx2::detect_outliers : kb::scalar::detect_outliers;
    return f(ptr<const void>(x), to_dtype(dt), m, k, alpha, ge, ptr<uint8_t>(mask));
  });
  m.def("quantize_rows", [](uintptr_t x, int dt, int64_t m, int64_t k, uintptr_t mask,
                            uintptr_t cols, int64_t c, uintptr_t q, uintptr_t absmax,
                            uintptr_t outlier_vals) {
    py::gil_scoped_release nogil;
    const auto f = use_avx2() ? kb::avx2::quantize_rows : kb::scalar::quantize_rows;
    return f(ptr<const void>(x), to_dtype(dt), m, k, ptr<const uint8_t>(mask),
             ptr<const int64_t>(cols), c, ptr<int8_t>(q), ptr<float>(absmax),
             ptr<void>(outlier_vals));
  });
  m.def("gemm_s8s8s32", [](uintptr_t a, int64_t m, int64_t k, uintptr_t packed, int64_t n,
                           uintptr_t c) {
    py::gil_scoped_release nogil;
    gemm_fn()(ptr<const int8_t>(a), m, k, ptr<const int8_t>(packed), n, ptr<int32_t>(c));
  });
  m.def("dequantize", [](uintptr_t acc, int64_t m, int64_t n, uintptr_t row_absmax,
                         uintptr_t col_absmax, uintptr_t bias, uintptr_t outlier_x,
                         uintptr_t outlier_w, int64_t c, uintptr_t out, int out_dt) {
    py::gil_scoped_release nogil;
    const kb::DequantArgs d{ptr<const float>(row_absmax), ptr<const float>(col_absmax),
                            ptr<const float>(bias),       ptr<const float>(outlier_x),
                            ptr<const float>(outlier_w),  c};
    const auto f = use_avx2() ? kb::avx2::dequantize : kb::scalar::dequantize;
    f(ptr<const int32_t>(acc), m, n, d, ptr<void>(out), to_dtype(out_dt));
  });
}
