"""ImageFolder trees made of real MNIST-5k digits written as PNG, and every layout mistake."""
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from aso_se.data import DataError, ImageFolderData
from search_space.errors import UserInputError


def digit_data(root: Path, **kwargs) -> ImageFolderData:
    settings = dict(root=str(root), in_channels=1, image_size=28, mean=(0.5,), std=(0.5,), crop_padding=0, horizontal_flip=False)
    return ImageFolderData(**(settings | kwargs))


def test_png_digits_load_pixel_exact(digit_folder, digits):
    data = digit_data(digit_folder, name="png_digits")
    assert (data.name, data.num_classes, data.in_channels, data.image_size) == ("png_digits", 10, 1, 28)
    test = data.train_loaders(8, seed=0)[1]
    images, labels = map(torch.cat, zip(*test))
    assert images.shape == (40, 1, 28, 28) and torch.bincount(labels).tolist() == [4] * 10
    # The test loader runs in file order: test/<digit>/<index>.png, index = row in MNIST-5k.
    rows = [int(Path(path).stem) for path, _ in data.splits.test.samples]
    expected = torch.from_numpy(digits[0][rows]).float().unsqueeze(1) / 255
    assert torch.allclose(images * 0.5 + 0.5, expected, atol=1e-6)
    assert labels.tolist() == digits[1][rows].tolist()


def test_rgb_reading_and_resizing(digit_folder):
    data = ImageFolderData(root=str(digit_folder), image_size=16, cutout_length=4)
    weights, arch = data.search_loaders(10, seed=0)
    images, _ = next(iter(weights))
    assert images.shape == (10, 3, 16, 16)
    assert torch.equal(images[:, 0], images[:, 1])  # grey PNGs read as RGB: equal channels
    assert len(weights.sampler) + len(arch.sampler) == 120


def test_val_folder_stands_in_for_test(tmp_path, digit_folder):
    shutil.copytree(digit_folder / "train", tmp_path / "train")
    shutil.copytree(digit_folder / "test", tmp_path / "val")
    assert len(digit_data(tmp_path).splits.test) == 40


def copy_of(digit_folder: Path, tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(digit_folder, root)
    return root


def test_missing_root(tmp_path):
    with pytest.raises(DataError, match=rf"data root {tmp_path / 'nowhere'} does not exist; expected .*train/<class>/.*fix: set data.root or ASO_SE_DATA, or use data=mnist5k"):
        digit_data(tmp_path / "nowhere").num_classes


def test_missing_test_folder(tmp_path, digit_folder):
    root = copy_of(digit_folder, tmp_path)
    shutil.rmtree(root / "test")
    with pytest.raises(DataError, match=r"has no test/ \(or val/\) folder"):
        digit_data(root).splits


def test_missing_train_folder(tmp_path, digit_folder):
    root = copy_of(digit_folder, tmp_path)
    shutil.rmtree(root / "train")
    with pytest.raises(DataError, match=r"has no train/ folder"):
        digit_data(root).splits


def test_images_without_class_folders(tmp_path, digit_folder):
    root = copy_of(digit_folder, tmp_path)
    for image in (root / "test").rglob("*.png"):
        image.rename(root / "test" / f"{image.parent.name}_{image.name}")
    for folder in [p for p in (root / "test").iterdir() if p.is_dir()]:
        folder.rmdir()
    with pytest.raises(DataError, match=rf"{root / 'test'} has no class folders; expected .*/<class>/<images>"):
        digit_data(root).splits


def test_empty_class_folder(tmp_path, digit_folder):
    root = copy_of(digit_folder, tmp_path)
    for image in (root / "train" / "7").iterdir():
        image.unlink()
    with pytest.raises(DataError, match=rf"{root / 'train' / '7'} holds no image; expected files ending in .*\.png"):
        digit_data(root).splits


def test_class_folders_that_differ(tmp_path, digit_folder):
    root = copy_of(digit_folder, tmp_path)
    shutil.rmtree(root / "test" / "9")
    with pytest.raises(DataError, match=r"class folders differ under .*: only in train/: 9; only in test/: -; fix: use the same"):
        digit_data(root).splits


@pytest.mark.parametrize("num_workers", [0, 2])
def test_unreadable_image_is_one_line_with_its_path(tmp_path, digit_folder, num_workers):
    root = copy_of(digit_folder, tmp_path)
    broken = sorted((root / "test" / "3").iterdir())[1]
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + np.random.default_rng(0).bytes(64))  # a PNG that ends early
    test = digit_data(root, num_workers=num_workers).train_loaders(40, seed=0)[1]
    with pytest.raises(DataError) as caught:
        next(iter(test))
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith(f"cannot read image {broken} (") and message.endswith("fix: replace or delete it")
    assert isinstance(caught.value, UserInputError)


def test_channel_arguments_are_checked(digit_folder):
    with pytest.raises(DataError, match="data.in_channels=2 is invalid; expected 1 .* or 3"):
        ImageFolderData(root=str(digit_folder), in_channels=2)
    with pytest.raises(DataError, match=r"data.mean/data.std have 3/3 values; expected one per channel \(1\)"):
        ImageFolderData(root=str(digit_folder), in_channels=1)
