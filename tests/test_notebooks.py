"""The notebooks in ``notebooks/`` execute top to bottom (small settings: ``L0BAYES_FAST=1``) and are stored clean.

Each notebook asserts its own numerical claims (atoms against sampling, KL against Monte Carlo,
variational against exact inclusion on the clear-cut diabetes features, pruned against gated
predictions), so a notebook that runs is also a notebook whose statements still hold.
"""

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("arviz")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300
# Notebooks whose training takes minutes with full settings: every cell that trains shows a progress bar.
SHOW_PROGRESS = {"05_transformer_pruning.ipynb"}


def test_the_five_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == [
        "01_hard_concrete.ipynb",
        "02_spike_slab_regression.ipynb",
        "03_sparse_mlp.ipynb",
        "04_posterior_gate_analysis.ipynb",
        "05_transformer_pruning.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch, tmp_path, request):
    if path.name == _documented_execution_target().name:
        # the notebook that docs/notebooks.md's `jupyter nbconvert --execute` runs: that run (the same small
        # settings and environment, the same nbclient underneath) is checked here, not repeated
        nb = request.getfixturevalue("documented_execution")
    else:
        monkeypatch.setenv("L0BAYES_FAST", "1")
        monkeypatch.setenv("MPLBACKEND", "Agg")
        # one thread per kernel: the models are tiny, and threads only contend on a shared CI machine
        monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        )
        client.execute()  # raises CellExecutionError, with the failing cell and traceback, on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    # tqdm.auto in a kernel without ipywidgets warns "IProgress not found" (ipywidgets is in the dev and
    # notebooks extras)
    streams = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    warned = [text for text in streams if "IProgress not found" in text]
    assert not warned, f"{path.name}: {warned[0][:300]}"
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
    if path.name in SHOW_PROGRESS:  # tqdm.auto's bar is a widget in a kernel
        training = [c for c in nb.cells if c.cell_type == "code" and ("train(" in c.source or ".step()" in c.source)]
        silent = [
            c.source.partition("\n")[0]
            for c in training
            if not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in c.outputs)
        ]
        assert training and not silent, f"{path.name}: cells that train without a progress bar: {silent}"


def _documented_nbconvert_commands():
    """The ``jupyter nbconvert`` command lines of docs/notebooks.md (code blocks and inline code)."""
    page = (ROOT / "docs" / "notebooks.md").read_text(encoding="utf-8")
    lines = [
        line
        for block in re.findall(r"^```bash\n(.*?)^```", page, re.DOTALL | re.MULTILINE)
        for line in block.splitlines()
    ]
    lines += [span.replace("\n", " ") for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", page)]  # wrapped inline code
    commands = (" ".join(line.split("#")[0].split()) for line in lines)
    return sorted({c for c in commands if re.match(r"(\w+=\S+ )*jupyter nbconvert ", c)})


def _run_nbconvert(command, cwd, tmp_path):
    """Run a documented ``jupyter nbconvert`` command line in ``cwd``, its ``/tmp/...`` output moved to ``tmp_path``."""
    words = shlex.split(command)
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    while "=" in words[0]:  # VAR=value prefixes
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    assert words[:2] == ["jupyter", "nbconvert"], command
    args = []
    for word in words[2:]:  # the shell's glob, and the page's output file moved to tmp_path
        if word.startswith("/tmp/"):
            word = str(tmp_path / Path(word).name)
        args += sorted(str(p) for p in Path(cwd).glob(word)) if "*" in word else [word]
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


def _documented_commands():
    """The page's two commands: execute a notebook, clear the outputs of notebooks in place."""
    commands = _documented_nbconvert_commands()
    execute = [c for c in commands if "--execute" in c]
    clear = [c for c in commands if "--clear-output" in c]
    assert len(execute) == 1 and len(clear) == 1, commands
    return execute[0], clear[0]


def _documented_execution_target():
    """The notebook that the page's execute command runs."""
    (target,) = [w for w in shlex.split(_documented_commands()[0]) if w.endswith(".ipynb") and not w.startswith("/")]
    return ROOT / target


@pytest.fixture(scope="module")
def documented_execution(tmp_path_factory):
    """The notebook executed by the page's ``jupyter nbconvert --execute`` command, with its outputs."""
    tmp_path = tmp_path_factory.mktemp("nbconvert")
    _run_nbconvert(_documented_commands()[0], ROOT, tmp_path)
    executed = list(tmp_path.glob("*.ipynb"))
    assert len(executed) == 1
    return nbformat.read(executed[0], as_version=4)


def test_documented_nbconvert_commands_run(tmp_path, documented_execution):
    """The page's commands work with the dev extra: execute a notebook, then clear its outputs in place."""
    dev = re.search(r"^dev = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.DOTALL | re.MULTILINE).group(1)
    assert re.search(r'"nbconvert\b', dev), "jupyter nbconvert is documented: nbconvert belongs in the dev extra"
    assert importlib.util.find_spec("nbconvert") is not None, 'nbconvert is not installed: pip install -e ".[dev]"'
    assert _documented_execution_target() in NOTEBOOKS
    nb = documented_execution
    assert any(c.outputs for c in nb.cells if c.cell_type == "code")
    # --clear-output --inplace on a copy of notebooks/ whose first notebook has the outputs
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "notebooks", copy / "notebooks")
    nbformat.write(nb, copy / "notebooks" / NOTEBOOKS[0].name)
    _run_nbconvert(_documented_commands()[1], copy, tmp_path)
    for path in sorted((copy / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code"), path
