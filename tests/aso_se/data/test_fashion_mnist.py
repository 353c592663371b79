"""Fashion-MNIST's three sources: torchvision's copy, Debian's package files, a download."""
import gzip
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from aso_se.data import FashionMNISTData
from aso_se.data.fashion_mnist import ALL_IDX_FILES, DEBIAN_DIR, IDX_FILES
from tests.aso_se.data.helpers import error_of, pick, write_idx_gz


@pytest.fixture(scope="module")
def idx_digits(tmp_path_factory, digits) -> tuple[Path, dict[str, tuple]]:
    """Real digits written as Debian's four gzipped IDX files (30 train, 10 test per class)."""
    images, labels = digits
    folder = tmp_path_factory.mktemp("fashion-mnist")
    written = {}
    for split, indices in (("train", pick(labels, 30)), ("test", pick(labels, 10, offset=30))):
        images_file, labels_file = IDX_FILES[split]
        write_idx_gz(folder / images_file, images[indices])
        write_idx_gz(folder / labels_file, labels[indices])
        written[split] = (torch.from_numpy(images[indices]), torch.from_numpy(labels[indices]))
    return folder, written


def test_reads_the_debian_package_layout(tmp_path, idx_digits):
    folder, written = idx_digits
    data = FashionMNISTData(root=str(tmp_path / "empty"), download=False, system_dir=str(folder))
    assert (data.name, data.num_classes, data.in_channels, data.image_size) == ("fashion_mnist", 10, 1, 28)
    for split, samples in (("train", data.splits.train), ("test", data.splits.test)):
        images, labels = samples.tensors
        assert images.shape == (len(written[split][0]), 1, 28, 28) and images.dtype == torch.uint8
        assert torch.equal(images[:, 0], written[split][0]) and torch.equal(labels, written[split][1])
    batch, _ = next(iter(data.train_loaders(16, seed=0)[0]))
    assert batch.shape == (16, 1, 28, 28) and batch.std() > 0.5


def test_a_torchvision_copy_under_root_comes_first(tmp_path, idx_digits):
    folder, written = idx_digits
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ALL_IDX_FILES:  # torchvision keeps the files unzipped
        (raw / name.removesuffix(".gz")).write_bytes(gzip.decompress((folder / name).read_bytes()))
    # Only the training labels differ between the two copies, so they show which one was read.
    shifted = (written["train"][1] + 1) % 10
    write_idx_gz(tmp_path / "labels.gz", shifted.numpy())
    (raw / "train-labels-idx1-ubyte").write_bytes(gzip.decompress((tmp_path / "labels.gz").read_bytes()))
    data = FashionMNISTData(root=str(tmp_path), download=False, system_dir=str(folder))
    assert torch.equal(data.splits.train_labels, shifted)


@pytest.mark.skipif(not Path(DEBIAN_DIR).is_dir(), reason="Debian's dataset-fashion-mnist package is not installed")
def test_real_fashion_mnist_from_the_debian_package(tmp_path):
    data = FashionMNISTData(root=str(tmp_path), download=False, max_test_samples=2000)
    assert (len(data.splits.train), len(data.splits.test)) == (60_000, 10_000)
    assert torch.bincount(data.splits.train_labels).tolist() == [6000] * 10
    histogram = torch.bincount(data.splits.train.tensors[0].flatten(), minlength=256).double()
    values = torch.arange(256, dtype=torch.float64) / 255
    mean = (histogram * values).sum() / histogram.sum()
    std = ((histogram * (values - mean) ** 2).sum() / histogram.sum()).sqrt()
    assert abs(mean - 0.2860) < 1e-3 and abs(std - 0.3530) < 1e-3  # Fashion-MNIST's published statistics
    images, labels = map(torch.cat, zip(*data.train_loaders(500, seed=0)[1]))
    assert images.shape == (2000, 1, 28, 28) and torch.bincount(labels).tolist() == [200] * 10


def copy_of(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ALL_IDX_FILES:
        (copy / name).write_bytes((folder / name).read_bytes())
    return copy


def test_truncated_idx_file(tmp_path, idx_digits):
    folder = copy_of(idx_digits[0], tmp_path)
    images_file = folder / IDX_FILES["train"][0]
    images_file.write_bytes(gzip.compress(gzip.decompress(images_file.read_bytes())[:-100]))
    data = FashionMNISTData(root=str(tmp_path / "empty"), download=False, system_dir=str(folder))
    assert error_of(lambda: data.splits) == (
        f"{images_file} holds 235100 bytes for shape (300, 28, 28); expected 235200; "
        "fix: apt-get install --reinstall dataset-fashion-mnist"
    )


def test_labels_that_do_not_match_the_images(tmp_path, idx_digits, digits):
    folder = copy_of(idx_digits[0], tmp_path)
    write_idx_gz(folder / IDX_FILES["test"][1], digits[1][:7])
    data = FashionMNISTData(root=str(tmp_path / "empty"), download=False, system_dir=str(folder))
    message = error_of(lambda: data.splits)
    assert message.startswith(f"{folder}: t10k-images-idx3-ubyte.gz has shape (100, 28, 28) and ")
    assert "t10k-labels-idx1-ubyte.gz (7,); expected [N, H, W] images and N labels" in message


def test_no_copy_and_no_network(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    data = FashionMNISTData(root=str(tmp_path / "data"), download=True, system_dir=str(tmp_path / "no-package"))
    message = error_of(lambda: data.splits)
    assert message.startswith(f"could not download Fashion-MNIST into {tmp_path / 'data'} (Error downloading ")
    assert f"{tmp_path / 'no-package'}/ with train-images-idx3-ubyte.gz" in message
    assert "fix: apt-get install dataset-fashion-mnist, or set data.root or ASO_SE_DATA, or use data=mnist5k" in message
