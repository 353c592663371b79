"""Every conf/data/<name>.yaml composes with Hydra and instantiates the contract's object."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from aso_se.data import ClassificationData

CONF = Path(__file__).resolve().parents[3] / "conf"
# name -> (in_channels, image_size, timesteps, root below ASO_SE_DATA or None)
EXPECTED = {
    "mnist5k": (1, 28, None, None),
    "fashion_mnist": (1, 28, None, ""),
    "cifar10": (3, 32, None, ""),
    "cifar100": (3, 32, None, ""),
    "image_folder": (3, 32, None, "my_images"),
    "cifar10_dvs": (2, 48, 10, "cifar10_dvs"),
    "dvs_gesture": (2, 64, 16, "dvs_gesture"),
}


def test_the_expected_configs_exist():
    assert sorted(path.stem for path in (CONF / "data").glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_instantiates_without_touching_files(name, tmp_path, monkeypatch):
    monkeypatch.setenv("ASO_SE_DATA", str(tmp_path))
    overrides = [f"+data={name}"] + ([f"data.root={tmp_path / 'my_images'}"] if name == "image_folder" else [])
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = compose(overrides=overrides)
    data = instantiate(config.data)
    in_channels, image_size, timesteps, root = EXPECTED[name]
    assert isinstance(data, ClassificationData) and data.name == name
    assert (data.in_channels, data.image_size, data.timesteps) == (in_channels, image_size, timesteps)
    if root is not None:
        assert data.root == tmp_path / root
    assert list(tmp_path.iterdir()) == []  # construction reads and writes nothing


def test_default_config_builds_loaders():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = compose(overrides=["+data=mnist5k"])
    data = instantiate(config.data)
    weights, arch = data.search_loaders(32, seed=0)
    images, labels = next(iter(arch))
    assert data.num_classes == 10 and images.shape == (32, 1, 28, 28) and labels.shape == (32,)
