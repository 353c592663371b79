"""trainer.precision=fp16 (train.py): fp16 autocast with dynamic loss scaling; an overflowing step is skipped."""
import functools

import pytest
import torch

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.retrain import Retrainer
from search_space.errors import UserInputError
from search_space.network import build_network
from search_space.neurons import NeuronFactory

FUSED_SGD = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=3e-4, fused=True)


def fp16_trainer(seed: int = 0, optimizer=FUSED_SGD) -> Retrainer:
    torch.manual_seed(seed)
    network = build_network("DARTS_V2", neuron=NeuronFactory("st_bif_qann", timesteps=1), channels=4, layers=3,
                            num_classes=10, in_channels=1, image_size=16, auxiliary=True)
    return Retrainer(network, optimizer=optimizer,
                     scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=2), epochs=2,
                     auxiliary_weight=0.4, drop_path_prob=0.0, grad_clip=5.0, precision="fp16",
                     ctx=DistributedContext(torch.device("cpu")), log_every_n_steps=10)


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(6, 1, 16, 16, generator=generator), torch.randint(10, (6,), generator=generator)


def weights(trainer: Retrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.network.parameters()]


def test_fp16_steps_run_in_half_precision_with_a_scaled_loss_and_train():
    trainer = fp16_trainer()
    trainer.model.train()
    seen = []
    hook = trainer.network.classifier.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    before = weights(trainer)
    for seed in range(3):
        loss, _ = trainer._train_step(*batch(seed))
        assert torch.isfinite(loss)
    hook.remove()
    assert seen == [torch.float16] * 3
    assert 0 < trainer.scaler.get_scale() <= 2.0**16  # its default start, halved by any overflow
    assert any(not torch.equal(a, b) for a, b in zip(before, weights(trainer)))
    assert all(p.dtype == torch.float32 for p in trainer.network.parameters())


def test_an_overflowing_step_is_skipped_and_the_scale_halved():
    trainer = fp16_trainer()
    trainer.model.train()
    trainer._train_step(*batch(0))  # creates the scale
    trainer.scaler.update(2.0**40)  # gradients this large overflow fp16
    before, momentum = weights(trainer), [s["momentum_buffer"].clone() for s in trainer.optimizer.state.values()]
    loss, _ = trainer._train_step(*batch(1))
    assert torch.isfinite(loss)  # the loss itself is fp32 and finite; its scaled gradients are not
    assert all(torch.equal(a, b) for a, b in zip(before, weights(trainer)))
    assert all(torch.equal(a, s["momentum_buffer"]) for a, s in zip(momentum, trainer.optimizer.state.values()))
    assert trainer.scaler.get_scale() == 2.0**39
    trainer.scaler.update(1024.0)  # (halving from 2^39 would take ~25 skipped steps)
    trainer._train_step(*batch(2))  # a step that fits trains again
    assert any(not torch.equal(a, b) for a, b in zip(before, weights(trainer)))


def test_the_scale_is_checkpointed_and_restored():
    trainer = fp16_trainer()
    trainer.model.train()
    trainer._train_step(*batch(0))
    trainer.scaler.update(1024.0)
    state = trainer.state_dict()
    assert state["loss_scaler"]["scale"] == 1024.0
    resumed = fp16_trainer(seed=1)
    resumed.load_state_dict(state)
    assert resumed.scaler.get_scale() == 1024.0
    assert all(torch.equal(a, b) for a, b in zip(weights(trainer), weights(resumed)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuda_graph=true needs a CUDA device")
def test_fp16_in_a_cuda_graph_needs_a_fused_optimizer():
    plain = functools.partial(torch.optim.SGD, lr=0.1)
    with pytest.raises(UserInputError, match="fp16 with cuda_graph=true needs a fused optimizer"):
        Retrainer(torch.nn.Linear(2, 2), optimizer=plain, scheduler=lambda o: None, epochs=1, auxiliary_weight=0.0,
                  drop_path_prob=0.0, grad_clip=1.0, precision="fp16",
                  ctx=DistributedContext(torch.device("cuda")), log_every_n_steps=1, cuda_graph=True)


def test_a_skipped_first_step_leaves_zero_momentum_not_uninitialized_memory():
    """torch's fused SGD allocates its momentum buffers with empty_like on its first step and skips the update when
    that step overflowed, so they would hold whatever the memory held; the retrainer starts them at zero."""
    trainer = fp16_trainer()
    trainer.model.train()
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)  # the very first step overflows
    trainer._train_step(*batch(0))
    buffers = [state["momentum_buffer"] for state in trainer.optimizer.state.values()]
    assert len(buffers) == len(list(trainer.network.parameters()))
    assert all(torch.count_nonzero(buffer) == 0 for buffer in buffers)
    trainer.scaler.update(1024.0)
    for seed in range(1, 4):
        loss, _ = trainer._train_step(*batch(seed))
        assert torch.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in trainer.network.parameters())


def test_fp16_sgd_with_dampening_is_refused():
    damped = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, dampening=0.1)
    with pytest.raises(UserInputError, match="dampening"):
        fp16_trainer(optimizer=damped)
