# Sourced by the benchmark scripts that run whole commands (needs $OUT and $WORK set).
# timed <name> <limit_s> <command...>: runs the command in $WORK with a time limit, logs its
# output to $OUT/<name>.log and appends "<name> exit <rc> wall <s>" to $OUT/summary.txt.
# A command that hits the limit gets SIGTERM (our entry points save and exit), and the script
# goes on, so one slow stage still leaves the others' results.
timed() {
  local name=$1 limit=$2; shift 2
  local start=$EPOCHREALTIME rc
  (cd "$WORK" && timeout "$limit" "$@") > "$OUT/$name.log" 2>&1
  rc=$?
  python3 -c "print(f'{\"$name\":<22} exit {$rc:>3}  wall {$EPOCHREALTIME - $start:7.1f} s')" \
    | tee -a "$OUT/summary.txt"
}
