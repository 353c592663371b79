"""Two CPU processes (gloo): α and weights stay identical while each rank sees other data."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from aso_se.parallel.distributed import broadcast_module, check_identical_across_ranks
from tests.aso_se.helpers import make_engine, tiny_supernet


def _search_steps(rank: int, world_size: int, init_file: str, out_dir: str, channels_last: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(100 + rank)  # different global RNG per rank: the engine must not depend on it
        engine = make_engine(tiny_supernet("relu", timesteps=1, in_channels=3, seed=100 + rank), seed=7,
                             channels_last=channels_last)
        broadcast_module(engine.supernet)  # what run() does first: rank 0's initial weights everywhere
        generator = torch.Generator().manual_seed(rank)  # each rank its own data
        for _ in range(2):
            images = torch.randn(4, 3, 16, 16, generator=generator)
            labels = torch.randint(0, 10, (4,), generator=generator)
            engine.train_step((images, labels), (images.flip(0), labels.flip(0)), temperature=1.0)
        torch.save(engine.supernet.state_dict(), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("channels_last", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["nchw", "channels_last"])  # nchw, the plain layout: out of CI
def test_ranks_stay_identical(tmp_path: Path, channels_last: bool) -> None:
    mp.spawn(_search_steps, args=(2, str(tmp_path / "rendezvous"), str(tmp_path), channels_last), nprocs=2, join=True)
    states = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    for name, value in states[0].items():
        if "running" in name or "num_batches" in name:  # BatchNorm statistics are per rank, as in DARTS
            continue
        assert torch.equal(value, states[1][name]), name
    initial = tiny_supernet("relu", timesteps=1, in_channels=3, seed=100).state_dict()
    moved = sum(not torch.equal(initial[name], value) for name, value in states[0].items() if "arch." in name)
    assert moved == 2  # both α sets were updated


def _compare_alpha(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        alpha = torch.randn(14, 8, generator=torch.Generator().manual_seed(3))
        check_identical_across_ranks(alpha, "α")  # equal everywhere: passes
        swapped = alpha.clone()
        if rank == 1:  # same values, two entries swapped: the sum alone would not see it
            swapped[0, 0], swapped[5, 3] = alpha[5, 3], alpha[0, 0]
        try:
            check_identical_across_ranks(swapped, "α")
            outcome = "passed"
        except RuntimeError as err:
            outcome = str(err)
        Path(out_dir, f"rank{rank}.txt").write_text(outcome)
    finally:
        dist.destroy_process_group()


def test_alpha_check_catches_ranks_that_differ(tmp_path: Path) -> None:
    mp.spawn(_compare_alpha, args=(2, str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):  # both ranks raise, so neither waits for the other at the next collective
        assert (tmp_path / f"rank{rank}.txt").read_text().startswith("α differs between processes")


@pytest.mark.slow
def test_two_nodes_of_two_processes_meet_through_a_c10d_rendezvous(tmp_path):
    """Two torchrun agents on this host stand in for two machines (c10d rendezvous, 4 gloo ranks):
    the search runs on all four, α checked identical on every rank each cycle, rank 0 alone writes."""
    import os
    import socket
    import subprocess
    import sys

    from tests.aso_se.run.helpers import REPO

    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-nodes", str(REPO / "search.py"), "experiment=smoke",
         "logger=none", "trainer=ddp", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [agent.communicate(timeout=300)[0] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert "(cpu, 4 processes)" in (run_dir / "search.log").read_text()
    assert (run_dir / "genotype.json").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]  # no rank but 0 wrote anything
