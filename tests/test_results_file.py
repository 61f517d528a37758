"""``benchmarks/RESULTS.md`` stays a page a reader can hold, and every link in it and in its records resolves.

RESULTS.md gives the current figures of each topic with their commands, machines and dates; method details,
earlier runs and raw records live in ``benchmarks/results/*.md``, which it links. A link to a moved or renamed
file, or to a heading that no longer exists, breaks here rather than for a reader.
"""

import re
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
RESULTS = BENCHMARKS / "RESULTS.md"
RECORDS = sorted((BENCHMARKS / "results").glob("*.md"))

#: At most this many lines, so that the current figures stay readable at a glance.
MAX_LINES = 1200

#: ``[text](target)`` and ``![alt](target)``, the target without a title.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    """The anchor GitHub and MkDocs give a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    return {slug(line.lstrip("#")) for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


def links(path):
    """``(line number, target)`` of every relative link in ``path`` (web addresses left out)."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for target in LINK.findall(line):
            if not re.match(r"[a-z]+:", target):
                found.append((number, target))
    return found


def broken(path):
    """The links of ``path`` whose file, or heading in a markdown file, does not exist."""
    bad = []
    for number, target in links(path):
        name, _, anchor = target.partition("#")
        linked = (path.parent / name).resolve() if name else path
        if not linked.exists():
            bad.append(f"{path.name}:{number}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            bad.append(f"{path.name}:{number}: {target} (no such heading)")
    return bad


def test_slug_matches_the_anchors_of_the_table_of_contents():
    assert slug("The paper's experiments") == "the-papers-experiments"
    assert slug("The README's main job") == "the-readmes-main-job"
    assert slug("train() overhead") == "train-overhead"


def test_broken_finds_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A topic\n", encoding="utf-8")
    page.write_text(
        "# Page\n\n[fine](other.md#a-topic) [web](https://example.org/x.md) [self](#page)\n"
        "[gone](results/gone.md) [renamed](other.md#old-topic) ![figure](figures/none.png)\n",
        encoding="utf-8",
    )
    assert broken(page) == [
        "page.md:4: results/gone.md (no such file)",
        "page.md:4: other.md#old-topic (no such heading)",
        "page.md:4: figures/none.png (no such file)",
    ]


def test_results_file_stays_short():
    lines = len(RESULTS.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"benchmarks/RESULTS.md has {lines} lines; move raw records to benchmarks/results/"


@pytest.mark.parametrize("path", [RESULTS, *RECORDS], ids=lambda path: path.name)
def test_every_relative_link_resolves(path):
    assert broken(path) == []


def test_every_record_file_is_linked_from_results():
    linked = {(RESULTS.parent / target.partition("#")[0]).resolve() for _, target in links(RESULTS)}
    assert RECORDS, "benchmarks/results/ holds no records"
    assert [path.name for path in RECORDS if path.resolve() not in linked] == []
