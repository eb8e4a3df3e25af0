"""``bench/gpu_suite.sh`` on the CPU: what can be checked without a GPU, so that a lease is
not spent on a typo. A dry run (``GPU_SUITE_DRY_RUN=1``) writes each stage's time cap and
command: every script, test file and flag it names must exist, the caps (with the kill
grace and the bundling reserve) must fit the one call's limit of 8 minutes, and every file
with a CUDA test must be in the first call's test stage. The table printed last is built
here from complete, partial and missing stage outputs. Fast: no stage runs."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "gpu_suite.sh"
ONE_CALL_LIMIT = 8 * 60  # seconds: the whole verdict in one device call
STAGES = {
    "first": ["env", "smoke", "tests", "grid", "e2e"],
    "second": ["env", "tests", "grid", "sanitize", "e2e"],
    "followup": ["e2e", "tests"],
    "rerun": ["probe", "smoke", "tests", "e2e"],
    "graphs": ["smoke", "e2e", "tests"],
}


def dry_run(tmp_path, call: str | None = None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    work, out = tmp_path / "work", tmp_path / "out"
    env = {**os.environ, "GPU_SUITE_DRY_RUN": "1", "GPU_SUITE_WORK": str(work), "OUT": str(out)}
    proc = subprocess.run(
        ["bash", str(SUITE), *([call] if call else [])],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,  # the script finds the checkout from its own path
    )
    return proc, work


def stages(work: Path) -> dict[str, tuple[int, list[str]]]:
    """name -> (cap in seconds, argv), in the order the suite runs them."""
    found = {}
    for line in (work / "stages.tsv").read_text().splitlines():
        name = line.split("\t")[0]
        cap, cmd = (work / f"{name}.cmd").read_text().split("\n", 1)
        found[name] = (int(cap), shlex.split(cmd))
    return found


def limits(work: Path) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", (work / "limits.txt").read_text())}


@pytest.mark.parametrize("call", ["first", "second", "followup"])
def test_each_call_fits_one_lease_call(tmp_path, call):
    proc, work = dry_run(tmp_path, None if call == "first" else call)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = stages(work)
    assert list(found) == STAGES[call]
    lim = limits(work)
    assert lim["CALL_LIMIT"] <= ONE_CALL_LIMIT
    total = sum(cap for cap, _ in found.values()) + len(found) * lim["KILL_GRACE"]
    assert total + lim["RESERVE"] <= lim["CALL_LIMIT"], (total, lim)
    assert all(cap > 0 for cap, _ in found.values())


def flags(script: str) -> set[str]:
    """The options a script's argparse declares, read from its source (no import: fast)."""
    return set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", (ROOT / script).read_text()))


def test_every_script_test_file_and_flag_named_exists(tmp_path):
    checked = set()
    for call in STAGES:
        proc, work = dry_run(tmp_path / call, call)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for name, (_, argv) in stages(work).items():
            # a `bash -c '...'` stage: its script's words too
            words = [w for a in argv for w in (shlex.split(a) if " " in a else [a])]
            for i, word in enumerate(words):
                if re.fullmatch(r"(bench|cutlass_kernels|tests)/\S+\.(py|sh)", word):
                    assert (ROOT / word).is_file(), f"{call} {name}: {word} does not exist"
                if word.endswith(".py") and words[i - 1] == "python":
                    rest = words[i + 1 :]
                    rest = rest[: rest.index("&&")] if "&&" in rest else rest
                    known = flags(word)
                    for flag in (w.split("=")[0] for w in rest if w.startswith("--")):
                        assert flag in known, f"{call} {name}: {word} has no {flag}"
                    checked.add(word)
    assert checked >= {"bench/gpu_smoke.py", "bench/bench_kernels.py", "bench/bench_e2e.py"}


def test_the_first_call_runs_every_file_with_a_cuda_test(tmp_path):
    proc, work = dry_run(tmp_path)
    assert proc.returncode == 0
    _, argv = stages(work)["tests"]
    assert "HYPOTHESIS_PROFILE=gpu" in argv and "-m" in argv
    named = [w for w in argv if w.startswith("tests/")]
    gpu_files = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"^(@pytest\.mark\.gpu\b|\s+pytest\.mark\.gpu,)", p.read_text(), re.M)
    }
    assert gpu_files and gpu_files <= set(named), gpu_files - set(named)
    # the engine's first (the CUDA default end to end); flex's property tests, a compile
    # per example, last (one ran past the whole stage in the second lease)
    assert named[0] == "tests/gpu/test_engine_gpu.py" and named[-1] == "tests/ops/test_ops_flex.py"
    assert "--timeout=40" in argv  # one test's cap: a long one fails alone


def test_the_gpu_profile_bounds_every_property_test():
    """Under HYPOTHESIS_PROFILE=gpu a test's examples are capped (tests/profiles.py), and
    every property test of the files the test stage runs takes its count from there."""
    proc = subprocess.run(
        [sys.executable, "-c", "import profiles as p; print(p.examples(150), p.examples(3))"],
        capture_output=True,
        text=True,
        cwd=ROOT / "tests",
        env={**os.environ, "HYPOTHESIS_PROFILE": "gpu"},
        timeout=30,
    )
    assert proc.stdout.split() == ["6", "3"], proc.stderr
    for path in (ROOT / "tests").rglob("test_*.py"):
        text = path.read_text()
        if re.search(r"pytest\.mark\.gpu", text):
            fixed = re.findall(r"max_examples=(\d+)", text)
            assert not fixed, f"{path.name}: max_examples={fixed} ignores the gpu profile"


def test_an_unknown_call_is_refused_before_anything_runs(tmp_path):
    proc, work = dry_run(tmp_path, "thrid")
    assert proc.returncode == 2 and "unknown call 'thrid'" in proc.stderr
    assert not work.exists()


def _write(work: Path, name: str, data) -> None:
    (work / name).write_text(data if isinstance(data, str) else json.dumps(data))


def test_the_table_reads_complete_partial_and_missing_stages(tmp_path):
    work = tmp_path
    _write(work, "stages.tsv", "env\t15\t4\tok\nsmoke\t75\t75\ttimed out at 75 s\n"
           "tests\t170\t160\tok\ngrid\t50\t30\tfailed (exit 1)\ne2e\t140\t120\tok\n")  # fmt: skip
    _write(work, "env.json", {"device": "NVIDIA H100", "capability": [9, 0], "torch": "2.11",
                              "auto_on_cuda": {"eager": "flex", "compiled": "flex"}})  # fmt: skip
    _write(work, "smoke.json", {"op eager": {"ok": True, "impl": "flex", "max_abs_err": 0.004,
                                             "seconds": 12.0}})  # fmt: skip
    _write(work, "tests.log", "tests/ops/test_ops_flex.py::test_a PASSED [ 1%]\n"
           "tests/ops/test_ops_flex.py::test_b FAILED [ 2%]\n")  # fmt: skip
    _write(work, "gpu_e2e.json", {
        "meta": {"forced_acceptance": [0.7], "bandwidth_floor_ms": 4.1},
        "rows": [{"batch": 8, "method": "hf-generate", "ms_per_token_per_seq": 30.0,
                  "speedup": 1.0},
                 {"batch": 8, "method": "bass[constant] p=0.7", "ms_per_token_per_seq": 9.0,
                  "speedup": 3.3}]})  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_summary.py"), str(work)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r.split("|")[1].strip(): r for r in proc.stdout.splitlines()[2:]}
    assert list(rows) == ["env", "smoke", "tests", "grid", "e2e"]
    assert "NVIDIA H100 (sm_90)" in rows["env"] and "eager flex" in rows["env"]
    assert "timed out at 75 s" in rows["smoke"] and "op eager (flex): ok" in rows["smoke"]
    assert "(from the log) 1 passed, 1 failed" in rows["tests"] and "test_b" in rows["tests"]
    assert "failed (exit 1)" in rows["grid"]
    assert "FORCED ACCEPTANCE" in rows["e2e"] and "3.30x generate" in rows["e2e"]
    assert "floor 4.10 ms" in rows["e2e"] and "5.8 ms/token/seq, 2.15x" in rows["e2e"]


@pytest.mark.slow
def test_the_sanitizer_script_checks_pass_on_the_cpu_implementations():
    """bench/gpu_sanitize.py (the second call's compute-sanitizer run) on the CPU."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_sanitize.py"), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "packed reference torch.bfloat16 ragged: ok" in proc.stdout
