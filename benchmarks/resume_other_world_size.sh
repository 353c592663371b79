#!/usr/bin/env bash
# A search stopped on all GPUs (SIGTERM after its first checkpoint) continues on half of them: the log must
# name the kept global batch and the checkpoint's global step and α digest. Logs in $OUT/world_*.log.
#   OUT=<dir> DATA=/tmp/cifar10 bash benchmarks/resume_other_world_size.sh
set -uo pipefail
gpus=$(nvidia-smi -L | wc -l); run=/tmp/world_size_search; rm -rf "$run"
python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" search.py trainer=ddp experiment=cifar10_qann \
  data.root="$DATA" data.max_train_samples=16384 search.schedule.warmup_epochs=1 search.schedule.search_epochs=2 \
  search.schedule.restabilize_epochs=1 logger=none hydra.run.dir="$run" > "$OUT/world_${gpus}.log" 2>&1 &
agent=$!
until [ -f "$run/checkpoints/last.pt" ] || ! kill -0 $agent 2>/dev/null; do sleep 0.5; done
sleep 5; kill -TERM $agent; wait $agent; echo "on $gpus GPUs: exit $?"
expected=$(python3 -c "
import torch; from aso_se.run.search_callbacks import alpha_digest
s = torch.load('$run/checkpoints/last.pt', map_location='cpu', weights_only=False)
print(f\"resumed at global step {s['engine']['global_step']}, α {alpha_digest(s['engine']['supernet'])}\", s['world_size'])")
echo "checkpoint: $expected"
half=$((gpus / 2))
CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((half - 1))) timeout -s TERM 60 python3 -m torch.distributed.run --standalone \
  --nproc_per_node=$half search.py resume="$run" > "$OUT/world_${half}.log" 2>&1; echo "on $half GPUs: exit $?"
grep -hE "resumed" "$OUT/world_${half}.log" | cut -c1-220
