"""Spike-domain fine-tuning: a retrained QANN's binary ST-BIF SNN trained on with BPTT at a fixed T.

The QANN's SNN (``search_space.trainable_snn``) starts from the QANN's weights and thresholds and is trained by
a second ``Retrainer``, so config, resume, DDP, precision and CUDA graphs work as for the QANN: the loss is the
cross-entropy of the logits summed over T steps, the gradient flows through the ST-BIF neuron's surrogate (its
fused multi-step Triton kernel on CUDA). No auxiliary head and no drop-path: the deployed network is trained.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.energy_report import energy_metrics
from aso_se.train.retrain import OptimizerFactory, Retrainer
from kernels.st_bif.surrogates import get_surrogate
from search_space.errors import UserInputError
from search_space.qann import REPORTED_TIMESTEPS
from search_space.trainable_snn import accuracy_against_timesteps, trainable_snn, with_early_readout


@dataclass(frozen=True)
class FinetuneSettings:
    """``snn_finetune`` of conf/train.yaml (a test checks that its defaults equal these)."""

    epochs: int = 0              # 0: no fine-tuning
    timesteps: int = 4           # T of the BPTT and of the deployed SNN
    lr: float = 0.01             # the retrain optimizer's, annealed to 0 by a cosine over the epochs
    surrogate: str = "sigmoid"   # the ST-BIF neuron's surrogate derivative: sigmoid | atan | rectangular
    early_timesteps: int | None = None  # also train the answer after these steps (< T): one SNN for both T
    early_weight: float = 1.0    # that answer's cross-entropy weight
    batch_size: int | None = None  # per process; None: the QANN's (BPTT keeps T steps of activations)

    @classmethod
    def from_config(cls, node: Any) -> FinetuneSettings:
        """Checked settings from the ``snn_finetune`` config node (a mapping)."""
        values = {**asdict(cls()), **dict(node or {})}
        unknown = sorted(set(values) - set(asdict(cls())))
        if unknown:
            raise UserInputError(f"snn_finetune has no setting {unknown[0]!r}; use epochs, timesteps, lr, surrogate, "
                                 "early_timesteps, early_weight or batch_size")
        for name in ("epochs", "timesteps"):
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "epochs" else 1):
                least = "a non-negative" if name == "epochs" else "a positive"
                raise UserInputError(f"snn_finetune.{name}={value!r} must be {least} integer, e.g. 4")
        for name, example in (("lr", "0.01"), ("early_weight", "1.0")):
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise UserInputError(f"snn_finetune.{name}={value!r} must be a positive number, e.g. {example}")
        batch = values["batch_size"]
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
            raise UserInputError(f"snn_finetune.batch_size={batch!r} must be a positive integer, e.g. 64, or null")
        early = values["early_timesteps"]
        if early is not None and (isinstance(early, bool) or not isinstance(early, int)
                                  or not 1 <= early < values["timesteps"]):
            raise UserInputError(f"snn_finetune.early_timesteps={early!r} must be an integer from 1 to "
                                 f"snn_finetune.timesteps - 1 = {values['timesteps'] - 1}, or null")
        try:
            get_surrogate(values["surrogate"])
        except (KeyError, ValueError) as error:
            raise UserInputError(f"snn_finetune.surrogate={values['surrogate']!r}: use sigmoid, atan or "
                                 "rectangular") from error
        return cls(**values)


def finetune_trainer(qann: nn.Module, settings: FinetuneSettings, *, optimizer: OptimizerFactory, grad_clip: float,
                     precision: str, ctx: DistributedContext, log_every_n_steps: int, cuda_graph: bool = False,
                     channels_last: bool = False, label_smoothing: float = 0.0, snn: nn.Module | None = None
                     ) -> Retrainer:
    """A Retrainer of ``qann``'s SNN at ``settings.timesteps`` (the QANN is left as it is). ``snn``: that SNN made
    already (``trainable_snn``'s, e.g. with other neurons: ``with_neurons``), to train it with the same recipe."""
    snn = trainable_snn(qann, settings.timesteps, settings.surrogate) if snn is None else snn
    if settings.early_timesteps is not None:
        snn = with_early_readout(snn, settings.early_timesteps)
    trainer = Retrainer(snn, optimizer=functools.partial(optimizer, lr=settings.lr),
                     scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=settings.epochs),
                     epochs=settings.epochs, auxiliary_weight=settings.early_weight, drop_path_prob=0.0,
                     grad_clip=grad_clip,
                     precision=precision, ctx=ctx, log_every_n_steps=log_every_n_steps, cuda_graph=cuda_graph,
                     channels_last=channels_last, label_smoothing=label_smoothing)
    also = "" if settings.early_timesteps is None else f", also {settings.early_timesteps}"
    trainer.label = f"SNN fine-tune (T = {settings.timesteps}{also})"
    return trainer


def follow_new_epochs(trainer: Retrainer) -> None:
    """A fine-tuning resumed with another number of epochs (``trainer.epochs``): its cosine spans them, from the
    epoch it stands at, and the learning rate is set to that point of the new cosine."""
    scheduler = trainer.scheduler
    if scheduler.T_max == trainer.epochs:
        return
    scheduler.T_max = trainer.epochs
    done = min(scheduler.last_epoch, trainer.epochs)
    rates = [scheduler.eta_min + (base - scheduler.eta_min) * (1 + math.cos(math.pi * done / trainer.epochs)) / 2
             for base in scheduler.base_lrs]
    for group, rate in zip(trainer.optimizer.param_groups, rates):
        if isinstance(group["lr"], torch.Tensor):  # on the device for captured steps: filled in place
            group["lr"].fill_(rate)
        else:
            group["lr"] = rate
    scheduler._last_lr = rates


def finetuned_metrics(trainer: Retrainer, settings: FinetuneSettings, batches: Iterable[tuple[Tensor, Tensor]], *,
                      with_energy: bool, sharded: bool = False, board: Any = None,
                      before_batch: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """metrics.json's ``snn_finetune``: the fine-tuned SNN's accuracy after each reported step (and at its T),
    its steps to silence within them, and (``with_energy``) its energy per image at its T."""
    batches = list(batches)
    snn, device, step = trainer.network, trainer.ctx.device, trainer.global_step
    steps = sorted({*REPORTED_TIMESTEPS, settings.timesteps})
    result = accuracy_against_timesteps(snn, batches, device=device, timesteps=steps, sharded=sharded,
                                        before_batch=before_batch)
    metrics: dict[str, Any] = {
        **asdict(settings),
        "test_acc": result.accuracy_at[settings.timesteps],
        "acc_at_t": {str(t): acc for t, acc in result.accuracy_at.items()},
        "silent": result.silent,
        "timesteps_to_silence": result.timesteps_to_silence,
        **{key: value for key, value in trainer.metrics().items()
           if key in ("best_test_acc", "firing_rate_mean", "train_images_per_second", "history")},
    }
    if board is not None:
        board.curve("snn_finetune/accuracy_vs_timesteps", list(result.accuracy_at), list(result.accuracy_at.values()),
                    step, xlabel="time steps", ylabel="fine-tuned SNN test accuracy")
    if with_energy:
        metrics.update(finetuned_energy(trainer, batches, board))
    return metrics


def finetuned_energy(trainer: Retrainer, batches: Iterable[tuple[Tensor, Tensor]], board: Any = None
                     ) -> dict[str, Any]:
    """The fine-tuned SNN's energy per image at its T (``energy_metrics``), also to TensorBoard's
    ``snn_finetune/energy``."""
    batches = list(batches)
    energy = energy_metrics(trainer.network, batches, device=trainer.ctx.device, board=None, step=trainer.global_step)
    if board is not None:
        board.scalars("snn_finetune/energy", energy, trainer.global_step)
    return energy
