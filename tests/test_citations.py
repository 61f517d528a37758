"""The product's text cites topics and pages, never the team's issue numbers or work sessions.

A reader of the README, the documentation, the package, the benchmarks (``benchmarks/RESULTS.md``
included), the experiments or the notebooks has no "issue 13" and no "session 5": a figure is cited
by its topic (a heading of ``benchmarks/RESULTS.md``, e.g. "Threads") or by a documentation page.
Links to other projects' issue trackers (``https://github.com/owner/repo/issues/12``) are not
citations of ours and are allowed.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What is checked: files, and every text file under these folders.
PLACES = ("README.md", "mkdocs.yml", "docs", "l0bayes", "benchmarks", "experiments", "notebooks")
TEXT_SUFFIXES = {".md", ".py", ".pyi", ".sh", ".cpp", ".h", ".yml", ".yaml", ".js", ".toml", ".txt", ".ipynb"}

#: Our own work history: issue numbers ("issue 13", "Issue 16 (threads)", "issues 4", "issue #7",
#: "issue13_step"), "issue: foundation", work sessions ("session 5", "Session 6:"), and the roles of
#: the people who wrote the figures ("(lead)", "integrator").
CITATION = re.compile(
    r"\b[Ii]ssues?[ _-]?#?\d+"
    r"|\b[Ii]ssue:"
    r"|\b[Ss]essions? ?#?\d+"
    r"|\([Ll]ead\b"
    r"|\b[Ii]ntegrator\b"
)
URL = re.compile(r"https?://\S+")


def _files():
    for place in PLACES:
        path = ROOT / place
        if path.is_file():
            yield path
        elif path.is_dir():
            for found in sorted(path.rglob("*")):
                if found.is_file() and "__pycache__" not in found.parts:
                    yield found


def _text(path):
    """The text a reader sees: a notebook's cell sources and text outputs, any other text file as is."""
    raw = path.read_text(encoding="utf-8")
    if path.suffix != ".ipynb":
        return raw
    parts = []
    for cell in json.loads(raw)["cells"]:
        parts.append("".join(cell.get("source", [])))
        for output in cell.get("outputs", []):
            parts.append("".join(output.get("text", [])))
            parts.append("".join(output.get("data", {}).get("text/plain", [])))
    return "\n".join(parts)


def citations(text):
    """``[(line number, match), ...]``: every citation of an issue number or a work session in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = URL.sub("", line)
        found += [(number, match.group(0)) for match in CITATION.finditer(line)]
    return found


@pytest.mark.parametrize(
    "text",
    [
        "Measured gains are in `benchmarks/RESULTS.md` (issue 13).",
        '# Measured (benchmarks/RESULTS.md, "Issue 16 (threads)"): one thread is within 1.15x',
        "## Distribution (issue: foundation)",
        "**Rerun in session 5** (16:39-16:41, idle machine)",
        "### Session 6: a step that compiles into one graph",
        "figures/issue13_step_vs_closed.png",
        "A later rerun of the same command, reported in issues 4 and 16, ended at 10.38%",
        "### Rerun on a quieter machine (lead, after the parallel work ended)",
        "Rerun on a quieter machine (integrator, 07:46-07:51 UTC)",
    ],
)
def test_the_check_finds_a_citation(text):
    assert citations(text)


@pytest.mark.parametrize(
    "text",
    [
        "the graph of torch-pruning <https://github.com/VainF/Torch-Pruning/issues/123>",
        "# ------------------------------------------------------------ rank helpers",
        "``pyro.clear_param_store()`` before fitting a second model in one session.",
        "A warning is issued when the check fails.",
        '`benchmarks/RESULTS.md`, "Threads"',
        "the lead-in of the page",
    ],
)
def test_the_check_passes_topics_and_ordinary_words(text):
    assert citations(text) == []


def test_no_product_text_cites_an_issue_or_a_session():
    """README, docs, l0bayes, benchmarks (with RESULTS.md), experiments and notebooks: topics, not issues."""
    checked, offenders = 0, []
    for path in _files():
        name = path.relative_to(ROOT).as_posix()
        offenders += [f"{name}: file name"] if citations(path.name) else []
        if path.suffix not in TEXT_SUFFIXES:
            continue
        checked += 1
        offenders += [f"{name}:{number}: {match!r}" for number, match in citations(_text(path))]
    assert checked > 50 and (ROOT / "benchmarks" / "RESULTS.md").is_file()
    assert offenders == [], "cite a topic (a heading of benchmarks/RESULTS.md) or a docs page instead:\n" + "\n".join(
        offenders
    )


def _results_headings():
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    return {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}


#: ``benchmarks/RESULTS.md`` followed by a quoted topic, e.g. ``benchmarks/RESULTS.md``, section "Threads".
RESULTS_TOPIC = re.compile(r"RESULTS\.md[`\s,(]{0,6}(?:section\s+)?\"([^\"]{2,100})\"")


def test_cited_results_topics_are_headings():
    """Every topic cited as ``benchmarks/RESULTS.md``, "Topic" is a heading there (renamed headings break this)."""
    headings, cited, missing = _results_headings(), 0, []
    for path in _files():
        if path.suffix not in TEXT_SUFFIXES or path.name == "RESULTS.md":
            continue
        # one line of prose, comment markers of wrapped lines removed
        text = re.sub(r"\n\s*(?:#:?|//)?\s*", " ", _text(path))
        for topic in RESULTS_TOPIC.findall(text):
            cited += 1
            if topic not in headings:
                missing.append(f"{path.relative_to(ROOT).as_posix()}: {topic!r}")
    assert cited > 10
    assert missing == [], "not a heading of benchmarks/RESULTS.md:\n" + "\n".join(missing)
