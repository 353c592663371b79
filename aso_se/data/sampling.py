"""Seeds, stratified splits and per-rank shards: everything random about the data is a pure
function of integers (split seed, run seed, epoch, sample index), never of hidden RNG state."""
import hashlib
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def derive_seed(*parts: int | str) -> int:
    """A 64-bit seed hashed from ``parts``: different tuples give unrelated seeds
    (integer-like parts, e.g. numpy ints, count as the same ``int``)."""
    canonical = repr(tuple(part if isinstance(part, str) else int(part) for part in parts))
    return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "little")


def stratified_order(labels: torch.Tensor, seed: int) -> torch.Tensor:
    """All indices of ``labels`` in a seeded order in which every prefix holds each class in
    (within one sample) its overall proportion, so ``order[:k]`` is a stratified subset of size
    k and ``order[k:]`` the stratified rest."""
    generator = torch.Generator().manual_seed(seed)
    shuffled = torch.randperm(len(labels), generator=generator)
    shuffled_labels = labels[shuffled]
    class_sizes = torch.bincount(shuffled_labels)
    class_starts = torch.cumsum(class_sizes, 0) - class_sizes
    by_class = torch.argsort(shuffled_labels, stable=True)
    rank_in_class = torch.empty_like(shuffled)
    rank_in_class[by_class] = torch.arange(len(labels)) - class_starts[shuffled_labels[by_class]]
    # Sorting by the fractional position inside the own class interleaves the classes evenly.
    position = (rank_in_class + 0.5) / class_sizes[shuffled_labels]
    return shuffled[torch.argsort(position, stable=True)]


class ShardSampler(Sampler[tuple[int, int]]):
    """This rank's share of ``indices``, yielded as ``(epoch, index)`` keys.

    The key carries the epoch to the dataset, even into persistent workers, to seed augmentation.
    ``shuffle=True`` (training): reshuffled from ``(seed, epoch)`` alone, dealt round-robin, the
    remainder dropped so shards are disjoint and every rank runs the same number of steps (as DDP
    needs). ``shuffle=False`` (evaluation): fixed order, every sample once over all ranks.
    ``set_epoch(epoch, skip)`` drops the epoch's first ``skip`` keys (a run resumed mid-epoch).
    """

    def __init__(self, indices: torch.Tensor, *, seed: int, rank: int, world_size: int, shuffle: bool) -> None:
        self.indices = indices
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch = epoch
        self.skip = skip

    def _shard_size(self) -> int:
        if self.shuffle:
            return len(self.indices) // self.world_size
        return len(range(self.rank, len(self.indices), self.world_size))

    def __len__(self) -> int:
        return max(0, self._shard_size() - self.skip)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices = self.indices
        if self.shuffle:
            generator = torch.Generator().manual_seed(derive_seed(self.seed, self.epoch))
            indices = indices[torch.randperm(len(indices), generator=generator)]
            indices = indices[: self._shard_size() * self.world_size]
        for index in indices[self.rank :: self.world_size][self.skip :].tolist():
            yield self.epoch, index
