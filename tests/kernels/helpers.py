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


def hopper_ptx(kernel, values: dict, pointers: dict) -> str:
    """The PTX of ``kernel`` compiled for sm_90 as a launch with ``values`` (every scalar argument's value, by name)
    specializes it: constexprs fixed, pointers (``pointers``: name -> Triton type, e.g. "*fp16") aligned to 16 bytes,
    integers equal to 1 made constants and multiples of 16 known to be. Call it where TRITON_INTERPRET is unset
    (``compile_for_hopper``)."""
    from triton import compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    params = list(zip(kernel.arg_names, kernel.params))
    constant = {name for name, param in params
                if param.is_constexpr or (name not in pointers and type(values.get(name)) is int and values[name] == 1)}
    constexprs = {name: values[name] for name in constant}
    signature = {name: "constexpr" if name in constant else pointers.get(name, "i32") for name, param in params}
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, param) in enumerate(params)
             if name not in constant and (name in pointers or values.get(name, 1) % 16 == 0)}
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def vector_accesses_only(ptx: str) -> list[str]:
    """The PTX's global loads and stores that are not vector ones (empty: every access moves 8 or 16 bytes)."""
    import re

    return [access for access in re.findall(r"(?:ld|st)[.]global[.][.a-z0-9]+", ptx)
            if ".v2." not in access and ".v4." not in access]


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


def assert_replay_equals_eager(step, source: torch.Tensor, gradients) -> None:
    """``step`` (a forward and its backward into ``.grad``, returning the detached output) run eagerly, then captured
    on other values of ``source`` and replayed on the first ones: the replay's output and ``gradients()`` (the
    tensors' ``.grad``, read after each) equal the eager ones bit for bit, as the same kernels in the same order
    must, and the replay reads ``source``."""
    eager = [step(), *(gradient.clone() for gradient in gradients())]
    values = source.detach().clone()
    with torch.no_grad():
        source.copy_(torch.randn_like(source))
    graph, captured = capture(step)
    with torch.no_grad():
        source.copy_(values)
    graph.replay()
    torch.cuda.synchronize()
    replayed = [captured, *gradients()]
    assert len(replayed) == len(eager)
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager))
