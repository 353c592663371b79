"""What a neuron keeps of the C++ node: its spec there, and which backward variants it has.

A neuron offers its kernels once the Python path has compiled and launched them for its usual inputs
(aligned, dense, one threshold dtype): the forward makes the spec, each backward variant (with or
without the threshold's gradient) is added when first launched. Until then, and for other inputs, the
Python path runs; the C++ node hands anything its kernels do not fit back to the Python backward.
"""
from typing import Any, Callable

import torch
from torch import Tensor

from .arguments import NativeKernel, native_kernel
from .build import build_error, enabled, module

ROLE_NAMES = ("x", "out", "theta", "grad_out", "grad_x", "partials", "counter", "grad_theta")


class Unavailable:
    """What a neuron keeps for a kind of input the node cannot take (turned off, failed to build, or kernels it
    cannot launch): the Python path runs it from then on. Falsy, as None (not decided yet) is, so that `if native:`
    asks whether there is a spec to run."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "UNAVAILABLE"


# Plan.native: None until decided, UNAVAILABLE where the node cannot take this kind of input, else a NativeSpec.
UNAVAILABLE = Unavailable()


class NativeSpec:
    __slots__ = ("apply", "index", "device_index", "x_dtype", "theta_dtype", "has_backward", "module")

    def __init__(self, loaded: Any, index: int, device_index: int, x_dtype: torch.dtype, theta_dtype: torch.dtype
                 ) -> None:
        self.module = loaded
        # (x, theta, index, raw stream) -> out, or None where the spec does not fit the inputs
        self.apply = loaded.apply
        self.index = index
        self.device_index = device_index
        self.x_dtype = x_dtype
        self.theta_dtype = theta_dtype
        self.has_backward = [False, False]

    def run(self, x: Tensor, theta: Tensor) -> Tensor | None:
        """The op's output through the C++ node on the current stream, or None where x and θ are not of the
        kind its kernels were compiled for."""
        return self.apply(x, theta, self.index, raw_stream(self.device_index))


# (device index) -> the handle of its current CUDA stream, which the node launches on
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def roles(*names: str | None) -> tuple[int | None, ...]:
    """The role numbers of a kernel's leading pointer arguments, by name (None for an argument passed as None)."""
    return tuple(None if name is None else ROLE_NAMES.index(name) for name in names)


def new_spec(x: Tensor, theta: Tensor, backward_programs: int, forward: NativeKernel,
             python_backward: Callable[[Tensor, Tensor, Tensor, bool], tuple[Tensor, Tensor | None]]
             ) -> NativeSpec | None:
    """A spec from the forward kernel, for inputs like x and theta (their kind: device, dtypes, shapes, x's
    strides; x dense), or None while the node is not built (it builds in the background)."""
    loaded = module()
    if loaded is None:
        return None
    index = loaded.new_spec(x, theta, backward_programs, forward.function, forward.grid, forward.threads,
                            forward.shared_bytes, forward.roles, forward.values, python_backward)
    return NativeSpec(loaded, index, x.get_device(), x.dtype, theta.dtype)


def set_backward(spec: NativeSpec, grad_threshold: bool, kernel: NativeKernel) -> None:
    spec.module.set_backward(spec.index, grad_threshold, kernel.function, kernel.grid, kernel.threads,
                             kernel.shared_bytes, kernel.roles, kernel.values)
    spec.has_backward[grad_threshold] = True


def available() -> bool:
    """Whether the node may still come: turned on, and its build has not failed."""
    return enabled() and build_error() is None


__all__ = ["UNAVAILABLE", "NativeSpec", "Unavailable", "available", "native_kernel", "new_spec", "raw_stream", "roles",
           "set_backward"]
