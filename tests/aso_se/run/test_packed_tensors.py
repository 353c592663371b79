"""Packed checkpoint states: every tensor back with its values, dtype, shape and layout."""
import io
from collections import OrderedDict

import pytest
import torch

from aso_se.run.checkpoint import load_checkpoint, save_checkpoint
from aso_se.run.packed_tensors import pack, unpack


def _state() -> dict:
    generator = torch.Generator().manual_seed(0)
    conv = torch.randn(5, 3, 3, 3, generator=generator).to(memory_format=torch.channels_last)
    return {
        "model": OrderedDict(weight=conv, bias=torch.randn(5, generator=generator), steps=torch.tensor(7)),
        "optimizer": {"state": {0: {"exp_avg": torch.randn(3, 7, generator=generator).t(),
                                    "step": torch.tensor(3.0)}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
        "rng": [torch.randint(0, 255, (13,), dtype=torch.uint8, generator=generator), (1, "a")],
        "half": torch.randn(2, 5, generator=generator).to(torch.bfloat16),
        "mask": torch.rand(4, generator=generator) > 0.5,
        "empty": torch.zeros(0, 3),
        "strided": torch.randn(6, 4, generator=generator)[::2],  # holes: left as is
        "expanded": torch.randn(3, 1, generator=generator).expand(3, 4),  # overlapping: left as is
        "epoch": 4, "name": "x",
    }


def _assert_same(got, want) -> None:
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got, want)
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want)
        for key in want:
            _assert_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for a, b in zip(got, want):
            _assert_same(a, b)
    else:
        assert got == want


def test_pack_then_unpack_returns_every_tensor_with_its_layout() -> None:
    state = _state()
    skeleton, packed = pack(state)
    assert len(packed["flats"]) == 5  # float32, int64, uint8, bfloat16, bool
    buffer = io.BytesIO()
    torch.save({"skeleton": skeleton, "packed": packed}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    restored = unpack(loaded["skeleton"], loaded["packed"])
    _assert_same(restored, state)
    assert restored["model"]["weight"].is_contiguous(memory_format=torch.channels_last)
    restored["model"]["bias"].add_(1)  # own storage: the others are untouched
    assert torch.equal(restored["model"]["weight"], state["model"]["weight"])


def test_checkpoints_are_packed_and_read_back(tmp_path) -> None:
    state = _state()
    save_checkpoint(state, tmp_path / "last.pt", kind="search")
    raw = torch.load(tmp_path / "last.pt", weights_only=True)
    assert not isinstance(raw["model"]["bias"], torch.Tensor)  # a placeholder in the file
    _assert_same(load_checkpoint(tmp_path / "last.pt", kind="search"), state)


def test_a_state_without_tensors_packs_to_an_empty_table() -> None:
    skeleton, packed = pack({"epoch": 3, "names": ["a", ("b", 1)]})
    assert packed["flats"] == [] and packed["table"].numel() == 0
    assert unpack(skeleton, packed) == {"epoch": 3, "names": ["a", ("b", 1)]}


def test_format_1_checkpoints_still_load(tmp_path) -> None:
    state = {"w": torch.randn(3, 2), "epoch": 2}
    torch.save({"aso_se_checkpoint": {"kind": "train", "version": 1}, **state}, tmp_path / "old.pt")
    _assert_same(load_checkpoint(tmp_path / "old.pt", kind="train"), state)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_pack_on_their_device() -> None:
    state = {"a": torch.randn(3, device="cuda"), "b": torch.randn(2)}
    skeleton, packed = pack(state)
    assert {flat.device.type for flat in packed["flats"]} == {"cuda", "cpu"}
    _assert_same(unpack(skeleton, packed), state)
