#!/usr/bin/env bash
# A rank SIGKILLed under torchrun --max-restarts=1 (NCCL on 2 GPUs): the other exits with one line, torchrun
# restarts both, and the run resumes from last.pt by itself. Log in $OUT/kill_a_rank.log.
#   OUT=<dir> DATA=/tmp/cifar10 GPUS=0,1 bash benchmarks/kill_a_rank.sh
set -uo pipefail
run_dir=/tmp/kill_a_rank; rm -rf "$run_dir"
CUDA_VISIBLE_DEVICES=${GPUS:-0,1} python3 -m torch.distributed.run --standalone --nproc_per_node=2 --max-restarts=1 \
  train.py trainer=ddp experiment=cifar10_qann genotype=DARTS_V2 data.root="$DATA" data.max_train_samples=8192 \
  data.max_test_samples=1024 snn_eval_samples=128 epochs=4 logger=none hydra.run.dir="$run_dir" \
  > "$OUT/kill_a_rank.log" 2>&1 &
agent=$!
until [ -f "$run_dir/checkpoints/last.pt" ]; do sleep 0.5; done
for pid in $(cat /proc/$agent/task/$agent/children); do
  if tr '\0' '\n' < /proc/$pid/environ | grep -qx RANK=1; then kill -9 "$pid"; fi
done
wait $agent; echo "torchrun exit $?"
grep -E "error:|resumed|retrain epoch|exitcode|SNN" "$OUT/kill_a_rank.log" | cut -c1-300
python3 -c "import json; m = json.load(open('$run_dir/metrics.json')); print('epochs', m['epochs'], 'test_acc', m['test_acc'])"
