// int8 x int8 -> int32 GEMM through cuBLASLt (kernelbench._cuda).
//
// Compiled against the cuBLASLt 13 headers for sm_80 and sm_90a; unverified on a GPU (the
// backends' verified devices say where it has run).
//
// Orderings. kernelbench wants C (m, n) row-major = x (m, k) row-major @ w (n, k)^T, with w in
// nn.Linear layout. cuBLASLt is column-major, and a row-major (r, c) buffer is the same bytes as
// a column-major (c, r) matrix. So in column-major terms we compute C^T (n x m) = w' x', where
//   A = the w buffer seen as column-major (k x n, ld k), op(A) = A^T    (n x k)   TRANSA = T
//   B = the x buffer seen as column-major (k x m, ld k), op(B) = B      (k x m)   TRANSB = N
//   C = the out buffer as column-major (n x m, ld n) = row-major (m, n).
// This is the "TN" int8 case that cuBLASLt's IMMA kernels have always supported.
//
// Compute type CUBLAS_COMPUTE_32I, scale type CUDA_R_32I (alpha = 1, beta = 0 as int32).
// One handle and one 32 MiB workspace per device; a plan (descriptors + heuristic algorithm) is
// built once per (device, m, n, k) and cached. Calls are serialized by a mutex, and the shared
// workspace assumes one stream at a time uses a device's plans (kernelbench's case).
//
// Alignment: the heuristic is told (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*) that A, B, C are
// 16-byte aligned, so kernelbench.cuda_ext enforces 16-byte aligned pointers and k, n multiples
// of 16 (every row then starts 16-byte aligned too).
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include <pybind11/pybind11.h>

#include "kb_cuda.cuh"

namespace py = pybind11;

namespace kb {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr uint32_t kMinAlignment = 16;

void lt_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLASLt error in ") + what + ": " +
                             cublasLtGetStatusName(st) + ": " + cublasLtGetStatusString(st));
  }
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatrixLayout_t b = nullptr;
  cublasLtMatrixLayout_t c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // Destruction at interpreter exit may race with CUDA teardown: statuses are ignored there.
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Key: m, n, k, variant (0 = int32 out; 1 + out dtype = outer-vector scaled).
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int>;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

std::mutex g_mutex;
std::map<int, std::unique_ptr<DeviceState>> g_devices;  // never freed: lives until exit

DeviceState& device_state() {
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  auto& slot = g_devices[dev];
  if (!slot) {
    auto st = std::make_unique<DeviceState>();
    lt_check(cublasLtCreate(&st->handle), "cublasLtCreate");
    cuda_check(cudaMalloc(&st->workspace, kWorkspaceBytes), "cudaMalloc(cuBLASLt workspace)");
    slot = std::move(st);
  }
  return *slot;
}

template <typename V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v,
              const char* what) {
  lt_check(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), what);
}

// Heuristic algorithm for a plan whose descriptors are set; throws when there is none.
void choose_algo(DeviceState& ds, Plan& p, cublasLtMatrixLayout_t d_layout, const char* what) {
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  cublasStatus_t (*)(cublasLtMatmulPreference_t)>
      guard(pref, cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = kWorkspaceBytes;
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws, sizeof(ws)),
           "set PREF_MAX_WORKSPACE_BYTES");
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, attr, &kMinAlignment,
                                                  sizeof(kMinAlignment)),
             "set PREF_MIN_ALIGNMENT");
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  lt_check(cublasLtMatmulAlgoGetHeuristic(ds.handle, p.op, p.a, p.b, p.c, d_layout, pref, 1,
                                          &result, &found),
           what);
  if (found < 1) {
    throw std::runtime_error(std::string(what) + ": cuBLASLt returned no algorithm");
  }
  p.algo = result.algo;
}

std::unique_ptr<Plan> make_int8_plan(DeviceState& ds, int64_t m, int64_t n, int64_t k,
                                     cublasComputeType_t compute, cudaDataType_t scale_type,
                                     cudaDataType_t c_type) {
  auto p = std::make_unique<Plan>();
  lt_check(cublasLtMatmulDescCreate(&p->op, compute, scale_type), "cublasLtMatmulDescCreate");
  set_desc(p->op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "set TRANSA");
  set_desc(p->op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "set TRANSB");
  lt_check(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8I, k, n, k), "layout A (weight)");
  lt_check(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8I, k, m, k), "layout B (activation)");
  lt_check(cublasLtMatrixLayoutCreate(&p->c, c_type, n, m, n), "layout C");
  (void)ds;
  return p;
}

void check_sizes(int64_t m, int64_t n, int64_t k) {
  if (m < 1 || n < 1 || k < 1) throw std::invalid_argument("cuBLASLt int8 GEMM: empty shape");
  if (k % 16 || n % 16) {
    throw std::invalid_argument("cuBLASLt int8 GEMM: k and n must be multiples of 16");
  }
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    throw std::invalid_argument("cuBLASLt int8 GEMM: sizes must fit in int32");
  }
}

void check_ptr(std::uintptr_t p, const char* name) {
  if (!p || p % kMinAlignment) {
    throw std::invalid_argument(std::string("cuBLASLt int8 GEMM: ") + name +
                                " must be a non-null 16-byte aligned device pointer");
  }
}

// One cublasLtMatmul on a plan: out = alpha * op(A) op(B) + beta * out, with A the weight (b
// here) and B the activation (a here), see the header comment. alpha and beta have the plan's
// scale type.
void run_plan(DeviceState& ds, const Plan& p, const void* alpha, const void* beta,
              std::uintptr_t a, std::uintptr_t b, std::uintptr_t out, std::uintptr_t stream,
              const char* what) {
  lt_check(cublasLtMatmul(ds.handle, p.op, alpha, as_ptr<const void>(b), p.a,
                          as_ptr<const void>(a), p.b, beta, as_ptr<void>(out), p.c,
                          as_ptr<void>(out), p.c, &p.algo, ds.workspace, kWorkspaceBytes,
                          as_stream(stream)),
           what);
}

// C (m, n) int32 row-major = a (m, k) int8 row-major @ b (n, k)^T.
void int8_gemm(std::uintptr_t a, std::uintptr_t b, std::uintptr_t c, int64_t m, int64_t n,
               int64_t k, std::uintptr_t stream) {
  check_sizes(m, n, k);
  check_ptr(a, "a");
  check_ptr(b, "b");
  check_ptr(c, "c");
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& ds = device_state();
  auto& slot = ds.plans[PlanKey{m, n, k, 0}];
  if (!slot) {
    auto p = make_int8_plan(ds, m, n, k, CUBLAS_COMPUTE_32I, CUDA_R_32I, CUDA_R_32I);
    choose_algo(ds, *p, p->c, "cublasLtMatmulAlgoGetHeuristic(int8 TN -> int32)");
    slot = std::move(p);
  }
  const Plan& p = *slot;
  const int32_t alpha = 1;
  const int32_t beta = 0;
  run_plan(ds, p, &alpha, &beta, a, b, c, stream, "cublasLtMatmul(int8 TN -> int32)");
}

// Outer-vector scaled int8 GEMM, straight to 16-bit or fp32:
//   out (m, n) = (a_scale (m) x b_scale (n)) * (a @ b^T), scales fp32.
// UNVERIFIED, and possibly unsupported: CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F exists in the
// cuBLASLt headers from 12.9 on (checked: 13.1.0 headers define it, = 3, "only applicable to
// matrices A and B"), and the header does not tie it to a data type, but the cuBLASLt docs list
// scale modes under the FP8/block-scaled sections and say *_SCALE_POINTER values "must have the
// same type as the compute type" for the scalar mode. With CUBLAS_COMPUTE_32I the heuristic may
// well answer CUBLAS_STATUS_NOT_SUPPORTED or find no algorithm; this function then raises with
// cuBLASLt's status, and nothing in kernelbench depends on it. Compute here is CUBLAS_COMPUTE_32I
// with scale type CUDA_R_32F (the documented combination for int8 inputs with non-int32 output).
void int8_gemm_outer_scaled(std::uintptr_t a, std::uintptr_t b, std::uintptr_t a_scale,
                            std::uintptr_t b_scale, std::uintptr_t out, int out_dtype, int64_t m,
                            int64_t n, int64_t k, std::uintptr_t stream) {
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120900
  check_sizes(m, n, k);
  check_ptr(a, "a");
  check_ptr(b, "b");
  check_ptr(out, "out");
  if (!a_scale || !b_scale) throw std::invalid_argument("outer-scaled GEMM: null scale pointer");
  cudaDataType_t d_type;
  if (out_dtype == kFloat16) {
    d_type = CUDA_R_16F;
  } else if (out_dtype == kBFloat16) {
    d_type = CUDA_R_16BF;
  } else if (out_dtype == kFloat32) {
    d_type = CUDA_R_32F;
  } else {
    throw std::invalid_argument("outer-scaled GEMM: out dtype must be fp16, bf16 or fp32");
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& ds = device_state();
  auto& slot = ds.plans[PlanKey{m, n, k, 1 + out_dtype}];
  if (!slot) {
    auto p = make_int8_plan(ds, m, n, k, CUBLAS_COMPUTE_32I, CUDA_R_32F, d_type);
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    set_desc(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode, "set A_SCALE_MODE=OUTER_VEC_32F");
    set_desc(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode, "set B_SCALE_MODE=OUTER_VEC_32F");
    // Placeholder pointers so the heuristic sees scaling enabled; the real ones are set below.
    set_desc(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, as_ptr<const void>(b_scale),
             "set A_SCALE_POINTER");
    set_desc(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, as_ptr<const void>(a_scale),
             "set B_SCALE_POINTER");
    choose_algo(ds, *p, p->c, "cublasLtMatmulAlgoGetHeuristic(int8 outer-vector scaled)");
    slot = std::move(p);
  }
  Plan& p = *slot;
  // op(A) is the weight: its scale vector has n entries (the rows of op(A)); B's has m.
  set_desc(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, as_ptr<const void>(b_scale),
           "set A_SCALE_POINTER");
  set_desc(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, as_ptr<const void>(a_scale),
           "set B_SCALE_POINTER");
  const float alpha = 1.f;
  const float beta = 0.f;
  run_plan(ds, p, &alpha, &beta, a, b, out, stream, "cublasLtMatmul(int8 outer-vector scaled)");
#else
  (void)a, (void)b, (void)a_scale, (void)b_scale, (void)out, (void)out_dtype;
  (void)m, (void)n, (void)k, (void)stream;
  throw std::runtime_error("outer-vector scaling needs cuBLASLt >= 12.9 headers at build time");
#endif
}

py::dict cublaslt_info() {
  py::dict d;
  d["cublaslt_version_runtime"] = static_cast<int64_t>(cublasLtGetVersion());
#ifdef CUBLAS_VERSION
  d["cublas_version_headers"] = static_cast<int64_t>(CUBLAS_VERSION);
#endif
  d["workspace_bytes"] = static_cast<int64_t>(kWorkspaceBytes);
  d["min_alignment_bytes"] = static_cast<int64_t>(kMinAlignment);
  return d;
}

}  // namespace

void register_cublaslt(py::module_& m) {
  m.def("int8_gemm", &int8_gemm, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("m"),
        py::arg("n"), py::arg("k"), py::arg("stream"),
        "c (m, n) int32 = a (m, k) int8 @ b (n, k)^T int8, cuBLASLt TN; k, n multiples of 16, "
        "pointers 16-byte aligned.");
  m.def("int8_gemm_outer_scaled", &int8_gemm_outer_scaled, py::arg("a"), py::arg("b"),
        py::arg("a_scale"), py::arg("b_scale"), py::arg("out"), py::arg("out_dtype"),
        py::arg("m"), py::arg("n"), py::arg("k"), py::arg("stream"),
        "EXPERIMENTAL, UNVERIFIED: out = outer(a_scale, b_scale) * (a @ b^T) through cuBLASLt's "
        "OUTER_VEC_32F scale mode; raises when cuBLASLt does not support it for int8.");
  m.def("cublaslt_info", &cublaslt_info, "cuBLASLt versions (runtime, headers) and settings.");
}

}  // namespace kb
