#!/usr/bin/env bash
# Starts a command in a process session of its own, so it outlives the device call that started it (a call's
# processes are killed when it returns, those of new sessions excepted), and writes its exit status to <done file>
# when it ends. The write runs inside that session too: `(setsid cmd; touch DONE) &` loses the touch with the call.
#   bash benchmarks/detach.sh <done file> <log file> -- <command>...
# Waited on by benchmarks/wait_and_snapshot.sh <s> <carry dir> <done file> -- <run dir>.
set -uo pipefail
usage() { echo "usage: detach.sh <done file> <log file> -- <command>..." >&2; exit 2; }
[ $# -ge 4 ] && [ "$3" = "--" ] || usage
done_file=$1 log=$2; shift 3
rm -f "$done_file"
mkdir -p "$(dirname "$done_file")" "$(dirname "$log")" || exit 1
# shellcheck disable=SC2016  # $1/$2 expand in the detached bash, not here
setsid nohup bash -c '"${@:3}" > "$2" 2>&1; echo $? > "$1"' detach "$done_file" "$log" "$@" < /dev/null > /dev/null 2>&1 &
pid=$!
# Returns only once the job leads its own session: a call that ends sooner would still take it down.
for _ in $(seq 500); do
  stat=$(cat "/proc/$pid/stat" 2> /dev/null) && read -r _ _ _ sid _ <<< "${stat##*) }" && [ "$sid" = "$pid" ] && break
  kill -0 "$pid" 2> /dev/null || break  # already over (its status is in the done file)
  sleep 0.01
done
echo "detach.sh: started pid $pid (log $log, exit status to $done_file when it ends)"
