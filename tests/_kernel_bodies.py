"""Kernel bodies written for a device compiler, compiled here as C or C++ and compared
bit for bit with the operations they replace (the CuPy rule, apply and logistic tests)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np

#: CUDA's round-to-nearest intrinsics as the IEEE operations they are (add, sub, mul in
#: double and float); with contraction off, as the intrinsics guarantee on the device
INTRINSICS = """
#define DEF(T, p) \\
    static inline T __##p##add_rn(T a, T b) { return a + b; } \\
    static inline T __##p##sub_rn(T a, T b) { return a - b; } \\
    static inline T __##p##mul_rn(T a, T b) { return a * b; }
DEF(double, d)
DEF(float, f)
"""

#: no contraction into fused multiply-adds, no fast-math reassociation
FLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC"]


def compile_library(
    compiler: str, folder: Path, stem: str, source: str, suffix: str
) -> ctypes.CDLL:
    """``source`` compiled by ``compiler`` into ``folder/stem.so`` (``folder`` private to
    the test run) and loaded; ``suffix`` is the source file's (``.c`` or ``.cpp``)."""
    src, lib = folder / f"{stem}{suffix}", folder / f"{stem}.so"
    src.write_text(source)
    subprocess.run([compiler, *FLAGS, "-o", str(lib), str(src)], check=True, timeout=120)
    return ctypes.CDLL(str(lib))


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    """``a`` and ``b`` of one float dtype hold the same bits (any NaN matching any NaN)."""
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    both_nan = np.isnan(a) & np.isnan(b)
    ints = np.dtype(f"int{8 * a.dtype.itemsize}")
    np.testing.assert_array_equal(
        np.where(both_nan, 0, a).view(ints), np.where(both_nan, 0, b).view(ints)
    )
