#!/usr/bin/env bash
# Regression gate for CI: a quick CPU sweep compared with the committed baseline of this
# machine class (reports/baselines/<device class>/).
#
# Error gate: strict (--error-tol 0: errors are deterministic for fixed seeds and inputs).
# Speed gate: --speed-tol 0.5. Speed is compared as the ratio to the same run's bf16 baseline,
# but on a shared 2-core VM a --quick run times each row for only 0.3 s, and two such runs of
# the same commit were seen to differ by up to ~35% on a ratio (see the closing note of the
# issue that added this gate); 50% catches a kernel that got clearly slower without failing
# CI on a noisy neighbour. A row is also only "slower" when the change exceeds both runs'
# measured spreads combined.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${KB_GATE_OUT:-$(mktemp -d)/quick}"
kernelbench run --quick --device cpu --out "$out" --no-report
if ! base=$(kernelbench baseline path --device cpu 2>/dev/null); then
  echo "no committed baseline for this machine class: gate skipped (run 'kernelbench baseline update $out' on this class)"
  exit 0
fi
echo "gating $out against $base"
kernelbench compare "$base" "$out" --speed-tol 0.5 --error-tol 0 --format text
