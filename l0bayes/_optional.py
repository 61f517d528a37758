"""Optional dependencies, imported when first needed with a message that says how to install them."""

import warnings

__all__ = ["figure_axes", "import_arviz"]


def import_arviz():
    """Import ArviZ lazily (an optional dependency: ``pip install l0bayes[analysis]``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # arviz 0.2x announces its 1.0 refactor
            import arviz
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("l0bayes.analysis needs ArviZ: pip install 'l0bayes[analysis]'") from err
    return arviz


def figure_axes(ax=None, figsize=(5.0, 3.5)):
    """``(figure, axes)`` to draw on: those of ``ax`` when given, else a new matplotlib ``Figure`` of ``figsize``
    inches and its one axes (no pyplot: no global state, nothing shown)."""
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()
