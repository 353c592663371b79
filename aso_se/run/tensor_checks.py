"""Checks of a state's tensors before and after a checkpoint: NaN/Inf, and a digest to compare two states."""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch


def first_non_finite(states: Mapping[str, Any]) -> str | None:
    """The name of the first floating tensor in ``states`` (nested dicts and lists) holding NaN or Inf,
    else None; one host sync per device. A diverged step can leave a finite loss and Inf weights
    behind it: saving them would overwrite the last good checkpoint."""
    named: list[tuple[str, torch.Tensor]] = []

    def walk(value: Any, name: str) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                named.append((name, value))
        elif isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, f"{name}.{key}" if name else str(key))
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{name}[{index}]")

    walk(states, "")
    for device in dict.fromkeys(tensor.device for _, tensor in named):
        on_device = [(name, tensor) for name, tensor in named if tensor.device == device]
        # One check of all of them at once (thousands of tensors in a search's state), then per tensor if it fails.
        maxima = torch._foreach_norm([tensor for _, tensor in on_device if tensor.numel()], float("inf"))
        if not maxima or bool(torch.isfinite(torch.stack(maxima)).all()):  # NaN and Inf propagate to the max
            continue
        finite = torch.stack([torch.isfinite(tensor).all() for _, tensor in on_device]).cpu()
        return on_device[int((~finite).nonzero()[0])][0]
    return None


def tensor_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """A short hash of named tensors' values (any device, dtype or layout): a resumed run logs the
    one of its restored state, to be compared with the checkpoint's (benchmarks/stop_resume_loop.py)."""
    digest = hashlib.sha1()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:12]
