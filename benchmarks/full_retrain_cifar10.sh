#!/usr/bin/env bash
# The fast full-size retrain (experiment=cifar10_qann_fast, DARTS_V2 as the ST-BIF QANN) on the GPUs of this
# machine (or those in CUDA_VISIBLE_DEVICES), stopped gracefully after STOP_S seconds (SIGTERM: checkpoint, exit
# 143) and continued by running it again with the same RUN dir (resume=). Log in $OUT/<run name>_<piece>.log.
# The global batch stays 1,024 on any number of GPUs (batch_size=1024/GPUs); overrides pick the arm:
#   OUT=<dir> DATA=/tmp/cifar10 RUN=/tmp/run/fast0 STOP_S=400 bash benchmarks/full_retrain_cifar10.sh [overrides]
#   CUDA_VISIBLE_DEVICES=2,3 RUN=/tmp/run/relu ... bash benchmarks/full_retrain_cifar10.sh neuron=relu
#   CUDA_VISIBLE_DEVICES=0 RUN=/tmp/run/one ... bash benchmarks/full_retrain_cifar10.sh trainer.precision=fp16
# GENOTYPE=<name or genotype.json> retrains another cell (default DARTS_V2), e.g. a searched-vs-random arm.
# CARRY=<dir>: after the piece, the run dir goes there in 15 MiB parts (benchmarks/carry_run_dir.sh) for another
# machine, where the next piece with the same RUN and CARRY unpacks it first (resume from a copied run dir). A
# snapshot while it runs: bash benchmarks/carry_run_dir.sh pack "$RUN" <dir>.
# Detached, so it outlives the device call: bash benchmarks/detach.sh <DONE file> <log> -- env RUN=... bash $0 ...;
# each call then ends with bash benchmarks/wait_and_snapshot.sh <s> <dir> <DONE file> -- "$RUN".
set -uo pipefail
name=$(basename "$RUN")
if [ -n "${CARRY:-}" ]; then bash "$(dirname "$0")/carry_run_dir.sh" unpack "$CARRY" "$RUN" || exit 1; fi
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  GPUS=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
else
  GPUS=$(nvidia-smi -L | wc -l)
fi
piece=$(ls "$OUT" 2>/dev/null | grep -c "^${name}_" || true)
log="$OUT/${name}_$piece.log"
# One GPU runs train.py as a one-GPU user does (no torchrun, no DDP).
if [ "$GPUS" = 1 ]; then
  launch=(python3) ddp=()
else
  launch=(python3 -m torch.distributed.run --standalone --nproc_per_node="$GPUS") ddp=(trainer=ddp)
fi
if [ -f "$RUN/checkpoints/last.pt" ]; then
  args=(resume="$RUN" ++data.root="$DATA")  # a run dir copied from another machine reads this machine's data
else
  args=("${ddp[@]}" experiment=cifar10_qann_fast genotype="${GENOTYPE:-DARTS_V2}" batch_size=$((1024 / GPUS))
        data.root="$DATA" hydra.run.dir="$RUN" "$@")
fi
timeout -s TERM --preserve-status "${STOP_S:-400}" "${launch[@]}" train.py "${args[@]}" > "$log" 2>&1
echo "$name exit $?"
grep -E "retrain epoch|SNN|energy|error|SIGTERM|resume" "$log" | tail -n 12
if [ -n "${CARRY:-}" ]; then bash "$(dirname "$0")/carry_run_dir.sh" pack "$RUN" "$CARRY"; fi
