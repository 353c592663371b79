"""The C++ autograd node's CPU-checkable parts: the argument layout taken from a kernel's signature, the build
(with the system compiler) and the argument slots the built node packs, its switch and its failures. Its launches
and gradients are checked on a GPU (test_native_node_gpu.py)."""
import os
import shutil
import struct
from types import SimpleNamespace

import pytest
import torch

from kernels import native
from kernels.native import build as native_build
from kernels.native.arguments import FIXED, argument_slots, native_kernel
from kernels.native.spec import UNAVAILABLE, roles
from kernels.st_bif import st_bif_multistep
from kernels.st_bif.plan import get_plan

SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*bf16", "state_ptr": "constexpr", "theta_ptr": "*fp32",
             "n": "i32", "stride": "i64", "one": "constexpr", "flag": "i1", "T": "constexpr"}


def test_argument_slots_skip_constexprs_and_keep_roles_and_values():
    pointer_roles = roles("x", "out", None, "theta")
    arguments = (1111, 2222, None, 3333, 1000, -(2**40), 1, True, 4)
    slots = argument_slots(SIGNATURE, arguments, pointer_roles)
    assert slots == ([0, 1, 2, FIXED, FIXED, FIXED], [0, 0, 0, 1000, 2**64 - 2**40, 1])


def test_float_arguments_go_as_their_bits():
    signature = {"x_ptr": "*fp32", "scale": "fp32", "weight": "fp64"}
    roles_, values = argument_slots(signature, (1, 0.1, -2.5), roles("x"))
    assert roles_ == [0, FIXED, FIXED]
    assert struct.unpack("<f", struct.pack("<I", values[1]))[0] == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert struct.unpack("<d", struct.pack("<Q", values[2]))[0] == -2.5


@pytest.mark.parametrize("signature, arguments, pointer_roles, match", [
    ({"x_ptr": "*fp32", "scale": "bf16"}, (1, 0.5), roles("x"), "cannot be passed as a fixed value"),
    ({"x_ptr": "*fp32", "y_ptr": "*fp32"}, (1, 2), roles("x", None), "not a pointer with a role"),
    ({"x_ptr": "*fp32"}, (1, 2), roles("x"), "the signature has 1 arguments, the launch passed 2"),
])
def test_argument_slots_refuse_what_the_node_cannot_pass(signature, arguments, pointer_roles, match):
    with pytest.raises(ValueError, match=match):
        argument_slots(signature, arguments, pointer_roles)


def fake_compiled(**metadata):
    defaults = dict(num_ctas=1, launch_pdl=False, launch_cooperative_grid=False, global_scratch_size=0,
                    profile_scratch_size=0, num_warps=4, shared=96)
    return SimpleNamespace(name="k", function=0xABC, src=SimpleNamespace(signature={"x_ptr": "*fp32", "n": "i32"}),
                           metadata=SimpleNamespace(**{**defaults, **metadata}))


def test_native_kernel_takes_the_launch_shape_from_the_metadata():
    kernel = native_kernel(fake_compiled(), 7, (123, 55), roles("x"))
    assert kernel == (0xABC, 7, 128, 96, [0, FIXED], [0, 55])


@pytest.mark.parametrize("metadata", [dict(launch_pdl=True), dict(num_ctas=2), dict(global_scratch_size=8),
                                      dict(profile_scratch_size=8), dict(launch_cooperative_grid=True)])
def test_native_kernel_refuses_launch_options_it_does_not_pass(metadata):
    with pytest.raises(ValueError, match="launch options"):
        native_kernel(fake_compiled(**metadata), 7, (123, 55), roles("x"))


needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                    reason="needs a C++ compiler")


@needs_compiler
@pytest.mark.slow
def test_built_node_packs_each_argument_in_a_64_bit_slot_then_two_null_scratch_pointers(tmp_path, monkeypatch):
    monkeypatch.setenv("ASO_SE_CACHE", str(tmp_path))
    loaded = native.wait()
    assert loaded is not None, native.build_error()
    pointers = [0x1000 * (i + 1) for i in range(len(loaded.ROLES))]
    role = loaded.ROLES
    signature = {"x_ptr": "*fp32", "g_ptr": "*fp32", "neg_min": "i32", "big": "i64"}
    roles_, values = argument_slots(signature, (0, 0, -3, 2**33), roles("x", "grad_theta"))
    slots = loaded.pack_arguments(roles_, values, pointers)
    assert slots == [pointers[role["x"]], pointers[role["grad_theta"]], 2**64 - 3, 2**33, 0, 0]
    assert int.from_bytes((2**64 - 3).to_bytes(8, "little")[:4], "little", signed=True) == -3  # an i32 reads this
    assert list(role) == ["x", "out", "theta", "grad_out", "grad_x", "partials", "counter", "grad_theta"]
    with pytest.raises(RuntimeError, match="unknown role"):
        loaded.pack_arguments([99], [0], pointers)


def test_a_failed_build_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("ASO_SE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(RuntimeError, match="the compiler exited 1"):
        native.build_library()
    assert not list(tmp_path.glob("*.so"))  # nothing half-written left behind
    monkeypatch.setattr(native_build, "BUILD", native_build.Build())
    with pytest.warns(UserWarning, match="the C\\+\\+ neuron node was not built"):
        assert native.wait() is None
    assert "the compiler exited 1" in native.build_error()
    assert native.module() is None  # no second build


def test_switched_off_it_neither_builds_nor_loads(monkeypatch):
    monkeypatch.setenv("ASO_SE_NATIVE", "0")
    fresh = native_build.Build()
    monkeypatch.setattr(native_build, "BUILD", fresh)
    assert not native.enabled()
    assert native.module() is None and native.wait() is None
    assert fresh.thread is None


def test_cpu_plans_never_use_the_node(monkeypatch):
    monkeypatch.setattr(native_build.BUILD, "start", lambda: pytest.fail("a CPU call started the build"))
    x = torch.randn(4, 3, 5)
    st_bif_multistep(x, 1.0, 3, -4, backend="torch")
    if os.environ.get("TRITON_INTERPRET") == "1":
        st_bif_multistep(x.requires_grad_(), 1.0, 3, -4, backend="triton").sum().backward()
        assert get_plan(x, 3, -4).native is UNAVAILABLE
