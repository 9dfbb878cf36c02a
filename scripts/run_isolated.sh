#!/usr/bin/env bash
# Run a command in a fresh network namespace that has only the loopback interface (needs root
# or unprivileged user namespaces). Tests then cannot reach or expose anything beyond this
# machine, and the Ray cluster tests (which need that guarantee) are enabled.
# Usage: scripts/run_isolated.sh CMD [ARGS...]; falls back to running CMD directly (and says so)
# when no namespace can be made.
set -euo pipefail
if unshare -n true 2>/dev/null; then
  exec unshare -n bash -c 'ip link set lo up && exec "$@"' bash "$@"
elif unshare -rn true 2>/dev/null; then
  exec unshare -rn bash -c 'ip link set lo up && exec "$@"' bash "$@"
fi
echo "run_isolated.sh: cannot create a network namespace; running without isolation" >&2
exec "$@"
