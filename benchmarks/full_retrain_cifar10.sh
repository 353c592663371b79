#!/usr/bin/env bash
# The fast full-size retrain (experiment=cifar10_qann_fast, DARTS_V2 as the ST-BIF QANN) on all GPUs of this
# machine, stopped gracefully after STOP_S seconds (SIGTERM: checkpoint, exit 143) and continued by running it
# again with the same RUN dir (resume=). Log in $OUT/fast_<piece>.log.
#   OUT=<dir> DATA=/tmp/cifar10 RUN=/tmp/run/fast0 STOP_S=400 bash benchmarks/full_retrain_cifar10.sh [overrides]
set -uo pipefail
GPUS=$(nvidia-smi -L | wc -l)
piece=$(ls "$OUT" 2>/dev/null | grep -c '^fast_' || true)
if [ -f "$RUN/checkpoints/last.pt" ]; then
  args=(resume="$RUN")
else
  args=(trainer=ddp experiment=cifar10_qann_fast genotype=DARTS_V2 data.root="$DATA" hydra.run.dir="$RUN" "$@")
fi
timeout -s TERM --preserve-status "${STOP_S:-400}" python3 -m torch.distributed.run --standalone \
  --nproc_per_node="$GPUS" train.py "${args[@]}" > "$OUT/fast_$piece.log" 2>&1
echo "exit $?"
grep -E "retrain epoch|SNN|energy|error|SIGTERM|resume" "$OUT/fast_$piece.log" | tail -n 12
