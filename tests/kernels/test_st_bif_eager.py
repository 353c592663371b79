"""The eager ST-BIF path (routes, Plans, compiled launches) against the custom ops, torch.compile and the reference."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernels.memory_order import storage_order
from kernels.st_bif import STBIFNeuron, st_bif_multistep
from kernels.st_bif import dispatch as st_bif_dispatch
from kernels.st_bif.function import _st_bif_forward_op
from kernels.st_bif.plan import get_plan, st_bif_fwd
from kernels.st_bif.reference import st_bif_reference
from kernels.st_bif.surrogates import SURROGATES

POS_MAX, NEG_MIN = 3, -4
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# T = 1; odd sizes; T > the kernels' chunk of 8 steps (two-pass backward).
SHAPES = [(1, 7, 13), (4, 3, 5, 7), (11, 2, 37)]
# The interpreter rounds fp32 -> bf16 by truncation, torch to nearest: 1 bf16 ulp apart.
OUT_TOL = {torch.float32: 0.0, torch.float16: 0.0, torch.bfloat16: 2**-7}
GRAD_X_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 2**-7}


def random_tensor(shape, dtype, seed, scale=1.5):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def eager(x, theta, surrogate):
    return st_bif_multistep(x, theta, POS_MAX, NEG_MIN, surrogate=surrogate, backend="triton")


def custom_op(x, theta, surrogate):
    return _st_bif_forward_op(x, theta, POS_MAX, NEG_MIN, surrogate)


def reference(x, theta, surrogate):
    return st_bif_reference(x, theta, POS_MAX, NEG_MIN, SURROGATES[surrogate])[0]


def compiled(x, theta, surrogate):
    fn = torch.compile(eager, backend="aot_eager", fullgraph=True, dynamic=False)
    return fn(x, theta, surrogate)


def out_and_grads(run, x_seq, theta, grad_out, surrogate, layout=lambda x: x):
    """(out, grad x, grad θ) of run(layout(x), θ) under grad_out; θ learnable."""
    x = x_seq.clone().requires_grad_()
    q_threshold = theta.clone().requires_grad_()
    out = run(layout(x), q_threshold, surrogate)
    grad_x, grad_theta = torch.autograd.grad(out, (x, q_threshold), grad_out)
    return out.detach(), grad_x, grad_theta


def assert_matches_reference(got, want, dtype, numel):
    (out, grad_x, grad_theta), (ref_out, ref_grad_x, ref_grad_theta) = got, want
    assert out.dtype == dtype and grad_x.dtype == dtype and grad_theta.dtype == ref_grad_theta.dtype
    assert grad_theta.shape == ref_grad_theta.shape
    assert (ref_out != 0).any() and (ref_grad_x != 0).any()
    torch.testing.assert_close(out, ref_out, rtol=OUT_TOL[dtype], atol=0)
    tol = GRAD_X_TOL[dtype]
    torch.testing.assert_close(grad_x, ref_grad_x, rtol=tol, atol=tol)
    # fp32 sums over all neurons in different orders: relative to the sum of magnitudes.
    torch.testing.assert_close(grad_theta, ref_grad_theta, rtol=1e-4, atol=1e-5 * numel)


@pytest.mark.parametrize("surrogate", ["sigmoid", "rectangular"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_eager_equals_custom_op_and_reference(shape, dtype, surrogate):
    seed = 10 * SHAPES.index(shape) + DTYPES.index(dtype) + len(surrogate)
    x_seq = random_tensor(shape, dtype, seed)
    grad_out = random_tensor(shape, dtype, seed + 1, scale=1.0)
    theta = torch.tensor(0.7)
    results = [out_and_grads(run, x_seq, theta, grad_out, surrogate) for run in (eager, eager, custom_op, reference)]
    first, second, op, ref = results
    for a, b, c in zip(first, second, op):  # the second call runs on cached routes and plans
        assert torch.equal(a, b) and torch.equal(a, c)
    assert_matches_reference(first, ref, dtype, x_seq.numel())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 7, 13), (4, 3, 5, 7)], ids=str)
def test_compiled_equals_eager(shape, dtype):
    torch._dynamo.reset()  # a fresh cache per case: no recompile limit
    x_seq = random_tensor(shape, dtype, seed=5)
    grad_out = random_tensor(shape, dtype, seed=6, scale=1.0)
    theta = torch.tensor(0.6)
    got = out_and_grads(compiled, x_seq, theta, grad_out, "sigmoid")
    want = out_and_grads(eager, x_seq, theta, grad_out, "sigmoid")
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert_matches_reference(got, out_and_grads(reference, x_seq, theta, grad_out, "sigmoid"), dtype, x_seq.numel())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_learnable_threshold_module(dtype):
    """STBIFNeuron with a learnable θ: outputs and grads of x and θ as the torch backend's module."""
    x_seq = random_tensor((4, 2, 3, 5, 5), dtype, seed=7)
    grad_out = random_tensor(x_seq.shape, dtype, seed=8, scale=1.0)
    results = []
    for backend in ("triton", "torch"):
        neuron = STBIFNeuron(q_threshold=0.45, level=8, learn_threshold=True, surrogate="atan", backend=backend)
        x = x_seq.clone().requires_grad_()
        out = neuron(x)
        results.append((out.detach(), *torch.autograd.grad(out, (x, neuron.q_threshold), grad_out)))
    assert_matches_reference(results[0], results[1], dtype, x_seq.numel())


def test_threshold_of_another_dtype_and_shape():
    """A [1] float64 θ: its grad keeps θ's shape and dtype."""
    x_seq = random_tensor((5, 3, 8), torch.float32, seed=9)
    grad_out = random_tensor(x_seq.shape, torch.float32, seed=10, scale=1.0)
    theta = torch.tensor([0.8], dtype=torch.float64)
    got = out_and_grads(eager, x_seq, theta, grad_out, "sigmoid")
    want = out_and_grads(reference, x_seq, theta, grad_out, "sigmoid")
    assert got[2].shape == (1,) and got[2].dtype == torch.float64
    assert_matches_reference(got, want, torch.float32, x_seq.numel())


# Views of a [4, 3, 14] input that the kernels take as they are ([T, N] views: neuron stride 2,
# an offset start), and one they run permuted to its memory order (transposed).
LAYOUTS = {
    "every other neuron": lambda x: x[:, :, ::2],
    "offset by one element": lambda x: x.flatten()[1:157].view(4, 3, 13),
    "transposed": lambda x: x.transpose(1, 2),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_layouts_of_input_and_gradient(name):
    """Each input layout against the reference under a contiguous, a stride-0 (the gradient of
    a sum) and a transposed gradient, on one cached plan per input layout."""
    layout = LAYOUTS[name]
    x_base = random_tensor((4, 3, 14), torch.float32, seed=11)
    shape = layout(x_base).shape
    gen = torch.Generator().manual_seed(12)
    grads = [
        torch.randn(shape, generator=gen),
        torch.full((), 0.3).expand(shape),
        torch.randn(tuple(reversed(shape)), generator=gen).permute(2, 1, 0),
    ]
    theta = torch.tensor(0.55)
    for grad_out in grads:
        got = out_and_grads(eager, x_base, theta, grad_out, "sigmoid", layout)
        want = out_and_grads(reference, x_base, theta, grad_out, "sigmoid", layout)
        assert_matches_reference(got, want, torch.float32, grad_out.numel())
    x = layout(x_base)
    order = storage_order(x)  # a dense permutation runs in its memory order, no copy
    assert (order is not None) == (name == "transposed")
    plan = get_plan(x if order is None else x.permute(order), POS_MAX, NEG_MIN, "sigmoid")
    assert plan.x_strides is not None
    assert len(plan.grad_strides) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_channels_last_input_runs_in_its_memory_order_and_keeps_its_strides(dtype):
    """A channels_last [T*B, C, H, W] viewed as [T, B, C, H, W] (the networks' layout with
    channels_last weights): no copy to contiguous, the output has the input's strides, and values
    and gradients equal the reference's, under a channels_last and a contiguous gradient."""
    steps, batch, channels, height, width = 3, 2, 5, 4, 3
    flat = random_tensor((steps * batch, channels, height, width), dtype, seed=21)
    to_layout = lambda x: x.contiguous(memory_format=torch.channels_last).unflatten(0, (steps, batch))  # noqa: E731
    x_seq = to_layout(flat)
    assert storage_order(x_seq) == (0, 1, 3, 4, 2)
    assert storage_order(flat.unflatten(0, (steps, batch))) is None  # contiguous: as it is
    out = eager(x_seq, torch.tensor(0.4), "sigmoid")
    assert out.stride() == x_seq.stride()
    gen = torch.Generator().manual_seed(22)
    upstream = torch.randn(x_seq.shape, generator=gen).to(dtype)
    theta = torch.tensor(0.4)
    for grad_out in (upstream, to_layout(upstream.flatten(0, 1))):
        got = out_and_grads(eager, flat.unflatten(0, (steps, batch)), theta, grad_out, "sigmoid",
                            lambda x: to_layout(x.flatten(0, 1)))
        want = out_and_grads(reference, flat.unflatten(0, (steps, batch)), theta, grad_out, "sigmoid")
        assert_matches_reference(got, want, dtype, x_seq.numel())


def test_calls_of_one_kind_share_a_route_and_a_plan():
    x_seq = random_tensor((3, 2, 9), torch.float32, seed=13)
    theta = torch.tensor(0.5)
    first = eager(x_seq, theta, "sigmoid")
    routes = dict(st_bif_dispatch._ROUTES)
    second = eager(random_tensor((3, 2, 9), torch.float32, seed=13), torch.tensor(0.5), "sigmoid")
    assert st_bif_dispatch._ROUTES == routes and torch.equal(first, second)
    assert get_plan(x_seq, POS_MAX, NEG_MIN) is get_plan(x_seq.clone(), POS_MAX, NEG_MIN)
    eager(x_seq.to(torch.float16), theta, "sigmoid")
    assert len(st_bif_dispatch._ROUTES) == len(routes) + 1


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x: st_bif_multistep(x.int(), 1.0, POS_MAX, NEG_MIN, backend="triton"), "floating dtype"),
        (lambda x: st_bif_multistep(x.double(), torch.tensor(1.0), POS_MAX, NEG_MIN, backend="triton"), "float64"),
        (lambda x: st_bif_multistep(x, torch.ones(2), POS_MAX, NEG_MIN, backend="triton"), "one-element"),
        (lambda x: st_bif_multistep(x, torch.tensor(1), POS_MAX, NEG_MIN, backend="triton"), "one-element"),
        (lambda x: st_bif_multistep(x, torch.tensor(1.0, device="meta"), POS_MAX, NEG_MIN), "same device"),
        (lambda x: st_bif_multistep(x, torch.tensor(1.0), 3.0, NEG_MIN, backend="triton"), "must be ints"),
        (lambda x: st_bif_multistep(x, torch.tensor(1.0), NEG_MIN, POS_MAX, backend="triton"), "neg_min < pos_max"),
        (lambda x: st_bif_multistep(x, torch.tensor(1.0), POS_MAX, NEG_MIN, surrogate="relu"), "unknown surrogate"),
        (lambda x: st_bif_multistep(x, torch.tensor(1.0), POS_MAX, NEG_MIN, backend="gpu"), "unknown backend"),
        (lambda x: st_bif_multistep(x[:0], torch.tensor(1.0), POS_MAX, NEG_MIN), "T >= 1"),
        (lambda x: st_bif_multistep(x.numpy(), 1.0, POS_MAX, NEG_MIN), "must be a torch.Tensor"),
        (lambda x: st_bif_multistep(x.numpy(), torch.tensor(1.0), POS_MAX, NEG_MIN), "must be a torch.Tensor"),
        (lambda x: st_bif_fwd(x, torch.tensor(1.0), POS_MAX, NEG_MIN, block_map=(x, x)), "block map"),
    ],
)
def test_bad_input_raises_after_good_calls_of_the_same_shape(call, match):
    """Routes are cached per kind of call: a bad call next to a cached good one is still checked."""
    x_seq = random_tensor((3, 2, 4), torch.float32, seed=14)
    for backend in ("triton", "torch"):
        st_bif_multistep(x_seq, torch.tensor(1.0), POS_MAX, NEG_MIN, backend=backend)
    with pytest.raises(ValueError, match=match):
        call(x_seq)


# Run in a fresh interpreter without TRITON_INTERPRET: Triton's JITFunction.run, with a driver
# that reports an sm_90 GPU and "compiled kernels" whose launchers record their arguments.
_FAKE_GPU = textwrap.dedent('''
    import torch, triton
    import triton.runtime.jit as jit
    from triton.backends.compiler import GPUTarget
    from triton.compiler import CompiledKernel
    from triton.runtime.driver import driver

    class FakeDriver:
        def get_current_device(self): return 0
        def get_current_stream(self, device): return 7
        def get_current_target(self): return GPUTarget("cuda", 90, 32)
        def get_device_capability(self, device=0): return (9, 0)

    driver.set_active(FakeDriver())
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_getCurrentRawStream = lambda device: 7
    torch.cuda.is_current_stream_capturing = lambda: False
    RECORDS = []

    class Address(int):
        """What data_ptr() returns here: the address, which remembers its tensor."""

    def data_ptr(tensor):
        address = Address(torch._C.TensorBase.data_ptr(tensor))
        address.tensor = tensor
        return address

    torch.Tensor.data_ptr = data_ptr

    class FakeCompiled(CompiledKernel):
        def __init__(self, fn, options):
            self.fn, self.options, self.module = fn, options, 1
            self.function, self.packed_metadata = id(self), (options["num_warps"], 1, 0)
        def launch_metadata(self, grid, stream, *args): return None
        def run(self, *args): RECORDS.append((self, args))

    def triton_choice(fn, args, options):
        """The compiled kernel JITFunction.run launches for these arguments (made on first use)."""
        caches = fn.device_caches[0]
        options = dict(options, debug=fn.debug or triton.knobs.runtime.debug,
                       instrumentation_mode=triton.knobs.compilation.instrumentation_mode)
        _, specialization, options_used = caches[4](*args, **options)
        key = jit.compute_cache_key(caches[1], specialization, options_used)
        return caches[0].setdefault(key, FakeCompiled(fn, {k: options[k] for k in ("num_warps", "launch_pdl")}))

    jit_run = jit.JITFunction.run
    def run_without_compiling(self, *args, grid, warmup, **kwargs):
        triton_choice(self, args, kwargs)
        return jit_run(self, *args, grid=grid, warmup=warmup, **kwargs)
    jit.JITFunction.run = run_without_compiling

    import kernels.backend
    import kernels.st_bif.plan as kt
    from kernels.st_bif import st_bif_multistep, st_bif_multistep_with_block_map
    kernels.backend.triton_can_run = lambda device: True
    kt._check_triton_input = lambda x_seq: None
    plan_init = kt.Plan.__init__
    def plan_on_gpu_0(self, *args, **kwargs):
        plan_init(self, *args, **kwargs)
        self.device_index = 0
    kt.Plan.__init__ = plan_on_gpu_0

    def fwd_bwd(x, theta, grad="dense", with_map=False, learn=True):
        x, theta = x.detach().requires_grad_(), theta.detach().requires_grad_(learn)
        if with_map:
            out = st_bif_multistep_with_block_map(x, theta, 3, -4, backend="triton")[0]
        else:
            out = st_bif_multistep(x, theta, 3, -4, surrogate="atan", backend="triton")
        grads = {"dense": torch.ones_like(out), "sum": torch.ones(()).expand(out.shape),
                 "transposed": torch.ones(out.shape[::-1]).permute(*reversed(range(out.dim()))),
                 "misaligned": misaligned(torch.ones_like(out))}
        torch.autograd.grad(out, (x, theta) if learn else (x,), grads[grad])

    def misaligned(t):
        return torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape).copy_(t)

    x = torch.randn(4, 3, 5, 7)
    theta = torch.tensor(0.7)
    cases = [
        lambda: fwd_bwd(x, theta), lambda: fwd_bwd(x.bfloat16(), theta), lambda: fwd_bwd(x.half(), theta),
        lambda: fwd_bwd(x[:1], theta), lambda: fwd_bwd(torch.randn(11, 2, 37), theta),
        lambda: fwd_bwd(misaligned(x), theta), lambda: fwd_bwd(x, misaligned(theta)),
        lambda: fwd_bwd(x, theta.double()), lambda: fwd_bwd(x, theta.reshape(1)),
        lambda: fwd_bwd(x, theta, "sum"), lambda: fwd_bwd(x, theta, "transposed"),
        lambda: fwd_bwd(x, theta, "misaligned"), lambda: fwd_bwd(x, theta, learn=False),
        lambda: fwd_bwd(x.transpose(2, 3), theta), lambda: fwd_bwd(torch.randn(4, 3, 5, 8)[..., ::2], theta),
        lambda: fwd_bwd(x.unsqueeze(1), theta, with_map=True),
        lambda: kt.st_bif_fwd(x, theta, 3, -4, with_state=True),
    ]
    direct = 0
    for case in cases:
        for attempt in range(2):
            RECORDS.clear()
            case()
            assert RECORDS, "no launch recorded"
            for compiled, args in RECORDS:
                grid, (stream, function, metadata), hooks, kernel_args = args[:3], args[3:6], args[6:9], args[9:]
                tensors = tuple(arg.tensor if isinstance(arg, Address) else arg for arg in kernel_args)
                assert compiled is triton_choice(compiled.fn, tensors, compiled.options), "another specialization"
                if hooks == (None, None, None):  # a kept launch: tensors passed as their addresses
                    assert not any(isinstance(arg, torch.Tensor) for arg in kernel_args)
                    assert any(isinstance(arg, Address) for arg in kernel_args)
                assert stream == 7 and function == compiled.function and metadata == compiled.packed_metadata
                assert grid[1:] == (1, 1) and grid[0] >= 1
                assert len(kernel_args) == len(compiled.fn.params)
                runtime = triton.knobs.runtime
                assert hooks in [(None, None, None), (None, runtime.launch_enter_hook, runtime.launch_exit_hook)]
                if attempt == 1:  # the second call of a case launches through the kept handles only
                    assert hooks == (None, None, None), hooks
                    direct += 1
    # A kept CUDA launcher needing no scratch is called below its __call__: the same C launch.
    from triton.backends.nvidia.driver import CudaLauncher
    from kernels.launch import keep, launch

    def fake_cuda_compiled(pdl):
        launcher = object.__new__(CudaLauncher)
        launcher.__dict__.update(num_ctas=1, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                                 profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=pdl)
        launcher.launch = lambda *args: RECORDS.append((launcher, args))
        compiled = object.__new__(CompiledKernel)
        compiled.__dict__.update(_run=launcher, module=1, function=1234, packed_metadata=(8, 1, 0))
        return compiled

    for pdl in (False, True):
        compiled = fake_cuda_compiled(pdl)
        pointers, scalars = (x.data_ptr(), None), (3, -4, 8, True)
        RECORDS.clear()
        compiled.run(5, 1, 1, 7, compiled.function, compiled.packed_metadata, None, None, None, *pointers, *scalars)
        launch(None, {"key": keep(compiled)}, "key", 0, 5, (x, None), pointers, scalars, 8)
        assert len(RECORDS) == 2 and RECORDS[0] == RECORDS[1], RECORDS
        assert keep(compiled)[0] is compiled.run.launch
    compiled.run.global_scratch_size = 64
    assert keep(compiled)[0] is compiled.run  # scratch to allocate: through CudaLauncher.__call__
    # A registered launch hook (a profiler's) sends launches through JITFunction.run again.
    seen = []
    triton.knobs.runtime.launch_enter_hook.add(seen.append)
    RECORDS.clear()
    fwd_bwd(x, theta)
    assert RECORDS and all(args[7] is triton.knobs.runtime.launch_enter_hook for _, args in RECORDS)
    print("direct launches", direct)
''')


def test_kept_launches_match_what_triton_would_launch():
    """On a faked GPU: a launch through a kept handle passes what JITFunction.run passes to the
    same compiled kernel (grid, stream, function, metadata, arguments; for a CUDA launcher, what
    its __call__ passes to its C launch), and the handle kept for a launch key is the kernel
    Triton itself picks for the arguments: dtypes, alignments, strides, T, θ's dtype and shape,
    a fixed θ, gradient layouts, the block map and the final state."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", _FAKE_GPU], env=env, cwd=root, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["launches", "33"]  # 16 forward+backward calls and a forward
