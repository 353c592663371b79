#!/usr/bin/env bash
# The README's CIFAR-10 spiking search, end to end on one GPU: experiment=$EXPERIMENT (default
# cifar10_qann, the QANN search at batch 512; cifar10_snn: BPTT at T = 4, batch 64) on the whole
# CIFAR-10 training set (two halves of 25,000), its full schedule, plus any overrides given.
# Wall time, per-epoch images/s, peak memory, genotype and α entropy go to $OUT.
#
#   OUT=/tmp/out bash benchmarks/search_cifar10_full.sh [overrides]
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the logs}
REPO=$PWD
WORK=$(mktemp -d)
CIFAR=/tmp/cifar10
if [ ! -d "$CIFAR/train" ]; then
  mkdir -p "$CIFAR" && tar -xzf .gpu/cifar10-jpg.tar.gz -C "$CIFAR"
fi
export PYTHONUNBUFFERED=1
source "$REPO/benchmarks/timed.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/summary.txt"
echo "experiment=${EXPERIMENT:-cifar10_qann} overrides: $*" | tee -a "$OUT/summary.txt"
# NPROC=N: torchrun on N GPUs of this machine (trainer=ddp, the same batch per process: N times fewer steps)
LAUNCH=(python3); [ "${NPROC:-1}" -gt 1 ] && LAUNCH=(python3 -m torch.distributed.run --standalone --nproc_per_node="$NPROC")
DDP=(); [ "${NPROC:-1}" -gt 1 ] && DDP=(trainer=ddp)
timed cifar10_full_search "${LIMIT_S:-1500}" "${LAUNCH[@]}" "$REPO/search.py" "${DDP[@]}" experiment="${EXPERIMENT:-cifar10_qann}" \
  data.root="$CIFAR" data.num_workers=12 "$@" hydra.run.dir="$WORK/search"
cp "$WORK/search/search.log" "$OUT/search.log" 2>/dev/null
cp "$WORK/search/genotype.json" "$OUT/genotype.json" 2>/dev/null
grep -E "images_per_second|gpu_memory" "$WORK/search/search.log" | tail -60 > "$OUT/epochs.txt"
cat "$OUT/summary.txt"
