// sm_80 instances of the fused int8 GEMM (see cutlass_int8.cuh). UNVERIFIED: compiled only.
//
// CUTLASS 2.x: multistage cp.async mainloop, mma.sync m16n8k32 int8 -> int32 (saturating
// operator), and the 2.x epilogue visitor tree (Sm80EVT, threadblock-level visitors):
//
//   D = [plus]( multiply_add( RowScale, multiplies(ColScale, Acc), Bias ) [, Outlier] )
//
// RowScale = VisitorColBroadcast (one fp32 per output row), ColScale / Bias =
// VisitorRowBroadcast (one fp32 per output column; the bias falls back to 0 for a null pointer),
// Outlier = VisitorAuxLoad of the fp32 (m, n) product, D = VisitorAuxStore (fp16/bf16).
// The 2.x VisitorAuxLoad has no null-pointer fallback (it would read address 0), so the tree
// comes in two variants: with and without the outlier load.
//
// Instances (2 tiles x 2 output types x {outlier, none} = 8):
//   kSmallM: 64 x 128 x 64 threadblock, 32 x 64 x 64 warps (4 warps), 5 stages: decode-sized m.
//   kLarge:  128 x 128 x 64 threadblock, 64 x 64 x 64 warps (4 warps), 4 stages.
// Identity threadblock swizzle (8), GemmUniversalMode::kGemm, no split-k (the visitor epilogue
// does not support it), so no workspace.
// Include order matters for CUTLASS (the visitor headers use names declared elsewhere).
// clang-format off
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/gemm_coord.h>
#include <cute/tensor.hpp>
#include <cutlass/arch/arch.h>
#include <cutlass/arch/mma.h>
#include <cutlass/gemm/device/gemm.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/epilogue/threadblock/fusion/visitors.hpp>
#include <cutlass/gemm/kernel/default_gemm_universal_with_visitor.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle.h>
// clang-format on

#include <utility>

#include "cutlass_int8.cuh"
#include "cutlass_int8_launch.cuh"

namespace kb {
namespace cutlass_int8 {
namespace {

using namespace cute;

// Kernel body for compute capability 8.x only; empty in the sm_90a pass of this file.
template <class Kernel>
struct Sm80Only : Kernel {
  template <class... Args>
  CUTLASS_DEVICE static void invoke(Args&&... args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && __CUDA_ARCH__ < 900
    Kernel::invoke(std::forward<Args>(args)...);
#endif
  }
};

template <class ElementD, class TileShape, class WarpShape, int Stages, bool WithOutlier>
struct Sm80FusedGemm {
  using ElementOut = ElementD;
  using ThreadMap = cutlass::epilogue::threadblock::OutputTileThreadLayout<
      TileShape, WarpShape, float, 4, 1>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using StrideMN = Stride<int64_t, _1, int64_t>;

  using Acc = cutlass::epilogue::threadblock::VisitorAccFetch;
  using RowScale = cutlass::epilogue::threadblock::VisitorColBroadcast<
      ThreadMap, float, Stride<_1, _0, int32_t>, false>;
  using ColScale = cutlass::epilogue::threadblock::VisitorRowBroadcast<
      ThreadMap, float, Stride<_0, _1, int32_t>, false>;
  using Bias = cutlass::epilogue::threadblock::VisitorRowBroadcast<
      ThreadMap, float, Stride<_0, _1, int32_t>, true>;
  using Outlier = cutlass::epilogue::threadblock::VisitorAuxLoad<ThreadMap, float, StrideMN>;

  using Mul = cutlass::epilogue::threadblock::VisitorCompute<
      cutlass::multiplies, float, float, kRound>;
  using Fma = cutlass::epilogue::threadblock::VisitorCompute<
      cutlass::multiply_add, std::conditional_t<WithOutlier, float, ElementD>, float, kRound>;
  using Add = cutlass::epilogue::threadblock::VisitorCompute<
      cutlass::plus, ElementD, float, kRound>;

  using Scaled = cutlass::epilogue::threadblock::Sm80EVT<Mul, ColScale, Acc>;
  using Biased = cutlass::epilogue::threadblock::Sm80EVT<Fma, RowScale, Scaled, Bias>;
  using WithAux = cutlass::epilogue::threadblock::Sm80EVT<Add, Biased, Outlier>;
  using Tree = std::conditional_t<WithOutlier, WithAux, Biased>;

  using Store = cutlass::epilogue::threadblock::VisitorAuxStore<ThreadMap, ElementD, kRound,
                                                                 StrideMN>;
  using TreeD = cutlass::epilogue::threadblock::Sm80EVT<Store, Tree>;

  using Kernel = Sm80Only<typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
      int8_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 16,
      int8_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 16,
      float, cutlass::layout::RowMajor, 4,
      int32_t, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      TileShape, WarpShape, cutlass::gemm::GemmShape<16, 8, 32>, TreeD,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>, Stages,
      cutlass::arch::OpMultiplyAddSaturate, 1>::GemmKernel>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Config>
typename Config::Tree::Arguments tree_args(const Problem& p, typename Config::StrideMN s_mn) {
  typename Config::Scaled::Arguments scaled{{p.col_scale}, {}, {}};
  typename Config::Biased::Arguments biased{{p.row_scale}, scaled, {p.bias}, {}};
  if constexpr (std::is_same_v<typename Config::Tree, typename Config::WithAux>) {
    return {biased, {const_cast<float*>(p.outlier), 0.f, s_mn}, {}};
  } else {
    (void)s_mn;
    return biased;
  }
}

template <class Config>
void run_instance(const Problem& p) {
  using Gemm = typename Config::Gemm;
  static thread_local InitializedGemm<Gemm> cached;
  if (launch_cached(cached, p, "sm80")) return;
  typename Config::StrideMN s_mn{int64_t(p.n), _1{}, int64_t(p.m) * p.n};
  typename Config::TreeD::Arguments epilogue{
      tree_args<Config>(p, s_mn),
      {static_cast<typename Config::ElementOut*>(p.out), s_mn}};

  typename Gemm::Arguments args(cutlass::gemm::GemmUniversalMode::kGemm,
                                cutlass::gemm::GemmCoord{p.m, p.n, p.k}, 1, epilogue, p.a, p.b,
                                nullptr, nullptr, 0, 0, 0, 0, p.k, p.k, p.n, p.n);
  cutlass_check(cached.gemm.can_implement(args), "sm80", "can_implement");
  if (Gemm::get_workspace_size(args) != 0) {
    throw std::runtime_error("CUTLASS sm80: unexpected workspace request");
  }
  initialize_and_launch(cached, p, args, nullptr, "sm80");
}

using TileSmall = cutlass::gemm::GemmShape<64, 128, 64>;
using WarpSmall = cutlass::gemm::GemmShape<32, 64, 64>;
using TileLarge = cutlass::gemm::GemmShape<128, 128, 64>;
using WarpLarge = cutlass::gemm::GemmShape<64, 64, 64>;

// The instance of one output type and outlier variant for the tile.
template <class ElementD, bool WithOutlier>
struct Sm80Launch {
  static void run(const Problem& p, int tile) {
    if (tile == kSmallM) {
      run_instance<Sm80FusedGemm<ElementD, TileSmall, WarpSmall, 5, WithOutlier>>(p);
    } else {
      run_instance<Sm80FusedGemm<ElementD, TileLarge, WarpLarge, 4, WithOutlier>>(p);
    }
  }
};

}  // namespace

void run_sm80(const Problem& p, int out_dtype, int tile) {
  run_dispatched<Sm80Launch, cutlass::half_t, cutlass::bfloat16_t>("sm80", p, out_dtype, tile);
}

const char* sm80_instances() {
  return "sm80 {fp16,bf16} x {outlier load, none} x {small_m: 64x128x64 warps 32x64x64 5 "
         "stages, large: 128x128x64 warps 64x64x64 4 stages}, mma.sync 16x8x32";
}

}  // namespace cutlass_int8
}  // namespace kb
