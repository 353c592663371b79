"""Input checks shared by the public API and the module, one ValueError per bad input, and the bounds they check.

Values of tensors are never read here (that would be a host sync per call): a tensor
threshold is checked for shape, dtype and device only; its positivity is the caller's
contract (STBIFNeuron checks its initial value).
"""
import torch
from torch import Tensor

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_sequence(x_seq: Tensor) -> None:
    if not isinstance(x_seq, Tensor):
        raise ValueError(f"x_seq must be a torch.Tensor [T, ...], got {type(x_seq).__name__}")
    if x_seq.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"x_seq has dtype {x_seq.dtype}: expected a floating dtype "
            "(float16, bfloat16, float32; float64 on backend 'torch'); cast the input first"
        )
    if x_seq.ndim < 1 or x_seq.shape[0] == 0:
        raise ValueError(
            f"x_seq has shape {tuple(x_seq.shape)}: expected [T, ...] with T >= 1 time steps"
        )


def level_bounds(level: int, sym: bool) -> tuple[int, int]:
    """(pos_max, neg_min) of a `level`-level quantizer: symmetric or unsigned."""
    if not isinstance(level, int) or level < 2:
        raise ValueError(f"level={level!r}: expected an int >= 2 (quantization levels)")
    return (level // 2 - 1, -(level // 2)) if sym else (level - 1, 0)


def check_bounds(pos_max: int, neg_min: int) -> None:
    if not (isinstance(pos_max, int) and isinstance(neg_min, int)):
        raise ValueError(
            f"pos_max and neg_min must be ints, got {type(pos_max).__name__} and "
            f"{type(neg_min).__name__}"
        )
    if pos_max <= neg_min:
        raise ValueError(
            f"pos_max={pos_max} <= neg_min={neg_min}: the spike counter needs "
            "neg_min < pos_max (e.g. from level_bounds(level, sym))"
        )


def check_threshold_value(q_threshold: float) -> None:
    if not q_threshold > 0:
        raise ValueError(f"q_threshold={q_threshold}: the threshold must be > 0")


def check_threshold(q_threshold: float | Tensor, x_seq: Tensor) -> None:
    """A positive number, or a one-element floating tensor on x_seq's device."""
    if not isinstance(q_threshold, Tensor):
        check_threshold_value(float(q_threshold))
        return
    if q_threshold.numel() != 1 or not q_threshold.is_floating_point():
        raise ValueError(
            f"q_threshold tensor has shape {tuple(q_threshold.shape)} and dtype "
            f"{q_threshold.dtype}: expected a one-element floating tensor"
        )
    if q_threshold.device != x_seq.device:
        raise ValueError(
            f"q_threshold is on {q_threshold.device} but x_seq is on {x_seq.device}: "
            "move both to the same device"
        )

