// kernelbench._cutlass: the pybind11 module of the CUTLASS fused int8 GEMM.
//
// Compiled for sm_80 and sm_90a; unverified on a GPU (the backends' verified devices say where
// it has run).
// Raw device pointers as integers, sizes, a cudaStream_t as an integer; no torch headers. The
// Python wrapper kernelbench/cutlass_ext.py checks everything first; the checks here repeat the
// ones that would otherwise corrupt memory.
//
// Dispatch: compute capability 9.0 -> the sm90 (CUTLASS 3.x) instances, 8.x -> the sm80
// (CUTLASS 2.x) instances, anything else -> RuntimeError. Tile: kAuto picks kSmallM for m <= 64
// (decode batches) and kLarge otherwise.
#include <cutlass/version.h>

#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

#include "cutlass_int8.cuh"

namespace py = pybind11;

namespace kb {
namespace cutlass_int8 {
namespace {

constexpr int kSmallMaxM = 64;
constexpr std::uintptr_t kAlign = 16;

int device_cc() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
             "cudaDeviceGetAttribute(major)");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
             "cudaDeviceGetAttribute(minor)");
  return major * 10 + minor;
}

void check_ptr(std::uintptr_t p, const char* name, bool optional) {
  if (!p) {
    if (optional) return;
    throw std::invalid_argument(std::string("cutlass fused int8 GEMM: ") + name + " is null");
  }
  if (p % kAlign) {
    throw std::invalid_argument(std::string("cutlass fused int8 GEMM: ") + name +
                                " must be 16-byte aligned");
  }
}

int select_tile(int64_t m, int tile) { return tile == kAuto ? (m <= kSmallMaxM ? kSmallM : kLarge) : tile; }

// Returns the tile actually used.
int fused_int8_linear(std::uintptr_t a, std::uintptr_t b, std::uintptr_t row_scale,
                      std::uintptr_t col_scale, std::uintptr_t bias, std::uintptr_t outlier,
                      std::uintptr_t out, int out_dtype, int64_t m, int64_t n, int64_t k,
                      int tile, std::uintptr_t stream) {
  if (m < 1 || n < 1 || k < 1) throw std::invalid_argument("cutlass fused int8 GEMM: empty shape");
  if (k % 16 || n % 16) {
    throw std::invalid_argument("cutlass fused int8 GEMM: k and n must be multiples of 16");
  }
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    throw std::invalid_argument("cutlass fused int8 GEMM: sizes must fit in int32");
  }
  if (tile != kAuto && tile != kSmallM && tile != kLarge) {
    throw std::invalid_argument("cutlass fused int8 GEMM: tile must be -1 (auto), 0 or 1");
  }
  check_ptr(a, "a", false);
  check_ptr(b, "b", false);
  check_ptr(row_scale, "row_scale", false);
  check_ptr(col_scale, "col_scale", false);
  check_ptr(bias, "bias", true);
  check_ptr(outlier, "outlier", true);
  check_ptr(out, "out", false);
  Problem p;
  p.a = reinterpret_cast<const int8_t*>(a);
  p.b = reinterpret_cast<const int8_t*>(b);
  p.row_scale = reinterpret_cast<const float*>(row_scale);
  p.col_scale = reinterpret_cast<const float*>(col_scale);
  p.bias = reinterpret_cast<const float*>(bias);
  p.outlier = reinterpret_cast<const float*>(outlier);
  p.out = reinterpret_cast<void*>(out);
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.stream = reinterpret_cast<cudaStream_t>(stream);
  const int used = select_tile(m, tile);
  const int cc = device_cc();
  if (cc == 90) {
    run_sm90(p, out_dtype, used);
  } else if (cc / 10 == 8) {
    run_sm80(p, out_dtype, used);
  } else {
    throw std::runtime_error("cutlass fused int8 GEMM: compute capability " +
                             std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
                             " has no instance (built for 8.x via sm_80 and 9.0 via sm_90a)");
  }
  return used;
}

py::dict cutlass_info() {
  py::dict d;
  d["cutlass_version"] = std::to_string(CUTLASS_MAJOR) + "." + std::to_string(CUTLASS_MINOR) +
                         "." + std::to_string(CUTLASS_PATCH);
  d["sm80_instances"] = std::string(sm80_instances());
  d["sm90_instances"] = std::string(sm90_instances());
  d["small_m_max"] = kSmallMaxM;
  d["alignment_bytes"] = static_cast<int64_t>(kAlign);
  return d;
}

}  // namespace
}  // namespace cutlass_int8
}  // namespace kb

PYBIND11_MODULE(_cutlass, m) {
  namespace ci = kb::cutlass_int8;
  m.doc() =
      "kernelbench CUTLASS int8 GEMM with a fused LLM.int8() dequantize epilogue. Unverified on "
      "a GPU until the cutlass backend lists a verified CUDA device. Raw device pointers as ints.";
  m.attr("FLOAT16") = static_cast<int>(ci::kOutFloat16);
  m.attr("BFLOAT16") = static_cast<int>(ci::kOutBFloat16);
  m.attr("TILE_AUTO") = static_cast<int>(ci::kAuto);
  m.attr("TILE_SMALL_M") = static_cast<int>(ci::kSmallM);
  m.attr("TILE_LARGE") = static_cast<int>(ci::kLarge);
  m.def("fused_int8_linear", &ci::fused_int8_linear, py::arg("a"), py::arg("b"),
        py::arg("row_scale"), py::arg("col_scale"), py::arg("bias"), py::arg("outlier"),
        py::arg("out"), py::arg("out_dtype"), py::arg("m"), py::arg("n"), py::arg("k"),
        py::arg("tile"), py::arg("stream"),
        "out (m, n) fp16/bf16 = float(a (m, k) @ b (n, k)^T) * row_scale[i] * col_scale[j] "
        "+ bias[j] + outlier[i, j]; 0 = absent (bias, outlier). Returns the tile used.");
  m.def("cutlass_info", &ci::cutlass_info, "CUTLASS version and the compiled instances.");
  m.def("device_compute_capability", &ci::device_cc,
        "Compute capability of the current device as major * 10 + minor.");
}
