"""The C++ autograd node of the eager neurons (threshold_node.cpp), built on first use and cached.

A Python autograd.Function costs host time per layer in its own machinery (benchmarks/RESULTS.md); the node
in threshold_node.cpp launches the same compiled Triton kernels from C++. It is built with the
system C++ compiler against the installed torch (no CUDA toolkit: it calls the driver through dlsym) into
~/.cache/aso_se (ASO_SE_CACHE to move it), in a background thread: until it is ready, or where it cannot be
built, the neurons run on their Python autograd.Function, with the same kernels and the same results.
ASO_SE_NATIVE=0 turns it off; `wait()` blocks until the build ends (tests, benchmarks).
"""
import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from pathlib import Path
from types import ModuleType

import torch

_SOURCE = Path(__file__).with_name("threshold_node.cpp")
_NAME = "aso_se_threshold_node"

_lock = threading.Lock()
_thread: threading.Thread | None = None
_module: ModuleType | None = None
_error: str | None = None


def enabled() -> bool:
    """Whether the node may be used: ASO_SE_NATIVE is not 0."""
    return os.environ.get("ASO_SE_NATIVE", "1") != "0"


def module() -> ModuleType | None:
    """The built extension, or None while it builds, where it failed, or when it is turned off. Starts the
    build (in the background) on first call."""
    if not enabled():
        return None
    if _module is not None or _error is not None:
        return _module
    _start()
    return None


def wait() -> ModuleType | None:
    """`module()`, after waiting for the build to end."""
    if not enabled():
        return None
    thread = _start()
    if thread is not None:
        thread.join()
    return _module


def build_error() -> str | None:
    """Why the build failed, or None."""
    return _error


def _start() -> threading.Thread | None:
    global _thread
    with _lock:
        if _thread is None and _module is None and _error is None:
            _thread = threading.Thread(target=_build_and_load, name="aso_se-native-build", daemon=True)
            _thread.start()
        return _thread


def _build_and_load() -> None:
    global _module, _error
    try:
        path = build()
        spec = importlib.util.spec_from_file_location(_NAME, path,
                                                      loader=importlib.machinery.ExtensionFileLoader(_NAME, str(path)))
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        _module = loaded
    except Exception as error:  # no compiler, no headers, a failed load: the Python path stays
        _error = f"{type(error).__name__}: {error}".strip()
        warnings.warn(f"the C++ neuron node was not built ({_error.splitlines()[0]}); the neurons run on their "
                      "Python autograd.Function (set ASO_SE_NATIVE=0 to skip the build)", stacklevel=1)


def compile_command(output: Path) -> list[str]:
    """The compiler command that builds the extension to `output`."""
    torch_root = Path(torch.__file__).parent
    torch_lib = torch_root / "lib"
    compiler = os.environ.get("CXX", "c++")
    include_dirs = [torch_root / "include", torch_root / "include" / "torch" / "csrc" / "api" / "include",
                    sysconfig.get_paths()["include"]]
    includes = [f"-I{path}" for path in include_dirs]
    return [
        compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", f"-DTORCH_EXTENSION_NAME={_NAME}",
        *includes, str(_SOURCE), "-o", str(output),
        f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ldl",
    ]


def _cache_dir() -> Path:
    root = os.environ.get("ASO_SE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "aso_se")
    return Path(root)


def build() -> Path:
    """Builds the extension (blocking) unless a build of this source for this torch and Python is cached;
    returns the path of the shared library."""
    digest = hashlib.sha256()
    digest.update(_SOURCE.read_bytes())
    digest.update(f"{torch.__version__}|{sys.version}|{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    output = _cache_dir() / f"{_NAME}-{digest.hexdigest()[:16]}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if output.exists():
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent) as scratch:
        partial = Path(scratch) / output.name
        result = subprocess.run(compile_command(partial), capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"the compiler exited {result.returncode}: {result.stderr.strip()[-2000:]}")
        os.replace(partial, output)  # atomic: a concurrent process sees no half-written library
    return output
