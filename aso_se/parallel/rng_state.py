"""Every global random number generator's state, in a form ``torch.load(weights_only=True)`` reads."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state() -> dict[str, Any]:
    """torch CPU and CUDA, Python's ``random`` and numpy's global generators (tensors and plain containers only)."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": {
            "kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian),
        },
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Sets the generators to a ``capture_rng_state()`` result (CUDA only when the device count matches)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    numpy = state["numpy"]
    np.random.set_state((
        numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"],
        numpy["cached_gaussian"],
    ))
