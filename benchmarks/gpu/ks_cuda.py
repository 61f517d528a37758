"""The truncated sampler of the continuous part (``HardConcrete.sample_continuous``) on CUDA, float32 and
float64, against the reference CDF of ``tests/hc_reference.py``: Kolmogorov-Smirnov p-values at 10^6 draws for
every case of the test suite (several seeds), and the uniform stream of the suite's seed itself (the suite's
test draws 20,000 numbers after ``torch.manual_seed(2)``; its statistic is that of those uniforms, since the
sampler is a monotone map of one uniform per draw)::

    python benchmarks/gpu/ks_cuda.py
"""

import pathlib
import sys

import torch
from scipy import stats

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
import hc_reference as ref  # noqa: E402
from test_hard_concrete import SAMPLE_CONTINUOUS_CASES  # noqa: E402

from l0bayes import HardConcrete  # noqa: E402


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(2)
        u = torch.rand(20000, dtype=dtype, device=device).double().cpu().numpy()
        p = stats.kstest(u, "uniform").pvalue
        print(f"{device} {dtype}: the uniforms after manual_seed(2), 20,000: KS p = {p:.4f}")
        for case in SAMPLE_CONTINUOUS_CASES:
            pvalues = []
            for seed in range(3):
                torch.manual_seed(100 + seed)
                a, b, lower, upper = (torch.tensor(v, dtype=dtype, device=device) for v in case)
                z = HardConcrete(a, b, lower, upper).sample_continuous((1_000_000,)).double().cpu().numpy()
                pvalues.append(stats.kstest(z, ref.truncated_cdf(*case)).pvalue)
            print(f"  case {case}: KS p at 10^6 draws, seeds 100-102: " + ", ".join(f"{p:.3f}" for p in pvalues))


if __name__ == "__main__":
    main()
