"""The result tables the benchmark scripts print: markdown for RESULTS.md, or right-aligned plain text."""


def format_table(header, rows, markdown=False, width=None):
    """``header`` and ``rows`` (sequences of strings) as one string.

    Plain text right-aligns every cell to ``width`` characters, or, when ``width`` is None, each column
    to its widest cell.
    """
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    table = [header, *rows]
    widths = [width] * len(header) if width else [max(len(x) for x in col) for col in zip(*table, strict=True)]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(row, widths, strict=True)) for row in table)
