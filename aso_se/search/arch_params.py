"""Architecture parameters: all α of a cell type in one ``[edges, ops]`` Parameter, sampled in one batch.

One batched Gumbel-top-k (:func:`draw_samples`) picks the ops of every edge of every cell type and
brings them to the host in one sync: the supernet needs them there to call only those ops.
An :class:`ArchSample` holds noise and choice but no autograd graph; each forward rebuilds its edge
weights from α (:meth:`BatchedArchitectureUpdate.edge_weights`), so no graph is backpropagated twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from search_space.errors import UserInputError


@dataclass(frozen=True)
class SamplingConfig:
    """Which ops a draw picks per edge (:func:`draw_samples`); the one place these knobs are spelled out.

    ``k``: the top-k ops of ``α + Gumbel noise`` (None = every op: DARTS's MixedOp, exactly when
    ``gumbel`` is off). ``weight_threshold``: also skip chosen ops (but the best) whose relaxed
    weight is under it. ``gumbel``: sample (exploration) or take the top-k of α itself.
    """

    k: int | None = 2
    weight_threshold: float = 0.0
    gumbel: bool = True

    def __post_init__(self) -> None:
        if self.k is not None and self.k < 1:
            raise UserInputError(f"sampling k={self.k}: need k >= 1 or null (every op); fix search.sampling.k")
        if not 0.0 <= self.weight_threshold < 1.0:
            raise UserInputError(
                f"sampling weight_threshold={self.weight_threshold}: need 0 <= threshold < 1; "
                "fix search.sampling.weight_threshold"
            )


# The fixed draws: every edge's most likely op alone (the supernet's single best path), every unpruned op.
ARGMAX = SamplingConfig(k=1, gumbel=False)
EVERY_OP = SamplingConfig(k=None, gumbel=False)


@dataclass(frozen=True)
class ArchSample:
    """One cell type's draw: Gumbel noise, chosen ops, temperature. Holds no autograd graph.

    ``chosen`` is ``[edges, k]`` on the device (-1 = not computed); ``active_ops`` is its host
    copy without the -1 entries, the op indices each edge computes, best first.
    """

    noise: Tensor
    chosen: Tensor
    active_ops: tuple[tuple[int, ...], ...]
    temperature: float

    @property
    def computes_every_op(self) -> bool:
        return all(len(ops) == self.noise.shape[-1] for ops in self.active_ops)


class BatchedArchitectureUpdate(nn.Module):
    """α of one cell type (``alpha``, ``[edges, ops]``) plus its pruning state.

    Buffers (in ``state_dict``, moved by ``.to()``): ``op_mask`` (False = pruned for good) and
    ``stayed_below`` (True while an op's probability has been under the prune threshold at every
    check of the current search phase; see ``aso_se.search.evolution``).
    """

    op_mask: Tensor
    stayed_below: Tensor

    def __init__(self, num_edges: int, primitives: Sequence[str], init_scale: float = 1e-3) -> None:
        super().__init__()
        self.primitives = tuple(primitives)
        # DARTS's initialization: tiny random α, an almost uniform start.
        self.alpha = nn.Parameter(init_scale * torch.randn(num_edges, len(self.primitives)))
        self.register_buffer("op_mask", torch.ones(num_edges, len(self.primitives), dtype=torch.bool))
        self.register_buffer("stayed_below", torch.ones(num_edges, len(self.primitives), dtype=torch.bool))

    def logits(self) -> Tensor:
        """α with ``-inf`` for pruned ops (what softmax, entropy and sampling read)."""
        return self.alpha.masked_fill(~self.op_mask, float("-inf"))

    def probabilities(self) -> Tensor:
        """``[edges, ops]`` softmax of α over the unpruned ops."""
        return torch.softmax(self.logits(), dim=-1)

    def edge_weights(self, sample: ArchSample, *, arch_grad: bool) -> Tensor:
        """``[edges, ops]`` weights for one forward: GDAS's straight-through estimator, top-k.

        Forward: ``soft = softmax((α + g) / τ)`` renormalized over the chosen ops, 0 elsewhere (1.0 for
        k = 1); gradient: that of ``soft``, so every unpruned α gets one. When every op is chosen the
        weights are ``soft`` (DARTS's ``softmax(α)`` with no noise and τ = 1). ``arch_grad=False``
        detaches α (weight steps).
        """
        logits = self.logits() if arch_grad else self.logits().detach()
        soft = torch.softmax((logits + sample.noise) / sample.temperature, dim=-1)
        if sample.computes_every_op:
            return soft
        chosen = torch.zeros_like(soft, dtype=torch.bool).scatter_(-1, sample.chosen.clamp(min=0), sample.chosen >= 0)
        kept = soft * chosen
        return soft + (kept / kept.sum(dim=-1, keepdim=True) - soft).detach()


def active_weights(weights: Tensor, sample: ArchSample) -> list[tuple[Tensor, ...]]:
    """Per edge, the weights of its active ops in ``sample.active_ops`` order, as 0-dim tensors.

    ``weights`` is ``[edges, ops]``. One gather and one unbind serve all edges (indexing each term
    would add ops per term in forward and backward); rows of ``sample.chosen`` list active ops
    first, so an edge's weights are the first ``len(active_ops[edge])`` of its row.
    """
    per_edge = weights.gather(-1, sample.chosen.clamp(min=0)).flatten().unbind()
    width = sample.chosen.shape[-1]
    return [per_edge[edge * width: edge * width + len(ops)] for edge, ops in enumerate(sample.active_ops)]


def draw_samples(
    archs: Sequence[BatchedArchitectureUpdate], num_samples: int, sampling: SamplingConfig, *, temperature: float,
    generator: torch.Generator | None = None,
) -> list[list[ArchSample]]:
    """``num_samples`` independent draws for every cell type in ``archs``: ``[sample][cell type]``.

    Per edge: the top-``sampling.k`` ops of ``α + g`` (``k=None``: every unpruned op), where ``g`` is
    Gumbel noise from ``generator`` if ``sampling.gumbel`` (else none), minus those whose
    ``softmax((α + g) / temperature)`` is under ``sampling.weight_threshold`` (the best is always
    kept). All cell types must have the same shape. One host sync in total.
    """
    return start_draw(archs, num_samples, sampling, temperature=temperature, generator=generator).samples()


class PendingDraw:
    """A draw whose chosen ops are on their way to the host (:func:`start_draw`); ``samples()`` waits for them.

    On a GPU the copy is queued right behind the draw's kernels, so ``samples()`` waits for those alone,
    not for the work the host queued after them (the rest of a step): a draw started one step early
    costs the next step no wait for the GPU to drain.
    """

    def __init__(self, noise: Tensor, chosen: Tensor, temperature: float) -> None:
        self.noise, self.chosen, self.temperature = noise, chosen, temperature
        self._ready: torch.cuda.Event | None = None
        if chosen.device.type == "cuda":
            self._host = torch.empty(chosen.shape, dtype=chosen.dtype, pin_memory=True)
            self._host.copy_(chosen, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = chosen

    @property
    def num_samples(self) -> int:
        return self.chosen.shape[0]

    def samples(self) -> list[list[ArchSample]]:
        """``[sample][cell type]`` ArchSamples; the draw's one host sync."""
        if self._ready is not None:
            self._ready.synchronize()
        chosen_host = self._host.tolist()
        return [
            [
                ArchSample(
                    noise=self.noise[s, t],
                    chosen=self.chosen[s, t],
                    active_ops=tuple(tuple(op for op in edge if op >= 0) for edge in chosen_host[s][t]),
                    temperature=self.temperature,
                )
                for t in range(len(chosen_host[s]))
            ]
            for s in range(len(chosen_host))
        ]


def start_draw(
    archs: Sequence[BatchedArchitectureUpdate], num_samples: int, sampling: SamplingConfig, *, temperature: float,
    generator: torch.Generator | None = None,
) -> PendingDraw:
    """:func:`draw_samples` without waiting: the draw is queued and its choice starts for the host."""
    logits = torch.stack([arch.logits().detach() for arch in archs])  # [types, edges, ops]
    shape = (num_samples, *logits.shape)
    if not sampling.gumbel:
        noise = torch.zeros(shape, device=logits.device)
    else:
        # Gumbel(0, 1) = -log(Exponential(1)), drawn as torch.nn.functional.gumbel_softmax draws it.
        noise = -torch.empty(shape, device=logits.device).exponential_(generator=generator).log()
    perturbed = logits + noise
    num_ops = logits.shape[-1]
    k = num_ops if sampling.k is None else min(sampling.k, num_ops)
    top_values, top_ops = perturbed.topk(k, dim=-1)
    soft = torch.softmax(perturbed / temperature, dim=-1).gather(-1, top_ops)
    keep = torch.isfinite(top_values) & (soft >= sampling.weight_threshold)
    keep[..., 0] = True
    return PendingDraw(noise, top_ops.masked_fill(~keep, -1), temperature)
