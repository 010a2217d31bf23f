"""Plot helpers of the experiments: one palette, the pyplot setup, saving a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["STYLES", "figure_legend", "pyplot", "save_figure"]


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


def figure_legend(fig: Any, axes: list[Any], *, ncol: int | None = None) -> Any:
    """One legend for the whole figure, below every panel, so that it covers no data.

    Collects the labelled artists of ``axes`` (each label once, in order of first
    appearance). Returns the legend (None when nothing is labelled).
    """
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if not handles:
        return None
    fig.tight_layout()  # first, so the panels keep their place and the legend goes below
    return fig.legend(
        list(handles.values()),
        list(handles),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        # about 3.3 inches a column (the longest labels), never wider than the figure
        ncol=ncol or max(1, min(len(handles), 3, int(fig.get_figwidth() // 3.3))),
        frameon=False,
    )


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
