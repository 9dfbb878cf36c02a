// Element type codes shared by every kernelbench extension (kernelbench._cpu, _cuda, _cutlass)
// and their Python wrappers (kernelbench.cpu_ext, kernelbench.cuda_ext, kernelbench.cutlass_ext,
// which read the codes from the modules' FLOAT32 / FLOAT16 / BFLOAT16 attributes).
#pragma once

namespace kb {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

inline constexpr int dtype_code(DType d) { return static_cast<int>(d); }

}  // namespace kb
