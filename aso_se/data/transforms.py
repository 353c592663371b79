"""Per-sample transforms: the standard augmentation (random crop with padding, horizontal
flip, cutout) and normalization, for images (PIL or uint8 tensors) and for DVS frames.

Every random draw uses torch's default CPU generator, which ``SeededTransformDataset`` seeds
per sample, so augmentation is reproducible from (seed, epoch, index).
"""
import torch
from torchvision.transforms import v2

from aso_se.data.errors import check_positive


class Cutout:
    """Zero one ``length`` × ``length`` square (clipped at the border) centred on a uniformly
    drawn pixel, on every leading channel/frame alike (DeVries & Taylor 2017, as in DARTS)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        height, width = image.shape[-2:]
        y = int(torch.randint(height, ()))
        x = int(torch.randint(width, ()))
        half = self.length // 2
        image = image.clone()
        image[..., max(0, y - half) : y + half, max(0, x - half) : x + half] = 0
        return image


def _augmentation(image_size: int, crop_padding: int, horizontal_flip: bool, cutout_length: int) -> tuple[list, list]:
    """Random steps (crop, flip) for the uint8/raw image, and cutout for the final tensor."""
    check_positive(crop_padding, "data.crop_padding", allow_zero=True)
    check_positive(cutout_length, "data.cutout_length", allow_zero=True)
    steps = []
    if crop_padding > 0:
        steps.append(v2.RandomCrop(image_size, padding=crop_padding))
    if horizontal_flip:
        steps.append(v2.RandomHorizontalFlip())
    return steps, [Cutout(cutout_length)] if cutout_length > 0 else []


def image_transforms(
    *,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    image_size: int,
    resize: bool,
    crop_padding: int,
    horizontal_flip: bool,
    cutout_length: int,
) -> tuple[v2.Compose, v2.Compose]:
    """(train, test) transforms from a PIL image or a uint8 ``[C, H, W]`` tensor to a
    normalized float ``[C, image_size, image_size]`` tensor. ``resize`` scales to
    ``image_size`` first (for folders of arbitrary images); the test transform never augments."""
    head = [v2.ToImage()] + ([v2.Resize((image_size, image_size), antialias=True)] if resize else [])
    tail = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    augment, cutout = _augmentation(image_size, crop_padding, horizontal_flip, cutout_length)
    train = v2.Compose(head + augment + tail + cutout + [v2.ToPureTensor()])
    test = v2.Compose(head + tail + [v2.ToPureTensor()])
    return train, test


def frame_transforms(
    *,
    image_size: int,
    resize: bool,
    crop_padding: int,
    horizontal_flip: bool,
    cutout_length: int,
) -> tuple[v2.Compose, v2.Compose]:
    """(train, test) transforms from spikingjelly's float32 event-count frames
    ``np.ndarray [T, 2, H, W]`` to a ``[T, 2, image_size, image_size]`` tensor. Resizing
    averages counts (antialiased), so values are event densities; no normalization."""
    head = [torch.from_numpy] + ([v2.Resize((image_size, image_size), antialias=True)] if resize else [])
    augment, cutout = _augmentation(image_size, crop_padding, horizontal_flip, cutout_length)
    train = v2.Compose(head + augment + cutout)
    test = v2.Compose(head)
    return train, test
