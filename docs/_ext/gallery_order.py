"""The gallery's order (an importable function: Sphinx pickles the gallery configuration)."""

from pathlib import Path

#: From the rule on a quadratic to a LIBSVM problem, a network, its telemetry, dask and the
#: theory.
GALLERY_ORDER = (
    "plot_beta_quadratic.py",
    "plot_logreg_libsvm.py",
    "plot_amadamw_vs_adamw.py",
    "plot_telemetry.py",
    "plot_dask_out_of_core.py",
    "plot_theory_check.py",
)


def gallery_key(filename: str) -> tuple[int, str]:
    name = Path(filename).name
    return (GALLERY_ORDER.index(name) if name in GALLERY_ORDER else len(GALLERY_ORDER), name)
