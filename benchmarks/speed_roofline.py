"""Speed case roofline: the retrain step's least bytes per kernel class against its GPU time, as a share of HBM.

    python benchmarks/speed.py --case roofline                # DARTS_V2 20×36, batch 1,024, fp16, channels_last
    python benchmarks/speed.py --case roofline --genotype DARTS_V2_SPIKE_NATIVE --hbm-gbps 3350
    python benchmarks/speed.py --case roofline --tiny         # CPU smoke run (no rows)

Why: every kernel class of the step (convs at DARTS's widths, batch norms, the quantizer, pools, sums, copies) is
memory-bound, so the least bytes a class must move, read at the HBM bandwidth, is its floor. Its measured time against
that floor says where the step's headroom is, before choosing what to fuse or remove.

The case is ``retrain_step --profile`` on one row (``--rows``, default 1024:fp16:cl; any retrain_step option works):
the row's step is timed (a CUDA graph replay), one eager step is profiled (GPU time per kernel class of
speed_retrain_step.KERNEL_CLASSES) and one more eager step is recorded layer by layer (``record_step``). The table
has, per class and for the whole step: the least bytes, their time at HBM bandwidth, the measured time, the bandwidth
the least bytes were moved at and its share of HBM (H100 SXM, H200, ...: by the GPU's name; ``--hbm-gbps``
overrides). Its lines become result rows of case "roofline".

The byte model (``call_bytes``, ``optimizer_bytes``): one training step (forward, backward, optimizer step), every
tensor at the dtype the step made it in (autocast), a gradient at its tensor's dtype and size.

- A layer (conv, linear, batch norm, quantizer, spiking neuron) reads its input and its weights and writes its output
  in the forward; its backward reads the output's gradient, its input and its weights and writes the input's gradient
  (none where the input needs none, e.g. the image) and the weights' gradients. Each tensor once per pass: any second
  pass (batch norm's statistics, then its normalization) is headroom.
- An average pool reads its input and writes its output; its backward reads the output's gradient and writes the
  input's. A max pool also writes its argmax (a byte per output: the window has fewer than 256 pixels) and its
  backward reads that instead of the input.
- A node's sum reads its two terms and writes the node. Its backward reads the node's gradient and writes the gradient
  of each term scaled by drop-path; an unscaled term shares the node's gradient (nothing to write, and nothing moves
  when neither term is scaled).
- A tensor read by k > 1 layers gets k gradients. The least is that each one after the first is added to the running
  sum by the kernel that makes it: k − 1 reads of the running sum (its writes are that kernel's input gradient).
- The optimizer reads every gradient once for the norm that clips it, and SGD with momentum reads weight, gradient and
  momentum and writes weight and momentum (without momentum: reads two, writes one). fp16's loss-scale check and
  unscaling fit in those passes.
- Copies and layout changes, and reductions outside the layers above, have no floor: they could all be avoided.
  The loss and the batch norms' running statistics (a few values per channel) are left out.
"""
from __future__ import annotations

import collections
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rows import Measurement
from search_space.errors import UserInputError

# Each GPU's HBM bandwidth in GB/s (the vendor's data sheets), by a part of its name; the first match wins.
HBM_GBPS = (("H200", 4800.0), ("H100 PCIe", 2000.0), ("H100 NVL", 3900.0), ("H100", 3350.0))
# A CPU smoke run's stand-in for the HBM bandwidth: its table only shows that every code path runs.
CPU_SMOKE_GBPS = 100.0
DEFAULT_ROW = "1024:fp16:cl"
TINY_ROW = "4:fp32:cl"

# The byte model's layer kinds and the kernel class (speed_retrain_step.KERNEL_CLASSES) their kernels fall in.
KIND_CLASSES = {
    "conv": "conv",  # nn.Linear too: its GEMM kernels are in the conv class
    "batch norm": "batch norm",
    "quantizer": "quantizer / neuron",
    "neuron": "quantizer / neuron",
    "average pool": "pool",
    "max pool": "pool",
    "node sum": "elementwise",
    "gradient sum": "elementwise",
}
WEIGHTED_KINDS = ("conv", "batch norm", "quantizer", "neuron")


@dataclass(frozen=True)
class LayerCall:
    """One layer's call in the recorded step: what the byte model needs of its tensors (bytes at their dtypes)."""

    kind: str                      # a key of KIND_CLASSES
    input_bytes: int = 0           # node sum: both terms; gradient sum: the extra gradients added to a running sum
    output_bytes: int = 0
    weight_bytes: int = 0          # its trainable parameters
    input_needs_grad: bool = True  # False: no input gradient to write (the image)
    output_elements: int = 0       # max pool: its argmax has one byte per output element
    scaled_terms: int = 0          # node sum: terms scaled by drop-path (0, 1 or 2)


def call_bytes(call: LayerCall) -> tuple[int, int]:
    """The least (forward, backward) bytes of one call, by the rules of the module docstring."""
    x, y, w = call.input_bytes, call.output_bytes, call.weight_bytes
    grad_x = x if call.input_needs_grad else 0
    if call.kind in WEIGHTED_KINDS:
        return x + w + y, y + x + w + grad_x + w
    if call.kind == "average pool":
        return x + y, y + grad_x
    if call.kind == "max pool":
        argmax = call.output_elements
        return x + y + argmax, y + argmax + grad_x
    if call.kind == "node sum":
        return x + y, y * (1 + call.scaled_terms) if call.scaled_terms else 0
    if call.kind == "gradient sum":
        return 0, x
    raise ValueError(f"no byte rule for layer kind {call.kind!r}; expected one of {', '.join(KIND_CLASSES)}")


def optimizer_bytes(parameter_bytes: int, *, momentum: bool, clipped: bool) -> int:
    """The least bytes of the gradient-norm clipping and the SGD step over ``parameter_bytes`` of weights."""
    passes = (3 + 2) if momentum else (2 + 1)
    return parameter_bytes * (passes + int(clipped))


def minimum_bytes(calls: Iterable[LayerCall], optimizer: int = 0) -> dict[str, int]:
    """The least bytes of one training step per kernel class: the calls' forward and backward, and the optimizer's."""
    by_class: dict[str, int] = collections.Counter()
    for call in calls:
        by_class[KIND_CLASSES[call.kind]] += sum(call_bytes(call))
    if optimizer:
        by_class["optimizer"] += optimizer
    return dict(by_class)


def hbm_gbps(device_name: str, override: float | None = None) -> float:
    """The HBM bandwidth (GB/s) of the GPU named ``device_name`` (torch.cuda.get_device_name), or ``override``."""
    if override is not None:
        if not override > 0:
            raise UserInputError(f"--hbm-gbps {override}: pass the GPU's HBM bandwidth in GB/s, e.g. 3350")
        return float(override)
    for part, gbps in HBM_GBPS:
        if part in device_name:
            return gbps
    raise UserInputError(f"no HBM bandwidth is known for {device_name!r}: pass --hbm-gbps <GB/s>")


# ---------------------------------------------------------------- recording a step's tensors
def _nbytes(value: Any) -> int:
    import torch

    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _leaf_kinds() -> tuple:
    from torch import nn

    from search_space.neurons import QuantizedActivation, SpikingNeuron

    return ((nn.Conv2d, "conv"), (nn.Linear, "conv"), (nn.modules.batchnorm._BatchNorm, "batch norm"),
            (QuantizedActivation, "quantizer"), (SpikingNeuron, "neuron"), (nn.MaxPool2d, "max pool"),
            (nn.AvgPool2d, "average pool"), (nn.AdaptiveAvgPool2d, "average pool"))


def _gradient_sums(roots: list) -> list[LayerCall]:
    """The sums of gradients in the autograd graph below ``roots``: a (node, input) pair fed by k > 1 edges is a
    tensor read k times, whose k gradients are added there. A node's input shapes and dtypes are read from its
    ``_input_metadata`` (private in PyTorch; no public attribute has them before its backward runs)."""
    fan_in: dict[tuple[int, int], int] = collections.Counter()
    nodes = {id(root): root for root in roots}
    stack = list(roots)
    while stack:
        node = stack.pop()
        for child, input_nr in node.next_functions:
            if child is None:
                continue
            fan_in[(id(child), input_nr)] += 1
            if id(child) not in nodes:
                nodes[id(child)] = child
                stack.append(child)
    sums = []
    for (node_id, input_nr), count in fan_in.items():
        if count > 1:
            metadata = nodes[node_id]._input_metadata[input_nr]
            size = math.prod(metadata.shape) * metadata.dtype.itemsize
            sums.append(LayerCall("gradient sum", input_bytes=(count - 1) * size))
    return sums


def record_step(network, step: Callable[[], Any]) -> list[LayerCall]:
    """Runs ``step()`` (one training step of ``network``: a single forward, backward, optimizer step) and returns
    its layer calls for the byte model: each leaf layer's tensors, each DARTS cell node's sum (its two edges'
    outputs, and how many drop-path scaled) and each sum of gradients of a tensor read more than once (from the
    autograd graph below the network's outputs)."""
    import torch
    from torch import nn

    from search_space.cell import Cell

    calls: list[LayerCall] = []
    handles: list = []

    def on_leaf(kind: str):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            x = args[0]
            calls.append(LayerCall(
                kind, _nbytes(x), _nbytes(output), sum(_nbytes(p) for p in module.parameters() if p.requires_grad),
                isinstance(x, torch.Tensor) and x.requires_grad,
                output.numel() if kind == "max pool" else 0))
        return hook

    def on_cell(cell: Cell) -> None:
        edges: list[tuple[nn.Module, int]] = []
        for op in cell._ops:
            handles.append(op.register_forward_hook(lambda module, args, out: edges.append((module, _nbytes(out)))))

        def hook(module: Cell, args: tuple, output: Any) -> None:
            drop_prob = args[2]  # Cell.forward(s0, s1, drop_prob), called positionally
            drawn = module.training and (isinstance(drop_prob, torch.Tensor) or drop_prob > 0)
            for (op_a, bytes_a), (op_b, bytes_b) in zip(edges[::2], edges[1::2]):
                scaled = sum(drawn and not isinstance(op, nn.Identity) for op in (op_a, op_b))
                calls.append(LayerCall("node sum", bytes_a + bytes_b, bytes_a, scaled_terms=scaled))
            edges.clear()

        handles.append(cell.register_forward_hook(hook))

    def on_output(module: nn.Module, args: tuple, output: Any) -> None:
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        calls.extend(_gradient_sums([t.grad_fn for t in outputs
                                     if isinstance(t, torch.Tensor) and t.grad_fn is not None]))

    kinds = _leaf_kinds()
    for module in network.modules():
        kind = next((name for cls, name in kinds if isinstance(module, cls)), None)
        if kind is not None:
            handles.append(module.register_forward_hook(on_leaf(kind)))
        if isinstance(module, Cell):
            on_cell(module)
    handles.append(network.register_forward_hook(on_output))
    try:
        step()
    finally:
        for handle in handles:
            handle.remove()
    return calls


# ---------------------------------------------------------------- the table
@dataclass(frozen=True)
class RooflineLine:
    """A kernel class (or the whole step): its least bytes per step and the time it took."""

    name: str
    least_bytes: int
    seconds: float
    kernels: int | None = None

    def floor_seconds(self, gbps: float) -> float:
        return self.least_bytes / (gbps * 1e9)

    def achieved_gbps(self) -> float | None:
        return self.least_bytes / self.seconds / 1e9 if self.seconds > 0 else None

    def share_of_hbm(self, gbps: float) -> float | None:
        achieved = self.achieved_gbps()
        return None if achieved is None else 100 * achieved / gbps


def roofline_lines(least_bytes: dict[str, int], seconds: dict[str, float], kernels: dict[str, int],
                   classes: Iterable[str], step_seconds: dict[str, float]) -> list[RooflineLine]:
    """One line per kernel class that moved bytes or took time (in ``classes``' order), then one per way of timing
    the whole step (``step_seconds``: name → seconds per step), each with all the classes' least bytes."""
    lines = [RooflineLine(name, least_bytes.get(name, 0), seconds.get(name, 0.0), kernels.get(name, 0))
             for name in classes if least_bytes.get(name, 0) or seconds.get(name, 0.0)]
    total = sum(least_bytes.values())
    return lines + [RooflineLine(name, total, step) for name, step in step_seconds.items()]


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def print_roofline(lines: list[RooflineLine], gbps: float, title: str) -> None:
    print(f"\n{title}; HBM {gbps:,.0f} GB/s")
    print("| kernel class | least bytes (GB) | at HBM (ms) | measured (ms) | achieved GB/s | % of HBM | "
          "headroom (ms) | kernels |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for line in lines:
        floor, measured = line.floor_seconds(gbps) * 1e3, line.seconds * 1e3
        print(f"| {line.name} | {line.least_bytes / 1e9:.3f} | {floor:.2f} | {measured:.2f} | "
              f"{_fmt(line.achieved_gbps(), ',.0f')} | {_fmt(line.share_of_hbm(gbps), '.1f')} | "
              f"{measured - floor:.2f} | {'' if line.kernels is None else line.kernels} |")


def measurements(lines: list[RooflineLine], gbps: float, what: str, note: str) -> list[Measurement]:
    """Each line's least bytes, measured time, achieved bandwidth and share of HBM as result rows."""
    rows = []
    for line in lines:
        name = f"{what}: {line.name}"
        rows += [Measurement("roofline", f"{name}: least bytes", round(line.least_bytes / 1e9, 3), "GB", note),
                 Measurement("roofline", f"{name}: time", round(line.seconds * 1e3, 2), "ms", note)]
        if line.least_bytes and line.seconds > 0:
            rows += [Measurement("roofline", f"{name}: achieved bandwidth", round(line.achieved_gbps()), "GB/s",
                                 note),
                     Measurement("roofline", f"{name}: share of HBM bandwidth", round(line.share_of_hbm(gbps), 1),
                                 "%", note)]
    return rows


def main(argv: list[str] | None = None) -> list[Measurement]:
    """``retrain_step --profile`` on one row (the roofline comes with its profile)."""
    from benchmarks import speed_retrain_step

    argv = list(argv or [])
    chosen = any(arg == "--rows" or arg.startswith("--rows=") for arg in argv)
    rows = [] if chosen else ["--rows", TINY_ROW if "--tiny" in argv else DEFAULT_ROW]
    return speed_retrain_step.main(["--profile", *rows, *argv], prog="speed.py --case roofline")
