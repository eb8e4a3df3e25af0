"""Smoke run of bench/continuous.py (a tiny random model saved with a word tokenizer, a
few prompts) so the continuous-batching benchmark cannot rot: every method runs, in child
processes, the CLI included, and greedy bass output is the same however it is batched."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench" / "continuous.py"


def test_continuous_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("continuous", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "smoke_continuous.json").read_text())
    meta = data["meta"]
    assert meta["command"] == f"python bench/continuous.py --smoke --out {tmp_path}"
    assert meta["prompts"] == len(data["prompts"]) >= 4 and meta["rows"] < meta["prompts"]
    rows = {r["method"]: r for r in data["methods"]}
    ran = set(mod.METHODS) - ({mod.GB} if data["skipped"] else set())
    assert ran | {"cli (its summary)"} == set(rows), (set(rows), data["skipped"])
    cap = meta["max_new_tokens"]
    for m, r in rows.items():
        assert len(r["lengths"]) == meta["prompts"] and all(1 <= n <= cap for n in r["lengths"])
        assert r["tokens"] == sum(r["lengths"]) and r["wall_s"] > 0 and r["tokens_per_s"] > 0
        assert r["rss_mib"] > 50, m
        spread = r["lengths_spread"]
        assert spread["min"] <= spread["median"] <= spread["max"] <= cap
    # rows end at different lengths (the smoke model's eos is chosen so), and static chunks
    # and continuous batching give the same rows, the CLI's too
    assert len(set(rows["bass-static-off"]["lengths"])) > 1
    assert set(data["mismatches"]) == set(rows) - {"bass-static-off", "cli (its summary)"}
    for m, bad in data["mismatches"].items():
        if m != mod.GB:
            assert bad == [], m
    assert rows["bass-continuous"]["vs_static"] > 0 and rows["cli"]["printed"]["tokens"] > 0
    assert rows["bass-continuous"]["admissions"] > 1  # finished rows' slots were refilled
    if mod.GB in rows:
        cb = rows[mod.GB]["settings"]["continuous_batching_config"]
        assert cb["max_requests_per_batch"] == meta["rows"]
        assert rows["bass-static"]["vs_generate_batch"] > 0
    text = (tmp_path / "smoke_continuous.md").read_text()
    assert f"Command: `{meta['command']}`" in text and re.search(r"^Commit: \S+", text, re.M)
    for m in rows:
        assert f"| {m} | " in text
    assert "MISMATCH" not in text
