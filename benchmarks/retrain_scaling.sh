#!/usr/bin/env bash
# The full-size retrain (DARTS_V2 20x36 QANN, graphs, channels_last, batches made on the GPU) on 1, 2 and 4 GPUs
# of this machine, one after the other: images/s per epoch from each run's metrics.json.
#   OUT=<dir> DATA=/tmp/cifar10 bash benchmarks/retrain_scaling.sh "1 2 4" [extra train.py overrides]
set -euo pipefail
COUNTS=${1:-"1 2 4"}; shift || true
for n in $COUNTS; do
  dir=$OUT/scale_$n
  python3 -m torch.distributed.run --standalone --nproc_per_node="$n" train.py trainer=ddp \
    experiment=cifar10_qann genotype=DARTS_V2 data.root="$DATA" data.augment_on_device=true \
    cuda_graph=true channels_last=true model.network.conv_backend=torch logger=none \
    snn_max_timesteps=8 data.max_test_samples=1000 hydra.run.dir="$dir" "$@" > "$OUT/scale_$n.log" 2>&1 \
    || { echo "$n GPUs: exit $?"; tail -5 "$OUT/scale_$n.log"; continue; }
  python3 - "$dir/metrics.json" "$n" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
rates = [round(h["images_per_second"]) for h in m["history"]]
print(f"{sys.argv[2]} GPU(s): images/s per epoch {rates}, wall {m['wall_time_s']:.0f} s, "
      f"test acc {[round(h['test_acc'], 4) for h in m['history']]}, train loss {[round(h['train_loss'], 4) for h in m['history']]}")
PY
done
