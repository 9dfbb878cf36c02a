// sm_90a instances of the fused int8 GEMM (see cutlass_int8.cuh). UNVERIFIED: compiled only.
//
// CUTLASS 3.x: collective builders, TMA loads + wgmma (int8 x int8 -> int32), warp-specialized
// kernel schedule, persistent tile scheduler, and an epilogue visitor tree (EVT):
//
//   D = [plus]( multiply_add( RowScale, multiplies(ColScale, Acc), Bias ) [, Outlier] ) -> fp16/bf16
//
// RowScale  = Sm90ColBroadcast: one fp32 per output ROW (the activation absmax), M-stride 1.
// ColScale  = Sm90RowBroadcast: one fp32 per output COLUMN (weight absmax * 1/127^2).
// Bias      = Sm90RowBroadcast with a null-pointer fallback to 0 (bias is optional).
// Outlier   = Sm90AuxLoad (TMA) of the fp32 (m, n) outlier product. Its smem layout and S2R
//             copy come from CUTLASS's EpilogueDescriptor / AuxLoadDescriptor helpers. The tree
//             comes in two variants, with and without this node: a call without outlier
//             columns never builds a TMA descriptor from a null pointer (as in the sm80 code).
// Acc is converted int32 -> fp32 by the first compute node (exact below 2^24, then rounded the
// way torch's acc.float() rounds).
//
// Instances (2 tiles x 2 output types x {outlier, none} = 8):
//   kSmallM: 64 x 128 x 128 tile, cluster 1x1x1, KernelTmaWarpSpecialized (one consumer
//            warpgroup, persistent scheduler as below): decode-sized m (<= 64) wastes at most
//            half of a 128-row tile.
//   kLarge:  128 x 128 x 128 tile, cluster 1x1x1, KernelTmaWarpSpecializedCooperative (two
//            consumer warpgroups on one tile): the usual large-GEMM int8 shape.
// Cluster 1x1x1 keeps every m and n legal (no cluster-divisibility launch constraint).
// Include order matters for CUTLASS (the fusion headers use names declared elsewhere).
// clang-format off
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/numeric_conversion.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/util/packed_stride.hpp>
// clang-format on

#include <type_traits>
#include <utility>

#include "cutlass_int8.cuh"
#include "cutlass_int8_launch.cuh"

namespace kb {
namespace cutlass_int8 {
namespace {

using namespace cute;

// The kernel body exists for sm_90 only; for the sm_80 pass of the same file it is empty, which
// keeps the fatbin small and the compile short. run_sm90 refuses other architectures at run time.
template <class Kernel>
struct Sm90Only : Kernel {
  template <class... Args>
  CUTLASS_DEVICE void operator()(Args&&... args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1000
    Kernel::operator()(std::forward<Args>(args)...);
#endif
  }
};

template <class ElementD, class TileShape, class ClusterShape, class KernelSchedule,
          class EpilogueSchedule, bool WithOutlier>
struct Sm90FusedGemm {
  using ElementAB = int8_t;
  using ElementAcc = int32_t;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;  // (n, k) row-major == k x n column-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementAB>::value;  // 16
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;    // 8

  using EpiDesc = cutlass::epilogue::collective::detail::EpilogueDescriptor<
      TileShape, cutlass::epilogue::collective::EpilogueTileAuto, void, ElementD,
      EpilogueSchedule>;
  using AuxDesc =
      cutlass::epilogue::collective::detail::AuxLoadDescriptor<EpiDesc, LayoutD, float>;

  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  using RowScale = cutlass::epilogue::fusion::Sm90ColBroadcast<
      0, TileShape, float, float, Stride<_1, _0, _0>, 4, false>;
  using ColScale = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, TileShape, float, float, Stride<_0, _1, _0>, 4, false>;
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, TileShape, float, float, Stride<_0, _1, _0>, 4, true>;
  using Outlier = cutlass::epilogue::fusion::Sm90AuxLoad<
      AuxDesc::Stages, typename EpiDesc::EpilogueTile, float, typename AuxDesc::Stride,
      typename AuxDesc::SmemLayoutAtom, typename AuxDesc::CopyOpS2R, 4, true>;

  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Mul = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>;
  // Without the outlier node the multiply_add is the root and writes ElementD itself.
  using Fma = cutlass::epilogue::fusion::Sm90Compute<
      cutlass::multiply_add, std::conditional_t<WithOutlier, float, ElementD>, float, kRound>;
  using Add = cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElementD, float, kRound>;

  using Scaled = cutlass::epilogue::fusion::Sm90EVT<Mul, ColScale, Acc>;
  using Biased = cutlass::epilogue::fusion::Sm90EVT<Fma, RowScale, Scaled, Bias>;
  using WithAux = cutlass::epilogue::fusion::Sm90EVT<Add, Biased, Outlier>;
  using Tree = std::conditional_t<WithOutlier, WithAux, Biased>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, LayoutD, kAlignD,
      ElementD, LayoutD, kAlignD, EpilogueSchedule, Tree>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, kAlignAB,
      ElementAB, LayoutB, kAlignAB, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = Sm90Only<cutlass::gemm::kernel::GemmUniversal<
      Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
      cutlass::gemm::PersistentScheduler>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Config>
constexpr bool WithOutlierTree = std::is_same_v<typename Config::Tree, typename Config::WithAux>;

template <class Config>
void run_instance(const Problem& p) {
  using Gemm = typename Config::Gemm;
  static thread_local InitializedGemm<Gemm> cached;
  if (launch_cached(cached, p, "sm90")) return;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using ElementD = typename Gemm::ElementD;

  StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, make_shape(p.m, p.k, 1));
  StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, make_shape(p.n, p.k, 1));
  StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, make_shape(p.m, p.n, 1));
  StrideC sc = cutlass::make_cute_packed_stride(StrideC{}, make_shape(p.m, p.n, 1));
  // EVT arguments mirror the tree: {children..., node op}.
  typename Config::Scaled::Arguments scaled{{p.col_scale}, {}, {}};
  typename Config::Biased::Arguments biased{{p.row_scale}, scaled, {p.bias}, {}};
  typename Config::Tree::Arguments tree = [&] {
    if constexpr (WithOutlierTree<Config>) {
      typename Config::AuxDesc::Stride s_aux{};
      s_aux = cutlass::make_cute_packed_stride(s_aux, make_shape(p.m, p.n, 1));
      return typename Config::Tree::Arguments{biased, {p.outlier, 0.f, s_aux}, {}};
    } else {
      return biased;
    }
  }();

  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {p.m, p.n, p.k, 1},
      {p.a, sa, p.b, sb},
      {tree, nullptr, sc, static_cast<ElementD*>(p.out), sd}};

  cutlass_check(cached.gemm.can_implement(args), "sm90", "can_implement");
  cached.valid = false;
  if (cached.workspace) {
    check_cuda(cudaFreeAsync(cached.workspace, cached.workspace_stream), "cudaFreeAsync(workspace)");
    cached.workspace = nullptr;
  }
  const size_t ws_bytes = Gemm::get_workspace_size(args);
  if (ws_bytes) {
    check_cuda(cudaMallocAsync(&cached.workspace, ws_bytes, p.stream), "cudaMallocAsync(workspace)");
    cached.workspace_stream = p.stream;
  }
  initialize_and_launch(cached, p, args, cached.workspace, "sm90");
}

using TileSmall = Shape<_64, _128, _128>;
using TileLarge = Shape<_128, _128, _128>;
using Cluster1 = Shape<_1, _1, _1>;
using SchedSmall = cutlass::gemm::KernelTmaWarpSpecialized;
using EpiSmall = cutlass::epilogue::TmaWarpSpecialized;
using SchedLarge = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpiLarge = cutlass::epilogue::TmaWarpSpecializedCooperative;

// The instance of one output type and outlier variant for the tile.
template <class ElementD, bool WithOutlier>
struct Sm90Launch {
  static void run(const Problem& p, int tile) {
    if (tile == kSmallM) {
      run_instance<
          Sm90FusedGemm<ElementD, TileSmall, Cluster1, SchedSmall, EpiSmall, WithOutlier>>(p);
    } else {
      run_instance<
          Sm90FusedGemm<ElementD, TileLarge, Cluster1, SchedLarge, EpiLarge, WithOutlier>>(p);
    }
  }
};

}  // namespace

void run_sm90(const Problem& p, int out_dtype, int tile) {
  run_dispatched<Sm90Launch, cutlass::half_t, cutlass::bfloat16_t>("sm90", p, out_dtype, tile);
}

const char* sm90_instances() {
  return "sm90 {fp16,bf16} x {outlier load, none} x {small_m: 64x128x128 "
         "TmaWarpSpecialized, large: 128x128x128 TmaWarpSpecializedCooperative}, cluster 1x1x1, "
         "persistent";
}

}  // namespace cutlass_int8
}  // namespace kb
