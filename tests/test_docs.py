"""The documentation site builds strictly, covers every page, and its API pages render the docstrings.

``mkdocs build --strict`` turns every warning (a broken link, an unknown cross-reference, a page
missing from the nav, a docstring mkdocstrings cannot parse) into a failure. Skipped when the
``docs`` extra (mkdocs-material, mkdocstrings[python]) is not installed; ``pip install -e ".[dev]"``
installs it.
"""

import html
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load_extension():
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
    # No --quiet: it lowers the log level below WARNING, and mkdocs-autorefs then skips its
    # warnings about unresolved cross-references, so --strict would not see them.
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def _text(path):
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


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
    assert len(own) == 10
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
    if not (ROOT / "l0bayes" / "cli.py").exists():
        pytest.skip("no l0bayes/cli.py yet")
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
    """The ```` ```python ```` blocks of a page (fragments that do not run alone are fenced ```` ```py ````)."""
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)


# distributed.md's script is meant for torchrun on Fashion-MNIST; its own tests cover that path.
PAGES_WITH_CODE = sorted(
    p.relative_to(DOCS).as_posix()
    for p in DOCS.rglob("*.md")
    if "_ext" not in p.parts and p.name != "distributed.md" and _python_blocks(p)
)


@pytest.mark.slow
@pytest.mark.parametrize("name", PAGES_WITH_CODE)
def test_code_on_the_page_runs(name, tmp_path):
    """The ``python`` blocks of each page, run in order as one script, finish without error."""
    pytest.importorskip("sklearn")
    script = tmp_path / "page.py"
    script.write_text("\n\n".join(_python_blocks(DOCS / name)), encoding="utf-8")
    env = {**__import__("os").environ, "MPLBACKEND": "Agg"}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env
    )
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
