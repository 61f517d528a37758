"""Griffe extension: render the reST markup of l0bayes' Sphinx-style docstrings as Markdown.

The docstrings are written for Sphinx (``:param:`` fields, ``:math:`` roles, ``.. math::``
blocks, ``:class:`` cross-references, ``Example::`` literal blocks). mkdocstrings parses the
fields itself (``docstring_style: sphinx``) but passes the prose through Markdown, where the
roles and directives would show up verbatim. Before parsing, this extension rewrites

* ``.. math::`` + indented block  ->  a ``$$ ... $$`` display block (pymdownx.arithmatex),
* ``:math:`x```                  ->  ``\\(x\\)`` inline math,
* ``:class:`~a.b.C``` etc.       ->  an optional cross-reference to ``a.b.C`` when it is a full
  ``l0bayes`` path (a link if that object is rendered, plain code if not), otherwise inline code
  (``C`` with ``~``, else the whole target),
* any other role, e.g. ``fc\\ :sub:`k```  ->  ``fc<sub>k</sub>``; unknown roles -> inline code,
* a paragraph ending in ``::`` followed by an indented block  ->  a fenced Python block.

The source files are not touched; only the text handed to the renderer changes.
"""

import re
import textwrap

import griffe

_INLINE_MATH = re.compile(r":math:`([^`]+)`")
_SUBSUP = re.compile(r"(?:\\ )?:(sub|sup):`([^`]+)`")
_OTHER_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`([^`]+)`")
_XREF = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc):`([^`]+)`")


def _xref(match):
    target = match.group(1).strip()
    short = target.startswith("~")
    target = target.lstrip("~")
    if target.startswith(".") or "<" in target:
        return f"`{target.lstrip('.')}`"
    label = target.rsplit(".", 1)[-1] if short else target
    if target.startswith("l0bayes.") and not any(part.startswith("_") for part in target.split(".")):
        # An optional autoref: a link when the target is rendered somewhere, plain code otherwise
        # (docstrings may name objects that have no API entry, e.g. a private module's constant).
        return f'<autoref identifier="{target}" optional><code>{label}</code></autoref>'
    return f"`{label}`"


def _indent(line):
    return len(line) - len(line.lstrip(" "))


def _take_block(lines, start, base):
    """Lines from ``start`` that are blank or indented deeper than ``base``; trailing blanks excluded."""
    end = start
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > base):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return end


def _blocks(text):
    """Rewrite ``.. math::`` directives and ``::`` literal blocks (line by line)."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        base = _indent(line)
        if stripped.startswith(".. math::"):
            first = stripped[len(".. math::") :].strip()
            end = _take_block(lines, i + 1, base)
            body = textwrap.dedent("\n".join(lines[i + 1 : end])).strip("\n")
            pad = " " * base
            math = "\n".join(part for part in (first, body) if part)
            out.extend(["", pad + "$$"] + [pad + m for m in math.split("\n")] + [pad + "$$", ""])
            i = end
            continue
        if stripped.endswith("::") and not stripped.startswith(".."):
            end = _take_block(lines, i + 1, base)
            if end > i + 1:
                body = textwrap.dedent("\n".join(lines[i + 1 : end])).strip("\n")
                pad = " " * base
                label = stripped[:-2].rstrip()
                if label:
                    out.append(pad + label + ":")
                out.extend(["", pad + "```python"] + [pad + b if b else b for b in body.split("\n")] + [pad + "```"])
                i = end
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


_FIELD_NAMES = (
    "param|parameter|arg|argument|key|keyword|type|var|ivar|cvar|vartype|returns?|rtype|raises?|except|exception"
)
_FIELD = re.compile(rf"^:(?:{_FIELD_NAMES})( [^:`]*)?:(?!`)")
_MULTI_PARAM = re.compile(r"^(\s*):param ((?:\w+, )+\w+):(.*)$")


def _split_multi_params(text):
    """``:param x, y: text`` (one field for several names) -> ``:param x: text``, ``:param y: see x``."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        match = _MULTI_PARAM.match(lines[i])
        if match is None:
            out.append(lines[i])
            i += 1
            continue
        pad, names, desc = match.group(1), match.group(2).split(", "), match.group(3)
        out.append(f"{pad}:param {names[0]}:{desc}")
        i += 1
        while i < len(lines) and lines[i].strip() and _indent(lines[i]) > len(pad):
            out.append(lines[i])
            i += 1
        out.extend(f"{pad}:param {name}: see ``{names[0]}``." for name in names[1:])
    return "\n".join(out)


def _prose_before_fields(text):
    """Move prose that follows a field list (after a blank line, unindented) in front of it.

    In reST a field list ends at a blank line followed by unindented text (e.g. an ``Example::``
    after the ``:param:`` fields); griffe's Sphinx parser would file that text under the last field.
    """
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if _FIELD.match(line)), None)
    if first is None:
        return text
    for j in range(first + 1, len(lines)):
        line = lines[j]
        if line.strip() and _indent(line) == 0 and not _FIELD.match(line) and not lines[j - 1].strip():
            fields = "\n".join(lines[first:j]).strip("\n")
            head = "\n".join(lines[:first]).rstrip("\n")
            tail = "\n".join(lines[j:]).strip("\n")
            return "\n\n".join(part for part in (head, tail, fields) if part)
    return text


def rst_to_markdown(text):
    """The Markdown form of a Sphinx-flavoured docstring (see the module docstring)."""
    text = _blocks(_prose_before_fields(text))
    text = _split_multi_params(text)
    text = _INLINE_MATH.sub(lambda m: "\\(" + m.group(1) + "\\)", text)
    text = _XREF.sub(_xref, text)
    text = _SUBSUP.sub(lambda m: f"<{m.group(1)}>{m.group(2)}</{m.group(1)}>", text)
    return _OTHER_ROLE.sub(lambda m: f"`{m.group(1)}`", text)


class RstRoles(griffe.Extension):
    """Apply :func:`rst_to_markdown` to every docstring as soon as its object is created."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
