// The launch path shared by the sm80 and sm90 instances of the fused int8 GEMM: status checks
// and the per-thread kernel cache (InitializedGemm, see cutlass_int8.cuh). Include after the
// CUTLASS headers; Gemm is a cutlass::gemm::device::GemmUniversalAdapter.
#pragma once

#include <stdexcept>
#include <string>

#include "cutlass_int8.cuh"

namespace kb {
namespace cutlass_int8 {

// Throws "CUTLASS <arch> <what>: <status>" unless the call succeeded.
inline void cutlass_check(cutlass::Status st, const char* arch, const char* what) {
  if (st != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("CUTLASS ") + arch + " " + what + ": " +
                             cutlassGetStatusString(st));
  }
}

// Runs the initialized kernel on p's stream and checks the launch.
template <class Gemm>
void launch(InitializedGemm<Gemm>& cached, const Problem& p, const char* arch) {
  cutlass_check(cached.gemm.run(p.stream), arch, "run");
  check_cuda(cudaGetLastError(), (std::string("CUTLASS ") + arch + " kernel launch").c_str());
}

// Launches the cached kernel when it was initialized for this very problem; false (nothing
// launched) otherwise.
template <class Gemm>
bool launch_cached(InitializedGemm<Gemm>& cached, const Problem& p, const char* arch) {
  if (!cached.valid || !same_problem(cached.problem, p)) return false;
  launch(cached, p, arch);
  return true;
}

// Initializes the kernel for p (the cache is invalid until that succeeds), then launches it.
template <class Gemm>
void initialize_and_launch(InitializedGemm<Gemm>& cached, const Problem& p,
                           const typename Gemm::Arguments& args, void* workspace,
                           const char* arch) {
  cached.valid = false;
  cutlass_check(cached.gemm.initialize(args, workspace, p.stream), arch, "initialize");
  cached.problem = p;
  cached.valid = true;
  launch(cached, p, arch);
}

}  // namespace cutlass_int8
}  // namespace kb
