"""Spike-sparse convolution on a CUDA GPU (compiled Triton, TF32, the calibrated dispatcher).
Run with `pytest -m gpu tests/kernels/test_sparse_conv_gpu.py` on a machine with a GPU."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from kernels.sparse_conv import (
    DensityTracker,
    SparseConv2d,
    capture_warmup,
    path_counts,
    reset_path_counts,
    sparse_conv2d,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# ‖out − ref‖ / ‖ref‖ against float64: TF32 for fp32 inputs, fp32 accumulation for half types.
TOLERANCE = {torch.float32: 2e-3, torch.float16: 2e-3, torch.bfloat16: 1e-2}
CONFIGS = [("dense", k, s, d) for k, s, d in itertools.product((1, 3, 5), (1, 2), (1, 2))] + \
          [("depthwise", k, s, d) for k, s, d in itertools.product((3, 5), (1, 2), (1, 2))]


def spiking_input(shape, dtype, memory, generator, density=0.3, plane_silence=0.6):
    """Spikes laid out "nchw", "channels_last" or as a "strided" planar view (rows padded in memory)."""
    x = torch.randn(shape, generator=generator, device="cuda").sign()
    x *= torch.rand(shape, generator=generator, device="cuda") < density
    x *= (torch.rand(shape[:2], generator=generator, device="cuda") >= plane_silence)[:, :, None, None]
    x = x.to(dtype)
    if memory == "channels_last":
        return x.to(memory_format=torch.channels_last)
    if memory == "strided":
        view = torch.full((*shape[:3], shape[3] + 3), float("nan"), device="cuda", dtype=dtype)[..., 1 : shape[3] + 1]
        return view.copy_(x)
    return x


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not got.isnan().any()
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["nchw", "strided"]  # planar: what the sparse kernels take (channels_last runs cuDNN)
# Every config once (dtype and layout cycling), and every dtype x layout for the 3x3 convs.
CASES = [(*config, DTYPES[i % 3], LAYOUTS[i % 2]) for i, config in enumerate(CONFIGS)] + \
        [(kind, 3, 1, 1, dtype, memory) for kind in ("dense", "depthwise") for dtype in DTYPES for memory in LAYOUTS]


@pytest.mark.parametrize("kind,kernel,stride,dilation,dtype,memory", CASES)
def test_matches_float64_conv(kind, kernel, stride, dilation, dtype, memory):
    generator = torch.Generator("cuda").manual_seed(CASES.index((kind, kernel, stride, dilation, dtype, memory)))
    c_in, size = 40, (19, 37)
    c_out, groups = (c_in, c_in) if kind == "depthwise" else (72, 1)
    padding = kernel // 2 * dilation
    x = spiking_input((6, c_in, *size), dtype, memory, generator).requires_grad_()
    weight = (torch.randn((c_out, c_in // groups, kernel, kernel), generator=generator, device="cuda") / kernel)
    weight = weight.to(dtype).requires_grad_()
    bias = torch.randn(c_out, generator=generator, device="cuda").to(dtype).requires_grad_()
    reset_path_counts()
    y = sparse_conv2d(x, weight, bias, stride, padding, dilation, groups, backend="triton")
    assert path_counts().get("sparse") == 1
    grad_y = torch.randn(y.shape, generator=generator, device="cuda").to(dtype)
    grads = torch.autograd.grad(y, (x, weight, bias), grad_y)
    ref_inputs = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    ref = F.conv2d(*ref_inputs, stride, padding, dilation, groups)
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad_y.double())
    for name, got, want in zip(("y", "grad_x", "grad_w", "grad_b"), (y, *grads), (ref, *ref_grads)):
        assert relative_error(got, want) < TOLERANCE[dtype], name


@pytest.mark.parametrize("memory", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_many_channels_run_several_chunks_and_output_blocks(dtype, memory):
    """160 -> 200 channels at 32x32: 5 chunks of 32 active channels, two output-channel blocks
    (the second partial), 4 x 32 tiles with 8 warps: the default forward configuration."""
    generator = torch.Generator("cuda").manual_seed(2)
    x = spiking_input((4, 160, 32, 32), dtype, memory, generator, density=0.5, plane_silence=0.1)
    weight = (torch.randn((200, 160, 3, 3), generator=generator, device="cuda") / 30).to(dtype)
    bias = torch.randn(200, generator=generator, device="cuda").to(dtype)
    with torch.no_grad():
        y = sparse_conv2d(x, weight, bias, 1, 1, backend="triton")
    assert relative_error(y, F.conv2d(x.double(), weight.double(), bias.double(), 1, 1)) < TOLERANCE[dtype]


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("groups", [1, 40], ids=["dense", "depthwise"])
def test_channels_last_input_runs_cudnn(groups, backend):
    generator = torch.Generator("cuda").manual_seed(4)
    x = spiking_input((6, 40, 19, 37), torch.float16, "channels_last", generator)
    weight = (torch.randn((40, 40 // groups, 3, 3), generator=generator, device="cuda") / 3).half()
    reset_path_counts()
    y = sparse_conv2d(x, weight, None, 1, 1, 1, groups, backend=backend)
    assert torch.equal(y, F.conv2d(x, weight, None, 1, 1, 1, groups))
    assert path_counts() == {"dense:unsupported": 1}


def test_sparse_path_is_graph_capturable():
    generator = torch.Generator("cuda").manual_seed(0)
    x = spiking_input((8, 64, 32, 32), torch.float16, "nchw", generator)
    weight = torch.randn((64, 64, 3, 3), device="cuda", dtype=torch.float16)
    expected = sparse_conv2d(x, weight, None, 1, 1, backend="triton")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sparse_conv2d(x, weight, None, 1, 1, backend="triton")
    x.copy_(spiking_input(x.shape, torch.float16, "nchw", generator))  # new data, same buffers
    graph.replay()
    torch.testing.assert_close(captured, F.conv2d(x, weight, None, 1, 1), rtol=2e-3, atol=2e-2)
    assert not torch.equal(captured, expected)


@pytest.fixture
def fresh_dispatcher(tmp_path, monkeypatch):
    """The dispatcher with no plans and an empty calibration cache of its own; calibrations counted. Each returns
    a crossover at which the sparse path wins up to half the work, not a timing: a measured one depends on the GPU's
    load (beside another job on the GPU it said "never wins", and the eager calls took another path)."""
    from kernels.sparse_conv import calibration, dispatch

    calibrations = []
    wins = calibration.Crossover(graph_forward=0.5, graph_map_forward=0.5, wgrad=-1.0, graph_dense_us=100.0,
                                 graph_map_zero_us=10.0)
    monkeypatch.setattr(calibration, "measure_crossover", lambda *args: calibrations.append(args) or wins)
    monkeypatch.setattr(dispatch, "STATE",
                        dispatch.DispatchState(calibration.CrossoverCache(tmp_path / "crossovers.json")))
    return calibrations


@pytest.mark.parametrize("plane_silence", [0.0, 0.95])
def test_auto_module_eager_calls_run_cudnn_and_only_a_warm_up_calibrates(plane_silence, fresh_dispatcher):
    generator = torch.Generator("cuda").manual_seed(1)
    conv = torch.nn.Conv2d(128, 128, 3, padding=1, bias=False).cuda().half()
    sparse = SparseConv2d.from_dense(conv)
    x = spiking_input((64, 128, 32, 32), torch.float16, "nchw", generator, density=0.5, plane_silence=plane_silence)
    reset_path_counts()
    for _ in range(40):
        y = sparse(x)
    torch.testing.assert_close(y, conv(x), rtol=2e-3, atol=2e-2)
    assert path_counts() == {"dense:eager": 40} and fresh_dispatcher == []
    reset_path_counts()
    with capture_warmup():
        for _ in range(3):
            y = sparse(x)
    torch.cuda.synchronize()
    sparse.density.poll()
    torch.testing.assert_close(y, conv(x), rtol=2e-3, atol=2e-2)
    assert len(fresh_dispatcher) == 1 and path_counts() == {"dense:eager": 3, "probe": 3}
    # the forward's work: chunks of 16 active channels per sample, of 8 (~6 of 128 channels active at 95% silence)
    assert sparse.density.forward == 1.0 if plane_silence == 0.0 else 0.0 < sparse.density.forward <= 0.25


def test_captured_calls_follow_the_graph_crossover_and_the_measured_density():
    """A call captured in a CUDA graph takes the sparse path only where the graph crossover says
    it wins at the density the eager warm-up measured; a site with no measurement captures cuDNN.
    Either way the replay computes the conv of the data it finds."""
    from kernels.sparse_conv import dispatch
    from kernels.sparse_conv.calibration import call_key

    generator = torch.Generator("cuda").manual_seed(3)
    conv = torch.nn.Conv2d(128, 128, 3, padding=1, bias=False).cuda().half()
    sparse = SparseConv2d.from_dense(conv)
    x = spiking_input((128, 128, 32, 32), torch.float16, "nchw", generator, density=0.5, plane_silence=0.9)
    with torch.no_grad():
        with capture_warmup():  # calibrates, measures the density
            for _ in range(3):
                sparse(x)
        torch.cuda.synchronize()
        crossover = dispatch.STATE.crossovers.get(call_key(x, sparse.weight, [1, 1], [1, 1], [1, 1], 1))
        assert crossover.graph_dense_us is not None and crossover.graph_map_zero_us is not None
        for tracker, measured in ((sparse.density, True), (DensityTracker(), False)):
            def call():
                return sparse_conv2d(x, sparse.weight, None, 1, 1, tracker=tracker)

            tracker.poll()
            assert (tracker.forward is not None) == measured
            wins = measured and tracker.forward <= crossover.graph_forward
            reset_path_counts()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = call()
            assert (path_counts().get("sparse", 0) == 1) == wins, (path_counts(), tracker.forward, crossover)
            x.copy_(spiking_input(x.shape, torch.float16, "nchw", generator, density=0.5, plane_silence=0.9))
            graph.replay()
            torch.testing.assert_close(y, conv(x), rtol=2e-3, atol=2e-2)
        # the module, on its eager route: its captured call follows the same rule
        sparse.density.poll()
        wins = sparse.density.forward <= crossover.graph_forward
        reset_path_counts()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = sparse(x)
        assert (path_counts().get("sparse", 0) == 1) == wins, (path_counts(), sparse.density.forward, crossover)
        graph.replay()
        torch.testing.assert_close(y, conv(x), rtol=2e-3, atol=2e-2)
    print(f"graph crossover {crossover.graph_forward:.3f} ({crossover.graph_map_forward:.3f} given the map), "
          f"measured {sparse.density.forward:.3f}")


def test_density_tracker_reads_back_without_waiting():
    tracker = DensityTracker()
    tracker.record(torch.tensor([0.25, 0.5], device="cuda"))
    torch.cuda.synchronize()
    tracker.poll()
    assert (tracker.forward, tracker.wgrad) == (0.25, 0.5)


@pytest.mark.parametrize("size", [(32, 32), (7, 7), (28, 28), (14, 14)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_st_bif_block_map_feeds_the_packed_forward(size, dtype):
    """On the GPU: the ST-BIF kernel's map equals the prescan of its output (its plane flags the
    OR of the blocks), and the conv given it (the packed forward at stride 1, tiles larger than
    small planes) matches float64."""
    from kernels.sparse_conv.function import conv_geometry
    from kernels.sparse_conv.prescan import block_activity
    from kernels.sparse_conv.triton import uses_packed_forward
    from kernels.st_bif import st_bif_multistep_with_block_map

    generator = torch.Generator("cuda").manual_seed(size[0])
    drive = torch.randn((2, 3, 24, *size), generator=generator, device="cuda") * 2
    drive *= torch.rand((1, 3, 24, 1, 1), generator=generator, device="cuda") > 0.7
    spikes_seq, block_map = st_bif_multistep_with_block_map(drive.to(dtype), 1.0, 3, -4)
    x = spikes_seq.flatten(0, 1)
    assert torch.equal(block_map.blocks, block_activity(x))
    assert torch.equal(block_map.planes, block_map.blocks.amax(dim=(1, 2)))
    weight = (torch.randn((40, 24, 3, 3), generator=generator, device="cuda") / 3).to(dtype)
    assert uses_packed_forward(conv_geometry(x, weight, [1, 1], [1, 1], [1, 1], 1))
    y = sparse_conv2d(x, weight, None, 1, 1, backend="triton", block_map=block_map)
    assert relative_error(y, F.conv2d(x.double(), weight.double(), None, 1, 1)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("groups", [1, 128], ids=["dense", "depthwise"])
def test_dependent_launches_wait_for_the_kernel_before(groups):
    """Our kernels launch dependently on sm_90+ (kernels/dependent_launch.py): they may start
    while the kernel before them runs. Each conv here reads what the kernel just before it wrote,
    new values every time, eagerly and replayed in a graph; a load before gdc_wait would read
    stale data."""
    from kernels import dependent_launch
    from kernels.st_bif import st_bif_multistep_with_block_map

    generator = torch.Generator("cuda").manual_seed(7)
    assert dependent_launch.use_pdl(torch.empty(0, device="cuda")) == (torch.cuda.get_device_capability()[0] >= 9)
    weight = (torch.randn((128, 128 // groups, 3, 3), generator=generator, device="cuda") / 34).half()
    drive = torch.empty((4, 32, 128, 32, 32), device="cuda", dtype=torch.float16)
    x = torch.empty((128, 128, 32, 32), device="cuda", dtype=torch.float16)

    def chain():
        spikes, block_map = st_bif_multistep_with_block_map(drive, 1.0, 3, -4)
        return spikes.flatten(0, 1), sparse_conv2d(spikes.flatten(0, 1), weight, None, 1, 1, 1, groups,
                                                   backend="triton", block_map=block_map)

    def new_drive():
        values = torch.randn(drive.shape, generator=generator, device="cuda") * 2
        values *= torch.rand((1, 32, 128, 1, 1), generator=generator, device="cuda") > 0.9
        drive.copy_(values)

    new_drive()
    chain()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        captured_spikes, captured_y = chain()
    with torch.no_grad():
        for _ in range(4):
            x.copy_(spiking_input(x.shape, torch.float16, "nchw", generator, plane_silence=0.9))
            y = sparse_conv2d(x, weight, None, 1, 1, 1, groups, backend="triton")
            want = F.conv2d(x.double(), weight.double(), None, 1, 1, 1, groups)
            assert relative_error(y, want) < TOLERANCE[torch.float16]
            new_drive()
            spikes, y = chain()
            want = F.conv2d(spikes.double(), weight.double(), None, 1, 1, 1, groups)
            assert relative_error(y, want) < TOLERANCE[torch.float16]
            new_drive()
            graph.replay()
            want = F.conv2d(captured_spikes.double(), weight.double(), None, 1, 1, 1, groups)
            assert relative_error(captured_y, want) < TOLERANCE[torch.float16]
