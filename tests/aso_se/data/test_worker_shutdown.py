"""A run's exit must not wait on loader workers: they ignore SIGTERM (the stop signal), and the interpreter's exit
terminates and then joins its children, so a worker that a dropped loader left behind would hold the exit for ever
(what train.py with snn_finetune on a CPU hit: the energy count's pass cut short, its loader then freed)."""
from __future__ import annotations

import multiprocessing
import signal

import torch

from aso_se.data import loaders
from aso_se.data.loaders import EpochLoader, SeededTransformDataset, ignore_in_workers, shutdown_workers
from aso_se.data.sampling import ShardSampler


def _live_workers(before: set[int]) -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.pid not in before]


def test_shutdown_kills_workers_that_no_tracked_loader_holds() -> None:
    before = {p.pid for p in multiprocessing.active_children()}
    previous = ignore_in_workers((signal.SIGTERM,))
    try:
        samples = [(torch.full((3, 2, 2), float(i)), i) for i in range(8)]
        loader = EpochLoader(SeededTransformDataset(samples, lambda x: x, seed=0),
                             ShardSampler(torch.arange(8), seed=0, rank=0, world_size=1, shuffle=False),
                             batch_size=2, num_workers=2)
        loader.set_epoch(0)
        batches = iter(loader)
        inputs, labels = next(batches)  # a pass cut short: its persistent workers stay up
        assert labels.tolist() == [0, 1] and inputs[1, 0, 0, 0].item() == 1.0
        workers = _live_workers(before)
        assert len(workers) == 2
        workers[0].terminate()  # SIGTERM is ignored: terminate() alone cannot stop them
        workers[0].join(timeout=1)
        assert workers[0].is_alive()
        loaders._LOADERS.discard(loader)  # as for a loader freed with its workers still up
        shutdown_workers()
        assert _live_workers(before) == []
        assert all(not w.is_alive() for w in workers)
    finally:
        ignore_in_workers(previous)


def test_close_stops_the_workers_of_a_pass_cut_short_and_the_next_pass_starts_afresh() -> None:
    """What the energy count leaves (a pass cut short, its persistent workers up) is stopped by ``close``: no
    worker and no queue feeder thread is left for the garbage collector, whose shutdown printed EBADF tracebacks
    into train.py runs that went well."""
    before = {p.pid for p in multiprocessing.active_children()}
    samples = [(torch.full((3, 2, 2), float(i)), i) for i in range(40)]
    loader = EpochLoader(SeededTransformDataset(samples, lambda x: x, seed=0),
                         ShardSampler(torch.arange(40), seed=0, rank=0, world_size=1, shuffle=False),
                         batch_size=4, num_workers=2)
    loader.set_epoch(0)
    for index, (_, labels) in enumerate(loader):
        if index == 2:
            break
    workers = _live_workers(before)
    assert len(workers) == 2 and loader._iterator is not None
    queues = [*loader._iterator._index_queues, loader._iterator._worker_result_queue]
    feeders = [queue._thread for queue in queues if getattr(queue, "_thread", None) is not None]
    assert feeders and any(feeder.is_alive() for feeder in feeders)
    loader.close()
    assert loader._iterator is None and _live_workers(before) == []
    assert not [feeder for feeder in feeders if feeder.is_alive()]
    loader.close()  # a second close, or one before any pass, does nothing
    loader.set_epoch(1)
    assert [labels.tolist() for _, labels in loader][-1] == [36, 37, 38, 39]  # a whole pass on new workers
    loader.close()
    assert _live_workers(before) == []
