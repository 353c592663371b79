"""The supernet under search together with what trains it: its two optimizers and the weights' LR schedule.

They are replaced together: when the supernet grows between cycles (the optimizers' and the schedule's state carried
over to the grown supernet's parameters, ``aso_se.search.growth``) and when a resume brings a grown structure. The
step (``aso_se.search.step.SearchStep``) trains whichever supernet and optimizers are current.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from aso_se.search.growth import grow_supernet, rebind_optimizer
from aso_se.search.step import SearchStep
from aso_se.search.supernet import SearchNetwork, SupernetStructure
from search_space.neurons import set_firing_rate_recording

logger = logging.getLogger(__name__)

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]
SchedulerFactory = Callable[[Optimizer], LRScheduler]


class TrainedSupernet:
    """``supernet`` on ``step``'s device and memory format, trained by ``step`` with optimizers from the factories.

    ``weights_scheduler``: optional factory taking the weights optimizer. ``graph_ops``: on CUDA, each op's forward
    and backward replayed from CUDA graphs (``aso_se.search.graphed_ops``).
    """

    def __init__(self, supernet: SearchNetwork, step: SearchStep, *, weights_optimizer: OptimizerFactory,
                 arch_optimizer: OptimizerFactory, weights_scheduler: SchedulerFactory | None,
                 graph_ops: bool) -> None:
        self.step = step
        self._make_weights_optimizer, self._make_arch_optimizer = weights_optimizer, arch_optimizer
        self._make_weights_scheduler = weights_scheduler
        self.graph_ops = bool(graph_ops) and self._graph_ops_apply(supernet, step.device)
        self.weights_scheduler: LRScheduler | None = None
        self.use(supernet.to(step.device))

    @staticmethod
    def _graph_ops_apply(supernet: SearchNetwork, device: torch.device) -> bool:
        """Whether graph_ops can act here; if not, says why once (the ops run eagerly, with the same results)."""
        reason = ("the device is not CUDA" if device.type != "cuda" else
                  "recomputed cells run ops again in backward" if supernet.recompute else None)
        if reason is not None:
            logger.warning("search.graph_ops=true has no effect here (%s): the ops run eagerly", reason)
        return reason is None

    def use(self, supernet: SearchNetwork) -> None:
        """Makes ``supernet`` the searched one, with fresh optimizers (and scheduler) over it."""
        supernet = supernet.to(memory_format=self.step.memory_format)  # keeps the Parameter objects
        supernet.use_op_graphs(self.graph_ops)
        set_firing_rate_recording(supernet, False)  # on for each epoch's last step only (recording_firing_rates)
        weights_optimizer = self._make_weights_optimizer(list(supernet.weight_parameters()))
        self.step.bind(supernet, weights_optimizer, self._make_arch_optimizer(supernet.arch_parameters()))
        self.weights_scheduler = (
            None if self._make_weights_scheduler is None else self._make_weights_scheduler(weights_optimizer)
        )

    def grow(self, *, new_cells: int, width_factor: int, seed: int) -> None:
        """Replaces the supernet by its grown copy (new modules initialized under ``seed``), the optimizers' and the
        schedule's state carried over."""
        step = self.step
        old_net, old_optimizers = step.supernet, (step.weights_optimizer, step.arch_optimizer)
        old_scheduler = self.weights_scheduler
        grown, old_name = grow_supernet(old_net, new_cells=new_cells, width_factor=width_factor, seed=seed)
        self.use(grown)
        if old_scheduler is not None:
            self.weights_scheduler.load_state_dict(old_scheduler.state_dict())
        for old, new in zip(old_optimizers, (step.weights_optimizer, step.arch_optimizer)):
            rebind_optimizer(old, new, old_net, grown, old_name, width_factor)
        old_net.use_op_graphs(False)  # its graphs' pools become free for the grown supernet's captures

    def state_dict(self) -> dict[str, Any]:
        step = self.step
        return {
            "structure": step.supernet.structure.to_dict(),
            "supernet": step.supernet.state_dict(),
            "weights_optimizer": step.weights_optimizer.state_dict(),
            "arch_optimizer": step.arch_optimizer.state_dict(),
            "weights_scheduler": None if self.weights_scheduler is None else self.weights_scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A ``state_dict()``: the supernet regrown to the saved structure first where it differs."""
        structure = SupernetStructure.from_dict(state["structure"])
        if structure != self.step.supernet.structure:
            self.use(self.step.supernet.with_structure(structure))
        self.step.supernet.load_state_dict(state["supernet"])
        self.step.weights_optimizer.load_state_dict(state["weights_optimizer"])
        self.step.arch_optimizer.load_state_dict(state["arch_optimizer"])
        if self.weights_scheduler is not None:
            self.weights_scheduler.load_state_dict(state["weights_scheduler"])
