"""DataLoaders whose batches are a pure function of (seed, epoch), for any number of workers."""
from collections.abc import Callable, Iterator
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


class EpochLoader(DataLoader):
    """A DataLoader over a ``ShardSampler``; call ``set_epoch(epoch)`` before each epoch.

    Workers persist across epochs when ``num_workers > 0``; memory is pinned only when CUDA is
    available. A private generator feeds DataLoader's per-iteration worker base seed, which
    would otherwise be drawn from the global RNG at every ``iter()``: a resumed run would then
    see the model's RNG stream shifted. Workers' own RNG is unused (see SeededTransformDataset).
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
            generator=torch.Generator(),
        )

    def __iter__(self) -> Iterator[Any]:
        iterator = super().__iter__()
        try:
            yield from iterator
        except Exception:
            _stop_workers(iterator)
            self._iterator = None  # persistent workers: a later pass starts fresh ones
            raise

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Batch order and augmentation of the next pass depend only on (seed, epoch).
        ``start_batch=k`` resumes that epoch at its batch k: the first k batches are skipped
        without being loaded, and the rest are exactly those of a full pass."""
        check_positive(start_batch, "start_batch", allow_zero=True)
        self.sampler.set_epoch(epoch, skip=start_batch * self.batch_size)
