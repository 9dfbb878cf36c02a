#!/usr/bin/env bash
# End-to-end check of the Ray executor through the CLI: a local two-node Ray cluster started with the `ray`
# CLI as the README says (`ray start --head`, then `ray start --address` for the second node; one
# CPU each, on 127.0.0.1), the same quick sweep run through `--executor ray --address` and through
# the local executor, and the two results compared row by row (keys and statuses; timings aside).
#
# Run it in a loopback-only network namespace (Ray listens on every interface, and on this
# project's VMs a Ray beside other interfaces was seen to hang):
#   scripts/run_isolated.sh bash scripts/ray_cluster_check.sh [OUT_DIR]
# Extra arguments after OUT_DIR go to both `kernelbench run` calls (default: --sizes gpt3 --quick).
# Exit 0 when both runs give the same rows; 1 otherwise; the cluster is stopped either way.
#
# Token authentication (Ray >= 2.60 turns it on by default, and enables it for every later
# cluster once ~/.ray/auth_token exists): the script makes a token for this cluster alone, in
# its own session directory, and gives it to every node and to the driver (RAY_AUTH_MODE=token,
# RAY_AUTH_TOKEN_PATH), so that the check runs the same on a machine that never ran Ray and on
# one where an earlier `kernelbench run --executor ray` left ~/.ray/auth_token. A failing step
# names its command and prints its log.
#
# Each Ray node here declares one CPU, so a Ray task times with one thread where the local run
# uses two: calls take about twice as long. Both runs get a generous --max-call so that the
# time-budget skip ("over budget", estimated from the previous cell) does not fire in one run
# and not the other (it did in CI: torch llm_int8 at d=2048 single-threaded was estimated over
# the quick default of 5 s). A status that still differs only by such a skip is reported as
# timing-dependent, not as a row difference.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)/ray-check}"
shift || true
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--sizes gpt3 --quick)
# no extra rounds either: which rows get one depends on their measured intervals
args=(--max-call 120 --extra-rounds 0 "${args[@]}")  # first, so the caller's flags win
port="${KB_RAY_PORT:-6390}"
mkdir -p "$out"
ray_tmp="$(mktemp -d /tmp/kbray.XXXXXX)"  # own session dir: no stale state from another Ray
export RAY_USAGE_STATS_ENABLED=0

cleanup() { timeout 60 ray stop --force >/dev/null 2>&1 || true; rm -rf "$ray_tmp"; }
trap cleanup EXIT
# this cluster's token: every node and the driver read it (never ~/.ray/auth_token)
(umask 077 && python3 -c "import secrets; print(secrets.token_hex(32))" >"$ray_tmp/auth_token")
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$ray_tmp/auth_token"
unset RAY_AUTH_TOKEN

# run_logged LOG CMD...: run CMD with its output in LOG; on failure say which command failed,
# with its exit status, and print its log
run_logged() {
  local log="$1" status=0
  shift
  "$@" >"$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    echo "ray_cluster_check: command failed (exit $status): $*" >&2
    echo "---- $log" >&2
    cat "$log" >&2
    echo "----" >&2
    return "$status"
  fi
}
node_opts=(--node-ip-address=127.0.0.1 --num-cpus=1 --object-store-memory=100000000)
run_logged "$out/ray-head.log" timeout 120 ray start --head --port="$port" \
  --include-dashboard=false --disable-usage-stats --temp-dir="$ray_tmp" "${node_opts[@]}"
run_logged "$out/ray-node2.log" timeout 120 ray start --address="127.0.0.1:$port" "${node_opts[@]}"
python3 - "$port" <<'EOF'
import sys, time, ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="warning", log_to_driver=False)
deadline = time.time() + 60
while sum(n["Alive"] for n in ray.nodes()) < 2 and time.time() < deadline:
    time.sleep(0.5)
alive = sum(n["Alive"] for n in ray.nodes())
print(f"ray cluster up: {alive} nodes, {ray.cluster_resources().get('CPU', 0):g} CPUs")
sys.exit(0 if alive == 2 else 1)
EOF

echo "== ray executor: kernelbench run ${args[*]} --executor ray --address 127.0.0.1:$port"
time kernelbench run "${args[@]}" --device cpu --executor ray --address "127.0.0.1:$port" \
  --out "$out/ray" --no-report
echo "== local executor: kernelbench run ${args[*]}"
time kernelbench run "${args[@]}" --device cpu --out "$out/local" --no-report

python3 - "$out/local" "$out/ray" <<'EOF'
import json, sys
from pathlib import Path
from kernelbench.results.schema import KEY_COLUMNS, load_results

local, ray_ = (load_results(p) for p in sys.argv[1:3])
key = list(KEY_COLUMNS)
def rows(df):
    return {tuple(r[k] for k in key): r["status"] for _, r in df.iterrows()}
def over_budget(df):
    hit = df["reason"].astype(str).str.startswith("over budget")
    return {tuple(r[k] for k in key) for _, r in df[hit].iterrows()}
a, b = rows(local), rows(ray_)
timing_skips = over_budget(local) | over_budget(ray_)
for name, df in (("local", local), ("ray", ray_)):
    dup = df.duplicated(subset=key).sum()
    print(f"{name}: {len(df)} rows, {dup} duplicate keys, statuses {df['status'].value_counts().to_dict()}")
hosts = json.loads((Path(sys.argv[2]) / "env.json").read_text()).get("hosts", [])
print(f"ray env.json hosts: {[(h['host'], h['device_class']) for h in hosts]}")
only_local, only_ray = sorted(set(a) - set(b)), sorted(set(b) - set(a))
differs = sorted(k for k in set(a) & set(b) if a[k] != b[k])
status_diff = [k for k in differs if k not in timing_skips]
for k in sorted(set(differs) - set(status_diff)):
    print("timing-dependent (over the time budget in one run):", k, "local", a[k], "ray", b[k])
for k in only_local: print("only in local:", k)
for k in only_ray: print("only in ray:", k)
for k in status_diff: print("status differs:", k, "local", a[k], "ray", b[k])
same = not (only_local or only_ray or status_diff) and len(local) == len(ray_) \
    and not local.duplicated(subset=key).any() and not ray_.duplicated(subset=key).any()
print("SAME ROWS" if same else "ROWS DIFFER", f"({len(a)} keys)")
sys.exit(0 if same else 1)
EOF
