"""train.py's cuda_graph=true on a CUDA GPU: captured steps train exactly as eager ones do.
Run with `pytest -m gpu tests/aso_se/test_graphed_step_gpu.py` on a machine with a GPU."""
import copy
import functools
import math
import statistics

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aso_se.loop import LoopCallbacks
from aso_se.parallel.distributed import DistributedContext
from aso_se.train.graphed_step import GraphedTrainStep
from aso_se.train.retrain import Retrainer
from kernels.sparse_conv import SparseConv2d
from search_space.errors import UserInputError
from search_space.network import build_network
from search_space.neurons import NeuronFactory

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def random_batches(sizes, shape, classes, seed):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, *shape, generator=generator).cuda(),
             torch.randint(0, classes, (size,), generator=generator).cuda()) for size in sizes]


def test_each_replay_trains_on_its_own_batch():
    """Per-step losses and final weights of the graphed step equal the eager step's, batch by
    batch (a replay on stale inputs or a missed optimizer step would differ), and a batch of
    another size runs eagerly."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)).cuda()]
    models.append(copy.deepcopy(models[0]))
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) for model in models]

    def step(model, optimizer, inputs, labels):
        loss = F.cross_entropy(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach(), (model(inputs).argmax(1) == labels).sum().float()

    graphed = GraphedTrainStep(functools.partial(step, models[1], optimizers[1]), warmup_steps=2)
    batches = random_batches([32] * 7 + [9], (20,), 5, seed=1)
    eager_losses, graphed_losses = [], []
    for inputs, labels in batches:
        eager_losses.append(step(models[0], optimizers[0], inputs, labels)[0].item())
        graphed_losses.append(graphed(inputs, labels)[0].item())  # .item(): before the next replay
    assert (graphed.captures, graphed.replays, graphed.eager_steps) == (1, 5, 3)
    torch.testing.assert_close(graphed_losses, eager_losses, rtol=1e-5, atol=1e-6)
    assert len(set(eager_losses)) == len(eager_losses)  # the batches do differ
    for eager_param, graphed_param in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(graphed_param, eager_param, rtol=1e-5, atol=1e-6)


class Batches:
    """The retrain loop's loader interface over fixed batches."""

    def __init__(self, batches):
        self.batches, self.start = batches, 0

    def set_epoch(self, epoch, start_batch=0):
        self.start = start_batch

    def __len__(self):
        return len(self.batches) - self.start

    def __iter__(self):
        return iter(self.batches[self.start:])


SGD = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=3e-4)


def spiking_network(auxiliary):
    torch.manual_seed(0)
    return build_network("DARTS_V2", neuron=NeuronFactory("st_bif", timesteps=2), channels=8, layers=3,
                         num_classes=10, in_channels=1, image_size=16, auxiliary=auxiliary).cuda()


def retrainer(network, cuda_graph, drop_path_prob=0.0, optimizer=SGD, precision="fp32", log_every=100):
    return Retrainer(
        network, optimizer=optimizer,
        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=2), epochs=2,
        auxiliary_weight=0.4, drop_path_prob=drop_path_prob, grad_clip=5.0, precision=precision,
        ctx=DistributedContext(torch.device("cuda")), log_every_n_steps=log_every, cuda_graph=cuda_graph)


def fit(trainer, train, test):
    assert trainer.fit(Batches(train), Batches(test))


@pytest.fixture
def deterministic_fp32(monkeypatch, no_tf32):
    """cuDNN's deterministic algorithms and no TF32: the eager and the graphed run then differ
    only where a spike flips, and spiking networks amplify any rounding difference."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)


def test_retrain_with_cuda_graph_matches_eager(deterministic_fp32):
    """Two epochs of a spiking DARTS_V2 network (ST-BIF neurons, auxiliary head), graphed against
    eager from the same weights: one capture per epoch, and the same losses, accuracies and
    weights. Its convs run on cuDNN in both modes: where the dispatcher picks the sparse kernels
    (fp32 through TF32) spikes flip, which a spiking network amplifies (the other tests here run
    the dispatcher inside the graph)."""
    network = spiking_network(auxiliary=True)
    for conv in (m for m in network.modules() if isinstance(m, SparseConv2d)):
        conv.backend = "torch"
    twin = copy.deepcopy(network)
    train = random_batches([16] * 6 + [5], (1, 16, 16), 10, seed=2)
    test = random_batches([16] * 2, (1, 16, 16), 10, seed=3)
    eager, graphed = retrainer(network, False), retrainer(twin, True)
    fit(eager, train, test)
    fit(graphed, train, test)
    step = graphed.graphed_step
    assert (step.captures, step.replays, step.eager_steps) == (2, 2 * 3, 2 * 4)
    for record_eager, record_graphed in zip(eager.history, graphed.history):
        for key, tolerance in (("train_loss", 1e-3), ("test_loss", 1e-3), ("train_acc", 0), ("test_acc", 0)):
            assert record_graphed[key] == pytest.approx(record_eager[key], rel=tolerance, abs=1e-6), \
                (key, eager.history, graphed.history)
    for (name, eager_param), graphed_param in zip(network.named_parameters(), twin.parameters()):
        error = ((graphed_param - eager_param).norm() / eager_param.norm().clamp_min(1e-12)).item()
        assert error < 1e-3, (name, error)


def step_losses(trainer, batch, steps):
    """Each step's training loss over `steps` steps of `batch` per epoch (from the running means that on_log gets)."""
    means = []

    class KeepMeans(LoopCallbacks):
        def on_log(self, scalars, step):
            means.append(scalars["loss"])

    assert trainer.fit(Batches([batch] * steps), Batches([batch]), callbacks=KeepMeans())
    epochs = [means[start:start + steps] for start in range(0, len(means), steps)]
    return [[k * mean - (k - 1) * before for k, mean, before in zip(range(1, steps + 1), epoch, [0.0] + epoch)]
            for epoch in epochs]


@pytest.mark.parametrize("conv_backend", ["auto", "torch"])
def test_cuda_graph_draws_new_drop_path_masks_each_replay(conv_backend, deterministic_fp32):
    """Drop-path draws its masks inside the graph: with the weights held fixed (learning rate 0), one batch's loss
    is the same at every step of the epoch without drop-path, and varies from replay to replay with it (masks frozen
    at capture, or a probability the graph does not see, would repeat one loss), around the eager run's mean.
    Fixed weights make the test about the masks alone: in training, a tiny spiking network's loss over two epochs
    with drop-path rose in eager runs on an H200 as often as in graphed ones (RESULTS.md)."""
    network = spiking_network(auxiliary=False)
    for conv in (m for m in network.modules() if isinstance(m, SparseConv2d)):
        conv.backend = conv_backend
    twin = copy.deepcopy(network)
    batch = random_batches([16], (1, 16, 16), 10, seed=4)[0]
    fixed = functools.partial(torch.optim.SGD, lr=0.0)
    losses = {"graphed": step_losses(retrainer(network, True, drop_path_prob=0.6, optimizer=fixed, log_every=1),
                                     batch, 24),
              "eager": step_losses(retrainer(twin, False, drop_path_prob=0.6, optimizer=fixed, log_every=1),
                                   batch, 24)}
    summary = {name: [(min(epoch), statistics.mean(epoch), max(epoch)) for epoch in epochs]
               for name, epochs in losses.items()}
    for name, (no_drop, drop) in losses.items():  # epoch 2 drops edges with probability 0.6 * 1 / 2
        assert all(math.isfinite(loss) for loss in no_drop + drop), summary
        # (the dispatcher's sparse kernels in the graph may round apart from cuDNN's warm-up steps: a spike or two)
        assert max(no_drop) - min(no_drop) < 5e-3 * statistics.mean(no_drop), (name, summary)
        assert statistics.stdev(drop) > 0.02 * statistics.mean(drop), (name, summary)
    graphed, eager = losses["graphed"][1], losses["eager"][1]
    standard_error = math.hypot(statistics.stdev(graphed), statistics.stdev(eager)) / math.sqrt(len(graphed))
    assert abs(statistics.mean(graphed) - statistics.mean(eager)) < 4 * standard_error, summary


class PinnedLoader:
    """The retrain loop's loader interface over a torch DataLoader with worker processes and
    pinned memory, as the image data sets use: its pin-memory thread calls CUDA while the
    step is being captured."""

    def __init__(self, inputs, labels):
        self.loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, labels), batch_size=16,
                                                  num_workers=2, pin_memory=True)

    def set_epoch(self, epoch, start_batch=0):
        assert start_batch == 0

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        return iter(self.loader)


def test_retrain_with_cuda_graph_and_a_pinned_memory_loader():
    network = spiking_network(auxiliary=False)
    generator = torch.Generator().manual_seed(5)
    loader = PinnedLoader(torch.randn(16 * 12, 1, 16, 16, generator=generator),
                          torch.randint(0, 10, (16 * 12,), generator=generator))
    trainer = retrainer(network, True)
    assert trainer.fit(loader, loader)
    assert trainer.graphed_step.captures == 2 and trainer.graphed_step.replays == 2 * 9
    assert all(torch.isfinite(torch.tensor(record["train_loss"])) for record in trainer.history)


def test_retrain_with_cuda_graph_and_a_capturable_adam():
    """Adam with capturable=True is captured and trains; without it the retrainer refuses it up
    front with a one-line error instead of failing inside the capture."""
    network = spiking_network(auxiliary=False)
    train = random_batches([16], (1, 16, 16), 10, seed=6) * 10
    with pytest.raises(UserInputError, match="capturable=False"):
        retrainer(network, True, optimizer=functools.partial(torch.optim.Adam, lr=1e-3))
    trainer = retrainer(network, True, optimizer=functools.partial(torch.optim.Adam, lr=1e-3, capturable=True))
    fit(trainer, train, train[:1])
    losses = [record["train_loss"] for record in trainer.history]
    assert trainer.graphed_step.captures == 2 and losses[1] < losses[0], losses


FUSED_SGD = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=3e-4, fused=True)


def fused_eager_and_graphed(precision):
    """The same spiking network trained eagerly and in graphs with a fused SGD: (eager, graphed) trainers, fitted."""
    network = spiking_network(auxiliary=True)
    for conv in (m for m in network.modules() if isinstance(m, SparseConv2d)):
        conv.backend = "torch"
    twin = copy.deepcopy(network)
    train = random_batches([16] * 6 + [5], (1, 16, 16), 10, seed=2)
    test = random_batches([16] * 2, (1, 16, 16), 10, seed=3)
    eager = retrainer(network, False, optimizer=FUSED_SGD, precision=precision)
    graphed = retrainer(twin, True, optimizer=FUSED_SGD, precision=precision)
    assert graphed.capture_once and not eager.capture_once
    fit(eager, train, test)
    fit(graphed, train, test)
    return eager, graphed


def assert_graphed_follows_eager(eager, graphed, rel, abs_loss):
    for record_eager, record_graphed in zip(eager.history, graphed.history):
        for key in ("train_loss", "test_loss"):
            assert record_graphed[key] == pytest.approx(record_eager[key], rel=rel, abs=abs_loss), key
    for (name, eager_param), graphed_param in zip(eager.network.named_parameters(), graphed.network.parameters()):
        assert torch.isfinite(graphed_param).all(), name
        error = ((graphed_param - eager_param).norm() / eager_param.norm().clamp_min(1e-12)).item()
        assert error < rel, (name, error)


def test_retrain_with_a_fused_sgd_captures_once_and_matches_eager(deterministic_fp32):
    """A fused SGD takes its learning rate from the device, so the whole run is one capture (the schedule and
    the drop-path probability are filled in place); the losses and weights equal an eager run's."""
    eager, graphed = fused_eager_and_graphed("fp32")
    step = graphed.graphed_step
    assert (step.captures, step.replays, step.eager_steps) == (1, 3 + 6, 3 + 1 + 1)
    assert [float(lr) for lr in graphed.scheduler.get_last_lr()] == pytest.approx(eager.scheduler.get_last_lr())
    assert_graphed_follows_eager(eager, graphed, rel=1e-3, abs_loss=1e-6)


def test_fp16_with_loss_scaling_captures_once_and_matches_eager(deterministic_fp32):
    """fp16 autocast with a GradScaler in the graphs: the inf check, the skipped step and the scale update run on
    the device; losses, the final scale and the weights follow an eager run's (fp16 tolerances). The first steps
    start at the scaler's 65,536 and may overflow, which both runs must skip alike."""
    eager, graphed = fused_eager_and_graphed("fp16")
    assert graphed.graphed_step.captures == 1
    assert graphed.scaler.get_scale() == eager.scaler.get_scale()
    assert_graphed_follows_eager(eager, graphed, rel=2e-2, abs_loss=1e-4)


def test_a_distilled_retrain_with_cuda_graph_matches_eager(deterministic_fp32):
    """The teacher's forward inside the captured step: graphed and eager distillation from one frozen teacher train
    the same student to the same losses and weights."""
    from aso_se.train.distill import Distillation

    torch.manual_seed(1)
    teacher = build_network("DARTS_V2", neuron=NeuronFactory("relu", timesteps=1), channels=8, layers=3,
                            num_classes=10, in_channels=1, image_size=16, auxiliary=False).cuda()
    network = spiking_network(auxiliary=True)
    for conv in (m for m in network.modules() if isinstance(m, SparseConv2d)):
        conv.backend = "torch"
    twin = copy.deepcopy(network)
    train = random_batches([16] * 6, (1, 16, 16), 10, seed=2)
    test = random_batches([16] * 2, (1, 16, 16), 10, seed=3)
    trainers = []
    for student, graphed in ((network, False), (twin, True)):
        trainer = Retrainer(
            student, optimizer=SGD, scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=2),
            epochs=2, auxiliary_weight=0.4, drop_path_prob=0.0, grad_clip=5.0, precision="fp32",
            ctx=DistributedContext(torch.device("cuda")), log_every_n_steps=100, cuda_graph=graphed,
            distill=Distillation(copy.deepcopy(teacher), weight=0.5, temperature=4.0))
        fit(trainer, train, test)
        trainers.append(trainer)
    eager, graphed = trainers
    assert graphed.graphed_step.captures >= 1
    for record_eager, record_graphed in zip(eager.history, graphed.history):
        assert record_graphed["train_loss"] == pytest.approx(record_eager["train_loss"], rel=1e-3)
        assert record_graphed["test_acc"] == record_eager["test_acc"]
    for (name, eager_param), graphed_param in zip(network.named_parameters(), twin.parameters()):
        error = ((graphed_param - eager_param).norm() / eager_param.norm().clamp_min(1e-12)).item()
        assert error < 1e-3, (name, error)
