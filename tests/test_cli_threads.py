"""The command line sets a passive OpenMP wait policy before torch loads, unless the user chose one."""

import os
import subprocess
import sys

import pytest
import torch

from l0bayes.cli.threads import configure_openmp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_policy_set_only_before_torch_and_only_without_a_user_choice(monkeypatch):
    assert torch.__name__ in sys.modules
    assert configure_openmp({}) is False  # torch is loaded in this process: too late, change nothing
    monkeypatch.delitem(sys.modules, "torch")
    env = {}
    assert configure_openmp(env) is True and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"):
        env = {key: "ACTIVE" if key == "OMP_WAIT_POLICY" else "100"}
        assert configure_openmp(env) is False and "PASSIVE" not in env.values()


def _run(code, **env):
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    environ.update(env, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


CODE = (
    "import os, sys\n"
    "from l0bayes.cli import main\n"
    "print('torch' in sys.modules)\n"
    "main(['--version'])\n"
    "print('torch' in sys.modules)\n"
    "print(os.environ.get('OMP_WAIT_POLICY'))\n"
)


@pytest.mark.parametrize("user", [None, "ACTIVE"])
def test_the_entry_point_sets_it_before_torch_loads(user):
    out = _run(CODE, **({"OMP_WAIT_POLICY": user} if user else {}))
    assert out[0] == "False"  # importing the command line does not load torch
    # the policy is in the environment, and torch still not loaded: what it reads when it loads
    assert out[-2] == "False" and out[-1] == (user or "PASSIVE")
