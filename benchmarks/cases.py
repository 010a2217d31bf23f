"""The harness's workloads beside :mod:`amopt.bench.cases`: the parameter layouts of the
models the GPU targets and their CPU stand-ins are set at, and the solver-quality runs of
the asv suite.

Examples
--------
>>> import math
>>> sum(math.prod(s) for s in gpt2_small_shapes())
124439808
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from amopt.bench.cases import _a9a_problem, a9a_path, split_sizes

__all__ = [
    "QUALITY_METHODS",
    "QUALITY_PROBLEMS",
    "gpt2_small_shapes",
    "llama_1b_shapes",
    "many_tensor_shapes",
    "shrunk_shapes",
    "solver_quality",
]


# --------------------------------------------------------------------------- model layouts


def gpt2_small_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of GPT-2 small (the output layer is tied to the token embedding)."""
    d, vocab, positions, layers = 768, 50257, 1024, 12
    shapes: list[tuple[int, ...]] = [(vocab, d), (positions, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,)]  # ln_1, attention
        shapes += [(d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]  # ln_2, MLP
    shapes += [(d,), (d,)]  # ln_f
    return shapes


def llama_1b_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of a Llama-3.2-1B-sized decoder (1.24B, tied output layer)."""
    d, ffn, vocab, layers, kv = 2048, 8192, 128256, 16, 512
    shapes: list[tuple[int, ...]] = [(vocab, d)]
    for _ in range(layers):
        shapes += [(d,), (d, d), (kv, d), (kv, d), (d, d)]  # norm, q, k, v, o
        shapes += [(d,), (ffn, d), (ffn, d), (d, ffn)]  # norm, gate, up, down
    shapes.append((d,))
    return shapes


def many_tensor_shapes(shapes: list[tuple[int, ...]], pieces: int) -> list[tuple[int, ...]]:
    """Every shape of ``shapes`` as ``pieces`` 1-D tensors (sizes differing by at most one):
    the same parameter count in ``pieces`` times as many tensors.

    Examples
    --------
    >>> many_tensor_shapes([(4, 5), (3,)], 2)
    [(10,), (10,), (2,), (1,)]
    """
    return [(n,) for s in shapes for n in split_sizes(math.prod(s), pieces)]


def shrunk_shapes(shapes: list[tuple[int, ...]], factor: int = 16) -> list[tuple[int, ...]]:
    """The same tensor count with every dimension divided by ``factor`` (a smoke test)."""
    return [tuple(max(1, n // factor) for n in s) for s in shapes]


# --------------------------------------------------------------------------- solver quality

QUALITY_PROBLEMS = ("quadratic", "mushrooms", "a9a")
QUALITY_METHODS = ("gd", "mgd", "am-mgd", "l-bfgs-b")


def _quality_problem(name: str) -> Any:
    from amopt.problems import LogisticRegression, Quadratic

    if name == "quadratic":
        return Quadratic.from_spectrum(100, cond=100.0, seed=0)
    if name == "mushrooms":
        return LogisticRegression.from_libsvm("mushrooms")
    if name == "a9a":
        return _a9a_problem(str(a9a_path()))
    raise ValueError(f"unknown problem {name!r}; expected one of {QUALITY_PROBLEMS}")


def solver_quality(problem: str, method: str, maxiter: int = 2000) -> dict[str, float]:
    """Final suboptimality and iterations to ``f - f* <= 1e-6`` of one solver on one problem.

    GD, MGD (beta 0.9) and AM-MGD (exact numerator) run ``amopt.minimize`` with
    ``lr = 1/L`` from ``x0 = 0``; L-BFGS-B is ``scipy.optimize.minimize``. ``f*``
    is the problem's reference optimum.

    Returns
    -------
    dict
        ``final_suboptimality`` (``f(x_final) - f*``) and ``iterations_to_1e-6``
        (``nan`` when not reached within ``maxiter``).
    """
    import scipy.optimize

    import amopt

    prob = _quality_problem(problem)
    f_star = float(prob.f_star)
    x0 = np.zeros(prob.dim)
    history: list[float] = []

    def callback(intermediate_result: Any) -> None:
        history.append(float(intermediate_result.fun))

    if method == "l-bfgs-b":
        res = scipy.optimize.minimize(
            prob.value_and_grad,
            x0,
            jac=True,
            method="L-BFGS-B",
            callback=callback,
            options={"maxiter": maxiter, "gtol": 0.0, "ftol": 0.0},
        )
    elif method in ("gd", "mgd", "am-mgd"):
        options: dict[str, Any] = {"lr": 1.0 / prob.L, "maxiter": maxiter, "gtol": 0.0}
        if method == "mgd":
            options["beta"] = 0.9
        res = amopt.minimize(
            prob.value_and_grad, x0, jac=True, method=method, options=options, callback=callback
        )
    else:
        raise ValueError(f"unknown method {method!r}; expected one of {QUALITY_METHODS}")
    final = float(prob.fun(res.x)) - f_star
    reached = next((k + 1 for k, f in enumerate(history) if f - f_star <= 1e-6), math.nan)
    return {"final_suboptimality": final, "iterations_to_1e-6": float(reached)}
