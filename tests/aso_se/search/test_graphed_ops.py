"""CUDA graphs of the supernet's ops (``search.graph_ops``): the same search as eager ops."""
from __future__ import annotations

import copy

import pytest
import torch

from aso_se.search import graphed_ops
from aso_se.search.graphed_ops import OpGraphs, StalePassError, _capturable, release_idle_cache
from search_space.neurons import NeuronFactory, SpikingNeuron, set_firing_rate_recording
from search_space.ops import DARTS_PRIMITIVES, OPS
from search_space.space import SearchSpace
from tests.aso_se.helpers import make_engine, sample_ops, tiny_supernet

DARTS_SPACE = SearchSpace(DARTS_PRIMITIVES)


def needs_cuda(test):
    """A GPU test: selected by ``pytest -m gpu`` (the CPU suite hides CUDA)."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


def graphed_and_eager(digits, neuron: str = "st_bif", timesteps: int = 2, device: str = "cuda"):
    """(images, a tiny supernet with op graphs, an eager deep copy of it, one top-2 sample of its ops)."""
    images = digits[0].to(device)
    supernet = tiny_supernet(neuron, timesteps=timesteps, space=DARTS_SPACE, channels=8).to(device)
    set_firing_rate_recording(supernet, False)  # a recording neuron runs eagerly (the engine records rarely)
    reference = copy.deepcopy(supernet)
    supernet.use_op_graphs(True)
    return images, supernet, reference, sample_ops(supernet, k=2, seed=None)


class RoutingRecorder:
    """Stands in for OpGraphs: runs each op eagerly and records the keys the cells hand it."""

    def __init__(self) -> None:
        self.passes: list[list[tuple]] = []
        self.last_grad_buffer = None  # nothing replayed

    def state_buffer(self, source_key):
        return None

    def begin_pass(self) -> None:
        self.passes.append([])

    def __call__(self, slot_key, source_key, op, x):
        self.passes[-1].append((slot_key, source_key, op))
        return op(x)


def test_cells_route_every_op_through_the_graphs_with_one_slot_per_edge_place(digits) -> None:
    images, _ = digits
    supernet = tiny_supernet("st_bif", space=DARTS_SPACE)
    samples = sample_ops(supernet, k=2, seed=3)
    cells = [wrapper.cell for wrapper in supernet.cells]
    ops = [op for cell in cells for op in (cell.preprocess0, cell.preprocess1, *(o for e in cell.edges for o in e.ops))]
    eager_calls = []
    hooks = [op.register_forward_hook(lambda module, *_: eager_calls.append(module)) for op in ops]
    expected = supernet(images, samples)
    for hook in hooks:
        hook.remove()
    recorder = RoutingRecorder()
    supernet.op_graphs = recorder
    torch.testing.assert_close(supernet(images, samples), expected, rtol=1e-6, atol=1e-7)
    (calls,) = recorder.passes
    assert [op for _, _, op in calls] == eager_calls  # every op the cells ran, in the same order
    slot_keys = [slot for slot, _, _ in calls]
    assert len(slot_keys) == len(set(slot_keys))  # one op per slot and pass: the slot's memory is free
    for cell in cells:
        mine = [(slot, source) for slot, source, _ in calls if slot[0] == id(cell)]
        assert mine[:2] == [((id(cell), "pre0"), (id(cell), "s0")), ((id(cell), "pre1"), (id(cell), "s1"))]
        assert {slot[2] for slot, _ in mine[2:]} == {0, 1}  # k = 2: an edge's first or second op
        assert all(source[1] in range(2 + cell.steps) for _, source in mine[2:])


def test_recomputing_supernets_and_cpu_engines_run_without_graphs(digits, caplog) -> None:
    images, labels = digits
    engine = make_engine(tiny_supernet("st_bif", space=DARTS_SPACE), graph_ops=True)  # CPU: nothing to capture
    assert engine.supernet.op_graphs is None
    assert "search.graph_ops=true has no effect here (the device is not CUDA)" in caplog.text
    supernet = tiny_supernet("st_bif", space=DARTS_SPACE, recompute=True)
    recorder = RoutingRecorder()
    supernet.op_graphs = recorder
    supernet(images, sample_ops(supernet, k=2)).sum().backward()
    assert recorder.passes == []  # a recomputation in backward would replay a graph twice in one pass


@pytest.mark.parametrize("neuron", ["st_bif", "st_bif_qann", "relu", "lif"])
def test_the_neuron_kinds_say_they_capture_and_an_unknown_spiking_neuron_stays_eager(neuron: str) -> None:
    factory = NeuronFactory(neuron, timesteps=1 if neuron == "st_bif_qann" else 2)
    op = OPS["sep_conv_3x3"](4, 1, False, factory)
    assert _capturable(op)
    for module in op.modules():
        if isinstance(module, SpikingNeuron):
            module.capturable = False  # as SpikingNeuron(neuron, T) of a neuron its builder does not vouch for
            assert not _capturable(op)


def test_a_copied_supernet_gets_graphs_of_its_own() -> None:
    supernet = tiny_supernet("st_bif", space=DARTS_SPACE)
    supernet.use_op_graphs(True)
    copied = copy.deepcopy(supernet)
    assert isinstance(copied.op_graphs, OpGraphs) and copied.op_graphs is not supernet.op_graphs
    supernet.use_op_graphs(False)
    assert supernet.op_graphs is None


@pytest.mark.parametrize(("free", "reserved", "allocated", "released"), [
    (10, 100, 95, False), (10, 100, 89, True), (50, 60, 10, False), (0, 30, 30, False),
])
def test_the_idle_cache_is_released_before_a_capture_only_when_it_outgrows_free_memory(
        monkeypatch, free: int, reserved: int, allocated: int, released: bool) -> None:
    emptied = []
    monkeypatch.setattr(graphed_ops.torch.cuda, "mem_get_info", lambda device: (free, 1000))
    monkeypatch.setattr(graphed_ops.torch.cuda, "memory_reserved", lambda device: reserved)
    monkeypatch.setattr(graphed_ops.torch.cuda, "memory_allocated", lambda device: allocated)
    monkeypatch.setattr(graphed_ops.torch.cuda, "empty_cache", lambda: emptied.append(True))
    assert release_idle_cache(torch.device("cuda", 0)) is released
    assert emptied == ([True] if released else [])


def run_search(digits, neuron: str, timesteps: int, graph_ops: bool, steps: int = 6, precision: str = "fp32"):
    images, labels = digits
    supernet = tiny_supernet(neuron, timesteps=timesteps, space=DARTS_SPACE, channels=8, in_channels=1)
    engine = make_engine(supernet, device="cuda", graph_ops=graph_ops, precision=precision)
    losses = []
    for step in range(steps):
        scalars = engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]),
                                    temperature=1.0, entropy_weight=0.01)
        losses.append(torch.stack([scalars["loss"], scalars["arch_loss"]]))
    return engine, torch.stack(losses).cpu()


@pytest.fixture
def deterministic_cudnn():
    """cuDNN's deterministic algorithms: with its default ones, two eager runs of this search already differ by
    ~1e-2 in loss after 6 steps (atomics in the weight gradients, amplified by SGD and spikes)."""
    saved = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    yield
    torch.backends.cudnn.deterministic = saved


@needs_cuda
@pytest.mark.parametrize(("neuron", "timesteps", "precision"), [
    ("st_bif", 2, "fp32"), ("st_bif_qann", 1, "fp32"), ("relu", 1, "fp32"), ("lif", 2, "fp32"), ("st_bif", 2, "bf16"),
])
def test_graphed_ops_give_the_eager_search(digits, deterministic_cudnn, neuron: str, timesteps: int,
                                           precision: str) -> None:
    graphed, graphed_losses = run_search(digits, neuron, timesteps, graph_ops=True, precision=precision)
    eager, eager_losses = run_search(digits, neuron, timesteps, graph_ops=False, precision=precision)
    graphs = graphed.supernet.op_graphs
    assert graphs.captured > 20 and graphs.replays > 100  # the graphs did run (first calls are eager)
    assert graphs.failed == 0
    torch.testing.assert_close(graphed_losses, eager_losses, rtol=1e-6, atol=1e-7)
    eager_state = eager.supernet.state_dict()
    for name, value in graphed.supernet.state_dict().items():  # weights, α, BatchNorm statistics
        torch.testing.assert_close(value, eager_state[name], rtol=1e-6, atol=1e-7, msg=name)


@needs_cuda
def test_a_backward_after_a_later_forward_raises(digits) -> None:
    images, _ = digits
    supernet = tiny_supernet("st_bif_qann", timesteps=1, space=DARTS_SPACE, channels=8).cuda()
    supernet.use_op_graphs(True)
    samples = sample_ops(supernet, k=2, seed=None)  # no Gumbel noise: its generator would be a CPU one
    images = images.cuda()
    for _ in range(2):  # warm-up call, then capture
        supernet(images, samples).sum().backward()
    assert supernet.op_graphs.captured > 0
    first = supernet(images, samples).sum()
    supernet(images, samples).sum()  # overwrites the first forward's activations
    with pytest.raises(StalePassError, match="graph_ops=false"):
        first.backward()


@needs_cuda
@pytest.mark.parametrize(("neuron", "timesteps"), [("st_bif", 2), ("st_bif_qann", 1), ("lif", 2)])
def test_replayed_ops_give_the_eager_ops_values_gradients_and_statistics(
    digits, deterministic_cudnn, neuron: str, timesteps: int
) -> None:
    images, supernet, reference, samples = graphed_and_eager(digits, neuron, timesteps)
    generator = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(4):  # eager warm-up, then captures (once each conv's route is fixed) and replays
        out, expected = supernet(images, samples), reference(images, samples)
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)
        grad = torch.randn(out.shape, device="cuda", generator=generator)
        out.backward(grad)
        expected.backward(grad)
        for (name, p), q in zip(supernet.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7, msg=name)
            p.grad = q.grad = None
        for (name, b), c in zip(supernet.named_buffers(), reference.buffers()):  # BatchNorm statistics
            torch.testing.assert_close(b, c, rtol=1e-6, atol=1e-7, msg=name)
    graphs = supernet.op_graphs
    assert graphs.captured > 10 and graphs.replays > graphs.captured and graphs.failed == 0


@needs_cuda
def test_a_graphed_search_resumed_from_its_state_ends_like_the_uninterrupted_one(digits, deterministic_cudnn) -> None:
    """What a resume after SIGKILL does to the engine (checkpoint = ``state_dict``), with graphs on both sides:
    the resumed engine captures its own graphs and continues exactly."""
    straight, straight_losses = run_search(digits, "st_bif", 2, graph_ops=True, steps=6)
    first, first_losses = run_search(digits, "st_bif", 2, graph_ops=True, steps=3)
    state = copy.deepcopy(first.state_dict())
    images, labels = digits
    resumed = make_engine(tiny_supernet("st_bif", timesteps=2, space=DARTS_SPACE, channels=8, in_channels=1, seed=1),
                          device="cuda", graph_ops=True)
    resumed.load_state_dict(state)
    losses = []
    for _ in range(3):
        scalars = resumed.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0,
                                     entropy_weight=0.01)
        losses.append(torch.stack([scalars["loss"], scalars["arch_loss"]]))
    assert resumed.supernet.op_graphs.captured > 0
    torch.testing.assert_close(torch.cat([first_losses, torch.stack(losses).cpu()]), straight_losses,
                               rtol=1e-6, atol=1e-7)


@needs_cuda
def test_a_graphed_search_across_a_growth_ends_like_the_eager_one(deterministic_cudnn) -> None:
    """Two cycles with a growth between: the old supernet's graphs are dropped (their pools freed for the new
    captures), the grown supernet captures its own, and the search ends as the eager one does."""
    from aso_se.data import MNIST5kData

    def search(graph_ops: bool):
        supernet = tiny_supernet("st_bif", timesteps=2, space=DARTS_SPACE, channels=8, in_channels=1)
        engine = make_engine(supernet, device="cuda", graph_ops=graph_ops, seed=3)
        first = engine.supernet
        assert engine.run(*MNIST5kData(max_train_samples=32).search_loaders(8, seed=0))
        return engine, first, engine.genotypes[-1]

    graphed, first, graphed_genotype = search(graph_ops=True)
    eager, _, eager_genotype = search(graph_ops=False)
    assert first is not graphed.supernet and first.op_graphs is None
    graphs = graphed.supernet.op_graphs
    assert graphs.captured > 0 and graphs.replays > 0 and graphs.failed == 0
    assert graphed_genotype == eager_genotype
    eager_state = eager.supernet.state_dict()
    for name, value in graphed.supernet.state_dict().items():  # weights, α, BatchNorm statistics
        torch.testing.assert_close(value, eager_state[name], rtol=1e-5, atol=1e-6, msg=name)


@needs_cuda
def test_without_weight_grads_the_replays_give_the_eager_alpha_gradient_and_no_weight_gradient(
    digits, deterministic_cudnn
) -> None:
    """A first-order α step's backward: graphed ops replay their input-only backward graph."""
    images, supernet, reference, samples = graphed_and_eager(digits)
    for _ in range(3):  # eager warm-up, captures, replays
        with supernet.op_graphs.without_weight_grads():
            loss = supernet(images, samples).square().mean()
            got = torch.autograd.grad(loss, supernet.arch_parameters())
        want = torch.autograd.grad(reference(images, samples).square().mean(), reference.arch_parameters())
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        weights = [p for name, p in supernet.named_parameters() if "arch" not in name]
        loss = supernet(images, samples).square().mean()  # outside: the weights' gradients again
        loss.backward()
        reference(images, samples).square().mean().backward()
        for p, q in zip(weights, [q for name, q in reference.named_parameters() if "arch" not in name]):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
            p.grad = q.grad = None
    entries = [entry for entry in supernet.op_graphs._entries.values() if entry]
    assert len(entries) > 10 and all(entry.input_backward is not None for entry in entries if entry.input_grad)


@needs_cuda
def test_weight_gradients_kept_by_zero_grad_or_summed_over_two_backwards_equal_the_eager_ones(
    digits, deterministic_cudnn
) -> None:
    """A replayed weight gradient becomes ``.grad`` without a copy (when ``.grad`` was None); the next replay must
    not overwrite it: gradients then zeroed in place (``set_to_none=False``) or summed over backwards, as eager."""
    images, supernet, reference, samples = graphed_and_eager(digits)
    generator = torch.Generator(device="cuda").manual_seed(0)

    def backward_and_compare() -> None:
        out, expected = supernet(images, samples), reference(images, samples)
        grad = torch.randn(out.shape, device="cuda", generator=generator)
        out.backward(grad)
        expected.backward(grad)
        for (name, p), q in zip(supernet.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-6, msg=name)

    def for_both(action) -> None:
        for net in (supernet, reference):
            for p in net.parameters():
                action(p)

    for _ in range(3):  # eager warm-up, captures, replays
        for_both(lambda p: setattr(p, "grad", None))
        backward_and_compare()  # .grad is the replay's buffer now
        for_both(lambda p: p.grad.zero_() if p.grad is not None else None)
        backward_and_compare()  # zeroed in place, then the replay's gradient added
        backward_and_compare()  # summed over two backwards
    assert supernet.op_graphs.replays > supernet.op_graphs.captured > 10
