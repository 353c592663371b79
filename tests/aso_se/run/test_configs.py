"""Every config group option and every experiment composes and instantiates (both entry points)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig

from aso_se.monitor.tensorboard import TensorBoardLogger
from aso_se.run.checkpoint import load_checkpoint, save_checkpoint
from aso_se.run.guard import _one_line
from aso_se.run.run_dir import register_resolvers
from search_space.genotypes import GENOTYPES
from search_space.neurons import NeuronFactory

CONF = Path(__file__).resolve().parents[3] / "conf"


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


def compose_config(entry_point: str, *overrides: str) -> DictConfig:
    register_resolvers()  # as the entry points do: the configs' own interpolations
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose(entry_point, overrides=list(overrides))


@pytest.mark.parametrize("entry_point", ["search", "train"])
@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes(entry_point: str, experiment: str) -> None:
    cfg = compose_config(entry_point, f"experiment={experiment}")
    assert cfg.trainer.precision in (("fp32", "bf16", "fp16") if entry_point == "train" else ("fp32", "bf16"))
    assert cfg.batch_size > 0
    instantiate(cfg.data)
    assert isinstance(instantiate(cfg.neuron), NeuronFactory)


def test_the_fast_recipe_keeps_its_global_batch_on_any_number_of_processes(monkeypatch) -> None:
    """Its learning rate is for a global batch of 1,024: one GPU takes all of it, torchrun's processes a share."""
    for processes, per_process in ((None, 1024), ("1", 1024), ("4", 256), ("8", 128)):
        if processes is None:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("WORLD_SIZE", processes)
        assert compose_config("train", "experiment=cifar10_qann_fast").batch_size == per_process
        assert compose_config("train", "experiment=cifar10_binary_snn").batch_size == per_process
    assert compose_config("train", "experiment=cifar10_qann_fast", "batch_size=96").batch_size == 96  # as given
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(Exception, match="global batch 1024 does not split over 3 processes") as info:
        compose_config("train", "experiment=cifar10_qann_fast").batch_size
    assert _one_line(info.value) == ("the recipe's global batch 1024 does not split over 3 processes; pass "
                                     "batch_size=<a batch per process>, e.g. 341")  # the entry points' error line


def test_search_data_settings_apply_to_their_data_set_and_entry_point_only() -> None:
    assert compose_config("search").data.max_train_samples == 1024  # conf/search_data/mnist5k.yaml
    assert compose_config("train").data.max_train_samples is None
    assert compose_config("search", "data=fashion_mnist").data.max_train_samples is None
    assert compose_config("search", "data.max_train_samples=4000").data.max_train_samples == 4000
    assert compose_config("search", "experiment=smoke").data.max_train_samples == 64  # experiments come later


def test_cifar10_snn_is_the_paper_scale_setting() -> None:
    search = compose_config("search", "experiment=cifar10_snn")
    assert search.data._target_.endswith("CIFARData") and search.data.name == "cifar10"
    assert (search.search.supernet.layers, search.search.supernet.channels) == (8, 16)
    assert search.neuron.timesteps == 4 and search.batch_size == 64
    schedule = instantiate(search.search.schedule)
    assert schedule.total_epochs == 50
    longer = instantiate(compose_config("search", "experiment=cifar10_snn",
                                        "search.schedule.first_warmup_epochs=30").search.schedule)
    assert longer.total_epochs == 75 and longer.plan()[30].phase.value == "search"
    train = compose_config("train", "experiment=cifar10_snn")
    assert (train.model.network.layers, train.model.network.channels) == (20, 36)
    assert train.model.network.auxiliary and train.data.cutout_length == 16
    assert "layers" not in train.get("search", {})  # the search half stays out of train.py


@pytest.mark.parametrize("option", options("data"))
def test_every_data_option_instantiates(option: str, tmp_path: Path) -> None:
    root = [f"data.root={tmp_path}"] if option == "image_folder" else []  # a required key
    data = instantiate(compose_config("search", f"data={option}", *root).data)
    assert data.in_channels in (1, 2, 3) and data.image_size > 0  # no file is read yet


@pytest.mark.parametrize("option", options("neuron"))
def test_every_neuron_option_makes_neurons(option: str) -> None:
    factory = instantiate(compose_config("search", f"neuron={option}").neuron)
    x = torch.randn(factory.timesteps * 3, 5)
    assert factory()(x).shape == x.shape


@pytest.mark.parametrize("space", options("search_space"))
@pytest.mark.parametrize("search", options("search"))
def test_every_supernet_option_builds_and_steps(space: str, search: str) -> None:
    cfg = compose_config("search", "experiment=smoke", f"search_space={space}", f"search={search}")
    engine = instantiate(cfg.search, _convert_="object")(
        search_space=instantiate(cfg.search_space), neuron=instantiate(cfg.neuron), num_classes=10,
        in_channels=1, optim=instantiate(cfg.optim, _convert_="object"))
    supernet = engine.supernet
    supernet(torch.randn(2, 1, 28, 28)).sum().backward()
    engine.weights_optimizer.step(), engine.arch_optimizer.step(), engine.weights_scheduler.step()
    assert engine.schedule.total_epochs > 0 and engine.sampling.k >= 1
    assert engine.weights_scheduler.T_max == engine.schedule.total_epochs


@pytest.mark.parametrize("model", options("model"))
def test_every_model_option_builds_the_retrain_network(model: str) -> None:
    cfg = compose_config("train", f"model={model}", "neuron=relu")
    network = instantiate(cfg.model.network)(GENOTYPES["DARTS_V2"], neuron=instantiate(cfg.neuron),
                                             num_classes=10, in_channels=3, image_size=32)
    optimizer = instantiate(cfg.optim.optimizer)(network.parameters())
    scheduler = instantiate(cfg.optim.scheduler)(optimizer)
    assert scheduler.T_max == cfg.epochs and 0 <= cfg.model.auxiliary_weight < 1
    assert (network.auxiliary_head is not None) == cfg.model.network.auxiliary


@pytest.mark.parametrize("option", options("search_optim"))
def test_every_search_optimizer_option(option: str) -> None:
    """search.py's optimizer group lands at cfg.optim, where the engine reads it."""
    optim = compose_config("search", f"search_optim={option}").optim
    parameter = torch.nn.Parameter(torch.randn(3))
    weights = instantiate(optim.weights)([parameter])
    instantiate(optim.arch)([parameter])
    assert instantiate(optim.weights_scheduler)(weights, T_max=2).T_max == 2


def test_optimizer_states_load_safely(tmp_path: Path) -> None:
    """Optimizer states hold only plain containers, so checkpoints load with weights_only."""
    cfg = compose_config("search")
    parameter = torch.nn.Parameter(torch.randn(3))
    arch = instantiate(cfg.optim.arch)([parameter])
    parameter.grad = torch.randn(3)
    arch.step()
    save_checkpoint({"arch": arch.state_dict()}, tmp_path / "last.pt", kind="search")
    loaded = load_checkpoint(tmp_path / "last.pt", kind="search")
    assert tuple(loaded["arch"]["param_groups"][0]["betas"]) == (0.5, 0.999)


@pytest.mark.parametrize("option", options("trainer"))
def test_every_trainer_option(option: str) -> None:
    trainer = compose_config("train", f"trainer={option}").trainer
    assert trainer.ddp == (option == "ddp") and trainer.device == "auto"


@pytest.mark.parametrize("option", options("logger"))
def test_every_logger_option(option: str, tmp_path: Path) -> None:
    logger = compose_config("search", f"logger={option}").logger
    if option == "none":
        assert logger is None
    else:
        board = instantiate(logger)(log_dir=tmp_path / "tb", purge_step=None)
        assert isinstance(board, TensorBoardLogger)
        board.close()


def test_the_binary_snn_recipe_trains_in_fp16_and_searches_as_before() -> None:
    """train.py's half keeps the full-size QANN and its BPTT within one GPU; search.py's half is unchanged."""
    assert compose_config("train", "experiment=cifar10_binary_snn").trainer.precision == "fp16"
    assert compose_config("train", "experiment=cifar10_qann_fast").trainer.precision == "fp32"
    assert compose_config("search", "experiment=cifar10_binary_snn").trainer.precision == "fp32"
    fp32 = compose_config("train", "experiment=cifar10_binary_snn", "trainer.precision=fp32")
    assert fp32.trainer.precision == "fp32"
