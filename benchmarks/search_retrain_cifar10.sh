#!/usr/bin/env bash
# Search and retrain on CIFAR-10 on one GPU, plus the default `python search.py` wall time
# (benchmarks/RESULTS.md, "Search and retrain on CIFAR-10"). Run from the repository root;
# logs, genotype and metrics go to $OUT. The CIFAR-10 JPEG copy is unpacked to /tmp/cifar10.
#
#   OUT=/tmp/out bash benchmarks/search_retrain_cifar10.sh
#
# The search is experiment=cifar10_snn cut to fit a few minutes: 8,000 training images (two
# halves of 4,000), 1 warm-up + 2 search epochs per cycle, 1 re-stabilization epoch. The
# retrain is that genotype in a search-sized network (8 cells, C = 16, auxiliary head) for 3
# epochs on the same 8,000 images, tested on the full 10,000-image test set. Each command has
# a time limit (seconds) so that one slow stage still leaves the others' results.
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the logs}
REPO=$PWD
WORK=$(mktemp -d)   # the runs' outputs/ (run directories) live here
CIFAR=/tmp/cifar10
if [ ! -d "$CIFAR/train" ]; then
  mkdir -p "$CIFAR" && tar -xzf .gpu/data/cifar10-jpg.tar.gz -C "$CIFAR"
fi
export PYTHONUNBUFFERED=1
CIFAR_DATA=(data.root="$CIFAR" data.num_workers=8 data.max_train_samples=8000)

source "$REPO/benchmarks/timed.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/summary.txt"

timed default_search 150 python3 "$REPO/search.py" hydra.run.dir="$WORK/default_search"
timed cifar10_search 240 python3 "$REPO/search.py" experiment=cifar10_snn "${CIFAR_DATA[@]}" \
  search.schedule.warmup_epochs=1 search.schedule.search_epochs=2 \
  search.schedule.restabilize_epochs=1 hydra.run.dir="$WORK/cifar10_search"
# The final genotype; if the time limit stopped the search (SIGTERM: it saves and exits),
# the newest cycle's.
GENOTYPE=$(ls -t "$WORK"/cifar10_search/genotype.json "$WORK"/cifar10_search/genotypes/*.json 2>/dev/null | head -1)
timed cifar10_retrain 120 python3 "$REPO/train.py" experiment=cifar10_snn "${CIFAR_DATA[@]}" epochs=3 \
  model.network.channels=16 model.network.layers=8 \
  genotype="$GENOTYPE" hydra.run.dir="$WORK/cifar10_retrain"

echo "retrained genotype: $GENOTYPE" >> "$OUT/summary.txt"
cp "$GENOTYPE" "$OUT/cifar10_genotype.json" 2>/dev/null
cp "$WORK/cifar10_retrain/metrics.json" "$OUT/cifar10_metrics.json" 2>/dev/null
cat "$OUT/summary.txt"
