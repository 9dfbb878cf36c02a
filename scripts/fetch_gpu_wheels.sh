#!/usr/bin/env bash
# Download into .whl/ the wheels that scripts/gpu_check.sh installs offline on a GPU machine
# (python 3.12, manylinux x86_64, torch 2.11 + CUDA 13 preinstalled, no internet).
#
# Only what such an image typically lacks: the build tools (scikit-build-core, pybind11, cmake,
# ninja), pytest + hypothesis, and kernelbench's CLI/report dependencies. nvidia-cublas is NOT
# fetched (~420 MB): torch's CUDA 13 wheel already depends on it, headers included. With
# KB_FETCH_NVCC=1 the nvcc 13.0 toolchain wheels are added too, for images without a CUDA
# toolkit (they make the folder larger than the 60 MiB budget; the script reports the total).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.whl"
mkdir -p "$dest"
py="${PYTHON:-python3}"

pkgs=(
  scikit-build-core==1.1.2 pybind11==3.1.0 cmake==4.4.4 ninja==1.13.2 pathspec==1.1.1
  packaging==26.3
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 hypothesis==6.170.15 sortedcontainers==2.4.0
  typer==0.29.1 click==8.5.1 rich==15.0.0 shellingham==1.5.4 markdown-it-py==4.3.0 mdurl==0.1.2
  pygments==2.21.0
  pandas==3.1.1 python-dateutil==2.9.0.post0 six==1.17.0 tzdata==2025.2
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
