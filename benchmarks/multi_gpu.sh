#!/usr/bin/env bash
# Several GPUs through torchrun + NCCL (benchmarks/RESULTS.md, "Several GPUs"). Run from the
# repository root on a machine with >= 2 GPUs; logs and a summary go to $OUT.
#
#   OUT=/tmp/out bash benchmarks/multi_gpu.sh
#
# 1. The default `python search.py` on one GPU, twice: cold (first use on this machine: Triton
#    compiles, sparse-conv calibration) and warm (both cached on disk).
# 2. The same search with `torchrun --nproc_per_node=2 ... trainer=ddp` (warm): each rank
#    takes half of each search split; the engine checks once per cycle that α is identical
#    on both ranks (aso_se.parallel.distributed.check_identical_across_ranks) and stops if not.
# 3. train.py on DARTS_V2 (experiment=smoke sizes) with DDP over 2 GPUs.
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the logs}
REPO=$PWD
WORK=$(mktemp -d)
NPROC=${NPROC:-2}
export PYTHONUNBUFFERED=1

source "$REPO/benchmarks/timed.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version())" | tee -a "$OUT/summary.txt"

timed search_1gpu_cold 240 python3 "$REPO/search.py" hydra.run.dir="$WORK/s1_cold"
timed search_1gpu_warm 240 python3 "$REPO/search.py" hydra.run.dir="$WORK/s1_warm"
timed search_${NPROC}gpu_ddp 240 torchrun --standalone --nproc_per_node="$NPROC" "$REPO/search.py" trainer=ddp \
  hydra.run.dir="$WORK/s2"
timed train_${NPROC}gpu_ddp 240 torchrun --standalone --nproc_per_node="$NPROC" "$REPO/train.py" trainer=ddp \
  experiment=smoke genotype=DARTS_V2 epochs=2 hydra.run.dir="$WORK/t2"

for run in s1_cold s1_warm s2; do
  echo "== $run: $(grep -o 'search run in .*' "$WORK/$run/search.log" | head -1)" | tee -a "$OUT/summary.txt"
  grep -E "cycle 1 search|distributed|differs" "$WORK/$run/search.log" | cut -c1-260 | tee -a "$OUT/summary.txt"
  python3 -c "import json,sys; print(json.load(open(sys.argv[1])))" "$WORK/$run/genotype.json" >> "$OUT/summary.txt" 2>&1
done
echo "== t2: $(grep -o 'train run in .*' "$WORK/t2/train.log" | head -1)" | tee -a "$OUT/summary.txt"
python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print({k: m[k] for k in ('world_size','device','test_acc','wall_time_s')})" \
  "$WORK/t2/metrics.json" | tee -a "$OUT/summary.txt"
