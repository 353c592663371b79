"""snn_finetune's settings: one source per default, and a one-line error for each bad value."""
from dataclasses import asdict
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from aso_se.train.snn_finetune import FinetuneSettings
from search_space.errors import UserInputError

TRAIN_CONFIG = Path(__file__).parents[3] / "conf" / "train.yaml"


def test_the_python_defaults_are_the_config_values() -> None:
    config = OmegaConf.to_container(OmegaConf.load(TRAIN_CONFIG).snn_finetune)
    assert config == asdict(FinetuneSettings())
    assert FinetuneSettings.from_config(config) == FinetuneSettings() and FinetuneSettings().epochs == 0


@pytest.mark.parametrize(("values", "fragment"), [
    ({"epochs": -1}, "snn_finetune.epochs=-1 must be a non-negative integer"),
    ({"epochs": 1.5}, "snn_finetune.epochs=1.5"),
    ({"timesteps": 0}, "snn_finetune.timesteps=0 must be a positive integer"),
    ({"timesteps": True}, "snn_finetune.timesteps=True"),
    ({"lr": 0}, "snn_finetune.lr=0 must be a positive number"),
    ({"surrogate": "tanh"}, "sigmoid, atan or rectangular"),
    ({"steps": 4}, "no setting 'steps'"),
    ({"timesteps": 4, "early_timesteps": 4}, "snn_finetune.early_timesteps=4 must be an integer from 1 to"),
    ({"early_timesteps": 0}, "snn_finetune.early_timesteps=0"),
    ({"early_weight": 0}, "snn_finetune.early_weight=0 must be a positive number"),
])
def test_bad_settings_are_refused_in_one_line(values: dict, fragment: str) -> None:
    with pytest.raises(UserInputError, match=fragment.replace(".", r"\.").replace("(", r"\(")):
        FinetuneSettings.from_config(values)


def test_good_settings_pass_through() -> None:
    settings = FinetuneSettings.from_config({"epochs": 3, "timesteps": 8, "lr": 0.02, "surrogate": "atan"})
    assert (settings.epochs, settings.timesteps, settings.lr, settings.surrogate) == (3, 8, 0.02, "atan")
