"""A compiled Triton kernel's launch as the C++ node takes it: the function, its launch shape, and per argument
either a role (a pointer given per call) or a fixed value.

The C++ node builds the argument buffer Triton's CUDA launcher builds (triton/backends/nvidia/driver.py,
`make_launcher`): every argument whose signature type is not "constexpr", in order, then the global and
profile scratch pointers. Kernels this cannot launch exactly so (fp16/bf16 scalars, scratch, clusters, PDL,
cooperative grids, tensor descriptors) are refused with ValueError, and stay on the Python launcher.
"""
import struct
from typing import Any, NamedTuple

FIXED = -1  # the role of an argument whose value is fixed (threshold_node.cpp: kFixed)
_INTEGER_TYPES = frozenset({"i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"})
_BITS = 2**64 - 1
# Float arguments go as their bits, as Triton's launcher packs them.
_FLOAT_FORMATS = {"fp32": ("<f", "<I"), "fp64": ("<d", "<Q")}


class NativeKernel(NamedTuple):
    function: int  # CUfunction
    grid: int
    threads: int
    shared_bytes: int
    roles: list[int]  # per non-constexpr argument
    values: list[int]  # its value as 64 bits where the role is FIXED, else 0


def argument_slots(signature: dict[str, str], arguments: tuple, pointer_roles: tuple[int | None, ...]
                   ) -> tuple[list[int], list[int]]:
    """(roles, values) of the arguments a launch passes, from the kernel's signature (name -> type, in order)
    and the values it was launched with: `pointer_roles` gives the role of each leading pointer argument
    (None where the argument was None, a constexpr), the rest of `arguments` are its scalars (integers, or
    fp32/fp64 given as their bits)."""
    types = list(signature.values())
    if len(types) != len(arguments):
        raise ValueError(f"the signature has {len(types)} arguments, the launch passed {len(arguments)}")
    roles, values = [], []
    for index, (kind, value) in enumerate(zip(types, arguments)):
        if kind == "constexpr":
            continue
        if index < len(pointer_roles):
            role = pointer_roles[index]
            if not kind.startswith("*") or role is None:
                raise ValueError(f"argument {index} ({kind}) is not a pointer with a role")
            roles.append(role)
            values.append(0)
        elif kind in _INTEGER_TYPES and isinstance(value, int):
            roles.append(FIXED)
            values.append(int(value) & _BITS)  # two's complement in 64 bits
        elif kind in _FLOAT_FORMATS and isinstance(value, (int, float)):
            as_float, as_bits = _FLOAT_FORMATS[kind]
            roles.append(FIXED)
            values.append(struct.unpack(as_bits, struct.pack(as_float, value))[0])
        else:
            raise ValueError(f"argument {index} of type {kind!r} cannot be passed as a fixed value")
    return roles, values


def native_kernel(compiled: Any, num_programs: int, arguments: tuple, pointer_roles: tuple[int | None, ...]
                  ) -> NativeKernel:
    """The NativeKernel of a compiled Triton kernel (launched once, so loaded) and one launch's arguments."""
    meta = compiled.metadata
    if (getattr(meta, "num_ctas", 1) != 1 or meta.launch_pdl or meta.launch_cooperative_grid
            or meta.global_scratch_size or meta.profile_scratch_size or getattr(meta, "tensordesc_meta", None)):
        raise ValueError(f"kernel {compiled.name} needs launch options the C++ node does not pass")
    if compiled.function is None:
        raise ValueError(f"kernel {compiled.name} is not loaded")
    roles, values = argument_slots(compiled.src.signature, arguments, pointer_roles)
    return NativeKernel(int(compiled.function), num_programs, 32 * meta.num_warps, meta.shared, roles, values)
