"""scripts/soak.py without a GPU: its argument parsing, its loop and its verdict, run
with a fake runner (errors, failed checks, memory growth, cache bounds, drift, the
wall-clock limit, the JSON record and the exit status)."""
from __future__ import annotations

import json

import pytest
from helpers import load_script

soak = load_script("scripts/soak.py")

MiB = 1 << 20


class FakeRunner:
    """Calls that do nothing; knobs to make each violation happen."""

    def __init__(self, args, *, raise_at=(), fail_check_at=(), grow_pool_per_call=0,
                 grow_kernels_at=None, hot_calls=10, drift=False, warmup=5):
        self.args, self.raise_at, self.fail_check_at = args, set(raise_at), set(fail_check_at)
        self.grow_pool_per_call, self.grow_kernels_at = grow_pool_per_call, grow_kernels_at
        self.hot_calls, self.drift, self.warmup = hot_calls, drift, warmup
        self.calls, self.checked, self.probes = 0, [], 0

    def warmup_calls(self):
        return [("warm", n) for n in range(self.warmup)]

    def call(self, i, check, spec=None):
        self.calls += 1
        if check:
            self.checked.append(i)
        if i in self.raise_at:
            raise RuntimeError(f"boom at {i}")
        if check and i in self.fail_check_at:
            return f"call {i}: max err 1.0 > 1e-2"
        return None

    def probe(self):
        self.probes += 1
        return "b" * 64 if (self.drift and self.probes > 1) else "a" * 64

    def sample(self):
        kernels = 7 + (1 if self.grow_kernels_at is not None and self.calls > self.grow_kernels_at
                       else 0)
        return {"pool_used": 0, "pool_total": 100 * MiB + self.calls * self.grow_pool_per_call,
                "device_free": 0, "device_total": 0, "device_used": 1000 * MiB, "rss": 500 * MiB,
                "hot_calls": self.hot_calls, "tensor_map_encoders": 3, "query_shifts": 2,
                "decode_plans": 1, "compiled_kernels": kernels}

    def bounds(self):
        return {"hot_calls": 1024, "tensor_map_encoders": 64, "query_shifts": 256,
                "decode_plans": 4096}

    def describe(self):
        return {"name": "fake"}


def run(argv, **knobs):
    holder = {}

    def factory(args):
        holder["runner"] = FakeRunner(args, **knobs)
        return holder["runner"]

    rc = soak.main(["--no-progress", *argv], runner_factory=factory)
    return rc, holder["runner"]


def test_defaults():
    a = soak.parse_args([])
    assert (a.calls, a.minutes, a.check_every, a.sample_every) == (10_000, 10.0, 50, 100)
    assert a.out is None and not a.no_torch


@pytest.mark.parametrize("argv", [["--calls", "0"], ["--check-every", "0"], ["--minutes", "0"],
                                  ["--sample-every", "-1"], ["--bogus"]])
def test_bad_arguments_exit(argv):
    with pytest.raises(SystemExit) as info:
        soak.parse_args(argv)
    assert info.value.code == 2


def test_clean_run_passes_and_writes_json(tmp_path):
    out = tmp_path / "sub" / "soak.json"
    rc, r = run(["--calls", "300", "--check-every", "7", "--sample-every", "50", "--out", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["ok"] and rec["violations"] == [] and rec["calls"] == 300 == r.calls
    assert rec["warmup_calls"] == 5
    assert r.checked == [i for i in range(300) if i % 7 == 0]
    assert rec["probe"]["start"] == rec["probe"]["end"]
    assert rec["samples"][0]["call"] == 5 and rec["samples"][-1]["call"] == 300
    assert len(rec["samples"]) >= 300 // 50


def test_progress_bar_path_runs():
    rc = soak.main(["--calls", "20"], runner_factory=lambda a: FakeRunner(a))
    assert rc == 0


@pytest.mark.parametrize("knobs,word", [
    (dict(raise_at={12}), "calls raised; first: RuntimeError: boom at 12"),
    (dict(fail_check_at={20}), "out of tolerance"),
    (dict(grow_pool_per_call=2 * MiB), "pool_total grew by"),
    (dict(grow_kernels_at=100), "compiled-kernel table grew by 1"),
    (dict(hot_calls=2000), "cache hot_calls reached 2000, above its bound 1024"),
    (dict(drift=True), "drift"),
])
def test_each_violation_fails_the_run(knobs, word, tmp_path, capsys):
    out = tmp_path / "soak.json"
    rc, _ = run(["--calls", "200", "--check-every", "10", "--out", str(out)], **knobs)
    assert rc == 1
    rec = json.loads(out.read_text())
    assert not rec["ok"] and any(word in v for v in rec["violations"]), rec["violations"]
    assert "VIOLATION" in capsys.readouterr().out


def test_growth_during_warmup_is_allowed():
    """Kernels compiled and pool blocks taken during the warm-up are not growth."""
    rc, _ = run(["--calls", "100"], grow_kernels_at=2)
    assert rc == 0


def test_wall_clock_limit_stops_the_run():
    args = soak.parse_args(["--calls", "10000", "--minutes", "0.5", "--no-progress"])
    ticks = iter(range(0, 10**6))
    record = soak.soak(FakeRunner(args), args, clock=lambda: float(next(ticks)))
    assert record["ok"] and 0 < record["calls"] < 10000


def test_error_limit_stops_the_run():
    rc, r = run(["--calls", "1000", "--max-errors", "3"], raise_at=set(range(10, 1000)))
    assert rc == 1 and r.calls == 13
