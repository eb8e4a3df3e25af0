"""bench/results/ holds the results of the committed benchmark runs only
(bench/commands.toml, what ``nox -s bench`` runs), each recording the command that wrote
it, and bench/results/gpu/<lease>/ those of GPU leases (bench/gpu_suite.sh, one folder per
lease, its README naming the calls, commands and commits), and bench/README.md maps every
run to its files (issue #27: results written by
commands that write elsewhere, orphans, and a ``nox -s bench`` whose flags differed from
the committed runs' had crept in)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
RUNS = tomllib.loads((BENCH / "commands.toml").read_text())["run"]


def result_files() -> set[str]:
    """The files directly in bench/results/ that git tracks (what a clone has; a local
    rerun's extra outputs are not results until committed), or all of them outside git.
    GPU leases' folders (bench/results/gpu/) are checked on their own."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        paths = [Path(line) for line in out.stdout.splitlines()]
        return {p.name for p in paths if p.parent == Path("bench/results")}
    return {p.name for p in RESULTS.iterdir() if p.is_file()}


def test_every_gpu_lease_says_what_ran():
    """Each GPU lease's folder: a README naming the device and each call's command and
    commit; per call through the suite, its table (summary.md) and stage verdicts
    (stages.tsv); per call of another command (a follow-up written in the lease), its logs."""
    leases = [p for p in (RESULTS / "gpu").iterdir() if p.is_dir()]
    assert leases
    for lease in leases:
        readme = (lease / "README.md").read_text()
        assert re.search(r"^Device: .*(H100|H200)", readme, re.M), lease.name
        calls = sorted(p for p in lease.iterdir() if p.is_dir())
        assert calls, lease.name
        for call in calls:
            row = re.search(rf"^\| {call.name} \| `([^`]+)`[^|]*\| [0-9a-f]{{7,}} ", readme, re.M)
            assert row, f"{lease.name}: {call.name} not in its table"
            if row.group(1).startswith("bash bench/gpu_suite.sh"):
                assert (call / "summary.md").is_file() and (call / "stages.tsv").is_file()
            else:
                assert any(call.glob("*.log")), f"{lease.name}/{call.name}: no logs"


def recorded_command(path: Path) -> str | None:
    """The command a result file says wrote it (markdown: its ``Command:`` line; JSON: its
    ``meta.command`` or ``command``); ``None`` for other files (charts)."""
    if path.suffix == ".md":
        m = re.search(r"^Command: `(.+)`", path.read_text(), re.MULTILINE)
        return m.group(1) if m else ""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return (data.get("meta") or {}).get("command", data.get("command", ""))
    return None


def test_runs_are_well_formed():
    names = [r["name"] for r in RUNS]
    assert len(set(names)) == len(names), f"duplicate run names: {names}"
    for run in RUNS:
        argv = shlex.split(run["command"])
        assert argv[:1] == ["python"] and argv[1].startswith("bench/"), run["command"]
        assert (ROOT / argv[1]).is_file(), f"{run['name']}: no script {argv[1]}"
        assert "--out" not in argv, f"{run['name']} writes outside bench/results/"
        assert run["writes"], f"{run['name']} writes nothing"


def test_every_result_belongs_to_a_run_and_exists():
    written = [f for r in RUNS for f in r["writes"]]
    assert len(set(written)) == len(written), "two runs claim the same file"
    files = result_files()
    orphans = sorted(files - set(written))
    assert not orphans, f"bench/results/ files no run in bench/commands.toml writes: {orphans}"
    missing = sorted(set(written) - files)
    assert not missing, f"bench/commands.toml names files bench/results/ lacks: {missing}"


@pytest.mark.parametrize("run", RUNS, ids=[r["name"] for r in RUNS])
def test_each_result_records_the_command_of_its_run(run):
    want = run.get("recorded", run["command"])
    for name in run["writes"]:
        got = recorded_command(RESULTS / name)
        if got is not None:
            assert got == want, f"{name} records `{got}`, bench/commands.toml says `{want}`"


def test_every_script_records_the_commit_machine_and_command():
    """New results carry the git commit too: every script of a run builds its header or
    metadata with bench/_machine.py (run_meta: command, commit, date, machine, software) or
    records its STARTED_AT commit itself."""
    for script in sorted({shlex.split(r["command"])[1] for r in RUNS}):
        text = (ROOT / script).read_text()
        assert "run_meta(" in text or "STARTED_AT" in text, script


def test_bench_readme_maps_every_run():
    readme = (BENCH / "README.md").read_text()
    for run in RUNS:
        assert f"`{run['command']}`" in readme, f"bench/README.md lacks `{run['command']}`"
        for name in run["writes"]:
            assert f"`{name}`" in readme, f"bench/README.md does not name {name}"


def test_profile_step_records_its_run(tmp_path):
    """bench/profile_step.py on a tiny random model: its header names the command and the
    commit (the other scripts' smoke tests cover theirs)."""
    spec = importlib.util.spec_from_file_location("profile_step", BENCH / "profile_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "profile.md"
    assert mod.main(["--tiny", "--batch", "2", "--max-new", "4", "--out", str(out)]) == 0
    text = out.read_text()
    assert "Command: `python bench/profile_step.py --tiny --batch 2" in text
    assert re.search(r"^Commit: \S+", text, re.MULTILINE)
