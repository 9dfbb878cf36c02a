#!/usr/bin/env bash
# Regression gate for CI: quick CPU sweeps of this checkout compared with the committed baseline
# of this machine class and processor (reports/baselines/<device class>/<processor>/).
# Usage: scripts/ci_gate.sh [OUT_DIR]
#
# Rounds. On this project's CI machines (shared 2-vCPU VMs) one `--quick` run is too few
# samples to gate speed: the machine's speed drifts between runs. The gate runs ROUNDS quick
# sweeps and pools them (`kernelbench merge`: each round weighs the same, the spread includes the
# drift between rounds); the committed baseline is made the same way, from more rounds.
# Each row is timed in alternation with its cell's 16-bit baseline (paired timing, on by
# default), so its speedup is two medians over the same seconds: a slow stretch of the machine
# slows both.
#
# Error gate, every row, strict (--error-tol 0): errors are deterministic for fixed seeds on one
# processor (against another processor's baseline a float row's error may move by rounding,
# up to 0.1%: compare allows that). An error regression, or a row that ran in the baseline and
# now fails or stops running, fails CI; so does unusable input (exit 2). A baseline from a
# machine that compare finds not comparable (exit 3: other processor identity, or peaks beyond
# the noise) gates the errors only; the speed gate is skipped with a message.
# Speed gate, our kernels (backend `custom`): a row fails CI when it is slower by more than
# SPEED_TOL and more than the two runs' measured spreads combined (compare's noise band). Peer
# and framework rows (torch, bitsandbytes, torchao) are printed with their speed verdicts but do
# not fail CI: their speed is not ours to regress.
# A speed failure is confirmed before it fails CI: ROUNDS more rounds are pooled with the first
# ones and the gate is applied again; noise rarely repeats, a real slowdown does.
#
# TOLERANCE (SPEED_TOL, default 0.30): measured, not guessed. `scripts/gate_noise.py` replays
# this gate on every draw of disjoint baseline / first / confirming rounds from 10 quick rounds
# of one commit. On cpu-avx512vnni-2core (the 10 rounds of the committed baseline, quiet): at
# 0.10, 0.15, 0.20 and 0.30 no false failure in 3000 draws; +20% median_ms on one custom
# llm_int8 row caught in all 9000 cases at 0.10, +50% at 0.15-0.30. But a fresh-clone CI run
# on a machine also running two pytest jobs read custom llm_int8 at d=768 22% slower, confirmed:
# 0.15 failed unchanged code there, 0.30 would not have. CI machines are shared: 0.30.
# Its Zen 4 processor (AuthenticAMD-25-17-1, 10 quiet rounds of its baseline): 0 false failures in
# 3000 draws at 0.15 and 0.30; +50% on one custom llm_int8 row caught in all 9000 cases.
# On cpu-avx2-2core (10 quiet rounds of its baseline): 0 false failures in 3000 draws at 0.30,
# 36 at 0.20; +50% on one custom llm_int8 row caught in 99% of cases at 0.30.
# On cpu-amx-2core (a 2-vCPU Xeon VM whose host shares its cores out): the 10 rounds of its
# first baseline gave 162 false failures in 3000 draws at 0.30, 0 at 0.40; those of the current
# one 0 at 0.30 (+50% caught in 8999 of 9000): its gate.json says 0.30.
# The numbers and the command: docs/benchmarks.md ("The gate in this project's CI").
set -euo pipefail
cd "$(dirname "$0")/.."
# The runs record the commit they measured (the installed package cannot know it).
KERNELBENCH_GIT_COMMIT="${KERNELBENCH_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || true)}"
export KERNELBENCH_GIT_COMMIT
out="${1:-$(mktemp -d)/gate}"
rounds="${KB_GATE_ROUNDS:-3}"
mkdir -p "$out"

if ! base=$(kernelbench baseline path --device cpu 2>/dev/null); then
  echo "GATE SKIPPED: no committed baseline for this machine class ($(python3 -c \
    'import torch; from kernelbench.run.env import device_class; print(device_class(torch.device("cpu")))'))"
  echo "(make one: 10 x 'kernelbench run --quick --cache hot --extra-rounds 0', 'kernelbench merge', 'kernelbench baseline update';"
  echo " measure its tolerance with scripts/gate_noise.py: docs/benchmarks.md)"
  exit 0
fi
# The tolerance: KB_GATE_SPEED_TOL, else the one measured for this baseline (gate.json beside
# it, written after scripts/gate_noise.py on its rounds), else 0.30. A gate.json may hold only
# the spread between runs (kernelbench spread --save): no tolerance measured then.
measured_tol=""
if [ -f "$base/gate.json" ]; then
  measured_tol="$(python3 -c 'import json, sys; t = json.load(open(sys.argv[1])).get("speed_tol"); print("" if t is None else float(t))' "$base/gate.json")"
fi
speed_tol="${KB_GATE_SPEED_TOL:-${measured_tol:-0.30}}"

sweep() {  # sweep FIRST LAST: quick rounds FIRST..LAST, then pool every round so far
  for i in $(seq "$1" "$2"); do
    echo "== quick round $i"
    # --cache hot, --extra-rounds 0: as the committed baselines were measured (caches left
    # warm, one round per run)
    kernelbench run --quick --device cpu --cache hot --extra-rounds 0 --out "$out/round$i" \
      --no-report \
      >"$out/round$i.log" 2>&1 \
      || { tail -20 "$out/round$i.log"; return 1; }
  done
  kernelbench merge "$out/merged" $(seq -f "$out/round%g" 1 "$2")
}

gate_speed() {  # 0: our kernels are not slower; 1: slower rows; 2: unusable input
  set +e
  kernelbench compare "$base" "$out/merged" --backend custom --speed-tol "$speed_tol" \
    --error-tol 0 --format text | tee "$out/gate-custom.txt"
  local status=${PIPESTATUS[0]}
  set -e
  return "$status"
}

sweep 1 "$rounds"
# Errors are deterministic only for the same inputs: a baseline drawn from other inputs (other
# seeds, after a change to how cases draw them) cannot gate; it must be made again on its class.
if ! python3 - "$base" "$out/merged" <<'PY'
import json, sys
from pathlib import Path
def seeds(run):
    rows = (json.loads(line) for line in (Path(run) / "results.jsonl").read_text().splitlines() if line.strip())
    return {(r["case"], r["d_model"], r["layer"], r["tokens"]): r["seed"] for r in rows}
base, new = seeds(sys.argv[1]), seeds(sys.argv[2])
stale = sorted(k for k in base.keys() & new.keys() if base[k] != new[k])
if stale:
    print(f"the baseline's inputs differ from this checkout's in {len(stale)} cells, e.g. {stale[0]}")
    sys.exit(1)
PY
then
  echo "GATE SKIPPED: the committed baseline ($base) was drawn from other inputs; make it again"
  echo "on this machine class (10 x 'kernelbench run --quick --cache hot --extra-rounds 0', merge, 'kernelbench baseline update')"
  exit 0
fi
echo "gating $out/merged ($rounds rounds) against $base"

echo "== every row: error gate strict, speed advisory outside backend custom"
set +e
kernelbench compare "$base" "$out/merged" --speed-tol "$speed_tol" --error-tol 0 --format text \
  | tee "$out/gate-all.txt"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -eq 2 ]; then exit 2; fi
if grep -qE '^(error-worse|failed) ' "$out/gate-all.txt"; then
  echo "gate: FAILED: an error regression or a row that no longer runs (above)"
  exit 1
fi
if [ "$status" -eq 3 ]; then
  # compare's exit 3: the baseline's machine has another processor identity or peaks beyond
  # the noise (same class name, different host): its speeds cannot gate this machine's
  echo "SPEED GATE SKIPPED: the committed baseline ($base) comes from a machine that is not"
  echo "comparable with this one (see NOT COMPARABLE above); make it again on this machine"
  echo "(10 x 'kernelbench run --quick --cache hot --extra-rounds 0', merge, 'kernelbench baseline update')"
  exit 0
fi

echo "== backend custom: speed gate (tolerance $speed_tol beyond the noise band)"
status=0
gate_speed || status=$?
if [ "$status" -eq 1 ]; then
  echo "== slower rows: confirming with $rounds more rounds pooled with the first $rounds"
  sweep $((rounds + 1)) $((2 * rounds))
  status=0
  gate_speed || status=$?
fi
case "$status" in
  0) echo "gate: passed" ;;
  1) echo "gate: FAILED: custom rows slower than the baseline in $((2 * rounds)) pooled rounds" ;;
  *) echo "gate: unusable input" ;;
esac
exit "$status"
