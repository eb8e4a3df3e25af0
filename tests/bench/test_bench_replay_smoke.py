"""bench/replay_policies.py: a smoke run (tiny sizes), ``--load``, and the replay's
fidelity: a policy that decides from token counts only drafts, accepts and steps in the
replay exactly as in a real generation."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench" / "replay_policies.py"


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("replay_policies", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(mod, tmp_path_factory):
    out = tmp_path_factory.mktemp("replay")
    argv = ["--setup", "tiny", "--batches", "1,4", "--max-new", "12", "--seeds", "1"]
    assert mod.main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    return out


def test_tables_name_every_method_and_batch(mod, run):
    table = (run / "tiny_policy_replay.md").read_text()
    for batch in (1, 4):
        for m in [mod.OFF, *mod.POLICIES]:
            label = f"**{m}** (default)" if m == mod.DEFAULT else m
            assert f"| {batch} | {label} |" in table
    assert "Default policy: worst cell" in table and "- batch 4: plain" in table


def test_load_replays_other_policies_without_the_model(mod, run, tmp_path, capsys):
    saved = run / "tiny_policy_replay.json"
    argv = ["--load", str(saved), "--policy", "constant:k=2", "--out", str(tmp_path)]
    for tag in ("a", "b"):
        assert mod.main([*argv, "--tag", tag]) == 0
    a, b = (json.loads((tmp_path / f"{t}.json").read_text())["cells"] for t in ("a", "b"))
    assert a == b  # deterministic given the traces and the cost table
    assert set(a["ragged"]["4"]) == {mod.OFF, "constant:k=2"}
    for spec, said in [("constant:q=2", "has no option 'q'"), ("nope", "unknown policy 'nope'")]:
        with pytest.raises(SystemExit) as usage:  # a usage error (status 2), not a traceback
            mod.main(["--load", str(saved), "--policy", spec, "--out", str(tmp_path)])
        assert usage.value.code == 2 and said in capsys.readouterr().err


def test_a_token_count_policy_replays_as_it_generates(mod, run):
    """``constant`` k=3 in the engine (real passes, greedy, n-gram lookup) and in the
    replay of the recorded traces: the same steps, drafted and accepted tokens."""
    from bench_policies import tiny_setup

    from bass import Generator
    from bass.policies import registry

    saved = json.loads((run / "tiny_policy_replay.json").read_text())
    main, _, sets, _ = tiny_setup()
    for name, prompts in sets.items():
        traces = saved["traces"][name]
        for B in (1, 4):
            real = {"steps": 0, "drafted": 0, "accepted": 0}
            for i in range(0, len(prompts) - B + 1, B):
                gen = Generator(main, "ngram", policy="constant", policy_options={"k": 3})
                st = gen.generate(prompts[i : i + B], max_new_tokens=12).stats
                real["steps"] += len(st.steps)
                real["drafted"] += sum(sum(s.drafted) for s in st.steps)
                real["accepted"] += sum(sum(s.accepted) for s in st.steps)
            cost = mod.Cost(saved["costs"][str(B)])
            sim = {"steps": 0, "drafted": 0, "accepted": 0}
            for i in range(0, len(traces) - B + 1, B):
                r = mod.replay(registry.load("constant", k=3), traces[i : i + B], cost, 0.0, 0)
                for key in sim:
                    sim[key] += r[key]
            assert sim == real, (name, B)
            assert real["accepted"] > 0
