"""The op registry: every registered op in every neuron mode, DARTS's definitions, the primitive list."""
import copy
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from kernels.sparse_conv import SparseConv2d
from search_space.errors import UserInputError
from search_space.neurons import NEURON_KINDS, NeuronFactory
from search_space.neurons.st_bif_qann import QuantizedActivation
from search_space.ops import (
    DARTS_PRIMITIVES,
    OPS,
    SPIKE_NATIVE_PRIMITIVES,
    SPIKING_PRIMITIVES,
    FactorizedReduce,
    NeuronConvBN,
    UnitAffineBatchNorm2d,
    check_primitives,
    register_op,
)
from search_space.space import SearchSpace

CONF = Path(__file__).resolve().parents[2] / "conf"
T, B, C, SIZE = 2, 2, 4, 8
NEURON_PARAMS = {"st_bif": {}, "lif": {}, "relu": {}, "st_bif_qann": {}}


def factory(kind: str) -> NeuronFactory:
    return NeuronFactory(kind, timesteps=1 if kind == "st_bif_qann" else T, **NEURON_PARAMS[kind])


# Parametrized over the registry, so a newly registered op is tested here automatically.
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kind", sorted(NEURON_KINDS))
@pytest.mark.parametrize("name", sorted(OPS))
def test_op_forward_backward(name, kind, stride):
    torch.manual_seed(0)
    op = OPS[name](C, stride, True, factory(kind))
    x = (2.0 * torch.randn(T * B, C, SIZE, SIZE)).requires_grad_()
    y = op(x)
    assert y.shape == (T * B, C, SIZE // stride, SIZE // stride)
    (y * torch.randn_like(y)).sum().backward()
    if name == "none":
        assert torch.equal(x.grad, torch.zeros_like(x))
    else:
        assert x.grad.abs().sum() > 0
    for param_name, param in op.named_parameters():
        assert param.grad is not None, param_name


@pytest.mark.parametrize("name", sorted(OPS))
def test_exactly_the_convs_that_read_spikes_are_sparse(name):
    """With LIF, spikes are exactly 0/1: a conv whose input is binary follows a neuron."""
    op = OPS[name](C, 2, True, factory("lif"))
    seen = []
    for conv in (m for m in op.modules() if isinstance(m, nn.Conv2d)):
        conv.register_forward_hook(
            lambda module, inputs, _: seen.append((isinstance(module, SparseConv2d), bool(((inputs[0] == 0) | (inputs[0] == 1)).all())))
        )
    op(2.0 * torch.randn(T * B, C, SIZE, SIZE))
    assert all(is_sparse == reads_spikes for is_sparse, reads_spikes in seen), seen


def conv_spec(module: nn.Module) -> list[tuple]:
    """(kernel, stride, padding, dilation, depthwise) of every conv, in order."""
    return [
        (m.kernel_size, m.stride, m.padding, m.dilation, m.groups == m.in_channels > 1)
        for m in module.modules() if isinstance(m, nn.Conv2d)
    ]


def square(k: int, s: int, p: int, d: int, depthwise: bool) -> tuple:
    return ((k, k), (s, s), (p, p), (d, d), depthwise)


# Transcribed from quark0/darts cnn/operations.py (SepConv, DilConv, FactorizedReduce, OPS); s = edge stride.
DARTS_CONVS = {
    "sep_conv_3x3": lambda s: [square(3, s, 1, 1, True), square(1, 1, 0, 1, False), square(3, 1, 1, 1, True), square(1, 1, 0, 1, False)],
    "sep_conv_5x5": lambda s: [square(5, s, 2, 1, True), square(1, 1, 0, 1, False), square(5, 1, 2, 1, True), square(1, 1, 0, 1, False)],
    "sep_conv_7x7": lambda s: [square(7, s, 3, 1, True), square(1, 1, 0, 1, False), square(7, 1, 3, 1, True), square(1, 1, 0, 1, False)],
    "dil_conv_3x3": lambda s: [square(3, s, 2, 2, True), square(1, 1, 0, 1, False)],
    "dil_conv_5x5": lambda s: [square(5, s, 4, 2, True), square(1, 1, 0, 1, False)],
    "skip_connect": lambda s: [] if s == 1 else [square(1, 2, 0, 1, False)] * 2,
    "conv_7x1_1x7": lambda s: [((1, 7), (1, s), (0, 3), (1, 1), False), ((7, 1), (s, 1), (3, 0), (1, 1), False)],
}


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("name", sorted(DARTS_CONVS))
def test_darts_conv_ops_have_darts_definitions(name, stride):
    op = OPS[name](C, stride, True, factory("relu"))
    assert conv_spec(op) == DARTS_CONVS[name](stride)
    relus = [m for m in op.modules() if isinstance(m, nn.ReLU)]
    assert len(relus) == darts_relu_count(name, stride)


def darts_relu_count(name: str, stride: int) -> int:
    if name == "skip_connect":
        return 0 if stride == 1 else 1  # Identity, or FactorizedReduce's ReLU
    return 2 if name.startswith("sep_conv") else 1


@pytest.mark.parametrize("stride", [1, 2])
def test_darts_pools_and_identity(stride):
    avg = OPS["avg_pool_3x3"](C, stride, True, factory("relu"))
    assert isinstance(avg, nn.AvgPool2d)
    assert (avg.kernel_size, avg.stride, avg.padding, avg.count_include_pad) == (3, stride, 1, False)
    pool = OPS["max_pool_3x3"](C, stride, True, factory("relu"))
    assert isinstance(pool, nn.MaxPool2d) and (pool.kernel_size, pool.stride, pool.padding) == (3, stride, 1)
    x = torch.randn(2, C, 7, 6)
    for op, reference in ((avg, nn.AvgPool2d(3, stride, 1, count_include_pad=False)), (pool, nn.MaxPool2d(3, stride, 1))):
        assert torch.equal(op(x), reference(x))  # on a CPU, PyTorch's pools (kernels.pool3x3's "auto")
    skip = OPS["skip_connect"](C, stride, True, factory("relu"))
    assert type(skip) is (nn.Identity if stride == 1 else FactorizedReduce)


def test_zero_subsamples_like_darts():
    x = torch.randn(T * B, C, 7, 7)
    assert OPS["none"](C, 2, True, factory("relu"))(x).shape == (T * B, C, 4, 4)  # x[:, :, ::2, ::2]


@pytest.mark.parametrize("affine", [True, False])
def test_affine_reaches_every_batchnorm(affine):
    for name in OPS:
        for bn in (m for m in OPS[name](C, 2, affine, factory("relu")).modules() if isinstance(m, nn.BatchNorm2d)):
            assert bn.affine == affine, name


def test_spiking_convs_are_neuron_conv_bn():
    for name, kernel in (("spike_conv_3x3", 3), ("spike_conv_1x1", 1)):
        op = OPS[name](C, 2, True, factory("st_bif"))
        assert isinstance(op, NeuronConvBN)
        assert conv_spec(op) == [square(kernel, 2, kernel // 2, 1, False)]


def test_primitive_lists():
    assert DARTS_PRIMITIVES == (
        "none", "max_pool_3x3", "avg_pool_3x3", "skip_connect",
        "sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3", "dil_conv_5x5",
    )
    assert check_primitives(SPIKING_PRIMITIVES) == SPIKING_PRIMITIVES
    assert check_primitives(list(DARTS_PRIMITIVES)) == DARTS_PRIMITIVES


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["none", "conv_9x9"], r"unknown op\(s\) \['conv_9x9'\].*known ops are \['avg_pool_3x3'"),
        ([], "must be non-empty"),
        (["none", "none"], "without repeats"),
        ("none", "got the string"),
    ],
)
def test_bad_primitive_list(names, message):
    with pytest.raises(UserInputError, match=message):
        check_primitives(names)


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_op("none")(lambda C, stride, affine, neuron: nn.Identity())


@pytest.mark.parametrize("name", ["darts", "spiking", "spike_native"])
def test_search_space_configs_instantiate(name):
    space = instantiate(OmegaConf.load(CONF / "search_space" / f"{name}.yaml"))
    assert isinstance(space, SearchSpace)
    expected = {"darts": DARTS_PRIMITIVES, "spiking": SPIKING_PRIMITIVES, "spike_native": SPIKE_NATIVE_PRIMITIVES}
    assert space.primitives == expected[name]
    assert (space.steps, space.multiplier) == (4, 4)


@pytest.mark.parametrize("stride", [1, 2])
def test_every_conv_of_the_spike_native_space_reads_spikes(stride):
    """Each conv of a spike-native op is a SparseConv2d reading a neuron's output (DARTS's 1x1 convs read the
    depthwise convs' real values); the space keeps DARTS's parameter-free ops."""
    assert set(SPIKE_NATIVE_PRIMITIVES) >= {"none", "max_pool_3x3", "avg_pool_3x3", "skip_connect"}
    weighted = 0
    for name in SPIKE_NATIVE_PRIMITIVES:
        op = OPS[name](8, stride, True, NeuronFactory("st_bif_qann", timesteps=1))
        modules = [m for m in op.modules() if not list(m.children())]
        for index, module in enumerate(modules):
            if isinstance(module, nn.Conv2d):
                weighted += 1
                assert isinstance(module, SparseConv2d), (name, index)
                before = index - 1
                while isinstance(modules[before], nn.Conv2d):  # FactorizedReduce: two convs read one neuron
                    before -= 1
                assert isinstance(modules[before], QuantizedActivation), (name, index, modules[before])
    assert weighted >= 4 * 3 + 2  # sep (4 convs), dil (2), spike convs (1 each), a stride-2 skip's reduce


def test_search_space_validation():
    with pytest.raises(UserInputError, match="unknown op"):
        SearchSpace(["none", "conv_9x9"])
    with pytest.raises(UserInputError, match="multiplier <= steps"):
        SearchSpace(DARTS_PRIMITIVES, steps=2, multiplier=3)


@pytest.mark.parametrize("name", ["spike_conv_3x3", "sep_conv_3x3", "dil_conv_3x3"])
def test_st_bif_ops_hand_the_kernel_written_block_map_to_their_convs(name, monkeypatch):
    """ST-BIF on its Triton kernel (interpreted here) → SparseConv2d on the Triton backend: the
    conv gets the map the neuron kernel wrote and never runs its prescan; the op's output and
    gradients equal those of the same op run without maps."""
    from kernels.sparse_conv import function as sparse_function

    torch.manual_seed(0)
    op = OPS[name](C, 1, True, NeuronFactory("st_bif", timesteps=T, backend="triton"))
    for conv in (m for m in op.modules() if isinstance(m, SparseConv2d)):
        conv.backend = "triton"
    x = 2.0 * torch.randn(T * B, C, SIZE, SIZE)
    x[:, 1] = 0.0  # a silent channel
    reference = copy.deepcopy(op)
    for conv in (m for m in reference.modules() if isinstance(m, SparseConv2d)):
        conv.backend = "torch"  # F.conv2d, no map wanted
    x_ref = x.clone().requires_grad_()
    y_ref = reference(x_ref)
    y_ref.sum().backward()
    monkeypatch.setattr(sparse_function, "block_activity", lambda *args: pytest.fail("the prescan ran"))
    x = x.requires_grad_()
    y = op(x)
    y.sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_unit_affine_batch_norm_is_batch_norm_without_affine(dtype):
    torch.manual_seed(0)
    plain, unit = nn.BatchNorm2d(5, affine=False).to(dtype), UnitAffineBatchNorm2d(5).to(dtype)
    assert list(unit.parameters()) == [] and list(unit.state_dict()) == list(plain.state_dict())
    assert unit.weight is not None and unit.bias is not None  # what makes PyTorch pick cuDNN on a GPU
    for _ in range(2):  # training (batch statistics, running averages), then eval
        x = (3 * torch.randn(3, 5, 7, 6, dtype=dtype) + 1).requires_grad_()
        upstream = torch.randn(3, 5, 7, 6, dtype=dtype)
        outputs = [norm(x) for norm in (plain, unit)]
        grads = [torch.autograd.grad(out, x, upstream)[0] for out in outputs]
        torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
        torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
        torch.testing.assert_close(unit.running_var, plain.running_var, rtol=0, atol=0)
        torch.testing.assert_close(unit.running_mean, plain.running_mean, rtol=0, atol=0)
        plain.eval(), unit.eval()
    assert plain.num_batches_tracked == 1 and unit.num_batches_tracked == 0  # not counted: read only without momentum
    unit.load_state_dict(plain.state_dict())  # checkpoints of either load into the other


def test_unit_affine_batch_norm_without_momentum_keeps_the_cumulative_average():
    torch.manual_seed(1)
    plain, unit = nn.BatchNorm2d(3, affine=False, momentum=None), UnitAffineBatchNorm2d(3, momentum=None)
    for _ in range(3):
        x = torch.randn(4, 3, 5, 5) * 2 + 1
        torch.testing.assert_close(unit(x), plain(x), rtol=0, atol=0)
    assert unit.num_batches_tracked == plain.num_batches_tracked == 3
    torch.testing.assert_close(unit.running_var, plain.running_var, rtol=0, atol=0)


def test_supernet_ops_use_the_unit_affine_batch_norm():
    op = OPS["sep_conv_3x3"](C, 1, False, factory("relu"))
    norms = [m for m in op.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(type(m) is UnitAffineBatchNorm2d for m in norms)
    retrain = OPS["sep_conv_3x3"](C, 1, True, factory("relu"))
    assert all(type(m) is nn.BatchNorm2d and m.affine for m in retrain.modules() if isinstance(m, nn.BatchNorm2d))
