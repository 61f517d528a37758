"""The notebooks in ``notebooks/`` execute top to bottom (small settings: ``L0BAYES_FAST=1``) and are stored clean.

Each notebook asserts its own numerical claims (atoms against sampling, KL against Monte Carlo,
variational against exact inclusion on the clear-cut diabetes features, pruned against gated
predictions), so a notebook that runs is also a notebook whose statements still hold.
"""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("arviz")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def test_the_four_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == [
        "01_hard_concrete.ipynb",
        "02_spike_slab_regression.ipynb",
        "03_sparse_mlp.ipynb",
        "04_posterior_gate_analysis.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch, tmp_path):
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
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
