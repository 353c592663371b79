"""Neuromorphic (DVS) datasets through spikingjelly 2.0, as event-count frames.

Samples are ``[T, 2, 128, 128]`` frames (T slices of equal event counts, channel = polarity) resized
to ``image_size``; batches are time-first, ``[T, B, 2, H, W]``, like every multi-step tensor here.
The files cannot be downloaded automatically: ``root`` must hold ``events_np/`` or the original
downloads in ``download/`` (converted on first use, slowly). We check before spikingjelly runs: on a
miss it would try to download and leave a ``.building`` marker that blocks every later attempt.
"""
from pathlib import Path
from zipfile import BadZipFile

import torch
from torch.utils.data import Dataset

from aso_se.data.base import ClassificationData, LoadedSplits, split_train_test
from aso_se.data.errors import DataError, check_fraction, check_positive
from aso_se.data.loaders import collate_time_first
from aso_se.data.transforms import frame_transforms

SENSOR_SIZE = 128  # both datasets were recorded with a 128 × 128 DVS


class NeuromorphicData(ClassificationData):
    """Shared part of the DVS datasets: on-disk checks, frame transforms, time-first batches."""

    in_channels = 2
    collate_fn = staticmethod(collate_time_first)
    source_page: str  # where users get the original files (set by each subclass)

    def __init__(
        self,
        *,
        root: str,
        timesteps: int,
        image_size: int,
        crop_padding: int,
        horizontal_flip: bool,
        cutout_length: int,
        num_workers: int,
        max_train_samples: int | None,
        max_test_samples: int | None,
        split_seed: int,
    ) -> None:
        check_positive(timesteps, "data.timesteps")
        check_positive(image_size, "data.image_size")
        train_transform, test_transform = frame_transforms(
            image_size=image_size, resize=image_size != SENSOR_SIZE,
            crop_padding=crop_padding, horizontal_flip=horizontal_flip, cutout_length=cutout_length,
        )
        super().__init__(
            train_transform=train_transform, test_transform=test_transform, num_workers=num_workers,
            max_train_samples=max_train_samples, max_test_samples=max_test_samples, split_seed=split_seed,
        )
        self.root = Path(root).expanduser()
        self.timesteps = timesteps
        self.image_size = image_size

    def _frames(self, dataset_class: type, **kwargs: bool) -> Dataset:
        """spikingjelly's frame dataset ``dataset_class(root, ..., **kwargs)`` (kwargs: e.g.
        DVS128Gesture's ``train``), after checking that its files exist."""
        self._check_files(dataset_class)
        try:
            return dataset_class(
                str(self.root), data_type="frame", frames_number=self.timesteps, split_by="number", **kwargs
            )
        except (OSError, EOFError, BadZipFile, RuntimeError, ValueError, NotImplementedError) as error:
            raise DataError(
                f"spikingjelly could not prepare {self.name} under {self.root} ({error}); fix: check the files against "
                f"{self.source_page}, delete half-written events_np/ or frames_number_*/ folders there and retry"
            ) from None

    def _check_files(self, dataset_class: type) -> None:
        markers = sorted(self.root.glob("*.building"))
        if markers:
            raise DataError(
                f"{markers[0]} marks an unfinished spikingjelly conversion; "
                f"fix: delete it and {markers[0].with_suffix('')} (if present), then retry"
            )
        if (self.root / "events_np").is_dir():
            return
        download = self.root / "download"
        expected = [name for name, _url, _md5 in dataset_class.resource_url_md5()]
        if not all((download / name).is_file() for name in expected):
            raise DataError(
                f"no {self.name} data under {self.root}: expected spikingjelly's converted {self.root}/events_np/ "
                f"or the original files {', '.join(expected)} in {download}/ (from {self.source_page}; "
                "they cannot be downloaded automatically); fix: put them there and set data.root or ASO_SE_DATA"
            )


class CIFAR10DVSData(NeuromorphicData):
    """CIFAR10-DVS (10 classes, 1,000 recordings each, no official split): a fixed stratified
    split by ``split_seed`` with ``test_fraction`` (0.1 = the usual 9:1). Note that the other
    common protocol, TEBN's (the first 100 recordings of each class for testing), is a different
    test set: compare accuracies only within one protocol."""

    name = "cifar10_dvs"
    source_page = "https://figshare.com/articles/dataset/CIFAR10-DVS_New/4724671"

    def __init__(
        self,
        *,
        root: str,
        timesteps: int = 10,
        image_size: int = 48,
        test_fraction: float = 0.1,
        crop_padding: int = 4,
        horizontal_flip: bool = True,
        cutout_length: int = 0,
        num_workers: int = 2,
        max_train_samples: int | None = None,
        max_test_samples: int | None = None,
        split_seed: int = 0,
    ) -> None:
        check_fraction(test_fraction, "data.test_fraction")
        super().__init__(
            root=root, timesteps=timesteps, image_size=image_size, crop_padding=crop_padding,
            horizontal_flip=horizontal_flip, cutout_length=cutout_length, num_workers=num_workers,
            max_train_samples=max_train_samples, max_test_samples=max_test_samples, split_seed=split_seed,
        )
        self.test_fraction = test_fraction

    def _load(self) -> LoadedSplits:
        from spikingjelly.datasets.cifar10_dvs import CIFAR10DVS, CIFAR10DVS_CLASS_NAMES

        frames = self._frames(CIFAR10DVS)
        if tuple(frames.classes) != CIFAR10DVS_CLASS_NAMES:
            raise DataError(
                f"{frames.root} has folders {', '.join(frames.classes)}; expected the 10 class folders "
                f"{', '.join(CIFAR10DVS_CLASS_NAMES)}; fix: remove other folders (e.g. a TEBN train/test split) from it"
            )
        labels = torch.tensor(frames.targets)
        return split_train_test(
            frames, labels, CIFAR10DVS_CLASS_NAMES, test_fraction=self.test_fraction, seed=self.split_seed
        )


class DVSGestureData(NeuromorphicData):
    """DVS128 Gesture (11 classes; the official train/test split by subject: 1,176 / 288
    samples in spikingjelly). Horizontal flips are off by default: they would turn left-hand
    gestures into right-hand ones, which are different classes. Labels follow spikingjelly's
    class folders ``0``..``10`` in string order (``0, 1, 10, 2, ...``); ``splits.classes``
    records that mapping."""

    name = "dvs_gesture"
    source_page = "https://ibm.ent.box.com/s/3hiq58ww1pbbjrinh367ykfdf60xsfm8/folder/50167556794"  # spikingjelly's

    def __init__(
        self,
        *,
        root: str,
        timesteps: int = 16,
        image_size: int = 64,
        crop_padding: int = 4,
        horizontal_flip: bool = False,
        cutout_length: int = 0,
        num_workers: int = 2,
        max_train_samples: int | None = None,
        max_test_samples: int | None = None,
        split_seed: int = 0,
    ) -> None:
        super().__init__(
            root=root, timesteps=timesteps, image_size=image_size, crop_padding=crop_padding,
            horizontal_flip=horizontal_flip, cutout_length=cutout_length, num_workers=num_workers,
            max_train_samples=max_train_samples, max_test_samples=max_test_samples, split_seed=split_seed,
        )

    def _load(self) -> LoadedSplits:
        from spikingjelly.datasets.dvs128_gesture import DVS128Gesture

        train, test = self._frames(DVS128Gesture, train=True), self._frames(DVS128Gesture, train=False)
        return LoadedSplits(train, torch.tensor(train.targets), test, torch.tensor(test.targets), tuple(train.classes))
