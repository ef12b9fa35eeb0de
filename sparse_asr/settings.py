"""Settings declared as dataclass fields with their rule beside them, and the ONE checker every section of a
config uses: the run's config (training/config.py) and each compressor's options (compression.options.*).

    @dataclass(frozen=True)
    class Options:
        interval: int = setting(32, positive, "must be >= 1")
        TIES = (tie("interval", lambda o: o.interval <= 64 or o.exact, "needs exact=true above 64"),)

    options = build(Options, {"interval": 16}, "compression.options.", where)

`build` refuses unknown keys and wrong types, checks every field's rule, finite floats and the section's
TIES (rules that bind two fields), and names the dotted key and `where(key)` (the file or the command-line
override that set it) in every error.
"""
from __future__ import annotations

import dataclasses
import math
import typing


class ConfigError(ValueError):
    pass


def setting(default=None, rule=None, must: str = "", resume_safe: bool = False, factory=None):
    """A field with its rule beside it: `rule(value)` must hold (`must` says what, in the error), and
    `resume_safe` marks the keys a resumed run may change: how a run is watched, where it runs and how long it
    goes on, never what it computes step by step (training/resume.py)."""
    metadata = {"rule": rule, "must": must, "resume_safe": resume_safe}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def tie(key: str, holds, must: str) -> tuple:
    """A rule over a whole section (`holds(section)`), reported as `key` `must`; listed in the section's TIES."""
    return key, holds, must


def positive(v) -> bool:
    return v >= 1


def natural(v) -> bool:
    return v >= 0


def between(lo: float, hi: float):
    return lambda v: lo <= v <= hi


def nowhere(key: str) -> str:
    return "settings"


def build(cls, raw, prefix: str = "", where=nowhere):
    """An instance of the settings dataclass `cls` from a mapping (nested dataclass fields from nested
    mappings), every value checked; ConfigError names `prefix + key` and `where(prefix + key)`."""
    node = _build(cls, raw, prefix, where)
    check(node, prefix, where)
    return node


def _build(cls, raw, prefix: str, where):
    if not isinstance(raw, dict):
        section = prefix[:-1] or "config"
        raise ConfigError(f"{where(section)}: {section} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            raise ConfigError(f"{where(prefix + str(key))}: unknown key {prefix + str(key)!r}; "
                              f"known keys here: {', '.join(sorted(names)) or 'none'}")
    values = {}
    for key, value in raw.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            values[key] = _build(hint, value, f"{prefix}{key}.", where)
        else:
            values[key] = _coerce(value, hint, prefix + key, where)
    return cls(**values)


def _coerce(value, hint, key: str, where):
    """Check `value` against a field's type; ints are accepted for floats, and '1e-4' strings too
    (PyYAML reads 1e-4 without a dot as a string)."""
    options = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    for t in options:
        if t is type(None) and value is None:
            return None
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is float and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        if t is str and isinstance(value, str):
            return value
        if t is dict and isinstance(value, dict):
            return dict(value)
    wanted = " or ".join("null" if t is type(None) else t.__name__ for t in options)
    raise ConfigError(f"{where(key)}: {key} must be {wanted}, got {value!r}")


def check(node, prefix: str = "", where=nowhere) -> None:
    """Every field's own rule, finite floats everywhere, then each section's TIES, sections descended."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            check(value, key + ".", where)
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where(key)}: {key} must be a finite number, got {value!r}")
        rule = f.metadata.get("rule")
        if rule is not None and not rule(value):
            raise ConfigError(f"{where(key)}: {key} {f.metadata['must']}, got {value!r}")
    for name, holds, must in getattr(node, "TIES", ()):
        if not holds(node):
            raise ConfigError(f"{where(prefix + name)}: {prefix + name} {must}, got {getattr(node, name)!r}")


def fields(node, prefix: str = ""):
    """(dotted key, dataclass field, value) of every setting, sections descended."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from fields(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, value
