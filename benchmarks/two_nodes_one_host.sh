#!/usr/bin/env bash
# Two torchrun agents on one host stand in for two machines (c10d rendezvous, NCCL), each with half of
# the GPUs: the search (short CIFAR-10 QANN schedule), then the retrain. Logs in $OUT/two_nodes_*.log.
#   OUT=<dir> DATA=/tmp/cifar10 bash benchmarks/two_nodes_one_host.sh
set -uo pipefail
gpus=$(nvidia-smi -L | wc -l); per_node=$((gpus / 2))
node() {  # node <rank> <entry point> <overrides...>
  local rank=$1 entry=$2; shift 2
  CUDA_VISIBLE_DEVICES=$(seq -s, $((rank * per_node)) $((rank * per_node + per_node - 1))) \
    python3 -m torch.distributed.run --nnodes=2 --nproc_per_node=$per_node --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:29531 --rdzv-id="$entry-$$" "$entry.py" trainer=ddp "$@"
}
short=(data.root="$DATA" data.max_train_samples=8192 logger=none)
for entry in search train; do
  if [ $entry = search ]; then args=(experiment=cifar10_qann search.schedule.warmup_epochs=1 search.schedule.search_epochs=2
    search.schedule.restabilize_epochs=1 "${short[@]}" hydra.run.dir=/tmp/two_nodes_search)
  else args=(experiment=cifar10_qann genotype=/tmp/two_nodes_search/genotype.json epochs=2 data.max_test_samples=2048
    snn_eval_samples=256 "${short[@]}" hydra.run.dir=/tmp/two_nodes_train); fi
  node 0 $entry "${args[@]}" > "$OUT/two_nodes_${entry}_0.log" 2>&1 & first=$!
  node 1 $entry "${args[@]}" > "$OUT/two_nodes_${entry}_1.log" 2>&1; second=$?
  wait $first; echo "$entry: node exits $? $second"
  grep -hE "processes\)|search \(epoch|retrain epoch|genotype:|SNN:|error" "$OUT/two_nodes_${entry}_0.log" | cut -c1-220 | tail -6
done
