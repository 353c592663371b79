"""The peers speed case (benchmarks/speed_peers.py) on a CPU, against stand-ins of the peers written here: the
constructors, forward outputs and ``train`` functions of quark0/darts's NetworkCIFAR and train.py and of PC-DARTS's
model_search.Network, Architect and train_search.py, in their PyTorch-0.3 spelling. So CI needs neither network nor the
real peers: the smoke run times each peer beside our steps, the in-memory edits make their old code run, their files
stay as they are, their modules collide neither with each other nor with ours, and bad input is one line."""
from __future__ import annotations

import sys
import types

import pytest

from benchmarks import speed, speed_peers
from search_space.genotypes import GENOTYPES

# The parts both peers' utils.py share (with the transposed top-k view and the CUDA-only drop-path mask).
UTILS = """
import torch
from torch.autograd import Variable


class AvgrageMeter(object):

  def __init__(self):
    self.avg = self.sum = self.cnt = 0

  def update(self, val, n=1):
    self.sum += val * n
    self.cnt += n
    self.avg = self.sum / self.cnt


def accuracy(output, target, topk=(1,)):
  maxk = max(topk)
  _, pred = output.topk(maxk, 1, True, True)
  pred = pred.t()
  correct = pred.eq(target.view(1, -1).expand_as(pred))
  return [correct[:k].view(-1).float().sum(0).mul_(100.0 / target.size(0)) for k in topk]


def drop_path(x, drop_prob):
  if drop_prob > 0.:
    mask = Variable(torch.cuda.FloatTensor(x.size(0), 1, 1, 1).bernoulli_(1. - drop_prob))
    x.div_(1. - drop_prob)
    x.mul_(mask)
  return x
"""

DARTS_V2 = GENOTYPES["DARTS_V2"]
DARTS = {
    "genotypes.py": f"""
from collections import namedtuple
Genotype = namedtuple('Genotype', 'normal normal_concat reduce reduce_concat')
DARTS_V2 = Genotype(normal={list(DARTS_V2.normal)!r}, normal_concat={list(DARTS_V2.normal_concat)!r},
                    reduce={list(DARTS_V2.reduce)!r}, reduce_concat={list(DARTS_V2.reduce_concat)!r})
DARTS = DARTS_V2
""",
    "operations.py": """
import torch.nn as nn
OWNER = 'darts'

def conv_bn(C_in, C_out, stride):
  return nn.Sequential(nn.ReLU(inplace=False), nn.Conv2d(C_in, C_out, 3, stride, 1, bias=False), nn.BatchNorm2d(C_out))
""",
    "utils.py": UTILS,
    "model.py": """
import torch
import torch.nn as nn
from operations import *
from utils import drop_path


class NetworkCIFAR(nn.Module):

  def __init__(self, C, num_classes, layers, auxiliary, genotype):
    super(NetworkCIFAR, self).__init__()
    print(C, num_classes, layers)
    assert OWNER == 'darts'
    self._layers, self._auxiliary = layers, auxiliary
    self.stem = nn.Sequential(nn.Conv2d(3, 3 * C, 3, padding=1, bias=False), nn.BatchNorm2d(3 * C))
    self.cells = nn.ModuleList([conv_bn(3 * C if i == 0 else C, C, 2 if i in [layers // 3, 2 * layers // 3] else 1)
                                for i in range(layers)])
    self.auxiliary_head = nn.Linear(C, num_classes)
    self.classifier = nn.Linear(C, num_classes)

  def forward(self, input):
    logits_aux = None
    s = self.stem(input)
    for i, cell in enumerate(self.cells):
      s = drop_path(cell(s), self.drop_path_prob) if self.training else cell(s)
      if i == 2 * self._layers // 3 and self._auxiliary and self.training:
        logits_aux = self.auxiliary_head(s.mean([2, 3]))
    return self.classifier(s.mean([2, 3])), logits_aux
""",
    "train.py": """
import sys
import torch
import utils
import logging
import argparse
import torch.nn as nn
import genotypes

from torch.autograd import Variable
from model import NetworkCIFAR as Network

parser = argparse.ArgumentParser("cifar")
parser.add_argument('--batch_size', type=int, default=96, help='batch size')
parser.add_argument('--learning_rate', type=float, default=0.025, help='init learning rate')
parser.add_argument('--momentum', type=float, default=0.9, help='momentum')
parser.add_argument('--weight_decay', type=float, default=3e-4, help='weight decay')
parser.add_argument('--report_freq', type=float, default=50, help='report frequency')
parser.add_argument('--init_channels', type=int, default=36, help='num of init channels')
parser.add_argument('--layers', type=int, default=20, help='total number of layers')
parser.add_argument('--auxiliary', action='store_true', default=False, help='use auxiliary tower')
parser.add_argument('--auxiliary_weight', type=float, default=0.4, help='weight for auxiliary loss')
parser.add_argument('--arch', type=str, default='DARTS', help='which architecture to use')
parser.add_argument('--grad_clip', type=float, default=5, help='gradient clipping')
args = parser.parse_args()
raise SystemExit('the top level of train.py ran')


def train(train_queue, model, criterion, optimizer):
  objs = utils.AvgrageMeter()
  top1 = utils.AvgrageMeter()
  model.train()

  for step, (input, target) in enumerate(train_queue):
    input = Variable(input).cuda()
    target = Variable(target).cuda(async=True)

    optimizer.zero_grad()
    logits, logits_aux = model(input)
    loss = criterion(logits, target)
    if args.auxiliary:
      loss += args.auxiliary_weight*criterion(logits_aux, target)
    loss.backward()
    nn.utils.clip_grad_norm(model.parameters(), args.grad_clip)
    optimizer.step()

    prec1, prec5 = utils.accuracy(logits, target, topk=(1, 5))
    objs.update(loss.data[0], input.size(0))
    top1.update(prec1.data[0], input.size(0))
  return top1.avg, objs.avg


if __name__ == '__main__':
  main()
""",
}

PC_DARTS = {
    "genotypes.py": """
from collections import namedtuple
Genotype = namedtuple('Genotype', 'normal normal_concat reduce reduce_concat')
PRIMITIVES = ['none', 'max_pool_3x3', 'skip_connect', 'sep_conv_3x3']
""",
    "operations.py": """
import torch.nn as nn
OWNER = 'pc_darts'
""",
    "utils.py": UTILS,
    "model_search.py": """
import torch
import torch.nn as nn
import torch.nn.functional as F
from operations import *
from torch.autograd import Variable
from genotypes import PRIMITIVES


class Network(nn.Module):

  def __init__(self, C, num_classes, layers, criterion, steps=4, multiplier=4, stem_multiplier=3):
    super(Network, self).__init__()
    assert OWNER == 'pc_darts'
    self._criterion = criterion
    self.stem = nn.Sequential(nn.Conv2d(3, C, 3, padding=1, bias=False), nn.BatchNorm2d(C))
    self.cells = nn.ModuleList([nn.ModuleList([nn.Conv2d(C, C, 3, padding=1, bias=False) for _ in PRIMITIVES])
                                for _ in range(layers)])
    self.classifier = nn.Linear(C, num_classes)
    self.alphas_normal = Variable(1e-3*torch.randn(layers, len(PRIMITIVES)).cuda(), requires_grad=True)
    self._arch_parameters = [self.alphas_normal]

  def forward(self, input):
    s = self.stem(input)
    for ops, weights in zip(self.cells, F.softmax(self.alphas_normal, dim=-1)):
      s = sum(w * op(s) for w, op in zip(weights, ops))
    return self.classifier(s.mean([2, 3]))

  def _loss(self, input, target):
    return self._criterion(self(input), target)

  def arch_parameters(self):
    return self._arch_parameters
""",
    "architect.py": """
import torch


class Architect(object):

  def __init__(self, model, args):
    self.model = model
    self.optimizer = torch.optim.Adam(self.model.arch_parameters(),
        lr=args.arch_learning_rate, betas=(0.5, 0.999), weight_decay=args.arch_weight_decay)

  def step(self, input_train, target_train, input_valid, target_valid, eta, network_optimizer, unrolled):
    self.optimizer.zero_grad()
    assert not unrolled
    self.model._loss(input_valid, target_valid).backward()
    self.optimizer.step()
""",
    "train_search.py": """
import torch
import utils
import argparse
import torch.nn as nn

from torch.autograd import Variable
from model_search import Network
from architect import Architect

parser = argparse.ArgumentParser("cifar")
parser.add_argument('--batch_size', type=int, default=256, help='batch size')
parser.add_argument('--learning_rate', type=float, default=0.1, help='init learning rate')
parser.add_argument('--momentum', type=float, default=0.9, help='momentum')
parser.add_argument('--weight_decay', type=float, default=3e-4, help='weight decay')
parser.add_argument('--report_freq', type=float, default=50, help='report frequency')
parser.add_argument('--epochs', type=int, default=50, help='num of training epochs')
parser.add_argument('--init_channels', type=int, default=16, help='num of init channels')
parser.add_argument('--layers', type=int, default=8, help='total number of layers')
parser.add_argument('--grad_clip', type=float, default=5, help='gradient clipping')
parser.add_argument('--unrolled', action='store_true', default=False, help='use one-step unrolled validation loss')
parser.add_argument('--arch_learning_rate', type=float, default=6e-4, help='learning rate for arch encoding')
parser.add_argument('--arch_weight_decay', type=float, default=1e-3, help='weight decay for arch encoding')
args = parser.parse_args()
raise SystemExit('the top level of train_search.py ran')


def train(train_queue, valid_queue, model, architect, criterion, optimizer, lr, epoch):
  objs = utils.AvgrageMeter()

  for step, (input, target) in enumerate(train_queue):
    model.train()
    n = input.size(0)
    input = Variable(input, requires_grad=False).cuda()
    target = Variable(target, requires_grad=False).cuda(async=True)

    input_search, target_search = next(iter(valid_queue))
    input_search = Variable(input_search, requires_grad=False).cuda()
    target_search = Variable(target_search, requires_grad=False).cuda(async=True)

    if epoch>=15:
      architect.step(input, target, input_search, target_search, lr, optimizer, unrolled=args.unrolled)

    optimizer.zero_grad()
    logits = model(input)
    loss = criterion(logits, target)

    loss.backward()
    nn.utils.clip_grad_norm(model.parameters(), args.grad_clip)
    optimizer.step()

    prec1, prec5 = utils.accuracy(logits, target, topk=(1, 5))
    objs.update(loss.data[0], n)
  return objs.avg, objs.avg
""",
}
BARE = ("genotypes", "operations", "utils", "model", "model_search", "architect")


@pytest.fixture
def peers(tmp_path):
    """Stand-ins of the two checkouts: darts's cnn folder and PC-DARTS's root."""
    folders = {}
    for name, files in (("darts", DARTS), ("PC-DARTS", PC_DARTS)):
        folder = tmp_path / name
        folder.mkdir()
        for filename, text in files.items():
            (folder / filename).write_text(text)
        folders[name] = folder
    return folders["darts"], folders["PC-DARTS"]


def test_the_smoke_run_times_each_peer_beside_ours(peers, tmp_path, monkeypatch, capsys):
    darts, pc_darts = peers
    before = {path: path.read_bytes() for folder in peers for path in folder.iterdir()}
    ours = types.ModuleType("utils")  # a bare name the peers' code also imports: it must stay ours
    monkeypatch.setitem(sys.modules, "utils", ours)
    monkeypatch.setattr(speed, "RESULTS", tmp_path / "results")
    assert speed.main(["--case", "peers", "--tiny", "--darts-dir", str(darts), "--pc-darts-dir", str(pc_darts)]) == 0
    out = capsys.readouterr().out
    table = [line.split(" | ") for line in out.splitlines() if line.startswith(("| retrain", "| search"))]
    assert [(cells[0], cells[1].split(",")[0]) for cells in table] == [
        ("| retrain", "quark0/darts train.py step"), ("| retrain", "ours"), ("| retrain", "ours"),
        ("| search", "PC-DARTS train_search.py step (first-order α step + weight step)"), ("| search", "ours"),
        ("| search", "ours")]
    assert "NetworkCIFAR DARTS_V2 3×8, aux 0.4, drop-path, batch 4, fp32, nchw, eager" in table[0][1]
    assert table[1][1].endswith("batch 4, fp32, nchw, eager") and table[2][1].endswith("batch 4, fp32, cl, eager")
    assert "top-2, ST-BIF QANN (T = 1), 3×8, batch 4 per split" in table[4][1] and "ReLU" in table[5][1]
    assert table[0][4] == "" and all(float(cells[4]) > 0 for cells in table[1:3] + table[4:])  # ours / the peer
    assert "8 10 3" not in out  # what the peer's constructor prints is kept out of the table
    rows = [line for line in out.splitlines() if line.startswith("peers | ")]
    assert any(": throughput / quark0/darts's | " in line for line in rows)
    assert any(": throughput / PC-DARTS's | " in line for line in rows)
    darts_note = next(line for line in out.splitlines() if line.startswith("peer code: quark0/darts"))
    assert darts_note == ("peer code: quark0/darts (commit unknown), edits in memory: train.py: async=True → "
                          "non_blocking=True; train.py: .data[0] → .item(); train.py: .cuda(non_blocking=True) → "
                          ".cpu(); train.py: .cuda() → .cpu(); utils.py: correct[:k].view(-1) → "
                          "correct[:k].reshape(-1); utils.py: torch.cuda.FloatTensor( → torch.FloatTensor(")
    assert "model_search.py: .cuda() → .cpu()" in out
    assert not (tmp_path / "results").exists()  # a smoke run writes no rows
    assert {path: path.read_bytes() for folder in peers for path in folder.iterdir()} == before  # files as fetched
    # each peer's modules under names of their own; the bare names are ours again (or gone)
    assert sys.modules["utils"] is ours and not [name for name in BARE if name != "utils" and name in sys.modules]
    assert sys.modules["_peer_darts_operations"].OWNER == "darts"
    assert sys.modules["_peer_pc_darts_operations"].OWNER == "pc_darts"
    assert sys.modules["_peer_darts_model"].NetworkCIFAR.__module__ == "_peer_darts_model"
    assert sys.modules["_peer_darts_utils"] is not sys.modules["_peer_pc_darts_utils"]


def test_edits_are_made_in_memory_and_the_cpu_ones_only_on_a_cpu(peers):
    darts, _ = peers
    on_gpu = speed_peers.PeerCode(speed_peers.PEERS["darts"], darts, cpu=False)
    text = on_gpu.source("train.py")
    assert "cuda(non_blocking=True)" in text and "loss.item()" in text and "async" not in text and ".cuda()" in text
    assert on_gpu.edits == {"train.py: async=True → non_blocking=True": 1, "train.py: .data[0] → .item()": 2}
    assert "torch.cuda.FloatTensor(" in on_gpu.source("utils.py") and "reshape(-1)" in on_gpu.source("utils.py")
    on_cpu = speed_peers.PeerCode(speed_peers.PEERS["darts"], darts, cpu=True)
    assert ".cuda" not in on_cpu.source("train.py") and "torch.FloatTensor(" in on_cpu.source("utils.py")
    assert (darts / "train.py").read_text() == DARTS["train.py"]


def test_a_failing_peer_loses_its_row_not_ours(peers, tmp_path, monkeypatch, capsys):
    darts, _ = peers
    (darts / "model.py").write_text(DARTS["model.py"].replace("return self.classifier(",
                                                              "raise RuntimeError('old code')  # "))
    monkeypatch.setattr(speed, "RESULTS", tmp_path / "results")
    assert speed.main(["--case", "peers", "--tiny", "--peers", "darts", "--darts-dir", str(darts),
                       "--retrain-rows", "fp32:nchw:eager"]) == 0
    out = capsys.readouterr().out
    assert "| retrain | quark0/darts: train.py step | failed: RuntimeError: old code | | | |" in out
    ours = [line for line in out.splitlines() if line.startswith("| retrain | ours")]
    assert len(ours) == 1 and ours[0].split(" | ")[4] == ""  # timed, without a peer to divide by


def test_bad_input_is_one_line(peers, capsys):
    darts, pc_darts = peers
    assert speed.main(["--case", "peers", "--tiny", "--pc-darts-dir", str(pc_darts), "--rows-out", ""]) == 2
    assert capsys.readouterr().err.strip() == (
        "speed.py --case peers: --darts-dir is missing: pass --darts-dir <the cnn folder of a quark0/darts checkout> "
        "(benchmarks/peers_setup.md fetches it into .peers/), or drop darts from --peers")
    assert speed.main(["--case", "peers", "--tiny", "--peers", "darts", "--darts-dir", str(pc_darts)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"speed.py --case peers: --darts-dir {pc_darts}: no model.py there; point it at the cnn folder of a "
        "quark0/darts checkout (benchmarks/peers_setup.md)")
    assert speed.main(["--case", "peers", "--darts-dir", str(darts), "--pc-darts-dir", str(pc_darts)]) == 2
    assert capsys.readouterr().err.strip() == ("speed.py --case peers: peers times a GPU's steps: run it with CUDA, "
                                               "or pass --tiny (a CPU smoke run)")
    assert speed.main(["--case", "peers", "--tiny", "--peers", "nasbench"]) == 2
    assert "'nasbench' is not one of darts, pc_darts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        speed.main(["--case", "peers", "--retrain-rows", "fp8:cl:graph"])
    assert "'fp8:cl:graph' is not precision:layout:mode[:neuron]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        speed.main(["--case", "peers", "--search-rows", "0"])
    assert "'0' is not a comma-separated list of speed_search_step row numbers" in capsys.readouterr().err
