"""``traceml.yaml``: discovery, loading and validation.

The file is looked up in the launch directory and then in each parent (seed
000: "TraceML searches the launch directory and its parents"). It is parsed
with PyYAML's safe loader, so YAML 1.1 scalar spelling decides the stored
type exactly as PyYAML does: ``010`` is the integer 8, ``1:30`` the integer
90, ``1e-3`` the *string* "1e-3", ``yes``/``no``/``on``/``off`` Booleans, and
a quoted ``"010"`` stays a string.

Every problem becomes one :class:`ConfigError` line naming the file and the
field path inside it; nothing is guessed or silently dropped.

Accepted top-level keys are ours (``mode``, ``history_enabled``,
``history_retention``, ``guard``, ``hygiene``) plus the settings the published
traceml-ai package reads from the same file (``logs_dir``,
``finalize_timeout_sec``, ``interval``, ``enable_logging``,
``dashboard_port``, ``dashboard_auto_open``), so one ``traceml.yaml`` serves
both tools. The last four are type-checked and otherwise ignored: they tune
displays this tool does not have.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from traceml_tui.core.hygiene_files import MAX_SECONDS
from traceml_tui.guard.contract import (
    ContractError,
    _type_name,  # one wording for type errors in both files
    measurement_end,
    parse_guard_contract,
    show_value,  # every quoted value is bounded (80 chars)
)

CONFIG_FILENAME = "traceml.yaml"
DEFAULT_HISTORY_RETENTION_S = 30 * 60
SUPPORTED_MODES = ("summary", "cli", "dashboard")
GUARD_MODE = "summary"

_DURATION = re.compile(r"^\s*(?P<value>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[smhdSMHD]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

_KNOWN_KEYS = (
    "mode",
    "history_enabled",
    "history_retention",
    "guard",
    "hygiene",
    "logs_dir",
    "finalize_timeout_sec",
    "interval",
    "enable_logging",
    "dashboard_port",
    "dashboard_auto_open",
)


class ConfigError(ValueError):
    """An unusable ``traceml.yaml``.

    ``str(err)`` is one line: ``"<file>: <field>: <rule>"`` (or
    ``"<file>: <rule>"`` when the whole file is at fault, ``"<field>: <rule>"``
    for a command-line value checked against the file). ``field`` is the
    dotted path inside the file (``guard.workload.name``), or ``None``.
    """

    def __init__(self, path: Path | str | None, field: str | None, rule: str) -> None:
        self.path = None if path is None else Path(path)
        self.field = field
        self.rule = " ".join(str(rule).split())  # one line, whatever the cause said
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [str(self.path)] if self.path is not None else []
        if self.field:
            parts.append(self.field)
        parts.append(self.rule)
        return ": ".join(parts)


@dataclass(frozen=True)
class TracemlConfig:
    """The validated contents of one ``traceml.yaml`` (or the defaults).

    ``history_retention`` is in **seconds** of wall-clock time, as in the
    published traceml-ai package (a bare number means seconds; ``"30m"``,
    ``"2h"``, ``"1d"`` are accepted and a fractional value is rounded up to a
    whole second). The final summary's analysis window is the common
    completed steps across ranks whose step-end time ``ts`` lies within this
    many seconds of the last step; ``None`` means no time bound. Seconds, not
    steps, so that a file written for traceml-ai means the same here.

    ``guard`` is the normalized contract (see ``guard.contract``) or ``None``
    for an ordinary run. ``hygiene`` is the raw mapping, validated by the
    hygiene module. ``path`` is the file read, ``None`` for defaults.
    """

    mode: str = GUARD_MODE
    history_enabled: bool = True
    history_retention: int | None = DEFAULT_HISTORY_RETENTION_S
    guard: dict | None = None
    hygiene: dict | None = None
    path: Path | None = None
    logs_dir: str | None = None
    finalize_timeout_sec: float | None = None


def find_config(start: Path) -> Path | None:
    """Return ``traceml.yaml`` in ``start`` or its nearest parent that has one.

    Walks up to the filesystem root; returns ``None`` when no file is found.
    Any entry of that name counts (a directory, a FIFO, a dangling link):
    skipping one would silently apply a parent folder's settings instead of
    the ones the user put here, so :func:`load_config` refuses it instead.
    """
    current = Path(start).absolute()
    while True:
        candidate = current / CONFIG_FILENAME
        if os.path.lexists(candidate):
            return candidate
        if current.parent == current:
            return None
        current = current.parent


def _duplicate_key(node: yaml.Node, field: str, seen_nodes: set[int] | None = None) -> tuple[str, int] | None:
    """First duplicated mapping key under ``node`` as (field path, line)."""
    # Aliases share (and may recursively contain) nodes: visit each node once.
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:
        return None
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[tuple[str, str]] = set()
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                ident = (key_node.tag, key_node.value)
                name = key_node.value if key_node.value.isprintable() else ascii(key_node.value)
                child = f"{field}.{name}" if field else name
                if ident in seen:
                    return child, key_node.start_mark.line + 1
                seen.add(ident)
                found = _duplicate_key(value_node, child, seen_nodes)
            else:
                found = _duplicate_key(value_node, field, seen_nodes)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = _duplicate_key(item, field, seen_nodes)
            if found:
                return found
    return None


#: YAML tags no setting can take: PyYAML would build a date, bytes, a set or pairs from them (and raise
#: a bare Python error on a malformed date). Plain text, numbers, Booleans, lists and mappings are all a
#: ``traceml.yaml`` holds.
_REFUSED_TAGS = {f"tag:yaml.org,2002:{name}": f"!!{name}" for name in ("timestamp", "binary", "set", "omap", "pairs")}
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


def _refused_tag(node: yaml.Node, field: str) -> tuple[str, str, int] | None:
    """The first node under ``node`` tagged with a refused tag, as (field path, tag, line)."""
    stack = [(node, field)]
    while stack:  # iterative: a deeply nested file must not exhaust the recursion limit here
        current, where = stack.pop()
        if current.tag in _REFUSED_TAGS:
            return where, _REFUSED_TAGS[current.tag], current.start_mark.line + 1
        if isinstance(current, yaml.MappingNode):
            for key_node, value_node in reversed(current.value):
                name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                name = name if name.isprintable() else ascii(name)
                if key_node.tag in _REFUSED_TAGS:
                    stack.append((key_node, where or "(a key)"))
                stack.append((value_node, f"{where}.{name}" if where else name))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend((item, where) for item in reversed(current.value))
    return None


def _key_name(key: str) -> str:
    """A user-supplied name on one line, escaped and at most 80 characters."""
    name = ascii(key[:80])[1:-1]
    return name if len(name) <= 80 and len(key) <= 80 else name[:79] + "…"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (``*name``, merge keys ``<<: *name`` included).

    An alias reuses a node; nested aliases expand exponentially (a few hundred
    bytes become gigabytes: the "billion laughs"), and no ``traceml.yaml``
    needs them. Anchors alone are harmless and allowed.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{_key_name(event.anchor)}) are not allowed in traceml.yaml",
                event.start_mark,
            )
        return super().compose_node(parent, index)


# An unquoted date (``2024-01-01``) stays the text it is: no setting takes a date, and an error about a
# string names the setting, where a date object would surprise every check after the loader.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


_KIND_NAMES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KIND_NAMES if test(mode)), "a special file")
    return f"cannot read file: {kind}, not a regular file"


def _read_regular(path: Path) -> bytes:
    """The bytes of ``path``, refusing anything but a regular file before reading it.

    Opening a FIFO for reading blocks until a writer appears, so the type is
    checked by ``stat`` first; the open is non-blocking and the type checked
    again on the open file in case the entry was swapped in between.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        if os.path.islink(path):
            raise ConfigError(path, None, "cannot read file: a symbolic link to a missing target") from None
        raise
    problem = _not_regular(info.st_mode)
    if problem:
        raise ConfigError(path, None, problem)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        problem = _not_regular(os.fstat(fd).st_mode)
        if problem:
            raise ConfigError(path, None, problem)
        return handle.read()


def _parse_yaml(path: Path) -> Any:
    try:
        source = _read_regular(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read file: {exc.strerror or exc}") from None
    try:
        # PyYAML keeps the last of two equal keys; a duplicated key would let one
        # declaration silently shadow another, so it is an error here.
        root = yaml.compose(source, Loader=_Loader)
        duplicate = _duplicate_key(root, "") if root is not None else None
        if duplicate:
            raise ConfigError(path, duplicate[0], f"duplicate key at line {duplicate[1]}")
        refused = _refused_tag(root, "") if root is not None else None
        if refused:
            raise ConfigError(path, refused[0] or None, f"the YAML tag {refused[1]} at line {refused[2]} is not "
                                                        "allowed (write plain text, a number or a Boolean)")
        return yaml.load(source, Loader=_Loader)  # noqa: S506 - a SafeLoader (without aliases)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(path, None, f"invalid YAML at {where}{problem}") from None
    except RecursionError:
        raise ConfigError(path, None, "invalid YAML: nested too deeply") from None
    except ConfigError:
        raise
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise ConfigError(path, None, f"invalid YAML: {_key_name(str(exc))}") from None


def _bool(path: Path, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    # traceml-ai accepts 0/1 for Boolean settings; keep files interchangeable.
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(path, key, f"must be a Boolean (true/false), not {_type_name(value)}")


def _as_float(value: int | float) -> float:
    """``float(value)``; infinity for an integer beyond a double (never an ``OverflowError``)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _positive_number(path: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, key, f"must be a number, not {_type_name(value)}")
    number = _as_float(value)
    if not math.isfinite(number) or number <= 0 or number > MAX_SECONDS:
        raise ConfigError(path, key, f"must be a finite number greater than 0 and at most {MAX_SECONDS:g} "
                                     f"(got {show_value(value)})")
    return number


def _retention_seconds(path: Path, value: Any) -> int:
    key = "history_retention"
    if isinstance(value, bool):
        raise ConfigError(path, key, "must be a duration in seconds or like 30m, 2h, 1d, not a Boolean")
    if isinstance(value, (int, float)):
        seconds = _as_float(value)
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match is None:
            raise ConfigError(path, key, f"must be a duration such as 1800, 30s, 30m, 2h or 1d (got {show_value(value)})")
        seconds = float(match.group("value")) * _UNIT_SECONDS[match.group("unit").lower()]
    else:
        raise ConfigError(path, key, f"must be a duration in seconds or like 30m, not {_type_name(value)}")
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_SECONDS:
        raise ConfigError(path, key, f"must be a finite positive duration of at most {MAX_SECONDS:g} s "
                                     f"(got {show_value(value)})")
    return math.ceil(seconds)


def load_config(path: Path | None) -> TracemlConfig:
    """Load and validate ``traceml.yaml`` at ``path``; ``None`` gives the defaults.

    An empty file gives the defaults too. Raises :class:`ConfigError` for an
    unreadable file, invalid YAML (with its line), a top level that is not a
    mapping, unknown top-level keys, wrongly typed settings, an invalid guard
    declaration (keeping the contract's field path), and a guard declared
    together with ``history_enabled: false`` or a mode other than
    ``summary`` (seed 000: the guard requires summary mode and history).
    """
    if path is None:
        return TracemlConfig()
    path = Path(path)
    raw = _parse_yaml(path)
    if raw is None:
        return TracemlConfig(path=path)
    if not isinstance(raw, Mapping):
        raise ConfigError(path, None, f"top level must be a mapping of settings, not {_type_name(raw)}")

    for key in raw:
        if not isinstance(key, str):
            raise ConfigError(path, None, f"setting names must be strings, found {show_value(key)}")
    unknown = sorted(key for key in raw if key not in _KNOWN_KEYS)
    if unknown:
        known = ", ".join(_KNOWN_KEYS)
        raise ConfigError(path, _key_name(unknown[0]), f"unknown setting (known: {known})")

    mode = raw.get("mode", GUARD_MODE)
    if not isinstance(mode, str):
        raise ConfigError(path, "mode", f"must be a string, not {_type_name(mode)}")
    if mode not in SUPPORTED_MODES:
        raise ConfigError(path, "mode", f"must be one of {', '.join(SUPPORTED_MODES)} (got {show_value(mode)})")

    history_enabled = _bool(path, "history_enabled", raw.get("history_enabled", True))
    retention = (
        _retention_seconds(path, raw["history_retention"]) if "history_retention" in raw else DEFAULT_HISTORY_RETENTION_S
    )

    logs_dir = raw.get("logs_dir")
    if logs_dir is not None and (not isinstance(logs_dir, str) or not logs_dir.strip()):
        raise ConfigError(path, "logs_dir", f"must be a nonempty string, not {_type_name(logs_dir)}")
    finalize_timeout = (
        _positive_number(path, "finalize_timeout_sec", raw["finalize_timeout_sec"])
        if "finalize_timeout_sec" in raw
        else None
    )
    if "interval" in raw:
        _positive_number(path, "interval", raw["interval"])
    for key in ("enable_logging", "dashboard_auto_open"):
        if key in raw:
            _bool(path, key, raw[key])
    if "dashboard_port" in raw:
        port = raw["dashboard_port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ConfigError(path, "dashboard_port", f"must be an integer port 1-65535 (got {show_value(port)})")

    hygiene = raw.get("hygiene")
    if "hygiene" in raw and not isinstance(hygiene, Mapping):
        raise ConfigError(path, "hygiene", f"must be a mapping, not {_type_name(hygiene)}")

    guard = None
    if "guard" in raw:
        try:
            guard = parse_guard_contract(raw["guard"])
        except ContractError as exc:
            raise ConfigError(path, exc.field, exc.rule) from None
        if mode != GUARD_MODE:
            raise ConfigError(path, "mode", f"must be {GUARD_MODE!r} when a guard is declared (got {show_value(mode)})")
        if not history_enabled:
            raise ConfigError(path, "history_enabled", "must be true when a guard is declared")

    return TracemlConfig(
        mode=mode,
        history_enabled=history_enabled,
        history_retention=retention,
        guard=guard,
        hygiene=dict(hygiene) if hygiene is not None else None,
        path=path,
        logs_dir=logs_dir,
        finalize_timeout_sec=finalize_timeout,
    )


def check_trace_max_steps(contract: dict, trace_max_steps: int | None) -> None:
    """Refuse a step cap that would cut the declared measurement range short.

    Seed 000: "If --trace-max-steps is used, it must include the complete
    requested range", i.e. ``trace_max_steps >= start_step + completed_steps - 1``.
    ``None`` (no cap) always passes.
    """
    if trace_max_steps is None:
        return
    if isinstance(trace_max_steps, bool) or not isinstance(trace_max_steps, int) or trace_max_steps < 1:
        raise ConfigError(None, "--trace-max-steps", f"must be a positive integer (got {show_value(trace_max_steps)})")
    end = measurement_end(contract)
    if trace_max_steps < end:
        start = contract["measurement"]["start_step"]
        raise ConfigError(
            None,
            "--trace-max-steps",
            f"{trace_max_steps} stops before the declared measurement range ends "
            f"(guard.measurement covers steps {start}-{end}); use at least {end}",
        )


__all__ = [
    "CONFIG_FILENAME",
    "ConfigError",
    "DEFAULT_HISTORY_RETENTION_S",
    "TracemlConfig",
    "check_trace_max_steps",
    "find_config",
    "load_config",
]
