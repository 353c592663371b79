"""Folders of images, ``root/train/<class>/*`` and ``root/test/<class>/*`` (or ``val/``), read
with torchvision's ImageFolder; every layout problem becomes a one-line ``DataError``."""
from functools import partial
from pathlib import Path

import torch
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from aso_se.data.base import ClassificationData, LoadedSplits
from aso_se.data.errors import FIX_ROOT, DataError, check_positive
from aso_se.data.transforms import image_transforms

PIL_MODES = {1: "L", 3: "RGB"}
LAYOUT = "train/<class>/<images> and test/<class>/<images> (or val/)"


def load_image(path: str, mode: str) -> Image.Image:
    """The image at ``path`` converted to ``mode``; decoding happens here, in the worker, so a
    broken file is reported with its path when it is first read."""
    try:
        with Image.open(path) as image:
            return image.convert(mode)
    except (OSError, ValueError) as error:
        raise DataError(
            f"cannot read image {path} ({error}); expected a readable image file; fix: replace or delete it"
        ) from None


def has_image_folder_layout(root: Path) -> bool:
    return (root / "train").is_dir()


def read_split(split_dir: Path, mode: str) -> ImageFolder:
    """One split folder; every class folder must hold at least one image."""
    if not any(entry.is_dir() for entry in split_dir.iterdir()):
        raise DataError(
            f"{split_dir} has no class folders; expected {split_dir}/<class>/<images>; "
            "fix: put each class's images in a folder of its own"
        )
    images = ImageFolder(str(split_dir), loader=partial(load_image, mode=mode), allow_empty=True)
    counts = torch.bincount(torch.tensor(images.targets, dtype=torch.long), minlength=len(images.classes))
    for name, count in zip(images.classes, counts.tolist()):
        if count == 0:
            raise DataError(
                f"{split_dir / name} holds no image; expected files ending in {', '.join(IMG_EXTENSIONS)}; "
                "fix: add images or remove the folder"
            )
    return images


def read_image_folder(root: Path, in_channels: int) -> LoadedSplits:
    """Train and test splits of an ImageFolder tree (``test/`` or else ``val/``)."""
    if not root.is_dir():
        raise DataError(f"data root {root} does not exist; expected a folder with {LAYOUT}; fix: {FIX_ROOT}")
    test_dir = next((root / name for name in ("test", "val") if (root / name).is_dir()), None)
    if not has_image_folder_layout(root) or test_dir is None:
        missing = "test/ (or val/)" if has_image_folder_layout(root) else "train/"
        raise DataError(
            f"data root {root} has no {missing} folder; expected {LAYOUT}; "
            "fix: arrange the images so or point data.root at such a folder"
        )
    train = read_split(root / "train", PIL_MODES[in_channels])
    test = read_split(test_dir, PIL_MODES[in_channels])
    if train.classes != test.classes:
        only_train = sorted(set(train.classes) - set(test.classes)) or ["-"]
        only_test = sorted(set(test.classes) - set(train.classes)) or ["-"]
        raise DataError(
            f"class folders differ under {root}: only in train/: {', '.join(only_train)}; only in "
            f"{test_dir.name}/: {', '.join(only_test)}; fix: use the same class folder names in both"
        )
    return LoadedSplits(
        train, torch.tensor(train.targets), test, torch.tensor(test.targets), tuple(train.classes)
    )


class ImageFolderData(ClassificationData):
    """Any ImageFolder tree; images are resized to ``image_size`` × ``image_size`` and
    normalized with the given per-channel ``mean``/``std``."""

    def __init__(
        self,
        *,
        root: str,
        name: str = "image_folder",
        in_channels: int = 3,
        image_size: int = 32,
        mean: tuple[float, ...] = (0.5, 0.5, 0.5),
        std: tuple[float, ...] = (0.5, 0.5, 0.5),
        crop_padding: int = 4,
        horizontal_flip: bool = True,
        cutout_length: int = 0,
        num_workers: int = 0,
        max_train_samples: int | None = None,
        max_test_samples: int | None = None,
        split_seed: int = 0,
    ) -> None:
        if in_channels not in PIL_MODES:
            raise DataError(f"data.in_channels={in_channels!r} is invalid; expected 1 (grayscale) or 3 (RGB)")
        if len(mean) != in_channels or len(std) != in_channels:
            raise DataError(
                f"data.mean/data.std have {len(mean)}/{len(std)} values; expected one per channel ({in_channels})"
            )
        check_positive(image_size, "data.image_size")
        train_transform, test_transform = image_transforms(
            mean=mean, std=std, image_size=image_size, resize=True,
            crop_padding=crop_padding, horizontal_flip=horizontal_flip, cutout_length=cutout_length,
        )
        super().__init__(
            train_transform=train_transform, test_transform=test_transform, num_workers=num_workers,
            max_train_samples=max_train_samples, max_test_samples=max_test_samples, split_seed=split_seed,
        )
        self.root = Path(root).expanduser()
        self.name = name
        self.in_channels = in_channels
        self.image_size = image_size

    def _load(self) -> LoadedSplits:
        return read_image_folder(self.root, self.in_channels)
