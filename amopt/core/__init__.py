"""The math of Adaptive Memory momentum over the Python array API.

The rules (:mod:`~amopt.core.rule`), their configuration (:mod:`~amopt.core.config`),
the per-scope sums they read (:mod:`~amopt.core.reduce`), the recorder that writes a
rule down for generated kernels (:mod:`~amopt.core.tape`) and the array-API helpers
(:mod:`~amopt.core.xp`). Nothing here imports a concrete array library but NumPy, whose
scalars hold a tape's host values; the kernels of each library are in
:mod:`amopt.backends`.
"""
