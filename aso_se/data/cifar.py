"""CIFAR-10 and CIFAR-100: torchvision's binary release (downloaded when allowed), or the same
images as an ImageFolder tree (``root/train/<class>/*``, ``root/test/<class>/*``)."""
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torchvision import datasets

from aso_se.data.base import ClassificationData, LoadedSplits
from aso_se.data.device_loader import DeviceAugment, DeviceEpochLoader, decode_uint8
from aso_se.data.errors import FIX_ROOT, DataError, check_positive
from aso_se.data.image_folder import LAYOUT, has_image_folder_layout, read_image_folder
from aso_se.data.sampling import ShardSampler, derive_seed
from aso_se.data.transforms import image_transforms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CIFARVariant:
    title: str
    torchvision_class: type[datasets.CIFAR10]
    num_classes: int
    mean: tuple[float, float, float]  # per-channel statistics of the training set,
    std: tuple[float, float, float]  # as used by DARTS and most CIFAR code


VARIANTS = {
    "cifar10": CIFARVariant("CIFAR-10", datasets.CIFAR10, 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": CIFARVariant("CIFAR-100", datasets.CIFAR100, 100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


class CIFARData(ClassificationData):
    """CIFAR-10/100 (``name`` picks which), 32×32 RGB, with the standard augmentation: random
    crop with ``crop_padding``, horizontal flip, optional cutout (DARTS retrains with 16)."""

    in_channels = 3
    image_size = 32

    def __init__(
        self,
        *,
        name: str,
        root: str,
        download: bool = True,
        crop_padding: int = 4,
        horizontal_flip: bool = True,
        cutout_length: int = 0,
        num_workers: int = 2,
        max_train_samples: int | None = None,
        max_test_samples: int | None = None,
        split_seed: int = 0,
        augment_on_device: bool = False,
    ) -> None:
        if name not in VARIANTS:
            raise DataError(f"data.name={name!r} is invalid; expected one of {', '.join(VARIANTS)}")
        self.variant = VARIANTS[name]
        train_transform, test_transform = image_transforms(
            mean=self.variant.mean, std=self.variant.std, image_size=self.image_size, resize=False,
            crop_padding=crop_padding, horizontal_flip=horizontal_flip, cutout_length=cutout_length,
        )
        super().__init__(
            train_transform=train_transform, test_transform=test_transform, num_workers=num_workers,
            max_train_samples=max_train_samples, max_test_samples=max_test_samples, split_seed=split_seed,
        )
        self.name = name
        self.root = Path(root).expanduser()
        self.download = download
        # The crop/flip/cutout settings again, for the device pipeline (aso_se.data.device_loader).
        self.augment_on_device = augment_on_device
        self.device_augment = DeviceAugment(mean=self.variant.mean, std=self.variant.std, crop_padding=crop_padding,
                                            horizontal_flip=horizontal_flip, cutout_length=cutout_length)

    def train_loaders(self, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1,
                      device: torch.device | None = None):
        """The host loaders, or with ``augment_on_device`` and a ``device``, loaders whose batches are
        made there (the splits decoded once to uint8 on the device)."""
        if not self.augment_on_device or device is None:
            return super().train_loaders(batch_size, seed=seed, rank=rank, world_size=world_size)
        check_positive(batch_size, "batch_size")
        train_images, test_images = (decode_uint8(split, self.num_workers).to(device)
                                     for split in (self.splits.train, self.splits.test))
        loaders = []
        for images, labels, limit, purpose, augment in (
            (train_images, self.splits.train_labels, self.max_train_samples, "train cap", self.device_augment),
            (test_images, self.splits.test_labels, self.max_test_samples, "test cap", None),
        ):
            indices = self._capped(labels, limit, purpose)
            sampler = ShardSampler(indices, seed=seed, rank=rank, world_size=world_size, shuffle=augment is not None)
            loaders.append(DeviceEpochLoader(images, labels.to(device), sampler, batch_size=batch_size,
                                             augment=augment, normalize=self.device_augment, seed=seed))
        return loaders[0], loaders[1]

    def search_loaders(self, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1,
                       device: torch.device | None = None):
        """The host loaders, or with ``augment_on_device`` and a ``device``, loaders whose batches are made
        there: no loader workers to restart at each epoch's start (a pause every rank of a short multi-GPU
        epoch waits for), no decoding beside the host-bound search step."""
        if not self.augment_on_device or device is None:
            return super().search_loaders(batch_size, seed=seed, rank=rank, world_size=world_size)
        check_positive(batch_size, "batch_size")
        images = decode_uint8(self.splits.train, self.num_workers).to(device)
        labels = self.splits.train_labels.to(device)
        weights_half, arch_half = self.search_halves()
        log.info("%s search halves: %d images for weights, %d for α (batches made on %s)",
                 self.name, len(weights_half), len(arch_half), device)
        return tuple(
            DeviceEpochLoader(images, labels, ShardSampler(half, seed=seed, rank=rank, world_size=world_size,
                                                           shuffle=True),
                              batch_size=batch_size, augment=self.device_augment, normalize=self.device_augment,
                              seed=derive_seed(seed, purpose))  # the halves' crops and flips independent
            for half, purpose in ((weights_half, "weights half"), (arch_half, "arch half"))
        )

    def _load(self) -> LoadedSplits:
        if not has_image_folder_layout(self.root):
            return self._read_torchvision()
        splits = read_image_folder(self.root, self.in_channels)
        title = self.variant.title
        if len(splits.classes) != self.variant.num_classes:
            raise DataError(
                f"{self.root} has {len(splits.classes)} class folders; expected the {self.variant.num_classes} classes "
                f"of {title}; fix: point data.root at a {title} copy or use data=image_folder"
            )
        first_path, _ = splits.train.samples[0]
        width, height = splits.train[0][0].size
        if (width, height) != (self.image_size, self.image_size):
            raise DataError(
                f"{first_path} is {width}x{height}; expected {self.image_size}x{self.image_size} {title} images; "
                "fix: use data=image_folder, which resizes to data.image_size"
            )
        return splits

    def _read_torchvision(self) -> LoadedSplits:
        title, torchvision_class = self.variant.title, self.variant.torchvision_class
        expected = f"{self.root / torchvision_class.base_folder}/ (torchvision) or, in {self.root}, {LAYOUT}"
        if not self.download and not self.root.is_dir():
            raise DataError(f"data root {self.root} does not exist; expected {expected}; fix: {FIX_ROOT}")
        try:
            train = torchvision_class(str(self.root), train=True, download=self.download)
            test = torchvision_class(str(self.root), train=False, download=self.download)
        except (OSError, RuntimeError) as error:  # URLError is an OSError
            if self.download:
                problem = f"could not download {title} into {self.root} ({error})"
            else:
                problem = f"no {title} under {self.root}"
            raise DataError(f"{problem}; expected {expected}; fix: put the files there and {FIX_ROOT}") from None
        train_labels, test_labels = torch.tensor(train.targets), torch.tensor(test.targets)
        return LoadedSplits(train, train_labels, test, test_labels, tuple(train.classes))
