"""Fashion-MNIST's three sources: torchvision's copy, Debian's package files, a download."""
import gzip
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from aso_se.data import DataError, FashionMNISTData
from aso_se.data.fashion_mnist import DEBIAN_DIR, IDX_FILES
from tests.data.files import pick, write_idx_gz


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
    for files in IDX_FILES.values():
        for name in files:  # torchvision keeps them unzipped; only the training labels differ
            content = gzip.decompress((folder / name).read_bytes())
            (raw / name.removesuffix(".gz")).write_bytes(content)
    shifted = (written["train"][1] + 1) % 10
    (raw / "train-labels-idx1-ubyte").write_bytes(gzip.decompress((folder / IDX_FILES["train"][1]).read_bytes())[:8] + shifted.numpy().astype("uint8").tobytes())
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


def test_corrupt_idx_file(tmp_path, idx_digits):
    folder, _ = idx_digits
    broken = tmp_path / "broken"
    broken.mkdir()
    for files in IDX_FILES.values():
        for name in files:
            (broken / name).write_bytes((folder / name).read_bytes())
    images_file = broken / IDX_FILES["train"][0]
    images_file.write_bytes(gzip.compress(gzip.decompress(images_file.read_bytes())[:-100]))
    with pytest.raises(DataError, match=rf"{images_file} holds 235100 bytes for shape \(300, 28, 28\); expected 235200"):
        FashionMNISTData(root=str(tmp_path / "empty"), download=False, system_dir=str(broken)).splits


def test_no_copy_and_no_network(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    data = FashionMNISTData(root=str(tmp_path / "data"), download=True, system_dir=str(tmp_path / "no-package"))
    with pytest.raises(DataError) as caught:
        data.splits
    message = str(caught.value)
    assert message.startswith(f"could not download Fashion-MNIST into {tmp_path / 'data'} (") and "\n" not in message
    assert f"{tmp_path / 'no-package'}/ with train-images-idx3-ubyte.gz" in message
    assert "fix: apt-get install dataset-fashion-mnist, or set data.root or ASO_SE_DATA, or use data=mnist5k" in message
