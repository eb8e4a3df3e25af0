"""The option tables of docs/reference/options.md, made from the declarations.

The docs site is built without importing bass (mkdocs reads the source statically), so
the tables are committed and ``tests/config/test_declarations.py`` fails when they
disagree with :data:`bass.options.OPTIONS` and the built-in policies' :func:`option`
fields. After changing an option, rewrite them (bass and its dependencies installed)::

    python docs/_ext/options_page.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "reference" / "options.md"
BEGIN = "<!-- options: made by docs/_ext/options_page.py from the declarations -->"
END = "<!-- options: end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*")


def _value(v) -> str:
    """``v`` as a config file spells it (``true``, ``"auto"``)."""
    return f"`{json.dumps(v)}`" if isinstance(v, (bool, str)) else f"`{v!r}`"


def _row(*cells: str) -> str:
    return f"| {' | '.join(cells)} |"


def _default(o, config: bool) -> str:
    if o.default is not None:
        return _value(o.default)
    absent = (o.absent_config or o.absent) if config else o.absent
    return _cell(absent) if absent is not None else "required"


def tables() -> str:
    """The tables (Markdown): the config file's keys with their flags and Python keywords,
    the API's own keywords, and the built-in policies' options."""
    from bass import plugins, policies
    from bass.config import TABLES
    from bass.options import OPTIONS

    docs = {"docs": True}  # phrases that do not depend on what this machine has installed
    out = [
        "### Config file keys and flags",
        "",
        "Each key is also the keyword of the Python call named. The default is what leaving "
        "the key out of a file means; a flag overrides the key, which overrides the "
        "default. (In Python, `generate()` of a Generator built without a config requires "
        "`max_new_tokens`, and "
        "`from_pretrained` takes `main` and, for a drafter, `draft`.)",
        "",
        "| key | flag | Python | default | allowed | what |",
        "|---|---|---|---|---|---|",
    ]
    for table, keys in TABLES.items():
        for key, o in keys.items():
            flag = f"`{o.flag}`" if o.flag else ""
            allowed, what = _cell(o.kind.allowed(docs)), _cell(o.doc)
            python, default = f"`{o.call}({o.said}=)`", _default(o, True)
            out.append(_row(f"`[{table}].{key}`", flag, python, default, allowed, what))
    out += ["", "### The Python API's own keywords", ""]
    out += ["| keyword | of | default | allowed | what |", "|---|---|---|---|---|"]
    for o in OPTIONS.values():
        if o.table is None:
            allowed, what = _cell(o.kind.allowed(docs)), _cell(o.doc)
            out.append(_row(f"`{o.said}`", f"`{o.call}()`", _default(o, False), allowed, what))
    out += [
        "",
        "### The built-in policies' options",
        "",
        "`[policy.options]` in a config file, `--policy-option NAME=VALUE` on the command "
        "line, `policy_options=` in Python (`bass policies` lists them too).",
        "",
        "| policy | option | default | allowed | what |",
        "|---|---|---|---|---|",
    ]
    for name, ep in policies.available().items():
        target = ep.load()
        if not plugins.is_builtin(target):
            continue
        declared = [f for f in dataclasses.fields(target) if "kind" in f.metadata]
        values = {"values": {f.name: f.default for f in declared}}
        for f in declared:
            allowed, what = _cell(f.metadata["kind"].allowed(values)), _cell(f.metadata["help"])
            out.append(_row(f"`{name}`", f"`{f.name}`", _value(f.default), allowed, what))
    return "\n".join(out) + "\n"


def page(text: str) -> str:
    """``text`` (the page) with the tables between its markers made anew."""
    head, _, rest = text.partition(BEGIN + "\n")
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n\n{tables()}\n{END}{tail}"


if __name__ == "__main__":
    old = PAGE.read_text(encoding="utf-8")
    new = page(old)
    if new != old:
        PAGE.write_text(new, encoding="utf-8")
        print(f"rewrote the option tables of {PAGE}", file=sys.stderr)
