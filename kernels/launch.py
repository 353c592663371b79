"""Kernel launches that skip `JITFunction.run` once a kernel is compiled for a launch key.

`JITFunction.run` binds and specializes every argument, builds a cache key from them and the
options, and makes launch metadata for two Python hooks on every call. Here the first launch
for a key goes through it (compiling if needed) and keeps the compiled kernel's launcher under
that key; later launches call it directly, with the arguments in the kernel's order (constexprs
included, as `run` passes them; pointers as addresses). The caller's key must fix every
argument's specialization: dtypes, integer values, pointer alignment to 16 bytes. Under the CPU
interpreter, or while launch hooks are registered (profilers), launches go through `run`.
"""
from typing import Any, Callable, Hashable

import torch
from triton import knobs
from triton.compiler import CompiledKernel

# (launcher, function handle, the launcher's arguments between the function and the hooks, the compiled kernel)
Handle = tuple[Callable[..., Any], Any, tuple, CompiledKernel]

_RUNTIME = knobs.runtime
# The hook chains every launch passes to its launcher; while both are these and empty, a launch
# without them (None, as for a kernel launched without hooks) does the same.
_ENTER, _EXIT = _RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook


def _cuda_launcher_type() -> type | None:
    try:
        from triton.backends.nvidia.driver import CudaLauncher
    except ImportError:  # another backend
        return None
    return CudaLauncher


def keep(compiled: CompiledKernel) -> Handle:
    """The handle of a compiled kernel that was launched once (its launcher is loaded)."""
    launcher = compiled.run
    cuda_launcher = _cuda_launcher_type()
    if (cuda_launcher is not None and isinstance(launcher, cuda_launcher) and not launcher.global_scratch_size
            and not launcher.profile_scratch_size):
        # CudaLauncher.__call__ allocates no scratch then: call its C launch with what it adds.
        prefix = (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None, compiled.packed_metadata)
        return launcher.launch, compiled.function, prefix, compiled
    return launcher, compiled.function, (compiled.packed_metadata,), compiled


def launch(
    kernel: Any, handles: dict[Hashable, Handle], key: Hashable, device_index: int | None, num_programs: int,
    tensors: tuple, pointers: tuple | None, scalars: tuple, num_warps: int, pdl: bool = False,
) -> None:
    """kernel[(num_programs,)](*tensors, *scalars, num_warps=, launch_pdl=) on the current stream of
    device `device_index` (None: CPU tensors, under the interpreter). `tensors` are the kernel's
    leading pointer arguments (or None), `pointers` their data_ptr()s (None where they are None):
    a kept launch takes the addresses, which spares its launcher a method call and a driver query
    per pointer. `handles` holds the kernel's kept launches, by key."""
    if device_index is not None and torch._C._cuda_getDevice() != device_index:
        with torch.cuda.device(device_index):
            return launch(kernel, handles, key, device_index, num_programs, tensors, pointers, scalars, num_warps, pdl)
    handle = handles.get(key)
    if (handle is not None and _RUNTIME.launch_enter_hook is _ENTER and not _ENTER.calls
            and _RUNTIME.launch_exit_hook is _EXIT and not _EXIT.calls):
        launcher, function, prefix, _ = handle
        stream = torch._C._cuda_getCurrentRawStream(device_index)
        launcher(num_programs, 1, 1, stream, function, *prefix, None, None, None, *pointers, *scalars)
        return None
    compiled = kernel[(num_programs,)](*tensors, *scalars, num_warps=num_warps, launch_pdl=pdl)
    if device_index is not None and isinstance(compiled, CompiledKernel):
        handles[key] = keep(compiled)
    return None
