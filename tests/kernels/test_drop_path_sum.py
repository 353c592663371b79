"""The drop-path node sum's Triton kernels (under TRITON_INTERPRET=1 on CPU) against the torch reference:
outputs and both terms' gradients, on random inputs of odd sizes, T = 1 and T > 1, every dtype, both layouts."""
import pytest
import torch

from kernels.drop_path_sum import concat_node_sums, drop_path_sum, drop_path_sum_reference
from kernels.drop_path_sum import triton as kernels
from tests.kernels.helpers import compile_for_hopper

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# One rounding of an fp32 sum on both sides; the interpreter rounds fp32 -> bf16 by truncation: 1 ulp apart.
TOL = {torch.float32: (1e-6, 1e-6), torch.float16: (1e-3, 1e-3), torch.bfloat16: (2**-7, 1e-2)}
# odd sizes, the third spanning two programs; rows of 512 elements: one sample per program (its scale read once)
SHAPES = [(1, 1, 1, 1), (3, 5, 7, 3), (4, 17, 13, 13), (3, 8, 8, 8)]


def terms(shape, dtype, channels_last, seed):
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    if channels_last:
        a, b = (t.contiguous(memory_format=torch.channels_last) for t in (a, b))
    return a, b


def scales(batch, which, seed):
    """Per-sample drop-path scales (0 or 1/keep, both present) for the terms named in ``which``."""
    gen = torch.Generator().manual_seed(seed)
    made = []
    for term in "ab":
        scale = None
        if term in which:
            scale = (torch.rand(batch, generator=gen) < 0.6).float() / 0.6
            scale[0] = 1 / 0.6
        made.append(scale)
    return made


def run(backend, a, b, scale_a, scale_b, timesteps, grad):
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    if backend == "reference":
        out = drop_path_sum_reference(a, b, scale_a, scale_b, timesteps)
    else:
        out = drop_path_sum(a, b, scale_a, scale_b, timesteps, backend=backend)
    out.backward(grad)
    return out.detach(), a.grad, b.grad


@pytest.mark.parametrize("which", ["ab", "a", "b"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("timesteps", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_triton_equals_reference(shape, dtype, timesteps, channels_last, which):
    shape = (shape[0] * timesteps, *shape[1:])
    a, b = terms(shape, dtype, channels_last, seed=sum(shape))
    scale_a, scale_b = scales(shape[0] // timesteps, which, seed=timesteps)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    got = run("triton", a, b, scale_a, scale_b, timesteps, grad)
    want = run("reference", a, b, scale_a, scale_b, timesteps, grad)
    rtol, atol = TOL[dtype]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
    assert got[0].stride() == a.stride() and got[1].stride() == a.stride()  # the terms' layout kept


def test_torch_path_equals_reference_and_drops_whole_samples():
    timesteps, batch = 2, 5
    a, b = terms((timesteps * batch, 3, 4, 4), torch.float32, True, seed=0)
    scale_a, scale_b = scales(batch, "ab", seed=1)
    grad = torch.randn_like(a)
    torch_path = run("torch", a, b, scale_a, scale_b, timesteps, grad)
    for g, w in zip(torch_path, run("reference", a, b, scale_a, scale_b, timesteps, grad)):
        torch.testing.assert_close(g, w)
    dropped = (scale_a == 0).repeat(timesteps)
    assert dropped.any() and torch.equal(torch_path[1][dropped], torch.zeros_like(torch_path[1][dropped]))


def test_gradient_in_another_layout_is_read_in_the_terms_layout():
    a, b = terms((4, 3, 5, 5), torch.float32, True, seed=3)
    scale_a, scale_b = scales(4, "ab", seed=4)
    grad = torch.randn(4, 3, 5, 5)  # contiguous, the terms channels_last
    got = run("triton", a, b, scale_a, scale_b, 1, grad)
    for g, w in zip(got, run("reference", a, b, scale_a, scale_b, 1, grad)):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("size", [(5, 3, 7), (8, 8, 8)], ids=["odd", "rows_of_512"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("timesteps", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_gradient_sliced_from_a_concatenation_is_read_in_place(dtype, timesteps, channels_last, size):
    """A node sum concatenated by torch.cat gets a channel slice of its gradient: the kernel reads it where it lies
    (no copy), and both terms' gradients, the unscaled one's too, come back in the terms' layout."""
    channels, height, width = size
    shape = (2 * timesteps, channels, height, width)
    a, b = terms(shape, dtype, channels_last, seed=7)
    scale_a, scale_b = scales(2, "a", seed=8)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    upstream = torch.randn(shape[0], channels + 7, height, width, generator=torch.Generator().manual_seed(9))
    upstream = upstream.to(dtype).contiguous(memory_format=layout)  # the concatenation's gradient, network's layout
    sliced = upstream[:, 3:3 + channels]
    assert sliced.stride() != a.stride() and kernels.slice_runs(sliced, a.stride()) is not None

    def concatenated(backend):
        a_, b_ = a.clone().requires_grad_(), b.clone().requires_grad_()
        if backend == "reference":
            out = drop_path_sum_reference(a_, b_, scale_a, scale_b, timesteps)
        else:
            out = drop_path_sum(a_, b_, scale_a, scale_b, timesteps, backend=backend)
        before, after = torch.zeros_like(upstream[:, :3]), torch.zeros_like(upstream[:, 3 + channels:])
        torch.cat([before, out, after], dim=1).backward(upstream)
        return a_.grad, b_.grad

    got, want = concatenated("triton"), concatenated("reference")
    rtol, atol = TOL[dtype]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
        assert g.stride() == a.stride()


def test_slice_runs_names_slices_only():
    cl = torch.channels_last
    terms_cl = torch.empty(4, 5, 3, 7).contiguous(memory_format=cl)
    assert kernels.slice_runs(torch.empty(4, 12, 3, 7).contiguous(memory_format=cl)[:, 2:7], terms_cl.stride()) \
        == (5, 12)
    assert kernels.slice_runs(torch.empty(4, 12, 3, 7)[:, 2:7], terms_cl.stride()) is None  # NCHW slice, cl terms
    assert kernels.slice_runs(torch.empty(4, 12, 3, 7)[:, 2:7], (105, 21, 7, 1)) == (105, 252)
    assert kernels.slice_runs(torch.empty(4, 5, 3, 14)[..., ::2], (105, 21, 7, 1)) is None  # strided within a run


def node_parts(dtype, timesteps, channels_last, seed):
    """A cell's concatenation: a ready tensor and three nodes' terms (both scaled, only a, only b), odd widths."""
    batch, gen = 2, torch.Generator().manual_seed(seed)
    layout = torch.channels_last if channels_last else torch.contiguous_format

    def tensor(channels):
        return torch.randn(batch * timesteps, channels, 3, 5, generator=gen).to(dtype).contiguous(memory_format=layout)

    scale_1, scale_2 = scales(batch, "ab", seed)
    return [tensor(3), (tensor(5), tensor(5), scale_1, scale_2), (tensor(4), tensor(4), scale_2, None),
            (tensor(2), tensor(2), None, scale_1)]


def concatenated(parts, timesteps, backend, upstream):
    """The concatenation and every input's gradient, through concat_node_sums or as torch.cat of reference sums."""
    leaves = [part.clone().requires_grad_() if isinstance(part, torch.Tensor) else
              (part[0].clone().requires_grad_(), part[1].clone().requires_grad_(), *part[2:]) for part in parts]
    if backend == "reference":
        out = torch.cat([leaf if isinstance(leaf, torch.Tensor) else drop_path_sum_reference(*leaf, timesteps)
                         for leaf in leaves], dim=1)
    else:
        out = concat_node_sums(leaves, timesteps, backend=backend)
    out.backward(upstream)
    inputs = [t for leaf in leaves for t in ((leaf,) if isinstance(leaf, torch.Tensor) else leaf[:2])]
    return out, inputs


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("timesteps", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_node_sums_written_into_the_concatenation_equal_torch_cat(dtype, timesteps, channels_last):
    parts = node_parts(dtype, timesteps, channels_last, seed=11)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    upstream = torch.randn(2 * timesteps, 14, 3, 5, generator=torch.Generator().manual_seed(12)).to(dtype)
    upstream = upstream.contiguous(memory_format=layout)
    (out, inputs), (want_out, want_inputs) = (concatenated(parts, timesteps, backend, upstream)
                                              for backend in ("triton", "reference"))
    rtol, atol = TOL[dtype]
    assert type(out.grad_fn).__name__ == "_ConcatNodeSumsBackward"  # summed in place, not torch.cat's fallback
    torch.testing.assert_close(out, want_out, rtol=rtol, atol=atol)
    assert out.is_contiguous(memory_format=layout)
    for got, want in zip(inputs, want_inputs):
        torch.testing.assert_close(got.grad, want.grad, rtol=rtol, atol=atol)
    for term in inputs[1:]:  # the nodes' terms get their gradients in their own layout
        assert term.grad.stride() == term.stride()


def test_concat_node_sums_falls_back_to_torch_cat():
    parts = node_parts(torch.float32, 1, True, seed=13)
    upstream = torch.randn(2, 14, 3, 5)
    want, _ = concatenated(parts, 1, "reference", upstream)
    for backend, given in (("torch", parts), ("triton", [parts[0].contiguous(), *parts[1:]])):  # or two layouts
        out, _ = concatenated(given, 1, backend, upstream)
        assert type(out.grad_fn).__name__ == "CatBackward0"
        torch.testing.assert_close(out, want)


def test_unscaled_terms_are_a_plain_sum():
    a, b = terms((2, 3, 4, 4), torch.float32, False, seed=5)
    torch.testing.assert_close(drop_path_sum(a, b, None, None), a + b)


def test_triton_refuses_terms_of_two_layouts_with_the_fix():
    a, b = terms((2, 3, 4, 4), torch.float32, False, seed=6)
    with pytest.raises(ValueError, match="one shape, dtype and dense layout.*backend='torch'"):
        drop_path_sum(a, b.contiguous(memory_format=torch.channels_last), *scales(2, "ab", 0), backend="triton")
    with pytest.raises(ValueError, match=r"scales of shape \[B\]"):
        drop_path_sum(a, b, torch.ones(3), None, backend="triton")
    with pytest.raises(ValueError, match="fp32, fp16 or bf16 terms.*float64.*backend='torch'"):  # it sums in fp32
        drop_path_sum(a.double(), b.double(), *scales(2, "ab", 0), backend="triton")


def test_the_shapes_take_both_ways_to_a_sample():
    assert 4 * 17 * 13 * 13 > kernels.BLOCK and (17 * 13 * 13) % (kernels.BLOCK // 4)  # per element, two programs
    assert (8 * 8 * 8) % (kernels.BLOCK // 4) == 0  # per program, a program a row



COMPILE_FOR_HOPPER = """
import re
from kernels.drop_path_sum import triton as kernels
from tests.kernels.helpers import hopper_ptx

pointers = {"a_ptr": "*fp16", "b_ptr": "*fp16", "out_ptr": "*fp16", "g_ptr": "*fp16", "grad_a_ptr": "*fp16",
            "grad_b_ptr": "*fp16", "scale_a_ptr": "*fp32", "scale_b_ptr": "*fp32"}
for kernel in (kernels._drop_path_sum_fwd_kernel, kernels._drop_path_sum_bwd_kernel):
    # every constexpr branch both ways (what a branch's types must agree with), not every combination; rows of
    # DARTS_V2 20 x 36's nodes (36 channels at 32 x 32: whole blocks) and of an odd size
    for scaled_a, scaled_b, sliced in ((True, True, False), (True, False, True), (False, True, True)):
        for channels, pixels in ((36, 32 * 32), (5, 7 * 3)):
            values = {"n": 256 * channels * pixels, "ROW_SIZE": channels * pixels, "batch": 256,
                      "RUN": channels if sliced else 1, "RUN_STRIDE": 4 * channels if sliced else 1,
                      "SCALED_A": scaled_a, "SCALED_B": scaled_b, "SLICED": sliced, "BLOCK": kernels.BLOCK}
            ptx = hopper_ptx(kernel, values, pointers)
            # sizes known to the compiler: no 64-bit division of every offset
            assert not re.search(r"(div|rem)[.][su]64", ptx), (kernel, values)
            if channels == 36:  # the node's own tensors and the concatenation's 36-channel runs move as vectors
                narrow = [a for a in re.findall(r"(?:ld|st)[.]global[.][.a-z0-9]+", ptx)
                          if ".v2." not in a and ".v4." not in a and not a.endswith(".b32")]
                assert not narrow, (kernel, values, sorted(set(narrow)))
"""


def test_kernels_compile_for_a_hopper_gpu():
    """The interpreter runs Python, not Triton's compiler: compile every variant for sm_90 (no GPU needed, a
    process without TRITON_INTERPRET), which refuses what the interpreter let through once (a constexpr branch
    returning a scalar where the other returned a block)."""
    compile_for_hopper(COMPILE_FOR_HOPPER)


def test_compiled_sums_take_the_reference_that_inductor_fuses():
    """Under torch.compile the node sum traces as the reference's ops, in one graph, and equals them."""
    shape = (6, 5, 7, 3)
    a, b = terms(shape, torch.float32, channels_last=True, seed=4)
    scale_a, scale_b = scales(shape[0], "ab", seed=5)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(6))

    def node(a, b):
        return drop_path_sum(a, b, scale_a, scale_b, backend="triton")

    compiled = torch.compile(node, fullgraph=True, backend="aot_eager")
    a_c, b_c = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = compiled(a_c, b_c)
    out.backward(grad)
    want = run("reference", a, b, scale_a, scale_b, 1, grad)
    for g, w in zip((out.detach(), a_c.grad, b_c.grad), want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_gradients_of_the_tensor_parts_equal_the_views_and_are_dense(dtype):
    """dense_grads: the ready tensor's gradient is the same values, as a dense channels_last tensor instead of a
    strided view of the concatenation's gradient; the nodes' terms are unchanged."""
    parts = node_parts(dtype, 3, True, seed=21)
    upstream = torch.randn(6, 14, 3, 5, generator=torch.Generator().manual_seed(22)).to(dtype)
    upstream = upstream.contiguous(memory_format=torch.channels_last)
    results = []
    for dense in (False, True):
        leaves = [part.clone().requires_grad_() if isinstance(part, torch.Tensor) else
                  (part[0].clone().requires_grad_(), part[1].clone().requires_grad_(), *part[2:]) for part in parts]
        out = concat_node_sums(leaves, 3, backend="triton", dense_grads=dense)
        assert type(out.grad_fn).__name__ == "_ConcatNodeSumsBackward"
        ready = leaves[0]
        reader = (ready * 2).sum()  # another reader of the tensor part: its gradients are summed
        (out * upstream).sum().add(reader).backward()
        results.append([ready.grad, *(t.grad for leaf in leaves[1:] for t in leaf[:2])])
        if dense:
            assert ready.grad.is_contiguous(memory_format=torch.channels_last)
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
