"""Spike-domain fine-tuning on a CUDA GPU: BPTT through the fused Triton ST-BIF kernel equals BPTT through the torch
reference neuron, and the fine-tuning Retrainer's CUDA-graph steps train as its eager ones.
Run with `pytest -m gpu tests/aso_se/train/test_snn_finetune_gpu.py`."""
import functools

import pytest
import torch

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.snn_finetune import FinetuneSettings, finetune_trainer
from search_space.genotypes import GENOTYPES
from search_space.trainable_snn import trainable_snn, with_neuron_backend
from tests.aso_se.train.test_graphed_step_gpu import Batches, random_batches
from tests.search_space.test_qann import qann_network
from tests.search_space.test_trainable_snn import loss_and_grads

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def exact_fp32(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


@pytest.mark.parametrize("timesteps", [1, 4, 8])
def test_triton_bptt_equals_reference_bptt_on_the_gpu(exact_fp32, timesteps):
    qann = qann_network(GENOTYPES["DARTS_V2"], seed=3, level=4, sym=False).cuda()
    snn = trainable_snn(qann, timesteps)
    x = torch.randn(8, 2, 12, 12, device="cuda")
    labels = torch.arange(8, device="cuda") % 5
    (ref_loss, ref), (loss, got) = (loss_and_grads(with_neuron_backend(snn, backend), x, labels)
                                    for backend in ("torch", "triton"))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    assert any(g.abs().max() > 0 for name, g in ref.items() if "q_threshold" in name)
    for name, grad in got.items():
        torch.testing.assert_close(grad, ref[name], rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize("early", [None, 2], ids=["at_t", "with_early_readout"])
def test_graphed_fine_tuning_trains_as_eager(exact_fp32, early):
    """Two epochs of the fine-tuning Retrainer at T = 4 (fused kernel), CUDA graphs against eager from the same
    QANN: the same losses and accuracies, and weights within rounding (with the early readout's hooks too)."""
    qann = qann_network(GENOTYPES["DARTS_V2"], seed=4, level=4, sym=False).cuda()
    settings = FinetuneSettings(epochs=2, timesteps=4, lr=0.01, early_timesteps=early)
    sgd = functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9)
    trainers = [finetune_trainer(qann, settings, optimizer=sgd, grad_clip=5.0, precision="fp32",
                                 ctx=DistributedContext(torch.device("cuda")), log_every_n_steps=100,
                                 cuda_graph=graphed) for graphed in (False, True)]
    train = random_batches([16] * 6, (2, 12, 12), 5, seed=5)
    test = random_batches([16] * 2, (2, 12, 12), 5, seed=6)
    for trainer in trainers:
        assert trainer.fit(Batches(train), Batches(test))
    eager, graphed = trainers
    assert graphed.graphed_step.captures >= 1 and graphed.graphed_step.replays >= 1
    for a, b in zip(eager.history, graphed.history):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)
        assert b["test_acc"] == a["test_acc"]
    for (name, p), q in zip(eager.network.named_parameters(), graphed.network.parameters()):
        error = ((q - p).norm() / p.norm().clamp_min(1e-12)).item()
        assert error < 1e-3, name
