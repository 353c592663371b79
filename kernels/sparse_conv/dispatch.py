"""`sparse_conv2d`: validates a call and runs it on its backend.

Backends (kernels/backend.py, and "reference"): "torch" (F.conv2d, i.e. cuDNN on CUDA; ``dense.dense_conv2d``),
"triton" (the sparse kernels, forward and weight gradient; under TRITON_INTERPRET=1 also on CPU tensors),
"reference" (the readable torch two-stage algorithm), and "auto": F.conv2d for eager calls, whose host work alone
costs more than cuDNN's GPU time, and the sparse kernels for a call captured in a CUDA graph where its shape's
crossover (calibration.py) says they win at the density its call site measured before. Eager calls inside
`capture_warmup()` calibrate their shape and measure that density; other eager calls do not
calibrate (but the first after a capture that found its shape uncalibrated). Unsupported calls
(channels_last input among them) take the dense path on every backend; under torch.compile "auto" is F.conv2d
(its decisions read timings and densities back at run time, which Dynamo cannot trace; "triton" compiles the sparse
kernels). Every eager call counts its path in
`PATH_COUNTS`; what "auto" remembers between calls is `STATE`.
"""
from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from kernels.backend import BACKENDS, check_backend
from kernels.block_map import BlockMap
from kernels.sparse_conv.calibration import Crossover, CrossoverCache, call_key, default_cache_file
from kernels.sparse_conv.dense import dense_conv2d
from kernels.sparse_conv.density import DensityTracker, work_fractions
from kernels.sparse_conv.function import conv_geometry, sparse_conv2d_forward, sparse_conv2d_triton
from kernels.sparse_conv.geometry import BLOCK, ConvGeometry, cdiv
from kernels.sparse_conv.prescan import block_activity
from kernels.sparse_conv.reference import sparse_conv2d_reference
from kernels.sparse_conv.triton import interpreted

IntPair = int | tuple[int, int] | list[int]
# Outside a warm-up, the eager calls of a site that can win when captured measure its density this
# rarely: a measurement costs a prescan.
EAGER_SAMPLE_EVERY = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DENSE_KERNELS, DEPTHWISE_KERNELS, STRIDES, DILATIONS = (1, 3, 5), (3, 5), (1, 2), (1, 2)
SPARSE_CONV_BACKENDS = (*BACKENDS, "reference")


class PathCounts:
    """How many calls took each path ("sparse", "reference", "dense:<why>"; "probe" and "sparse_wgrad" count
    density measurements and sparse weight gradients), since the last `snapshot_and_reset`: what a monitor logs."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter()

    def count(self, path: str, calls: int = 1) -> None:
        if torch.compiler.is_compiling():  # traced, the count would guard the graph on it: a recompile per call
            return
        self._counts[path] += calls

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)

    def reset(self) -> None:
        self._counts.clear()

    def snapshot_and_reset(self) -> dict[str, int]:
        """The counts so far, then zero: one reading per logging period."""
        counts = dict(self._counts)
        self._counts.clear()
        return counts


PATH_COUNTS = PathCounts()


def path_counts() -> dict[str, int]:
    """`PATH_COUNTS.snapshot()`, for callers written before `PATH_COUNTS`."""
    return PATH_COUNTS.snapshot()


def reset_path_counts() -> None:
    """`PATH_COUNTS.reset()`, for callers written before `PATH_COUNTS`."""
    PATH_COUNTS.reset()


class DispatchState:
    """What "auto" remembers between calls: plans per call signature, the crossover cache, density trackers
    shared by calls without a tracker of their own, and the open `capture_warmup` and `dense_captures` contexts.

    `crossovers` (a CrossoverCache; None: the default file's) is made on first use, so importing the package
    touches no path on disk.
    """

    def __init__(self, crossovers: CrossoverCache | None = None) -> None:
        self._crossovers = crossovers
        self.plans: dict[tuple, _Plan] = {}
        self.shared_trackers: dict[str, DensityTracker] = collections.defaultdict(DensityTracker)
        # Signatures captured before their shape was calibrated (a capture cannot time): their next eager
        # call calibrates, so that a later capture can take the sparse path.
        self.captured_uncalibrated: set[tuple] = set()
        self.warmups = 0  # open capture_warmup() contexts
        self.dense_captures = False  # inside dense_captures()

    @property
    def crossovers(self) -> CrossoverCache:
        if self._crossovers is None:
            self._crossovers = CrossoverCache(default_cache_file())
        return self._crossovers


# The process's dispatcher state. Functions here read it at each call, so a test may swap in a fresh one.
STATE = DispatchState()


@contextlib.contextmanager
def capture_warmup() -> Iterator[None]:
    """Marks the eager calls inside as the warm-up of a CUDA-graph capture to come: "auto" calls
    calibrate their shape (once; cached on disk) and measure their input's density, so that the
    captured calls can take the sparse path. They still compute with cuDNN."""
    state = STATE
    state.warmups += 1
    try:
        yield
    finally:
        state.warmups -= 1


def warming_up() -> bool:
    """True inside `capture_warmup()`."""
    return STATE.warmups > 0


def on_gpu(x: torch.Tensor) -> bool:
    """Whether "auto" treats x as a CUDA tensor (CPU tests of the dispatcher replace it)."""
    return x.is_cuda


def capturing() -> bool:
    """Whether the current stream is capturing a CUDA graph (asked on CUDA calls only)."""
    return torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def dense_captures() -> Iterator[None]:
    """Calls captured inside take the path that eager calls take (cuDNN), so that a graph equals the
    eager op: the searched supernet's op graphs (aso_se.search.graphed_ops)."""
    state = STATE
    before = state.dense_captures
    state.dense_captures = True
    try:
        yield
    finally:
        state.dense_captures = before


def capturing_sparse() -> bool:
    """Whether a call now is captured with the sparse path open to it (`capturing`, outside `dense_captures`)."""
    return not STATE.dense_captures and capturing()


@dataclass(frozen=True)
class ConvCall:
    """One call's arguments, normalized (pairs as lists)."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    groups: int
    tracker: DensityTracker | None
    block_map: torch.Tensor | None = None  # written by the ST-BIF kernel that made x, if any
    plane_map: torch.Tensor | None = None  # its plane flags, if given with it

    @property
    def geometry(self) -> ConvGeometry:
        return conv_geometry(self.x, self.weight, self.stride, self.padding, self.dilation, self.groups)

    @property
    def needs_weight_grad(self) -> bool:
        return torch.is_grad_enabled() and self.weight.requires_grad

    @property
    def needs_autograd(self) -> bool:
        tensors = (self.x, self.weight, self.bias)
        return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _pair(value: IntPair, name: str) -> list[int]:
    pair = [value, value] if isinstance(value, int) else list(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise ValueError(f"sparse_conv2d: {name} must be an int or a pair of ints, got {value!r}")
    return pair


def _autocast(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """Inside torch.autocast, cast like aten::conv2d does (all to the autocast dtype), so that
    SparseConv2d stays a drop-in for nn.Conv2d; gradients flow back through the casts."""
    if not torch.is_autocast_enabled(x.device.type):
        return x, weight, bias
    dtype = torch.get_autocast_dtype(x.device.type)
    return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


def _split_block_map(x: torch.Tensor, block_map: BlockMap | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(blocks, plane flags or None) of a given map, both checked against x."""
    blocks, planes = block_map if isinstance(block_map, BlockMap) else (block_map, None)
    batch, channels, height, width = x.shape
    for name, tensor, expected in (("block_map", blocks, (batch, cdiv(height, BLOCK), cdiv(width, BLOCK), channels)),
                                   ("block_map.planes", planes, (batch, channels))):
        if tensor is not None and (not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int8
                                   or tensor.device != x.device or tuple(tensor.shape) != expected):
            got = (f"{tensor.dtype} {list(tensor.shape)} on {tensor.device}" if isinstance(tensor, torch.Tensor)
                   else type(tensor).__name__)
            raise ValueError(f"sparse_conv2d: {name} must be int8 {list(expected)} on {x.device} for an input of "
                             f"shape {list(x.shape)}, got {got}; pass the map that st_bif_multistep_with_block_map "
                             "returned with this input, or block_map=None")
    return blocks, planes


def _validate(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, groups: int) -> None:
    if x.dim() != 4 or weight.dim() != 4:
        raise ValueError(f"sparse_conv2d: expected a 4-D input [N, C, H, W] and a 4-D weight, got input "
                         f"{tuple(x.shape)} and weight {tuple(weight.shape)}; "
                         "flatten [T, B, C, H, W] to [T*B, C, H, W]")
    for name, tensor in (("weight", weight), ("bias", bias)):
        if tensor is not None and (tensor.dtype != x.dtype or tensor.device != x.device):
            raise ValueError(f"sparse_conv2d: {name} is {tensor.dtype} on {tensor.device} but the input is "
                             f"{x.dtype} on {x.device}; move/cast them to the same dtype and device")
    if x.shape[1] != weight.shape[1] * groups:
        raise ValueError(f"sparse_conv2d: the input has {x.shape[1]} channels, the weight {tuple(weight.shape)} "
                         f"with groups={groups} expects {weight.shape[1] * groups}")


def channels_innermost(x: torch.Tensor) -> bool:
    """True where a pixel's channels lie together in memory (channels_last): the sparse kernels,
    which read planes, lose to cuDNN there."""
    return x.shape[1] > 1 and x.stride(1) < x.stride(3)


def unsupported_reason(call: ConvCall) -> str | None:
    """Why the Triton kernels do not take this call (None if they do)."""
    x, weight = call.x, call.weight
    out_channels, _, kernel_h, kernel_w = weight.shape
    depthwise = call.groups == x.shape[1] == out_channels and call.groups > 1
    kernels = DEPTHWISE_KERNELS if depthwise else DENSE_KERNELS
    if x.dtype not in SUPPORTED_DTYPES:
        return f"dtype {x.dtype}"
    if call.groups != 1 and not depthwise:
        return f"groups={call.groups} (supported: 1, or depthwise with C_out = C_in)"
    if kernel_h not in kernels or kernel_w not in kernels:
        return f"kernel {kernel_h}x{kernel_w} (supported: {kernels})"
    if any(s not in STRIDES for s in call.stride) or any(d not in DILATIONS for d in call.dilation):
        return f"stride {call.stride} / dilation {call.dilation} (supported: {STRIDES} / {DILATIONS})"
    if channels_innermost(x):
        return "channels_last layout (the sparse kernels read planar layouts such as NCHW)"
    if x.numel() == 0 or call.geometry.rows.out_size <= 0 or call.geometry.cols.out_size <= 0:
        return "empty input or output"
    return None


def _dense(call: ConvCall, path: str) -> torch.Tensor:
    PATH_COUNTS.count(path)
    return dense_conv2d(call.x, call.weight, call.bias, call.stride, call.padding, call.dilation, call.groups)


def _sparse(call: ConvCall, sparse_wgrad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, block map) from the Triton kernels; without autograd (and outside torch.compile) the
    custom op's dispatch is skipped: on small layers the host time is what a call costs."""
    PATH_COUNTS.count("sparse")
    PATH_COUNTS.count("sparse_wgrad", int(sparse_wgrad and call.needs_weight_grad))
    args = (call.x, call.weight, call.bias, call.stride, call.padding, call.dilation, call.groups)
    if call.needs_autograd or torch.compiler.is_compiling():
        return sparse_conv2d_triton(*args, sparse_wgrad, call.block_map, call.plane_map)
    return sparse_conv2d_forward(*args, call.block_map, call.plane_map)


def _run_torch(call: ConvCall) -> torch.Tensor:
    return _dense(call, "dense:requested")


def _run_reference(call: ConvCall) -> torch.Tensor:
    if unsupported_reason(call) is not None:
        return _dense(call, "dense:unsupported")
    PATH_COUNTS.count("reference")
    return sparse_conv2d_reference(call.x, call.weight, call.bias, call.geometry)


def _run_triton(call: ConvCall) -> torch.Tensor:
    if not call.x.is_cuda and not interpreted():
        raise ValueError("sparse_conv2d: backend='triton' on CPU tensors needs Triton's interpreter; set "
                         "TRITON_INTERPRET=1 before triton is imported, or use a CUDA tensor")
    if unsupported_reason(call) is not None:
        return _dense(call, "dense:unsupported")
    return _sparse(call, sparse_wgrad=True)[0]


@dataclass(frozen=True)
class _Plan:
    """What "auto" does with one call signature on a GPU."""

    dense_path: str | None  # the counter of the cuDNN path every call takes (unsupported, never winning)
    key: str = ""
    geometry: ConvGeometry | None = None
    crossover: Crossover | None = None  # None: not calibrated yet


def _signature(call: ConvCall) -> tuple:
    x, weight = call.x, call.weight
    return (x.shape, x.stride(), x.dtype, x.device, weight.shape, *call.stride, *call.padding,
            *call.dilation, call.groups)


def _plan_of(key: str, geometry: ConvGeometry, crossover: Crossover | None) -> _Plan:
    never = crossover is not None and crossover.graph_map_forward < 0  # (graph_forward is timed only above 0)
    return _Plan("dense:never_wins" if never else None, key, geometry, crossover)


def _plan(state: DispatchState, call: ConvCall, signature: tuple) -> _Plan:
    """The call's plan, from the cache (a dict lookup) or made now, with the crossover of its shape
    if one was measured before (in memory or in the cache file). Never calibrates."""
    plan = state.plans.get(signature)
    if plan is None:
        if unsupported_reason(call) is not None:
            plan = _Plan("dense:unsupported")
        else:
            key = call_key(call.x, call.weight, call.stride, call.padding, call.dilation, call.groups)
            plan = _plan_of(key, call.geometry, state.crossovers.get(key))
        state.plans[signature] = plan
    return plan


def _calibrated(state: DispatchState, call: ConvCall, signature: tuple, plan: _Plan) -> _Plan:
    """`plan` with its shape's crossover measured now (the GPU runs timing loops for a while)."""
    crossover = state.crossovers.measure(plan.key, call.x, call.weight, call.stride, call.padding, call.dilation,
                                         call.groups)
    plan = state.plans[signature] = _plan_of(plan.key, plan.geometry, crossover)
    state.captured_uncalibrated.discard(signature)
    return plan


def _run_auto(call: ConvCall) -> torch.Tensor:
    if not on_gpu(call.x):
        return _dense(call, "dense:cpu")
    if torch.compiler.is_compiling():  # its plans rest on timings and densities read back at run time: untraceable
        return _dense(call, "dense:compiled")
    state = STATE
    signature = _signature(call)
    plan = _plan(state, call, signature)
    if plan.dense_path is not None:
        return _dense(call, plan.dense_path)
    tracker = call.tracker if call.tracker is not None else state.shared_trackers[plan.key]
    if capturing():
        if state.dense_captures:
            return _dense(call, "dense:eager")
        return _run_captured(state, call, signature, plan, tracker)
    warm_up = state.warmups > 0
    calibrating = plan.crossover is None and (warm_up or signature in state.captured_uncalibrated)
    if plan.crossover is None and not calibrating:
        return _dense(call, "dense:eager")  # it could not win: not worth a calibration
    if calibrating:
        plan = _calibrated(state, call, signature, plan)
        if plan.dense_path is not None:
            return _dense(call, plan.dense_path)
    tracker.poll()  # here, not in a capture: querying an event is not allowed there
    if tracker.sample_due(EAGER_SAMPLE_EVERY, now=calibrating or warm_up):
        PATH_COUNTS.count("probe")  # the density, for a capture to come
        blocks = call.block_map if call.block_map is not None else block_activity(call.x)
        tracker.record(work_fractions(call.x, blocks, plan.geometry))
    return _dense(call, "dense:eager")


def _run_captured(state: DispatchState, call: ConvCall, signature: tuple, plan: _Plan, tracker: DensityTracker
                  ) -> torch.Tensor:
    """A call being captured: the graph replays the path picked now, so the sparse one only at a
    density measured before, at which the crossover says it wins."""
    crossover = plan.crossover
    if crossover is None:
        state.captured_uncalibrated.add(signature)
        return _dense(call, "dense:uncalibrated")
    limit = crossover.graph_forward if call.block_map is None else crossover.graph_map_forward
    if limit < 0:
        return _dense(call, "dense:never_wins")
    if tracker.forward is None:
        return _dense(call, "dense:unmeasured")
    if tracker.forward > limit:
        return _dense(call, "dense:too_dense")
    sparse_wgrad = tracker.wgrad is not None and tracker.wgrad <= crossover.wgrad
    return _sparse(call, sparse_wgrad)[0]


def _known_plan(x: torch.Tensor, weight: torch.Tensor, stride: IntPair, padding: IntPair, dilation: IntPair,
                groups: int) -> tuple[tuple, _Plan | None]:
    """(signature, plan or None) of an "auto" call on a GPU, as `sparse_conv2d` would see it."""
    x, weight, _ = _autocast(x, weight, None)
    call = ConvCall(x, weight, None, _pair(stride, "stride"), _pair(padding, "padding"),
                    _pair(dilation, "dilation"), groups, None)
    signature = _signature(call)
    return signature, STATE.plans.get(signature)


def fixed_dense_path(
    x: torch.Tensor, weight: torch.Tensor, stride: IntPair, padding: IntPair, dilation: IntPair, groups: int,
    backend: str,
) -> tuple[str, bool] | None:
    """(counter, whether warm-up and captured calls differ) of the cuDNN path that every other
    eager call shaped like this (already dispatched) one takes, or None where the path depends on
    the call. SparseConv2d uses it to skip the dispatcher's per-call host work (as much as a small
    layer's GPU time) once a layer's route is fixed."""
    if backend == "torch":
        return "dense:requested", False
    if backend != "auto":
        return None
    if not on_gpu(x):
        return "dense:cpu", False
    signature, plan = _known_plan(x, weight, stride, padding, dilation, groups)
    if plan is None or signature in STATE.captured_uncalibrated:  # the next eager call calibrates
        return None
    if plan.dense_path is not None:
        return plan.dense_path, False
    return "dense:eager", True


def captured_call_wants_block_map(
    x: torch.Tensor, weight: torch.Tensor, stride: IntPair, padding: IntPair, dilation: IntPair, groups: int,
    tracker: DensityTracker,
) -> bool:
    """Whether an "auto" call shaped like this, captured now with x's block map and the density
    `tracker` measured, would take the sparse path (the neuron before it then writes the map)."""
    _, plan = _known_plan(x, weight, stride, padding, dilation, groups)
    if plan is None or plan.dense_path is not None or plan.crossover is None or tracker.forward is None:
        return False
    return tracker.forward <= plan.crossover.graph_map_forward


_RUNS: dict[str, Callable[[ConvCall], torch.Tensor]] = {
    "auto": _run_auto,
    "torch": _run_torch,
    "triton": _run_triton,
    "reference": _run_reference,
}


def sparse_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntPair = 1,
    padding: IntPair = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    *,
    backend: str = "auto",
    tracker: DensityTracker | None = None,
    block_map: BlockMap | torch.Tensor | None = None,
) -> torch.Tensor:
    """F.conv2d(x, weight, bias, stride, padding, dilation, groups), skipping all-zero input
    blocks where that is faster; the result does not depend on the backend (up to rounding).

    `tracker` keeps the sparsity measurements of one call site (a module passes its own);
    without it, calls of the same key share one. `block_map` is x's block map as the ST-BIF
    kernel wrote it (`kernels.st_bif.st_bif_multistep_with_block_map`, a `BlockMap`; or its
    blocks alone): the sparse path then skips its prescan. A wrong map gives wrong results; its
    shape, dtype and device are checked.
    """
    check_backend(backend, "sparse_conv2d", SPARSE_CONV_BACKENDS)
    if isinstance(padding, str):
        raise ValueError(f"sparse_conv2d: padding must be numeric, got {padding!r}; pass an int or a pair")
    x, weight, bias = _autocast(x, weight, bias)
    _validate(x, weight, bias, groups)
    blocks, planes = _split_block_map(x, block_map) if block_map is not None else (None, None)
    call = ConvCall(x, weight, bias, _pair(stride, "stride"), _pair(padding, "padding"),
                    _pair(dilation, "dilation"), groups, tracker, blocks, planes)
    return _RUNS[backend](call)
