"""The exact ST-BIF SNN of a network trained with neuron=st_bif_qann, evaluated after retraining."""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn

from search_space.errors import UserInputError
from search_space.qann import QuantizedActivation, evaluate_snn

log = logging.getLogger(__name__)


def is_qann(network: nn.Module) -> bool:
    return any(isinstance(module, QuantizedActivation) for module in network.modules())


def check_snn_settings(dtype: str, spikes_per_step: Any, first_timesteps: Any = None) -> None:
    """The SNN evaluation's settings, checked before training rather than after it."""
    if dtype not in ("float32", "float64"):
        raise UserInputError(f"snn_eval_dtype={dtype!r}: use float32 (Triton neuron) or float64 (exact)")
    if isinstance(spikes_per_step, bool) or not isinstance(spikes_per_step, int) or spikes_per_step < 1:
        raise UserInputError(f"snn_spikes_per_step={spikes_per_step!r}: use a positive integer (1: binary spikes)")
    if first_timesteps is not None and (isinstance(first_timesteps, bool) or not isinstance(first_timesteps, int)
                                        or first_timesteps < 1):
        raise UserInputError(f"snn_first_timesteps={first_timesteps!r}: use null (T = 4 first) or a positive integer")


def snn_metrics(network: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], *, device: torch.device,
                max_timesteps: int, dtype: str = "float32", board: Any = None, step: int = 0,
                before_batch: Callable[[], None] = lambda: None, sharded: bool = False,
                spikes_per_step: int = 1, first_timesteps: int | None = None) -> dict[str, Any]:
    """metrics.json's SNN keys; TensorBoard gets the accuracy-over-steps curve as a figure.
    ``before_batch``, ``sharded``: see ``evaluate_snn`` (every rank then gets the same keys)."""
    check_snn_settings(dtype, spikes_per_step, first_timesteps)
    result = evaluate_snn(network, batches, device=device, max_timesteps=max_timesteps,
                          dtype=getattr(torch, dtype), before_batch=before_batch, sharded=sharded,
                          spikes_per_step=spikes_per_step, first_timesteps=first_timesteps)
    if board is not None:
        board.curve("snn/accuracy_vs_timesteps", list(result.accuracy_at), list(result.accuracy_at.values()), step,
                    xlabel="time steps", ylabel="SNN test accuracy")
        board.scalars("snn", {"test_acc": result.snn_accuracy, "timesteps": result.snn_timesteps}, step)
    ending = "steps to silence" if result.silent else "steps, still firing at snn_max_timesteps"
    log.info("SNN: %.4f test accuracy after %d %s (QANN %.4f); max |logit difference| %.3g",
             result.snn_accuracy, result.snn_timesteps, ending, result.qann_accuracy, result.logit_max_abs_diff)
    return {
        "snn_test_acc": result.snn_accuracy,
        "snn_timesteps": result.snn_timesteps,
        "snn_silent": result.silent,
        "snn_logit_max_abs_diff": result.logit_max_abs_diff,
        "snn_prediction_agreement": result.prediction_agreement,
        "snn_eval_dtype": dtype,
        "snn_spikes_per_step": spikes_per_step,
        "snn_acc_at_t": {str(steps): accuracy for steps, accuracy in result.accuracy_at.items()},
    }
