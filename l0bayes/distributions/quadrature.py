"""Gauss-Legendre quadrature for the continuous part of hard concrete gates.

The expectations of the hard concrete (mean, variance, entropy, KL) are integrals of
smooth functions over a finite interval of the logit variable
``v = logit((z - lower) / (upper - lower))`` (docs/mathematics.md, "Deterministic quadrature"); a fixed
Gauss-Legendre rule integrates them deterministically, differentiably and vectorised over
any batch shape.

How many nodes: the integrands are analytic in a strip around the real interval whose
half-width is ``pi / temperature`` (poles of the logistic density) or ``pi`` (the stretch
Jacobian), whichever is smaller. For an interval of half-length ``h`` and strip half-width
``d`` the Gauss-Legendre error decays like ``rho ** (-2 n)`` with
``rho = d/h + sqrt(1 + (d/h)**2)`` (the Bernstein ellipse that fits in the strip), so
:func:`num_nodes_for` picks ``n = ceil(c / log(rho))`` with ``c`` calibrated per dtype
against mpmath (``tests/test_accuracy.py``): relative error below 1e-10 in float64 and
1e-6 in float32 over ``temperature`` in ``[0.05, 5]`` and ``|log_alpha| <= 30``.
"""

import functools
import math

import numpy as np
import torch

#: ``c`` in ``n = ceil(c / log(rho))`` per dtype (see the module docstring).
_ACCURACY_CONSTANT = {torch.float64: 17.5, torch.float32: 12.5}
MIN_NODES = 8
MAX_NODES = 512


def num_nodes_for(max_temperature, max_half_width, dtype):
    """Gauss-Legendre nodes that reach ``dtype``'s accuracy for the given worst-case parameters.

    :param float max_temperature: the largest temperature involved.
    :param float max_half_width: the largest half-length of the logit interval ``(v0, v1)``.
    :param torch.dtype dtype: float64 targets 1e-10 relative error, other dtypes 1e-6.
    """
    strip = math.pi / max(max_temperature, 1.0)
    delta = strip / max_half_width
    rho = delta + math.sqrt(1.0 + delta * delta)
    c = _ACCURACY_CONSTANT.get(dtype, _ACCURACY_CONSTANT[torch.float32])
    return int(min(MAX_NODES, max(MIN_NODES, math.ceil(c / math.log(rho)))))


def check_num_nodes(num_nodes):
    """Raise a :class:`ValueError` naming ``num_nodes`` unless it is a positive integer (not a bool)."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive integer, got {num_nodes!r}")


@functools.cache
def _legendre_numpy(num_nodes):
    return np.polynomial.legendre.leggauss(num_nodes)


_CACHE = {}


def gauss_legendre(num_nodes, dtype=torch.float64, device="cpu"):
    """Nodes and weights of the ``num_nodes``-point Gauss-Legendre rule on ``[-1, 1]``.

    Returns two 1-d tensors of ``dtype`` on ``device``; computed once in float64 and
    cached.
    """
    check_num_nodes(num_nodes)
    key = (num_nodes, dtype, torch.device(device))
    if key not in _CACHE:
        x, w = _legendre_numpy(num_nodes)
        _CACHE[key] = (
            torch.as_tensor(x, dtype=dtype, device=device),
            torch.as_tensor(w, dtype=dtype, device=device),
        )
    return _CACHE[key]


#: Gates processed at once by the chunked quadrature: ``chunk * num_nodes`` temporaries
#: stay in cache instead of page-faulting through gigabytes for 10^7 gates.
CHUNK_SIZE = 1 << 14


def map_chunks(fn, tensors, batch_shape, chunk_size=CHUNK_SIZE):
    """Apply ``fn`` to flat chunks of broadcast ``tensors`` and reassemble ``batch_shape``.

    ``fn`` takes 1-d tensors (one chunk of each input) and returns a 1-d tensor of the same
    length. Differentiable (chunks are joined with ``torch.cat``).
    """
    flat = [t.expand(batch_shape).reshape(-1) for t in tensors]
    total = flat[0].numel() if flat else 0
    if total <= chunk_size:
        return fn(*flat).reshape(batch_shape)
    pieces = [fn(*(t[i : i + chunk_size] for t in flat)) for i in range(0, total, chunk_size)]
    return torch.cat(pieces).reshape(batch_shape)
