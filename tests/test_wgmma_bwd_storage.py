"""flash_wgmma_bwd's shared memory and variants, checked by NVRTC (no GPU needed).

The kernel's ``WgmmaBwdTraits::Storage`` is the one layout of its shared memory
(``SMEM_BYTES = sizeof(Storage) + SMEM_SLACK``); the host launches with
``Config.smem``, so a probe static_asserts the two equal for every shipped config.
The variants the host does not route here yet (softcap, a sliding window, both)
compile for sm_90a in both kernels and both dQ modes, with no spills except
softcap at D = 128 (dK and dV take 128 registers; up to 56 bytes spilled with a
causal band, ptxas of CUDA 13). Softcap takes 64-query tiles at every head dim:
with the 128-query tiles of D <= 80 the narrow kernel (about 245 registers without
it) spills some 150 bytes.
"""

from __future__ import annotations

import pytest

from cupy_attention import jit
from cupy_attention.families import flash_wgmma_bwd as fb
from cupy_attention.variant import Variant

from helpers import nvrtc_probe

SHIPPED = sorted({fb.config(d) for d in range(64, fb.TILES[-1][0] + 1, 8)},
                 key=lambda c: c.head_dim)
# and the deterministic mode's (64-query tiles where the default takes 128: D = 64 with
# ALiBi), flash_wgmma_bwd_dkdv_mid's (D = 136-192) and, under softcap, the wide kernel's there
SHIPPED_ALL = sorted({fb.config(d, vt, det) for d in range(64, fb.TILES[-1][0] + 1, 8)
                      for det in (False, True)
                      for vt in (Variant(), Variant(dense="alibi"), Variant(softcap=30.0))},
                     key=lambda c: (c.head_dim, c.block_m))


def smem_probe(configs, lie: bool = False) -> str:
    lines = ['#include "flash_wgmma_bwd.cu"']
    for i, c in enumerate(configs):
        traits = c.traits("bfloat16")
        smem = c.smem + (16 if lie and i == 0 else 0)
        lines.append(f'static_assert({traits}::SMEM_BYTES == {smem}, '
                     f'"SMEM_BYTES D={c.head_dim} BM={c.block_m}");')
        lines.append(f'static_assert(sizeof({traits}::Storage) + SMEM_SLACK == {smem}, '
                     f'"sizeof(Storage) D={c.head_dim}");')
    return "\n".join(lines) + "\n"


def test_every_head_dim_has_a_config():
    assert [c.head_dim for c in SHIPPED] == list(range(64, 257, 8))
    assert {c.wide for c in SHIPPED} == {False, True}


def test_host_shared_memory_matches_the_storage():
    ok, log = nvrtc_probe(smem_probe(SHIPPED_ALL), jit.options_for("sm_90a"))
    assert ok, f"flash_wgmma_bwd.py's Config.smem and WgmmaBwdTraits::Storage disagree:\n{log}"


def dq_smem_probe(lie: bool = False) -> str:
    """static_asserts that flash_wgmma_bwd_dq's shared memory is the host's dq_smem at
    every head dim it runs (the wide kernel's) and both key-tile widths."""
    lines = ['#include "flash_wgmma_bwd.cu"']
    for c in SHIPPED:
        if not c.wide:
            continue
        for bn in (48, 64):
            smem = fb.dq_smem(c.head_dim, bn) + (16 if lie else 0)
            traits = f"WgmmaBwdDqTraits<{c.head_dim}, {bn}, bf16>"
            lines.append(f'static_assert({traits}::SMEM_BYTES == {smem}, '
                         f'"DQ SMEM_BYTES D={c.head_dim} BN={bn}");')
    return "\n".join(lines) + "\n"


def test_dq_pass_shared_memory_matches_the_storage():
    ok, log = nvrtc_probe(dq_smem_probe(), jit.options_for("sm_90a"))
    assert ok, f"flash_wgmma_bwd.py's dq_smem and WgmmaBwdDqTraits disagree:\n{log}"
    ok, log = nvrtc_probe(dq_smem_probe(lie=True), jit.options_for("sm_90a"))
    assert not ok and "DQ SMEM_BYTES D=" in log, log


def test_wide_head_dims_take_the_dq_pass():
    for c in SHIPPED:
        for det in (False, True):
            kernels = [s.expr.split("<", 1)[0] for s in fb.specs(c, "bfloat16", Variant(), det)]
            assert ("flash_wgmma_bwd_dq" in kernels) == c.wide, (c, det, kernels)
            if c.wide:
                assert "kDqSeparate" in fb.specs(c, "bfloat16", Variant(), det)[1].expr
    ragged = fb.config(256, Variant(ragged=True))
    assert fb.own_dq(ragged)
    assert not fb.own_dq(fb.config(128, Variant(ragged=True)))


def test_smem_probe_catches_a_wrong_size():
    ok, log = nvrtc_probe(smem_probe(SHIPPED[:1], lie=True), jit.options_for("sm_90a"))
    assert not ok and "SMEM_BYTES D=" in log, log


LAUNCH_VARIANTS = (Variant(), Variant(True), Variant(True, dropout=True),
                   Variant(True, (64, 0), dropout=True), Variant(softcap=30.0, dropout=True),
                   Variant(softcap=30.0),
                   Variant(True, (64, 0)), Variant(ragged=True), Variant(dense="alibi"),
                   Variant(True, softcap=30.0, dense="alibi"))


def threads_probe(lie: bool = False) -> str:
    """static_asserts that the dK/dV kernel's threads (BwdLaunch) are the host's
    (Config.threads) for every shipped config, these variants, every dQ mode and, for
    the atomic one, with and without a split."""
    lines = ['#include "flash_wgmma_bwd.cu"']
    for c in SHIPPED_ALL:
        if c.mid:   # (one launch shape: the default mode, fixed lengths, no split)
            lines.append(f"static_assert({c.traits('bfloat16')}::THREADS == "
                         f'{c.threads("atomic", Variant())}, "THREADS D={c.head_dim} mid");')
            continue
        for vt in LAUNCH_VARIANTS:
            for mode, cpp in fb.DQ_MODES.items():
                for split in (False, True) if mode == "atomic" else (False,):
                    threads = c.threads(mode, vt, split) + (32 if lie else 0)
                    traits = f"WgmmaBwdTraits<{c.head_dim}, {c.block_m}, bf16>"
                    launch = f"BwdLaunch<{traits}, {vt.cpp()}, {cpp}, {str(split).lower()}>"
                    lines.append(f"static_assert({launch}::THREADS == {threads}, "
                                 f'"THREADS D={c.head_dim} {mode}{vt.suffix()} split={split}");')
                    if lie:
                        return "\n".join(lines) + "\n"
    return "\n".join(lines) + "\n"


def test_host_threads_match_the_launch_bounds():
    ok, log = nvrtc_probe(threads_probe(), jit.options_for("sm_90a"))
    assert ok, f"flash_wgmma_bwd.py's Config.threads and BwdLaunch disagree:\n{log}"


def test_threads_probe_catches_a_wrong_count():
    ok, log = nvrtc_probe(threads_probe(lie=True), jit.options_for("sm_90a"))
    assert not ok and "THREADS D=" in log, log


def test_where_the_producer_warpgroup_runs():
    # beyond SHIPPED's tiles (config(d) knows no variant): the deterministic D = 64 with
    # ALiBi on 64-query tiles, 80-query tiles at D = 88-128 in place of 64 at 88-120, and
    # flash_wgmma_bwd_dkdv_mid at D = 136-192 (both modes, ALiBi too; softcap runs the wide
    # kernel there, and 64-query tiles at D = 88-120 where the plain non-causal kernel takes
    # 80)
    assert len(SHIPPED_ALL) == len(SHIPPED) + 2 + 8 + 5
    assert {c.head_dim for c in SHIPPED_ALL if c.mid} == set(range(136, 193, 8))
    assert fb.config(160, Variant(dense="alibi")).mid and fb.config(160, Variant(), True).mid
    assert not fb.config(160, Variant(softcap=30.0)).mid
    assert fb.config(160, Variant(True, (64, 0))).mid and not fb.config(160, Variant(True), split=True).mid
    assert fb.config(160, Variant(True)).threads("atomic", Variant(True)) == 384
    assert fb.config(128, Variant(dense="alibi")).block_m == 64
    assert fb.config(120, Variant(dense="alibi")).block_m == fb.config(128, Variant()).block_m == 80
    c = fb.config(128)
    assert c.threads("ordered", Variant(True)) == c.threads("staggered", Variant()) == 384
    assert c.threads("atomic", Variant(True)) == 384
    # under dropout for the atomic dQ only, without softcap or a window's lower bound;
    # not for the atomic dQ with packed sequences or a split, nor without dQ, nor on
    # 128-query tiles past D = 64 or in the wide kernel
    assert c.threads("atomic", Variant(True, dropout=True)) == 384
    assert c.threads("ordered", Variant(dropout=True)) == 256
    assert c.threads("atomic", Variant(True, softcap=30.0, dropout=True)) == 256
    assert c.threads("atomic", Variant(True, (64, 0), dropout=True)) == 256
    assert c.threads("atomic", Variant(True, ragged=True)) == 256
    assert c.threads("atomic", Variant(True), split=True) == 256
    assert c.threads("atomic", Variant(True, softcap=30.0, dense="alibi")) == 256
    assert c.threads("ordered", Variant(True, softcap=30.0, dense="alibi")) == 384
    assert c.threads("separate", Variant()) == 256
    # 128-query tiles: at D = 64 in the ordered modes, with dV and dK from shared
    # memory (KV_SS_FITS), not with ALiBi or dropout; never for the atomic dQ. D = 72-80
    # take 64-query tiles, on the producer warpgroup in both modes
    wide_rows = fb.config(64)
    assert wide_rows.block_m == 128
    assert wide_rows.threads("ordered", Variant()) == wide_rows.threads("staggered", Variant(True)) == 384
    assert wide_rows.threads("ordered", Variant(True, dense="alibi")) == 256
    assert wide_rows.threads("ordered", Variant(True, dropout=True)) == 256
    assert wide_rows.threads("atomic", Variant()) == wide_rows.threads("atomic", Variant(True)) == 256
    for d in (72, 80):
        assert fb.config(d, Variant()).block_m == 64
        assert fb.config(d).threads("ordered", Variant()) == 384
        assert fb.config(d).threads("atomic", Variant()) == 384
    assert fb.config(256).threads("ordered", Variant()) == 256     # the wide kernel


def variant_spec(head_dim: int, variant: Variant, deterministic: bool) -> jit.KernelSpec:
    """The shipped dK/dV instantiation (softcap takes the 64-row tiles: fb.config; the
    deterministic mode's dQ ordered or separate: fb.specs)."""
    c = fb.config(head_dim, variant, deterministic)
    return fb.specs(c, "bfloat16", variant, deterministic)[1]


VARIANTS = [
    Variant(softcap=30.0),
    Variant(causal=True, softcap=30.0),
    Variant(window=(128, 64)),
    Variant(causal=True, window=(256, -1)),
    Variant(causal=True, window=(96, -1), softcap=50.0),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.suffix().strip(","))
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("deterministic", [False, True])
def test_variants_compile_for_sm90a(head_dim, variant, deterministic):
    spec = variant_spec(head_dim, variant, deterministic)
    r = jit.compile_spec(spec, "sm_90a").resources
    known_spills = bool(variant.softcap) and head_dim == 128
    assert r.spills == 0 or known_spills, (spec.name, r)


def test_dq_pass_key_tiles():
    """flash_wgmma_bwd_dq takes 96 keys a tile up to D = 176 (not under dropout), 48
    only where 64 spilled (dropout from D = 240, softcap with ALiBi at D = 256), and its
    shared memory fits 227 KB at every head dim the wide kernel runs, with one V buffer
    from D = 200 at 64 keys."""
    assert fb.dq_block_n(136, Variant(True, softcap=30.0, dense="alibi")) == 96
    assert fb.dq_block_n(176, Variant(window=(256, 0))) == 96
    assert fb.dq_block_n(176, Variant(dropout=True)) == 64
    assert fb.dq_block_n(184, Variant()) == 64
    assert fb.dq_block_n(256, Variant()) == 64
    assert fb.dq_block_n(256, Variant(dropout=True)) == 48
    assert fb.dq_block_n(240, Variant(True, dropout=True)) == 48
    assert fb.dq_block_n(232, Variant(True, dropout=True)) == 64
    assert fb.dq_block_n(256, Variant(softcap=30.0, dense="alibi")) == 48
    assert fb.dq_block_n(256, Variant(softcap=30.0)) == 64
    for d in range(136, 257, 8):
        for bn in (48, 64) + ((96,) if d <= fb.DQ_WIDE_KEYS_MAX_D else ()):
            assert fb.dq_smem(d, bn) <= 227 * 1024, (d, bn)
    d_pad = 256
    assert fb.dq_smem(256, 64) == 2 * 128 * d_pad * 2 + 3 * 64 * d_pad * 2 + 1024   # one V buffer
    assert fb.dq_smem(192, 64) == 2 * 128 * 192 * 2 + 4 * 64 * 192 * 2 + 1024      # two
