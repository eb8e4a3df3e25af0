"""bench/coupling.py: a smoke run on a tiny pair, and its exact agreements against
Monte-Carlo draws of bass's own samplers (sample_keyed, rejection sampling)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from bass.sampling import position_keys, sample_keyed

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench" / "coupling.py"


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("coupling", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_smoke_run_reports_every_way(mod, tmp_path):
    assert mod.main(["--tiny", "--out", str(tmp_path / "c")]) == 0
    text = (tmp_path / "c.md").read_text()
    assert "| rejection |" in text and "Command: `python bench/coupling.py --tiny" in text


def test_the_block_agreement_is_what_sample_keyed_does(mod):
    """The formula for 64-token blocks equals the rate at which sample_keyed's draws of two
    distributions with one key agree (Monte Carlo, 40k keys)."""
    g = torch.Generator().manual_seed(0)
    V, N = 300, 40_000
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 3, -1)
    q = torch.softmax(torch.log(p) + 0.7 * torch.randn(V, generator=g, dtype=torch.float64), -1)
    keys = torch.tensor(position_keys(1, list(range(N)), [0] * N, 1))
    same = (sample_keyed(p.expand(N, V), keys) == sample_keyed(q.expand(N, V), keys)).double()
    want = mod.block_agreement(p[None], q[None], 64).item()
    assert abs(same.mean().item() - want) < 4 * (want * (1 - want) / N) ** 0.5
    got = mod.agreement(p[None], q[None])
    assert got["rejection"].item() >= want >= got["inverse-cdf"].item() - 0.05
