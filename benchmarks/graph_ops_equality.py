"""Is the search step with per-op CUDA graphs (``search.graph_ops``) the eager step? Two ways, small supernet.

* Free run: two engines (graphed and eager, or eager twice as the control) from the same seed, six steps each;
  the relative difference of their losses per step.
* Lockstep: before each step the graphed engine is set to the eager one's state (weights, α, optimizers,
  generator); the step's loss, α and every weight gradient are compared, the worst gradient named. This separates
  a wrong replay (a large per-step error) from cuDNN's non-deterministic algorithms amplified over steps.

``python benchmarks/graph_ops_equality.py [--deterministic] [--control]`` on a GPU (RESULTS.md, "Graphs per op").
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages (and tests/, for its helpers) live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.data import MNIST5kData  # noqa: E402
from search_space.ops import DARTS_PRIMITIVES  # noqa: E402
from search_space.space import SearchSpace  # noqa: E402
from tests.aso_se.helpers import make_engine, tiny_supernet  # noqa: E402

SPACE = SearchSpace(DARTS_PRIMITIVES)
NEURONS = (("relu", 1), ("st_bif_qann", 1), ("st_bif", 2), ("lif", 2))


class NoGraphs:
    replays = captured = failed = 0


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    loader, _ = MNIST5kData(max_train_samples=64).search_loaders(16, seed=0)
    loader.set_epoch(0)
    return next(iter(loader))


def build(neuron: str, timesteps: int, graph_ops: bool, device: str):
    supernet = tiny_supernet(neuron, timesteps=timesteps, space=SPACE, channels=8, in_channels=1)
    return make_engine(supernet, device=device, graph_ops=graph_ops)


def step(engine, batch) -> torch.Tensor:
    images, labels = batch
    scalars = engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0,
                                entropy_weight=0.01)
    return torch.stack([scalars["loss"], scalars["arch_loss"]]).cpu()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def free_run(neuron, timesteps, graph_ops, batch, device, steps=6) -> list[float]:
    a, b = build(neuron, timesteps, graph_ops, device), build(neuron, timesteps, False, device)
    return [relative(step(a, batch), step(b, batch)) for _ in range(steps)]


def lockstep(neuron, timesteps, graph_ops, batch, device, steps=8) -> list[tuple]:
    eager, other = build(neuron, timesteps, False, device), build(neuron, timesteps, graph_ops, device)
    graphs = other.supernet.op_graphs or NoGraphs()
    rows = []
    for index in range(steps):
        other.load_state_dict(copy.deepcopy(eager.state_dict()))
        replays = graphs.replays
        loss_eager, loss_other = step(eager, batch), step(other, batch)
        worst = ("", 0.0)
        for (name, p), (_, q) in zip(eager.supernet.named_parameters(), other.supernet.named_parameters()):
            if p.grad is None and q.grad is None:
                continue
            if (p.grad is None) != (q.grad is None):
                worst = (f"{name}: a gradient on one side only", float("inf"))
                break
            error = relative(q.grad, p.grad)
            if error > worst[1]:
                worst = (name, error)
        alpha = max(relative(q, p) for p, q in zip(eager.supernet.arch_parameters(), other.supernet.arch_parameters()))
        rows.append((index, relative(loss_other, loss_eager), alpha, worst[1], worst[0], graphs.replays - replays,
                     graphs.captured, graphs.failed))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deterministic", action="store_true", help="cuDNN's deterministic algorithms")
    parser.add_argument("--control", action="store_true", help="also eager vs eager in lockstep")
    parser.add_argument("--device", default="cuda", help="cpu: graphs off (a dry run of the script)")
    args = parser.parse_args()
    torch.backends.cudnn.deterministic = args.deterministic
    batch = digits()
    graph_ops = args.device != "cpu"
    for neuron, timesteps in NEURONS:
        print(f"== {neuron} T={timesteps} cudnn.deterministic={args.deterministic}")
        print("free run, eager vs eager, relative loss difference per step:",
              " ".join(f"{v:.1e}" for v in free_run(neuron, timesteps, False, batch, args.device)))
        print("free run, graphs vs eager:", " ".join(f"{v:.1e}" for v in free_run(neuron, timesteps, graph_ops, batch,
                                                                                   args.device)))
        arms = [("eager/eager", False)] if args.control else []
        for label, graphed in [*arms, ("graphs/eager", graph_ops)]:
            for row in lockstep(neuron, timesteps, graphed, batch, args.device):
                print(f"lockstep {label} step %d: loss %.1e, alpha %.1e, worst gradient %.1e (%s); "
                      "replays %d, captured %d, failed %d" % row)


if __name__ == "__main__":
    main()
