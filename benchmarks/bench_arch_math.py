"""Benchmark: the α entropy and KL (aso_se.search.fast_math) compiled by torch.compile vs eager, on CUDA.

Per function, in one process: the first call of the compiled version (the compile, on whatever caches
the machine has) and the median per-call time of both versions afterwards (forward + backward for the
entropy, as in the α loss; forward for the KL, as at epoch ends), and the number of calls after which the
compile would pay for itself. Shapes: both cell types' α of DARTS's space ([2, 14, 8]).

    python benchmarks/bench_arch_math.py
"""
from __future__ import annotations

import statistics
import time

import torch

from aso_se.search import fast_math


def per_call_ms(fn, calls: int = 200) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    alpha = torch.randn(2, 14, 8, device="cuda", requires_grad=True)
    start_logits = torch.randn(2, 14, 8, device="cuda")
    compiled_entropy = torch.compile(fast_math.entropy, fullgraph=True, dynamic=False)
    compiled_kl = torch.compile(fast_math.kl_divergence, fullgraph=True, dynamic=False)
    cases = {
        "entropy fwd+bwd": (lambda f: (lambda: f(alpha).mean().backward()), fast_math.entropy, compiled_entropy),
        "kl fwd": (lambda f: (lambda: f(alpha.detach(), start_logits)), fast_math.kl_divergence, compiled_kl),
    }
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}")
    print("| function | first compiled call (s) | eager per call (ms) | compiled per call (ms) | calls to pay back |")
    print("|---|---:|---:|---:|---:|")
    for name, (make, eager, compiled) in cases.items():
        start = time.perf_counter()
        make(compiled)()
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        eager_ms, compiled_ms = per_call_ms(make(eager)), per_call_ms(make(compiled))
        saved = eager_ms - compiled_ms
        payback = f"{first * 1000 / saved:,.0f}" if saved > 0 else "never"
        print(f"| {name} | {first:.2f} | {eager_ms:.3f} | {compiled_ms:.3f} | {payback} |")


if __name__ == "__main__":
    main()
