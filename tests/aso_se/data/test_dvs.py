"""DVS datasets through spikingjelly, on event streams made from real MNIST-5k digits laid out
as spikingjelly's converted events (``root/events_np``); and the errors when files are absent."""
from pathlib import Path

import numpy as np
import pytest
import torch

from aso_se.data import CIFAR10DVSData, DVSGestureData
from tests.aso_se.data.helpers import digit_events, error_of, pick

CIFAR10_DVS_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def write_events(folder: Path, name: str, image: np.ndarray, rng: np.random.Generator) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / f"{name}.npz", **digit_events(image, rng))


@pytest.fixture(scope="module")
def gesture_root(tmp_path_factory, digits) -> Path:
    """DVS128 Gesture layout: events_np/{train,test}/<0..10>/ (2 train, 1 test per class)."""
    images, labels = digits
    root, rng = tmp_path_factory.mktemp("dvs_gesture"), np.random.default_rng(0)
    for gesture in range(11):
        same_digit = np.flatnonzero(labels == gesture % 10)[5 * (gesture // 10) :]  # 10 reuses other zeros
        for split, indices in (("train", same_digit[:2]), ("test", same_digit[2:3])):
            for index in indices:
                write_events(root / "events_np" / split / str(gesture), f"user{index:04d}", images[index], rng)
    return root


@pytest.fixture(scope="module")
def cifar10_dvs_root(tmp_path_factory, digits) -> Path:
    """CIFAR10-DVS layout: events_np/<class>/cifar10_<class>_<i>.npz, 3 recordings per class."""
    images, labels = digits
    root, rng = tmp_path_factory.mktemp("cifar10_dvs"), np.random.default_rng(1)
    for index in pick(labels, 3):
        name = CIFAR10_DVS_CLASSES[labels[index]]
        write_events(root / "events_np" / name, f"cifar10_{name}_{index}", images[index], rng)
    return root


def expected_frames(events_file: Path, timesteps: int) -> torch.Tensor:
    """spikingjelly's split_by="number" frames, recomputed: T slices of N // T events (the last
    takes the rest), channel = polarity, counts at (y, x)."""
    events = np.load(events_file)
    frames = torch.zeros(timesteps, 2, 128, 128)
    step = len(events["t"]) // timesteps
    for t in range(timesteps):
        stop = len(events["t"]) if t == timesteps - 1 else (t + 1) * step
        for x, y, p in zip(events["x"][t * step : stop], events["y"][t * step : stop], events["p"][t * step : stop]):
            frames[t, int(p != 0), y, x] += 1
    return frames


def test_gesture_batches_are_time_first_frames_of_the_events(gesture_root):
    data = DVSGestureData(root=str(gesture_root), timesteps=4, image_size=128, crop_padding=0, num_workers=0)
    assert (data.name, data.num_classes, data.in_channels, data.timesteps) == ("dvs_gesture", 11, 2, 4)
    test = data.train_loaders(6, seed=0)[1]
    frames, labels = next(iter(test))
    assert frames.shape == (4, 6, 2, 128, 128) and frames.is_contiguous() and labels.shape == (6,)
    for b in range(6):  # the test loader keeps the dataset's order
        path, label = data.splits.test.samples[b]
        split_dir = gesture_root / "events_np" / "test" / data.splits.classes[label]
        assert torch.equal(frames[:, b], expected_frames(split_dir / Path(path).name, 4))
        assert labels[b] == label


def test_gesture_resizing_keeps_the_event_density(gesture_root):
    full = DVSGestureData(root=str(gesture_root), timesteps=4, image_size=128, crop_padding=0, num_workers=0)
    small = DVSGestureData(root=str(gesture_root), timesteps=4, image_size=32, crop_padding=0, num_workers=0)
    frames_full, _ = next(iter(full.train_loaders(11, seed=0)[1]))
    frames_small, _ = next(iter(small.train_loaders(11, seed=0)[1]))
    assert frames_small.shape == (4, 11, 2, 32, 32)
    events_per_frame = frames_full.sum(dim=(2, 3, 4))
    torch.testing.assert_close(frames_small.sum(dim=(2, 3, 4)) * 16, events_per_frame, rtol=1e-3, atol=1e-3)


def test_cifar10_dvs_split_and_search_halves(cifar10_dvs_root):
    data = CIFAR10DVSData(root=str(cifar10_dvs_root), timesteps=5, image_size=48, test_fraction=0.34)
    assert (data.num_classes, data.in_channels, data.timesteps) == (10, 2, 5)
    assert torch.bincount(data.splits.test_labels).tolist() == [1] * 10
    assert torch.bincount(data.splits.train_labels).tolist() == [2] * 10
    weights, arch = data.search_loaders(4, seed=0)
    assert len(weights.sampler) == len(arch.sampler) == 10
    frames, labels = next(iter(weights))
    assert frames.shape == (5, 4, 2, 48, 48) and frames.sum() > 0 and labels.shape == (4,)


def test_cifar10_dvs_rejects_a_leftover_tebn_split(cifar10_dvs_root):
    frames_dir = cifar10_dvs_root / "frames_number_5_split_by_number"
    assert len(CIFAR10DVSData(root=str(cifar10_dvs_root), timesteps=5).splits.train) == 27  # makes frames_dir
    # spikingjelly's CIFAR10DVSTEBNSplit adds train/<class>/ links inside the same folder.
    leftover = frames_dir / "train" / "airplane"
    leftover.mkdir(parents=True)
    first = sorted((frames_dir / "airplane").iterdir())[0]
    (leftover / first.name).symlink_to(first)
    try:
        message = error_of(lambda: CIFAR10DVSData(root=str(cifar10_dvs_root), timesteps=5).splits)
        assert message.startswith(f"{frames_dir} has folders airplane, automobile, bird, cat, deer, dog, frog, horse, ")
        assert "ship, train, truck; expected the 10 class folders airplane, " in message
        assert message.endswith("fix: remove other folders (e.g. a TEBN train/test split) from it")
    finally:
        (leftover / first.name).unlink()
        leftover.rmdir()
        leftover.parent.rmdir()


@pytest.mark.parametrize(
    ("data_class", "expected"),
    [
        (CIFAR10DVSData, ", ".join(f"{name}.zip" for name in CIFAR10_DVS_CLASSES)),
        (DVSGestureData, "DvsGesture.tar.gz, gesture_mapping.csv, LICENSE.txt, README.txt"),
    ],
)
def test_missing_files_are_named_and_nothing_is_attempted(tmp_path, data_class, expected):
    (tmp_path / "download").mkdir()
    (tmp_path / "download" / expected.split(", ")[0]).touch()  # one file is not enough
    data = data_class(root=str(tmp_path))
    assert error_of(lambda: data.splits) == (
        f"no {data.name} data under {tmp_path}: expected spikingjelly's converted {tmp_path}/events_np/ or the "
        f"original files {expected} in {tmp_path}/download/ (from {data.source_page}; they cannot be downloaded "
        "automatically); fix: put them there and set data.root or ASO_SE_DATA"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["download"]  # spikingjelly never ran


def test_unfinished_conversion_marker(tmp_path):
    (tmp_path / "events_np.building").touch()
    assert error_of(lambda: DVSGestureData(root=str(tmp_path)).splits) == (
        f"{tmp_path}/events_np.building marks an unfinished spikingjelly conversion; "
        f"fix: delete it and {tmp_path}/events_np (if present), then retry"
    )


def test_timesteps_must_be_positive(tmp_path):
    assert error_of(lambda: CIFAR10DVSData(root=str(tmp_path), timesteps=0)) == (
        "data.timesteps=0 is invalid; expected an integer >= 1"
    )
