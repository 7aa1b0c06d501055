"""The Runner: every kernel family and torch backend on one case, forward and backward."""

from __future__ import annotations

import warnings

import numpy as np

import cupy_attention as ca

from .. import dispatch
from ..arrays import host64
from ..errors import UnsupportedError
from ..reference import attention_reference
from .cases import Case, DECODE_GRID_TIMED, ERR_ROWS, make_row
from .overhead import OverheadProbe
from .peers import TorchPeers
from .timing import Timing, Unsupported, _finite, first_line


class Runner(TorchPeers, OverheadProbe, Timing):
    """Times one case at a time on the current device (see the package docstring)."""

    # -- one case ----------------------------------------------------------
    def _policy_skip(self, name: str, quadratic: bool, case: Case) -> str | None:
        if (self.decode_grid and case.kind == "decode" and name not in DECODE_GRID_TIMED
                and name not in self.named):
            return ("the decode grid times decode beside torch's cudnn and flash (name "
                    "others in --kernels/--torch-backends to run them)")
        if quadratic and name not in self.named and \
                case.seqlen_q * case.seqlen_k > self.quadratic_max ** 2:
            return (f"O(S^2) baseline skipped above S={self.quadratic_max} "
                    "(name it in --kernels/--torch-backends to run it)")
        return None

    def _torch_backends(self, case: Case, rows: list):
        """(backend, row label) of each torch backend to time on ``case``; the ones the
        size policy skips get their skipped row in ``rows`` instead."""
        for backend in self.backends:
            label = f"torch:{backend}"
            reason = self._policy_skip(label, backend == "math", case)
            if reason:
                rows.append(make_row(case, label, "torch", skipped=reason))
            else:
                yield backend, label

    def _measure(self, case, kernel, impl, fn, sets, ref) -> dict:
        """One row; a declined torch backend gives a skipped row, a failure an error row."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                figures, out = self.time_calls(fn, sets)
                if ref is not None:
                    got = host64(out[0:1, 0:1, -ref.shape[2]:, :])
                    figures["max_err"] = _finite(float(np.max(np.abs(got - ref))))
                    del out
                    figures["extra_bytes"] = self.extra_memory(fn, sets[0])
            return make_row(case, kernel, impl, **figures)
        except Unsupported as exc:
            return make_row(case, kernel, impl, skipped=str(exc))
        except Exception as exc:  # keep going: one broken kernel must not end the run
            return make_row(case, kernel, impl, error=first_line(exc))
        finally:
            self.free_memory()

    def _reference(self, case: Case, q, k, v) -> np.ndarray:
        """float64 output of the last rows of batch 0, query head 0 (KV head 0)."""
        rows = min(ERR_ROWS, case.seqlen_q)
        out, _ = attention_reference(host64(q[0:1, 0:1, -rows:, :]), host64(k[0:1, 0:1]),
                                     host64(v[0:1, 0:1]), causal=case.causal)
        return out

    def run_case(self, case: Case) -> list[dict]:
        if case.kind == "bwd":
            return self._run_backward(case)
        if case.kind == "decode" and case.page:
            return self._run_paged(case)
        sets = self.input_sets(case)
        ref = self._reference(case, *sets[0])
        problem = case.problem(self.device_id)
        rows = []
        for name, family in dispatch.FAMILIES.items():
            if self.kernels is not None and name not in self.kernels:
                continue
            reason = (family.check(problem, self.cc)
                      or self._policy_skip(name, "S^2" in family.memory, case))
            if reason:
                rows.append(make_row(case, name, "ours", skipped=reason))
                continue

            def ours(q, k, v, name=name):
                return ca.attention(q, k, v, causal=case.causal, kernel=name)

            rows.append(self._measure(case, name, "ours", ours, sets, ref))
        for backend, label in self._torch_backends(case, rows):
            rows.append(self._measure(case, label, "torch", self._torch_forward(backend, case),
                                      sets, ref))
        del sets
        self.free_memory()
        return rows

    def _run_paged(self, case: Case) -> list[dict]:
        """attention_decode on a paged cache: each set's K and V cut into pages of
        ``case.page`` rows and stored in a shuffled order, with its block table."""
        if self.kernels is not None and "decode" not in self.kernels:
            return [make_row(case, "decode", "ours", skipped="paged caches run on decode, "
                             "which --kernels leaves out")]
        sets = self.input_sets(case)
        ref = self._reference(case, *sets[0])
        rng = np.random.default_rng(case.page)
        b, page = case.batch, case.page
        per = -(-case.seqlen_k // page)
        xp = _array_module(sets[0][0])
        paged = []
        for q, k, v in sets:
            order = rng.permutation(b * per)
            table = xp.asarray(order.astype(np.int32).reshape(b, per), device=q.device)
            lens = xp.asarray(np.full(b, case.seqlen_k, np.int32), device=q.device)
            where = xp.asarray(order, device=q.device)

            def pool(x):   # [B, Hkv, Sk, D] -> pages [B * per, page, Hkv, D], shuffled
                shape = (b, per * page, case.heads_kv, case.head_dim)
                rows = xp.zeros(shape, dtype=x.dtype, device=x.device)
                rows[:, :case.seqlen_k] = _bshd(x)
                out = xp.empty(shape, dtype=x.dtype, device=x.device).reshape(
                    b * per, page, case.heads_kv, case.head_dim)
                out[where] = rows.reshape(b * per, page, case.heads_kv, case.head_dim)
                return out
            paged.append((_bshd(q), pool(k), pool(v), table, lens))
        del sets

        def ours(q, k, v, table, lens):
            out = ca.attention_decode(q, k, v, cache_seqlens=lens, block_table=table,
                                      causal=case.causal)
            return _bshd(out)   # [B, Hq, Sq, D], as the reference is

        rows = [self._measure(case, "decode", "ours", ours, paged, ref)]
        del paged
        self.free_memory()
        return rows

    def _run_backward(self, case: Case) -> list[dict]:
        """The backward alone. Ours: out and LSE come from one forward per input set,
        made before the timed calls, and each backward kernel that takes the case is
        timed. torch: one forward per input set with its autograd graph retained, and
        the timed call is ``autograd.grad`` through it."""
        from ..backward import BACKWARD_KERNELS
        from ..calls import backward_family

        sets = self.input_sets(case, with_dout=True)
        problem = case.problem(self.device_id)
        rows, with_fwd = [], None
        for name in BACKWARD_KERNELS:
            if name in ("auto", "reference") or (self.kernels is not None and
                                                 name not in self.kernels):
                continue
            try:
                backward_family(problem, name, self.device_id)
            except UnsupportedError as exc:
                rows.append(make_row(case, name, "ours", skipped=str(exc)))
                continue
            if with_fwd is None:
                with_fwd = [(q, k, v, dout) + tuple(ca.attention(q, k, v, causal=case.causal,
                                                                 return_lse=True))
                            for q, k, v, dout in sets]

            def ours(q, k, v, dout, out, lse, name=name):
                return ca.attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                             kernel=name)

            rows.append(self._measure(case, name, "ours", ours, with_fwd, None))
        del with_fwd
        torch = self.torch
        for backend, label in self._torch_backends(case, rows):
            sdpa = self._torch_sdpa(backend, case)
            try:
                graphs = []
                for s in sets:
                    leaves = tuple(x.detach().requires_grad_() for x in s[:3])
                    with torch.enable_grad():
                        graphs.append((sdpa(*leaves),) + leaves + (s[3],))
            except Unsupported as exc:
                rows.append(make_row(case, label, "torch", skipped=str(exc)))
                continue

            def theirs(out, q, k, v, dout):
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

            rows.append(self._measure(case, label, "torch", theirs, graphs, None))
            del graphs
        del sets
        self.free_memory()
        return rows


def _bshd(x):
    """A [B, H, S, D] view of [B, S, H, D] (and back): axes 1 and 2 swapped, torch or CuPy."""
    return x.transpose(1, 2) if type(x).__module__.startswith("torch") else x.swapaxes(1, 2)


class _CupyOn:
    """CuPy's asarray/zeros/empty with torch's ``device=`` keyword (ignored: the current
    device), so one code path builds paged caches for either kind of input."""

    def __init__(self, cupy):
        self.cupy = cupy

    def asarray(self, x, device=None):
        return self.cupy.asarray(x)

    def zeros(self, shape, dtype, device=None):
        return self.cupy.zeros(shape, dtype=dtype)

    def empty(self, shape, dtype, device=None):
        return self.cupy.empty(shape, dtype=dtype)


def _array_module(x):
    if type(x).__module__.startswith("torch"):
        import torch
        return torch
    import cupy
    return _CupyOn(cupy)
