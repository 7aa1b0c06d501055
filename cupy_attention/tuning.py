"""Tuned tile configurations: what ``cupy-attention tune`` measured on this machine.

``cupy-attention tune`` times each family's :meth:`~cupy_attention.families.base.
Family.candidates` for some problems and writes the winners to one JSON file per
persistence key, (device name, driver version, NVRTC version, package version), in
the JIT cache directory (:func:`cupy_attention.jit.cache_dir`). A family plans a
launch with :meth:`Family.config_for`, which asks :func:`lookup` here: the file for
the current device is read once per process, lazily, on the first launch that is
planned, and after that a lookup is one dict access.

The file sits beside the kernel cache and obeys its trust rules: it is read only
when :func:`cupy_attention.jit.cache_trust_problem` accepts the directory and the
file itself is a regular file of the current user that group and others cannot
write (``jit.read_trusted``), and written atomically (temp file, fsync, rename).
A tuned entry is only a choice among the family's own candidates: one that is not
(an old file, a hand edit) is ignored. ``CUPY_ATTENTION_NO_CACHE=1`` ignores the
tuned table as well.

Problems are matched by (family, dtype, head dim, variant, Sq and Sk rounded up to
powers of two): a tune at S = 4096 serves S = 2049..4096.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import threading
from pathlib import Path

from . import __version__, jit

SCHEMA = "cupy-attention-tuning/1"
PREFIX = "tuning-"
# A candidate replaces the table's configuration only when it is faster by more than
# this fraction and its slowest timing round beats the table's fastest (decide()).
MIN_GAIN = 0.03


class TuningError(RuntimeError):
    """The tuned table cannot be read or written as asked (untrusted cache directory)."""


# ---------------------------------------------------------------------------
# Keys

def bucket(n: int) -> int:
    """The power of two at least ``n`` (1 for n <= 1)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def problem_key(family: str, p) -> str:
    """The tuned table's key of problem ``p`` (a :class:`~cupy_attention.problem.Problem`)
    for ``family``."""
    variant = p.variant.suffix().lstrip(",") or "plain"
    return (f"{family}|{p.dtype}|D={p.head_dim}|{variant}|Sq<={bucket(p.seqlen_q)}"
            f"|Sk<={bucket(p.seqlen_k)}")


_DRIVER_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_driver_version(text: str) -> str | None:
    """The driver version in ``/proc/driver/nvidia/version``'s text, e.g. "550.54.15"."""
    m = _DRIVER_RE.search(text)
    return m.group(1) if m else None


def driver_version() -> str:
    """The NVIDIA driver's version: the kernel module's (Linux) or, failing that, the
    CUDA version the driver reports ("cuda-12040"). No subprocess: cheap enough for
    the first launch of a process."""
    try:
        found = parse_driver_version(Path("/proc/driver/nvidia/version").read_text())
        if found:
            return found
    except OSError:
        pass
    import cupy

    return f"cuda-{cupy.cuda.runtime.driverGetVersion()}"


def persist_key(device_name: str, driver: str, nvrtc: str, version: str = __version__) -> dict:
    return {"device": device_name, "driver": driver, "nvrtc": nvrtc, "version": version}


def current_key(device_id: int) -> dict:
    """The persistence key of ``device_id`` in this process (needs CuPy and the device)."""
    from . import device

    return persist_key(device.device_name(device_id), driver_version(),
                       ".".join(map(str, jit.nvrtc_version())))


def table_path(key: dict) -> Path:
    """The file of persistence key ``key`` in the cache directory."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return jit.cache_dir() / f"{PREFIX}{digest}.json"


# ---------------------------------------------------------------------------
# Files

def read_table(path: Path, key: dict | None = None) -> dict | None:
    """A tuned-table file's content if it is trusted, parses, has our schema and (when
    given) records ``key``; None otherwise."""
    blob = jit.read_trusted(Path(path))
    if blob is None:
        return None
    try:
        data = json.loads(blob)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or \
            not isinstance(data.get("entries"), dict):
        return None
    if key is not None and data.get("key") != key:
        return None
    return data


def save(key: dict, entries: dict[str, dict]) -> Path:
    """Merge ``entries`` (problem key -> entry) into the file of ``key``, atomically.
    Raises :class:`TuningError` when the cache directory is not trusted (or caching is
    off) and OSError when the file cannot be written."""
    if not jit.cache_enabled():
        raise TuningError("CUPY_ATTENTION_NO_CACHE is set: the tuned table lives in the cache "
                          "directory and is not used; unset it to tune")
    why = jit.cache_trust_problem()
    if why is not None:
        raise TuningError(f"not writing the tuned table: {why}")
    path = table_path(key)
    old = read_table(path, key)
    merged = dict(old["entries"]) if old else {}
    merged.update(entries)
    data = {"schema": SCHEMA, "key": key,
            "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "entries": dict(sorted(merged.items()))}
    jit.write_atomic(path, (json.dumps(data, indent=1) + "\n").encode())
    reset()
    return path


def tuning_files() -> list[Path]:
    d = jit.cache_dir()
    return sorted(d.glob(f"{PREFIX}*.json")) if d.is_dir() else []


def _any_tuning_file() -> bool:
    try:
        with os.scandir(jit.cache_dir()) as it:
            return any(e.name.startswith(PREFIX) and e.name.endswith(".json") for e in it)
    except OSError:
        return False


def clear() -> int:
    """Remove every tuned-table file from the cache directory; how many."""
    n = 0
    for path in tuning_files():
        path.unlink(missing_ok=True)
        n += 1
    reset()
    return n


# ---------------------------------------------------------------------------
# Lookup (planning a launch)

_TABLES: dict[int, dict[str, tuple]] = {}   # device id -> problem key -> config
_FORCED: dict[str, tuple] = {}              # family -> config, while tune times it
_lock = threading.Lock()


def reset() -> None:
    """Forget the tables read so far (the next lookup reads the file again)."""
    with _lock:
        _TABLES.clear()


def _load(device_id: int) -> dict[str, tuple]:
    with _lock:
        table = _TABLES.get(device_id)
        if table is not None:
            return table
        table = {}
        # No tuned file at all (the common case): nothing to key, so skip the device
        # name, driver and NVRTC queries that the persistence key needs.
        if jit.cache_enabled() and _any_tuning_file():
            try:
                key = current_key(device_id)
            except Exception:  # no CuPy, no device, no NVRTC: nothing tuned applies
                key = None
            why = jit.cache_trust_problem() if key is not None else None
            if why is not None:
                jit.warn_untrusted(str(jit.cache_dir()), why)
            elif key is not None:
                data = read_table(table_path(key), key)
                for name, entry in (data or {}).get("entries", {}).items():
                    cfg = entry.get("config") if isinstance(entry, dict) else None
                    if isinstance(cfg, list) and all(type(x) is int for x in cfg):
                        table[name] = tuple(cfg)
        _TABLES[device_id] = table
        return table


def lookup(family: str, p, device_id: int) -> tuple | None:
    """The tuned configuration of ``family`` for problem ``p`` on ``device_id``, or None."""
    if _FORCED:
        forced = _FORCED.get(family)
        if forced is not None:
            return forced
    table = _TABLES.get(device_id)
    if table is None:
        table = _load(device_id)
    return table.get(problem_key(family, p)) if table else None


class forced:
    """Within the block, every launch ``family`` plans uses ``config`` (``tune`` times
    candidates this way; a config that is not one of the family's candidates for the
    problem is still ignored)."""

    def __init__(self, family: str, config: tuple):
        self.family, self.config = family, tuple(config)

    def __enter__(self):
        _FORCED[self.family] = self.config
        return self

    def __exit__(self, *exc):
        _FORCED.pop(self.family, None)
        return False


# ---------------------------------------------------------------------------
# The decision rule

def decide(table: dict, best: dict, min_gain: float = MIN_GAIN) -> tuple[bool, str]:
    """Whether ``best`` (a candidate's timing) replaces ``table`` (the table config's),
    and why. Timings are ``bench.Runner.time_calls`` figures: ``ms`` (median of all
    calls), ``ms_rounds`` (each round's median), ``spread_pct``.

    The candidate wins only when it is faster by more than ``min_gain`` and by more
    than either side's spread, and its slowest round is faster than the table's
    fastest: a tuned configuration is never slower than the table's by noise."""
    t_ms, b_ms = float(table["ms"]), float(best["ms"])
    if not (t_ms > 0 and b_ms > 0):
        return False, "no valid timing"
    gain = t_ms / b_ms - 1
    if gain <= min_gain:
        return False, f"{gain:+.1%}: not more than the {min_gain:.0%} margin"
    spread = max(float(table.get("spread_pct", 0)), float(best.get("spread_pct", 0))) / 100
    if gain <= spread:
        return False, f"{gain:+.1%}: within the {spread:.1%} spread of the rounds"
    t_rounds = table.get("ms_rounds") or [t_ms]
    b_rounds = best.get("ms_rounds") or [b_ms]
    if max(b_rounds) >= min(t_rounds):
        return False, f"{gain:+.1%}: its slowest round is not faster than the table's fastest"
    return True, f"{gain:+.1%}, outside the spread ({spread:.1%})"
