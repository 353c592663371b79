#!/usr/bin/env bash
# The QANN search (experiment=cifar10_qann: batch 512 per split and process, so N GPUs take N times fewer steps)
# on N GPUs of this machine, cut to 1 warm-up and $SEARCH_EPOCHS search epochs of the whole training set. Prints
# each epoch's images/s, and from the per-step TensorBoard events the median step time and the pauses between
# epochs (what an epoch costs beyond its steps: checkpoint, figures, loader restart).
#   OUT=<dir> DATA=/tmp/cifar10 bash benchmarks/search_scaling.sh "1 2 4" [extra search.py overrides]
# (EXPERIMENT=smoke WORKERS=0 without DATA: the same on the embedded digits, seconds on a CPU)
set -uo pipefail
COUNTS=${1:-"1 2 4"}; shift || true
for n in $COUNTS; do
  dir=$OUT/search_${n}gpu${TAG:-}
  launch=(python3 -m torch.distributed.run --standalone --nproc_per_node="$n" search.py trainer=ddp)
  [ "$n" = 1 ] && launch=(python3 search.py)
  "${launch[@]}" experiment="${EXPERIMENT:-cifar10_qann}" ${DATA:+data.root="$DATA"} data.num_workers="${WORKERS:-12}" \
    trainer.log_every_n_steps=1 \
    search.schedule.cycles=1 search.schedule.warmup_epochs=1 search.schedule.search_epochs="${SEARCH_EPOCHS:-4}" \
    search.schedule.restabilize_epochs=0 hydra.run.dir="$dir" "$@" > "$dir.log" 2>&1 \
    || { echo "$n GPUs: exit $?"; tail -5 "$dir.log"; continue; }
  python3 - "$dir" "$n" <<'PY'
import re, statistics, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run, n = sys.argv[1], sys.argv[2]
rates = re.findall(r"(warmup|search) \(epoch (\d+)\).*images_per_second ([\d.e+]+).*seconds ([\d.]+)", open(f"{run}/search.log").read())
print(f"{n} GPU(s): epochs " + ", ".join(f"{p} {e}: {float(r):.0f} img/s {s} s" for p, e, r, s in rates))
events = EventAccumulator(f"{run}/tb", size_guidance={"scalars": 0}); events.Reload()
times = [e.wall_time for e in events.Scalars("search/loss")]
gaps = [b - a for a, b in zip(times, times[1:])]
step = statistics.median(gaps)
pauses = [f"{g:.2f}" for g in gaps if g > 2.5 * step]
ends = [f"{e.value:.2f}" for e in events.Scalars("search_epoch/end_seconds")] if "search_epoch/end_seconds" in events.Tags()["scalars"] else []
print(f"   {len(times)} steps, median step {step * 1000:.0f} ms; pauses over 2.5x a step (s): {pauses}; "
      f"of which rank 0's epoch-end callback (s): {ends}")
PY
done
