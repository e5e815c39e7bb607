"""Recorder configuration: one frozen, keyword-only dataclass, validated on construction.

Every field can be overridden from the environment as ``GOODTRACE_<FIELD>`` (for example
``GOODTRACE_ENABLED=0`` or ``GOODTRACE_FLUSH_INTERVAL_S=2``); explicit arguments win.
Explicit arguments are checked strictly (a bad one is a :class:`ConfigError`); the environment,
which a launcher sets for every job, leniently: a variable whose value cannot be parsed or is
out of range is warned about once (naming it and its value) and the default is used.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from goodtrace import schema
from goodtrace.record.errors import warn


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which and why."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """How the recorder behaves. All durations are in seconds unless the name says otherwise."""

    enabled: bool = True
    lag: int = 1
    # How often the readiness thread tests pending completion values (0: never; a completion is
    # then dated when goodtrace waits for it). A completion is dated at most one interval, plus
    # the thread's wake-up delay, after it became ready.
    poll_interval_s: float = 0.002
    flush_interval_s: float = schema.DEFAULT_FLUSH_INTERVAL_S
    gc_threshold_s: float = 0.001
    record_gc: bool = True
    max_buffer_records: int = 2_000_000
    max_pending_bytes: int = 64 * 1024 * 1024
    segment_bytes: int = 64 * 1024 * 1024
    remote_segment_bytes: int = 1024 * 1024
    remote_upload_interval_s: float = 1.0
    # Is the open segment still there (one fstat)? 0: at every heartbeat, so a deleted run directory is
    # recreated within a flush interval. The native writer checks at every heartbeat whatever this says.
    storage_check_interval_s: float = 0.0
    finish_timeout_s: float = 10.0
    # A process of the rank's own reduces its closed segments for reports every this many seconds
    # (record/io/compactor.py, read/rank_compact.py; needs goodtrace[report] and a local or NFS run
    # directory). 0: off (the default).
    compact_interval_s: float = 0.0
    # Process-wide hooks gt.init installs (docs/recording.md, "What goodtrace changes in the process"):
    # a SIGTERM handler (only where the program has none) and sys/threading excepthooks.
    sigterm_handler: bool = True
    exception_hooks: bool = True
    overhead_categories: tuple[str, ...] = ()
    blocking_categories: tuple[str, ...] = ()
    categories: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for flag in ("enabled", "record_gc", "sigterm_handler", "exception_hooks"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        _check_int("lag", self.lag, minimum=0, maximum=1000)
        if self.poll_interval_s != 0:
            _check_float("poll_interval_s", self.poll_interval_s, minimum=0.0001, maximum=10)
        _check_float("flush_interval_s", self.flush_interval_s, minimum=0.001, maximum=3600)
        _check_float("gc_threshold_s", self.gc_threshold_s, minimum=0.0, maximum=3600)
        _check_int("max_buffer_records", self.max_buffer_records, minimum=1000, maximum=10**9)
        _check_int("max_pending_bytes", self.max_pending_bytes, minimum=1024, maximum=2**40)
        _check_int("segment_bytes", self.segment_bytes, minimum=1024, maximum=2**40)
        _check_int("remote_segment_bytes", self.remote_segment_bytes, minimum=1024, maximum=2**40)
        _check_float(
            "remote_upload_interval_s", self.remote_upload_interval_s, minimum=0.01, maximum=86400
        )
        _check_float("storage_check_interval_s", self.storage_check_interval_s, minimum=0.0, maximum=86400)
        _check_float("finish_timeout_s", self.finish_timeout_s, minimum=0.0, maximum=3600)
        if self.compact_interval_s != 0:
            _check_float("compact_interval_s", self.compact_interval_s, minimum=0.1, maximum=86400)
        for field in ("overhead_categories", "blocking_categories"):
            value = getattr(self, field)
            if isinstance(value, str) or not all(isinstance(c, str) and c for c in value):
                raise ConfigError(f"{field} must be a sequence of non-empty strings, got {value!r}")
            object.__setattr__(self, field, tuple(value))
        if not isinstance(self.categories, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in self.categories.items()
        ):
            raise ConfigError(f"categories must map span names to category names, got {self.categories!r}")
        object.__setattr__(self, "categories", dict(self.categories))

    @property
    def all_overhead_categories(self) -> frozenset[str]:
        return schema.OVERHEAD_CATEGORIES | frozenset(self.overhead_categories)

    @property
    def all_blocking_categories(self) -> frozenset[str]:
        return schema.BLOCKING_CATEGORIES | frozenset(self.blocking_categories)

    def to_record(self) -> dict[str, Any]:
        """The configuration as written into each segment header."""
        return {
            "lag": self.lag,
            "poll_interval_s": self.poll_interval_s,
            "flush_interval_s": self.flush_interval_s,
            "gc_threshold_s": self.gc_threshold_s,
            "overhead_categories": list(self.overhead_categories),
            "blocking_categories": list(self.blocking_categories),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Build a config from ``GOODTRACE_*`` variables, then explicit ``overrides``.

        A bad variable (``GOODTRACE_LAG=x``, ``GOODTRACE_FLUSH_INTERVAL_S=0``) is warned about
        once and left out: the job runs with the default. A bad ``override`` raises."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            variable = "GOODTRACE_" + field.name.upper()
            raw = env.get(variable)
            if raw is None or field.name == "categories" or overrides.get(field.name) is not None:
                continue
            try:
                value = _parse_env(field.name, raw, field.type)
                cls(**{field.name: value})  # each field is checked on its own
            except ConfigError as exc:
                _warn_env(variable, raw, exc)
                continue
            values[field.name] = value
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown config option(s): {', '.join(sorted(unknown))}")
        return cls(**values)


_warned_env: set[tuple[str, str]] = set()


def _warn_env(variable: str, raw: str, exc: ConfigError) -> None:
    """Once per variable and value and process: the environment never fails ``init``."""
    if (variable, raw) in _warned_env:
        return
    _warned_env.add((variable, raw))
    default = next((f.default for f in dataclasses.fields(Config) if "GOODTRACE_" + f.name.upper() == variable), None)
    warn(f"{variable}={raw[:200]!r} ignored ({exc}); using the default ({default!r})", stacklevel=4)


def _parse_env(name: str, raw: str, type_name: object) -> Any:
    text = str(type_name)
    try:
        if text == "bool":
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if text == "int":
            return int(raw)
        if text == "float":
            return float(raw)
        if text.startswith("tuple"):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"GOODTRACE_{name.upper()}={raw!r} is not a valid {text}") from None
    return raw


def _check_int(name: str, value: object, *, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, got {value!r}")
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name} must be between {minimum} and {maximum}, got {value}")


def _check_float(name: str, value: object, *, minimum: float, maximum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if math.isnan(value) or not minimum <= value <= maximum:
        raise ConfigError(f"{name} must be between {minimum} and {maximum}, got {value}")
