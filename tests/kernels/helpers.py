"""Helpers shared by the kernel tests."""
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def compile_for_hopper(script: str) -> None:
    """Runs `script` (which calls triton.compile for GPUTarget("cuda", 90, 32)) in a process without
    TRITON_INTERPRET: the interpreter runs Python, not Triton's compiler, so only this shows that a kernel
    compiles for the GPU. Fails the test with the compiler's message."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def capture(step):
    """``step`` captured in a CUDA graph after one warm-up call on a side stream (as torch.cuda.graphs recommends):
    (the graph, what the captured call returned)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    return graph, captured
