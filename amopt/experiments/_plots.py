"""Plot helpers of the experiments: one palette, the pyplot setup, saving a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["STYLES", "pyplot", "save_figure"]


#: Colour and line style of each method, the same in every plot.
STYLES: dict[str, tuple[str, str]] = {
    "GD": ("tab:gray", "-"),
    "MGD (0.9)": ("tab:blue", "--"),
    "MGD (beta*)": ("tab:blue", "-"),
    "HB (beta*)": ("tab:green", "-"),
    "AM-MGD (exact)": ("tab:red", "-"),
    "AM-MGD (linear)": ("tab:orange", "-"),
    "L-BFGS-B": ("k", ":"),
    "CG": ("tab:purple", ":"),
    "Adam": ("tab:blue", "-"),
    "AM-Adam (linear)": ("tab:purple", "-"),
    "AM-Adam (exact)": ("tab:pink", "--"),
    "AdamW (warm-up)": ("tab:blue", "-"),
    "AdamW (no warm-up)": ("tab:blue", "--"),
    "AM-AdamW (warm-up)": ("tab:red", "-"),
    "AM-AdamW (no warm-up)": ("tab:red", "--"),
    "AM-AdamW (clip)": ("tab:orange", "-"),
    "AM-AdamW (restart)": ("tab:green", "-"),
}


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, with readable defaults."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 110,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.titlesize": 10,
            "axes.labelsize": 9,
            "legend.fontsize": 7.5,
            "xtick.labelsize": 8,
            "ytick.labelsize": 8,
        }
    )
    return plt


def save_figure(fig: Any, path: Path) -> str:
    """Save, close, and return the file name (for the result's ``plots`` list)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name
