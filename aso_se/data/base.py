"""The object every ``conf/data/<name>.yaml`` instantiates, and its two loader methods."""
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from aso_se.data.errors import DataError, check_positive
from aso_se.data.loaders import EpochLoader, SeededTransformDataset
from aso_se.data.sampling import ShardSampler, derive_seed, stratified_order

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedSplits:
    """A dataset's untransformed ``(image, label)`` samples; labels also as tensors, so that
    splits and caps never have to read an image."""

    train: Dataset
    train_labels: torch.Tensor
    test: Dataset
    test_labels: torch.Tensor
    classes: tuple[str, ...]


def split_train_test(
    samples: Dataset, labels: torch.Tensor, classes: tuple[str, ...], *, test_fraction: float, seed: int
) -> LoadedSplits:
    """A fixed stratified train/test split (for datasets that come without one); depends only
    on ``seed`` — the dataset's ``split_seed`` — so every run tests on the same samples."""
    order = stratified_order(labels, derive_seed(seed, "test split"))
    test_size = round(len(labels) * test_fraction)
    test, train = order[:test_size], order[test_size:]
    return LoadedSplits(
        Subset(samples, train.tolist()), labels[train], Subset(samples, test.tolist()), labels[test], classes
    )


class ClassificationData(ABC):
    """A labelled image (or DVS-frame) dataset with its search and train loaders.

    Attributes: ``name``, ``num_classes``, ``in_channels``, ``image_size``, ``timesteps`` (None for
    static images, batches ``[B, C, H, W]`` the model repeats over T; T for DVS, batches ``[T, B, 2, H, W]``).
    Files are read on first use, so a ``DataError`` is not wrapped by Hydra's ``instantiate``. After
    ``set_epoch(epoch)`` loaders yield ``(inputs, labels)`` in an order and augmentation that depend on
    (seed, epoch) only. ``rank``/``world_size`` shard for DDP: training shards disjoint and equally long.
    """

    name: str
    in_channels: int
    image_size: int
    timesteps: int | None = None
    collate_fn: Callable[[list], Any] | None = None

    def __init__(
        self,
        *,
        train_transform: Callable,
        test_transform: Callable,
        num_workers: int,
        max_train_samples: int | None,
        max_test_samples: int | None,
        split_seed: int,
    ) -> None:
        check_positive(num_workers, "data.num_workers", allow_zero=True)
        check_positive(max_train_samples, "data.max_train_samples", allow_none=True)
        check_positive(max_test_samples, "data.max_test_samples", allow_none=True)
        check_positive(split_seed, "data.split_seed", allow_zero=True)
        self.train_transform = train_transform
        self.test_transform = test_transform
        self.num_workers = num_workers
        self.max_train_samples = max_train_samples
        self.max_test_samples = max_test_samples
        self.split_seed = split_seed

    @abstractmethod
    def _load(self) -> LoadedSplits:
        """Read (or index) the files; raise ``DataError`` for anything the user must fix."""

    @cached_property
    def splits(self) -> LoadedSplits:
        return self._load()

    @property
    def num_classes(self) -> int:
        return len(self.splits.classes)

    def search_loaders(
        self, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1, device: torch.device | None = None
    ) -> tuple[EpochLoader, EpochLoader]:
        """(weights, architecture) loaders over two disjoint, stratified halves of the
        (capped) training set. Both use the training transforms, as DARTS's train_search does.
        ``device``: as for `train_loaders`."""
        weights_half, arch_half = self.search_halves()
        dataset = SeededTransformDataset(self.splits.train, self.train_transform, seed)
        log.info("%s search halves: %d images for weights, %d for α", self.name, len(weights_half), len(arch_half))
        return (
            self._loader(dataset, weights_half, batch_size, seed=seed, rank=rank, world_size=world_size, shuffle=True),
            self._loader(dataset, arch_half, batch_size, seed=seed, rank=rank, world_size=world_size, shuffle=True),
        )

    def search_halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training-set indices of the weights' and α's halves (stratified, fixed by ``split_seed``)."""
        train = self._capped(self.splits.train_labels, self.max_train_samples, "train cap")
        order = stratified_order(self.splits.train_labels[train], derive_seed(self.split_seed, "search halves"))
        return train[order[: len(order) // 2]], train[order[len(order) // 2 :]]

    def train_loaders(
        self, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1, device: torch.device | None = None
    ) -> tuple[EpochLoader, EpochLoader]:
        """(train, test) loaders: the (capped) training set augmented and shuffled, the
        (capped) test set in a fixed order without augmentation. ``device``: where a data set that
        can make its batches on the device (CIFAR's ``augment_on_device``) makes them; others ignore it."""
        train = self._capped(self.splits.train_labels, self.max_train_samples, "train cap")
        test = self._capped(self.splits.test_labels, self.max_test_samples, "test cap")
        log.info("%s: %d training and %d test images", self.name, len(train), len(test))
        return (
            self._loader(
                SeededTransformDataset(self.splits.train, self.train_transform, seed),
                train, batch_size, seed=seed, rank=rank, world_size=world_size, shuffle=True,
            ),
            self._loader(
                SeededTransformDataset(self.splits.test, self.test_transform, seed),
                test, batch_size, seed=seed, rank=rank, world_size=world_size, shuffle=False,
            ),
        )

    def _capped(self, labels: torch.Tensor, limit: int | None, purpose: str) -> torch.Tensor:
        """All indices, or a stratified subset of ``limit`` fixed by ``split_seed``."""
        if limit is None or limit >= len(labels):
            return torch.arange(len(labels))
        return stratified_order(labels, derive_seed(self.split_seed, purpose))[:limit].sort().values

    def _loader(
        self,
        dataset: SeededTransformDataset,
        indices: torch.Tensor,
        batch_size: int,
        *,
        seed: int,
        rank: int,
        world_size: int,
        shuffle: bool,
    ) -> EpochLoader:
        check_positive(batch_size, "batch_size")
        check_positive(seed, "seed", allow_zero=True)
        check_positive(world_size, "world_size")
        if not 0 <= rank < world_size:
            raise DataError(f"rank={rank} is invalid for world_size={world_size}; expected 0 <= rank < world_size")
        if len(indices) < world_size:
            raise DataError(
                f"{self.name}: {len(indices)} images cannot be shared by {world_size} processes; "
                "fix: raise data.max_train_samples/max_test_samples or use fewer processes"
            )
        sampler = ShardSampler(indices, seed=seed, rank=rank, world_size=world_size, shuffle=shuffle)
        return EpochLoader(
            dataset, sampler, batch_size=batch_size, num_workers=self.num_workers, collate_fn=self.collate_fn
        )
