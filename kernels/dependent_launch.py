"""Programmatic dependent launch (PDL, Hopper and later) for kernels that run back to back.

A kernel launched with `launch_pdl=True` may start while the kernel before it still runs: its
programs run up to `gdc_wait()`, which returns once that kernel has completed and its writes are
visible. Such a kernel must call `gdc_wait()` before it touches global memory at all (a fresh
buffer may reuse memory the earlier kernel still uses). `gdc_launch_dependents()` lets the next
kernel start launching before this one ends. Both sit behind a constexpr `PDL` flag, compiled out
on Triton's CPU interpreter and on GPUs before sm_90.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_enabled = os.environ.get("ASO_SE_PDL", "1") != "0"


def set_enabled(enabled: bool) -> bool:
    """Turns dependent launches on or off for later calls (A/B timing); returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


@functools.lru_cache(maxsize=16)
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def use_pdl(x: torch.Tensor) -> bool:
    """True when kernels on x's device launch dependently: a CUDA device of sm_90 or later, and
    not turned off (`ASO_SE_PDL=0` or `set_enabled(False)`)."""
    return _enabled and x.is_cuda and _device_supports(x.device.index if x.device.index is not None
                                                         else torch.cuda.current_device())


@triton.jit
def wait_then_release(PDL: tl.constexpr):
    """At a kernel's start: wait for the kernel before it, then let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
