"""CIFAR batches made on the device (data.augment_on_device) for the search and the retrain, on real
digits padded to 32x32 RGB, against the host loaders."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from aso_se.data import CIFARData
from aso_se.data.device_loader import DeviceEpochLoader
from aso_se.search.schedule import SearchSchedule
from tests.aso_se.data.helpers import write_image_tree
from tests.aso_se.helpers import make_engine, tiny_supernet

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cifar_like(tmp_path_factory, digits) -> Path:
    """A CIFAR-10 ImageFolder copy of real digits: 32x32 RGB PNGs, 12 training and 4 test images per class."""
    def to_rgb(digit: np.ndarray) -> Image.Image:
        rgb = np.stack([np.pad(digit, 2)] * 3, axis=-1)
        rgb[..., 1] //= 2  # channels that differ, so a mixed-up channel order shows
        return Image.fromarray(rgb)

    images, labels = digits
    return write_image_tree(tmp_path_factory.mktemp("cifar_like"), images, labels, to_image=to_rgb,
                            class_name=lambda label: f"class{label}")


def _data(root: Path, **augment) -> CIFARData:
    return CIFARData(name="cifar10", root=str(root), download=False, augment_on_device=True, **augment)


def _keys(loader) -> list[int]:
    return [index for _, index in loader.sampler]


def test_search_halves_on_the_device_are_the_host_halves(cifar_like: Path) -> None:
    data = _data(cifar_like)
    host = data.search_loaders(8, seed=3)
    device = data.search_loaders(8, seed=3, device=CPU)
    assert all(isinstance(loader, DeviceEpochLoader) for loader in device)
    for on_host, on_device in zip(host, device):
        on_host.set_epoch(0), on_device.set_epoch(0)
        assert _keys(on_host) == _keys(on_device)  # the same shuffled order
    assert not set(_keys(device[0])) & set(_keys(device[1])) and len(_keys(device[0])) == 60
    assert len(device[0]) == 60 // 8  # training drops the incomplete last batch
    halves = [set(_keys(loader)) for loader in device]
    ranks = [data.search_loaders(8, seed=3, rank=rank, world_size=2, device=CPU) for rank in (0, 1)]
    for split, half in enumerate(halves):  # two ranks share each half between them
        shards = [set(_keys(loaders[split])) for loaders in ranks]
        assert shards[0] | shards[1] == half and not shards[0] & shards[1]


def test_unaugmented_device_batches_equal_the_host_transforms(cifar_like: Path) -> None:
    plain = {"crop_padding": 0, "horizontal_flip": False, "cutout_length": 0}
    data = _data(cifar_like, **plain)
    weights = data.search_loaders(8, seed=1, device=CPU)[0]
    weights.set_epoch(2)
    images, labels = next(iter(weights))
    keys = _keys(weights)[:8]
    host = data.search_loaders(8, seed=1)[0].dataset  # the host transforms (nothing random left)
    expected = torch.stack([host[(2, key)][0] for key in keys])
    assert images.shape == (8, 3, 32, 32) and torch.equal(labels, data.splits.train_labels[keys])
    torch.testing.assert_close(images, expected, rtol=0, atol=1e-6)


def test_augmented_batches_depend_on_seed_epoch_and_batch_only(cifar_like: Path) -> None:
    data = _data(cifar_like)
    weights, arch = data.search_loaders(8, seed=5, device=CPU)
    weights.set_epoch(1)
    first = [batch[0] for batch in weights]
    weights.set_epoch(1)
    assert all(torch.equal(a, b) for a, b in zip(first, [batch[0] for batch in weights]))
    weights.set_epoch(1, start_batch=2)  # a resumed epoch: the rest of the same batches
    assert all(torch.equal(a, b) for a, b in zip(first[2:], [batch[0] for batch in weights], strict=True))
    weights.set_epoch(2)
    assert not torch.equal(first[0], next(iter(weights))[0])
    assert weights.seed != arch.seed  # the two halves' crops and flips are drawn independently


def test_a_search_on_device_batches_resumed_mid_epoch_ends_as_an_uninterrupted_one(cifar_like: Path) -> None:
    """The cifar10_qann search's batch path through the engine, stopped mid-epoch (after the search epoch's first
    of 3 steps) and resumed."""
    data = _data(cifar_like)
    schedule = SearchSchedule(cycles=1, warmup_epochs=1, search_epochs=1, restabilize_epochs=0)

    def engine():
        return make_engine(tiny_supernet("st_bif_qann", timesteps=1, in_channels=3), schedule=schedule, seed=2)

    reference = engine()
    assert reference.run(*data.search_loaders(16, seed=1, device=CPU))
    first = engine()
    stop_mid_epoch = lambda: first.progress["global_step"] == 4  # noqa: E731
    assert first.run(*data.search_loaders(16, seed=1, device=CPU), should_stop=stop_mid_epoch) is False
    resumed = engine()
    resumed.load_state_dict(first.state_dict())
    assert resumed.run(*data.search_loaders(16, seed=1, device=CPU))
    assert resumed.genotypes[-1] == reference.genotypes[-1]
    for name, value in reference.supernet.state_dict().items():
        assert torch.equal(resumed.supernet.state_dict()[name], value), name
