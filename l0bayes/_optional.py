"""Optional dependencies, imported when first needed with a message that says how to install them."""

import warnings

__all__ = ["import_arviz"]


def import_arviz():
    """Import ArviZ lazily (an optional dependency: ``pip install l0bayes[analysis]``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # arviz 0.2x announces its 1.0 refactor
            import arviz
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("l0bayes.analysis needs ArviZ: pip install 'l0bayes[analysis]'") from err
    return arviz
