"""A training step captured in a CUDA graph and replayed (train.py's ``cuda_graph=true``).

A retrain step of a small spiking network is host-bound: hundreds of kernel launches, each costing
more CPU time than GPU time. Captured once, the whole step (forward, backward, clipping, optimizer
step) is one graph launch, and the sparse convolutions inside it are priced by GPU time
(kernels/sparse_conv/dispatch.py), so they run wherever they win on the captured input.
The recipe is PyTorch's whole-network capture (torch.cuda.graphs docs); see :class:`GraphedTrainStep`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.sparse_conv import capture_warmup
from search_space.errors import UserInputError

StepFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class FlatGradients:
    """Every parameter's ``.grad`` a view of one flat buffer, averaged over the ranks in one all-reduce.

    Several GPUs with graphs: the forward and backward are replayed from one graph, the buffer is
    all-reduced (one NCCL call), and the clipping and optimizer step are replayed from a second graph.
    Zero the buffer with ``zero_()`` (never set the grads to None: the views would be lost).
    """

    def __init__(self, parameters: list[torch.nn.Parameter], world_size: int) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        self.world_size = world_size
        self.flat = torch.zeros(sum(p.numel() for p in self.parameters), device=self.parameters[0].device,
                                dtype=self.parameters[0].dtype)
        offset = 0
        for p in self.parameters:  # each view with its parameter's strides (channels_last weights)
            p.grad = self.flat.as_strided(p.shape, p.stride(), offset)
            offset += p.numel()

    def zero_(self) -> None:
        self.flat.zero_()

    def sum_over_ranks(self) -> None:
        """The sum over the ranks (the caller divides by ``world_size``, inside its graph)."""
        torch.distributed.all_reduce(self.flat)

    def average_(self) -> None:
        self.flat.div_(self.world_size)


def check_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Raises UserInputError for an optimizer whose step cannot be captured: LBFGS (it re-runs a
    closure) or one with ``capturable=False`` (Adam, AdamW, ...: their step reads counters on the host)."""
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.LBFGS):
        raise UserInputError("cuda_graph=true cannot capture LBFGS's step (it re-runs a closure); "
                             "use another optimizer or cuda_graph=false")
    if any(group.get("capturable") is False for group in optimizer.param_groups):
        raise UserInputError(f"cuda_graph=true needs a capturable optimizer, and {name} has capturable=False; "
                             f"set +optim.optimizer.capturable=true or cuda_graph=false")


class GraphedTrainStep:
    """``step(inputs, labels) -> (loss, correct)``, eager until captured, then replayed.

    ``warmup_steps`` eager steps on a side stream make the lazy state (optimizer buffers, cuBLAS
    workspaces, sparse-conv calibration); the next step is captured; every step trains on its batch.
    A batch of another shape (an epoch's last) runs eagerly. A replay returns the graph's static
    outputs: the next call overwrites them, so use them (on the device, stream-ordered) first.
    """

    def __init__(self, step_fn: StepFn, *, warmup_steps: int = 3, reduce: Callable[[], None] | None = None,
                 finish: Callable[[], None] | None = None) -> None:
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps={warmup_steps}: need at least one eager step before a capture")
        if (reduce is None) != (finish is None):
            raise ValueError("reduce and finish go together: the step is split around the reduction")
        self.step_fn = step_fn
        # Several GPUs: step_fn (forward, backward) and finish (clip, optimizer step) are two graphs and
        # reduce (the gradients' all-reduce) runs between their replays.
        self.reduce, self.finish = reduce, finish
        self.warmup_steps = warmup_steps
        self.captures = 0  # graphs captured so far (one per reset, in practice per epoch)
        self.replays = 0   # steps run by replaying a graph (the capture's own step included)
        self.eager_steps = 0
        self.reset()

    @staticmethod
    def eager_only(step_fn: StepFn, *, reduce: Callable[[], None], finish: Callable[[], None]) -> StepFn:
        """The split step run eagerly (no GPU, or graphs off): step_fn, reduce, finish."""
        def step(inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            loss, correct = step_fn(inputs, labels)
            reduce()
            finish()
            return loss, correct
        return step

    def reset(self) -> None:
        """Drop the graph: the next steps warm up and capture a new one. Call it when anything captured
        as a constant changes: the learning rate, the drop-path probability, the sparse convs' paths
        (the retrain loop calls it once per epoch, where all three change)."""
        self._graph: torch.cuda.CUDAGraph | None = None
        self._finish_graph: torch.cuda.CUDAGraph | None = None
        self._static: tuple[torch.Tensor, ...] = ()
        self._warm = 0
        self._shape_key: tuple | None = None

    def __call__(self, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (inputs.shape, inputs.dtype, labels.shape, labels.dtype, inputs.device)
        if self._graph is not None:
            if key != self._shape_key:  # e.g. the epoch's last, smaller batch
                return self._eager(inputs, labels)
            static_inputs, static_labels, loss, correct = self._static
            static_inputs.copy_(inputs, non_blocking=True)
            static_labels.copy_(labels, non_blocking=True)
            self._graph.replay()
            if self._finish_graph is not None:
                self.reduce()
                self._finish_graph.replay()
            self.replays += 1
            return loss, correct
        if key != self._shape_key:  # warm up on the shape that will be captured
            self._shape_key, self._warm = key, 0
        if self._warm < self.warmup_steps:
            self._warm += 1
            return self._eager(inputs, labels, side_stream=True)
        return self._capture(inputs, labels)

    def _eager(self, inputs: torch.Tensor, labels: torch.Tensor, *,
               side_stream: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        self.eager_steps += 1
        if not side_stream:
            return self._split_step(inputs, labels)
        # Warm-up on a side stream, as the capture will be: state made lazily is then made there.
        current = torch.cuda.current_stream(inputs.device)
        side = torch.cuda.Stream(inputs.device)
        side.wait_stream(current)
        with torch.cuda.stream(side), capture_warmup():  # the sparse convs measure and calibrate here
            loss, correct = self._split_step(inputs, labels)
        current.wait_stream(side)
        for tensor in (loss, correct):  # made on the side stream, read on this one
            tensor.record_stream(current)
        return loss, correct

    def _capture(self, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        static_inputs, static_labels = inputs.clone(), labels.clone()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the data loader's pin-memory thread keeps calling CUDA (pinned allocations)
        # during the capture; in the default global mode that invalidates the capture.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            loss, correct = self.step_fn(static_inputs, static_labels)
        if self.finish is not None:
            finish_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(finish_graph, pool=graph.pool(), capture_error_mode="thread_local"):
                self.finish()
            self._finish_graph = finish_graph
        self._graph, self._static = graph, (static_inputs, static_labels, loss, correct)
        self.captures += 1
        graph.replay()  # the capture ran nothing: this trains on the batch
        if self._finish_graph is not None:
            self.reduce()
            self._finish_graph.replay()
        self.replays += 1
        return loss, correct

    def _split_step(self, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.finish is None:
            return self.step_fn(inputs, labels)
        return self.eager_only(self.step_fn, reduce=self.reduce, finish=self.finish)(inputs, labels)
