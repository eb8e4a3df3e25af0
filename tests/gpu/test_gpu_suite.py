"""``bench/gpu_suite.sh`` on the CPU: what can be checked without a GPU, so that a lease
is not spent on a typo. A dry run (``GPU_SUITE_DRY_RUN=1``) writes each stage's command;
every script, test file and flag it names must exist; unknown stages are refused; the
sanitizer script's own comparisons run on the CPU's implementations."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "gpu_suite.sh"
STAGES = ["env", "build", "test", "sanitize", "kernels", "e2e"]


def suite(tmp_path, stages: str, **env):
    run_env = {**os.environ, "GPU_SUITE_DRY_RUN": "1", **env}
    run_env.pop("OUT", None)
    return subprocess.run(
        ["bash", str(SUITE), stages, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=run_env,
        cwd=tmp_path,  # the script finds the checkout from its own path
    )


def test_a_dry_run_of_every_stage_names_scripts_tests_and_flags_that_exist(tmp_path):
    proc = suite(tmp_path, "all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "summary.txt").read_text()
    for stage in STAGES:
        assert f"{stage}: dry run" in summary
    helps: dict[str, str] = {}
    for cmd_file in sorted(tmp_path.glob("*.cmd")):
        argv = shlex.split(cmd_file.read_text())
        for i, word in enumerate(argv):
            path = ROOT / word
            if word.endswith(".py") and word != "-":
                assert path.is_file(), f"{cmd_file.name}: {word} does not exist"
            if argv[i - 1 : i + 1] == ["python", word] and word.endswith(".py"):
                script = word
                if script not in helps:
                    h = subprocess.run(
                        [sys.executable, str(path), "--help"],
                        capture_output=True,
                        text=True,
                        timeout=120,
                        cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                    )
                    helps[script] = h.stdout if h.returncode == 0 else ""
                # every --flag after the script must be one its parser knows
                for flag in (w.split("=")[0] for w in argv[i + 1 :] if w.startswith("--")):
                    if helps[script]:
                        assert re.search(rf"{re.escape(flag)}\b", helps[script]), (
                            f"{cmd_file.name}: {script} has no {flag}"
                        )
    tests = shlex.split((tmp_path / "test.cmd").read_text())
    named = [w for w in tests if w.startswith("tests/")]
    assert named and all((ROOT / w).is_file() for w in named)
    # every file with a CUDA test (marked gpu) is in the test stage's list
    gpu_files = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"^(@pytest\.mark\.gpu\b|\s+pytest\.mark\.gpu,)", p.read_text(), re.M)
    }
    assert gpu_files <= set(named), gpu_files - set(named)


def test_an_unknown_stage_is_refused_before_anything_runs(tmp_path):
    proc = suite(tmp_path, "env,kernals")
    assert proc.returncode == 2
    assert "unknown stage 'kernals'" in proc.stderr and "kernels" in proc.stderr
    assert not (tmp_path / "summary.txt").exists()


def test_the_sanitizer_script_checks_pass_on_the_cpu_implementations():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_sanitize.py"), "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "packed reference torch.bfloat16 ragged: ok" in proc.stdout
