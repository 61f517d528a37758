"""The package's floors and homes: no import cycle, no module importing a floor above its own, one home per name.

Every module under ``l0bayes/`` is parsed with :mod:`ast`; every ``import`` and ``from ... import`` is
collected, at module level and inside functions alike (an import inside a function is a dependency that
runs later, not an absent one), relative imports resolved. Importing ``a.b.c`` also runs the
``__init__`` of ``a.b`` unless the importer is itself inside ``a.b``, so that package is a dependency
too: a package that imports a module which imports back into the package is a cycle.

The floors, lowest first, are those of the ``l0bayes`` docstring. A public name has one home: the module
that defines it, exposed by the packages above that module and by no other module. No module forwards names
with a module-level ``__getattr__`` (the two packages that import their own names on first use, to keep
``import l0bayes.cli`` free of torch and ``import l0bayes.selection`` free of scikit-learn, are the exceptions,
:data:`LAZY_PACKAGES`), and no module only re-exports.
"""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "l0bayes"

# Lowest first; a module sits on the floor of its first component below ``l0bayes``.
FLOORS = [
    {"_archive", "_atomic", "_checks", "_optional", "_warnings", "utils", "threads", "io"},
    {"distributions"},
    {"data"},
    {"nn"},
    {"pruning"},
    {"inference"},
    {"analysis"},
    {"models"},
    {"selection"},
    {"cli", "__main__"},
]

# Packages whose module-level ``__getattr__`` imports names of their own ``__all__`` on first use (PEP 562):
# ``l0bayes`` so that ``import l0bayes.cli`` sets how OpenMP threads wait before torch loads, ``l0bayes.selection``
# so that scikit-learn loads only for ``VariableSelector``. Each name they give is in their ``__all__``.
LAZY_PACKAGES = {"l0bayes", "l0bayes.selection"}

# Where the code, the docs and the notebooks import l0bayes names from.
USERS = ["l0bayes", "tests", "experiments", "benchmarks", "docs", "notebooks", "README.md"]


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _tree(path):
    return ast.parse(Path(path).read_text(encoding="utf-8"), str(path))


def _resolve(package, node):
    """The absolute module of ``from <node.module> import ...`` written in ``package``."""
    if not node.level:
        return node.module
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


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
        names = tuple(a.name for a in node.names)
        self.found.append((_resolve(self.package, node), names, self.depth > 0, node.lineno))


def _imports(name, path):
    visitor = _Imports(name, Path(path).name == "__init__.py")
    visitor.visit(_tree(path))
    return visitor.found


def _edges(modules):
    """``{(importer, imported): [(line, lazy), ...]}`` between modules of the package."""
    edges = {}
    for name, path in modules.items():
        for target, names, lazy, line in _imports(name, path):
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


def _top_level(tree):
    """The module's statements, with those under ``if TYPE_CHECKING:`` / ``try:`` counted as its own."""
    for node in tree.body:
        if isinstance(node, ast.If | ast.Try):
            yield node
            for body in [node.body, node.orelse] if isinstance(node, ast.If) else [node.body]:
                yield from body
        else:
            yield node


def _defined(tree):
    """Names a module binds itself: functions, classes, assignments (imports excluded)."""
    names = set()
    for node in _top_level(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _is_all(node):
    return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)


def _all(tree):
    """The module's ``__all__`` (a literal list), or ``None``."""
    node = next((n for n in tree.body if _is_all(n)), None)
    if node is None:
        return None
    try:
        return ast.literal_eval(node.value)
    except ValueError:
        raise AssertionError(f"line {node.lineno}: __all__ is not a literal list of names") from None


def _getattr(tree):
    """The module-level ``def __getattr__``, or ``None``."""
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"), None)


@pytest.fixture(scope="module")
def edges():
    return _edges(_modules())


@pytest.fixture(scope="module")
def trees():
    return {name: _tree(path) for name, path in _modules().items()}


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
    """No cycle among the package's modules, imports inside functions included (so none at module level)."""
    cycle = _cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {edges[(a, b)][0][0]})" for a, b in zip(cycle, cycle[1:], strict=False)
    )


def test_no_floor_imports_a_higher_one(edges):
    """distributions < data < nn < pruning < inference < analysis < models < selection < cli: imports only go down."""
    upward = [
        f"{a}:{where[0][0]} imports {b}" + (" (inside a function)" if all(lazy for _, lazy in where) else "")
        for (a, b), where in sorted(edges.items())
        if _floor(a) < _floor(b)
    ]
    assert not upward, "a lower floor imports a higher one:\n" + "\n".join(upward)


def test_nn_never_imports_pruning(edges):
    """``l0bayes.nn`` builds networks; ``l0bayes.pruning`` builds on it and never the other way, not even lazily."""
    up = [(a, b) for (a, b) in edges if a.startswith("l0bayes.nn") and b.startswith("l0bayes.pruning")]
    assert not up, up


def test_no_module_forwards_through_getattr(trees):
    """No module-level ``__getattr__`` but the lazy imports of :data:`LAZY_PACKAGES`, which give their own names."""
    found = {name for name, tree in trees.items() if _getattr(tree) is not None}
    assert found == LAZY_PACKAGES, f"module-level __getattr__ in {sorted(found - LAZY_PACKAGES)}"
    for name in LAZY_PACKAGES:
        tree = trees[name]
        asked = {
            c.value
            for c in ast.walk(_getattr(tree))
            if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.isidentifier()
        }
        assert asked and asked <= set(_all(tree)), f"{name}.__getattr__ gives {sorted(asked - set(_all(tree)))}"
    # and no module swaps its own class to intercept attributes: ``sys.modules[...].__class__ = ...``
    swaps = [
        f"{name}:{node.lineno}"
        for name, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
        and target.attr == "__class__"
        and "sys.modules" in ast.unparse(target.value)
    ]
    assert not swaps, f"module class swapped in {swaps}"


def test_no_module_only_reexports(trees):
    """Outside package ``__init__`` files, a module defines something: not only imports and an ``__all__``."""
    only = []
    for name, tree in trees.items():
        if _modules()[name].name == "__init__.py":
            continue
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if all(isinstance(n, ast.Import | ast.ImportFrom) or _is_all(n) for n in body):
            only.append(name)
    assert not only, f"modules that only re-export: {only}"


def test_every_public_name_has_one_home(trees):
    """A module's ``__all__`` lists what it defines; a package's, what its own modules define.

    So a name in ``__all__`` is exposed by the module that defines it and the packages above it, and by no
    other module.
    """
    modules = _modules()
    homes = {}
    wrong = []
    for name, tree in trees.items():
        exported = _all(tree)
        if exported is None:
            continue
        is_package = modules[name].name == "__init__.py"
        own = _defined(tree)
        imported = {}
        for node in _top_level(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(name if is_package else name.rpartition(".")[0], node)
                for alias in node.names:
                    imported[alias.asname or alias.name] = target
        for public in exported:
            if public in own:
                homes.setdefault(public, set()).add(name)
            elif not is_package:
                wrong.append(f"{name} lists {public!r}, imported from {imported.get(public)}")
            elif public in imported and not imported[public].startswith(name + "."):
                wrong.append(f"{name} lists {public!r} from {imported[public]}, outside the package")
    assert not wrong, "\n".join(wrong)


def _code_of(path):
    """``[(where, source)]``: a Python file, the code cells of a notebook, the Python blocks of a Markdown page."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return [(str(path.relative_to(ROOT)), text)]
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        return [
            (f"{path.relative_to(ROOT)} cell {k}", "".join(c["source"]))
            for k, c in enumerate(cells)
            if c["cell_type"] == "code"
        ]
    return [
        (f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}", m.group(1))
        for m in re.finditer(r"```python\n(.*?)```", text, re.S)
    ]


def test_code_docs_and_notebooks_import_each_name_from_its_home(trees):
    """``from l0bayes.x import n``: ``n`` is defined in ``l0bayes.x``, is its submodule, or is in its ``__all__``."""
    modules = _modules()
    exposed = {}
    for name, tree in trees.items():
        exposed[name] = (
            _defined(tree) | set(_all(tree) or ()) if modules[name].name == "__init__.py" else _defined(tree)
        )
    files = []
    for place in USERS:
        path = ROOT / place
        files += (
            [path] if path.is_file() else sorted(p for ext in ("py", "ipynb", "md") for p in path.rglob(f"*.{ext}"))
        )
    wrong = []
    for path in files:
        for where, source in _code_of(path):
            source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue  # a fragment, not a program
            module = _module_name(path) if path.is_relative_to(PACKAGE) else ""
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    wrong += [
                        f"{where}:{node.lineno} imports {a.name}, no module"
                        for a in node.names
                        if a.name.startswith("l0bayes.") and a.name not in modules
                    ]
                if not isinstance(node, ast.ImportFrom) or (node.level and not module):
                    continue
                target = _resolve(package, node)
                if target != "l0bayes" and not target.startswith("l0bayes."):
                    continue
                if target not in modules:
                    wrong.append(f"{where}:{node.lineno} imports from {target}, no module")
                    continue
                for alias in node.names:
                    if f"{target}.{alias.name}" not in modules and alias.name not in exposed[target]:
                        wrong.append(f"{where}:{node.lineno} imports {alias.name} from {target}, not its home")
    assert not wrong, "\n".join(wrong)


def test_the_floors_are_documented():
    """The ``l0bayes`` docstring names every public module of every floor, floor by floor, in this order."""
    import l0bayes

    doc = l0bayes.__doc__
    positions = [
        [doc.index(f"``l0bayes.{name}``") for name in sorted(floor) if not name.startswith("_")] for floor in FLOORS
    ]
    assert all(max(low) < min(high) for low, high in zip(positions, positions[1:], strict=False))
