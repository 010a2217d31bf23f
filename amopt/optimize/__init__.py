"""The driver of :func:`amopt.minimize`: the steps, the METHODS table and the loop.

:mod:`~amopt.optimize.steps` holds the public pure step functions (one AM step on
arrays, each library's kernel found in :mod:`amopt.backends`), and
:mod:`~amopt.optimize.split` the AM steps cut at the rule for the device loop;
:mod:`~amopt.optimize.methods` the table of methods, each a step factory and its
options; :mod:`~amopt.optimize.loop` the iteration loop, the objective wrapper and the
stop reasons; :mod:`~amopt.optimize.minimize` the public entry points.
"""
