"""The Triton kernels compiled for CUDA GPUs, without one.

``tests/test_triton.py`` runs the kernels in Triton's interpreter, which executes
their Python and so accepts code that the compiler rejects (a dtype mix, a
non-constexpr branch, a Python construct the code generator does not know). Here
every specialisation the drivers launch is compiled ahead of time, through Triton's
own pipeline (TTIR, TTGIR, LLVM IR, PTX and ``ptxas`` to a cubin), for the
compute capabilities of an A100 (8.0) and an H100 (9.0). The specialisations are
the ones ``triton_amsgd`` and ``triton_am_adamw`` actually launch: their launches
are recorded (not run) over every parameter dtype, scope, weight-decay mode,
gradient scaler and ``maximize``. The generated PTX is then checked for two facts
of the memory-bound passes:

* float64 arithmetic appears exactly where the kernel computes in float64 (a float64
  parameter, or AMSGD's float64 sums by design), never in a float32 pass;
* whole aligned blocks of float32 are read with 128-bit vector loads.

The recording and compiling run in a child process without ``TRITON_INTERPRET``:
``triton.language``'s own jit functions are interpreted ones when the variable was
set at import, and ``tests/test_triton.py`` sets it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
ARCHS = (80, 90)
_F64_OP = re.compile(r"\b(?:add|sub|mul|fma|div|sqrt|rcp)\.[a-z.]*f64\b")


def _record_and_compile() -> list[dict]:
    """Child process: record the drivers' launches, compile each one for ``ARCHS``."""
    import inspect
    import itertools

    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from amopt.core.config import AMConfig
    from amopt.torch import _triton as tri
    from amopt.torch._records import AdamHyper, AdamTensors, Scaler, SGDHyper, SGDTensors

    kernels = tri._kernels(False)
    launches: dict[tuple, tuple] = {}

    class Recorder:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                consts = {k: v for k, v in kwargs.items() if k.isupper()}
                options = {k: v for k, v in kwargs.items() if not k.isupper()}
                types = tuple(a.dtype if isinstance(a, torch.Tensor) else type(a) for a in args)
                key = (
                    self.name,
                    self.kernel,
                    tuple(sorted((k, str(v)) for k, v in consts.items())),
                    types,
                )
                launches.setdefault(key, (self.name, self.kernel, args, consts, options))

            return launch

    def rule_kernels(rule, config, dtype, extra=None):
        # the rule kernels the drivers make (one per rule, configuration, dtype and extra
        # input: the learning-rate ratio, the first-step flag)
        kernel = kernels["rule"](rule, config, dtype, extra=extra)
        return None if kernel is None else Recorder("rule", kernel)

    recorders = {
        k: v if k == "dtypes" else Recorder(k, v) for k, v in kernels.items() if k != "rule"
    }
    recorders["rule"] = rule_kernels
    tri._kernels = lambda interpret: recorders
    tri._interpret = lambda: False
    tri._require = lambda name, tensors: None  # CPU tensors stand in for CUDA ones

    dtypes = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    for dtype, per_layer, scaled in itertools.product(dtypes, (True, False), (False, True)):
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(s, generator=gen).to(dtype) for s in ((130, 131), (7,))]
        gs = [torch.randn(x.shape, generator=gen).to(dtype) for x in xs]
        amp = Scaler(torch.tensor(2.0), torch.tensor(0.0)) if scaled else Scaler()
        cfg = AMConfig(lam=0.1, beta_max=0.9, per_layer=per_layer, numerator="linear")
        for wd, maximize in ((0.0, False), (0.1, True)):
            steps = [torch.zeros(()) for _ in xs]
            t = SGDTensors(xs, gs, [None] * len(xs), steps)
            tri.triton_amsgd(t, SGDHyper(1e-2, wd, maximize, cfg), amp)
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        for mode in ("decoupled", "proximal", "l2"):
            t = AdamTensors(
                xs,
                gs,
                [torch.zeros_like(x) for x in xs],
                [torch.zeros_like(x) for x in xs],
                [torch.zeros(()) for _ in xs],
                [torch.ones((), dtype=acc) for _ in xs],
            )
            tri.triton_am_adamw(t, AdamHyper(1e-3, 0.99, 1e-8, 0.1, mode, scaled, cfg), amp)

    pointer = {
        torch.float16: "*fp16",
        torch.bfloat16: "*bf16",
        torch.float32: "*fp32",
        torch.float64: "*fp64",
        torch.int32: "*i32",
        torch.int64: "*i64",
        torch.uint8: "*u8",
        torch.bool: "*i1",
    }
    results = []
    for name, fn, args, consts, options in launches.values():
        signature = {}
        for param, value in zip(inspect.signature(fn.fn).parameters, args, strict=False):
            if isinstance(value, torch.Tensor):
                signature[param] = pointer[value.dtype]
            elif isinstance(value, bool):
                signature[param] = "i1"
            elif isinstance(value, int):
                signature[param] = "i64"
            else:
                signature[param] = "fp64"
        signature.update(dict.fromkeys(consts, "constexpr"))
        for arch in ARCHS:
            entry = {
                "kernel": name,
                "arch": arch,
                "consts": {k: str(v) for k, v in consts.items()},
                "first": pointer[args[0].dtype],  # a rule kernel computes in its sums' dtype
            }
            try:
                compiled = triton.compile(
                    ASTSource(fn=fn, signature=signature, constexprs=consts),
                    target=GPUTarget("cuda", arch, 32),
                    options=options,
                )
            except Exception as exc:  # reported, with the specialisation, by the test
                entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            else:
                ptx = compiled.asm["ptx"]
                entry["f64_ops"] = sorted(set(_F64_OP.findall(ptx)))
                entry["fma"] = len(re.findall(r"\bfma\.[a-z.]*f(?:32|64)\b", ptx))
                entry["vector_loads"] = len(re.findall(r"ld\.global(?:\.[a-z]+)*\.v4\.b32", ptx))
                entry["cubin_bytes"] = len(compiled.asm["cubin"])
            results.append(entry)
    return results


def _nvidia_backend() -> str | None:
    """Why Triton cannot compile for CUDA here, or ``None``."""
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError as exc:
        return f"Triton has no CUDA backend here ({exc})"
    ptxas = Path(compiler.__file__).parent / "bin" / "ptxas"
    if not ptxas.exists():
        return f"Triton ships no ptxas ({ptxas})"
    return None


@pytest.fixture(scope="module")
def compiled():
    reason = _nvidia_backend()
    if reason is not None:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run(
        [sys.executable, __file__, "--worker"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_launched_specialisation_compiles(compiled):
    kinds = {e["kernel"] for e in compiled}
    assert kinds == {"sgd_reduce", "sgd_apply", "adam_reduce", "adam_apply", "segment_sum", "rule"}
    assert {e["arch"] for e in compiled} == set(ARCHS)
    failed = [e for e in compiled if "error" in e]
    assert not failed, "\n".join(
        f"{e['kernel']} sm_{e['arch']} {e['consts']}: {e['error']}" for e in failed
    )
    assert all(e["cubin_bytes"] > 0 for e in compiled)
    # every parameter dtype reached the kernels, with and without masks
    for name in ("sgd_apply", "adam_reduce", "adam_apply"):
        dts = {e["consts"]["DT"] for e in compiled if e["kernel"] == name}
        assert dts == {"fp16", "bf16", "fp32", "fp64"}, (name, dts)
        masked = {e["consts"]["MASKED"] for e in compiled if e["kernel"] == name}
        assert masked == {"True", "False"}, (name, masked)


def _compute_dtype(entry: dict) -> str:
    if entry["kernel"] == "rule":
        return entry["first"].lstrip("*")
    consts = entry["consts"]
    return consts.get("CT", consts.get("ACC"))


def test_float64_arithmetic_only_where_the_kernel_computes_in_float64(compiled):
    for e in compiled:
        if "error" in e:
            continue
        wide = _compute_dtype(e) == "fp64"
        assert bool(e["f64_ops"]) == wide, (e["kernel"], e["consts"], e["f64_ops"])


def test_the_rule_kernels_round_every_operation_once(compiled):
    """No multiply-add contracted in a rule kernel (one rounding where the rule's array
    operations round twice), and both sums dtypes reached them."""
    rules = [e for e in compiled if e["kernel"] == "rule" and "error" not in e]
    assert {e["first"] for e in rules} == {"*fp32", "*fp64"}
    assert all(e["fma"] == 0 for e in rules), [(e["consts"], e["fma"]) for e in rules]


def test_aligned_float32_blocks_are_read_with_vector_loads(compiled):
    checked = 0
    for e in compiled:
        c = e["consts"]
        if "error" in e or e["kernel"] in ("segment_sum", "rule"):
            continue
        if c["DT"] == "fp32" and c["ALIGNED"] == "True" and c["MASKED"] == "False":
            # x, g, d (and v): one 128-bit load per four floats of each stream
            assert e["vector_loads"] >= 3, (e["kernel"], c, e["vector_loads"])
            checked += 1
    assert checked >= 4


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    print(json.dumps(_record_and_compile()))
