"""Every option declared once (bass.options): the config file's tables, the flags, the
docs' tables and the policies' options are made from the declarations and agree with
them; the declarations' modules import one way (no cycle, the core never imports the
configuration layer or the command line, a lazy import inside a function included)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

import pytest

import bass.config
from bass import options
from bass.cli import build_parser
from bass.cli.settings import FLAG_KEYS
from bass.option_kinds import Range
from bass.policies.builtin import BassPolicy

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "bass"

# --------------------------------------------------------------------------- derived


def test_every_config_key_is_one_declared_option():
    declared = {o.config_key: o for o in options.OPTIONS.values() if o.config_key}
    made = {
        f"{table}.{f.name}": f.default
        for table, cls in [
            ("policy", bass.config.PolicyConfig),
            ("generation", bass.config.GenerationConfig),
            ("model", bass.config.ModelConfig),
        ]
        for f in dataclasses.fields(cls)
    }
    assert set(made) == set(declared)
    for key, o in declared.items():
        default = getattr(bass.config.Config(), o.table).__dict__[key.split(".")[1]]
        assert default == (None if o.name in bass.config.UNSET else o.default), key
    assert tuple(bass.config.TABLES["generation"]) == options.GENERATE


def test_every_flag_sets_its_declared_key():
    """Each declared flag is a flag of `bass generate` and `bass eval humaneval` (but
    --logprobs and --prompt-logprobs, which an evaluation keeps none of), of the declared
    type or choices, and FLAG_KEYS sends it to the declared key."""
    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices
    commands = [subs["generate"], subs["eval"]._subparsers._group_actions[0].choices["humaneval"]]
    flagged = [o for o in options.OPTIONS.values() if o.flag]
    assert {dest for dest in FLAG_KEYS} == {o.flag[2:].replace("-", "_") for o in flagged}
    for command in commands:
        actions = {a.dest: a for a in command._actions}
        for o in flagged:
            dest = o.flag[2:].replace("-", "_")
            if dest in ("logprobs", "prompt_logprobs") and command is commands[1]:
                assert dest not in actions
                continue
            action = actions[dest]
            assert o.flag in action.option_strings and FLAG_KEYS[dest][0] == o.config_key
            if getattr(o.kind, "choices", None) and not callable(o.kind.choices):
                assert tuple(action.choices) == tuple(o.kind.choices)
            elif o.kind.type in (int, float):
                assert action.type is o.kind.type
            assert o.doc in action.help


def test_a_flag_and_a_key_refuse_in_the_declared_words(capsys):
    from cli_support import run

    for o in options.OPTIONS.values():
        if o.kind.type is int and o.flag and isinstance(o.kind, Range):
            rc, _, err = run(capsys, f"generate hi {o.flag} -5")
            assert rc == 2 and f"command line: {o.flag} = -5 is not allowed" in err
            assert f"expected {o.kind.allowed({})}" in err


def test_the_docs_tables_are_the_declarations():
    spec = importlib.util.spec_from_file_location(
        "options_page", ROOT / "docs/_ext/options_page.py"
    )
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    text = page.PAGE.read_text(encoding="utf-8")
    assert page.BEGIN in text and page.END in text
    assert page.page(text) == text, (
        "docs/reference/options.md disagrees with the declarations: run "
        "`python docs/_ext/options_page.py` and commit the page"
    )


def test_a_policy_option_is_declared_with_the_same_range():
    declared = {f.name: f.metadata["kind"] for f in dataclasses.fields(BassPolicy) if f.metadata}
    assert isinstance(declared["l0"], Range) and declared["l0"].high == "l_limit"
    assert declared["l0"].allowed({"values": {"l_limit": 32}}) == "an int in [1, l_limit=32]"
    with pytest.raises(options.OptionError, match=r"an int in \[1, l_limit=8\], got 9"):
        BassPolicy(l0=9, l_limit=8)


# --------------------------------------------------------------------------- imports


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the bass modules it imports, anywhere in it (a lazy import inside a
    function too; ``importlib.import_module("...")`` with a literal name too)."""
    paths = {_module(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level else []
                stem = ".".join([*base, *(node.module.split(".") if node.module else [])])
                # `from . import x`: the module x where there is one, else the package
                subs = [f"{stem}.{a.name}" for a in node.names if f"{stem}.{a.name}" in paths]
                found.update(subs or [stem])
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                target = node.args[0].value
                found.add(f"{name}{target}" if target.startswith(".") else target)
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


DECLARING = ["bass.option_kinds", "bass.options", "bass.config", "bass.cli.parser",
             "bass.cli.settings", "bass.policies", "bass.policies.base",
             "bass.policies.registry", "bass.engine"]  # fmt: skip
CORE = ["bass.option_kinds", "bass.options", "bass.policies", "bass.engine"]


def test_no_import_cycle_in_bass():
    """Layers import one way (core <- configuration <- applications): no cycle anywhere in
    src/bass, lazy imports inside functions included."""
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(scc) for scc in found)
    assert set(DECLARING) <= set(import_graph())  # the graph sees the option modules


def test_no_module_over_600_lines():
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert not long, f"modules over 600 lines (split them): {long}"


@pytest.mark.parametrize("module", CORE)
def test_the_core_never_imports_the_configuration_or_the_command_line(module):
    above = sorted(
        m for m in reach(import_graph(), module) if m == "bass.config" or m.startswith("bass.cli")
    )
    assert not above, f"{module} imports {above} (the layers above the core)"


def test_ranks_agree_on_every_generation_option():
    """A tensor-parallel group (and ``bass.distributed.generate``'s ranks) refuses ranks
    whose calls differ in any ``[generation]`` option (``logprobs`` was left out: ranks
    asking for other ones merged silently); the eos ids are compared apart, as a set."""
    from bass.distributed import AGREED

    assert set(AGREED) == set(options.GENERATE) - {"eos_token_id"}
