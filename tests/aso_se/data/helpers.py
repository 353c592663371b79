"""Shared by the data tests: files made from real MNIST-5k digits in the formats the data layer
reads, and the check that a user error is one ``DataError`` line."""
import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aso_se.data.errors import DataError
from search_space.errors import UserInputError


def error_of(action: Callable[[], object]) -> str:
    """The message of the ``DataError`` that ``action()`` raises; it must be one line."""
    with pytest.raises(DataError) as caught:
        action()
    message = str(caught.value)
    assert isinstance(caught.value, UserInputError) and message and "\n" not in message
    return message


def pick(labels: np.ndarray, per_class: int, offset: int = 0) -> np.ndarray:
    """Indices of ``per_class`` digits of every class, starting at ``offset`` within each."""
    return np.concatenate([np.flatnonzero(labels == c)[offset : offset + per_class] for c in range(10)])


def write_image_tree(root: Path, images: np.ndarray, labels: np.ndarray, *,
                     to_image: Callable[[np.ndarray], Image.Image], class_name: Callable[[int], str] = str) -> Path:
    """An ImageFolder tree of real digits as PNG: train/<class>/ (12 per class), test/<class>/ (4 per class)."""
    for split, indices in (("train", pick(labels, 12)), ("test", pick(labels, 4, offset=12))):
        for index in indices:
            folder = root / split / class_name(int(labels[index]))
            folder.mkdir(parents=True, exist_ok=True)
            to_image(images[index]).save(folder / f"{index:04d}.png")
    return root


def write_idx_gz(path: Path, array: np.ndarray) -> None:
    """An unsigned-byte IDX file, gzipped, as the MNIST/Fashion-MNIST distributions ship it."""
    header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
    with gzip.open(path, "wb") as file:
        file.write(header + array.astype(np.uint8).tobytes())


def digit_events(image: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A DVS-like event stream from a real digit: each bright pixel fires ``value // 64``
    events at its spot on a 128 × 128 sensor, polarity from the pixel's parity, random times."""
    rows, cols = np.nonzero(image >= 64)
    counts = image[rows, cols] // 64
    y = np.repeat(rows * 4 + 8, counts)
    x = np.repeat(cols * 4 + 8, counts)
    p = np.repeat(image[rows, cols] % 2, counts)
    order = rng.permutation(len(x))
    t = np.sort(rng.integers(0, 1_000_000, len(x)))
    return {
        "t": t.astype(np.int64),
        "x": x[order].astype(np.int16),
        "y": y[order].astype(np.int16),
        "p": p[order].astype(np.uint8),
    }
