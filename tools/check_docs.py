"""Open the built documentation in a real headless browser and check that it works.

Usage (after ``python -m sphinx -W --keep-going -b html docs docs/_build/html``)::

    python tools/check_docs.py [docs/_build/html] [--out DIR] [--chromium PATH]

Needs ``pip install playwright`` and a Chromium from the system (Debian:
``apt-get install chromium``); playwright drives it through ``executable_path``, so no browser
is downloaded. The site is served from 127.0.0.1 on a free port; any request to another host
is refused and counts as a failure, so a page that needs the network fails here.

Checked on the index, one API page, three gallery pages, one user-guide page and the
performance page: the page loads; every image on it is loaded (``naturalWidth > 0``; the
index, the gallery pages and the user-guide page must have one at least); every math element
is typeset by MathJax with no MathJax error (each of these pages but the performance page and
the dask example has math); the performance page holds the tables rendered from the bench's
JSON; no console error, no page error, no failed request and no
HTTP status >= 400. Then the site's
search for ``AMAdamW`` must list the optimizer's API page. A full-page screenshot of each
page is written to ``--out`` (default ``docs/_build/check``). Exit status 0 when all passes.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]

#: (name, path in the site, needs an image, needs math, a CSS selector it must hold or None)
PAGES = (
    ("index", "index.html", True, True, None),
    ("api", "api/generated/amopt.torch.AMAdamW.html", False, True, None),
    ("gallery", "auto_examples/plot_beta_quadratic.html", True, True, None),
    # a MyST page with display math and a figure made at build time
    ("guide", "user-guide/adaptive-memory.html", True, True, None),
    # the tables rendered from the bench's JSON, each with its machine and setup
    ("performance", "performance.html", False, False, "table.bench-table"),
    ("gallery-telemetry", "auto_examples/plot_telemetry.html", True, True, None),
    ("gallery-dask", "auto_examples/plot_dask_out_of_core.html", True, False, None),
)
SEARCH_TERM = "AMAdamW"
SEARCH_TARGET = "api/generated/amopt.torch.AMAdamW.html"

#: the elements Sphinx writes math into (MathJax adds spans of class "math" of its own)
MATH_STATE = """() => {
    const SPHINX_MATH = '.math.notranslate';
    const maths = [...document.querySelectorAll(SPHINX_MATH)];
    const typeset = maths.filter(
        m => m.querySelector('.MathJax, .MathJax_Display, .MathJax_SVG, mjx-container'));
    return {
        total: maths.length,
        typeset: typeset.length,
        errors: document.querySelectorAll('.MathJax_Error, merror, [data-mjx-error]').length,
        hub: !!(window.MathJax && window.MathJax.Hub),
    };
}"""

IMAGES = """() => [...document.images].map(i => ({
    src: i.currentSrc || i.src, complete: i.complete, width: i.naturalWidth,
}))"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the browser's own checks report failures
        pass


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    return server, f"http://{host}:{port}/"


def _find_chromium(given: str | None) -> str:
    for candidate in (given, shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("no Chromium found: apt-get install chromium, or pass --chromium PATH")


def _check_page(
    page,
    base: str,
    name: str,
    path: str,
    need_image: bool,
    need_math: bool,
    selector: str | None,
    out: Path,
) -> list[str]:
    problems: list[str] = []
    page.goto(base + path, wait_until="load")
    page.wait_for_load_state("networkidle")
    if selector is not None and page.locator(selector).count() == 0:
        problems.append(f"{name}: nothing matches {selector!r}")
    if need_math:
        try:
            page.wait_for_function(
                "() => { const m = [...document.querySelectorAll('.math.notranslate')];"
                " return m.length > 0 && m.every(e => e.querySelector("
                "'.MathJax, .MathJax_Display, .MathJax_SVG, mjx-container')); }",
                timeout=20_000,
            )
        except Exception as exc:  # noqa: BLE001 - reported with the state below
            problems.append(f"{name}: math not typeset in 20 s ({type(exc).__name__})")
    math = page.evaluate(MATH_STATE)
    if need_math and math["total"] == 0:
        problems.append(f"{name}: no math on the page")
    if math["typeset"] < math["total"]:
        problems.append(
            f"{name}: {math['total'] - math['typeset']} of {math['total']} math "
            "elements not typeset"
        )
    if math["errors"]:
        problems.append(f"{name}: {math['errors']} MathJax errors")
    # without an icon link the browser asks for /favicon.ico, a 404 in every user's console
    # (a request the routes above do not see)
    if not page.evaluate("() => !!document.querySelector('link[rel~=\"icon\"]')"):
        problems.append(f"{name}: no icon link (the browser asks for /favicon.ico)")
    images = page.evaluate(IMAGES)
    broken = [i["src"] for i in images if not (i["complete"] and i["width"] > 0)]
    if broken:
        problems.append(f"{name}: images not loaded: {broken}")
    if need_image and not images:
        problems.append(f"{name}: no image on the page")
    shot = out / f"{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(
        f"  {name}: {path}: {len(images)} images loaded, {math['typeset']}/{math['total']} "
        f"math typeset, screenshot {shot}"
    )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "docs" / "_build" / "html"))
    parser.add_argument("--out", default=str(ROOT / "docs" / "_build" / "check"))
    parser.add_argument("--chromium", default=None, help="the Chromium executable")
    args = parser.parse_args(argv)
    site = Path(args.site).resolve()
    if not (site / "index.html").is_file():
        raise SystemExit(f"{site} holds no built site (no index.html): build it first")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("tools/check_docs.py needs playwright: pip install playwright") from None

    server, base = _serve(site)
    host = urlparse(base).netloc
    problems: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=_find_chromium(args.chromium), headless=True
            )
            context = browser.new_context(viewport={"width": 1280, "height": 900})

            def refuse_other_hosts(route) -> None:
                if urlparse(route.request.url).netloc == host:
                    route.continue_()
                else:
                    problems.append(f"request to another host: {route.request.url}")
                    route.abort()

            context.route("**/*", refuse_other_hosts)
            page = context.new_page()
            page.on(
                "console",
                lambda m: (
                    m.type == "error" and problems.append(f"console error on {page.url}: {m.text}")
                ),
            )
            page.on("pageerror", lambda e: problems.append(f"page error on {page.url}: {e}"))
            page.on(
                "requestfailed",
                lambda r: problems.append(f"failed request: {r.url} ({r.failure})"),
            )
            page.on(
                "response",
                lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"),
            )

            print(f"serving {site} at {base}")
            for name, path, need_image, need_math, selector in PAGES:
                problems += _check_page(
                    page, base, name, path, need_image, need_math, selector, out
                )

            page.goto(f"{base}search.html?q={SEARCH_TERM}", wait_until="load")
            try:
                page.wait_for_function(
                    "() => document.querySelectorAll('#search-results li').length > 0",
                    timeout=20_000,
                )
            except Exception as exc:  # noqa: BLE001
                problems.append(f"search for {SEARCH_TERM}: no results ({type(exc).__name__})")
            hrefs = page.eval_on_selector_all("#search-results li a", "as => as.map(a => a.href)")
            hit = any(SEARCH_TARGET in h for h in hrefs)
            print(
                f"  search {SEARCH_TERM!r}: {len(hrefs)} results, API page "
                f"{'found' if hit else 'NOT found'}"
            )
            if not hit:
                problems.append(f"search for {SEARCH_TERM} does not list {SEARCH_TARGET}")
            page.screenshot(path=str(out / "search.png"), full_page=False)
            browser.close()
    finally:
        server.shutdown()

    for problem in problems:
        print("FAIL", problem)
    print("docs check:", "passed" if not problems else f"{len(problems)} problems")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
