"""Command-line overrides for frozen, typed experiment configs (docs/design.md practice 8).

An experiment declares one frozen dataclass (fields may be nested frozen dataclasses) whose
defaults live in exactly one place, plus an optional dict of named presets. The command line
then picks a preset and overrides single fields by their dotted path:

    python -m experiments.numerics --preset smoke --rows=512 --distributions=normal,weight
    python -m experiments.rl --rl.lr=3e-6 --model.remat=true

Rules (kept small on purpose, so every experiment parses the same way):
- `--preset NAME` or `--preset=NAME` starts from `presets[NAME]` instead of the default
  instance; it may appear anywhere, and every override applies on top of it.
- `--a.b=value` sets field `b` of the nested config in field `a`; `--a.b value` works too.
  A later override of the same key wins.
- Values are coerced from the field's annotation: int, float, str, bool
  (true/false/1/0/yes/no; a bare `--flag` means true), `Literal[...]` (checked against its
  options), `X | None` ("none" gives None), `tuple[X, ...]` (comma separated, "" is empty).
  Any other annotation is refused with a ValueError rather than guessed at.
- An unknown key is an error that names the valid fields at that level; setting a
  sub-config as a whole (`--rl=3`) is an error that names its fields.
- The config is built once with all overrides (one `dataclasses.replace` per level), so its
  `__post_init__` validation sees the final values, not a half-applied state.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _hints(cls) -> dict[str, Any]:
    # get_type_hints resolves string annotations (`from __future__ import annotations`).
    return typing.get_type_hints(cls)


def _is_config(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def coerce(text: str, tp, where: str = "value"):
    """Convert command-line `text` to type `tp` (see the module docstring for the rules)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if type(None) in args and text.lower() == "none":
            return None
        errors = []
        for member in members:
            try:
                return coerce(text, member, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(f"{where}: cannot read {text!r} as {tp}: " + "; ".join(errors))
    if origin is typing.Literal:
        for option in args:
            if text == str(option):
                return option
        raise ValueError(f"{where}={text!r}; valid options: {', '.join(map(str, args))}")
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise ValueError(f"{where}: only tuple[X, ...] fields can be set from the command line, not {tp}")
        items = [s.strip() for s in text.split(",")] if text.strip() else []
        return tuple(coerce(s, args[0], f"{where}[{i}]") for i, s in enumerate(items))
    if tp is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{where}={text!r} is not a bool; use one of {_TRUE + _FALSE}")
    if tp in (int, float, str):
        try:
            return tp(text)
        except ValueError:
            raise ValueError(f"{where}={text!r} is not a valid {tp.__name__}") from None
    raise ValueError(f"{where}: fields of type {tp} cannot be set from the command line")


def _split_argv(argv: Sequence[str]) -> tuple[str | None, list[tuple[str, str | None]]]:
    """Separate `--preset` from the `(dotted key, text or None)` overrides, in order."""
    preset, overrides = None, []
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise ValueError(f"unexpected argument {arg!r}; expected --key=value or --preset NAME")
        key, eq, text = arg[2:].partition("=")
        has_next = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if not eq and has_next:
            text, eq = argv[i + 1], "="
            i += 1
        i += 1
        if key == "preset":
            if not eq:
                raise ValueError("--preset needs a name: --preset NAME")
            preset = text
        else:
            overrides.append((key, text if eq else None))
    return preset, overrides


def _nest(cls, overrides: list[tuple[str, str | None]]) -> dict[str, Any]:
    """Turn dotted overrides into a nested dict of coerced values, checking every key."""
    tree: dict[str, Any] = {}
    for key, text in overrides:
        node, node_cls, path = tree, cls, key.split(".")
        for depth, name in enumerate(path):
            fields = _fields(node_cls)
            here = ".".join(path[: depth + 1])
            if name not in fields:
                raise ValueError(
                    f"unknown option --{key}: {node_cls.__name__} has no field {name!r}; "
                    f"valid fields: {', '.join(fields)}"
                )
            tp = _hints(node_cls)[name]
            last = depth == len(path) - 1
            if _is_config(tp):
                if last:
                    raise ValueError(
                        f"--{here} is a sub-config ({tp.__name__}); set its fields instead, "
                        f"e.g. --{here}.{next(iter(_fields(tp)))}=...; valid fields: "
                        f"{', '.join(_fields(tp))}"
                    )
                node = node.setdefault(name, {})
                node_cls = tp
                continue
            if not last:
                raise ValueError(f"unknown option --{key}: --{here} is a {tp} field, not a sub-config")
            if text is None:
                if tp is not bool:
                    raise ValueError(f"--{key} needs a value: --{key}=VALUE")
                text = "true"
            node[name] = coerce(text, tp, f"--{key}")
    return tree


def _apply(config: T, tree: Mapping[str, Any]) -> T:
    changes = {
        name: _apply(getattr(config, name), value) if isinstance(value, dict) else value
        for name, value in tree.items()
    }
    return dataclasses.replace(config, **changes) if changes else config


def parse(cls: type[T], argv: Sequence[str], presets: Mapping[str, T] | None = None, root: str | None = None) -> T:
    """Build a `cls` instance from `argv` (without the program name); raises ValueError.

    presets: name -> a complete `cls` instance; `--preset NAME` starts from it.
    root: the name `cls` has where another entry point nests it: `--ROOT.key` sets `key`, so both
      spellings work (experiments.rl takes experiments.ablation's `--rl.data_file`).
    """
    if not _is_config(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    presets = dict(presets or {})
    preset, overrides = _split_argv(argv)
    if root:
        overrides = [(key.removeprefix(f"{root}."), text) for key, text in overrides]
    if preset is None:
        base = cls()
    elif preset in presets:
        base = presets[preset]
    else:
        valid = ", ".join(presets) if presets else "(none defined)"
        raise ValueError(f"unknown preset {preset!r}; valid presets: {valid}")
    return _apply(base, _nest(cls, overrides))


def preset_of(argv: Sequence[str]) -> str | None:
    """The `--preset` name `argv` picks (None: no --preset), for a `main()` whose other steps
    follow the preset (e.g. the warm-up an RL run trains first)."""
    return _split_argv(argv)[0]


def _comment_descriptions(cls) -> dict[str, str]:
    """`name: type = default  # description` comments in the class body."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found = {}
    for line in source.splitlines():
        match = re.match(r"^\s+(\w+)\s*:[^#]*?\s#\s*(.+)$", line)
        if match and match[1] not in found:
            found[match[1]] = match[2].strip()
    return found


def _docstring_descriptions(cls, names) -> dict[str, str]:
    """`name: description` (or `a, b: ...`, `a / b: ...`) entries of the class docstring: an entry
    starts a line or follows ". " or "; ", and runs up to the next entry or blank line."""
    doc = inspect.getdoc(cls) or ""
    if cls.__doc__ is None or doc.startswith(f"{cls.__name__}("):  # the dataclass's generated signature
        return {}
    label = re.compile(r"(?:^|(?<=\n)|(?<=[.;] ))\s*((?:`?\w+`?)(?:(?:, | / )`?\w+`?)*): ")
    found = {}
    for paragraph in re.split(r"\n\s*\n", doc):
        matches = [m for m in label.finditer(paragraph)
                   if all(n.strip("`") in names for n in re.split(r", | / ", m[1]))]
        for m, after in zip(matches, [*matches[1:], None]):
            text = " ".join(paragraph[m.end(): after.start() if after else None].split()).rstrip(";. ")
            for n in re.split(r", | / ", m[1]):
                found.setdefault(n.strip("`"), text)
    return found


def field_descriptions(cls) -> dict[str, str]:
    """One line per field of `cls` that the code documents: the field's trailing `# comment`, else
    its `name: description` entry in the class docstring (cut at its first sentence when long)."""
    names = set(_fields(cls))
    found = {**_docstring_descriptions(cls, names), **_comment_descriptions(cls)}
    lines = {}
    for name, text in found.items():
        if name not in names:
            continue
        if len(text) > 100:
            text = _first_sentence(text)
            text = text if len(text) <= 100 else text[:97].rstrip() + "..."
        lines[name] = text
    return lines


def _first_sentence(text: str) -> str:
    """`text` up to its first ". " or "; " outside parentheses (not the dot of "e.g." or "et al.")."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ".;" and text[i + 1: i + 2] == " " and not re.search(r"(\be\.g|\bi\.e|\bal|\bvs)$", text[:i]):
            return text[:i]
    return text


def describe(config, prefix: str = "", descriptions: bool = False) -> list[str]:
    """`--dotted.key=value` lines for every leaf field of `config` (help text and logs); with
    `descriptions`, each followed by the field's one-line description where it has one."""
    lines = []
    notes = field_descriptions(type(config)) if descriptions else {}
    for name in _fields(type(config)):
        value = getattr(config, name)
        if dataclasses.is_dataclass(value):
            lines += describe(value, f"{prefix}{name}.", descriptions)
        else:
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
            line = f"--{prefix}{name}={shown}"
            lines.append(f"{line:<36}  {notes[name]}" if name in notes else line)
    return lines


def cli(cls: type[T], presets: Mapping[str, T] | None = None, argv: Sequence[str] | None = None,
        root: str | None = None) -> T:
    """`parse` for a `main()`: `-h/--help` prints every field's value under the preset (and
    overrides) `argv` applies, with its description, and the presets; errors exit with 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    wants_help = "-h" in argv or "--help" in argv
    try:
        config = parse(cls, [a for a in argv if a not in ("-h", "--help")], presets, root)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if wants_help:
        preset = preset_of([a for a in argv if a not in ("-h", "--help")])
        applied = f"preset {preset!r} applied" if preset else f"no preset: {cls.__name__}'s defaults"
        print(f"options of {cls.__name__} ({applied}, with any overrides given):")
        print("\n".join("  " + line for line in describe(config, descriptions=True)))
        if presets:
            print(f"presets (--preset NAME): {', '.join(presets)}")
        raise SystemExit(0)
    return config
