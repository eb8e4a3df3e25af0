"""A griffe extension for the API pages: bass's docstrings use reST roles
(``:class:`Generator```) and literal-block markers (``Example::``), which mkdocstrings
would show as written. Each role becomes a link to the object it names when the site
documents it (resolved like Sphinx: as written, then within the class, then within the
module), plain code otherwise; ``::`` at a line's end becomes ``:``."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")
LITERAL = re.compile(r"(?<=\S)::$", re.MULTILINE)


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` seen from ``obj`` (``target`` itself when not found)."""
    scopes = [obj, obj.parent, obj.module] if obj.is_class else [obj.parent, obj.module]
    for scope in [s for s in scopes if s is not None]:
        head = target.split(".", 1)[0]
        if head in scope.members:
            return f"{scope.path}.{target}"
    return target


def _rewrite(obj: griffe.Object, text: str) -> str:
    def role(m: re.Match) -> str:
        short, target = m.group(1), m.group(2).strip().lstrip(".")
        shown = target.rsplit(".", 1)[-1] if short else target
        path = target if target.startswith("bass") else _resolve(obj, target)
        return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'

    return LITERAL.sub(":", ROLE.sub(role, text))


class RstRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        todo = [pkg]
        while todo:
            obj = todo.pop()
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj, obj.docstring.value)
            todo.extend(m for m in obj.members.values() if not m.is_alias)
