#!/usr/bin/env bash
# Scaling of the paper-scale search over GPUs (benchmarks/RESULTS.md, "Several GPUs"): the
# experiment=cifar10_snn search cut to 8,000 images and 2 cycles of 1 warm-up, 1 search and
# 1 re-stabilization epoch, on 1 GPU and then with torchrun + NCCL on $NPROC GPUs. The 1-GPU run
# goes first and pays the one-time costs (Triton compiles, sparse-conv calibration); compare
# the later epochs' seconds. Each rank keeps batch 64, so N GPUs take N times fewer steps.
#
#   OUT=/tmp/out bash benchmarks/multi_gpu_cifar10.sh
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the logs}
REPO=$PWD
WORK=$(mktemp -d)
NPROC=${NPROC:-2}
CIFAR=/tmp/cifar10
if [ ! -d "$CIFAR/train" ]; then
  mkdir -p "$CIFAR" && tar -xzf .gpu/data/cifar10-jpg.tar.gz -C "$CIFAR"
fi
export PYTHONUNBUFFERED=1
ARGS=(experiment=cifar10_snn data.root="$CIFAR" data.num_workers=6 data.max_train_samples=8000
      search.schedule.warmup_epochs=1 search.schedule.search_epochs=1 search.schedule.restabilize_epochs=1)

source "$REPO/benchmarks/timed.sh"

nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/summary.txt"
timed cifar_search_1gpu 280 python3 "$REPO/search.py" "${ARGS[@]}" hydra.run.dir="$WORK/c1"
timed cifar_search_${NPROC}gpu 280 torchrun --standalone --nproc_per_node="$NPROC" "$REPO/search.py" trainer=ddp \
  "${ARGS[@]}" hydra.run.dir="$WORK/c2"
for run in c1 c2; do
  echo "== $run" | tee -a "$OUT/summary.txt"
  grep -E "epoch [0-9]+\)" "$WORK/$run/search.log" | sed -E 's/.*INFO\] - //; s/  (lr|temperature|entropy|arch_kl|loss|arch_loss) [^ ]+//g' \
    | tee -a "$OUT/summary.txt"
done
