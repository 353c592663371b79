#!/usr/bin/env bash
# The end of one device call that waits on detached jobs: polls until every DONE file exists or MAX_S seconds passed,
# then snapshots each run dir into the carry dir (benchmarks/carry_run_dir.sh pack), so a job that died at once ends
# the call at once and a host that goes back before the next call leaves the last snapshot behind.
#   bash benchmarks/wait_and_snapshot.sh <max seconds> <carry dir> <done file>... -- <run dir>...
# Start each job with bash benchmarks/detach.sh <done file> <log> -- <command>..., which writes its done file.
# Exit 0: every job is done; 3: some still run (call again); 1: a snapshot failed (its old parts kept).
set -uo pipefail
usage() { echo "usage: wait_and_snapshot.sh <max seconds> <carry dir> <done file>... -- <run dir>..." >&2; exit 2; }
[ $# -ge 4 ] || usage
max_s=$1 carry=$2; shift 2
[[ "$max_s" =~ ^[0-9]+$ ]] || { echo "wait_and_snapshot.sh: max seconds must be a whole number, got '$max_s'" >&2; exit 2; }
done_files=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do done_files+=("$1"); shift; done
[ "${1:-}" = "--" ] || usage
shift
[ ${#done_files[@]} -gt 0 ] && [ $# -gt 0 ] || usage
all_done() { for f in "${done_files[@]}"; do [ -e "$f" ] || return 1; done; }
deadline=$((SECONDS + max_s))
until all_done || [ "$SECONDS" -ge "$deadline" ]; do sleep "${POLL_S:-10}"; done
status=0
for run in "$@"; do
  if [ -d "$run" ]; then
    bash "$(dirname "$0")/carry_run_dir.sh" pack "$run" "$carry" || status=1
  else
    echo "wait_and_snapshot.sh: no run dir $run yet (nothing to snapshot)" >&2
  fi
done
[ "$status" -ne 0 ] && exit "$status"
all_done && exit 0
echo "wait_and_snapshot.sh: still running after ${max_s} s: $(for f in "${done_files[@]}"; do [ -e "$f" ] || printf '%s ' "$f"; done)"
exit 3
