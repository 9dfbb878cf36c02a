#!/usr/bin/env bash
# Download into .whl/ the wheels that scripts/gpu_check.sh installs offline on a GPU machine
# (python 3.12, manylinux x86_64, torch 2.11 + CUDA 13 preinstalled, no internet).
#
# Only what that image lacks (see the list below). nvidia-cublas is NOT fetched (~420 MB):
# torch's CUDA 13 wheel already depends on it, headers included. With
# KB_FETCH_NVCC=1 the nvcc 13.0 toolchain wheels are added too, for images without a CUDA
# toolkit (they make the folder larger than the 60 MiB budget; the script reports the total).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.whl"
mkdir -p "$dest"
py="${PYTHON:-python3}"

# The H200 image already holds torch 2.11, triton, scikit-build-core, pybind11, cmake, ninja,
# pytest, hypothesis, typer, rich, pandas, matplotlib, seaborn, jinja2 and nvidia-cublas
# (device tool's KINDS.md): carry only what it lacks, so no package exists in two versions.
pkgs=(
  nvidia-cutlass==4.2.0.0   # CUTLASS headers for kernelbench._cutlass (~6 MB)
  bitsandbytes==0.50.2      # peer backend (~43 MB)
  torchao==0.18.0           # peer backend (~3 MB)
)
if [[ "${KB_FETCH_NVCC:-0}" == 1 ]]; then
  pkgs+=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
         nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85)
fi

for spec in "${pkgs[@]}"; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 --platform any \
    -d "$dest" "$spec" 2>&1 | grep -v "is ignored: it is neither" || true
  name="${spec%%==*}"
  ls "$dest" | grep -qi "^${name//-/[-_]}-" || { echo "MISSING: $spec" >&2; exit 1; }
done

total=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
echo "fetched ${#pkgs[@]} wheels into $dest: $((total / 1048576)) MiB"
ls -1 "$dest"
if ((total > 60 * 1048576)); then
  echo "WARNING: .whl/ is over 60 MiB" >&2
fi
