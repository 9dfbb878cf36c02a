#!/usr/bin/env bash
# Compile check of the CUDA sources: every csrc/*.cu, for sm_80 and sm_90a, with -DNDEBUG,
# nvcc -c into a temporary folder (nothing is linked, nothing runs on a GPU). CI runs it.
#
# Needs nvcc (CUDACXX, PATH or /usr/local/cuda/bin) and the cuBLASLt headers, found in order in
# KERNELBENCH_CUBLAS_ROOT/include, the CUDA toolkit, the Python's site-packages
# (nvidia/cu13 or nvidia/cublas), or a cache that this script fills from the nvidia-cublas wheel
# on PyPI (headers only are kept; the wheel itself is ~420 MB and deleted after extraction).
# pybind11 headers come from the Python, else from a pip --target install in the same cache.
# CUTLASS headers (for csrc/cutlass_int8*.cu) come from KERNELBENCH_CUTLASS_ROOT, the Python's
# nvidia-cutlass wheel (site-packages/cutlass_library/source), or a cache that this script fills
# from that wheel on PyPI (~6 MB; include/ and tools/util/include/ are kept).
#
# Env: NVCC_JOBS (parallel nvcc processes, default nproc), NVIDIA_CUBLAS_VERSION (wheel pin),
#      NVIDIA_CUTLASS_VERSION (wheel pin), KB_CUDA_CACHE (cache folder, default
#      ~/.cache/kernelbench).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
cache="${KB_CUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kernelbench}"
cublas_version="${NVIDIA_CUBLAS_VERSION:-13.1.0.3}"
cutlass_version="${NVIDIA_CUTLASS_VERSION:-4.2.0.0}"

say() { printf '[check_cuda_build] %s\n' "$*"; }
die() { printf '[check_cuda_build] ERROR: %s\n' "$*" >&2; exit 1; }

# --- nvcc ----------------------------------------------------------------------------------
nvcc="${CUDACXX:-}"
[[ -z "$nvcc" ]] && nvcc="$(command -v nvcc || true)"
[[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n "$nvcc" && -x "$nvcc" ]] || die "nvcc not found (set CUDACXX or put nvcc on PATH)"
say "nvcc: $nvcc ($("$nvcc" --version | grep -o 'release [0-9.]*' || echo '?'))"
cuda_home="$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)"

# --- cuBLASLt headers ----------------------------------------------------------------------
cublas_inc=""
if [[ -n "${KERNELBENCH_CUBLAS_ROOT:-}" && -f "$KERNELBENCH_CUBLAS_ROOT/include/cublasLt.h" ]]; then
  cublas_inc="$KERNELBENCH_CUBLAS_ROOT/include"
elif [[ -f "$cuda_home/include/cublasLt.h" ]]; then
  cublas_inc="$cuda_home/include"
else
  cublas_inc="$("$py" - <<'EOF' || true
import os, sys
for p in sys.path:
    for s in ("cu13", "cublas"):
        d = os.path.join(p or ".", "nvidia", s, "include")
        if os.path.isfile(os.path.join(d, "cublasLt.h")):
            print(os.path.abspath(d))
            raise SystemExit
EOF
)"
fi
if [[ -z "$cublas_inc" ]]; then
  dest="$cache/cublas-headers-$cublas_version"
  if [[ ! -f "$dest/include/cublasLt.h" ]]; then
    say "cuBLASLt headers not found: fetching nvidia-cublas==$cublas_version from PyPI (headers only kept)"
    tmp_whl="$(mktemp -d)"
    "$py" -m pip download -q --no-deps --only-binary=:all: -d "$tmp_whl" \
      "nvidia-cublas==$cublas_version" || { rm -rf "$tmp_whl"; die "pip download nvidia-cublas failed"; }
    mkdir -p "$dest/include"
    "$py" - "$tmp_whl" "$dest/include" <<'EOF' || { rm -rf "$tmp_whl"; die "extracting headers failed"; }
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if "/include/" in name and name.endswith(".h"):
            with open(os.path.join(sys.argv[2], os.path.basename(name)), "wb") as f:
                f.write(z.read(name))
EOF
    rm -rf "$tmp_whl"
  fi
  cublas_inc="$dest/include"
fi
[[ -f "$cublas_inc/cublasLt.h" ]] || die "no cublasLt.h in $cublas_inc"
say "cuBLASLt headers: $cublas_inc ($(grep -m1 -o 'CUBLAS_VER_MAJOR [0-9]*' "$cublas_inc/cublas_api.h" 2>/dev/null || echo 'version ?'))"

# --- Python and pybind11 headers -----------------------------------------------------------
py_inc="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
[[ -f "$py_inc/Python.h" ]] || die "Python.h not found in $py_inc (install the Python dev headers)"
pb_inc="$("$py" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null || true)"
if [[ -z "$pb_inc" ]]; then
  if [[ ! -d "$cache/pybind11/pybind11" ]]; then
    say "pybind11 not importable: pip install --target $cache/pybind11 pybind11"
    "$py" -m pip install -q --no-deps --target "$cache/pybind11" "pybind11>=2.12" \
      || die "pip install pybind11 failed"
  fi
  pb_inc="$(PYTHONPATH="$cache/pybind11" "$py" -c 'import pybind11; print(pybind11.get_include())')"
fi
say "pybind11 headers: $pb_inc"

# --- CUTLASS headers -----------------------------------------------------------------------
cutlass_root=""
if [[ -n "${KERNELBENCH_CUTLASS_ROOT:-}" && -f "$KERNELBENCH_CUTLASS_ROOT/include/cutlass/cutlass.h" ]]; then
  cutlass_root="$KERNELBENCH_CUTLASS_ROOT"
else
  cutlass_root="$("$py" - <<'EOF' || true
import os, sys
for p in sys.path:
    d = os.path.join(p or ".", "cutlass_library", "source")
    if os.path.isfile(os.path.join(d, "include", "cutlass", "cutlass.h")):
        print(os.path.abspath(d))
        raise SystemExit
EOF
)"
fi
if [[ -z "$cutlass_root" ]]; then
  cutlass_root="$cache/cutlass-$cutlass_version"
  if [[ ! -f "$cutlass_root/include/cutlass/cutlass.h" ]]; then
    say "CUTLASS headers not found: fetching nvidia-cutlass==$cutlass_version from PyPI (headers only kept)"
    tmp_whl="$(mktemp -d)"
    "$py" -m pip download -q --no-deps --only-binary=:all: -d "$tmp_whl" \
      "nvidia-cutlass==$cutlass_version" || { rm -rf "$tmp_whl"; die "pip download nvidia-cutlass failed"; }
    "$py" - "$tmp_whl" "$cutlass_root" <<'EOF' || { rm -rf "$tmp_whl"; die "extracting CUTLASS headers failed"; }
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
keep = {"cutlass_library/source/include/": "include/",
        "cutlass_library/source/tools/util/include/": "tools/util/include/"}
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        for pre, dst in keep.items():
            if name.startswith(pre) and not name.endswith("/"):
                out = os.path.join(sys.argv[2], dst, name[len(pre):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, "wb") as f:
                    f.write(z.read(name))
EOF
    rm -rf "$tmp_whl"
  fi
fi
[[ -f "$cutlass_root/include/cutlass/cutlass.h" ]] || die "no cutlass/cutlass.h in $cutlass_root/include"
say "CUTLASS headers: $cutlass_root ($(grep -m1 -o 'define CUTLASS_MAJOR [0-9]*' "$cutlass_root/include/cutlass/version.h" 2>/dev/null || echo 'version ?'))"

# --- compile -------------------------------------------------------------------------------
shopt -s nullglob
sources=(csrc/*.cu)
((${#sources[@]})) || die "no csrc/*.cu files"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
njobs="${NVCC_JOBS:-$(nproc 2>/dev/null || echo 2)}"
flags=(-c -O3 -std=c++17 -DNDEBUG -Xcompiler=-fPIC -Xcompiler=-Wall
       -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a
       --expt-relaxed-constexpr
       -I"$root/csrc" -I"$cublas_inc" -I"$py_inc" -I"$pb_inc"
       -I"$cutlass_root/include" -I"$cutlass_root/tools/util/include")
say "compiling ${#sources[@]} file(s) for sm_80 + sm_90a with $njobs job(s) into $out"

start_all=$SECONDS

status=0
for src in "${sources[@]}"; do
  while (( $(jobs -rp | wc -l) >= njobs )); do wait -n || true; done
  obj="$out/$(basename "$src" .cu).o"
  ( t0=$SECONDS
    if "$nvcc" "${flags[@]}" "$src" -o "$obj" >"$obj.log" 2>&1; then
      echo "ok $((SECONDS - t0))" >"$obj.rc"
    else
      echo "FAILED $((SECONDS - t0))" >"$obj.rc"
    fi ) &

done
wait

for src in "${sources[@]}"; do
  obj="$out/$(basename "$src" .cu).o"
  read -r result secs <"$obj.rc"
  if [[ "$result" == ok ]]; then
    say "compiled $src -> $(basename "$obj") ($(stat -c %s "$obj") bytes, ${secs}s)"
  else
    status=1
    say "FAILED $src (${secs}s):"
  fi
  if [[ -s "$obj.log" ]]; then sed 's/^/    /' "$obj.log"; fi
done
if ((status)); then
  die "CUDA compile check failed"
fi
say "all ${#sources[@]} CUDA file(s) compiled for sm_80 and sm_90a in $((SECONDS - start_all))s"
