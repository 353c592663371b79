"""Crossover densities of the sparse path against cuDNN for calls captured in a CUDA graph (the
only calls that can take it: eager ones pay host work far above cuDNN's), measured once per call
shape on the running GPU and cached in memory and in a small JSON file.

The sparse path's GPU time is, to first order, linear in the fraction of the dense work it does
(`density.work_fractions`), so an all-zero and a dense input give the line; the crossover is where
it meets SAFETY x cuDNN's time (a model: densities in between are predicted, not timed).
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

from kernels.sparse_conv.function import conv_geometry, sparse_conv2d_forward
from kernels.sparse_conv.prescan import block_activity, tile_activity
from kernels.sparse_conv.wgrad import sparse_conv_wgrad, sparse_depthwise_wgrad

logger = logging.getLogger(__name__)

# Part of every cache key: bump it when the kernels or the timings change, so that crossovers
# cached by an older version are measured again.
CALIBRATION_VERSION = 4
SAFETY = 0.9  # the sparse path must be predicted this much faster than cuDNN to be taken
_BENCH_MS = dict(warmup=5, rep=25)
_GRAPH_BENCH_MS = dict(warmup=2, rep=10)  # graph replays vary little


@dataclass(frozen=True)
class Crossover:
    """Work fractions at or under which the sparse path beats cuDNN (negative: never), for calls
    captured in a CUDA graph: `graph_forward` with its own prescan, `graph_map_forward` given the
    block map, `wgrad` the weight gradient; and the times they come from (µs, medians; None: not
    timed, because that line cannot win)."""

    graph_forward: float
    graph_map_forward: float
    wgrad: float
    graph_dense_us: float
    graph_map_zero_us: float
    graph_map_full_us: float | None = None
    graph_sparse_zero_us: float | None = None
    graph_sparse_full_us: float | None = None
    dense_wgrad_us: float | None = None
    wgrad_zero_us: float | None = None
    wgrad_full_us: float | None = None


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
    """The crossovers from timings asked for by name, in an order that stops early: a line's dense
    end is not timed where its all-zero end (its cheapest case) does not beat cuDNN. The forward
    given the block map comes first; with its own prescan (which only adds) it is timed only if
    that can win, and so is the weight gradient (which runs only after a sparse forward)."""
    times = {"graph_dense_us": time_us("graph_dense")}
    budget = SAFETY * times["graph_dense_us"]
    graph_map_forward = _timed_crossing(time_us, "graph_map", budget, times)
    graph_forward = wgrad = -1.0
    if graph_map_forward >= 0:
        graph_forward = _timed_crossing(time_us, "graph_sparse", budget, times)
        times["dense_wgrad_us"] = time_us("dense_wgrad")
        wgrad = _timed_crossing(time_us, "wgrad", SAFETY * times["dense_wgrad_us"], times)
    return Crossover(graph_forward=graph_forward, graph_map_forward=graph_map_forward, wgrad=wgrad, **times)


def _median_us(fn) -> float:
    return 1000.0 * triton.testing.do_bench(fn, return_mode="median", **_BENCH_MS)


def _graph_us(fn) -> float:
    """GPU time of fn: captured in a CUDA graph (warmed up first on the capturing side stream),
    then the replay's median (cold cache). capture_begin/end rather than torch.cuda.graph(), whose
    gc.collect() and empty_cache() on entry cost a program calibrating many shapes minutes."""
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


def measure_crossover(
    x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int
) -> Crossover:
    """Time cuDNN and the sparse path, each captured in a CUDA graph, on an all-zero and a dense
    input shaped like `x`; the weight gradients by their GPU time."""
    geometry = conv_geometry(x, weight, stride, padding, dilation, groups)
    weight = weight.detach()
    full, zero = torch.randn_like(x), torch.zeros_like(x)  # keep x's memory format
    wgrad = sparse_depthwise_wgrad if geometry.is_depthwise else sparse_conv_wgrad

    def conv(x_: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x_, weight, None, stride, padding, dilation, groups)

    def sparse_wgrad(x_: torch.Tensor, grad_y: torch.Tensor) -> Callable[[], torch.Tensor]:
        active = tile_activity(block_activity(x_), geometry)[0]
        return lambda: wgrad(x_, grad_y, geometry, active, weight.dtype)

    @functools.cache  # made at the first weight-gradient timing, if any, and shared
    def output_grad() -> torch.Tensor:
        return torch.randn_like(conv(full))

    def time_us(name: str) -> float:
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


def _crossover_or_none(value: object) -> Crossover | None:
    """A cached entry as a Crossover; None for one an older version wrote (other fields)."""
    try:
        return Crossover(**value)
    except TypeError:
        return None


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
                except ValueError as error:
                    stored = error
                if not isinstance(stored, dict):
                    logger.warning("ignoring unreadable sparse-conv calibration cache %s: %s", self.path, stored)
                    stored = {}
                self._memory = {key: crossover for key, value in stored.items()
                                if (crossover := _crossover_or_none(value)) is not None}
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
        logger.debug("sparse_conv calibrated %s: captured sparse forward up to %.3f of the work (%.3f given the "
                     "block map), sparse wgrad up to %.3f", key, crossover.graph_forward, crossover.graph_map_forward,
                     crossover.wgrad)
        return crossover


def call_key(
    x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int
) -> str:
    """What a crossover depends on: our kernels' version, GPU, library versions, dtype, shapes and
    conv parameters."""
    device = torch.cuda.get_device_name(x.device) if x.is_cuda else str(x.device)
    return "|".join(map(str, (
        f"v{CALIBRATION_VERSION}", device, torch.__version__, triton.__version__, x.dtype, tuple(x.shape),
        tuple(weight.shape), tuple(stride), tuple(padding), tuple(dilation), groups,
    )))
