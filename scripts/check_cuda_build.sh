#!/usr/bin/env bash
# The CUDA compile check: every CUDA module built through CMake (cmake/cuda.cmake) for sm_80 and
# sm_90a by scripts/prebuild_gpu.sh, which also leaves them in .gpu-prebuilt/ for a GPU window.
exec bash "$(dirname "${BASH_SOURCE[0]}")/prebuild_gpu.sh" "$@"
