"""Test-wide setup. Runs before any test module imports triton."""
import os

# CI has no GPU: Triton kernels run on the CPU through Triton's interpreter, which must be
# switched on before triton is first imported. On a CUDA machine the real compiler is kept.
if "TRITON_INTERPRET" not in os.environ and not os.path.exists("/dev/nvidia0"):
    os.environ["TRITON_INTERPRET"] = "1"
