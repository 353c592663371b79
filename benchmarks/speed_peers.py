"""Speed case peers: quark0/darts's retrain step and PC-DARTS's search step beside ours, same GPU, same batches.

    python benchmarks/speed.py --case peers --darts-dir .peers/darts/cnn --pc-darts-dir .peers/PC-DARTS
    python benchmarks/speed.py --case peers --darts-dir .peers/darts/cnn --peers darts --retrain-rows fp32:nchw:eager
    python benchmarks/speed.py --case peers --darts-dir ... --pc-darts-dir ... --tiny   # CPU smoke run (no rows)

Why: issue 98 asks where our steps stand against the code the field runs, side by side in one process on one GPU,
each peer run from its own checkout with only the changes today's PyTorch needs. Their code is never committed here:
benchmarks/peers_setup.md fetches it into the ignored folder .peers/, and this case imports it from the folders given.

Retrain (``--darts-dir``, the cnn folder of quark0/darts): the ``train`` function of its train.py, run on a list of
one device-resident batch repeated (its loop moves each batch with ``.cuda()``, a no-op there), so no input pipeline
is timed, as in ours. Its network is its ``model.NetworkCIFAR`` of ``genotypes.DARTS_V2``, 20 cells × 36 channels, the
auxiliary head at weight 0.4 (its README's ``--auxiliary``), its SGD (momentum 0.9, weight decay 3e-4), clipping at 5
and its batch of 96, fp32, eager; its step also reads the loss and top-1/top-5 accuracy to the host, as it does in
training. Beside it, in rows of ``--retrain-rows``: our ``Retrainer`` step of the same genotype and size
(speed_retrain_step's, with our QANN neuron unless the row names another) at the same batch, first at the same
precision (fp32, NCHW, eager), then at our fast settings (fp16, channels_last, a CUDA graph replay). Both networks
drop paths with speed_retrain_step's probability, the middle of DARTS's ramp to 0.2.

Search (``--pc-darts-dir``, the root of a PC-DARTS checkout): the ``train`` function of its train_search.py at its
last epoch (its α steps run from its 16th epoch on), where each step is an α step on a second batch (its
``architect.Architect``, first order as its default) then a weight step, on its ``model_search.Network`` (8 cells ×
16 channels, every op on a quarter of the channels) at its batch of 256 per split. Beside it, rows of
speed_search_step's ``ROWS`` (``--search-rows``): our ASO-SE search step (an α step and a weight step; the two sampled
ops of each edge on all channels) of the same size on the same two batches, as our QANN search runs it and with ReLU
(the peer's neuron). Images/s count both batches, as speed_search_step does.

Each row: the median over ``--repeats`` runs of ``--steps`` steps (synced at the end of each run) of the wall time per
step, its images/s, our rows' images/s over the peer's, and the peak GPU memory.

The peers' files stay as fetched. Each is imported under a module name of its own (``_peer_darts_model``,
``_peer_pc_darts_model_search``, ...): the two peers' model.py, genotypes.py, operations.py and utils.py collide
neither with each other nor with ours. The edits today's PyTorch needs are made to the source text in memory as it is
imported (``PATCHES``, each with its reason); the rows' notes name those made. Of the scripts, only the imports, the
argument parser (its defaults but the sizes set here) and ``train`` run: not their top level, which parses the
command line and makes an experiment folder.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import functools
import gc
import importlib.abc
import importlib.util
import io
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rows import REPO, Measurement
from benchmarks.speed_retrain_step import DROP_PATH_PROB, retrain_trainer, sync
from benchmarks.speed_search_step import ROWS as SEARCH_ROWS
from benchmarks.speed_search_step import make_engine
from search_space.errors import UserInputError
from search_space.genotypes import load_genotype
from search_space.network import build_network
from search_space.neurons import NeuronFactory

SETUP = "benchmarks/peers_setup.md"
CIFAR_CLASSES = 10


@dataclass(frozen=True)
class Patch:
    """One edit to a peer's source text, made in memory as the file is read."""

    files: tuple[str, ...]
    old: str
    new: str
    why: str
    cpu_only: bool = False  # only for a CPU smoke run: the peers' code puts every tensor on CUDA


SCRIPTS = ("train.py", "train_search.py")
CODE = ("utils.py", "model.py", "model_search.py", "architect.py", *SCRIPTS)
# In order: the CPU edit of .cuda(non_blocking=True) reads the first edit's text.
PATCHES = (
    Patch(SCRIPTS, "async=True", "non_blocking=True",
          "async is a keyword since Python 3.7 (a SyntaxError); PyTorch's argument is non_blocking"),
    Patch(SCRIPTS, ".data[0]", ".item()",
          "a 0-dim tensor cannot be indexed since PyTorch 0.4 (IndexError); .item() reads the loss and accuracies"),
    Patch(("utils.py",), "correct[:k].view(-1)", "correct[:k].reshape(-1)",
          "the top-k hits are a transposed tensor: view(-1) fails for k > 1 (RuntimeError: view size is not "
          "compatible with input tensor's size and stride)"),
    Patch(CODE, ".cuda(non_blocking=True)", ".cpu()", "no CUDA in a CPU smoke run", cpu_only=True),
    Patch(CODE, ".cuda()", ".cpu()", "no CUDA in a CPU smoke run", cpu_only=True),
    Patch(("utils.py",), "torch.cuda.FloatTensor(", "torch.FloatTensor(",
          "the drop-path mask on the CPU in a CPU smoke run", cpu_only=True),
)


@dataclass(frozen=True)
class PeerSpec:
    label: str          # the module-name prefix and the --peers name
    name: str           # in the table and the rows
    option: str         # the command-line option of its folder
    where: str          # what that folder is
    modules: tuple[str, ...]   # its files that its code imports by bare name
    script: str


PEERS = {
    "darts": PeerSpec("darts", "quark0/darts", "--darts-dir", "the cnn folder of a quark0/darts checkout",
                      ("genotypes", "operations", "utils", "model"), "train.py"),
    "pc_darts": PeerSpec("pc_darts", "PC-DARTS", "--pc-darts-dir", "the root of a yuhuixu1993/PC-DARTS checkout",
                         ("genotypes", "operations", "utils", "model_search", "architect"), "train_search.py"),
}


class PeerCode:
    """One peer's folder: its files read with ``PATCHES`` applied and imported under names of their own."""

    def __init__(self, spec: PeerSpec, folder: Path | None, *, cpu: bool) -> None:
        if folder is None:
            raise UserInputError(f"{spec.option} is missing: pass {spec.option} <{spec.where}> ({SETUP} fetches it "
                                 f"into .peers/), or drop {spec.label} from --peers")
        for name in (*spec.modules, spec.script.removesuffix(".py")):
            if not (folder / f"{name}.py").is_file():
                raise UserInputError(f"{spec.option} {folder}: no {name}.py there; point it at {spec.where} "
                                     f"({SETUP})")
        self.spec, self.folder, self.cpu = spec, folder.resolve(), cpu
        self.modules: dict[str, object] = {}
        self.edits: dict[str, int] = {}   # "file: old → new" → how many times made

    def source(self, filename: str) -> str:
        text = (self.folder / filename).read_text()
        for patch in PATCHES:
            if filename in patch.files and (self.cpu or not patch.cpu_only) and patch.old in text:
                self.edits[f"{filename}: {patch.old} → {patch.new}"] = text.count(patch.old)
                text = text.replace(patch.old, patch.new)
        return text

    def unique(self, name: str) -> str:
        return f"_peer_{self.spec.label}_{name}"

    @contextlib.contextmanager
    def imports(self):
        """Inside, ``import utils`` (and its other own files) in this peer's code finds this peer's file, loaded
        once under ``unique(name)``; outside, those bare names are what they were (ours, the other peer's or none)."""
        shadowed = {name: sys.modules.pop(name) for name in self.spec.modules if name in sys.modules}
        sys.modules.update(self.modules)
        finder = _PeerFinder(self)
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)
            for name in self.spec.modules:
                sys.modules.pop(name, None)
            sys.modules.update(shadowed)

    def script(self, argv: list[str]) -> dict:
        """The parts of the peer's script a step needs, run as the script runs them: its imports, its argument
        parser (parsing ``argv``: its defaults but what the case sets) and its ``train`` function."""
        path = self.folder / self.spec.script
        tree = ast.parse(self.source(self.spec.script), filename=str(path))
        kept = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_parser(node)
                or isinstance(node, ast.FunctionDef) and node.name == "train"]
        if not any(isinstance(node, ast.FunctionDef) for node in kept) or not any(map(_is_parser, kept)):
            raise UserInputError(f"{path} has no top-level train function or argument parser: "
                                 f"{self.spec.option} expects {self.spec.where} ({SETUP})")
        namespace = {"__name__": self.unique(path.stem), "__file__": str(path)}
        with self.imports():
            exec(compile(ast.Module(body=kept, type_ignores=[]), str(path), "exec"), namespace)
        namespace["args"] = namespace["parser"].parse_args(argv)
        return namespace

    def commit(self) -> str:
        """The peer checkout's commit, if its folder is in a git checkout of its own (not this repository's)."""
        try:
            top = subprocess.run(["git", "-C", str(self.folder), "rev-parse", "--show-toplevel", "--short", "HEAD"],
                                 capture_output=True, text=True, check=True).stdout.split()
        except (OSError, subprocess.CalledProcessError):
            return ""
        return top[1] if len(top) == 2 and Path(top[0]).resolve() != REPO.resolve() else ""

    def note(self) -> str:
        commit = self.commit()
        edits = "; ".join(self.edits) or "none"
        return f"{self.spec.name} {'at ' + commit if commit else '(commit unknown)'}, edits in memory: {edits}"


def _is_parser(node: ast.stmt) -> bool:
    """``parser = argparse.ArgumentParser(...)`` or ``parser.add_argument(...)``."""
    if isinstance(node, ast.Assign):
        return [getattr(target, "id", None) for target in node.targets] == ["parser"]
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "add_argument"
            and getattr(node.value.func.value, "id", None) == "parser")


class _PeerFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a peer's own files by bare name and executes their patched text in a module of a unique name."""

    def __init__(self, peer: PeerCode) -> None:
        self.peer = peer

    def find_spec(self, fullname, path=None, target=None):
        if path is None and fullname in self.peer.spec.modules and fullname not in self.peer.modules:
            return importlib.util.spec_from_file_location(fullname, self.peer.folder / f"{fullname}.py", loader=self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        name = module.__spec__.name
        module.__name__ = self.peer.unique(name)  # its classes' __module__: no clash with the other peer's
        sys.modules[module.__name__] = self.peer.modules[name] = module
        exec(compile(self.peer.source(f"{name}.py"), module.__file__, "exec"), module.__dict__)


@dataclass(frozen=True)
class Timed:
    """A row's median wall time per step and its peak GPU memory."""

    seconds: float
    peak_gib: float


@dataclass(frozen=True)
class Row:
    section: str        # "retrain" or "search"
    who: str            # the peer's name, or "ours"
    what: str           # the step, network, batch, precision, layout and mode
    images: int         # images per step
    timed: Timed | None  # None: out of GPU memory
    note: str

    @property
    def peer(self) -> bool:
        return self.who != "ours"

    def images_per_second(self) -> float:
        return self.images / self.timed.seconds


def time_steps(run: Callable[[int], None], device: torch.device, args, *, warmup: int) -> Timed:
    """``run(n)`` runs n steps; the median seconds per step over ``args.repeats`` synced runs of ``args.steps``."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run(warmup)
    times = []
    for _ in range(args.repeats):
        sync(device)
        started = time.perf_counter()
        run(args.steps)
        sync(device)
        times.append((time.perf_counter() - started) / args.steps)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return Timed(statistics.median(times), peak)


def guarded(make_row: Callable[[], Row], section: str, who: str, what: str) -> Row | None:
    """``make_row()``, or a row without a time when the GPU runs out of memory, or None (and why, with the
    traceback) when the step fails: one failing step costs the other rows nothing."""
    try:
        return make_row()
    except torch.OutOfMemoryError:
        return Row(section, who, what, 0, None, "out of memory")
    except UserInputError:
        raise
    except Exception as error:
        traceback.print_exc()
        message = str(error).splitlines()[0] if str(error) else ""
        print(f"| {section} | {who}: {what} | failed: {type(error).__name__}: {message} | | | |", flush=True)
        return None
    finally:
        gc.collect()  # a trainer's graph and its memory pool sit in reference cycles
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def random_batch(batch: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, 32, 32, generator=generator)
    labels = torch.randint(CIFAR_CLASSES, (batch,), generator=generator)
    return images.to(device), labels.to(device)


# ----------------------------------------------------------------------------------------------- retrain
@dataclass(frozen=True)
class RetrainRow:
    precision: str
    layout: str
    mode: str
    neuron: str

    def label(self, args) -> str:
        return (f"ours, Retrainer step, {args.genotype} {args.layers}×{args.channels} {self.neuron}, aux, drop-path, "
                f"batch {args.retrain_batch}, {self.precision}, {self.layout}, "
                f"{'CUDA graph' if self.mode == 'graph' else 'eager'}")


def retrain_rows(text: str) -> list[RetrainRow]:
    rows = []
    for spec in filter(None, text.split(",")):
        parts = spec.split(":")
        if len(parts) not in (3, 4) or parts[0] not in ("fp32", "bf16", "fp16") or parts[1] not in ("nchw", "cl") \
                or parts[2] not in ("eager", "graph"):
            raise argparse.ArgumentTypeError(f"{spec!r} is not precision:layout:mode[:neuron], e.g. fp16:cl:graph "
                                             "(fp32|bf16|fp16, nchw|cl, eager|graph)")
        rows.append(RetrainRow(*parts[:3], parts[3] if len(parts) == 4 else "st_bif_qann"))
    return rows


def darts_row(peer: PeerCode, args, batch, device) -> Row:
    """quark0/darts's ``train`` on its NetworkCIFAR; the batch repeated as its train queue."""
    script = peer.script(["--batch_size", str(args.retrain_batch), "--layers", str(args.layers), "--init_channels",
                          str(args.channels), "--auxiliary", "--arch", args.genotype])
    theirs = getattr(script["genotypes"], args.genotype, None)
    if theirs is None or _cell(theirs) != _cell(load_genotype(args.genotype)):
        raise UserInputError(f"--genotype {args.genotype}: quark0/darts's genotypes.py has "
                             f"{'no such cell' if theirs is None else 'another cell of that name'}; use DARTS_V2")
    them = script["args"]
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):  # its cells print their channel counts
        model = script["Network"](them.init_channels, CIFAR_CLASSES, them.layers, them.auxiliary, theirs).to(device)
    model.drop_path_prob = DROP_PATH_PROB
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), them.learning_rate, momentum=them.momentum,
                                weight_decay=them.weight_decay)

    def run(steps: int) -> None:
        script["train"]([batch] * steps, model, criterion, optimizer)

    what = (f"{peer.spec.name} train.py step, NetworkCIFAR {args.genotype} {them.layers}×{them.init_channels}, aux "
            f"{them.auxiliary_weight:g}, drop-path, batch {them.batch_size}, fp32, nchw, eager")
    return Row("retrain", peer.spec.name, what, them.batch_size, time_steps(run, device, args, warmup=args.warmup),
               peer.note())


def _cell(genotype) -> tuple:
    return tuple((tuple(map(tuple, getattr(genotype, kind))), tuple(getattr(genotype, f"{kind}_concat")))
                 for kind in ("normal", "reduce"))


def ours_retrain_row(row: RetrainRow, args, batch, device) -> Row:
    torch.manual_seed(0)
    network = build_network(args.genotype, neuron=NeuronFactory(row.neuron, timesteps=1), channels=args.channels,
                            layers=args.layers, num_classes=CIFAR_CLASSES, auxiliary=True,
                            conv_backend=args.conv_backend)
    trainer = retrain_trainer(network, row.precision, row.layout == "cl", device, graph=row.mode == "graph")
    trainer.model.train()
    inputs, labels = trainer._to_device(batch[0]), batch[1]
    step = trainer.graphed_step or trainer.eager_step

    def run(steps: int) -> None:
        for _ in range(steps):
            step(inputs, labels)

    warmup = args.warmup if trainer.graphed_step is None else max(args.warmup, trainer.graphed_step.warmup_steps + 2)
    timed = time_steps(run, device, args, warmup=warmup)
    return Row("retrain", "ours", row.label(args), args.retrain_batch, timed,
               f"conv_backend={args.conv_backend}; device-resident batch, as the peer's")


# ----------------------------------------------------------------------------------------------- search
def pc_darts_row(peer: PeerCode, args, batches, device) -> Row:
    """PC-DARTS's ``train`` at its last epoch (α steps on): the weights' batch repeated as its train queue, the α
    batch as its search queue (it draws ``next(iter(valid_queue))`` each step)."""
    script = peer.script(["--batch_size", str(args.search_batch), "--layers", str(args.search_layers),
                          "--init_channels", str(args.search_channels)])
    them = script["args"]
    torch.manual_seed(0)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    model = script["Network"](them.init_channels, CIFAR_CLASSES, them.layers, criterion).to(device)
    optimizer = torch.optim.SGD(model.parameters(), them.learning_rate, momentum=them.momentum,
                                weight_decay=them.weight_decay)
    architect = script["Architect"](model, them)
    weights_batch, arch_batch = batches

    def run(steps: int) -> None:
        script["train"]([weights_batch] * steps, [arch_batch], model, architect, criterion, optimizer,
                        them.learning_rate, them.epochs - 1)

    order = "second-order" if them.unrolled else "first-order"
    what = (f"{peer.spec.name} train_search.py step ({order} α step + weight step), {them.layers}×"
            f"{them.init_channels}, partial channels, batch {them.batch_size} per split, fp32, eager")
    return Row("search", peer.spec.name, what, 2 * them.batch_size,
               time_steps(run, device, args, warmup=args.warmup), peer.note())


def ours_search_row(number: int, args, batches, device) -> Row:
    row = SEARCH_ROWS[number - 1]
    engine = make_engine(row, args.search_channels, args.search_layers, device)
    layout = torch.channels_last if row.channels_last else torch.contiguous_format
    weights_batch, arch_batch = ((images.to(memory_format=layout), labels) for images, labels in batches)
    step = functools.partial(engine.train_step, weights_batch, arch_batch, temperature=1.0, entropy_weight=0.0,
                             next_temperature=1.0 if row.draw_ahead else None)

    def run(steps: int) -> None:
        for _ in range(steps):
            step()

    timed = time_steps(run, device, args, warmup=args.warmup)
    what = (f"ours, ASO-SE search step, {row.name}, {args.search_layers}×{args.search_channels}, "
            f"batch {args.search_batch} per split, {row.precision}")
    return Row("search", "ours", what, 2 * args.search_batch, timed, f"speed_search_step row {number}")


def search_rows(text: str) -> list[int]:
    try:
        numbers = [int(part) for part in text.split(",") if part]
    except ValueError:
        numbers = [0]
    if not all(1 <= number <= len(SEARCH_ROWS) for number in numbers):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of speed_search_step row numbers "
                                         f"(1 … {len(SEARCH_ROWS)})")
    return numbers


# ----------------------------------------------------------------------------------------------- report
def print_row(row: Row, peer: Row | None) -> None:
    if row.timed is None:
        print(f"| {row.section} | {row.who}: {row.what} | {row.note} | | | |", flush=True)
        return
    ratio = f"{row.images_per_second() / peer.images_per_second():.2f}" if peer and not row.peer and peer.timed else ""
    print(f"| {row.section} | {row.what} | {row.timed.seconds * 1e3:.1f} | {row.images_per_second():,.0f} | {ratio} | "
          f"{row.timed.peak_gib:.1f} |", flush=True)


def measurements(rows: list[Row], peers: dict[str, Row]) -> list[Measurement]:
    """Each timed row's throughput, step time and peak memory; each of our rows' throughput over its peer's."""
    found = []
    for row in rows:
        if row.timed is None:
            continue
        found += [Measurement("peers", f"{row.what}: throughput", round(row.images_per_second()), "images/s",
                              row.note),
                  Measurement("peers", f"{row.what}: step", round(row.timed.seconds * 1e3, 2), "ms", row.note)]
        peer = peers.get(row.section)
        if not row.peer and peer is not None and peer.timed is not None:
            found.append(Measurement("peers", f"{row.what}: throughput / {peer.who}'s",
                                     round(row.images_per_second() / peer.images_per_second(), 2), "x",
                                     "same process, GPU and batches"))
        if row.timed.peak_gib:
            found.append(Measurement("peers", f"{row.what}: peak memory", round(row.timed.peak_gib, 2), "GiB"))
    return found


def main(argv: list[str] | None = None) -> list[Measurement]:
    parser = argparse.ArgumentParser(prog="speed.py --case peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--darts-dir", type=Path, help="the cnn folder of a quark0/darts checkout, e.g. "
                        f".peers/darts/cnn ({SETUP})")
    parser.add_argument("--pc-darts-dir", type=Path, help="the root of a yuhuixu1993/PC-DARTS checkout, e.g. "
                        ".peers/PC-DARTS")
    parser.add_argument("--peers", default="darts,pc_darts", help="comma-separated: darts (the retrain step), "
                        "pc_darts (the search step)")
    parser.add_argument("--retrain-rows", type=retrain_rows, help="our retrain rows, precision:layout:mode[:neuron] "
                        "comma-separated (default fp32:nchw:eager,fp16:cl:graph; neuron st_bif_qann, e.g. "
                        "fp32:nchw:eager:relu)")
    parser.add_argument("--search-rows", type=search_rows, default=[9, 7],
                        help="our search rows: speed_search_step's row numbers (default 9,7: the QANN search at T = 1 "
                        "and ReLU, both top-2)")
    parser.add_argument("--genotype", default="DARTS_V2")
    parser.add_argument("--layers", type=int, default=20, help="retrain cells (quark0/darts train.py's default)")
    parser.add_argument("--channels", type=int, default=36, help="retrain channels (its default)")
    parser.add_argument("--retrain-batch", type=int, default=96, help="its train.py's default batch")
    parser.add_argument("--conv-backend", default="torch",
                        help="our retrain network's (experiment=cifar10_qann_fast's)")
    parser.add_argument("--search-layers", type=int, default=8, help="PC-DARTS train_search.py's default")
    parser.add_argument("--search-channels", type=int, default=16, help="its default")
    parser.add_argument("--search-batch", type=int, default=256, help="per split, its default")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: 3 cells × 8 channels, batch 4, 2 steps, "
                        "our fp32 eager rows")
    args = parser.parse_args(argv)
    chosen = [name for name in args.peers.split(",") if name]
    unknown = [name for name in chosen if name not in PEERS]
    if unknown:
        raise UserInputError(f"--peers {args.peers}: {unknown[0]!r} is not one of {', '.join(PEERS)}")
    if args.tiny:
        args.layers = args.search_layers = 3
        args.channels = args.search_channels = 8
        args.retrain_batch = args.search_batch = 4
        args.warmup, args.steps, args.repeats = 1, 2, 1
        args.retrain_rows = args.retrain_rows or retrain_rows("fp32:nchw:eager,fp32:cl:eager")
    args.retrain_rows = args.retrain_rows or retrain_rows("fp32:nchw:eager,fp16:cl:graph")
    for name in ("layers", "channels", "retrain_batch", "search_layers", "search_channels", "search_batch", "steps",
                 "repeats"):
        if getattr(args, name) < 1:
            raise UserInputError(f"--{name.replace('_', '-')} must be a positive integer")
    device = torch.device("cpu" if args.tiny else "cuda")
    if not args.tiny and not torch.cuda.is_available():
        raise UserInputError("peers times a GPU's steps: run it with CUDA, or pass --tiny (a CPU smoke run)")
    folders = {"darts": args.darts_dir, "pc_darts": args.pc_darts_dir}
    peers = {name: PeerCode(PEERS[name], folders[name], cpu=device.type == "cpu") for name in chosen}
    torch.backends.cudnn.benchmark = True
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{datetime.date.today()} {gpu}, torch {torch.__version__}; random batches, device-resident; "
          f"{args.steps} steps × {args.repeats} runs after {args.warmup}")
    print("| section | step | ms / step | images/s | ours / peer | peak GiB |\n|---|---|---:|---:|---:|---:|")
    rows: list[Row] = []
    baseline: dict[str, Row] = {}

    def add(row: Row | None) -> None:
        if row is None:
            return
        if row.peer:
            baseline[row.section] = row
        rows.append(row)
        print_row(row, baseline.get(row.section))

    if "darts" in peers:
        darts, batch = peers["darts"], random_batch(args.retrain_batch, 0, device)
        add(guarded(lambda: darts_row(darts, args, batch, device), "retrain", darts.spec.name, "train.py step"))
        for spec in args.retrain_rows:
            add(guarded(lambda: ours_retrain_row(spec, args, batch, device), "retrain", "ours", spec.label(args)))
    if "pc_darts" in peers:
        pc_darts = peers["pc_darts"]
        batches = (random_batch(args.search_batch, 1, device), random_batch(args.search_batch, 2, device))
        add(guarded(lambda: pc_darts_row(pc_darts, args, batches, device), "search", pc_darts.spec.name,
                    "train_search.py step"))
        for number in args.search_rows:
            add(guarded(lambda: ours_search_row(number, args, batches, device), "search", "ours",
                        f"ours, ASO-SE search step, {SEARCH_ROWS[number - 1].name}"))
    for peer in peers.values():
        print(f"peer code: {peer.note()}")
    return measurements(rows, baseline)


if __name__ == "__main__":
    main()
