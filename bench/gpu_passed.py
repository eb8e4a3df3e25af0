"""Which ragged attention implementations passed all their GPU tests, from a JUnit XML.

``python bench/gpu_passed.py gpu_tests.xml`` prints them comma-separated (for
``bench/calibrate_auto.py --impls``): an implementation counts when at least one of its
tests ran and none failed or errored. Tests are attributed by file and parameters:
tests/test_triton_fused*.py -> ``fused``; tests/test_cutlass.py -> ``pad`` / ``split`` by
their parameter (tests of both, such as the shared softmax, count for both);
tests/test_ops_reference.py -> ``reference``; tests/test_ops_compile.py and
tests/test_ops_contract.py (opcheck) -> the implementation its parameter names. Exits 1
(printing nothing) when the file is missing or no implementation passed, so a calibration
never silently trusts kernels that were not tested.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def attribute(classname: str, name: str) -> set[str]:
    params = set(re.split(r"[\[\]\-]", name)) if "[" in name else set()
    if "test_triton_fused" in classname:
        return {"fused"}
    if "test_cutlass" in classname:
        return ({"pad", "split"} & params) or {"pad", "split"}
    if "test_ops_reference" in classname:
        return {"reference"}
    if "test_ops_compile" in classname or "test_ops_contract" in classname:
        return params & {"reference", "fused", "pad", "split"}  # one impl per test
    return set()


def passed(xml_path: Path) -> list[str]:
    ran: set[str] = set()
    failed: set[str] = set()
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        impls = attribute(case.get("classname", ""), case.get("name", ""))
        outcome = {child.tag for child in case}
        if "skipped" in outcome:
            continue
        ran |= impls
        if outcome & {"failure", "error"}:
            failed |= impls
    return sorted(ran - failed)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python bench/gpu_passed.py gpu_tests.xml", file=sys.stderr)
        return 2
    path = Path(args[0])
    if not path.is_file():
        print(f"{path} missing: run the test stage first", file=sys.stderr)
        return 1
    good = passed(path)
    if not good:
        return 1
    print(",".join(good))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
