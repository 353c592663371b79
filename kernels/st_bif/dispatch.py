"""The ST-BIF functions, and the route each call takes: the C++ node, the Triton kernels' autograd.Function, or the
torch reference.

"auto" runs the Triton kernels on CUDA and the reference elsewhere (kernels/backend.py). Eager calls check their
inputs and pick the route once per kind of call (shapes, strides, dtypes, devices, bounds, surrogate, backend);
under torch.compile the checks are traced and the custom op runs.
"""
import torch
from torch import Tensor

from kernels.backend import use_triton
from kernels.block_map import BlockMap
from kernels.memory_order import in_storage_order, storage_order
from kernels.native.spec import raw_stream

from .function import STBIFFunction, st_bif_triton
from .plan import Plan, block_map_of, get_plan
from .reference import st_bif_reference
from .surrogates import get_surrogate
from .validation import check_bounds, check_sequence, check_threshold


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
    return run(x_seq, q_threshold, pos_max, neg_min, surrogate, backend, with_block_map=False)[0]


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
    return run(x_seq, q_threshold, pos_max, neg_min, surrogate, backend, with_block_map=True)[:2]


def _st_bif_torch(
    x_seq: Tensor, q_threshold: Tensor, pos_max: int, neg_min: int, surrogate: str
) -> Tensor:
    return st_bif_reference(x_seq, q_threshold, pos_max, neg_min, get_surrogate(surrogate))[0]


def _use_triton(backend: str, device: torch.device) -> bool:
    # No `problem`: the Triton path's Plan checks dtypes itself, so "auto" on CUDA refuses float64 as "triton" does.
    return use_triton(backend, "st_bif", device, None)


def run(
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
            run_in_order = lambda x: run(x, q_threshold, pos_max, neg_min, surrogate, backend, False)[0]  # noqa: E731
            return in_storage_order(run_in_order, x_seq, order), None, None
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
    plan = get_plan(x_seq, pos_max, neg_min, surrogate) if _use_triton(backend, x_seq.device) else None
    if len(_ROUTES) >= _MAX_ROUTES:
        _ROUTES.clear()
    _ROUTES[key] = plan
    return plan


def _run_traced(
    x_seq: Tensor, q_threshold: float | Tensor, pos_max: int, neg_min: int, surrogate: str, backend: str
) -> Tensor:
    """`run` under torch.compile (no block map): the checks, traced once per graph, and the custom op."""
    check_sequence(x_seq)
    check_threshold(q_threshold, x_seq)
    check_bounds(pos_max, neg_min)
    get_surrogate(surrogate)
    triton = _use_triton(backend, x_seq.device)
    if not isinstance(q_threshold, Tensor):
        q_threshold = torch.full((), float(q_threshold), device=x_seq.device)
    if triton:
        return st_bif_triton(x_seq, q_threshold, pos_max, neg_min, surrogate)
    return _st_bif_torch(x_seq, q_threshold, pos_max, neg_min, surrogate)
