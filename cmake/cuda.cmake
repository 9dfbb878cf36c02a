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
if(NOT DEFINED KERNELBENCH_CUBLAS_ROOT AND DEFINED ENV{KERNELBENCH_CUBLAS_ROOT})
  set(KERNELBENCH_CUBLAS_ROOT "$ENV{KERNELBENCH_CUBLAS_ROOT}")
endif()
set(_kb_cublas_roots "")
if(KERNELBENCH_CUBLAS_ROOT)
  list(APPEND _kb_cublas_roots "${KERNELBENCH_CUBLAS_ROOT}")
endif()
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
          "import os, sys\nfor p in sys.path:\n    for s in ('cu13', 'cublas'):\n        d = os.path.join(p or '.', 'nvidia', s)\n        if os.path.isfile(os.path.join(d, 'include', 'cublasLt.h')): print(os.path.abspath(d))"
  RESULT_VARIABLE _kb_py_rc
  OUTPUT_VARIABLE _kb_py_roots
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(_kb_py_rc EQUAL 0 AND _kb_py_roots)
  string(REPLACE "\n" ";" _kb_py_roots "${_kb_py_roots}")
  list(APPEND _kb_cublas_roots ${_kb_py_roots})
endif()

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

# --- the module ------------------------------------------------------------------------------
# NO_EXTRAS: keep pybind11's host-only flags (LTO, strip) off the nvcc command line.
pybind11_add_module(_cuda MODULE NO_EXTRAS csrc/cuda_int8.cu csrc/cublaslt_int8.cu)
set_target_properties(_cuda PROPERTIES
  CUDA_ARCHITECTURES OFF
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_RUNTIME_LIBRARY Static
  CXX_VISIBILITY_PRESET hidden
  CUDA_VISIBILITY_PRESET hidden
  # At run time torch has normally loaded libcublasLt already (same soname); the rpath covers a
  # bare import: the build-time library folder, and the wheel layout next to site-packages.
  INSTALL_RPATH "$ORIGIN/../nvidia/cu13/lib;$ORIGIN/../nvidia/cublas/lib;${_kb_cublas_libdir}"
  BUILD_RPATH "${_kb_cublas_libdir}")
target_include_directories(_cuda PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/csrc")
target_compile_options(_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_80,code=sm_80>
  $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a>
  $<$<COMPILE_LANGUAGE:CUDA>:-O3>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fvisibility=hidden>)
target_link_libraries(_cuda PRIVATE kb_cublaslt CUDA::cudart_static)
install(TARGETS _cuda LIBRARY DESTINATION kernelbench)
message(STATUS "kernelbench: building kernelbench._cuda for sm_80 and sm_90a")
