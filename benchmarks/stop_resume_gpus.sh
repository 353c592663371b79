#!/usr/bin/env bash
# benchmarks/stop_resume_loop.py on every GPU of this machine at once, one loop per GPU (its own trials),
# each starting no trial after BUDGET_S seconds. JSON lines and tables in $OUT/stops_gpu<i>.{jsonl,log}.
#   OUT=<dir> DATA=/tmp/cifar10 BUDGET_S=420 SEED0=0 bash benchmarks/stop_resume_gpus.sh [GPU indices]
set -uo pipefail
gpus=("$@")
[ ${#gpus[@]} -gt 0 ] || mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader)
for gpu in "${gpus[@]}"; do
  CUDA_VISIBLE_DEVICES=$gpu python3 benchmarks/stop_resume_loop.py --trials 50 --seed $((${SEED0:-0} + gpu)) \
    --data-root "$DATA" --delay 15 75 --budget-s "${BUDGET_S:-420}" --work "/tmp/stops_gpu$gpu" \
    --out "$OUT/stops_gpu$gpu.jsonl" > "$OUT/stops_gpu$gpu.log" 2>&1 &
done
wait
cat "$OUT"/stops_gpu*.jsonl | python3 -c "
import collections, json, sys
rows = [json.loads(line) for line in sys.stdin]
print(len(rows), 'trials:', dict(collections.Counter(r['outcome'] for r in rows)),
      'resumes matching:', sum(r.get('resume_matches') is True for r in rows),
      'resume stops:', dict(collections.Counter(r.get('resume_stop') for r in rows if 'resume_stop' in r)))"
