"""The QANN -> ST-BIF SNN equivalence on a GPU, with the Triton neuron kernel (``pytest -m gpu``)."""
from __future__ import annotations

import pytest
import torch

from search_space.genotypes import GENOTYPES
from search_space.qann import convert_to_snn, evaluate_snn
from tests.search_space.test_qann import ALL_OPS, qann_network

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("genotype", [ALL_OPS, GENOTYPES["DARTS_V2"]], ids=["all_ops", "darts_v2"])
def test_triton_snn_summed_logits_equal_the_qann_logits(genotype) -> None:
    network = qann_network(genotype, seed=5).cuda()
    x = torch.randn(32, 2, 12, 12, device="cuda")
    labels = torch.randint(0, 5, (32,), device="cuda")
    result = evaluate_snn(network, [(x, labels)], device="cuda", max_timesteps=256)
    assert result.silent and result.prediction_agreement == 1.0
    qann_logits = network(x)[0]
    assert result.logit_max_abs_diff <= 1e-4 * qann_logits.abs().max().item()


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
