# CUDA extension kernelbench._cuda (included from CMakeLists.txt after Python and pybind11 are
# found). One pybind11 module from csrc/cuda_int8.cu (quantize/dequantize kernels) and
# csrc/cublaslt_int8.cu (cuBLASLt int8 GEMM). No torch headers: it builds beside a CPU torch.
#
# KERNELBENCH_CUDA:
#   OFF   skip.
#   ON    required: a missing CUDA compiler or cuBLASLt is a configure error.
#   AUTO  build only when a CUDA compiler is found AND the target Python's torch is a CUDA build
#         (torch.version.cuda is not None); otherwise skip with a message.
#
# cuBLASLt (headers + library) is searched, in order, in:
#   KERNELBENCH_CUBLAS_ROOT (CMake variable or environment variable): a folder with include/
#     and lib/ (for example site-packages/nvidia/cu13 of the nvidia-cublas wheel);
#   the target Python's site-packages: nvidia/cu13, then nvidia/cublas (the cu12 wheels);
#   the CUDA toolkit (CUDA::cublasLt).
# Architectures: sm_80 and sm_90a (CUDA_ARCHITECTURES is OFF; the -gencode flags are explicit).
# Every CUDA module is made by kb_cuda_module() with the one flag list KERNELBENCH_CUDA_FLAGS;
# scripts/prebuild_gpu.sh (also the CI compile check) builds through this file.
# A second module, kernelbench._cutlass (csrc/cutlass_int8*.cu), is built when the CUTLASS
# headers are found (see the CUTLASS section at the end).

string(TOUPPER "${KERNELBENCH_CUDA}" _kb_cuda_mode)
if(NOT _kb_cuda_mode MATCHES "^(ON|OFF|AUTO)$")
  message(FATAL_ERROR "KERNELBENCH_CUDA must be ON, OFF or AUTO, got '${KERNELBENCH_CUDA}'")
endif()

macro(_kb_cuda_skip reason)
  if(_kb_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "KERNELBENCH_CUDA=ON but ${reason}")
  endif()
  message(STATUS "kernelbench: CUDA extension skipped: ${reason}")
  return()
endmacro()

if(_kb_cuda_mode STREQUAL "OFF")
  message(STATUS "kernelbench: CUDA extension skipped: KERNELBENCH_CUDA=OFF")
  return()
endif()

# torch in the target Python: AUTO builds only for a CUDA torch; ON only reports it.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import torch; print(torch.version.cuda)"
  RESULT_VARIABLE _kb_torch_rc
  OUTPUT_VARIABLE _kb_torch_cuda
  ERROR_VARIABLE _kb_torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _kb_torch_rc EQUAL 0)
  set(_kb_torch_cuda "")
  set(_kb_torch_note "torch is not importable in the build environment")
elseif(_kb_torch_cuda STREQUAL "None" OR _kb_torch_cuda STREQUAL "")
  set(_kb_torch_cuda "")
  set(_kb_torch_note "torch in ${Python_EXECUTABLE} is a CPU build (torch.version.cuda is None)")
else()
  set(_kb_torch_note "torch in ${Python_EXECUTABLE} is built for CUDA ${_kb_torch_cuda}")
endif()
if(_kb_cuda_mode STREQUAL "AUTO" AND _kb_torch_cuda STREQUAL "")
  message(STATUS "kernelbench: CUDA extension skipped (KERNELBENCH_CUDA=AUTO): ${_kb_torch_note}"
                 " (set KERNELBENCH_CUDA=ON to build it anyway)")
  return()
endif()
message(STATUS "kernelbench: ${_kb_torch_note}")

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  _kb_cuda_skip("no CUDA compiler was found (set CUDACXX or put nvcc on PATH)")
endif()

# --- cuBLASLt --------------------------------------------------------------------------------
# _kb_candidate_roots(OUT VAR PROBE): the folders where an optional dependency may be, in order:
# VAR (a CMake variable, else the environment variable of that name) when set, then each folder
# the Python snippet PROBE prints (one a line) when run by the target Python.
function(_kb_candidate_roots out var probe)
  set(roots "")
  set(given "${${var}}")
  if(NOT DEFINED ${var} AND DEFINED ENV{${var}})
    set(given "$ENV{${var}}")
  endif()
  if(given)
    list(APPEND roots "${given}")
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "${probe}"
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE found
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc EQUAL 0 AND found)
    string(REPLACE "\n" ";" found "${found}")
    list(APPEND roots ${found})
  endif()
  set(${out} "${roots}" PARENT_SCOPE)
endfunction()

_kb_candidate_roots(_kb_cublas_roots KERNELBENCH_CUBLAS_ROOT
  "import os, sys\nfor p in sys.path:\n    for s in ('cu13', 'cublas'):\n        d = os.path.join(p or '.', 'nvidia', s)\n        if os.path.isfile(os.path.join(d, 'include', 'cublasLt.h')): print(os.path.abspath(d))")

set(_kb_cublas_inc "")
set(_kb_cublas_lib "")
foreach(_root IN LISTS _kb_cublas_roots)
  if(EXISTS "${_root}/include/cublasLt.h")
    find_library(_kb_cublaslt_in_root
      NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12
      PATHS "${_root}/lib" "${_root}/lib64" NO_DEFAULT_PATH NO_CACHE)
    if(_kb_cublaslt_in_root)
      set(_kb_cublas_inc "${_root}/include")
      set(_kb_cublas_lib "${_kb_cublaslt_in_root}")
      break()
    endif()
  endif()
endforeach()

enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

if(_kb_cublas_lib)
  add_library(kb_cublaslt SHARED IMPORTED)
  set_target_properties(kb_cublaslt PROPERTIES
    IMPORTED_LOCATION "${_kb_cublas_lib}"
    INTERFACE_INCLUDE_DIRECTORIES "${_kb_cublas_inc}")
  get_filename_component(_kb_cublas_libdir "${_kb_cublas_lib}" DIRECTORY)
  message(STATUS "kernelbench: cuBLASLt from ${_kb_cublas_lib}")
elseif(TARGET CUDA::cublasLt)
  add_library(kb_cublaslt INTERFACE IMPORTED)
  target_link_libraries(kb_cublaslt INTERFACE CUDA::cublasLt)
  set(_kb_cublas_libdir "${CUDAToolkit_LIBRARY_DIR}")
  message(STATUS "kernelbench: cuBLASLt from the CUDA toolkit (${CUDAToolkit_LIBRARY_DIR})")
else()
  _kb_cuda_skip("cuBLASLt was not found (pip install nvidia-cublas, or set KERNELBENCH_CUBLAS_ROOT \
to a folder with include/cublasLt.h and lib/libcublasLt.so*)")
endif()

# --- the modules -----------------------------------------------------------------------------
# One flag list for every CUDA translation unit. NDEBUG keeps CUTLASS's host asserts out;
# CUTLASS needs --expt-relaxed-constexpr.
set(KERNELBENCH_CUDA_FLAGS
  -gencode=arch=compute_80,code=sm_80
  -gencode=arch=compute_90a,code=sm_90a
  -O3 -DNDEBUG --expt-relaxed-constexpr
  -Xcompiler=-fvisibility=hidden -Xcompiler=-Wall)
set(_kb_root "${CMAKE_CURRENT_LIST_DIR}/..")

# kb_cuda_module(NAME SOURCES <.cu files> [INCLUDES <dirs>] [LIBS <targets>] [RPATH <dirs>])
# A pybind11 module kernelbench.NAME: static CUDA runtime, hidden symbols, installed into
# kernelbench/. NO_EXTRAS keeps pybind11's host-only flags (LTO, strip) off the nvcc line.
function(kb_cuda_module name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;INCLUDES;LIBS;RPATH")
  list(TRANSFORM arg_SOURCES PREPEND "${_kb_root}/")
  pybind11_add_module(${name} MODULE NO_EXTRAS ${arg_SOURCES})
  set_target_properties(${name} PROPERTIES
    CUDA_ARCHITECTURES OFF
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON
    CUDA_RUNTIME_LIBRARY Static
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    # The built file already carries its final rpath: copied or installed, nothing rewrites it.
    BUILD_WITH_INSTALL_RPATH ON
    INSTALL_RPATH "${arg_RPATH}")
  target_include_directories(${name} PRIVATE "${_kb_root}/csrc" ${arg_INCLUDES})
  target_compile_options(${name} PRIVATE
    "$<$<COMPILE_LANGUAGE:CUDA>:${KERNELBENCH_CUDA_FLAGS}>")
  target_link_libraries(${name} PRIVATE CUDA::cudart_static ${arg_LIBS})
  install(TARGETS ${name} LIBRARY DESTINATION kernelbench)
  message(STATUS "kernelbench: building kernelbench.${name} for sm_80 and sm_90a")
endfunction()

# At run time torch has normally loaded libcublasLt already (same soname); the rpath covers a
# bare import: the wheel layout next to site-packages, and the build-time library folder.
kb_cuda_module(_cuda SOURCES csrc/cuda_int8.cu csrc/cublaslt_int8.cu LIBS kb_cublaslt
  RPATH "$ORIGIN/../nvidia/cu13/lib;$ORIGIN/../nvidia/cublas/lib;${_kb_cublas_libdir}")

# --- CUTLASS: kernelbench._cutlass (optional) -------------------------------------------------
# The fused int8 GEMM (csrc/cutlass_int8*.cu) needs the CUTLASS headers (include/ and
# tools/util/include/), searched in order in:
#   KERNELBENCH_CUTLASS_ROOT (CMake or environment variable): a CUTLASS checkout or the
#     extracted headers (a folder with include/cutlass/cutlass.h);
#   the target Python's nvidia-cutlass wheel (site-packages/cutlass_library/source);
#   ~/.cache/kernelbench/cutlass-* (what scripts/prebuild_gpu.sh extracts from that wheel).
# Not found: the module is skipped with a message (the rest of kernelbench._cuda is unaffected).
_kb_candidate_roots(_kb_cutlass_roots KERNELBENCH_CUTLASS_ROOT
  "import os, sys\nfor p in sys.path:\n    d = os.path.join(p or '.', 'cutlass_library', 'source')\n    if os.path.isfile(os.path.join(d, 'include', 'cutlass', 'cutlass.h')): print(os.path.abspath(d))")
if(DEFINED ENV{HOME})
  file(GLOB _kb_cutlass_cached LIST_DIRECTORIES true "$ENV{HOME}/.cache/kernelbench/cutlass-*")
  list(SORT _kb_cutlass_cached ORDER DESCENDING)
  list(APPEND _kb_cutlass_roots ${_kb_cutlass_cached})
endif()
set(_kb_cutlass_root "")
foreach(_root IN LISTS _kb_cutlass_roots)
  if(EXISTS "${_root}/include/cutlass/cutlass.h")
    set(_kb_cutlass_root "${_root}")
    break()
  endif()
endforeach()
if(NOT _kb_cutlass_root)
  message(STATUS "kernelbench: kernelbench._cutlass skipped: CUTLASS headers not found (set "
                 "KERNELBENCH_CUTLASS_ROOT, pip install nvidia-cutlass, or run "
                 "scripts/prebuild_gpu.sh once to fill ~/.cache/kernelbench)")
  return()
endif()
kb_cuda_module(_cutlass
  SOURCES csrc/cutlass_int8.cu csrc/cutlass_int8_sm80.cu csrc/cutlass_int8_sm90.cu
  INCLUDES "${_kb_cutlass_root}/include" "${_kb_cutlass_root}/tools/util/include")
message(STATUS "kernelbench: CUTLASS from ${_kb_cutlass_root}")
