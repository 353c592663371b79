"""Test-wide setup. Runs before any test module imports triton."""
import os

# CI has no GPU: Triton kernels run on the CPU through Triton's interpreter, which must be
# switched on before triton is first imported. On a CUDA machine the real compiler is kept.
if "TRITON_INTERPRET" not in os.environ and not os.path.exists("/dev/nvidia0"):
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402 - after the interpreter switch

# Tests use tiny tensors: one intra-op thread. Extra threads buy nothing at these sizes, and
# on a busy 2-core machine their spin-waits made whole test folders 10x slower (13 s vs 178 s).
torch.set_num_threads(1)
