#!/usr/bin/env bash
# What a GPU window carries, in MiB: the repository as it travels (tracked and untracked files
# that git does not ignore) plus the ignored folders named on the command line (default: .whl
# and .gpu-prebuilt). Exit status 1 when the total is over KB_CARRY_LIMIT_MIB (default 60).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
limit_mib="${KB_CARRY_LIMIT_MIB:-60}"
folders=("$@")
((${#folders[@]})) || folders=(.whl .gpu-prebuilt)

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
repo_bytes="$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null |
  tail -1 | cut -f1)"
total=$repo_bytes
line="repository $(mib "$repo_bytes")"
for f in "${folders[@]}"; do
  bytes=0
  [[ -e "$f" ]] && bytes="$(du -sb "$f" | cut -f1)"
  total=$((total + bytes))
  line+=" + $f $(mib "$bytes")"
done
echo "carried: $line = $(mib "$total") MiB (limit $limit_mib MiB)"
if ((total > limit_mib * 1048576)); then
  echo "carried total is over $limit_mib MiB" >&2
  exit 1
fi
