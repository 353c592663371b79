"""The next step's draw started during a step (``train_step(next_temperature=)``): the same search, exactly."""
from __future__ import annotations

import pytest
import torch

from aso_se.search.arch_params import SamplingConfig, draw_samples, start_draw
from tests.aso_se.helpers import make_engine, tiny_supernet
from tests.aso_se.search.test_arch_params import HostSyncCounter, arch, seeded

TEMPERATURES = (2.0, 1.5, 1.1, 0.7)


def run_steps(digits, *, ahead: bool, arch_steps: bool = True, device: str = "cpu", **engine_kwargs):
    """Four steps at falling temperatures, the next draw started early or not; (engine, samples drawn)."""
    images, labels = digits
    engine = make_engine(tiny_supernet("st_bif"), device=device, **engine_kwargs)
    drawn = []
    draws = engine.step.draws
    take = draws.take
    draws.take = lambda *args: drawn.append(take(*args)) or drawn[-1]
    for step, temperature in enumerate(TEMPERATURES):
        next_temperature = TEMPERATURES[step + 1] if ahead and step + 1 < len(TEMPERATURES) else None
        engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]) if arch_steps else None,
                          temperature=temperature, entropy_weight=0.01, next_temperature=next_temperature)
    return engine, drawn


def assert_same_search(first, second, exact: bool = True) -> None:
    """Same ops and noise drawn at every step, same supernet state (to rounding where not ``exact``)."""
    (engine_a, drawn_a), (engine_b, drawn_b) = first, second
    assert [[[s.active_ops for s in kinds] for kinds in step] for step in drawn_a] == \
        [[[s.active_ops for s in kinds] for kinds in step] for step in drawn_b]
    for step_a, step_b in zip(drawn_a, drawn_b):
        for sample_a, sample_b in zip(sum(step_a, []), sum(step_b, [])):
            assert torch.equal(sample_a.noise.cpu(), sample_b.noise.cpu())
            assert sample_a.temperature == sample_b.temperature
    state_b = engine_b.supernet.state_dict()
    for name, value in engine_a.supernet.state_dict().items():
        if exact:
            assert torch.equal(value, state_b[name]), name
        else:
            torch.testing.assert_close(value, state_b[name], rtol=1e-4, atol=1e-5, msg=name)
    assert torch.equal(engine_a.generator.get_state(), engine_b.generator.get_state())


@pytest.mark.parametrize("arch_steps", [True, False], ids=["search", "warmup"])
def test_drawing_ahead_gives_the_same_samples_weights_and_alpha(digits, arch_steps: bool) -> None:
    assert_same_search(run_steps(digits, ahead=True, arch_steps=arch_steps),
                       run_steps(digits, ahead=False, arch_steps=arch_steps))


def test_the_early_draw_reads_alpha_after_the_arch_update(digits) -> None:
    """The next step's ops come from α after this step's α update (a large α lr moves the choices)."""
    images, labels = digits
    engine = make_engine(tiny_supernet("st_bif"), arch_optimizer=lambda params: torch.optim.SGD(params, lr=100.0))
    alpha_before = [alpha.detach().clone() for alpha in engine.supernet.arch_parameters()]
    engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0, next_temperature=1.0)
    pending, generator_state = engine.step.draws.pending

    def chosen_from(alphas) -> list[torch.Tensor]:
        copies = [arch(0, edges=alpha.shape[0]) for alpha in alphas]
        for copy, alpha in zip(copies, alphas):
            with torch.no_grad():
                copy.alpha.copy_(alpha)
        generator = torch.Generator().set_state(generator_state)
        return [sample.chosen for sample in
                start_draw(copies, 2, SamplingConfig(k=2), temperature=1.0, generator=generator).samples()[0]]

    got = [sample.chosen for sample in pending.samples()[0]]
    after = chosen_from([alpha.detach() for alpha in engine.supernet.arch_parameters()])
    before = chosen_from(alpha_before)
    assert all(torch.equal(a, b) for a, b in zip(got, after))
    assert not all(torch.equal(a, b) for a, b in zip(got, before))


def test_an_early_draw_for_another_temperature_is_undone_and_redrawn(digits) -> None:
    """A pending draw that does not match the step (another temperature) leaves no trace in the generator."""
    images, labels = digits
    engines = [make_engine(tiny_supernet("st_bif")) for _ in range(2)]
    for engine, guess in zip(engines, (0.3, None)):  # the first guesses the next temperature wrong
        engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0, next_temperature=guess)
        engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=0.9)
    assert torch.equal(engines[0].generator.get_state(), engines[1].generator.get_state())
    for a, b in zip(engines[0].supernet.arch_parameters(), engines[1].supernet.arch_parameters()):
        assert torch.equal(a, b)


def test_a_checkpoint_taken_with_a_draw_pending_saves_the_generator_before_it(digits) -> None:
    images, labels = digits
    engine = make_engine(tiny_supernet("st_bif"))
    engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0)
    before = engine.generator.get_state()
    engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0, next_temperature=0.9)
    after_step = engine.generator.get_state()
    plain = make_engine(tiny_supernet("st_bif"))
    plain.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0)
    plain.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0)
    assert not torch.equal(before, after_step)  # the early draw moved the generator ...
    assert torch.equal(engine.state_dict()["gumbel_rng"], plain.generator.get_state())  # ... the checkpoint not


def test_a_step_with_an_early_draw_still_reads_the_device_once(digits) -> None:
    images, labels = digits
    engine = make_engine(tiny_supernet("st_bif"), arch_optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0, next_temperature=2.0)
    with HostSyncCounter() as counter:
        engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=2.0, next_temperature=2.0)
    assert counter.calls == ["tolist"]


def test_start_draw_then_samples_equals_draw_samples() -> None:
    archs = [arch(0), arch(1)]
    sampling = SamplingConfig(k=2, weight_threshold=0.1)
    pending = start_draw(archs, 2, sampling, temperature=0.5, generator=seeded(4))
    reference = draw_samples(archs, 2, sampling, temperature=0.5, generator=seeded(4))
    got = pending.samples()
    assert pending.num_samples == 2
    for samples, reference_samples in zip(got, reference):
        for sample, reference_sample in zip(samples, reference_samples):
            assert sample.active_ops == reference_sample.active_ops
            assert torch.equal(sample.chosen, reference_sample.chosen)
            assert torch.equal(sample.noise, reference_sample.noise)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_drawing_ahead_on_the_gpu_gives_the_same_search(digits) -> None:
    """The choice reaches the host through a pinned copy and an event there; cuDNN's backward kernels sum
    in no fixed order, so the weights agree to rounding."""
    assert_same_search(run_steps(digits, ahead=True, device="cuda"), run_steps(digits, ahead=False, device="cuda"),
                       exact=False)
