"""Fashion-MNIST: torchvision's copy under ``root``, else the gzipped IDX files that Debian's
``dataset-fashion-mnist`` package installs, else a torchvision download when allowed."""
import gzip
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset
from torchvision import datasets

from aso_se.data.base import ClassificationData, LoadedSplits
from aso_se.data.errors import FIX_ROOT, DataError
from aso_se.data.transforms import image_transforms

# Where Debian's package dataset-fashion-mnist installs the original gzipped files (listed
# from its .deb, version 0.0~git20200523.55506a9-1 in bookworm).
DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
ALL_IDX_FILES = [name for files in IDX_FILES.values() for name in files]
REINSTALL = "apt-get install --reinstall dataset-fashion-mnist"
# Mean and std of the 60k training images.
FASHION_MEAN, FASHION_STD = (0.2860,), (0.3530,)


def read_idx_gz(path: Path) -> torch.Tensor:
    """A gzipped IDX file of unsigned bytes (magic ``00 00 08 <ndim>``, then ``ndim``
    big-endian int32 sizes, then the data) as a uint8 tensor."""
    try:
        with gzip.open(path, "rb") as file:
            raw = file.read()
    except OSError as error:
        raise DataError(f"cannot read {path} ({error}); expected a gzipped IDX file; fix: {REINSTALL}") from None
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
        raise DataError(f"{path} is not an unsigned-byte IDX file; expected magic 00 00 08; fix: {REINSTALL}")
    ndim = raw[3]
    shape = tuple(np.frombuffer(raw, ">i4", count=ndim, offset=4).tolist())
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != np.prod(shape):
        raise DataError(
            f"{path} holds {data.size} bytes for shape {shape}; expected {np.prod(shape)}; fix: {REINSTALL}"
        )
    return torch.from_numpy(data.reshape(shape).copy())


class FashionMNISTData(ClassificationData):
    """Fashion-MNIST, 28×28 grayscale, 10 classes, in memory (60k train, 10k test)."""

    name = "fashion_mnist"
    in_channels = 1
    image_size = 28

    def __init__(
        self,
        *,
        root: str,
        download: bool = True,
        system_dir: str = DEBIAN_DIR,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
        cutout_length: int = 0,
        num_workers: int = 0,
        max_train_samples: int | None = None,
        max_test_samples: int | None = None,
        split_seed: int = 0,
    ) -> None:
        train_transform, test_transform = image_transforms(
            mean=FASHION_MEAN, std=FASHION_STD, image_size=self.image_size, resize=False,
            crop_padding=crop_padding, horizontal_flip=horizontal_flip, cutout_length=cutout_length,
        )
        super().__init__(
            train_transform=train_transform, test_transform=test_transform, num_workers=num_workers,
            max_train_samples=max_train_samples, max_test_samples=max_test_samples, split_seed=split_seed,
        )
        self.root = Path(root).expanduser()
        self.download = download
        self.system_dir = Path(system_dir)

    def _load(self) -> LoadedSplits:
        if self._has_system_copy() and not self._has_torchvision_copy():
            train, test = self._read_system_copy("train"), self._read_system_copy("test")
        else:
            train, test = self._read_torchvision("train"), self._read_torchvision("test")
        return LoadedSplits(
            TensorDataset(*train), train[1], TensorDataset(*test), test[1], tuple(datasets.FashionMNIST.classes)
        )

    def _has_torchvision_copy(self) -> bool:
        raw = self.root / "FashionMNIST" / "raw"  # torchvision keeps the files unzipped there
        return all((raw / name.removesuffix(".gz")).is_file() for name in ALL_IDX_FILES)

    def _has_system_copy(self) -> bool:
        return all((self.system_dir / name).is_file() for name in ALL_IDX_FILES)

    def _read_system_copy(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        images_file, labels_file = IDX_FILES[split]
        images, labels = read_idx_gz(self.system_dir / images_file), read_idx_gz(self.system_dir / labels_file)
        if images.dim() != 3 or labels.dim() != 1 or len(images) != len(labels):
            raise DataError(
                f"{self.system_dir}: {images_file} has shape {tuple(images.shape)} and {labels_file} "
                f"{tuple(labels.shape)}; expected [N, H, W] images and N labels; fix: {REINSTALL}"
            )
        return images.unsqueeze(1), labels.long()

    def _read_torchvision(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            dataset = datasets.FashionMNIST(str(self.root), train=split == "train", download=self.download)
        except (OSError, RuntimeError) as error:  # torchvision turns a failed download into RuntimeError
            if self.download:
                problem = f"could not download Fashion-MNIST into {self.root} ({error})"
            else:
                problem = f"no Fashion-MNIST under {self.root}"
            raise DataError(
                f"{problem}; expected {self.root}/FashionMNIST/raw/ (torchvision) or {self.system_dir}/ with "
                f"{', '.join(ALL_IDX_FILES)}; fix: apt-get install dataset-fashion-mnist, or {FIX_ROOT}"
            ) from None
        return dataset.data.unsqueeze(1), dataset.targets
