"""The documentation site builds strictly, covers every page, and its API pages render the docstrings.

``mkdocs build --strict`` turns every warning (a broken link, an unknown cross-reference, a page
missing from the nav, a docstring mkdocstrings cannot parse) into a failure. Skipped when the
``docs`` extra (mkdocs-material, mkdocstrings[python]) is not installed; ``pip install -e ".[dev]"``
installs it.
"""

import functools
import html
import http.server
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import chromium_cdp as cdp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load_extension():
    pytest.importorskip("griffe")  # the docs' extension is a griffe one (installed with the docs' tools)
    spec = importlib.util.spec_from_file_location("rst_roles", DOCS / "_ext" / "rst_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(nav):
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from _nav_pages(value)
        else:
            yield value


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "pymdownx"):
        pytest.importorskip(module)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    if shutil.which("npm") is None:  # MathJax comes from npm at build time; without it the pages show TeX source
        env["L0BAYES_DOCS_WITHOUT_MATHJAX"] = "1"
    # No --quiet: it lowers the log level below WARNING, and mkdocs-autorefs then skips its
    # warnings about unresolved cross-references, so --strict would not see them.
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_site_loads_nothing_from_another_host(site):
    """No page's ``<script src>`` or ``<link href>`` points at another host (MathJax, fonts: all local)."""
    tags = re.compile(r"<(?:script|link)\b[^>]*?\b(?:src|href)=[\"']([^\"']+)", re.IGNORECASE)
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        for url in tags.findall(page.read_text(encoding="utf-8")):
            parsed = urllib.parse.urlparse(url)
            assert parsed.scheme not in ("http", "https") and not url.startswith("//"), (page, url)
    if shutil.which("npm") is not None:  # then the build must have shipped MathJax
        assert (site / "javascripts" / "mathjax" / "tex-chtml.js").is_file()
    assert "javascripts/mathjax/tex-chtml.js" in (site / "mathematics" / "index.html").read_text(encoding="utf-8")


def _serve(directory):
    """A local HTTP server for ``directory`` on a free loopback port (a daemon thread)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# Wait until MathJax has typeset the page and whatever the site's scripts do after that (Material's
# `document$` handlers) has run, then describe what is on the screen: every typeset character
# (`mjx-c`) is drawn by a CSS rule of MathJax's CommonHTML output (its `::before` content); a
# character without that rule has no box and shows nothing, though its `<mjx-container>` is there.
MATH_STATE = r"""(async () => {
  const started = Date.now();
  while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
    if (Date.now() - started > 30000) throw new Error("MathJax did not start");
    await new Promise((r) => setTimeout(r, 50));
  }
  await MathJax.startup.promise;
  await new Promise((r) => setTimeout(r, 1000));
  await MathJax.startup.promise;
  const root = document.querySelector("article") || document.body;
  const chars = [...root.querySelectorAll("mjx-container mjx-c")];
  const drawn = chars.filter((c) => {
    const box = c.getBoundingClientRect(), content = getComputedStyle(c, "::before").content;
    return box.width > 0 && box.height > 0 && content !== "none" && content !== "" && content !== '""';
  });
  const formula = root.querySelector("div.arithmatex mjx-math") || root.querySelector("mjx-math");
  if (formula) formula.scrollIntoView({block: "center"});
  const box = formula ? formula.getBoundingClientRect() : {x: 0, y: 0, width: 0, height: 0};
  return {
    formulas: root.querySelectorAll(".arithmatex").length,
    containers: root.querySelectorAll(".arithmatex mjx-container").length,
    errors: root.querySelectorAll("mjx-merror").length,
    tex_left: [...root.querySelectorAll(".arithmatex")].filter((a) => /\\[()\[\]]/.test(a.textContent)).length,
    chars: chars.length,
    drawn: drawn.length,
    display: [box.x + scrollX, box.y + scrollY, box.width, box.height],
  };
})()"""

# Material's instant navigation (feature `navigation.instant`) fetches the next page, swaps its
# content into the current document and emits `document$`; the same, for the page at URL.
# Started without awaiting it in the evaluation (some Chromium builds collect a promise held only by the
# protocol's awaitPromise while it fetches: "Promise was collected"); _swap polls for its end.
SWAP_TO = """window.__l0bayes_swap = "running";
(async (url) => {
  const fresh = new DOMParser().parseFromString(await (await fetch(url)).text(), "text/html");
  document.querySelector("article").replaceWith(document.adoptNode(fresh.querySelector("article")));
  document$.next(document);
})(%s).then(() => { window.__l0bayes_swap = "done"; }, (e) => { window.__l0bayes_swap = "failed: " + e; });
0"""


def _swap(browser, url):
    """Swap the page's article for ``url``'s as Material's instant navigation does, and wait for it."""
    browser.evaluate(SWAP_TO % json.dumps(url))
    for _ in range(600):
        state = browser.evaluate("window.__l0bayes_swap")
        if state != "running":
            assert state == "done", state
            return
        time.sleep(0.05)
    raise AssertionError(f"the swap to {url} did not finish in 30 s")


def _ink(png):
    """The fraction of dark pixels of a screenshot (formulas are black on white in the light scheme)."""
    from PIL import Image

    grey = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=float)
    return float((grey < 128).mean())


def _check_rendered(browser, where):
    """Every formula typeset, and drawn: glyph boxes, and ink on the screen that goes when maths is hidden."""
    state = browser.evaluate(MATH_STATE)
    assert state["formulas"] > 0 and state["containers"] == state["formulas"], (where, state)
    assert state["errors"] == 0 and state["tex_left"] == 0, (where, state)
    # A few characters are drawn without glyphs (e.g. spaces): allow 10% of them.
    assert state["chars"] > 0 and state["drawn"] >= 0.9 * state["chars"], (where, state)
    x, y, width, height = state["display"]
    assert height > 10 and width > 10, (where, state)  # a blank formula collapses to a few pixels
    shown = _ink(browser.screenshot(x, y, width, height))
    browser.evaluate(
        "document.head.appendChild(document.createElement('style')).textContent = "
        "'mjx-container { visibility: hidden !important }'; 0"
    )
    hidden = _ink(browser.screenshot(x, y, width, height))
    browser.evaluate("document.head.lastChild.remove(); 0")
    assert shown > 0.01 and hidden < 0.1 * shown, (where, shown, hidden)
    return state


def test_mathematics_page_renders_offline_in_chromium(site, tmp_path):
    """Headless Chromium draws the formulas of the pages with the MathJax shipped in the site.

    Over ``file://`` and ``http://``, on first load and after a page swap as Material's instant
    navigation does it. What is checked is what a reader sees: MathJax's elements being in the page
    is not enough (with the CSS of its characters gone, every formula is blank space).
    """
    chromium = cdp.find_chromium()
    if chromium is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    if not (site / "javascripts" / "mathjax" / "tex-chtml.js").is_file():
        pytest.skip("the site was built without MathJax (npm is not installed)")
    pytest.importorskip("PIL")
    formulas = (site / "mathematics" / "index.html").read_text(encoding="utf-8").count('class="arithmatex"')
    assert formulas > 20
    server = _serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with cdp.Chromium(chromium, tmp_path / "profile") as browser:
            browser.open((site / "mathematics" / "index.html").as_uri())
            assert _check_rendered(browser, "file://")["formulas"] == formulas
            browser.open(base + "mathematics/")
            assert _check_rendered(browser, "http://")["formulas"] == formulas
            for page in ("getting-started/", "mathematics/"):
                _swap(browser, base + page)
                _check_rendered(browser, f"swapped to {page}")
    finally:
        server.shutdown()
        server.server_close()


# After MathJax: every display formula's overflow (a formula wider than the column scrolls, and hides
# its equation number past the edge), and the formulas whose text (MathJax's assistive MathML, what a
# screen reader reads and what the glyphs draw) shows a backslash: TeX that was taken literally.
LAYOUT = r"""(async () => {
  while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) await new Promise((r) => setTimeout(r, 50));
  await MathJax.startup.promise;
  const root = document.querySelector("article");
  return {
    wide: [...root.querySelectorAll("div.arithmatex")]
      .map((d, i) => [i, d.scrollWidth - d.clientWidth, d.textContent.slice(0, 60)])
      .filter(([i, over]) => over > 1),
    backslash: [...root.querySelectorAll("mjx-assistive-mml")]
      .map((m) => m.textContent)
      .filter((t) => t.includes("\\")),
    formulas: root.querySelectorAll("mjx-container").length,
  };
})()"""

# On a phone's screen: whether the page got wider than the screen, the formulas of which some part is out of
# sight with no way to scroll to it (a box that scrolls and is on the screen must hold the formula, with no
# box between them that clips without scrolling), and the equation numbers not on the screen. A formula
# wider than the screen scrolls sideways in its own box; the theme's tables scroll as a whole.
PHONE = r"""(async () => {
  while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) await new Promise((r) => setTimeout(r, 50));
  await MathJax.startup.promise;
  const width = document.documentElement.clientWidth;
  const root = document.querySelector("article");
  const off = (e) => { const box = e.getBoundingClientRect(); return box.left < -1 || box.right > width + 1; };
  const text = (c) => (c.querySelector("mjx-assistive-mml") || c).textContent.slice(0, 60);
  const cut = [];
  for (const c of root.querySelectorAll("mjx-container")) {
    if (!off(c) && c.scrollWidth <= c.clientWidth + 1) continue;
    // up to the first box that scrolls and is on the screen; a box that clips without scrolling cuts it
    let e = c, seen = false;
    for (; e && e !== document.body; e = e.parentElement) {
      const overflow = getComputedStyle(e).overflowX;
      if (overflow === "hidden" || overflow === "clip") break;
      if ((overflow === "auto" || overflow === "scroll") && !off(e)) { seen = true; break; }
    }
    if (!seen) cut.push(text(c));
  }
  const numbers = [...root.querySelectorAll("mjx-labels mjx-itable")];
  return {
    width,
    page: document.documentElement.scrollWidth,
    cut,
    numbers: numbers.length,
    numbers_off: numbers.filter(off).map((n) => n.textContent),
    formulas: root.querySelectorAll("mjx-container").length,
  };
})()"""


def _pages_with_formulas(site):
    """The site's pages with formulas, as URL paths."""
    pages = (p.parent.relative_to(site).as_posix() for p in site.rglob("index.html"))
    return sorted(f"{p}/" for p in pages if 'class="arithmatex"' in (site / p / "index.html").read_text("utf-8"))


@pytest.mark.slow
@pytest.mark.parametrize("width", [390, 1280, 1700])
def test_formulas_fit_their_column_and_show_no_backslash(site, tmp_path, width):
    """No formula of any page runs off the screen, and no formula shows TeX that was taken literally.

    At common window widths (1280, 1700; the window is 15 px narrower: a browser's scroll bar takes that
    much of it) no display formula is wider than its column, where it would be cut, its number out of
    sight. On a phone's screen, 390 px wide, the page is no wider than the screen, a formula wider than it
    scrolls in its own box, and every equation number is on the screen.
    """
    chromium = cdp.find_chromium()
    if chromium is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    if not (site / "javascripts" / "mathjax" / "tex-chtml.js").is_file():
        pytest.skip("the site was built without MathJax (npm is not installed)")
    pages = _pages_with_formulas(site)
    assert {"mathematics/", "api/distributions/", "api/selection/", "guide/training/"} <= set(pages)
    phone = width < 500  # a window cannot be that narrow: the page is laid out as on a phone's screen
    server = _serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with cdp.Chromium(chromium, tmp_path / "profile", width=800 if phone else width - 15, height=900) as browser:
            if phone:
                browser.emulate(width, 844)
            numbers = 0
            for page in pages:
                browser.open(base + page)
                if phone:
                    state = browser.evaluate(PHONE)
                    assert state["width"] == width and state["formulas"] > 0, (page, state)
                    assert state["page"] <= width, (page, "the page is wider than the screen", state["page"])
                    assert state["cut"] == [] and state["numbers_off"] == [], (page, state)
                    numbers += state["numbers"]
                    continue
                state = browser.evaluate(LAYOUT)
                assert state["formulas"] > 0, page
                assert state["wide"] == [], (page, width, state["wide"])
                assert state["backslash"] == [], (page, state["backslash"])
            assert numbers > 10 or not phone  # the mathematics page numbers its equations
    finally:
        server.shutdown()
        server.server_close()


NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def test_the_readme_counts_the_notebooks_there_are():
    there = len(list((ROOT / "notebooks").glob("*.ipynb")))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    said = re.findall(r"executes all (\w+) with small settings|\| (\w+) short notebooks", readme)
    assert len(said) == 2 and all(NUMBERS[(a or b).lower()] == there for a, b in said), (said, there)


def _announced_lists(text):
    """``(N, items)`` for every "N steps ...:" followed by a numbered list of ``items`` items."""
    found = []
    for match in re.finditer(r"\b(\w+) steps\b[^\n]*:\n", text):
        if match.group(1).lower() not in NUMBERS:
            continue
        items = 0
        for line in text[match.end() :].splitlines():
            if re.match(r"\d+\. ", line):
                items += 1
            elif line.strip() and not line.startswith(" ") and items:
                break  # the first paragraph after the list
        found.append((NUMBERS[match.group(1).lower()], items))
    return found


def test_announced_steps_are_the_steps_listed():
    assert _announced_lists("Three steps:\n\n1. a\n2. b\n   more of b\n\n3. c\n\nAfter.\n4. not counted\n") == [(3, 3)]
    lists = {name: _announced_lists((ROOT / name).read_text(encoding="utf-8")) for name in _pages()}
    assert lists["docs/guide/variable-selection.md"], "the guide announces its steps"
    assert {name: found for name, found in lists.items() if any(n != k for n, k in found)} == {}


def test_readme_says_which_cpu_kernels_its_figures_come_from():
    """Seed 0 ends at 2.23% with AVX-512 kernels, 3.62% with AVX2 ones: a rerun elsewhere is not the same."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "same machine and torch build" in readme
    assert "AVX-512" in readme and "AVX2" in readme and "ATEN_CPU_CAPABILITY=avx2" in readme


def test_no_literal_backslash_underscore_in_text_of_formulas():
    r"""``\text{fan\_in}`` shows its backslash in MathJax 3 (text mode takes ``\_`` literally): use ``\mathrm``."""
    pattern = re.compile(r"\\text(?:tt|rm|it|bf|sf)?\{[^{}]*\\_")
    offenders = [name for name in _pages() if pattern.search((ROOT / name).read_text(encoding="utf-8"))]
    # the API pages render the docstrings' :math: roles with the same MathJax
    offenders += [str(path) for path in (ROOT / "l0bayes").rglob("*.py") if pattern.search(path.read_text("utf-8"))]
    assert offenders == []


def _text(path):
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def _load_mathjax_hook():
    spec = importlib.util.spec_from_file_location("mathjax_hook", DOCS / "_ext" / "mathjax_hook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mathjax_hook_without_npm(tmp_path, monkeypatch, caplog):
    """No npm and no cached copy: a warning (so --strict fails), or a note with L0BAYES_DOCS_WITHOUT_MATHJAX=1."""
    hook = _load_mathjax_hook()
    monkeypatch.setattr(hook, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(hook.shutil, "which", lambda name: None)
    monkeypatch.delenv("L0BAYES_DOCS_WITHOUT_MATHJAX", raising=False)
    config = {"site_dir": str(tmp_path / "site")}
    with caplog.at_level("INFO", logger="mkdocs.hooks.mathjax"):
        assert hook.on_config(config) is config
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "npm is not installed" in caplog.text
    hook.on_post_build(config)
    assert not (tmp_path / "site").exists()  # nothing to copy
    caplog.clear()
    monkeypatch.setenv("L0BAYES_DOCS_WITHOUT_MATHJAX", "1")
    with caplog.at_level("INFO", logger="mkdocs.hooks.mathjax"):
        hook.on_config(config)
    assert [r.levelname for r in caplog.records] == ["INFO"]
    # a cached copy is used as is, without npm
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tex-chtml.js").write_text("/* mathjax */")
    hook.on_config(config)
    hook.on_post_build(config)
    assert (tmp_path / "site" / "javascripts" / "mathjax" / "tex-chtml.js").read_text() == "/* mathjax */"


def test_every_page_is_in_the_nav():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = set(_nav_pages(config["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "_ext" not in p.parts}
    assert on_disk - in_nav == set(), "pages missing from the nav of mkdocs.yml"
    assert in_nav - on_disk == set(), "nav entries without a page"


def test_strict_build_renders_api_and_math(site):
    api = site / "api" / "distributions" / "index.html"
    page = api.read_text(encoding="utf-8")
    for name in ("HardConcrete", "StretchedConcrete", "kl_hard_concrete", "quadrature.num_nodes_for"):
        assert f'id="l0bayes.distributions.{name}"' in page, name
    # reST roles and directives were turned into MathJax spans / blocks, none is left verbatim.
    assert '<span class="arithmatex">' in page and '<div class="arithmatex">' in page
    for built in site.joinpath("api").rglob("index.html"):
        text = _text(built)
        for leftover in (":math:`", ":class:`", ":func:`", ":meth:`", ".. math::"):
            assert leftover not in text, (built, leftover)
    # Cross-references left unresolved by mkdocs-autorefs stay as "[title][identifier]" text.
    for built in site.rglob("index.html"):
        assert "][l0bayes." not in built.read_text(encoding="utf-8"), built
    maths = (site / "mathematics" / "index.html").read_text(encoding="utf-8")
    assert maths.count('class="arithmatex"') > 20
    # No TeX left in the prose: a "$" that arithmatex did not pair (e.g. "$a + $ b") shows verbatim.
    own = [site / "index.html"]
    for page in ("getting-started", "mathematics", "cli", "notebooks", "guide"):
        own += sorted((site / page).rglob("index.html"))
    assert len(own) == 12
    for built in own:
        body = built.read_text(encoding="utf-8")
        body = re.sub(r'<(span|div) class="arithmatex">.*?</\1>', "", body, flags=re.DOTALL)
        body = re.sub(r"<(pre|code|script)\b.*?</\1>", "", body, flags=re.DOTALL)
        prose = html.unescape(re.sub(r"<[^>]+>", "", body))
        assert "$" not in prose and "\\(" not in prose, built


def test_rst_roles_extension():
    ext = _load_extension()
    doc = (
        "Summary with :math:`a_1` and :class:`~l0bayes.nn.L0MLP`, :func:`torch.sigmoid`.\n\n"
        ".. math::\n    x = 1\n\nExample::\n\n    >>> 1 + 1\n    2\n\n"
        ":param x, y: the data\n    (tensors).\n:returns: nothing.\n\nTrailing note."
    )
    out = ext.rst_to_markdown(doc)
    assert "\\(a_1\\)" in out
    assert '<autoref identifier="l0bayes.nn.L0MLP" optional><code>L0MLP</code></autoref>' in out
    assert "`torch.sigmoid`" in out
    assert "$$\nx = 1\n$$" in out
    assert "```python\n>>> 1 + 1\n2\n```" in out
    assert ":param x: the data\n    (tensors).\n:param y: see ``x``." in out
    # prose after the field list is moved in front of it, so it is not filed under the last field
    assert out.index("Trailing note.") < out.index(":param x:")


def test_cli_page_covers_every_option():
    """Every option of ``l0bayes fit --help`` is described on ``docs/cli.md``."""
    if not (ROOT / "l0bayes" / "cli").is_dir():
        pytest.skip("no l0bayes/cli yet")
    proc = subprocess.run(
        [sys.executable, "-m", "l0bayes", "fit", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", proc.stdout)) - {"--help"}
    assert len(options) > 5, proc.stdout
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    missing = sorted(option for option in options if option not in page)
    assert not missing, f"docs/cli.md does not mention {missing}; paste the new `l0bayes fit --help` there"


def _python_blocks(page):
    """The ```` ```python ```` blocks of a page."""
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)


def _pages():
    """README.md and every documentation page, as paths relative to the repository root."""
    pages = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.parts)]
    return [p.relative_to(ROOT).as_posix() for p in pages]


# distributed.md's script is meant for torchrun on Fashion-MNIST (200 epochs); tests/test_distributed.py
# runs that path, and test_every_python_block_compiles checks its syntax here.
NOT_RUN = {"docs/distributed.md"}
# Pages whose blocks run in the default suite (about 8-11 s of CPU each on the machine of
# benchmarks/RESULTS.md); every other page runs with `pytest -m slow` (CPU seconds there:
# hard-concrete.md 24, regression.md 15, networks.md 13). A new page is slow until it is listed
# here; getting-started.md is here because the output it prints is compared with the page's.
FAST = {"README.md", "docs/guide/training.md", "docs/getting-started.md"}
PAGES_WITH_CODE = [name for name in _pages() if name not in NOT_RUN and _python_blocks(ROOT / name)]


def test_every_python_block_compiles():
    """No page shows Python that does not parse, and no page hides code in ``py`` fences the suite skips."""
    for name in _pages():
        page = ROOT / name
        assert not re.search(r"^```(py|python3|pycon)\s*$", page.read_text(encoding="utf-8"), re.MULTILINE), name
        for block in _python_blocks(page):
            compile(block, name, "exec")
    assert "README.md" in PAGES_WITH_CODE and FAST <= set(PAGES_WITH_CODE)


def test_no_page_or_docstring_cites_the_working_note():
    """The product's mathematics page is docs/mathematics.md; the project's MATH.md is not shipped."""
    files = [ROOT / name for name in _pages()] + sorted((ROOT / "l0bayes").rglob("*.py"))
    offenders = [f.relative_to(ROOT).as_posix() for f in files if "MATH.md" in f.read_text(encoding="utf-8")]
    assert offenders == []


# A ```text block right after the line "<!-- output -->" shows what the ```python block before it
# prints, exactly: the test compares them. Such a page seeds what its code draws.
OUTPUT_MARK = "<!-- output -->"
# A ```text block right after "<!-- output of `COMMAND` -->" shows the last lines that the shell command
# (an `l0bayes` command line) prints on standard output: the test runs it and compares them.
COMMAND_MARK = re.compile(r"<!-- output of `([^`]+)` -->\s*$")
# In a shown output, "…" stands for text that no rerun repeats and that the test does not compare: a wall
# time, or a figure that depends on how the CPU's kernels round (the rest of its line must match).
ELIDED = "…"


def _matches(printed, shown):
    """Whether ``printed`` is ``shown``, where each "…" of ``shown`` matches any text within its line and a line
    of dashes (a table's rule, as wide as the table's widest row) matches a line of dashes of any width."""
    pattern = []
    for line in shown.split("\n"):
        if line and set(line) == {"-"}:
            pattern.append("-+")
        else:
            pattern.append(".*?".join(re.escape(piece) for piece in line.split(ELIDED)))
    return re.fullmatch("\n".join(pattern), printed) is not None  # "." does not cross a line


def _shown_outputs(page):
    """``{k: text}``: the output a page shows for its ``k``-th python block (counting from 0)."""
    shown = {}
    pieces = re.split(r"^```(python|text)\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)
    blocks = -1
    for k in range(1, len(pieces), 3):
        kind, body, before = pieces[k], pieces[k + 1], pieces[k - 1]
        if kind == "python":
            blocks += 1
        elif before.rstrip().endswith(OUTPUT_MARK):
            assert blocks >= 0 and blocks not in shown, f"{page.name}: an output block without its own python block"
            shown[blocks] = body
    return shown


def _run_page(name, tmp_path):
    pytest.importorskip("sklearn")
    script = tmp_path / "page.py"
    separator = "@@ l0bayes docs: python block {} @@"
    blocks = _python_blocks(ROOT / name)
    script.write_text(
        "\n\n".join(f"print({separator.format(k)!r}, flush=True)\n{block}" for k, block in enumerate(blocks)),
        encoding="utf-8",
    )
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    if OUTPUT_MARK in (ROOT / name).read_text(encoding="utf-8"):
        env["CUDA_VISIBLE_DEVICES"] = ""  # the outputs shown are the CPU's (train() takes a GPU when it sees one)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env
    )
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    printed = re.split(r"^@@ l0bayes docs: python block \d+ @@\n", proc.stdout, flags=re.MULTILINE)[1:]
    assert len(printed) == len(blocks), proc.stdout[-2000:]
    for k, text in _shown_outputs(ROOT / name).items():
        assert _matches(printed[k], text), f"{name}: python block {k + 1} prints\n{printed[k]}\nthe page shows\n{text}"


def test_shown_outputs_are_found():
    """The pages that show a block's output mark it, and the marks are read (getting-started.md has two)."""
    assert sorted(_shown_outputs(DOCS / "getting-started.md")) == [0, 2]
    marked = [name for name in _pages() if OUTPUT_MARK in (ROOT / name).read_text(encoding="utf-8")]
    assert {"docs/getting-started.md", "docs/guide/networks.md", "docs/guide/regression.md"} <= set(marked)
    # checked where the page runs: in the default suite (FAST), or with `pytest -m slow`
    assert set(marked) <= set(PAGES_WITH_CODE), "a page whose printed output is shown is run"


@pytest.mark.parametrize("name", [n for n in PAGES_WITH_CODE if n in FAST])
def test_code_on_the_page_runs(name, tmp_path):
    """The ``python`` blocks of each page, run in order as one script, finish without error."""
    _run_page(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PAGES_WITH_CODE if n not in FAST])
def test_code_on_the_slow_page_runs(name, tmp_path):
    """As above, for the pages with longer examples."""
    _run_page(name, tmp_path)


def _fenced_blocks(page):
    """``[(kind, line_before, body)]``: every fenced block of a page, its language and the last line before it."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", text, flags=re.DOTALL | re.MULTILINE):
        before = text[: match.start()].rstrip().rpartition("\n")[2]
        found.append((match.group(1), before, match.group(2)))
    return found


def _shown_command_outputs():
    """``[(page, command, text)]``: the outputs of commands that the pages show, as marked."""
    return [
        (name, mark.group(1), body)
        for name in _pages()
        for kind, before, body in _fenced_blocks(ROOT / name)
        if kind == "text" and (mark := COMMAND_MARK.fullmatch(before))
    ]


# Text blocks that are not the output of a run: `l0bayes fit --help` (argparse wraps it to the terminal's width,
# and its layout changes with the Python version; test_cli_page_covers_every_option checks that it is complete).
NOT_OUTPUT = ("usage: l0bayes fit ",)


def test_every_output_a_page_shows_is_repeated():
    """Every output block of the pages (a ``text`` fence, or one without a language) is marked, so a test reruns it."""
    unmarked = [
        (name, body.partition("\n")[0])
        for name in _pages()
        for kind, before, body in _fenced_blocks(ROOT / name)
        if kind in ("", "text", "console", "output")
        and before.strip() != OUTPUT_MARK
        and not COMMAND_MARK.fullmatch(before)
        and not body.startswith(NOT_OUTPUT)
    ]
    assert unmarked == [], "mark each output block: <!-- output --> or <!-- output of `command` -->"
    assert [page for page, _, _ in _shown_command_outputs()].count("docs/cli.md") == 2


def test_shown_output_matching():
    """ "…" stands for any text within its line, a rule for a rule of any width; everything else is compared."""
    assert _matches("time 2.6 s (0.01 s/epoch)\n", "time … s (… s/epoch)\n")
    assert _matches("---\nx 1\n-----\n", "-----\nx 1\n--\n")
    assert not _matches("time 2.6 s\nnext\n", "time …\n")  # "…" does not stand for a line
    assert not _matches("objective 881.56\n", "objective 855.50\n")
    assert not _matches("a.b\n", "a…c\n") and not _matches("axb\n", "a.b\n")


@pytest.mark.parametrize(
    ("name", "command", "shown"),
    _shown_command_outputs(),
    ids=[f"{name}:{command}" for name, command, _ in _shown_command_outputs()],
)
def test_command_output_on_the_page(name, command, shown, l0bayes_command):
    """The last lines a page shows of an ``l0bayes`` command's output are what the command prints on the CPU.

    Run in a temporary directory, with a ``/tmp/...`` path of the command moved there (and named as on the page
    in what it prints); once per session (tests/conftest.py), so that other tests check the same run.
    """
    pytest.importorskip("sklearn")
    assert command.startswith("l0bayes "), f"{name}: only l0bayes commands are run: {command}"
    run = l0bayes_command(command)
    assert run.returncode == 0, f"{name}: {command}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    last = "".join(run.stdout.splitlines(keepends=True)[-len(shown.splitlines()) :])
    assert _matches(last, shown), f"{name}: `{command}` ends with\n{last}\nthe page shows\n{shown}"


def _resolve(path):
    """The object at the dotted ``path`` (a module, then attributes), or ``None``."""
    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for part in parts[k:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def test_the_api_reference_lists_each_object_once(site):
    """Every module, class and function of the API pages has one heading: not one per path that imports it."""
    import inspect

    seen = {}
    for page in sorted(site.joinpath("api").rglob("index.html")):
        for path in re.findall(r'<h[1-6][^>]*id="(l0bayes\.[^"]+)"', page.read_text(encoding="utf-8")):
            obj = _resolve(path)
            if inspect.isclass(_resolve(path.rpartition(".")[0])):
                continue  # a member of a class: inherited members repeat by design
            if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isfunction(obj):
                seen.setdefault(id(obj), []).append(f"{page.parent.name}: {path}")
    assert len(seen) > 100
    twice = [paths for paths in seen.values() if len(paths) > 1]
    assert not twice, twice
