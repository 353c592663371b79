"""The build of the C++ node (threshold_node.cpp): started on first use, in a background thread, and cached.

It is built with the system C++ compiler against the installed torch (no CUDA toolkit: it calls the driver
through dlsym) into ~/.cache/aso_se (ASO_SE_CACHE to move it). A process builds it at most once (`BUILD`); a
failed build warns once and leaves the neurons on their Python path.
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


class Build:
    """One process's build of the node: its thread once started, then the loaded extension or why it failed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.module: ModuleType | None = None
        self.error: str | None = None

    def start(self) -> threading.Thread | None:
        """Starts the build unless it started or ended before; returns its thread (None once it ended before)."""
        with self.lock:
            if self.thread is None and self.module is None and self.error is None:
                self.thread = threading.Thread(target=self._build_and_load, name="aso_se-native-build", daemon=True)
                self.thread.start()
            return self.thread

    def _build_and_load(self) -> None:
        try:
            path = build_library()
            spec = importlib.util.spec_from_file_location(
                _NAME, path, loader=importlib.machinery.ExtensionFileLoader(_NAME, str(path)))
            loaded = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded)
            self.module = loaded
        except Exception as error:  # no compiler, no headers, a failed load: the Python path stays
            self.error = f"{type(error).__name__}: {error}".strip()
            warnings.warn(f"the C++ neuron node was not built ({self.error.splitlines()[0]}); the neurons run on "
                          "their Python autograd.Function (set ASO_SE_NATIVE=0 to skip the build)", stacklevel=1)


# The process's build; the functions below read it at each call, so a test may swap in a fresh one.
BUILD = Build()


def enabled() -> bool:
    """Whether the node may be used: ASO_SE_NATIVE is not 0."""
    return os.environ.get("ASO_SE_NATIVE", "1") != "0"


def module() -> ModuleType | None:
    """The built extension, or None while it builds, where it failed, or when it is turned off. Starts the
    build (in the background) on first call."""
    if not enabled():
        return None
    build = BUILD
    if build.module is not None or build.error is not None:
        return build.module
    build.start()
    return None


def wait() -> ModuleType | None:
    """`module()`, after waiting for the build to end."""
    if not enabled():
        return None
    build = BUILD
    thread = build.start()
    if thread is not None:
        thread.join()
    return build.module


def build_error() -> str | None:
    """Why the build failed, or None."""
    return BUILD.error


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


def build_library() -> Path:
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
