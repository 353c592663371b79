"""How the supernet's ops are run: eagerly (:class:`EagerOps`) or replayed from CUDA graphs (``graphed_ops.OpGraphs``).

A cell hands every op call to one runner, naming where the call sits: ``slot_key`` (cell, edge, place of
the op among the edge's active ops; or a preprocessing) and ``source_key`` (cell, state it reads). The
eager runner ignores them; the graphed one keeps a memory pool per slot and a buffer per state.
"""
from __future__ import annotations

import contextlib
from typing import Hashable, Iterator, Protocol

from torch import Tensor, nn


class OpRunner(Protocol):
    """Runs the supernet's ops for one forward (a *pass*); see the module docstring for the keys."""

    # After a call: the buffer the op's backward reads the output's gradient from (whoever computes that
    # gradient may write it there and spare a copy), or None.
    last_grad_buffer: Tensor | None

    def begin_pass(self) -> None:
        """A new forward of the supernet starts."""

    def __call__(self, slot_key: Hashable, source_key: Hashable, op: nn.Module, x: Tensor) -> Tensor:
        """``op(x)``."""

    def state_buffer(self, source_key: Hashable) -> Tensor | None:
        """Memory to compute state ``source_key`` into (where the ops reading it would copy it), or None."""

    def without_weight_grads(self) -> contextlib.AbstractContextManager[None]:
        """Inside, backwards may skip the weights' gradients (a first-order α step discards them)."""


class EagerOps:
    """The plain runner: ``op(x)``, no buffers."""

    last_grad_buffer: Tensor | None = None

    def begin_pass(self) -> None:
        pass

    def __call__(self, slot_key: Hashable, source_key: Hashable, op: nn.Module, x: Tensor) -> Tensor:
        return op(x)

    def state_buffer(self, source_key: Hashable) -> Tensor | None:
        return None

    @contextlib.contextmanager
    def without_weight_grads(self) -> Iterator[None]:
        yield  # eager backwards taken with autograd.grad(loss, α) skip them already


EAGER = EagerOps()
