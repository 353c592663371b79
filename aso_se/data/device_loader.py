"""Image batches made on the device: the whole split held there as uint8, augmented per batch.

A full-size retrain on one GPU eats thousands of images per second; worker processes decoding and
augmenting one image at a time on the host then cost more than the step (benchmarks/RESULTS.md,
"Full-size retrain"). Here the split is decoded once into a ``[N, C, H, W]`` uint8 tensor on the
device, and each batch is gathered, cropped, flipped, normalized and cut out there in a few kernels.

The augmentation is the host transforms' (``aso_se.data.transforms``): a random crop of the image
zero-padded by ``crop_padding``, a horizontal flip with probability 1/2, normalization, then cutout
(a ``cutout_length`` square of zeros centred on a uniform pixel). Its draws come from a generator
seeded by (seed, epoch, batch), so a batch depends on those integers only, not on the number of
ranks before it or on how the run was resumed.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.functional import pil_to_tensor

from aso_se.data.loaders import worker_context
from aso_se.data.sampling import ShardSampler, derive_seed


class DeviceAugment:
    """Batched crop/flip/normalize/cutout of uint8 ``[B, C, H, W]`` images, on their device."""

    def __init__(self, *, mean: tuple[float, ...], std: tuple[float, ...], crop_padding: int,
                 horizontal_flip: bool, cutout_length: int) -> None:
        self.mean, self.std = mean, std
        self.crop_padding = crop_padding
        self.horizontal_flip = horizontal_flip
        self.cutout_length = cutout_length

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=images.device).view(1, -1, 1, 1)
        return (images.float() / 255.0 - mean) / std

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        batch, _, height, width = images.shape
        device = images.device

        def uniform_ints(high: int) -> torch.Tensor:
            return torch.randint(high, (batch,), generator=generator, device=device)

        if self.crop_padding > 0:
            pad = self.crop_padding
            padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
            top, left = uniform_ints(2 * pad + 1), uniform_ints(2 * pad + 1)
            rows = (top[:, None] + torch.arange(height, device=device))[:, None, :, None]
            cols = (left[:, None] + torch.arange(width, device=device))[:, None, None, :]
            samples = torch.arange(batch, device=device)[:, None, None, None]
            channels = torch.arange(images.shape[1], device=device)[None, :, None, None]
            images = padded[samples, channels, rows, cols]
        if self.horizontal_flip:
            flip = uniform_ints(2).bool().view(-1, 1, 1, 1)
            images = torch.where(flip, images.flip(-1), images)
        out = self.normalize(images)
        if self.cutout_length > 0:
            half = self.cutout_length // 2
            y, x = uniform_ints(height), uniform_ints(width)
            ys = torch.arange(height, device=device)[None, :, None]
            xs = torch.arange(width, device=device)[None, None, :]
            inside = ((ys >= (y - half).clamp(min=0)[:, None, None]) & (ys < (y + half)[:, None, None])
                      & (xs >= (x - half).clamp(min=0)[:, None, None]) & (xs < (x + half)[:, None, None]))
            out = out.masked_fill(inside[:, None], 0.0)
        return out


class DeviceEpochLoader:
    """``(inputs, labels)`` batches of this rank's shard, made on ``images``' device.

    The order and sharding are a ``ShardSampler``'s (the host loaders'): ``set_epoch(epoch,
    start_batch)`` reshuffles from (seed, epoch) and skips an interrupted epoch's first batches.
    ``augment=None`` (evaluation) only normalizes. Training (``augment`` given) drops an incomplete last
    batch: a captured step replays one batch shape, and another shape would run eagerly once per epoch.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, sampler: ShardSampler, *,
                 batch_size: int, augment: DeviceAugment | None, normalize: DeviceAugment,
                 seed: int) -> None:
        self.images, self.labels = images, labels
        self.sampler = sampler
        self.batch_size = batch_size
        self.augment, self.normalize = augment, normalize
        self.seed = seed
        self._start_batch = 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.sampler.set_epoch(epoch, skip=start_batch * self.batch_size)
        self._start_batch = start_batch

    def __len__(self) -> int:
        if self.augment is not None:
            return len(self.sampler) // self.batch_size
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        keys = torch.tensor([index for _, index in self.sampler], dtype=torch.long)
        keys = keys[: len(self) * self.batch_size]
        order = keys.to(self.images.device, non_blocking=True)
        generator = torch.Generator(device=self.images.device)
        for offset, start in enumerate(range(0, len(order), self.batch_size), start=self._start_batch):
            chosen = order[start:start + self.batch_size]
            images = self.images.index_select(0, chosen)
            if self.augment is None:
                inputs = self.normalize.normalize(images)
            else:
                generator.manual_seed(derive_seed(self.seed, self.sampler.epoch, offset) % 2**63)
                inputs = self.augment(images, generator)
            yield inputs, self.labels.index_select(0, chosen)


def decode_uint8(samples: Dataset, num_workers: int) -> torch.Tensor:
    """Every ``(image, label)`` of ``samples`` (PIL images, or torchvision's CIFAR arrays) as one uint8
    ``[N, C, H, W]`` tensor on the host, decoded by ``num_workers`` processes."""
    data = getattr(samples, "data", None)
    if data is not None and getattr(data, "ndim", 0) == 4:  # torchvision's CIFAR: uint8 [N, H, W, C] in memory
        return torch.from_numpy(data).permute(0, 3, 1, 2).contiguous()
    loader = DataLoader(_AsTensor(samples), batch_size=1024, num_workers=num_workers,
                        multiprocessing_context=worker_context(num_workers))
    return torch.cat([images for images in loader])


class _AsTensor(Dataset):
    def __init__(self, samples: Dataset) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> torch.Tensor:
        return pil_to_tensor(self.samples[index][0])
