"""Build of amopt's optional C extension: the fused CPU kernels of ``amopt.torch``.

Everything else about the package is in ``pyproject.toml``. ``pip install .`` (and
``pip install -e .``) compile ``amopt/torch/csrc/am_fused.c`` into
``amopt/torch/_am_fused*.so``, a plain shared library that ``amopt.torch._fused`` loads
with :mod:`ctypes`. The extension is optional: without a C compiler, on a compiler that
is not GCC-compatible, or with ``AMOPT_BUILD_KERNELS=0``, the install goes on without
it and the kernels are compiled on first use instead (see ``amopt/torch/_fused.py``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError

ROOT = Path(__file__).resolve().parent
CSRC = Path("amopt") / "torch" / "csrc"
#: The kernel sources, in the order ``amopt.torch._fused.SOURCES`` hashes them.
SOURCES = ("am_fused.c", "am_fused_common.h", "am_fused_kernels.h", "am_fused_variant.h")
BASE_FLAGS = ["-O3", "-g0", "-fno-math-errno", "-ffp-contract=off", "-std=c99"]
# tried in order until one builds: OpenMP threads, then SIMD pragmas only, then plain C
FLAG_SETS = (["-fopenmp"], ["-fopenmp-simd"], [])


def kernel_source_hash() -> str:
    """SHA-256 of the kernel sources: the loader refuses a library built from others."""
    data = b"\0".join((ROOT / CSRC / name).read_bytes() for name in SOURCES)
    return hashlib.sha256(data).hexdigest()


class BuildKernels(build_ext):
    """Build the kernel library with the first flag set the compiler accepts; never fail."""

    def build_extension(self, ext: Extension) -> None:
        if os.environ.get("AMOPT_BUILD_KERNELS", "1").strip().lower() in ("0", "false", "no"):
            self.announce("amopt: AMOPT_BUILD_KERNELS=0, kernels left to the first use", 2)
            return
        if self.compiler.compiler_type != "unix":
            self.announce("amopt: no GCC-compatible compiler, kernels left to the first use", 2)
            return
        errors = []
        for flags in FLAG_SETS:
            ext.extra_compile_args = [*BASE_FLAGS, *flags]
            ext.extra_link_args = [f for f in flags if f == "-fopenmp"]
            try:
                super().build_extension(ext)
                return
            except (CCompilerError, CompileError, ExecError, LinkError) as exc:
                errors.append(f"{' '.join(flags) or 'no OpenMP'}: {exc}")
                self.force = True  # rebuild the objects with the next flags
        self.warn(
            "amopt: the fused kernels could not be built now; they are compiled on first "
            "use instead (" + "; ".join(errors) + ")"
        )

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []  # a plain library for ctypes, no Python module init function


if __name__ == "__main__":
    setup(
        ext_modules=[
            Extension(
                "amopt.torch._am_fused",
                sources=[str(CSRC / SOURCES[0])],
                depends=[str(CSRC / name) for name in SOURCES[1:]],
                define_macros=[("AM_SOURCE_HASH", f'"{kernel_source_hash()}"')],
                libraries=["m"],
                optional=True,
            )
        ],
        cmdclass={"build_ext": BuildKernels},
    )
