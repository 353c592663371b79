"""The neuron registry and factory: flattened multi-step layout, fresh state per forward, firing rates,
the YAML defaults equal to the builders', bad input."""
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from kernels.st_bif import level_bounds, st_bif_multistep
from search_space.errors import UserInputError
from search_space.neurons import (
    NEURON_KINDS,
    NeuronFactory,
    QuantizedActivation,
    SpikingNeuron,
    firing_rates,
    make_neuron,
    neuron_parameters,
    register_neuron,
    set_firing_rate_recording,
)

CONF = Path(__file__).resolve().parents[2] / "conf"
T, B = 3, 2


def drive(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A random drive strong enough to make every kind spike."""
    return 2.0 * torch.randn(*shape, dtype=dtype)


def test_st_bif_runs_time_first_over_the_flattened_batch():
    neuron = make_neuron("st_bif", timesteps=T, q_threshold=0.5, level=8)
    x = drive(T * B, 4, 5, 5)
    pos_max, neg_min = level_bounds(8, sym=True)
    expected = st_bif_multistep(x.view(T, B, 4, 5, 5), 0.5, pos_max, neg_min)
    torch.testing.assert_close(neuron(x), expected.flatten(0, 1), rtol=0, atol=0)


def test_lif_runs_time_first_from_rest():
    neuron = make_neuron("lif", timesteps=T, tau=2.0, v_threshold=1.0)
    x = drive(T * B, 7)
    v = torch.zeros(B, 7)
    expected = []
    for x_t in x.view(T, B, 7):  # LIF by hand: decay toward the input, fire, hard reset to 0
        v = v + (x_t - v) / 2.0
        spike = (v >= 1.0).float()
        v = v * (1 - spike)
        expected.append(spike)
    torch.testing.assert_close(neuron(x), torch.cat(expected), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["lif", "st_bif"])
def test_channels_last_input_reaches_the_neuron_in_memory_order_and_keeps_its_layout(kind):
    """A channels_last [T*B, C, H, W]: a spikingjelly neuron (LIF) gets a contiguous [T, B, H, W, C] view
    (its kernels would copy anything else; ST-BIF does this inside kernels.st_bif), the output is
    channels_last, values and gradients as for NCHW."""
    neuron = make_neuron(kind, timesteps=T)
    x = drive(T * B, 4, 3, 5)
    layouts = []
    neuron.neuron.register_forward_pre_hook(lambda m, inputs: layouts.append(inputs[0].is_contiguous()))
    x_last = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    x_plain = x.clone().requires_grad_()
    out_last, out_plain = neuron(x_last), neuron(x_plain)
    assert layouts == ([True, True] if kind == "lif" else [False, True])
    assert out_last.is_contiguous(memory_format=torch.channels_last)
    assert not out_last.is_contiguous() and (out_plain != 0).any()
    torch.testing.assert_close(out_last, out_plain, rtol=0, atol=0)
    upstream = torch.randn_like(x)
    grads = [torch.autograd.grad(out, inp, upstream)[0] for out, inp in ((out_last, x_last), (out_plain, x_plain))]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=1e-6)


def test_relu_is_plain_relu():
    neuron = make_neuron("relu", timesteps=T)
    assert type(neuron) is nn.ReLU and not neuron.inplace


@pytest.mark.parametrize("kind", ["st_bif", "lif"])
def test_every_forward_starts_from_the_initial_state(kind):
    neuron = make_neuron(kind, timesteps=T)
    x = drive(T * B, 3, 4, 4).requires_grad_()
    first = neuron(x)
    first.sum().backward()  # a second forward+backward must not reuse the first graph or state
    second = neuron(x)
    second.sum().backward()
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    assert torch.count_nonzero(first) > 0


@pytest.mark.parametrize("kind", ["st_bif", "lif"])
def test_firing_rate_is_recorded_and_collected(kind):
    model = nn.Sequential(make_neuron(kind, timesteps=T), nn.Identity(), make_neuron(kind, timesteps=T))
    x = drive(T * B, 16)
    out = model(x)
    rates = firing_rates(model)
    assert set(rates) == {"0", "2"}
    torch.testing.assert_close(rates["2"], (out != 0).float().mean())
    assert 0 < rates["0"] < 1

    set_firing_rate_recording(model, False)
    model(torch.zeros_like(x))  # silent input: a recording neuron would drop to 0
    torch.testing.assert_close(firing_rates(model)["2"], (out != 0).float().mean())


def test_firing_rate_is_not_checkpointed():
    neuron = make_neuron("lif", timesteps=T)
    assert "firing_rate" not in neuron.state_dict()


def test_batch_that_is_not_a_multiple_of_t_is_refused():
    with pytest.raises(ValueError, match="not T\\*B"):
        make_neuron("st_bif", timesteps=T)(drive(T * B + 1, 4))


def test_factory_makes_fresh_neurons():
    factory = NeuronFactory("st_bif", timesteps=T, learn_threshold=True)
    first, second = factory(), factory()
    assert isinstance(first, SpikingNeuron) and first is not second
    assert first.neuron.q_threshold is not second.neuron.q_threshold
    assert first.timesteps == T


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("izhikevich", {}, "unknown neuron kind 'izhikevich'"),
        ("lif", {"threshold": 1.0}, r"no parameter\(s\) \['threshold'\]"),
        ("relu", {"tau": 2.0}, r"no parameter\(s\) \['tau'\]"),
        ("lif", {"surrogate": "gauss"}, "unknown LIF surrogate 'gauss'"),
        ("lif", {"tau": 0.5}, "tau=0.5 must be greater than 1"),
        ("st_bif", {"level": 1}, "neuron st_bif: level=1"),
        ("st_bif", {"q_threshold": -1.0}, "neuron st_bif"),
        ("st_bif_qann", {"level": 1}, "neuron st_bif_qann: level=1 must be an integer >= 2"),
        ("st_bif_qann", {"q_threshold": 0.0}, "neuron st_bif_qann: q_threshold=0.0 must be > 0"),
        ("st_bif_qann", {"backend": "cuda"}, "neuron st_bif_qann: backend='cuda' must be one of"),
    ],
)
def test_bad_neuron_config_names_the_problem(kind, params, message):
    with pytest.raises(UserInputError, match=message):
        NeuronFactory(kind, timesteps=1 if kind == "st_bif_qann" else T, **params)


@pytest.mark.parametrize("timesteps", [0, -2, 2.5, True])
def test_bad_timesteps(timesteps):
    with pytest.raises(UserInputError, match="timesteps"):
        make_neuron("lif", timesteps=timesteps)


@pytest.mark.parametrize("kind", sorted(NEURON_KINDS))
def test_every_neuron_config_instantiates(kind):
    factory = instantiate(OmegaConf.load(CONF / "neuron" / f"{kind}.yaml"))
    assert isinstance(factory, NeuronFactory) and factory.kind == kind
    x = drive(factory.timesteps * B, 4)
    assert factory()(x).shape == x.shape


@pytest.mark.parametrize("kind", sorted(NEURON_KINDS))
def test_every_kind_has_a_config_whose_values_are_the_python_defaults(kind):
    """One source per value: a builder called without parameters behaves like conf/neuron/<kind>.yaml."""
    config = OmegaConf.to_container(OmegaConf.load(CONF / "neuron" / f"{kind}.yaml"))
    params = {key: value for key, value in config.items() if key not in ("_target_", "kind", "timesteps")}
    assert params == neuron_parameters(kind)


def test_every_config_is_a_registered_kind():
    assert {path.stem for path in (CONF / "neuron").glob("*.yaml")} == set(NEURON_KINDS)


def test_st_bif_learns_its_threshold_by_default():
    neuron = make_neuron("st_bif", timesteps=T)
    assert isinstance(neuron.neuron.q_threshold, nn.Parameter)
    assert not isinstance(make_neuron("st_bif", timesteps=T, learn_threshold=False).neuron.q_threshold, nn.Parameter)


def test_a_registered_kind_is_built_by_the_factory():
    @register_neuron("scaled_test")
    def scaled(timesteps: int, gain: float = 2.0) -> nn.Module:
        return nn.Hardtanh(-gain, gain)

    try:
        assert NEURON_KINDS["scaled_test"] is scaled and neuron_parameters("scaled_test") == {"gain": 2.0}
        x = drive(T * B, 5)
        torch.testing.assert_close(NeuronFactory("scaled_test", timesteps=T, gain=0.5)()(x), x.clamp(-0.5, 0.5))
        with pytest.raises(ValueError, match="'scaled_test' is already registered"):
            register_neuron("scaled_test")(scaled)
    finally:
        del NEURON_KINDS["scaled_test"]


def test_st_bif_qann_is_the_quantizer_at_one_step():
    neuron = NeuronFactory("st_bif_qann", timesteps=1, q_threshold=0.5, level=4, sym=False)()
    assert isinstance(neuron, QuantizedActivation) and (neuron.neg_min, neuron.pos_max) == level_bounds(4, False)[::-1]
    x = drive(B, 6, dtype=torch.float64)
    expected = 0.5 * torch.clamp(torch.floor(x / 0.5 + 0.5), 0, 3)
    torch.testing.assert_close(neuron.double()(x), expected, rtol=0, atol=0)
