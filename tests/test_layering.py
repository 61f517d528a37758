"""The package's floors: no import cycle, and no module importing a floor above its own.

Every module under ``l0bayes/`` is parsed with :mod:`ast`; every ``import`` and ``from ... import`` is
collected, at module level and inside functions alike (an import inside a function is a dependency that
runs later, not an absent one), relative imports resolved. Importing ``a.b.c`` also runs the
``__init__`` of ``a.b`` unless the importer is itself inside ``a.b``, so that package is a dependency
too: a package that imports a module which imports back into the package is a cycle.

The floors, lowest first, are those of the ``l0bayes`` docstring. The former homes of the names that
moved up to ``l0bayes.pruning`` (:data:`REEXPORTS`) are the one exception: they forward to it for user
code, and nothing inside the package may use them.
"""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "l0bayes"

# Lowest first; a module sits on the floor of its first component below ``l0bayes``.
FLOORS = [
    {"_atomic", "_checks", "_optional", "utils", "threads", "io"},
    {"distributions"},
    {"data"},
    {"nn"},
    {"pruning"},
    {"inference"},
    {"analysis"},
    {"models"},
    {"cli", "__main__"},
]

# The former homes of names that moved up to l0bayes.pruning, kept for user code: module -> where it forwards.
# Their imports may go up a floor (lazily, where the module is a package that the target imports) and are
# left out of the cycle search; nothing in l0bayes imports the former homes.
REEXPORTS = {
    "l0bayes.nn": "l0bayes.pruning",
    "l0bayes.nn.wrn": "l0bayes.pruning",
    "l0bayes.nn.prune": "l0bayes.pruning",
    "l0bayes.nn.sparsify": "l0bayes.pruning",
    "l0bayes.nn.dependency": "l0bayes.pruning",
    "l0bayes.nn.export": "l0bayes.pruning",
}
FORMER_MODULES = {"l0bayes.nn.prune", "l0bayes.nn.sparsify", "l0bayes.nn.dependency", "l0bayes.nn.export"}


def _reexport(importer, imported):
    target = REEXPORTS.get(importer)
    return target is not None and (imported == target or imported.startswith(target + "."))


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


class _Imports(ast.NodeVisitor):
    """``(target, names, lazy, line)`` for every import of a module; ``lazy``: inside a function."""

    def __init__(self, module, is_package):
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = 0
        self.found = []

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node):
        for alias in node.names:
            self.found.append((alias.name, (), self.depth > 0, node.lineno))

    def visit_ImportFrom(self, node):
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module
        self.found.append((target, tuple(a.name for a in node.names), self.depth > 0, node.lineno))


def _edges(modules):
    """``{(importer, imported): [(line, lazy), ...]}`` between modules of the package."""
    edges = {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for target, names, lazy, line in visitor.found:
            if target != "l0bayes" and not target.startswith("l0bayes."):
                continue
            # from package import submodule: the submodule; from module import name: the module
            targets = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules] or [target]
            for t in targets:
                while t not in modules:  # an attribute path: its module
                    t = t.rpartition(".")[0]
                # importing a.b.c runs a.b's __init__ too, unless the importer is already inside a.b
                chain = [t] + [".".join(t.split(".")[:k]) for k in range(1, t.count(".") + 1)]
                for dep in chain:
                    if not (name == dep or name.startswith(dep + ".")):
                        edges.setdefault((name, dep), []).append((line, lazy))
    return edges


def _floor(module):
    parts = module.split(".")
    if len(parts) == 1:
        return len(FLOORS)  # the package itself: its lazy names come from every floor
    for k, floor in enumerate(FLOORS):
        if parts[1] in floor:
            return k
    raise AssertionError(f"{module} sits on no floor: add it to FLOORS and to the l0bayes docstring")


def _cycle(edges):
    """One import cycle (a list of modules, first == last), or ``None``."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


@pytest.fixture(scope="module")
def edges():
    return _edges(_modules())


def test_the_walk_sees_lazy_relative_and_package_imports(edges, tmp_path):
    """The walk resolves ``from ..x import y``, sees imports inside functions and the ``__init__`` they run."""
    sources = {
        "l0bayes/a/__init__.py": "from .b import x\n",
        "l0bayes/a/b.py": "x = 1\n\n\ndef f():\n    from ..c import y\n",
        "l0bayes/c.py": "import torch\n\nfrom .a import b\n\ny = 2\n",
    }
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = {"l0bayes.a": "l0bayes/a/__init__.py", "l0bayes.a.b": "l0bayes/a/b.py", "l0bayes.c": "l0bayes/c.py"}
    found = _edges({name: tmp_path / path for name, path in modules.items()})
    assert found == {
        ("l0bayes.a", "l0bayes.a.b"): [(1, False)],
        ("l0bayes.a.b", "l0bayes.c"): [(5, True)],  # inside a function; not l0bayes.a, which b is inside
        ("l0bayes.c", "l0bayes.a.b"): [(3, False)],
        ("l0bayes.c", "l0bayes.a"): [(3, False)],  # importing l0bayes.a.b runs l0bayes/a/__init__.py
    }
    assert _cycle(found) == ["l0bayes.a", "l0bayes.a.b", "l0bayes.c", "l0bayes.a"]
    assert _cycle({("a", "b"): 0, ("b", "c"): 0, ("a", "c"): 0}) is None
    assert edges[("l0bayes.nn.gates", "l0bayes.distributions")][0][1] is False  # and it reads the package


def test_no_import_cycle(edges):
    """No cycle among the package's imports, those inside functions included."""
    graph = {e: w for e, w in edges.items() if not _reexport(*e)}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {graph[(a, b)][0][0]})" for a, b in zip(cycle, cycle[1:], strict=False)
    )


def test_no_floor_imports_a_higher_one(edges):
    """distributions < data < nn < pruning < inference < analysis < models < cli: imports only go down."""
    upward = [
        f"{a}:{where[0][0]} imports {b}" + (" (inside a function)" if all(lazy for _, lazy in where) else "")
        for (a, b), where in sorted(edges.items())
        if _floor(a) < _floor(b) and not _reexport(a, b)
    ]
    assert not upward, "a lower floor imports a higher one:\n" + "\n".join(upward)


def test_the_former_homes_only_forward(edges):
    """Nothing in the package uses the former homes; the packages among them forward lazily.

    A former module that nothing imports cannot close a cycle; ``l0bayes.nn`` and ``l0bayes.nn.wrn`` are
    imported by ``l0bayes.pruning`` itself, so their forwarding must wait until the name is asked for.
    """
    import l0bayes.nn

    assert not [f"{a} imports {b}" for (a, b) in edges if b in FORMER_MODULES]
    moved = set(l0bayes.nn._MOVED)
    for name, path in _modules().items():
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        for target, names, _, line in visitor.found:
            if target == "l0bayes.nn":
                assert not moved & set(names), f"{name}:{line} imports {sorted(moved & set(names))} from l0bayes.nn"
    forwarding = [(a, b) for (a, b) in edges if _reexport(a, b)]
    assert {a for a, _ in forwarding} == set(REEXPORTS)
    for a, b in forwarding:
        assert a in FORMER_MODULES or all(lazy for _, lazy in edges[(a, b)]), f"{a} imports {b} at module level"


def test_the_floors_are_documented():
    """The ``l0bayes`` docstring names every public module of every floor, floor by floor, in this order."""
    import l0bayes

    doc = l0bayes.__doc__
    positions = [
        [doc.index(f"``l0bayes.{name}``") for name in sorted(floor) if not name.startswith("_")] for floor in FLOORS
    ]
    assert all(max(low) < min(high) for low, high in zip(positions, positions[1:], strict=False))


def _fresh(code):
    """Run ``code`` in a fresh interpreter (the order of first imports is what is tested)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "first",
    [
        "import l0bayes.pruning.export",
        "import l0bayes.nn.prune",
        "from l0bayes.nn.sparsify import Group",
        "from l0bayes.nn.wrn import l0_wide_resnet",
        "import l0bayes.inference.checkpoint",
    ],
)
def test_the_old_names_still_work(first):
    """Whatever is imported first, the old paths give what they gave: functions, classes and modules."""
    _fresh(
        f"""
        import types
        {first}
        import l0bayes.nn.prune
        from l0bayes import nn, pruning
        from l0bayes.nn import prune, sparsify, save_pruned, PruneReport, WideResNet, l0_wide_resnet
        import l0bayes.nn.prune as as_name
        from l0bayes.nn.prune import prune as prune_fn, PruneReport, SelectFeatures, architecture, flops
        from l0bayes.nn.sparsify import Group, strip_gates
        from l0bayes.nn.export import load_pruned, LAYER_TYPES
        from l0bayes.nn.dependency import structure
        from l0bayes.inference.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
        import l0bayes.io
        assert prune is prune_fn is as_name is pruning.prune is nn.prune and isinstance(prune, types.FunctionType)
        assert flops is pruning.flops and architecture is nn.architecture and PruneReport is pruning.PruneReport
        assert sparsify is pruning.sparsify is nn.sparsify and isinstance(sparsify, types.FunctionType)
        assert save_pruned is pruning.save_pruned and l0_wide_resnet is pruning.l0_wide_resnet
        assert isinstance(nn.export, types.ModuleType) and nn.export.save_pruned is save_pruned
        assert isinstance(nn.dependency, types.ModuleType) and nn.dependency.structure is structure
        assert SelectFeatures is pruning.SelectFeatures and Group is pruning.Group
        assert load_checkpoint is l0bayes.io.load_checkpoint and CheckpointError is l0bayes.io.CheckpointError
        assert {{"sparsify", "prune", "save_pruned", "WideResNet"}} <= set(nn.__all__) <= set(dir(nn))
        assert "export" in dir(nn) and "l0_wide_resnet" not in dir(pruning.sparsify)
        """
    )
