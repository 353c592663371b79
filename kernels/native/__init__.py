"""The C++ autograd node of the eager neurons (threshold_node.cpp): its build (build.py), what a neuron keeps of
it (spec.py) and the kernel launches it takes (arguments.py).

A Python autograd.Function costs host time per layer in its own machinery (benchmarks/RESULTS.md); the node
in threshold_node.cpp launches the same compiled Triton kernels from C++. Until it is built, or where it cannot
be, the neurons run on their Python autograd.Function, with the same kernels and the same results.
ASO_SE_NATIVE=0 turns it off; `wait()` blocks until the build ends (tests, benchmarks).
"""
from .build import build_error, build_library, compile_command, enabled, module, wait

__all__ = ["build_error", "build_library", "compile_command", "enabled", "module", "wait"]
