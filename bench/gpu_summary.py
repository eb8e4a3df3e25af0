"""The GPU suite's short table (bench/gpu_suite.sh prints it last): one row per stage with
its cap, its time, its verdict and what it found, from whatever the stages left in the
work folder (a stage cut off by its cap leaves partial files, or none).

    python bench/gpu_summary.py WORK_DIR

Standard library only: it runs after every stage and must cost nothing.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PAPER = "paper (7.8B, A100, batch 8): 5.8 ms/token/seq, 2.15x over regular decoding"


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def env(work: Path) -> str:
    e = _load(work / "env.json")
    if not e:
        return ""
    cap = "".join(map(str, e.get("capability") or []))
    auto = e.get("auto_on_cuda", {})
    return (
        f"{e.get('device')} (sm_{cap}), torch {e.get('torch')}, CUDA {e.get('cuda')}, "
        f"triton {e.get('triton')}, transformers {e.get('transformers')}; auto on CUDA: "
        + ", ".join(f"{k} {v}" for k, v in auto.items())
    )


def smoke(work: Path) -> str:
    s = _load(work / "smoke.json") or {}
    parts = []
    for name, r in s.items():
        verdict = "ok" if r.get("ok") else "FAILED"
        err = f" err {r['max_abs_err']:.1e}" if "max_abs_err" in r else ""
        impl = f" ({r['impl']})" if isinstance(r.get("impl"), str) else ""
        parts.append(f"{name}{impl}: {verdict}{err}, {r.get('seconds', 0):.0f} s")
    return "; ".join(parts)


def tests(work: Path) -> str:
    xml = work / "gpu_tests.xml"
    failed: list[str] = []
    if xml.is_file():
        try:
            suite = ET.parse(xml).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
            for case in suite.iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failed.append(case.get("name", "?"))
            passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
            head = f"{passed} passed, {n['failures'] + n['errors']} failed, {n['skipped']} skipped"
            return head + (f"; failed: {', '.join(failed[:8])}" if failed else "")
        except (ET.ParseError, AttributeError, ValueError):
            pass
    try:  # cut off before the XML: count the verbose log's result lines
        log = (work / "tests.log").read_text(errors="replace")
    except OSError:
        return ""
    counts = {w: len(re.findall(rf" {w}\b", log)) for w in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    failed = re.findall(r"^(\S+::\S+) (?:FAILED|ERROR)", log, re.M)
    return (
        f"(from the log) {counts['PASSED']} passed, {counts['FAILED'] + counts['ERROR']} "
        f"failed, {counts['SKIPPED']} skipped"
        + (f"; failed: {', '.join(f.split('::')[-1] for f in failed[:8])}" if failed else "")
    )


def grid(work: Path) -> str:
    g = _load(work / "gpu_kernels.json")
    if not g:
        return ""
    copy = g["meta"].get("copy_gbs") or float("nan")
    parts = []
    for row in g["rows"]:
        impls = {k: v for k, v in row.items() if isinstance(v, dict) and "layer_us" in v}
        best = min(impls, key=lambda k: impls[k]["layer_us"])
        flex = impls.get("flex")
        share = f", flex {flex['layer_us']:.0f} µs" if flex and best != "flex" else ""
        gbs = impls[best].get("gbs", float("nan"))
        parts.append(
            f"{row['case']}: {best} {impls[best]['layer_us']:.0f} µs "
            f"({100 * gbs / copy:.0f}% of {copy:.0f} GB/s){share}"
        )
    return "; ".join(parts)


def e2e(work: Path) -> str:
    e = _load(work / "gpu_e2e.json")
    if not e:
        return ""
    meta, rows = e["meta"], e["rows"]
    parts = []
    for r in rows:
        if r["method"] == "hf-generate":
            continue
        parts.append(
            f"b{r['batch']} {r['method']}: {r['ms_per_token_per_seq']:.1f} ms/tok/seq "
            f"({r['speedup']:.2f}x generate)"
        )
    floor = meta.get("bandwidth_floor_ms")
    tail = f"; weight-bandwidth floor {floor:.2f} ms/step" if floor else ""
    forced = meta.get("forced_acceptance")
    label = f"FORCED ACCEPTANCE p={forced}: " if forced else ""
    return label + "; ".join(parts) + tail + f"; {PAPER}"


FOUND = {"env": env, "smoke": smoke, "tests": tests, "grid": grid, "e2e": e2e}


def main(argv=None) -> int:
    work = Path((argv or sys.argv[1:])[0])
    lines = ["| stage | cap s | took s | verdict | found |", "|---|---:|---:|---|---|"]
    try:
        stages = [ln.split("\t") for ln in (work / "stages.tsv").read_text().splitlines()]
    except OSError:
        stages = []
    for name, cap, took, verdict in (s for s in stages if len(s) == 4):
        try:
            found = FOUND.get(name, lambda w: "")(work)
        except Exception as e:  # a malformed partial file must not hide the other rows
            found = f"(unreadable: {type(e).__name__})"
        lines.append(f"| {name} | {cap} | {took} | {verdict} | {found} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
