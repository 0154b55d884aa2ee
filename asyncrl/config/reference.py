"""The config reference: every key of the run config with its type, default and doc.

The doc of a field is the string literal written right under it in its dataclass (the convention of
every config here); it is read from the class's source with `ast`, so the code is the one source of
`python -m launch --show-config` and of docs/config.md. Regenerate that file with

    python -m asyncrl.config.reference > docs/config.md
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import sys
import textwrap
import typing
from typing import Any, Iterator, NamedTuple

from asyncrl.config.loader import to_dict


class Key(NamedTuple):
    name: str  # dotted path, e.g. "learner.lr"
    type: str  # as written in the annotation, e.g. "float", 'Literal["auto", "float32"]'
    value: Any  # the default, or the value in the config shown
    doc: str


def field_docs(cls: type) -> dict[str, str]:
    """{field name: the string literal under it} for one dataclass (including its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def keys(cfg: Any, prefix: str = "") -> Iterator[Key]:
    """Every leaf key of a config dataclass instance, in declaration order; nested dataclasses recurse."""
    hints = typing.get_type_hints(type(cfg))
    docs = field_docs(type(cfg))
    for f in dataclasses.fields(cfg):
        if not f.init:
            continue
        value, name = getattr(cfg, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from keys(value, f"{name}.")
        else:
            plain = value.value if isinstance(value, enum.Enum) else to_dict(value)
            yield Key(name, type_name(hints[f.name]), plain, docs.get(f.name, ""))


def missing_docs(cfg: Any) -> list[str]:
    return [k.name for k in keys(cfg) if not k.doc]


def _literal(value: Any) -> str:
    """A value as it would be written in TOML / --set."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def render_text(cfg: Any) -> str:
    """For the terminal: one block per key; a value that differs from the default shows the default too."""
    defaults = {k.name: k.value for k in keys(type(cfg)())}
    out = []
    for k in keys(cfg):
        changed = f", default {_literal(defaults[k.name])}" if defaults.get(k.name, k.value) != k.value else ""
        out.append(f"{k.name} = {_literal(k.value)}    ({k.type}{changed})")
        if k.doc:
            out.extend("    " + line for line in textwrap.wrap(k.doc, 100))
    return "\n".join(out) + "\n"


def render_markdown(cfg: Any) -> str:
    """docs/config.md: one table per section."""
    out = ["# Config reference", "",
           "Every key of the run config (`python -m launch CONFIG --set section.key=value`), with its type, default",
           "and doc, generated from the config dataclasses. Do not edit by hand; regenerate with",
           "", "    python -m asyncrl.config.reference > docs/config.md"]
    section = None
    for k in keys(cfg):
        head = k.name.split(".", 1)[0]
        if head != section:
            section = head
            out += ["", f"## `[{section}]`", "", "| key | type | default | doc |", "|---|---|---|---|"]
        cells = [f"`{k.name}`", f"`{k.type}`", f"`{_literal(k.value)}`", k.doc]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


def main() -> int:
    from asyncrl.config.run import RunConfig

    sys.stdout.write(render_markdown(RunConfig()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
