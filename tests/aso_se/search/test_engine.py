"""The ASO-SE engine end to end on real digits: cycles, growth, exact resume, NaN, configs."""
from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR

from aso_se.data import MNIST5kData
from aso_se.errors import TrainingDiverged
from aso_se.search.arch_params import SamplingConfig
from aso_se.search.derive import supernet_genotype
from aso_se.search.engine import ASOSEEngine, SearchLoopCallbacks
from aso_se.search.evolution import EvolutionConfig
from aso_se.search.schedule import SearchSchedule
from aso_se.search.step import beta_decay
from aso_se.search.supernet import SearchCell
from search_space.errors import UserInputError
from search_space.network import build_network
from search_space.neurons import NeuronFactory, SpikingNeuron, firing_rates
from search_space.ops import PARAMETER_FREE_OPS
from tests.aso_se.helpers import SMALL_SPACE, Recorder, darts_optimizers, make_engine, tiny_supernet

SCHEDULE = SearchSchedule(cycles=2, warmup_epochs=1, search_epochs=1, restabilize_epochs=1)
EVOLUTION = EvolutionConfig(grow_cells=1, width_factor=2, max_channels=8, prune_threshold=0.19, max_skip_connect=1,
                            max_parameter_free=1)


def loaders(samples: int = 32, batch: int = 8):
    """mnist5k's two search halves: 16 digits each, 2 steps per epoch."""
    return MNIST5kData(max_train_samples=samples).search_loaders(batch, seed=0)


def new_engine(**kwargs: Any) -> ASOSEEngine:
    return make_engine(
        tiny_supernet("st_bif"), schedule=SCHEDULE, sampling=SamplingConfig(k=2), evolution=EVOLUTION, seed=3,
        weights_scheduler=lambda optimizer: CosineAnnealingLR(optimizer, SCHEDULE.total_epochs),
        **kwargs,
    )


def test_two_cycle_search_on_digits_yields_a_trainable_genotype() -> None:
    recorded = Recorder()
    engine = new_engine()
    assert engine.run(*loaders(), callbacks=recorded)
    steps, epochs, cycles, genotype = recorded.steps, recorded.epochs, recorded.cycles, engine.genotypes[-1]
    assert [result.cycle for result in cycles] == [0, 1] and genotype == cycles[-1].genotype == engine.genotypes[-1]
    assert cycles[0].pruned_ops > 0 and cycles[1].pruned_ops == 0  # the last cycle neither prunes nor grows
    assert engine.supernet.structure.cells == ("normal", "grown", "reduction", "reduction")
    assert engine.supernet.structure.channels == 8
    assert [info["phase"] for info in epochs] == ["warmup", "search", "restabilize", "warmup", "search"]
    assert len(steps) == 10 and [m["global_step"] for m in steps] == list(range(10))
    search_steps = [m for m in steps if m["phase"] == "search"]
    keys = {"arch_loss", "arch_accuracy", "entropy", "loss", "accuracy", "temperature"}
    assert all(keys <= set(metrics) for metrics in search_steps)
    assert epochs[-1]["lr"] < epochs[0]["lr"] and epochs[1]["arch_kl"] > 0
    assert all(op in SMALL_SPACE.primitives and op != "none" for op, _ in genotype.normal + genotype.reduce)
    assert sum(op == "skip_connect" for op, _ in genotype.normal) <= 1
    # the engine derives under evolution's caps: the same α uncapped gives more pools and skips
    assert all(sum(op in PARAMETER_FREE_OPS for op, _ in edges) <= 1 for edges in (genotype.normal, genotype.reduce))
    assert sum(op in PARAMETER_FREE_OPS for op, _ in supernet_genotype(engine.supernet, None).normal) > 1
    network = build_network(genotype, neuron=NeuronFactory("st_bif", timesteps=2), channels=4, layers=3,
                            num_classes=10, in_channels=1, image_size=28)
    logits, _ = network(torch.randn(2, 1, 28, 28))
    logits.sum().backward()
    assert logits.shape == (2, 10)


def test_growth_drops_the_old_supernets_op_graphs() -> None:
    """Their memory pools must be freeable before the grown supernet captures its own (a GPU ran out otherwise)."""
    engine, supernets = new_engine(), []

    class KeepSupernets(SearchLoopCallbacks):
        def on_epoch_end(self, summary: dict) -> None:
            if not supernets:
                engine.supernet.use_op_graphs(True)  # as on CUDA with search.graph_ops=true (CPU ops stay eager)
            supernets.append(engine.supernet)

    engine.run(*loaders(), callbacks=KeepSupernets())
    assert supernets[0] is not engine.supernet and supernets[0].op_graphs is None


def test_progressive_depth_grows_several_cells_a_cycle_up_to_max_cells() -> None:
    """The fifth candidate change's shape (RESULTS.md): three cycles, several cells per growth, the last growth cut
    to max_cells; the grown cells are normal ones between the reductions, and the genotype still comes out."""
    schedule = SearchSchedule(cycles=3, warmup_epochs=1, search_epochs=1, restabilize_epochs=0)
    evolution = EvolutionConfig(grow_cells=2, max_cells=6, max_channels=None, prune_threshold=0.0)
    engine = make_engine(tiny_supernet("st_bif"), schedule=schedule, sampling=SamplingConfig(k=2),
                         evolution=evolution, seed=3)
    recorded = Recorder()
    assert engine.run(*loaders(), callbacks=recorded)
    cycles, genotype = recorded.cycles, engine.genotypes[-1]
    cells = [result.structure.cells for result in cycles]
    assert [len(c) for c in cells] == [5, 6, 6]  # 3 + 2, then + 1 (the cap), then no growth after the last cycle
    assert all(c.count("reduction") == 2 for c in cells) and cells[1].count("grown") == 3
    assert engine.supernet.structure.cells == cells[-1] and genotype == cycles[-1].genotype
    assert len(genotype.normal) == len(genotype.reduce) == 2 * SMALL_SPACE.steps


def roundtrip(state: dict) -> dict:
    """Through torch.save / torch.load(weights_only=True), as the apps' checkpoints do."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("channels_last", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["nchw", "channels_last"])  # nchw, the plain layout: out of CI
def test_interrupted_and_resumed_search_ends_exactly_like_an_uninterrupted_one(channels_last: bool) -> None:
    reference = new_engine(channels_last=channels_last)
    assert reference.run(*loaders())
    expected = reference.genotypes[-1]
    # Stop mid-epoch in cycle 0's search phase, then in cycle 1's warm-up (after the growth).
    state, finished = None, False
    for stop_at in (3, 7, None):
        engine = new_engine(channels_last=channels_last)
        if state is not None:
            engine.load_state_dict(roundtrip(state))
        finished = engine.run(*loaders(), should_stop=lambda: engine.progress["global_step"] == stop_at)
        state = engine.state_dict()
        if stop_at is not None:
            assert not finished and engine.progress["global_step"] == stop_at
    assert finished and engine.genotypes[-1] == expected
    assert engine.supernet.structure == reference.supernet.structure
    expected_state = reference.supernet.state_dict()
    for name, value in engine.supernet.state_dict().items():
        assert torch.equal(value, expected_state[name]), name
    if channels_last:  # the resumed, regrown supernet still runs in NHWC
        seen = set()
        hooks = record_layouts(engine.supernet, seen)
        engine.train_step(*(next(iter(loader)) for loader in loaders()), temperature=1.0, entropy_weight=0.0)
        for hook in hooks:
            hook.remove()
        assert seen - {None} == {"nhwc"}


def test_resuming_with_another_schedule_is_refused() -> None:
    state = new_engine().state_dict()
    other = make_engine(tiny_supernet("st_bif"), schedule=SearchSchedule(cycles=3, warmup_epochs=1, search_epochs=2))
    with pytest.raises(UserInputError, match="same search.schedule"):
        other.load_state_dict(state)


def test_a_checkpoint_from_before_a_schedule_field_existed_resumes_at_its_default() -> None:
    """β-decay's weights came after searches now running: their checkpoints lack the fields and ran with them off."""
    state = new_engine().state_dict()
    for name in ("beta_decay_weight_start", "beta_decay_weight_end"):
        del state["schedule"][name]
    new_engine().load_state_dict(state)
    turned_on = make_engine(tiny_supernet("st_bif"), schedule=SearchSchedule(
        cycles=2, warmup_epochs=1, search_epochs=1, restabilize_epochs=1, beta_decay_weight_end=1.0))
    with pytest.raises(UserInputError, match="same search.schedule"):
        turned_on.load_state_dict(state)


def test_resuming_on_another_device_type_is_refused_with_the_device_to_use() -> None:
    """A search written on a GPU and resumed on the CPU: its Gumbel generator's state cannot move, so one line names
    the device that wrote it (before, torch's "Expected a CPUGeneratorImplState of size 5056 ..." leaked through)."""
    state = new_engine().state_dict()
    assert state["gumbel_rng_device"] == "cpu"
    new_engine().load_state_dict(state)  # the same device type: fine
    state["gumbel_rng_device"] = "cuda"
    with pytest.raises(UserInputError, match=r"written by a search on cuda and this run is on cpu; resume it on cuda "
                                             r"\(trainer.device=cuda\)"):
        new_engine().load_state_dict(state)
    del state["gumbel_rng_device"]  # a checkpoint from before the device was saved, written on a GPU
    state["gumbel_rng"] = torch.randint(0, 256, (16,), dtype=torch.uint8)  # a CUDA generator's state: 16 bytes
    with pytest.raises(UserInputError, match="does not fit this run's cpu generator"):
        new_engine().load_state_dict(state)


class PoisonedLoader:
    """A loader whose third batch holds NaN images."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.loader.set_epoch(epoch, start_batch=start_batch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for index, (images, labels) in enumerate(self.loader):
            yield (images.fill_(float("nan")) if index == 2 else images), labels


def test_nan_loss_stops_the_search_naming_where() -> None:
    weights_loader, arch_loader = loaders(samples=64)
    engine = make_engine(tiny_supernet("relu", timesteps=1), schedule=SCHEDULE)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at cycle 0, warmup epoch 0, step 2"):
        engine.run(PoisonedLoader(weights_loader), arch_loader)


def test_search_config_composes_into_the_engine() -> None:
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(Path(__file__).parents[3] / "conf" / "search"), version_base="1.3"):
        config = compose("aso_se")
    build = instantiate(config, _convert_="object")
    optim = {"weights": darts_optimizers()["weights_optimizer"], "arch": darts_optimizers()["arch_optimizer"]}
    engine = build(search_space=SMALL_SPACE, neuron=NeuronFactory("relu", timesteps=1), num_classes=10,
                   in_channels=1, optim=optim)
    assert engine.sampling.k == 2 and engine.schedule.cycles >= 1 and engine.evolution.max_skip_connect == 2


def test_the_engine_derives_its_genotype_under_the_normal_pool_cap() -> None:
    engine = make_engine(tiny_supernet("st_bif"), evolution=EvolutionConfig(max_skip_connect=None, max_normal_pools=0))
    pool = SMALL_SPACE.primitives.index("max_pool_3x3")
    with torch.no_grad():
        for kind in ("normal", "reduce"):
            alpha = engine.supernet.arch[kind].alpha
            alpha.copy_(torch.randn_like(alpha))
            alpha[:, pool] += 10.0  # every edge's strongest op: the pool
    genotype = engine.genotype()
    assert not any(op == "max_pool_3x3" for op, _ in genotype.normal)
    assert genotype.reduce == supernet_genotype(engine.supernet, None).reduce
    assert all(op == "max_pool_3x3" for op, _ in genotype.reduce)


def test_bf16_step_keeps_fp32_state(digits) -> None:
    images, labels = digits
    engine = make_engine(tiny_supernet("st_bif"), precision="bf16")
    scalars = engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0)
    assert all(torch.isfinite(value) for value in scalars.values())
    assert all(param.dtype == torch.float32 for param in engine.supernet.parameters())


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(UserInputError, match="trainer.precision"):
        make_engine(tiny_supernet("relu", timesteps=1), precision="fp16")


def test_firing_rates_are_recorded_in_the_last_step_of_each_epoch_only() -> None:
    engine = new_engine()
    recording: list[bool] = []
    train_step = engine.train_step

    def spying_train_step(*args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        neurons = [m for m in engine.supernet.modules() if isinstance(m, SpikingNeuron)]
        recording.append(any(neuron.record_firing_rate for neuron in neurons))
        return train_step(*args, **kwargs)

    engine.train_step = spying_train_step
    rates: list[dict[str, torch.Tensor]] = []

    class KeepRates(SearchLoopCallbacks):
        def on_epoch_end(self, summary: dict) -> None:
            rates.append(firing_rates(engine.supernet))

    engine.run(*loaders(), callbacks=KeepRates())
    assert recording == [False, True] * 5  # 5 epochs of 2 steps
    assert all(0 < max(epoch.values()) < 1 for epoch in rates)


def test_channels_last_step_equals_the_nchw_step_and_keeps_nhwc_activations() -> None:
    """engine channels_last: the same losses and α as NCHW (fp64: both layouts round alike up to
    summation order), and NHWC activations at every BatchNorm's input, neuron's output and cell's
    output (the node sums keep the layout), also in the supernet grown and widened by a search."""
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, 8, 8, generator=gen, dtype=torch.float64), torch.randint(0, 10, (4,), generator=gen))
               for _ in range(2)]
    results, layouts = [], []
    for channels_last in (False, True):
        engine = make_engine(tiny_supernet("st_bif", in_channels=3), sampling=SamplingConfig(k=2),
                             channels_last=channels_last, seed=3)
        engine.supernet.double()
        seen = set()
        hooks = record_layouts(engine.supernet, seen)
        metrics = engine.train_step(*batches, temperature=1.0, entropy_weight=0.01)
        for hook in hooks:
            hook.remove()
        layouts.append(seen - {None})
        results.append((metrics["loss"], metrics["arch_loss"], engine._stacked_logits()))
    for plain, last in zip(*results):
        torch.testing.assert_close(torch.as_tensor(last), torch.as_tensor(plain), rtol=1e-9, atol=1e-12)
    assert layouts == [{"nchw"}, {"nhwc"}]
    engine = new_engine(channels_last=True)
    engine.run(*loaders())
    assert engine.supernet.structure.cells == ("normal", "grown", "reduction", "reduction")  # grown and widened
    seen = set()
    hooks = record_layouts(engine.supernet, seen)
    engine.train_step(*(next(iter(loader)) for loader in loaders()), temperature=1.0, entropy_weight=0.0)
    assert seen - {None} == {"nhwc"}


def record_layouts(supernet, seen: set) -> list:
    """Hooks adding the layout of every BatchNorm's input and every neuron's and cell's output to ``seen``."""
    hooks = []
    for module in supernet.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            hooks.append(module.register_forward_pre_hook(lambda m, inputs: seen.add(layout_of(inputs[0]))))
        if isinstance(module, (SpikingNeuron, SearchCell)):
            hooks.append(module.register_forward_hook(lambda m, inputs, out: seen.add(layout_of(out))))
    return hooks


def layout_of(x: torch.Tensor) -> str | None:
    """"nchw" / "nhwc" / "other" for a 4-d tensor whose layouts differ (C > 1, H*W > 1), else None."""
    if x.shape[1] == 1 or x.shape[2] * x.shape[3] == 1:
        return None
    return "nchw" if x.is_contiguous() else "nhwc" if x.is_contiguous(memory_format=torch.channels_last) else "other"


def test_beta_decay_is_the_mean_edge_logsumexp_and_skips_pruned_ops() -> None:
    logits = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
    masked = logits.masked_fill(torch.arange(7) == 3, float("-inf"))  # op 3 pruned on every edge
    value = beta_decay(masked)
    expected = torch.stack([torch.log(torch.exp(torch.cat([edge[:3], edge[4:]])).sum())
                            for edge in logits.reshape(-1, 7)]).mean()
    assert value.item() == pytest.approx(expected.item(), rel=1e-12)
    value.backward()  # ∂/∂α = softmax over the live ops / edges: every α pushed down, the strongest the most
    grad = torch.softmax(masked.detach(), dim=-1) / 10
    torch.testing.assert_close(logits.grad, grad)


def test_beta_decay_weight_keeps_alpha_smaller_than_the_same_search_without_it() -> None:
    """The same seed and digits with and without β-decay: the term lowers α's per-edge logsumexp, and its value
    comes out with the search steps' scalars."""
    def search(weight: float) -> tuple[float, list[dict[str, Any]]]:
        schedule = SearchSchedule(cycles=1, warmup_epochs=1, search_epochs=2, beta_decay_weight_start=weight,
                                  beta_decay_weight_end=weight)
        recorded = Recorder()
        engine = make_engine(tiny_supernet("st_bif"), schedule=schedule, sampling=SamplingConfig(k=2), seed=3)
        engine.run(*loaders(), callbacks=recorded)
        return beta_decay(engine.supernet.arch_logits()).item(), recorded.steps

    off, off_steps = search(0.0)
    on, on_steps = search(5.0)
    assert on < off
    assert all("beta_decay" in m and m["beta_decay_weight"] == 5.0 for m in on_steps if m["phase"] == "search")
    assert not any("beta_decay" in m for m in off_steps)
