#!/usr/bin/env bash
# Moves a run dir between machines that share no disk, in gzip-compressed parts of PART_SIZE (default 15M: a lent
# GPU host returns files of at most 16 MiB). best.pt, older last.*.pt and unfinished .*.tmp saves stay behind.
#   bash benchmarks/carry_run_dir.sh pack <run dir> <carry dir>     # safe while the run writes (snapshot)
#   bash benchmarks/carry_run_dir.sh unpack <carry dir> <run dir>   # no-op if <run dir> exists or no parts
set -uo pipefail
usage() { echo "usage: carry_run_dir.sh pack <run dir> <carry dir> | unpack <carry dir> <run dir>" >&2; exit 2; }
[ $# -eq 3 ] || usage
case "$1" in
  pack)
    run=${2%/} carry=$3; name=$(basename "$run")
    [ -d "$run" ] || { echo "carry_run_dir.sh: no run dir $run (nothing packed; give the dir train.py wrote)" >&2; exit 1; }
    mkdir -p "$carry" || exit 1
    # Parts go to a fresh folder first, so a failed pack leaves the last good parts in place.
    tmp=$(mktemp -d "$carry/.$name.XXXXXX") || exit 1
    # tar exit 1 ("file changed as we read it": a log appended to during a snapshot) still gives a usable archive;
    # checkpoints are replaced atomically, so tar reads one whole version of each.
    tar -cf - -C "$(dirname "$run")" --exclude=best.pt --exclude='last.*.pt' --exclude='.*.tmp' "$name" | gzip -1 \
      | split -b "${PART_SIZE:-15M}" - "$tmp/$name.tar.part-"
    status=("${PIPESTATUS[@]}")
    if [ "${status[0]}" -gt 1 ] || [ "${status[1]}" -ne 0 ] || [ "${status[2]}" -ne 0 ]; then
      rm -rf "$tmp"; echo "carry_run_dir.sh: packing $run failed (tar/gzip/split: ${status[*]}); old parts kept" >&2; exit 1
    fi
    rm -f "$carry/$name.tar.part-"* && mv "$tmp/$name.tar.part-"* "$carry/" && rmdir "$tmp"
    ls -l "$carry/$name.tar.part-"*
    ;;
  unpack)
    carry=$2 run=${3%/}; name=$(basename "$run")
    if [ -d "$run" ] || ! ls "$carry/$name.tar.part-"* > /dev/null 2>&1; then exit 0; fi
    mkdir -p "$(dirname "$run")" && tmp=$(mktemp -d "$(dirname "$run")/.$name.XXXXXX") || exit 1
    # Into a fresh folder first, so parts cut short leave no half run dir that a resume would trust.
    # gzip -f passes uncompressed parts through unchanged.
    if ! { cat "$carry/$name.tar.part-"* | gzip -dcf | tar -xf - -C "$tmp"; } || [ ! -d "$tmp/$name" ]; then
      rm -rf "$tmp"; echo "carry_run_dir.sh: the parts in $carry do not unpack to $run (a part missing or cut short?)" >&2
      exit 1
    fi
    mv "$tmp/$name" "$run" && rmdir "$tmp" || exit 1
    echo "$name: run dir unpacked from $carry"
    ;;
  *) usage ;;
esac
