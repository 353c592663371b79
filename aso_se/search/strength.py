"""The cell from the supernet's weights instead of α: each op judged by the accuracy of the single path it joins.

The base path gives every edge its α-argmax op; each edge in turn takes every other op, or none (the edge cut), and
the path's accuracy on held-out images is measured (DARTS-PT's perturbation, without its fine-tuning). An op's
strength on its edge is that accuracy minus the accuracy with the edge cut, and DARTS's rule on the strengths gives
the cell. ``search.py derive=strength`` derives its final cell so (``final_cell_by_strength``);
``benchmarks/op_strength.py`` analyses a finished search's checkpoint with the same functions. Batch norms use the
batch's statistics (their running ones were gathered on sampled mixtures of ops, not on one path), on batches that mix
the classes (``mixed_batches``). A judging stops between two paths when asked, and the paths it judged (``judged``)
let a resume go on where it stopped.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import torch

from aso_se.search.arch_params import ArchSample
from aso_se.search.derive import NONE_OP, derive_genotype
from aso_se.search.supernet import CELL_TYPES, SearchNetwork
from search_space.errors import UserInputError
from search_space.genotypes import Genotype
from search_space.ops import PARAMETER_FREE_OPS

if TYPE_CHECKING:
    from aso_se.search.engine import ASOSEEngine

log = logging.getLogger(__name__)


class JudgingStopped(Exception):
    """A stop was asked for between two judged paths; the ones judged so far are in the ``judged`` dict."""


def with_op(sample: ArchSample, edge: int, op: int) -> ArchSample:
    """``sample`` (one op per edge) with ``edge`` computing ``op`` instead."""
    chosen = sample.chosen.clone()
    chosen[edge, 0] = op
    active = tuple((op,) if e == edge else ops for e, ops in enumerate(sample.active_ops))
    return dataclasses.replace(sample, chosen=chosen, active_ops=active)


@torch.no_grad()
def correct(supernet: SearchNetwork, samples: Sequence[ArchSample], batches: Sequence[tuple[torch.Tensor, ...]]
            ) -> torch.Tensor:
    """Which images the path ``samples`` classifies right (bool, on the CPU); batch norms on the batch's
    statistics, everything else in eval mode."""
    supernet.eval()
    for module in supernet.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.train()
    return torch.cat([(supernet(x, samples, arch_grad=False).argmax(dim=1) == y).cpu() for x, y in batches])


def mixed_batches(loader: Iterable, batch_size: int, seed: int, device: str | torch.device,
                  max_images: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The loader's images (its first ``max_images``, if given) in one fixed shuffled order, in batches of
    ``batch_size``. A test set comes sorted by class, and batch norms on the statistics of a one-class batch
    misjudge every path (RESULTS.md, issue #44)."""
    images, labels, count = [], [], 0
    for x, y, *_ in loader:
        images.append(x.cpu())
        labels.append(y.cpu())
        count += len(y)
        if max_images is not None and count >= max_images:
            break
    images, labels = torch.cat(images)[:max_images], torch.cat(labels)[:max_images]
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    return [(images[part].to(device), labels[part].to(device)) for part in torch.split(order, batch_size)]


def strengths(supernet: SearchNetwork, batches: Sequence[tuple[torch.Tensor, ...]],
              judged: dict[str, torch.Tensor] | None = None, *, should_stop: Callable[[], bool] = lambda: False,
              on_edge: Callable[[str, int, int], None] = lambda kind, edge, edges: None) -> dict:
    """Per cell type ``[edges, ops]`` accuracies of the base path with one edge changed, the base's, and how many
    images each changed path judges otherwise than the base (``discordant``: the paired difference's standard error
    is about sqrt(discordant) / images, McNemar's). Per edge, ``lead`` is the strongest op's accuracy minus the
    runner-up's and ``lead_discordant`` the images those two paths judge otherwise (``decided_edges``).

    ``judged`` maps a path's name to which images it classifies right: paths in it are not run again, new ones are
    added. ``should_stop()`` is asked before each path still to run (``JudgingStopped``); ``on_edge(kind, edge,
    edges)`` follows each judged edge (progress, saving ``judged``)."""
    judged = {} if judged is None else judged

    def path(name: str, samples: Sequence[ArchSample]) -> torch.Tensor:
        if name not in judged:
            if should_stop():
                raise JudgingStopped(name)
            judged[name] = correct(supernet, samples, batches)
        return judged[name]

    primitives = supernet.search_space.primitives
    none = primitives.index(NONE_OP) if NONE_OP in primitives else None
    base = supernet.argmax_sample()
    base_correct = path("base", base)
    result = {"base_accuracy": base_correct.float().mean().item(), "accuracy": {}, "discordant": {}, "lead": {},
              "lead_discordant": {}}
    for kind_index, kind in enumerate(CELL_TYPES):
        mask = supernet.arch[kind].op_mask.cpu()
        accuracies, discordant, leads, lead_discordant = [], [], [], []
        for edge in range(mask.shape[0]):
            rights: dict[int, torch.Tensor] = {}
            for op in range(len(primitives)):
                if mask[edge, op] or op == none:  # an op pruned for good (stale weights) is not judged
                    samples = list(base)
                    samples[kind_index] = with_op(base[kind_index], edge, op)
                    rights[op] = path(f"{kind}/{edge}/{primitives[op]}", samples)
            accuracies.append([rights[op].float().mean().item() if op in rights else None
                               for op in range(len(primitives))])
            discordant.append([int((rights[op] != base_correct).sum()) if op in rights else None
                               for op in range(len(primitives))])
            ranked = sorted((op for op in rights if op != none), key=lambda op: (-accuracies[-1][op], op))
            on_edge(kind, edge, mask.shape[0])
            if len(ranked) < 2:  # one op left on the edge: nothing to decide between
                leads.append(None)
                lead_discordant.append(None)
                continue
            first, second = ranked[:2]
            leads.append(accuracies[-1][first] - accuracies[-1][second])
            lead_discordant.append(int((rights[first] != rights[second]).sum()))
        result["accuracy"][kind], result["discordant"][kind] = accuracies, discordant
        result["lead"][kind], result["lead_discordant"][kind] = leads, lead_discordant
    return result


def decided_edges(table: dict) -> dict[str, int]:
    """Per cell type, the edges whose strongest op leads the runner-up by at least 2 standard errors of the
    paired difference (McNemar's, sqrt(discordant) / images): where the judging is not down to which images it saw."""
    images = table["images"]
    return {kind: sum(lead is not None and lead > 0 and lead >= 2 * count ** 0.5 / images
                      for lead, count in zip(leads, table["lead_discordant"][kind]))
            for kind, leads in table["lead"].items()}


def strength_genotype(accuracies: dict, primitives: Sequence[str], steps: int, multiplier: int,
                      max_skip_connect: int | None, max_parameter_free: int | None,
                      max_normal_pools: int | None = None) -> Genotype:
    """DARTS's rule on strengths: an op's accuracy on its edge minus the accuracy with the edge cut (``none``);
    the search's caps as for its α cell."""
    if NONE_OP not in primitives:
        raise UserInputError(f"the search space {list(primitives)} has no none op to cut an edge with; "
                             "derive the cell from α (derive=alpha) or add none to the primitives")
    none = primitives.index(NONE_OP)
    scores = {}
    for kind, table in accuracies.items():
        scores[kind] = torch.tensor([[-float("inf") if acc is None else acc - row[none] for acc in row]
                                     for row in table], dtype=torch.float64)
    return derive_genotype(scores["normal"], scores["reduce"], primitives, steps=steps, multiplier=multiplier,
                           max_skip_connect=max_skip_connect, max_parameter_free=max_parameter_free,
                           max_normal_pools=max_normal_pools)


def parameter_free(genotype: Genotype) -> dict[str, int]:
    """Pool and skip edges per cell type."""
    return {kind: sum(op in PARAMETER_FREE_OPS for op, _ in getattr(genotype, kind)) for kind in CELL_TYPES}


def cells_record(alpha_cell: Genotype, strength_cell: Genotype) -> dict:
    """Both cells of a judging, with their parameter-free edges, as strength.json and op_strength.json keep them."""
    record = {}
    for name, cell in (("alpha_genotype", alpha_cell), ("strength_genotype", strength_cell)):
        record[name], record[f"{name}_parameter_free"] = json.loads(cell.to_json()), parameter_free(cell)
    return record


DERIVE_RULES = ("alpha", "strength")


def check_rule(rule: str, images: int | None, primitives: Sequence[str]) -> None:
    """Before a search starts: a final derivation rule (``derive=``) that its end can apply."""
    if rule not in DERIVE_RULES:
        raise UserInputError(f"derive={rule}: pass derive=alpha (DARTS's rule on α) or derive=strength (each op "
                             "judged by its path's accuracy on α's split)")
    if rule == "strength":
        if images is not None and (isinstance(images, bool) or not isinstance(images, int) or images < 1):
            raise UserInputError(f"derive_images={images}: derive=strength needs 1 or more images of α's split, "
                                 "or null for all of it")
        if NONE_OP not in primitives:
            raise UserInputError(f"derive=strength cuts edges with the none op, which the search space "
                                 f"{list(primitives)} lacks; add none to its primitives or pass derive=alpha")


def derive_by_strength(supernet: SearchNetwork, loader: Any, *, images: int | None, batch_size: int,
                       seed: int, device: str | torch.device, max_skip_connect: int | None,
                       max_parameter_free: int | None, max_normal_pools: int | None = None,
                       judged: dict[str, torch.Tensor] | None = None,
                       should_stop: Callable[[], bool] = lambda: False,
                       on_edge: Callable[[str, int, int], None] = lambda kind, edge, edges: None
                       ) -> tuple[Genotype, dict]:
    """The cell of the ops' strengths on the first ``images`` images of ``loader`` (α's split; None: all of it), and
    the table (``strengths``'s, with the images counted and ``decided_edges``) it comes from; ``judged``,
    ``should_stop`` and ``on_edge`` as for ``strengths``."""
    supernet.use_op_graphs(False)  # the search is over: plain eager forwards judge the paths
    # the images (order, crops) of the loader's first pass, whichever pass it was at: a resumed judging, and
    # benchmarks/op_strength.py --split arch on a fresh loader, see the ones the stopped judging saw
    loader.set_epoch(0)
    batches = mixed_batches(loader, batch_size, seed, device, max_images=images)
    table = strengths(supernet, batches, judged, should_stop=should_stop, on_edge=on_edge)
    space = supernet.search_space
    genotype = strength_genotype(table["accuracy"], space.primitives, space.steps, space.multiplier,
                                 max_skip_connect, max_parameter_free, max_normal_pools)
    table.update(images=sum(len(y) for _, y in batches), primitives=list(space.primitives))
    return genotype, {**table, "decided_edges": decided_edges(table)}


def judging_key(engine: ASOSEEngine, *, images: int | None, batch_size: int, seed: int) -> dict[str, Any]:
    """What a judging of ``engine``'s final supernet depends on: paths judged under another key are judged anew."""
    return {"images": images, "batch_size": batch_size, "seed": seed, "global_step": engine.progress["global_step"]}


def final_cell_by_strength(
        engine: ASOSEEngine, loader: Any, *, images: int | None, batch_size: int, seed: int,
        judged: dict[str, torch.Tensor], seconds_before: float, keep: Callable[[dict[str, Any]], None],
        should_stop: Callable[[], bool]) -> tuple[Genotype, dict]:
    """``derive=strength`` at a search's end: the cell of the ops' strengths in ``engine``'s supernet on the first
    ``images`` images (None: all) of ``loader``, α's split, under the search's caps; and the record strength.json
    keeps: the table, the seconds spent judging, and both cells (α's, the last cycle's, beside it).

    A judging that ``should_stop`` ends (``JudgingStopped``) goes on after a resume: ``keep(state)`` gets the paths
    judged so far, their ``judging_key`` and the seconds spent after each edge and at the stop; a resume passes the
    kept paths as ``judged`` and the seconds as ``seconds_before``."""
    evolution, alpha_genotype = engine.evolution, engine.genotypes[-1]
    key = judging_key(engine, images=images, batch_size=batch_size, seed=seed)
    started = time.perf_counter()

    def keep_judged(kind: str | None = None, edge: int = 0, edges: int = 0) -> None:
        seconds = seconds_before + time.perf_counter() - started
        keep({"paths": judged, "judging": key, "seconds": seconds})
        if kind is not None:
            log.info("derive=strength: %s edge %d of %d judged (%d paths, %.0f s)", kind, edge + 1, edges,
                     len(judged), seconds)

    try:
        genotype, table = derive_by_strength(
            engine.supernet, loader, images=images, batch_size=batch_size, seed=seed, device=engine.device,
            max_skip_connect=evolution.max_skip_connect, max_parameter_free=evolution.max_parameter_free,
            max_normal_pools=evolution.max_normal_pools, judged=judged, should_stop=should_stop, on_edge=keep_judged)
    except JudgingStopped:
        keep_judged()  # the paths judged since the last edge's end too
        raise
    table["judging_seconds"] = seconds_before + time.perf_counter() - started
    decided = table["decided_edges"]
    log.info("derive=strength on %d images of α's split in %.0f s (base path %.4f; the strongest op leads by 2 SE "
             "on %d of %d normal and %d of %d reduction edges): %s (α's cell: %s)", table["images"],
             table["judging_seconds"], table["base_accuracy"], decided["normal"], len(table["lead"]["normal"]),
             decided["reduce"], len(table["lead"]["reduce"]), genotype, alpha_genotype)
    return genotype, {**table, **cells_record(alpha_genotype, genotype)}
