"""The retrain network: DARTS's NetworkCIFAR exactly (relu), every genotype x neuron, time handling."""
import collections
import hashlib
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from kernels.drop_path_sum import drop_path_sum
from kernels.sparse_conv import SparseConv2d, path_counts, reset_path_counts
from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES
from search_space.multistep import Stem, drop_path_scale
from search_space.network import build_network
from search_space.neurons import NEURON_KINDS, NeuronFactory, firing_rates

CONF = Path(__file__).resolve().parents[2] / "conf"

# Obtained by running quark0/darts (commit f276dd34) cnn/model.py NetworkCIFAR(36, 10, 20, True, genotype)
# in a scratch directory outside the repository, with genotypes from quark0/darts, PC-DARTS and P-DARTS:
# parameters with and without the auxiliary head (DARTS's count_parameters_in_MB drops "auxiliary").
# The same run loaded each DARTS model's state_dict into ours (strict) and got identical outputs.
DARTS_PARAMETERS = {
    "NASNet": (4288944, 3830950),
    "AmoebaNet": (3603072, 3145078),
    "DARTS_V1": (3645840, 3169414),
    "DARTS_V2": (3825768, 3349342),
    "PC_DARTS": (4111104, 3634678),
    "PC_DARTS_IMAGENET": (4197936, 3721510),
    "PDARTS": (3910224, 3433798),
}
# From the same DARTS_V2 model: sha256 of its state_dict listing ("key [shape]" per line, in order), of its
# module type names in modules() order (one per line), and the count of each type.
DARTS_V2_STATE_SHA256 = "50aef71006708227268040c0e3de51d1f55eb35044e5c565b1770ca23765d9a5"
DARTS_V2_TYPES_SHA256 = "0e82f365461730d875f2a5ff29bc633d1a136ca378f3843968f348fb3c80ba3e"
DARTS_V2_TYPE_COUNTS = {
    "Conv2d": 441, "BatchNorm2d": 241, "ReLU": 241, "Sequential": 148, "SepConv": 90, "Identity": 42,
    "ReLUConvBN": 38, "ModuleList": 21, "Cell": 20, "DilConv": 18, "MaxPool2d": 10, "FactorizedReduce": 2,
    "Linear": 2, "NetworkCIFAR": 1, "AuxiliaryHeadCIFAR": 1, "AvgPool2d": 1, "AdaptiveAvgPool2d": 1,
}
# Our class names that stand for DARTS's (the rest are the same torch classes).
DARTS_NAMES = {
    "SparseConv2d": "Conv2d", "NeuronConvBN": "ReLUConvBN", "RetrainNetwork": "NetworkCIFAR",
    "AuxiliaryHead": "AuxiliaryHeadCIFAR", "Stem": "Sequential", "DartsAvgPool": "AvgPool2d",
    "DartsMaxPool": "MaxPool2d",
}


def sha256(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def darts_cifar(name: str) -> nn.Module:
    return build_network(name, neuron=NeuronFactory("relu", timesteps=1), channels=36, layers=20, num_classes=10,
                         auxiliary=True)


def test_relu_darts_v2_is_darts_network_layer_for_layer():
    net = darts_cifar("DARTS_V2")
    types = [DARTS_NAMES.get(type(m).__name__, type(m).__name__) for m in net.modules()]
    assert collections.Counter(types) == DARTS_V2_TYPE_COUNTS
    assert sha256(types) == DARTS_V2_TYPES_SHA256
    assert sha256([f"{key} {list(value.shape)}" for key, value in net.state_dict().items()]) == DARTS_V2_STATE_SHA256
    assert net.timesteps == 1


@pytest.mark.parametrize("name", sorted(DARTS_PARAMETERS))
def test_relu_parameter_counts_equal_darts(name):
    net = darts_cifar(name)
    total = sum(p.numel() for p in net.parameters())
    without_auxiliary = sum(p.numel() for n, p in net.named_parameters() if "auxiliary" not in n)
    assert (total, without_auxiliary) == DARTS_PARAMETERS[name]


def tiny(name: str, kind: str, timesteps: int, *, neuron_params: dict | None = None, **overrides) -> nn.Module:
    if kind == "st_bif_qann":  # the QANN trains at T = 1 only
        timesteps = 1
    options = dict(channels=4, layers=3, num_classes=5, in_channels=3, auxiliary=True, timesteps=timesteps,
                   image_size=8)
    if "neuron" not in overrides:
        options["neuron"] = NeuronFactory(kind, timesteps=timesteps, **(neuron_params or {}))
    return build_network(name, **{**options, **overrides})


@pytest.mark.parametrize("timesteps", [1, 3])
@pytest.mark.parametrize("kind", sorted(NEURON_KINDS))
@pytest.mark.parametrize("name", sorted(GENOTYPES))
def test_every_genotype_with_every_neuron_trains_and_evaluates(name, kind, timesteps):
    torch.manual_seed(0)
    net = tiny(name, kind, timesteps)
    net.drop_path_prob = 0.2
    x = torch.randn(2, 3, 8, 8)
    logits, logits_aux = net(x)
    assert logits.shape == logits_aux.shape == (2, 5)
    (logits.logsumexp(1).sum() + 0.4 * logits_aux.logsumexp(1).sum()).backward()
    assert all(p.grad is not None for p in net.parameters())
    assert net.stem[0].weight.grad.abs().sum() > 0
    net.eval()
    with torch.no_grad():
        first, no_aux = net(x)
        second, _ = net(x)
    assert no_aux is None and torch.isfinite(first).all()
    torch.testing.assert_close(first, second, rtol=0, atol=0)  # no state or randomness left in eval


@pytest.mark.parametrize("kind", sorted(NEURON_KINDS))
def test_bf16_autocast(kind):
    net = tiny("DARTS_V2", kind, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, logits_aux = net(torch.randn(2, 3, 8, 8))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    (logits.float().sum() + logits_aux.float().sum()).backward()


@pytest.mark.parametrize("kind", ["st_bif", "lif"])
def test_dvs_frames_run_time_first(kind):
    net = tiny("DARTS_V2", kind, 4, in_channels=2, auxiliary=False)
    frames = (torch.rand(4, 3, 2, 8, 8) < 0.3).float()  # [T, B, polarity, H, W] events
    logits, _ = net(frames)
    assert logits.shape == (3, 5)
    logits.sum().backward()
    with pytest.raises(UserInputError, match="3 frames per sample but the network runs T=4"):
        net(frames[:3])


def test_mnist_digits_through_a_spiking_network_with_auxiliary_head(mnist_digits):
    images, labels = mnist_digits
    net = build_network("PC_DARTS", neuron=NeuronFactory("st_bif", timesteps=2), channels=8, layers=5, num_classes=10,
                        in_channels=1, auxiliary=True, image_size=28)
    pool = net.auxiliary_head.features[1]  # 28 -> 14 -> 7: DARTS's ImageNet head pool, 7x7 -> 2x2
    assert (type(pool), pool.kernel_size, pool.stride) == (nn.AvgPool2d, 5, 2)
    logits, logits_aux = net(images)
    loss = nn.functional.cross_entropy(logits, labels) + 0.4 * nn.functional.cross_entropy(logits_aux, labels)
    loss.backward()
    rates = firing_rates(net)
    assert rates and all(0 <= rate <= 1 for rate in rates.values())
    assert any(rate > 0 for rate in rates.values())


def test_spiking_network_learns_real_digits(mnist_batch):
    images, labels = mnist_batch
    torch.manual_seed(0)
    net = build_network("DARTS_V2", neuron=NeuronFactory("st_bif", timesteps=2), channels=8, layers=3, num_classes=10,
                        in_channels=1, image_size=28)
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = nn.functional.cross_entropy(net(images)[0], labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses  # measured: 3.11 -> 1.72


@pytest.mark.parametrize(("image_size", "pool"), [(32, (nn.AvgPool2d, 3)), (16, (nn.AdaptiveAvgPool2d, None))])
def test_auxiliary_pool_fits_the_size_it_sees(image_size, pool):
    net = tiny("DARTS_V2", "relu", 1, image_size=image_size)
    head_pool = net.auxiliary_head.features[1]
    assert (type(head_pool), getattr(head_pool, "stride", None)) == pool
    _, logits_aux = net(torch.randn(2, 3, image_size, image_size))
    assert logits_aux.shape == (2, 5)


def test_relu_over_several_steps_equals_one_step():
    """Identical steps through a stateless network: the T-average equals the single step."""
    one = tiny("DARTS_V2", "relu", 1, auxiliary=False)
    three = tiny("DARTS_V2", "relu", 3, auxiliary=False)
    three.load_state_dict(one.state_dict())
    x = torch.randn(2, 3, 8, 8)
    one.eval(), three.eval()
    torch.testing.assert_close(three(x)[0], one(x)[0])
    # Training mode: the same batch statistics (running statistics are not compared: BN's unbiased
    # variance update sees T times more values).
    one.train(), three.train()
    torch.testing.assert_close(three(x)[0], one(x)[0])


def test_stem_direct_encoding_equals_running_it_on_t_copies():
    stem = Stem(3, 6, timesteps=3)
    x = torch.randn(2, 3, 5, 5)
    copies = x.repeat(3, 1, 1, 1)
    torch.testing.assert_close(stem(x), nn.Sequential.forward(stem, copies))
    stem.eval()
    torch.testing.assert_close(stem(x), nn.Sequential.forward(stem, copies))


def test_drop_path_drops_whole_samples_over_all_steps():
    torch.manual_seed(0)
    timesteps, batch = 3, 64
    ones = torch.ones(timesteps * batch, 2, 2, 2)
    scale = drop_path_scale(ones, 0.25, timesteps)
    out = drop_path_sum(ones, torch.zeros_like(ones), scale, None, timesteps).view(timesteps, batch, -1)
    per_sample = out[0, :, 0]
    assert torch.equal(out, per_sample.view(1, batch, 1).expand_as(out))  # one draw per sample, all steps
    assert ((per_sample == 0) | torch.isclose(per_sample, torch.tensor(1 / 0.75))).all()
    assert 0 < (per_sample == 0).sum() < batch


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("timesteps", [1, 2])
def test_node_sums_on_the_triton_kernel_equal_pytorchs_ops(timesteps, channels_last):
    """A training step with drop-path through the cells' kernel (the interpreter; nodes that only the concatenation
    reads take their gradient slice in place, or, as a benchmark's baseline, are summed apart and concatenated)
    and through PyTorch's ops: the same draws, outputs and gradients (the kernel rounds once in fp32; in fp32 that
    is PyTorch's result to 1e-6)."""
    layout = torch.channels_last if channels_last else torch.contiguous_format
    results = []
    for backend, into_concat in (("torch", True), ("triton", True), ("triton", False)):
        torch.manual_seed(0)
        net = tiny("DARTS_V2", "lif", timesteps).to(memory_format=layout).train()
        net.drop_path_prob = 0.4
        for cell in net.cells:
            cell.drop_path_backend, cell.sums_into_concat = backend, into_concat
        x = torch.randn(4, 3, 8, 8).contiguous(memory_format=layout)
        logits = net(x)[0]
        logits.square().sum().backward()
        results.append((logits.detach(), [p.grad for p in net.parameters()]))
    (logits_torch, grads_torch), *kernel_runs = results
    for logits_triton, grads_triton in kernel_runs:
        torch.testing.assert_close(logits_triton, logits_torch, rtol=1e-5, atol=1e-6)
        for got, want in zip(grads_triton, grads_torch):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_no_drop_path_and_drawn_scales_of_one_give_equal_bits_on_the_kernel():
    """A graph that captures a run once draws drop-path scales even at probability 0 (the probability is a device
    tensor); the eager step at 0.0 draws none. Both must build the same sums into the concatenation, so that the
    captured run equals the eager one bit for bit (spiking networks amplify any rounding difference)."""
    results = []
    for drop_prob in (0.0, torch.tensor(0.0)):
        torch.manual_seed(0)
        net = tiny("DARTS_V2", "lif", 2).to(memory_format=torch.channels_last).train()
        net.drop_path_prob = drop_prob
        for cell in net.cells:
            cell.drop_path_backend = "triton"
        logits = net(torch.randn(4, 3, 8, 8).contiguous(memory_format=torch.channels_last))[0]
        logits.square().sum().backward()
        results.append([logits.detach(), *(p.grad for p in net.parameters() if p.grad is not None)])
    assert len(results[0]) == len(results[1]) > 20
    assert all(torch.equal(got, want) for got, want in zip(*results))


def test_drop_path_only_in_training_and_not_on_identity():
    net = tiny("DARTS_V1", "relu", 1, auxiliary=False)  # its normal cell has identity skips
    x = torch.randn(4, 3, 8, 8)
    net.eval()
    reference = net(x)[0]
    net.drop_path_prob = 0.5
    torch.testing.assert_close(net(x)[0], reference)
    cell = net.cells[0]
    states = [torch.randn(4, 4, 8, 8) for _ in range(2)]
    cell.train()
    identity_edge = next(i for i, op in enumerate(cell._ops) if isinstance(op, nn.Identity))
    h, scale = cell._edge(identity_edge, states, drop_prob=0.9)
    assert h is states[cell._indices[identity_edge]] and scale is None
    conv_edge = next(i for i, op in enumerate(cell._ops) if not isinstance(op, nn.Identity))
    assert cell._edge(conv_edge, states, drop_prob=0.9)[1].shape == (4,)  # one scale per sample


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"channels": 5}, "channels=5 must be even"),
        ({"channels": 0}, "channels=0 must be a positive integer"),
        ({"layers": 2.0}, "layers=2.0 must be a positive integer"),
        ({"image_size": 30}, "image_size=30 must be a multiple of 4"),
        ({"neuron": "st_bif"}, "neuron='st_bif' is not a neuron factory: pass one"),
        ({"neuron": NeuronFactory("lif", timesteps=2)}, "timesteps=3 contradicts the neuron factory's 2"),
        ({"conv_backend": "cudnn"}, "conv_backend='cudnn' is not one of auto, torch; fix model.network.conv_backend"),
    ],
)
def test_bad_network_config(overrides, message):
    with pytest.raises(UserInputError, match=message):
        tiny("DARTS_V2", "st_bif", 3, **overrides)


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("gelu", {}, "unknown neuron kind 'gelu'"),
        ("st_bif", {"tau": 3.0}, r"neuron 'st_bif' has no parameter\(s\) \['tau'\]"),
    ],
)
def test_bad_neuron_config_stops_before_the_network(kind, params, message):
    with pytest.raises(UserInputError, match=message):
        tiny("DARTS_V2", kind, 3, neuron_params=params)


def test_genotype_by_name_path_or_object(tmp_path):
    path = tmp_path / "genotype.json"
    path.write_text(GENOTYPES["PDARTS"].to_json())
    by_path = tiny(path, "relu", 1)
    by_object = tiny(GENOTYPES["PDARTS"], "relu", 1)
    assert [type(m) for m in by_path.modules()] == [type(m) for m in by_object.modules()]
    with pytest.raises(UserInputError, match="neither a bundled name"):
        tiny("NO_SUCH_CELL", "relu", 1)


@pytest.mark.parametrize(("kind", "timesteps"), [("lif", 2), ("st_bif", 4), ("relu", 1), ("st_bif_qann", 1)])
def test_timesteps_default_to_the_factory(kind, timesteps):
    net = build_network("DARTS_V2", neuron=NeuronFactory(kind, timesteps=timesteps), channels=4, layers=3,
                        num_classes=5, image_size=8)
    assert net.timesteps == timesteps and all(cell.timesteps == timesteps for cell in net.cells)


def test_a_plain_callable_neuron_needs_timesteps():
    net = build_network("DARTS_V2", neuron=lambda: nn.ReLU(), timesteps=2, channels=4, layers=3, num_classes=5,
                        image_size=8, auxiliary=False)
    assert net.timesteps == 2 and net(torch.randn(3, 3, 8, 8))[0].shape == (3, 5)
    with pytest.raises(UserInputError, match="the neuron factory has no `timesteps`: pass timesteps="):
        build_network("DARTS_V2", neuron=lambda: nn.ReLU(), channels=4, layers=3, num_classes=5, image_size=8)


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_conv_backend_reaches_every_spike_reading_conv(backend):
    net = tiny("DARTS_V2", "lif", 2, conv_backend=backend)
    convs = [m for m in net.modules() if isinstance(m, SparseConv2d)]
    assert len(convs) > 10 and {conv.backend for conv in convs} == {backend}
    reset_path_counts()
    net(torch.rand(2, 3, 8, 8))
    assert set(path_counts()) == {"dense:cpu" if backend == "auto" else "dense:requested"}


@pytest.mark.parametrize("name", ["darts", "small", "tiny"])
def test_model_configs_build_networks(name):
    config = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    net = instantiate(config.network)(genotype="DARTS_V2", neuron=NeuronFactory("relu", timesteps=1), num_classes=10,
                                      in_channels=1, image_size=28)
    assert (len(net.cells), net.auxiliary_head is not None) == (config.network.layers, config.network.auxiliary)
    assert 0 <= config.drop_path_prob < 1 and config.auxiliary_weight >= 0
