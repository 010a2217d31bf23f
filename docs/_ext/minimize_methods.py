"""One page per method of ``amopt.minimize``, made from its options docstring.

As scipy's reference has a page per ``minimize`` method: the text is what
``amopt.show_options(method, disp=False)`` returns (the docstring of
``amopt.METHODS[method]``), written as reST under ``docs/api/minimize/`` before Sphinx
reads the sources (the folder is generated, like autosummary's ``generated/``).
"""

from __future__ import annotations

from pathlib import Path


def write_pages(folder: Path) -> list[str]:
    """Write ``index.rst`` and one ``<method>.rst`` per method into ``folder``."""
    import amopt

    folder.mkdir(parents=True, exist_ok=True)
    names = list(amopt.METHODS)
    for method in names:
        text = amopt.show_options(method, disp=False).strip("\n")
        title = f'``minimize(method="{method}")``'  # literal: no typographic quotes
        page = [
            title,
            "=" * len(title),
            "",
            f'The options of ``amopt.minimize(fun, x0, method="{method}", options={{...}})``,',
            f'as ``amopt.show_options("{method}")`` prints them.',
            "",
            text,
            "",
        ]
        (folder / f"{method}.rst").write_text("\n".join(page), encoding="utf-8")
    index = [
        "``minimize`` methods",
        "====================",
        "",
        "One page per method of :func:`amopt.minimize`: its update and its options with",
        "their defaults (``amopt.show_options(method)`` prints the same text).",
        "",
        ".. toctree::",
        "   :maxdepth: 1",
        "",
        *(f"   {method}" for method in names),
        "",
    ]
    (folder / "index.rst").write_text("\n".join(index), encoding="utf-8")
    return names
