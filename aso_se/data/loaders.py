"""DataLoaders whose batches are a pure function of (seed, epoch), for any number of workers.

Workers ignore the main process's stop signals (`ignore_in_workers`): a signal to the whole process
group must reach the main process alone, which finishes its step, saves and shuts the workers down.
"""
import contextlib
import functools
import multiprocessing
import signal
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from aso_se.data.errors import check_positive
from aso_se.data.sampling import ShardSampler, derive_seed


class SeededTransformDataset(Dataset):
    """``transform(samples[index])`` for a key ``(epoch, index)`` from a ``ShardSampler``.

    torch's default CPU generator is seeded from (seed, epoch, index) for the transform and
    restored afterwards, so augmentation does not depend on worker count or worker RNG state,
    and nothing leaks into the caller's RNG stream when ``num_workers=0``.
    """

    def __init__(self, samples: Dataset, transform: Callable, seed: int) -> None:
        self.samples = samples
        self.transform = transform
        self.seed = seed

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key
        image, label = self.samples[index]
        generator = torch.default_generator
        state = generator.get_state()
        generator.manual_seed(derive_seed(self.seed, epoch, index))
        try:
            return self.transform(image), int(label)
        finally:
            generator.set_state(state)


def collate_time_first(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack DVS samples ``[T, 2, H, W]`` into the model's time-first ``[T, B, 2, H, W]``."""
    frames, labels = zip(*batch)
    return torch.stack(frames, dim=1), torch.tensor(labels)


# Signals that workers of loaders built from now on ignore: a run's stop signals (aso_se.run.stop_signals).
_IGNORED_IN_WORKERS: tuple[int, ...] = ()
_LOADERS: "weakref.WeakSet[EpochLoader]" = weakref.WeakSet()
# Every pass's worker processes, each with the id under which torch watches its pass's workers for a death.
_WORKERS: "weakref.WeakKeyDictionary[multiprocessing.process.BaseProcess, int]" = weakref.WeakKeyDictionary()


def ignore_in_workers(signums: Iterable[int]) -> tuple[int, ...]:
    """Workers of loaders built from now on ignore ``signums``; returns the previous set."""
    global _IGNORED_IN_WORKERS
    previous, _IGNORED_IN_WORKERS = _IGNORED_IN_WORKERS, tuple(signums)
    return previous


def _ignore_signals(signums: tuple[int, ...], worker_id: int) -> None:
    """worker_init_fn: ignore the stop signals, then unblock them (blocked since the fork)."""
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)  # replaces torch's SIGTERM handler, which kills the worker
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signums)  # a signal pending since the fork is now dropped


@contextlib.contextmanager
def _blocked(signums: tuple[int, ...]) -> Iterator[None]:
    """Block ``signums`` in this thread while workers fork: until their init function ignores
    them, a signal to the group would hit torch's worker handler and kill them."""
    if not signums:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def shutdown_workers() -> None:
    """Stop the workers (and pin-memory threads) of every live EpochLoader now; a run calls it
    before it exits, since torch skips the shutdown at interpreter exit (see `_stop_workers`).

    Then kill any loader worker still alive: one a dropped loader's pass left behind (a pass cut short,
    e.g. the energy count's, then its loader freed) ignores SIGTERM, the stop signal, so the interpreter's
    exit, which terminates and joins its children, would wait on it for ever."""
    for loader in list(_LOADERS):
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            _stop_workers(iterator)
            loader._iterator = None
    for process, pass_id in list(_WORKERS.items()):
        if process.is_alive():
            try:  # no longer watched: torch would report the kill below as a worker's failure
                torch._C._remove_worker_pids(pass_id)
            except (RuntimeError, ValueError):  # its pass (or its other worker) already stopped watching
                pass
            process.kill()
            process.join(timeout=10)
    _WORKERS.clear()


def _stop_workers(iterator: Any) -> None:
    """Stops a failed pass's workers now and joins its queues' feeder threads.

    Left to interpreter exit, torch skips the worker shutdown and a feeder thread can print an EBADF
    traceback after the user's one-line error; joined here, no thread is left to print anything."""
    shutdown = getattr(iterator, "_shutdown_workers", None)  # absent without workers
    if shutdown is None:
        return
    shutdown()
    queues = [*getattr(iterator, "_index_queues", []), getattr(iterator, "_worker_result_queue", None)]
    for queue in queues:
        feeder = getattr(queue, "_thread", None)
        if feeder is not None:
            feeder.join(timeout=10)


def worker_context(num_workers: int) -> Any:
    """The multiprocessing context for ``num_workers`` loader workers: None (torch's default) unless this process
    runs under a start method that is not the standard library's, e.g. a job of Hydra's joblib launcher (loky),
    whose Process type DataLoader's workers can't use; then the platform's usual fork (Linux) or spawn."""
    method = multiprocessing.get_start_method(allow_none=True)
    if num_workers == 0 or method in (None, "fork", "spawn", "forkserver"):
        return None
    return multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")


class EpochLoader(DataLoader):
    """A DataLoader over a ``ShardSampler``; call ``set_epoch(epoch)`` before each epoch.

    Workers persist across epochs when ``num_workers > 0``; memory is pinned only when CUDA is
    available. A private generator feeds DataLoader's per-iteration worker base seed, which
    would otherwise be drawn from the global RNG at every ``iter()``: a resumed run would then
    see the model's RNG stream shifted. Workers' own RNG is unused (see SeededTransformDataset).
    Workers ignore the stop signals set by `ignore_in_workers` when the loader was built.
    """

    def __init__(
        self,
        dataset: SeededTransformDataset,
        sampler: ShardSampler,
        *,
        batch_size: int,
        num_workers: int,
        collate_fn: Callable[[list], Any] | None = None,
    ) -> None:
        super().__init__(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=num_workers > 0,
            multiprocessing_context=worker_context(num_workers),
            generator=torch.Generator(),
            worker_init_fn=functools.partial(_ignore_signals, _IGNORED_IN_WORKERS),
        )
        self._ignored_signals = _IGNORED_IN_WORKERS if num_workers > 0 else ()
        _LOADERS.add(self)

    def __iter__(self) -> Iterator[Any]:
        with _blocked(self._ignored_signals):  # the workers (if any start now) inherit the mask
            iterator = super().__iter__()
        _WORKERS.update((process, id(iterator)) for process in getattr(iterator, "_workers", ()))
        try:
            yield from iterator
        except Exception:
            _stop_workers(iterator)
            self._iterator = None  # persistent workers: a later pass starts fresh ones
            raise

    def close(self) -> None:
        """Stops the persistent workers now, a pass left unfinished included, and joins their queues' feeder threads.
        A loader dropped with its workers up leaves them to the garbage collector, whose shutdown races the feeder
        threads: they print EBADF tracebacks into a run that went well. The next pass starts new workers."""
        if self._iterator is not None:
            _stop_workers(self._iterator)
            self._iterator = None

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Batch order and augmentation of the next pass depend only on (seed, epoch).
        ``start_batch=k`` resumes that epoch at its batch k: the first k batches are skipped
        without being loaded, and the rest are exactly those of a full pass."""
        check_positive(start_batch, "start_batch", allow_zero=True)
        self.sampler.set_epoch(epoch, skip=start_batch * self.batch_size)
