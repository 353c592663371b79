"""ImageFolder trees made of real MNIST-5k digits written as PNG, and every layout mistake."""
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from aso_se.data import ImageFolderData
from tests.aso_se.data.helpers import error_of


def digit_data(root: Path, **kwargs) -> ImageFolderData:
    settings = dict(in_channels=1, image_size=28, mean=(0.5,), std=(0.5,), crop_padding=0, horizontal_flip=False)
    return ImageFolderData(root=str(root), **(settings | kwargs))


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
    root = tmp_path / "nowhere"
    assert error_of(lambda: digit_data(root).num_classes) == (
        f"data root {root} does not exist; expected a folder with train/<class>/<images> and test/<class>/<images> "
        "(or val/); fix: set data.root or ASO_SE_DATA, or use data=mnist5k"
    )


@pytest.mark.parametrize(("removed", "named"), [("test", "test/ (or val/)"), ("train", "train/")])
def test_missing_split_folder(tmp_path, digit_folder, removed, named):
    root = copy_of(digit_folder, tmp_path)
    shutil.rmtree(root / removed)
    message = error_of(lambda: digit_data(root).splits)
    assert message.startswith(f"data root {root} has no {named} folder; expected train/")


def test_images_without_class_folders(tmp_path, digit_folder):
    root = copy_of(digit_folder, tmp_path)
    for image in list((root / "test").rglob("*.png")):
        image.rename(root / "test" / f"{image.parent.name}_{image.name}")
    for folder in [p for p in (root / "test").iterdir() if p.is_dir()]:
        folder.rmdir()
    message = error_of(lambda: digit_data(root).splits)
    assert message.startswith(f"{root / 'test'} has no class folders; expected {root / 'test'}/<class>/<images>; fix:")


def test_empty_class_folder(tmp_path, digit_folder):
    root = copy_of(digit_folder, tmp_path)
    for image in (root / "train" / "7").iterdir():
        image.unlink()
    message = error_of(lambda: digit_data(root).splits)
    assert message.startswith(f"{root / 'train' / '7'} holds no image; expected files ending in .jpg, .jpeg, .png")
    assert message.endswith("fix: add images or remove the folder")


def test_class_folders_that_differ(tmp_path, digit_folder):
    root = copy_of(digit_folder, tmp_path)
    shutil.rmtree(root / "test" / "9")
    assert error_of(lambda: digit_data(root).splits) == (
        f"class folders differ under {root}: only in train/: 9; only in test/: -; "
        "fix: use the same class folder names in both"
    )


def break_one_png(digit_folder: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = copy_of(digit_folder, tmp_path)
    broken = sorted((root / "test" / "3").iterdir())[1]
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + np.random.default_rng(0).bytes(64))  # a PNG that ends early
    return root, broken


def test_unreadable_image_is_reported_by_path(tmp_path, digit_folder):
    root, broken = break_one_png(digit_folder, tmp_path)
    test = digit_data(root).train_loaders(40, seed=0)[1]
    message = error_of(lambda: next(iter(test)))
    assert message == (
        f"cannot read image {broken} (cannot identify image file '{broken}'); expected a readable image file; "
        "fix: replace or delete it"
    )


def test_unreadable_image_in_a_worker_is_still_one_line(tmp_path, digit_folder):
    """Run in a fresh process, as a user would: the worker's error arrives as the same one line,
    and nothing else reaches stderr. (In-process, torch's collection of a DataLoader iterator
    whose worker raised races its queue feeder thread and prints EBADF noise later.)"""
    root, broken = break_one_png(digit_folder, tmp_path)
    script = f"""
import sys
from aso_se.data import ImageFolderData
from aso_se.data.errors import DataError
data = ImageFolderData(root={str(root)!r}, in_channels=1, image_size=28, mean=(0.5,), std=(0.5,), num_workers=2)
try:
    next(iter(data.train_loaders(40, seed=0)[1]))
except DataError as error:
    print(error)
    sys.exit(1)
"""
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stdout == (
        f"cannot read image {broken} (cannot identify image file '{broken}'); expected a readable image file; "
        "fix: replace or delete it\n"
    )
    assert done.stderr == ""


def test_a_failed_pass_stops_its_workers_before_the_error_leaves(tmp_path, digit_folder):
    """No worker or queue feeder thread outlives the error (left to interpreter exit, a feeder
    thread once printed an EBADF traceback after the one line); the next pass starts afresh."""
    root, broken = break_one_png(digit_folder, tmp_path)
    data = ImageFolderData(root=str(root), in_channels=1, image_size=28, mean=(0.5,), std=(0.5,), num_workers=2)
    loader = data.train_loaders(40, seed=0)[1]
    for _ in range(2):
        message = error_of(lambda: [batch for batch in loader])
        assert message.startswith(f"cannot read image {broken}")
        assert loader._iterator is None
        assert not [t for t in threading.enumerate() if t.name == "QueueFeederThread" and t.is_alive()]


def test_channel_arguments_are_checked(digit_folder):
    assert error_of(lambda: ImageFolderData(root=str(digit_folder), in_channels=2)) == (
        "data.in_channels=2 is invalid; expected 1 (grayscale) or 3 (RGB)"
    )
    assert error_of(lambda: ImageFolderData(root=str(digit_folder), in_channels=1)) == (
        "data.mean/data.std have 3/3 values; expected one per channel (1)"
    )
