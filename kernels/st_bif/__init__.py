"""Fused, trainable multi-step ST-BIF neuron: public API.

`st_bif_multistep` runs the neuron over a whole sequence `[T, ...]` from its initial state
(q = 0.5, acc = 0); `STBIFNeuron` is the module for `[T, B, ...]` input. The backend is picked
from one table: "auto" runs the Triton kernels on CUDA and the torch reference elsewhere;
"triton" and "torch" force one ("triton" on CPU tensors needs TRITON_INTERPRET=1). Eager calls
check their inputs and pick the backend once per kind of call (shapes, strides, dtypes, devices,
bounds, surrogate, backend); under torch.compile the checks are traced and the custom op runs.
"""
from typing import Callable

import torch
from torch import Tensor, nn

from kernels.block_map import BlockMap
from kernels.memory_order import in_storage_order, storage_order
from kernels.native.spec import NativeSpec, raw_stream

from .function import STBIFFunction, st_bif_triton
from .reference import st_bif_reference
from .surrogates import SURROGATES, get_surrogate
from .triton import Plan, block_map_of, get_plan
from .validation import check_bounds, check_sequence, check_threshold, check_threshold_value

__all__ = ["STBIFNeuron", "SURROGATES", "level_bounds", "st_bif_multistep", "st_bif_multistep_with_block_map"]


def _st_bif_torch(
    x_seq: Tensor, q_threshold: Tensor, pos_max: int, neg_min: int, surrogate: str
) -> Tensor:
    return st_bif_reference(x_seq, q_threshold, pos_max, neg_min, get_surrogate(surrogate))[0]


_BACKENDS: dict[str, Callable[[Tensor, Tensor, int, int, str], Tensor]] = {
    "torch": _st_bif_torch,
    "triton": st_bif_triton,
}
# What "auto" runs per device type; devices not listed run the reference.
_AUTO_BACKEND: dict[str, str] = {"cuda": "triton", "cpu": "torch"}


def _check_backend(backend: str) -> None:
    if backend != "auto" and backend not in _BACKENDS:
        raise ValueError(
            f"unknown backend {backend!r}: expected 'auto' or one of {sorted(_BACKENDS)}"
        )


def _resolve_backend(backend: str, device: torch.device) -> str:
    _check_backend(backend)
    return _AUTO_BACKEND.get(device.type, "torch") if backend == "auto" else backend


def level_bounds(level: int, sym: bool) -> tuple[int, int]:
    """(pos_max, neg_min) of a `level`-level quantizer: symmetric or unsigned."""
    if not isinstance(level, int) or level < 2:
        raise ValueError(f"level={level!r}: expected an int >= 2 (quantization levels)")
    return (level // 2 - 1, -(level // 2)) if sym else (level - 1, 0)


def st_bif_multistep(
    x_seq: Tensor,
    q_threshold: float | Tensor,
    pos_max: int,
    neg_min: int,
    *,
    surrogate: str = "sigmoid",
    backend: str = "auto",
) -> Tensor:
    """ST-BIF over `x_seq` [T, ...] (fp16/bf16/fp32); returns the output, same shape and dtype.

    `q_threshold` is a number or a one-element tensor (it may require grad). Gradients reach
    x_seq and q_threshold through the surrogate `surrogate` (a name in SURROGATES).
    """
    return _run(x_seq, q_threshold, pos_max, neg_min, surrogate, backend, with_block_map=False)[0]


def st_bif_multistep_with_block_map(
    x_seq: Tensor,
    q_threshold: float | Tensor,
    pos_max: int,
    neg_min: int,
    *,
    surrogate: str = "sigmoid",
    backend: str = "auto",
) -> tuple[Tensor, BlockMap | None]:
    """`st_bif_multistep` and the block map of its output, for x_seq [T, B, C, H, W].

    The map (kernels/block_map.py: int8 blocks [T*B, ceil(H/8), ceil(W/8), C], 1 where an 8x8
    block of a plane holds a spike, and plane flags [T*B, C]) is what
    `kernels.sparse_conv.sparse_conv2d(..., block_map=)` would otherwise compute with a pass over
    the output. The Triton kernel writes it while it writes the spikes; on the torch backend,
    under torch.compile, or for other shapes the map is None (the conv then makes its own).
    """
    return _run(x_seq, q_threshold, pos_max, neg_min, surrogate, backend, with_block_map=True)[:2]


def _run(
    x_seq: Tensor, q_threshold: float | Tensor, pos_max: int, neg_min: int, surrogate: str, backend: str,
    with_block_map: bool,
) -> tuple[Tensor, BlockMap | None, Plan | None]:
    """(output, its block map if asked for and made, the Plan it ran on: None for the reference, under
    torch.compile and for other memory orders)."""
    if torch.compiler.is_compiling():
        return _run_traced(x_seq, q_threshold, pos_max, neg_min, surrogate, backend), None, None
    if isinstance(x_seq, Tensor) and not x_seq.is_contiguous():
        order = storage_order(x_seq)
        if order is not None:  # e.g. channels_last: run on the memory order and hand back x_seq's strides
            run = lambda x: _run(x, q_threshold, pos_max, neg_min, surrogate, backend, False)[0]  # noqa: E731
            return in_storage_order(run, x_seq, order), None, None
    if not isinstance(q_threshold, Tensor):
        check_sequence(x_seq)
        check_threshold(q_threshold, x_seq)
        # A device-side fill, not a host-to-device copy: keeps CUDA-graph capture working.
        q_threshold = torch.full((), float(q_threshold), device=x_seq.device)
    try:
        key = (x_seq.shape, x_seq.stride(), x_seq.dtype, x_seq.device, q_threshold.shape, q_threshold.dtype,
               q_threshold.device, pos_max, neg_min, type(pos_max), type(neg_min), surrogate, backend)
    except AttributeError:  # x_seq is not a tensor
        check_sequence(x_seq)
        raise
    plan = _ROUTES.get(key, _NEW)
    if plan is _NEW:
        plan = _new_route(key, x_seq, q_threshold, pos_max, neg_min, surrogate, backend)
    if plan is None:
        return _st_bif_torch(x_seq, q_threshold, pos_max, neg_min, surrogate), None, None
    native = plan.native
    if native and not with_block_map:  # the C++ autograd node (kernels/native), where it fits these inputs
        out = native.apply(x_seq, q_threshold, native.index, raw_stream(native.device_index))
        if out is not None:
            return out, None, plan
    block_map = block_map_of(plan.map_shapes, x_seq) if with_block_map and plan.map_shapes is not None else None
    return STBIFFunction.apply(x_seq, q_threshold, plan, block_map), block_map, plan


# Eager calls: the checks and the backend choice made once per kind of call (every input's
# properties but values), kept as the Triton Plan to launch with, or None for the reference.
_ROUTES: dict[tuple, Plan | None] = {}
_MAX_ROUTES = 4096
_NEW = object()


def _new_route(
    key: tuple, x_seq: Tensor, q_threshold: Tensor, pos_max: int, neg_min: int, surrogate: str, backend: str
) -> Plan | None:
    check_sequence(x_seq)
    check_threshold(q_threshold, x_seq)
    check_bounds(pos_max, neg_min)
    get_surrogate(surrogate)
    kind = _resolve_backend(backend, x_seq.device)
    plan = get_plan(x_seq, pos_max, neg_min, surrogate) if kind == "triton" else None
    if len(_ROUTES) >= _MAX_ROUTES:
        _ROUTES.clear()
    _ROUTES[key] = plan
    return plan


def _run_traced(
    x_seq: Tensor, q_threshold: float | Tensor, pos_max: int, neg_min: int, surrogate: str, backend: str
) -> Tensor:
    """`_run` under torch.compile (no block map): the checks, traced once per graph, and the custom op."""
    check_sequence(x_seq)
    check_threshold(q_threshold, x_seq)
    check_bounds(pos_max, neg_min)
    get_surrogate(surrogate)
    kind = _resolve_backend(backend, x_seq.device)
    if not isinstance(q_threshold, Tensor):
        q_threshold = torch.full((), float(q_threshold), device=x_seq.device)
    return _BACKENDS[kind](x_seq, q_threshold, pos_max, neg_min, surrogate)


class STBIFNeuron(nn.Module):
    """Multi-step ST-BIF neuron for `[T, B, ...]` input, a drop-in for a spikingjelly neuron.

    Every forward runs the whole sequence from the initial state, so the module keeps no
    state between calls: `spikingjelly.activation_based.functional.reset_net` has nothing
    to reset here and skips it (no `reset` method, no warning).
    """

    def __init__(
        self,
        q_threshold: float = 1.0,
        level: int = 8,
        sym: bool = True,
        learn_threshold: bool = False,
        surrogate: str = "sigmoid",
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_threshold_value(q_threshold)
        get_surrogate(surrogate)
        _check_backend(backend)
        self.pos_max, self.neg_min = level_bounds(level, sym)
        self.level, self.sym = level, sym
        self.surrogate, self.backend = surrogate, backend
        # (bounds, surrogate, backend) and the NativeSpec (kernels/native) of the last call, where it had one
        self._native: tuple[tuple, NativeSpec] | None = None
        threshold = torch.tensor(float(q_threshold))
        if learn_threshold:
            self.q_threshold = nn.Parameter(threshold)
        else:
            self.register_buffer("q_threshold", threshold)

    def forward(self, x_seq: Tensor) -> Tensor:
        config = (self.pos_max, self.neg_min, self.surrogate, self.backend)
        if torch.compiler.is_compiling():
            return _run(x_seq, self.q_threshold, *config, False)[0]
        native = self._native
        # The last call's C++ node first: it checks in C++ that x_seq and θ are of the kind it was made for.
        if native is not None and native[0] == config:
            try:
                spec = native[1]
                out = spec.apply(x_seq, self.q_threshold, spec.index, raw_stream(spec.device_index))
            except TypeError:  # x_seq is not a tensor: _run says so
                out = None
            if out is not None:
                return out
        out, _, plan = _run(x_seq, self.q_threshold, *config, False)
        native = None if plan is None else plan.native
        self._native = (config, native) if native else None
        return out

    def forward_with_block_map(self, x_seq: Tensor) -> tuple[Tensor, BlockMap | None]:
        """`forward` and the block map of its output (`st_bif_multistep_with_block_map`)."""
        return _run(x_seq, self.q_threshold, self.pos_max, self.neg_min, self.surrogate, self.backend, True)[:2]

    def __getstate__(self) -> dict:
        # The C++ node's spec belongs to this process: copies and pickles find theirs on their first call.
        return {**super().__getstate__(), "_native": None}

    def extra_repr(self) -> str:
        learn = isinstance(self.q_threshold, nn.Parameter)
        return (
            f"level={self.level}, sym={self.sym}, pos_max={self.pos_max}, "
            f"neg_min={self.neg_min}, learn_threshold={learn}, surrogate={self.surrogate!r}, "
            f"backend={self.backend!r}"
        )
