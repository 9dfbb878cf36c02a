#!/usr/bin/env bash
# A GPU window in one command: scripts/gpu_check.sh OUTDIR [--dry-run]
#
# On a fresh GPU machine without internet (python3 3.12 with a CUDA 13 torch), from a checkout
# that carries .whl/ (scripts/fetch_gpu_wheels.sh) and .gpu-prebuilt/ (scripts/prebuild_gpu.sh).
# Steps, in order, each bounded by `timeout` and by the whole run's deadline
# (KB_GPU_DEADLINE_S, default 465 s: the command ends inside 8 minutes):
#   nvidia-smi    nvidia-smi -q
#   wheels        .whl/*.whl into a private site folder (the image's environment is untouched)
#   env           Python, torch, CUDA, device
#   modules       the prebuilt modules, verified against their manifest (scripts/gpu_prebuilt.py)
#                 and copied into kernelbench/; on a mismatch, built here by prebuild_gpu.sh
#   import        kernelbench._cuda and kernelbench._cutlass load and report the device
#   pytest-gpu    pytest -m gpu over tests/ (contract suite on cuda + GPU kernel tests; --junitxml, no -x)
#   probe-NAME    each scripts/gpu_probes.py / scripts/gpu_probe_*.py, run as SCRIPT --out DIR
#   memcheck      compute-sanitizer --tool memcheck on scripts/kernel_workload.py (odd shapes)
#   sweep         kernelbench run --quick, the gpt3 case's 8 dims at 2048 tokens, --budget 0.2
#   racecheck     compute-sanitizer --tool racecheck on the same workload, last
# Everything (logs, steps.tsv, junit XML, probe output, the sweep's run folder) is archived into
# OUTDIR/gpu_check.tar.gz after EVERY step (a killed command runs no exit trap), and
# OUTDIR/steps.tsv is the step table (name, rc, seconds, limit). Exit status: the first failed
# step's. --dry-run walks every step on a CPU machine with stand-ins (CI runs it).
set -uo pipefail

usage() { echo "usage: $0 OUTDIR [--dry-run]" >&2; exit 2; }
dry=0
outdir=""
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 ;;
    -*) usage ;;
    *) [[ -z "$outdir" ]] || usage; outdir="$a" ;;
  esac
done
[[ -n "$outdir" ]] || usage
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$outdir"
out="$(cd "$outdir" && pwd)"
cd "$root"

deadline="${KB_GPU_DEADLINE_S:-465}"
scratch="$(mktemp -d /tmp/kb-gpu-check.XXXXXX)"
work="$scratch/gpu_check"            # what the archive holds
site="$scratch/site"                  # the carried wheels go here, nothing else is touched
mkdir -p "$work" "$site"
exec > >(tee "$work/console.log") 2>&1

# The site folder is on the path BEFORE anything is installed into it.
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
if ((dry == 0)) || ! python3 -c 'import kernelbench' 2>/dev/null; then
  export PYTHONPATH="$root:$PYTHONPATH"  # the checkout's kernelbench (not installed there)
fi
export PATH="$site/bin:$PATH" PYTHONUNBUFFERED=1
# libcublasLt for a bare import of kernelbench._cuda (torch loads the same file anyway).
cublas_root="$(python3 - <<'EOF' 2>/dev/null
import os, site, sys
for p in sys.path + site.getsitepackages():
    d = os.path.join(p or ".", "nvidia", "cu13")
    if os.path.isfile(os.path.join(d, "lib", "libcublasLt.so.13")):
        print(os.path.abspath(d)); break
EOF
)"
[[ -n "$cublas_root" ]] && export LD_LIBRARY_PATH="$cublas_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
[[ -x "$sanitizer" ]] || sanitizer=""
export root site work dry cublas_root

printf 'step\trc\tseconds\tlimit\n' >"$work/steps.tsv"
first_rc=0

archive() {
  tar -czf "$out/gpu_check.tar.gz.tmp" -C "$scratch" gpu_check 2>/dev/null &&
    mv -f "$out/gpu_check.tar.gz.tmp" "$out/gpu_check.tar.gz"
  cp "$work/steps.tsv" "$out/steps.tsv"
}

# step NAME LIMIT CMD...: run CMD (a command or an exported function) under
# min(LIMIT, time left), log to NAME.log, record rc and seconds, refresh the archive.
step() {
  local name="$1" limit="$2" rc t0=$SECONDS
  shift 2
  local left=$((deadline - SECONDS - 10))
  ((left < limit)) && limit=$left
  if ((limit < 5)); then
    echo "=== [$name] skipped: no time left (deadline ${deadline}s)"
    printf '%s\tno-time\t0\t0\n' "$name" >>"$work/steps.tsv"
    ((first_rc == 0)) && first_rc=124  # a check that did not run is no pass
    archive
    return 0
  fi
  echo "=== [$name] $* (limit ${limit}s)"
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$work/$name.log"
  rc=${PIPESTATUS[0]}
  local dt=$((SECONDS - t0))
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$dt" "$limit" >>"$work/steps.tsv"
  echo "=== [$name] rc=$rc in ${dt}s"
  ((rc != 0 && first_rc == 0)) && first_rc=$rc
  archive
  return 0
}
skip() {  # skip NAME REASON
  echo "=== [$1] skipped: $2"
  printf '%s\tskipped\t0\t0\n' "$1" >>"$work/steps.tsv"
  archive
}

# --- the steps ---------------------------------------------------------------------------------
nvidia_smi() {
  if ((dry)); then echo "dry run: stand-in for nvidia-smi -q"; else nvidia-smi -q; fi
}
install_wheels() {
  shopt -s nullglob
  local whls=(.whl/*.whl)
  if ((${#whls[@]} == 0)); then
    echo "no wheels in .whl/ (scripts/fetch_gpu_wheels.sh fills it where there is internet)"
    return 0
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${whls[@]}" && ls "$site"
}
show_env() {
  python3 - <<'EOF'
import sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
EOF
  echo "cuBLASLt: ${cublas_root:-not found}"
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|triton|bitsandbytes|torchao|nvidia-cublas|pybind11) '
}
modules() {
  local dest=kernelbench
  ((dry)) && dest="$work/dry-run-install" && mkdir -p "$dest"
  python3 scripts/gpu_prebuilt.py verify .gpu-prebuilt --install "$dest" && return 0
  if ((dry)); then
    echo "dry run: stand-in for the fallback build (scripts/prebuild_gpu.sh with this python3)"
    return 0
  fi
  echo "building here instead (scripts/prebuild_gpu.sh)"
  KB_PREBUILD_PYTHON="$(command -v python3)" KB_PREBUILD_OUT="$root/build/gpu-check-built" \
    KERNELBENCH_CUBLAS_ROOT="$cublas_root" \
    KERNELBENCH_CUTLASS_ROOT="$site/cutlass_library/source" bash scripts/prebuild_gpu.sh &&
    python3 scripts/gpu_prebuilt.py verify build/gpu-check-built --install kernelbench
}
import_modules() {
  python3 - "$dry" <<'EOF'
import sys
import torch
from kernelbench.kernels import cuda_ext, cutlass_ext
dry = sys.argv[1] == "1"
for name, ext in (("_cuda", cuda_ext), ("_cutlass", cutlass_ext)):
    why = ext.unavailable_reason()
    print(f"kernelbench.{name}: built={ext.extension_built()} unavailable_reason={why}")
    if why is None:
        print(ext.info())
    elif not dry:
        sys.exit(1)
EOF
}
gpu_test_files() {  # where GPU tests live (KB_GPU_TESTS overrides): every test file, since the
  # contract suite runs on each device and conftest marks its cuda cases "gpu" (-m gpu selects)
  if [[ -n "${KB_GPU_TESTS:-}" ]]; then echo "$KB_GPU_TESTS"; return; fi
  echo tests
}
pytest_gpu() {
  # shellcheck disable=SC2046
  python3 -m pytest -m gpu $(gpu_test_files) -q -rs -p no:cacheprovider \
    --continue-on-collection-errors --junitxml="$work/pytest-gpu.xml"
}
probe() {  # probe SCRIPT
  if ((dry)); then python3 -m py_compile "$1" && echo "dry run: $1 compiles"; return; fi
  local d="$work/probes/$(basename "$1" .py)"
  mkdir -p "$d"
  python3 "$1" --out "$d"
}
workload() {  # workload [memcheck|racecheck]
  if ((dry)); then
    python3 scripts/kernel_workload.py --device cpu --backends custom --dtypes bfloat16
    return
  fi
  if [[ -z "$sanitizer" ]]; then echo "compute-sanitizer not found"; return 3; fi
  local extra=()
  [[ "$1" == racecheck ]] && extra=(--dtypes float16)
  "$sanitizer" --tool "$1" --error-exitcode 9 --print-limit 200 \
    python3 scripts/kernel_workload.py --device cuda "${extra[@]}"
}
sweep() {
  # quick: one round (no extra one: the device time is counted), short budgets; the flags
  # given win over the profile's, and the gpt3 case's eight dims are listed (a case name
  # alone would take the quick profile's three).
  local dims
  dims="$(python3 - <<'EOF'
import tomllib
with open("cases/gpt3.toml", "rb") as f:
    print(",".join(str(size["d_model"]) for size in tomllib.load(f)["sizes"]))
EOF
)"
  local args=(--quick --extra-rounds 0 --case gpt3 --sizes "$dims" --tokens 2048 --device cuda
              --budget 0.2)
  ((dry)) && args=(--quick --extra-rounds 0 --case gpt3 --sizes "${dims%%,*}" --tokens 16
                   --device cpu --backends custom --methods llm_int8 --budget 0.05 --no-report)
  python3 -c 'import sys; from kernelbench.cli import app; sys.argv[0] = "kernelbench"; app()' \
    run "${args[@]}" --out "$work/run"
}
export -f nvidia_smi install_wheels show_env modules import_modules gpu_test_files pytest_gpu \
  probe workload sweep
export sanitizer

echo "=== gpu_check $( ((dry)) && echo '(dry run) ')in $root -> $out/gpu_check.tar.gz"
archive
step nvidia-smi 30 bash -c nvidia_smi
step wheels 90 bash -c install_wheels
step env 60 bash -c show_env
step modules 240 bash -c modules
step import 60 bash -c import_modules
step pytest-gpu 120 bash -c pytest_gpu
shopt -s nullglob
probes=(scripts/gpu_probes.py scripts/gpu_probe_*.py)
found_probe=0
for p in "${probes[@]}"; do
  [[ -f "$p" ]] || continue
  found_probe=1
  step "probe-$(basename "$p" .py)" 60 bash -c 'probe "$1"' _ "$p"
done
((found_probe)) || skip probes "no scripts/gpu_probes.py or scripts/gpu_probe_*.py"
step memcheck 90 bash -c 'workload memcheck'
step sweep 120 bash -c sweep
step racecheck 60 bash -c 'workload racecheck'

echo "=== steps"
column -t "$work/steps.tsv" 2>/dev/null || cat "$work/steps.tsv"
echo "=== total ${SECONDS}s, exit $first_rc; results: $out/gpu_check.tar.gz"
archive
exit "$first_rc"
