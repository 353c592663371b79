"""Crossover densities of the sparse path against cuDNN, measured once per call shape on the
running GPU and cached (in memory and in a small JSON file).

The sparse path's time is, to first order, linear in the fraction of the dense work it does
(`triton.work_fractions`), so two measurements (an all-zero and a dense input) give the line;
the crossover is where that line meets SAFETY x cuDNN's time on the same input. (A model, and
stated as one: a call between the two measured ends is predicted, not timed.)

Two crossovers per call: one for eager calls, costed with their host work (on a slow host the
sparse path's three launches can cost more than cuDNN's GPU time), and one for calls captured in
a CUDA graph, where only GPU time counts (replays do no host work).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import triton
import triton.testing

from kernels.sparse_conv.function import conv_geometry, sparse_conv2d_forward, sparse_conv2d_triton
from kernels.sparse_conv.prescan import block_activity, tile_activity
from kernels.sparse_conv.triton import sparse_conv_wgrad, sparse_depthwise_wgrad

logger = logging.getLogger(__name__)

# Part of every cache key: bump it when the kernels or the timings change, so that crossovers
# cached by an older version are measured again (2: the depthwise map timing with plane flags;
# 3: the channels_last packing reads whole channel rows).
CALIBRATION_VERSION = 3
SAFETY = 0.9  # the sparse path must be predicted this much faster than cuDNN to be taken
_BENCH_MS = dict(warmup=5, rep=25)
_GRAPH_BENCH_MS = dict(warmup=2, rep=10)  # graph replays vary little


@dataclass(frozen=True)
class Crossover:
    """Work fractions at or under which the sparse path beats cuDNN (negative: never): `forward`
    for eager calls, `graph_forward` for calls captured in a CUDA graph; and the times they come
    from (µs, medians; None: not timed, because that forward never wins)."""

    forward: float
    wgrad: float
    dense_us: float
    sparse_zero_us: float
    sparse_full_us: float | None = None
    dense_wgrad_us: float | None = None
    wgrad_zero_us: float | None = None
    wgrad_full_us: float | None = None
    graph_forward: float = -1.0  # a cache file from before graph timing: never under graphs
    graph_map_forward: float = -1.0  # captured, with the block map given (no prescan to pay)
    graph_dense_us: float | None = None
    graph_map_zero_us: float | None = None
    graph_map_full_us: float | None = None
    graph_sparse_zero_us: float | None = None
    graph_sparse_full_us: float | None = None


def _crossing(budget: float, at_zero: float, at_full: float) -> float:
    """Fraction f at which at_zero + f * (at_full - at_zero) reaches `budget`."""
    if at_full <= budget:
        return 1.0
    if at_zero >= budget:
        return -1.0
    return (budget - at_zero) / (at_full - at_zero)


def _timed_crossing(time_us: Callable[[str], float], line: str, budget: float, times: dict[str, float]) -> float:
    """The crossing of the line timed as `line`_zero and `line`_full with `budget`, the dense end
    not timed where the zero end does not beat the budget; the times go into `times`."""
    times[f"{line}_zero_us"] = zero = time_us(f"{line}_zero")
    if zero >= budget:
        return -1.0
    times[f"{line}_full_us"] = full = time_us(f"{line}_full")
    return _crossing(budget, zero, full)


def crossover_from_timings(time_us: Callable[[str], float]) -> Crossover:
    """The crossovers from timings asked for by name, in an order that stops early: a line's
    time on a dense input is not asked for when the sparse call on an all-zero input (its
    cheapest case) does not beat cuDNN. The captured forward is timed given the block map first,
    and with its own prescan only if that line can win (the prescan only adds to it). The weight
    gradient is timed only where the eager forward can win (its crossover then serves graphs
    too). On small layers, whose sparse call is bound by its host work, that saves most of the
    timings."""
    times = {"dense_us": time_us("dense")}
    forward = _timed_crossing(time_us, "sparse", SAFETY * times["dense_us"], times)
    times["graph_dense_us"] = time_us("graph_dense")
    graph_budget = SAFETY * times["graph_dense_us"]
    graph_map_forward = _timed_crossing(time_us, "graph_map", graph_budget, times)
    graph_forward = -1.0 if graph_map_forward < 0 else _timed_crossing(time_us, "graph_sparse", graph_budget, times)
    wgrad = -1.0
    if forward >= 0:
        times["dense_wgrad_us"] = time_us("dense_wgrad")
        wgrad = _timed_crossing(time_us, "wgrad", SAFETY * times["dense_wgrad_us"], times)
    return Crossover(forward=forward, wgrad=wgrad, graph_forward=graph_forward, graph_map_forward=graph_map_forward,
                     **times)


def _median_us(fn) -> float:
    return 1000.0 * triton.testing.do_bench(fn, return_mode="median", **_BENCH_MS)


def _back_to_back_us(fn, calls: int = 20, repeats: int = 5) -> float:
    """Per-call time of `calls` back-to-back calls between two events: max(host, GPU) per call,
    which is what a host-bound training step pays (do_bench's cache flush before every call
    hides the host work behind the GPU's flush)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        per_call.append(1000.0 * start.elapsed_time(end) / calls)
    return sorted(per_call)[repeats // 2]


def _graph_us(fn) -> float:
    """GPU time of fn: captured in a CUDA graph (warmed up first on the capturing side stream),
    then the replay's median (cold cache). capture_begin/end rather than torch.cuda.graph(),
    whose gc.collect() and empty_cache() on entry cost a running program (a search calibrating
    ~60 call shapes) minutes."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        graph.capture_begin()
        try:
            fn()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return 1000.0 * triton.testing.do_bench(graph.replay, return_mode="median", **_GRAPH_BENCH_MS)


def _cost_us(fn) -> float:
    """A call's cost: its GPU time from a cold cache or its back-to-back time, the larger."""
    return max(_median_us(fn), _back_to_back_us(fn))


def measure_crossover(
    x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int
) -> Crossover:
    """Time cuDNN and the sparse path on an all-zero and a dense input shaped like `x`.

    The forward is timed end to end, the way a caller pays for it (prescan, launches, host
    work), not as a sum of kernel times: on small layers the host work dominates, so both
    eager forwards are costed by `_cost_us` (cold-cache GPU time or back-to-back time, the
    larger), and the captured ones by `_graph_us` (GPU time)."""
    geometry = conv_geometry(x, weight, stride, padding, dilation, groups)
    weight = weight.detach()
    full, zero = torch.randn_like(x), torch.zeros_like(x)  # keep x's memory format
    wgrad = sparse_depthwise_wgrad if geometry.is_depthwise else sparse_conv_wgrad

    def conv(x_: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x_, weight, None, stride, padding, dilation, groups)

    def sparse(x_: torch.Tensor) -> torch.Tensor:
        return sparse_conv2d_triton(x_, weight, None, stride, padding, dilation, groups, False)[0]

    def sparse_wgrad(x_: torch.Tensor, grad_y: torch.Tensor) -> Callable[[], torch.Tensor]:
        active = tile_activity(block_activity(x_), geometry)[0]
        return lambda: wgrad(x_, grad_y, geometry, active, weight.dtype)

    @functools.cache  # made at the first weight-gradient timing, if any, and shared
    def output_grad() -> torch.Tensor:
        return torch.randn_like(conv(full))

    def time_us(name: str) -> float:
        if name == "dense":
            return _cost_us(lambda: conv(full))
        if name in ("sparse_zero", "sparse_full"):
            source = zero if name == "sparse_zero" else full
            return _cost_us(lambda: sparse(source))
        if name == "graph_dense":
            return _graph_us(lambda: conv(full))
        if name.startswith("graph_"):  # graph_map_zero, graph_map_full, graph_sparse_zero, graph_sparse_full
            source = zero if name.endswith("_zero") else full
            blocks = planes = None
            if name.startswith("graph_map"):  # the map as the ST-BIF kernel writes it: blocks and plane flags
                blocks = block_activity(source)
                planes = blocks.amax(dim=(1, 2))
            return _graph_us(lambda: sparse_conv2d_forward(source, weight, None, stride, padding, dilation, groups,
                                                           blocks, planes))
        grad_y = output_grad()
        if name == "dense_wgrad":
            return _median_us(lambda: torch.ops.aten.convolution_backward(
                grad_y, full, weight, None, stride, padding, dilation, False, [0, 0], groups, [False, True, False]))
        return _median_us(sparse_wgrad(zero if name == "wgrad_zero" else full, grad_y))

    return crossover_from_timings(time_us)


def default_cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "aso_se" / "sparse_conv_crossovers.json"


class CrossoverCache:
    """Crossovers by call key: looked up in memory, then in the JSON file, else measured (and
    written back). Keys name the GPU and the torch/triton versions, so a stale file is harmless."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._memory: dict[str, Crossover] | None = None

    def _load(self) -> dict[str, Crossover]:
        if self._memory is None:
            self._memory = {}
            if self.path is not None and self.path.exists():
                try:
                    stored = json.loads(self.path.read_text())
                    self._memory = {key: Crossover(**value) for key, value in stored.items()}
                except (ValueError, TypeError) as error:
                    logger.warning("ignoring unreadable sparse-conv calibration cache %s: %s", self.path, error)
        return self._memory

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({key: asdict(value) for key, value in self._load().items()}, indent=1)
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False) as tmp:
            tmp.write(payload)
        os.replace(tmp.name, self.path)

    def get(self, key: str) -> Crossover | None:
        return self._load().get(key)

    def measure(
        self, key: str, x: torch.Tensor, weight: torch.Tensor,
        stride: list[int], padding: list[int], dilation: list[int], groups: int,
    ) -> Crossover:
        crossover = measure_crossover(x, weight, stride, padding, dilation, groups)
        self._load()[key] = crossover
        self._save()
        logger.debug("sparse_conv calibrated %s: sparse forward up to %.3f of the work (%.3f in CUDA graphs), "
                     "sparse wgrad up to %.3f", key, crossover.forward, crossover.graph_forward, crossover.wgrad)
        return crossover


def call_key(
    x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int
) -> str:
    """What a crossover depends on: our kernels' version, GPU, library versions, dtype, layout,
    shapes and conv parameters."""
    layout = "channels_last" if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() else "nchw"
    device = torch.cuda.get_device_name(x.device) if x.is_cuda else str(x.device)
    return "|".join(map(str, (
        f"v{CALIBRATION_VERSION}", device, torch.__version__, triton.__version__, x.dtype, layout, tuple(x.shape),
        tuple(weight.shape),
        tuple(stride), tuple(padding), tuple(dilation), groups,
    )))
