"""evaluate_snn(sharded=True) on two CPU processes (gloo): each rank runs every other batch, and both
get the one-process evaluation of the whole set."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from search_space.genotypes import GENOTYPES
from search_space.qann import evaluate_snn
from tests.search_space.test_qann import qann_network


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(8)
    return [(torch.randn(n, 2, 12, 12, generator=generator, dtype=torch.float64), torch.arange(n) % 5)
            for n in (3, 2, 4)]  # odd count: rank 1 has one batch fewer


def _evaluate(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        calls = []
        result = evaluate_snn(qann_network(GENOTYPES["DARTS_V2"], seed=9).double(), _batches(), max_timesteps=256,
                              sharded=True, before_batch=lambda: calls.append(1))
        torch.save({"result": result, "calls": len(calls)}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_give_the_one_process_evaluation(tmp_path: Path) -> None:
    mp.spawn(_evaluate, args=(2, str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=2, join=True)
    alone = evaluate_snn(qann_network(GENOTYPES["DARTS_V2"], seed=9).double(), _batches(), max_timesteps=256)
    assert alone.silent and len(alone.accuracy_at) > 3 and 0 < alone.snn_accuracy < 1
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    for rank in ranks:
        assert rank["result"] == alone
    assert ranks[0]["calls"] == ranks[1]["calls"]  # before_batch in step on both (a collective stop check)
