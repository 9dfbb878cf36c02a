#!/usr/bin/env bash
# Download into .whl/ the wheels that scripts/gpu_check.sh installs offline on a GPU machine
# (python 3.12, manylinux x86_64, torch 2.11 + CUDA 13 preinstalled, no internet), check that
# each one is there in the pinned version, and print the carried total (scripts/carried_size.sh).
#
# Only what that image lacks (see the list below). nvidia-cublas is NOT fetched (~420 MB):
# torch's CUDA 13 wheel already depends on it. With KB_FETCH_NVCC=1 the nvcc 13.0 toolchain
# wheels are added too, for images without a CUDA toolkit (over the 60 MiB budget).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.whl"
mkdir -p "$dest"
py="${PYTHON:-python3}"

# The H200 image already holds torch 2.11, triton, scikit-build-core, pybind11, cmake, ninja,
# pytest, hypothesis, typer, rich, pandas, matplotlib, seaborn, jinja2 and nvidia-cublas:
# carry only what it lacks, so no package exists in two versions.
pkgs=(
  nvidia-cutlass==4.2.0.0   # CUTLASS headers, for a fallback build on the device (~6 MB)
  bitsandbytes==0.50.2      # peer backend (~43 MB; a manylinux_2_24 wheel only)
  torchao==0.18.0           # peer backend (~3 MB)
)
if [[ "${KB_FETCH_NVCC:-0}" == 1 ]]; then
  pkgs+=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
         nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85)
fi
platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
           manylinux_2_17_x86_64 manylinux2014_x86_64 any)

missing=0
for spec in "${pkgs[@]}"; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]/#/--platform=}" -d "$dest" "$spec" 2>&1 |
    grep -v "is ignored: it is neither" || true
  name="${spec%%==*}" version="${spec##*==}"
  # Wheel file names spell the project name with underscores: nvidia_cutlass-4.2.0.0-....whl
  if ! compgen -G "$dest/${name//-/_}-${version}-*.whl" >/dev/null; then
    echo "MISSING: $spec (no ${name//-/_}-${version}-*.whl in $dest)" >&2
    missing=1
  fi
done
((missing == 0)) || exit 1

echo "wheels in $dest:"
ls -1 "$dest"
bash "$root/scripts/carried_size.sh" || echo "WARNING: over the carry budget" >&2
