"""CUDA graphs of the supernet's ops: each op's forward and backward replayed as one graph each.

The search step launches thousands of small kernels, and on a GPU its host time, not the kernels,
sets the pace (RESULTS.md, "Search step"). The step as a whole cannot be one graph (the sampled ops
change every step), but each op with weights can: its forward (neuron, convs, BatchNorm) and its
backward become two graph launches instead of one launch per kernel.

Memory grows with the top-k supernet's places, not with every op: graphs are grouped by *slot*, (cell, edge,
place of the op among the edge's active ops), and the graphs of one slot (forward and backward) share one memory
pool, which keeps the largest captured op's activations and scratch all the time (about 4x the eager step's
memory, RESULTS.md). One op per slot is live at a time, because each forward of the supernet is followed by its
backward before the next forward (``SearchNetwork.forward`` starts a *pass*; a backward from an older pass raises
instead of reading overwritten activations). Inputs are copied once per pass into a buffer per cell state;
outputs and input gradients are copied within the graphs into per-slot buffers, weight gradients into buffers of
each op's own (they live until the optimizer step). Captures take the convs' eager path (cuDNN;
``kernels.sparse_conv.dispatch.dense_captures``).

An op runs eagerly instead (same function) when: not on CUDA, not training, grad disabled, under another
autocast state than its capture's, while a neuron records its firing rate, while a spike-reading conv's path
is not fixed yet, when the op has no weights (pools, identity: one or two kernels), one of its modules says
``capturable = False`` (a spiking neuron says so unless its builder vouches for it: ``search_space.neurons``),
its output differs from its slot's other ops', or its first call (a warm-up: cuDNN's autotuner and Triton's
compiler must not run inside a capture).
A failed capture (logged) ends capturing: the ops not captured by then stay eager.

A capture allocates from its slot's pool only: while it runs, the allocator cannot hand it memory cached for
eager steps, nor free the pools of graphs already dropped (a grown supernet's predecessor). So before a capture,
when the idle cache outgrows the device's free memory, the cache is released (``release_idle_cache``).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterator

import torch
from torch import Tensor, nn

from kernels.sparse_conv import SparseConv2d
from kernels.sparse_conv.dispatch import dense_captures
from search_space.neurons import SpikingNeuron

logger = logging.getLogger(__name__)


def release_idle_cache(device: torch.device) -> bool:
    """Empties the CUDA allocator's cache when it holds more memory unused than the device has free (True if
    so): a capture that follows could not use that memory otherwise, and would run out."""
    free, _ = torch.cuda.mem_get_info(device)
    idle = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if idle <= free:
        return False
    torch.cuda.empty_cache()
    return True


def _autocast_state() -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")


class _SlotMismatch(Exception):
    """An op's output differs in shape, layout or dtype from the other ops of its slot (their shared buffer)."""


class StalePassError(RuntimeError):
    """A graphed op's backward ran after a later forward of the supernet overwrote its activations."""


@dataclass
class _Slot:
    """Memory shared by the graphs of one (cell, edge, place) or one preprocessing input."""

    pool: tuple = field(default_factory=torch.cuda.graph_pool_handle)
    out: Tensor | None = None        # the op's output, written by its forward graph
    grad_out: Tensor | None = None   # the gradient of the output, copied in before a backward replay
    grad_in: Tensor | None = None    # the gradient of the input, written by the backward graph
    pass_id: int = -1                # the pass whose activations the slot holds


@dataclass
class _Entry:
    """One op's pair of graphs in one slot."""

    slot: _Slot
    source: _Slot                    # the buffer of the state the op reads
    forward: torch.cuda.CUDAGraph
    backward: torch.cuda.CUDAGraph
    input_backward: torch.cuda.CUDAGraph | None  # the input's gradient alone (``OpGraphs.without_weight_grads``)
    input_grad: bool
    autocast: tuple[bool, torch.dtype]  # the autocast state captured (CUDA): replayed under that state only
    param_grads: tuple[Tensor | None, ...]
    pointers: tuple[int, ...]        # the parameters' addresses at capture: a moved parameter means recapture


class _Replay(torch.autograd.Function):
    """The op as one node of the autograd graph: a forward replay, and a backward replay."""

    @staticmethod
    def forward(ctx, entry: _Entry, pass_id: int, weight_grads: bool, x: Tensor, *params: Tensor) -> Tensor:
        ctx.entry, ctx.pass_id, ctx.weight_grads = entry, pass_id, weight_grads or entry.input_backward is None
        ctx.params = params
        entry.slot.pass_id = pass_id
        entry.forward.replay()
        return entry.slot.out.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        entry: _Entry = ctx.entry
        if entry.slot.pass_id != ctx.pass_id or entry.source.pass_id != ctx.pass_id:
            raise StalePassError(
                "a graphed supernet op's backward ran after a later forward overwrote its activations: run each "
                "forward's backward before the next forward, or set search.graph_ops=false"
            )
        entry.slot.pass_id = -1  # the backward graph may reuse the activations' memory: one backward per forward
        if ctx.weight_grads:
            _unshare_grads(ctx.params, entry.param_grads)
        grad_out = entry.slot.grad_out
        if grad.data_ptr() != grad_out.data_ptr() or grad.stride() != grad_out.stride():  # else written in place
            grad_out.copy_(grad)
        (entry.backward if ctx.weight_grads else entry.input_backward).replay()
        grad_x = entry.slot.grad_in.detach() if entry.input_grad else None
        param_grads = entry.param_grads if ctx.weight_grads else (None,) * len(entry.param_grads)
        return (None, None, None, grad_x, *(None if g is None else g.detach() for g in param_grads))


def _unshare_grads(params: tuple[Tensor, ...], buffers: tuple[Tensor | None, ...]) -> None:
    """Autograd keeps a returned weight gradient as the weight's ``.grad`` without a copy (nothing else refers to
    that tensor), so ``.grad`` may still be the graph's buffer from the last backward. Before the graph writes it
    again, such a ``.grad`` gets memory of its own: a gradient kept through ``zero_grad(set_to_none=False)`` or
    accumulated over two backwards would otherwise be overwritten, then doubled."""
    for param, buffer in zip(params, buffers):
        grad = param.grad
        if grad is not None and buffer is not None and grad.data_ptr() == buffer.data_ptr():
            param.grad = grad.clone()


def _capturable(module: nn.Module) -> bool:
    """Whether ``module`` has weights and no part that says it does not capture (checked once per op)."""
    if not any(p.requires_grad for p in module.parameters()):
        return False
    return all(getattr(sub, "capturable", True) for sub in module.modules())


def _routes_known(convs: list[SparseConv2d]) -> bool:
    """Every spike-reading conv has a fixed eager path (cuDNN), which ``dense_captures`` makes the captured
    one too; None: the dispatcher still decides per call (e.g. its next eager call calibrates)."""
    return all(conv.fixed_route is not None for conv in convs)


class OpGraphs:
    """The graphs of one supernet's ops (``SearchNetwork.use_op_graphs``).

    An op's trainable parameters are looked up at its first call (the step's host time): moving them
    (``.to``, a new data pointer) makes a new capture, but replacing a parameter object or changing its
    ``requires_grad`` afterwards needs new graphs (``use_op_graphs(True)``)."""

    def __init__(self) -> None:
        self.pass_id = 0
        self._slots: dict[Hashable, _Slot] = {}
        self._sources: dict[Hashable, _Slot] = {}
        self._entries: dict[tuple[Hashable, int], _Entry | None] = {}  # (slot key, id(op)); None: stays eager
        self._warm: set[int] = set()           # ops that ran once eagerly with grad
        self._kinds: dict[int, bool] = {}      # id(op) -> _capturable
        self._neurons: dict[int, list[SpikingNeuron]] = {}
        self._convs: dict[int, list[SparseConv2d]] = {}
        self._named_params: dict[int, list[tuple[str, nn.Parameter]]] = {}  # id(op) -> its trainable parameters
        self._params: dict[int, list[nn.Parameter]] = {}  # the same, without their names
        self._stream: torch.cuda.Stream | None = None  # captures and their warm-ups run here
        self._side_warm: set[int] = set()      # ops warmed up on the capture stream
        self.capturing = True  # False after a failed capture: no new captures (graphs already made still replay)
        self.weight_grads = True  # False inside without_weight_grads()
        self.last_grad_buffer: Tensor | None = None  # see __call__
        self.captured = 0   # graph pairs captured
        self.replays = 0    # op calls replayed from graphs
        self.failed = 0     # captures that failed
        self.cache_releases = 0  # times the allocator's idle cache was released before a capture

    @contextlib.contextmanager
    def without_weight_grads(self) -> Iterator[None]:
        """Ops replayed inside give their input's gradient alone, as eager ops do under ``autograd.grad(loss, α)``
        (a first-order α step): their backward skips the weights' gradients, which the step would discard."""
        before = self.weight_grads
        self.weight_grads = False
        try:
            yield
        finally:
            self.weight_grads = before

    def begin_pass(self) -> None:
        """A new forward of the supernet: later backwards of older passes raise StalePassError."""
        self.pass_id += 1

    def __call__(self, slot_key: Hashable, source_key: Hashable, op: nn.Module, x: Tensor) -> Tensor:
        """``op(x)``: replayed from its graphs where it can be, else eagerly. After a replay, ``last_grad_buffer``
        is the buffer its backward graph reads the output's gradient from (whoever computes that gradient may
        write it there and spare the copy), else None."""
        self.last_grad_buffer = None
        if not self._may_replay(op, x):
            return op(x)
        key = (slot_key, id(op))
        entry = self._entries.get(key, False)
        if entry is None or (entry is False and not self.capturing):
            return op(x)
        if entry is False and id(op) not in self._warm:
            self._warm.add(id(op))
            return op(x)
        source = self._source(source_key, x)
        if source is None:  # another shape or layout than the graphs' (e.g. a last, smaller batch)
            return op(x)
        if entry is False:
            entry = self._capture(key, slot_key, source, op, x)
            if entry is None:
                return op(x)
        if entry.autocast != _autocast_state():  # e.g. an fp32 evaluation step of a bf16 search: eager
            return op(x)
        params = self._params[id(op)]
        if tuple(p.data_ptr() for p in params) != entry.pointers or x.requires_grad != entry.input_grad:
            self._entries[key] = False  # parameters were replaced (e.g. moved): capture again
            return op(x)
        self.replays += 1
        self.last_grad_buffer = entry.slot.grad_out
        return _Replay.apply(entry, self.pass_id, self.weight_grads, x, *params)

    def _may_replay(self, op: nn.Module, x: Tensor) -> bool:
        if not (x.is_cuda and op.training and torch.is_grad_enabled()):
            return False
        kind = self._kinds.get(id(op))
        if kind is None:
            kind = self._kinds[id(op)] = _capturable(op)
            self._neurons[id(op)] = [m for m in op.modules() if isinstance(m, SpikingNeuron)]
            self._convs[id(op)] = [m for m in op.modules() if isinstance(m, SparseConv2d)]
            named = self._named_params[id(op)] = [(n, p) for n, p in op.named_parameters() if p.requires_grad]
            self._params[id(op)] = [p for _, p in named]
        return kind and not any(neuron.record_firing_rate for neuron in self._neurons[id(op)])

    def state_buffer(self, source_key: Hashable) -> Tensor | None:
        """The buffer graphed ops read state ``source_key`` from (None before its first use). A state computed
        into it (``weighted_sum(out=)``) is not copied again; it lives until that state's next forward."""
        source = self._sources.get(source_key)
        return None if source is None or not torch.is_grad_enabled() else source.out

    def _source(self, source_key: Hashable, x: Tensor) -> _Slot | None:
        """The buffer holding state ``source_key`` of this pass (copied in on its first use); None where x
        differs in shape or layout from the first input seen there (the graphs were captured for that)."""
        source = self._sources.get(source_key)
        if source is None:
            source = self._sources[source_key] = _Slot(pool=None, out=torch.empty_like(x))
        elif source.out.shape != x.shape or source.out.stride() != x.stride() or source.out.dtype != x.dtype:
            return None
        if source.pass_id != self.pass_id:
            if x.data_ptr() != source.out.data_ptr():  # else computed into the buffer (``state_buffer``)
                source.out.copy_(x.detach())
            source.pass_id = self.pass_id
        return source

    def _capture(self, key: tuple, slot_key: Hashable, source: _Slot, op: nn.Module, x: Tensor) -> _Entry | None:
        if not _routes_known(self._convs[id(op)]):
            return None  # eager this time; tried again on the next call
        slot = self._slots.get(slot_key)
        if slot is None:
            slot = self._slots[slot_key] = _Slot()
        if self._stream is None:
            self._stream = torch.cuda.Stream(x.device)
        params = self._params[id(op)]
        current = torch.cuda.current_stream(x.device)
        self._stream.wait_stream(current)
        forward, backward = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        autocast = _autocast_state()
        try:
            # Under autocast, without its cache of cast weights: a capture must cast the weights inside the graph
            # (a cached cast from the warm-up would be replayed as that step's weights for good).
            with torch.cuda.stream(self._stream), dense_captures(), torch.autocast(
                "cuda", dtype=autocast[1], enabled=autocast[0], cache_enabled=False
            ):
                x_in = source.out.detach().requires_grad_(x.requires_grad)
                # The weights enter as fresh leaves sharing their memory: a parameter's own gradient accumulator
                # may be kept alive by an older autograd graph on the default stream, and a backward captured
                # through it would make that stream wait on the capture (an error).
                aliases = {name: p.detach().requires_grad_() for name, p in self._named_params[id(op)]}
                inputs = ([x_in] if x.requires_grad else []) + list(aliases.values())

                def run(inp: Tensor) -> Tensor:
                    return torch.func.functional_call(op, aliases, (inp,))

                if id(op) not in self._side_warm or slot.out is None:  # lazy per-stream state is made here
                    self._warm_up(op, run, x_in, inputs, slot)
                    self._side_warm.add(id(op))
                # The weights' gradients outlive the replay (the optimizer reads them after the whole backward):
                # each op copies them into buffers of its own, outside the pool that other ops' graphs reuse.
                grad_buffers = [torch.empty_like(p) for p in aliases.values()]
                self.cache_releases += release_idle_cache(x.device)
                forward.capture_begin(pool=slot.pool, capture_error_mode="thread_local")
                try:
                    out = run(x_in)
                    slot.out.copy_(out)
                finally:
                    forward.capture_end()
                # The backward in the slot's pool too: with one backward pool shared by all slots the weight
                # gradients came out wrong (RESULTS.md, "Graphs per op": likely another capture's scratch placed
                # on a gradient the optimizer had still to read).
                input_backward = None
                if x.requires_grad and aliases:  # first: it keeps the activations for the full backward
                    input_backward = torch.cuda.CUDAGraph()
                    input_backward.capture_begin(pool=slot.pool, capture_error_mode="thread_local")
                    try:
                        (grad_x,) = torch.autograd.grad(out, [x_in], grad_outputs=slot.grad_out, retain_graph=True)
                        slot.grad_in.copy_(grad_x)
                        del grad_x
                    finally:
                        input_backward.capture_end()
                backward.capture_begin(pool=slot.pool, capture_error_mode="thread_local")
                try:
                    grads = torch.autograd.grad(out, inputs, grad_outputs=slot.grad_out, allow_unused=True)
                    if x.requires_grad:
                        slot.grad_in.copy_(grads[0])
                        grads = grads[1:]
                    for buffer, grad in zip(grad_buffers, grads):
                        if grad is not None:
                            buffer.copy_(grad)
                    grads = [None if grad is None else buffer for buffer, grad in zip(grad_buffers, grads)]
                finally:
                    backward.capture_end()
                del out, x_in, inputs
        except _SlotMismatch as error:  # found in the warm-up, before any capture: this op alone stays eager
            current.wait_stream(self._stream)
            self._entries[key] = None
            logger.warning("op %s in slot %s stays eager: %s", type(op).__name__, slot_key, error)
            return None
        except Exception as error:  # the allocator may still be recording into the pool: capture nothing more
            current.wait_stream(self._stream)
            torch.cuda.synchronize(x.device)
            self.failed += 1
            self.capturing = False
            while error.__context__ is not None:  # the first error, not capture_end's "previous error" one
                error = error.__context__
            logger.warning("op %s in slot %s: CUDA-graph capture failed (%s); ops not captured yet stay eager",
                           type(op).__name__, slot_key, str(error).splitlines()[0])
            return None
        current.wait_stream(self._stream)
        entry = _Entry(slot, source, forward, backward, input_backward, x.requires_grad, autocast, tuple(grads),
                       tuple(p.data_ptr() for p in params))
        self._entries[key] = entry
        self.captured += 1
        return entry

    @staticmethod
    def _warm_up(op: nn.Module, run: Callable[[Tensor], Tensor], x_in: Tensor, inputs: list[Tensor],
                 slot: _Slot) -> None:
        """One forward (``run``, i.e. ``op``) and backward on the capture stream (``op``'s BatchNorm statistics
        restored afterwards: the step's real call follows); makes the slot's buffers from their shapes."""
        saved = [buffer.detach().clone() for buffer in op.buffers()]
        out = run(x_in)
        if x_in.requires_grad:  # the input-only backward too, as captured
            torch.autograd.grad(out, [x_in], grad_outputs=torch.zeros_like(out), retain_graph=True)
        grads = torch.autograd.grad(out, inputs, grad_outputs=torch.zeros_like(out), allow_unused=True)
        if slot.out is None:
            slot.out, slot.grad_out = torch.empty_like(out), torch.empty_like(out)
        elif (slot.out.shape, slot.out.stride(), slot.out.dtype) != (out.shape, out.stride(), out.dtype):
            raise _SlotMismatch(f"its output {tuple(out.shape)} {out.dtype} differs from the slot's other ops'")
        if slot.grad_in is None and x_in.requires_grad:
            slot.grad_in = torch.empty_like(grads[0])
        with torch.no_grad():
            for buffer, value in zip(op.buffers(), saved):
                buffer.copy_(value)

    def __deepcopy__(self, memo: dict) -> OpGraphs:
        return OpGraphs()  # graphs belong to the original's parameters: a copy captures its own
