"""The ``l0bayes`` command line: a thin layer over :mod:`l0bayes.data`, :mod:`l0bayes.models`,
:func:`l0bayes.inference.train` and :mod:`l0bayes.pruning` (pruning, FLOP counts, safe export).

``l0bayes fit`` trains a sparse model and prints a final table (test error, pruned architecture,
active parameters and FLOPs against the dense model, the free-energy terms of Eq. 21/22, wall time,
device). With no arguments it fits the L0 MLP to scikit-learn's digits with the penalised
objective (Eq. 22), which needs no download. Everything goes to the run directory (``--out``), whose
rules (refuse a used directory, one run at a time, atomic writes) are in :mod:`l0bayes.cli.rundir`.

One module per concern:

* :mod:`~l0bayes.cli.arguments`: the argument parser and the rules of the option values (also for
  ``config.json``);
* :mod:`~l0bayes.cli.config`: defaults, their checks, ``config.json`` and what ``--resume`` may change;
* :mod:`~l0bayes.cli.threads`: how OpenMP threads wait (set before torch loads);
* :mod:`~l0bayes.cli.models`: the model built from the settings and the data set;
* :mod:`~l0bayes.cli.rundir`: the run directory (lock, atomic writes, stale checkpoints);
* :mod:`~l0bayes.cli.evaluation`: the final numbers and the pruned model;
* :mod:`~l0bayes.cli.inclusion`: the checked inclusion probabilities of a Bayes regression's table;
* :mod:`~l0bayes.cli.report`: the final table, ``summary.json``, the history files;
* :mod:`~l0bayes.cli.plots`: ``training.png`` and ``gates.png``;
* :mod:`~l0bayes.cli.fit`: ``l0bayes fit`` itself, from the settings to the exit status.
"""

import sys

from .arguments import PROG, build_parser, parse_lam
from .config import DEFAULTS, RESUMABLE, resolve_config
from .errors import CLIError
from .fit import fit
from .models import build_model
from .threads import configure_openmp

__all__ = ["CLIError", "DEFAULTS", "RESUMABLE", "build_model", "build_parser", "fit", "main", "parse_lam"]


def main(argv=None):
    """Entry point of the ``l0bayes`` script (and ``python -m l0bayes``); returns the exit status.

    With no arguments, or options without a command, runs ``fit``.
    """
    configure_openmp()  # before torch loads: OpenMP threads that sleep, not spin, when they wait
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["fit", *argv]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: usage + one-line error (status 2), or --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command != "fit":
        parser.print_help()
        return 2
    try:
        cfg = resolve_config(args)
        return fit(cfg, resume=args.resume, overwrite=args.overwrite)
    except CLIError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
