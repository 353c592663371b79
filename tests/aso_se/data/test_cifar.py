"""CIFAR-10 from the real JPEG copy (ASO_SE_CIFAR10, skipped when unset) and CIFAR's errors."""
import os
import urllib.error
import urllib.request

import pytest
import torch

from aso_se.data import CIFARData
from tests.aso_se.data.helpers import error_of

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@pytest.mark.skipif(not os.environ.get("ASO_SE_CIFAR10"), reason="ASO_SE_CIFAR10 (the unpacked JPEG copy) is unset")
def test_cifar10_jpeg_copy():
    root = os.environ["ASO_SE_CIFAR10"]
    data = CIFARData(name="cifar10", root=root, download=False, max_train_samples=600, max_test_samples=500)
    assert (data.num_classes, data.in_channels, data.image_size, data.timesteps) == (10, 3, 32, None)
    assert data.splits.classes == CIFAR10_CLASSES
    assert (len(data.splits.train), len(data.splits.test)) == (50_000, 10_000)
    weights, arch = data.search_loaders(50, seed=0)
    assert len(weights.sampler) == len(arch.sampler) == 300
    images, labels = next(iter(weights))
    assert images.shape == (50, 3, 32, 32) and labels.max() < 10
    # Random crops with 4 pixels of zero padding leave padded (black) borders on some images.
    black = -torch.tensor(data.variant.mean) / torch.tensor(data.variant.std)
    border = images[:, :, 0, :].permute(0, 2, 1)  # top rows, [B, W, C]
    assert torch.isclose(border, black, atol=1e-5).all(-1).all(-1).any()
    test_images, test_labels = map(torch.cat, zip(*data.train_loaders(100, seed=0)[1]))
    assert torch.bincount(test_labels).tolist() == [50] * 10
    # Normalized with CIFAR-10's training statistics, the real test images are close to N(0, 1).
    mean, std = test_images.mean(dim=(0, 2, 3)), test_images.std(dim=(0, 2, 3))
    assert mean.abs().max() < 0.1 and ((std > 0.85) & (std < 1.15)).all()


def test_offline_download(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)  # what torchvision meets with no network
    root = tmp_path / "data"
    message = error_of(lambda: CIFARData(name="cifar10", root=str(root), download=True).train_loaders(8, seed=0))
    assert message.startswith(f"could not download CIFAR-10 into {root} (<urlopen error [Errno -2] Name or service")
    assert f"expected {root}/cifar-10-batches-py/ (torchvision) or, in {root}, train/<class>/<images>" in message
    assert message.endswith("fix: put the files there and set data.root or ASO_SE_DATA, or use data=mnist5k")


def test_missing_root_without_download(tmp_path):
    root = tmp_path / "nowhere"
    message = error_of(lambda: CIFARData(name="cifar10", root=str(root), download=False).splits)
    assert message.startswith(f"data root {root} does not exist; expected {root}/cifar-10-batches-py/")
    assert message.endswith("fix: set data.root or ASO_SE_DATA, or use data=mnist5k")


def test_wrong_layout_without_download(tmp_path):
    (tmp_path / "images").mkdir()
    message = error_of(lambda: CIFARData(name="cifar100", root=str(tmp_path), download=False).splits)
    assert message.startswith(f"no CIFAR-100 under {tmp_path}; expected {tmp_path}/cifar-100-python/ (torchvision) or")


def test_wrong_number_of_classes(digit_folder):
    message = error_of(lambda: CIFARData(name="cifar100", root=str(digit_folder)).num_classes)
    assert message == (
        f"{digit_folder} has 10 class folders; expected the 100 classes of CIFAR-100; "
        "fix: point data.root at a CIFAR-100 copy or use data=image_folder"
    )


def test_unknown_variant():
    message = error_of(lambda: CIFARData(name="cifar1000", root="data"))
    assert message == "data.name='cifar1000' is invalid; expected one of cifar10, cifar100"


def test_images_of_the_wrong_size(digit_folder):
    message = error_of(lambda: CIFARData(name="cifar10", root=str(digit_folder)).splits)
    assert message.startswith(f"{digit_folder}/train/0/") and message.endswith(
        ".png is 28x28; expected 32x32 CIFAR-10 images; fix: use data=image_folder, which resizes to data.image_size"
    )
