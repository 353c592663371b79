"""The QANN -> ST-BIF SNN equivalence on a GPU, with the Triton neuron kernel (``pytest -m gpu``)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.st_bif import st_bif_multistep
from search_space.genotypes import GENOTYPES
from search_space.qann import QuantizedActivation, convert_to_snn, evaluate_snn
from tests.search_space.test_qann import ALL_OPS, ALL_OPS_GENOTYPES, qann_network

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GENOTYPE_CASES = pytest.mark.parametrize(
    "genotype", [*ALL_OPS_GENOTYPES, GENOTYPES["DARTS_V2"]],
    ids=[f"all_ops{i}" for i in range(len(ALL_OPS_GENOTYPES))] + ["darts_v2"],
)


@GENOTYPE_CASES
def test_triton_snn_summed_logits_equal_the_qann_logits(genotype) -> None:
    network = qann_network(genotype, seed=5).cuda()
    x = torch.randn(32, 2, 12, 12, device="cuda")
    labels = torch.randint(0, 5, (32,), device="cuda")
    result = evaluate_snn(network, [(x, labels)], device="cuda", max_timesteps=256)
    assert result.silent and result.prediction_agreement == 1.0
    qann_logits = network(x)[0]
    assert result.logit_max_abs_diff <= 1e-4 * qann_logits.abs().max().item()


@GENOTYPE_CASES
def test_fp64_on_cuda_is_exact(genotype) -> None:
    network = qann_network(genotype, seed=9).cuda()
    x = torch.randn(8, 2, 12, 12, device="cuda")
    result = evaluate_snn(network, [(x, torch.zeros(8, dtype=torch.long))], device="cuda", max_timesteps=256,
                          dtype=torch.float64)
    assert result.silent and result.logit_max_abs_diff <= 1e-9 and result.prediction_agreement == 1.0


def test_triton_snn_equals_the_reference_snn() -> None:
    network = qann_network(ALL_OPS, seed=6).cuda()
    x = torch.randn(16, 2, 12, 12, device="cuda")
    snn = convert_to_snn(network, 16)
    with torch.no_grad():
        triton_logits = snn(x)[0]
        for module in snn.modules():
            if hasattr(module, "backend") and module.backend == "auto":
                module.backend = "torch"
        torch_logits = snn(x)[0]
    assert torch.allclose(triton_logits, torch_logits, rtol=1e-5, atol=1e-5)


def test_one_triton_neuron_sums_to_the_quantized_total() -> None:
    torch.manual_seed(0)
    theta = 0.375
    quantizer = QuantizedActivation(theta, level=8, learn_threshold=False).cuda()
    steps = torch.randint(-12, 13, (5, 4096), device="cuda") * (theta / 4)  # quarters of θ: exact halves occur
    drive = torch.cat([steps, torch.zeros(40, 4096, device="cuda")])
    out = st_bif_multistep(drive, theta, quantizer.pos_max, quantizer.neg_min, backend="triton")
    assert out[-10:].abs().sum() == 0
    torch.testing.assert_close(out.sum(0), quantizer(steps.sum(0)), rtol=0, atol=1e-6)
    snn = convert_to_snn(nn.Sequential(quantizer), drive.shape[0])
    torch.testing.assert_close(snn(drive), out, rtol=0, atol=0)
