"""flash_wgmma's host-side plan: where its causal query blocks start
(query_shift), and the shared memory it asks for (smem_bytes), which must equal
what the kernel lays out: NVRTC compiles a probe that static_asserts
WgmmaTraits::SMEM_BYTES against the host's figure for every tile config."""

from __future__ import annotations

import pytest

from cupy_attention import jit
from cupy_attention.families import flash_wgmma
from cupy_attention.families.flash_wgmma import query_shift

from helpers import nvrtc_probe


@pytest.mark.parametrize("seqlen, block_m", [(192, 192), (384, 192), (1536, 192), (512, 128),
                                             (4096, 128)])
def test_whole_blocks_stay_in_place(seqlen, block_m):
    assert query_shift(seqlen, seqlen, block_m, 128) == 0


@pytest.mark.parametrize("seqlen_q, seqlen_k, block_m, block_n, shift", [
    # S = 512 and 1k, BLOCK_M = 192, BLOCK_N = 128 (D = 64): the partial block (128 and
    # 64 rows) goes first; measured 1.03x and 1.07x against shift 0 on the H200
    (512, 512, 192, 128, 64),
    (1024, 1024, 192, 128, 128),
    # BLOCK_N = 96 (D = 96, 112), S = 512 and 2k: shifting by 64 would end every block
    # 64 rows into a key tile, one more key tile per block (0.92x, 0.96x measured)
    (512, 512, 192, 96, 0),
    (2048, 2048, 192, 96, 0),
    # one query row: one consumer works wherever it sits; ties keep 0
    (1, 1, 192, 128, 0),
])
def test_measured_cases(seqlen_q, seqlen_k, block_m, block_n, shift):
    assert query_shift(seqlen_q, seqlen_k, block_m, block_n) == shift


@pytest.mark.parametrize("block_m, block_n", [(192, 128), (192, 112), (192, 96), (192, 64),
                                              (128, 128), (128, 112)])
def test_shift_keeps_every_row_in_a_block(block_m, block_n):
    """0 <= shift <= the last block's overhang: the last block still reaches the last
    row, and the first block still starts at or before row 0."""
    for seqlen_q in list(range(1, 700, 7)) + [1000, 1023, 3000, 16000]:
        for seqlen_k in (seqlen_q, seqlen_q // 3 + 1, 2 * seqlen_q):
            overhang = -(-seqlen_q // block_m) * block_m - seqlen_q
            shift = query_shift(seqlen_q, seqlen_k, block_m, block_n)
            assert 0 <= shift <= overhang, (seqlen_q, seqlen_k, shift)


def smem_probe(cases, lie: bool = False) -> str:
    """static_asserts of WgmmaTraits::SMEM_BYTES against the host's smem_bytes."""
    lines = ['#include "flash_wgmma.cu"']
    for i, (d, cfg) in enumerate(cases):
        consumers, block_n, min_blocks, stages = cfg
        traits = f"WgmmaTraits<{d}, {consumers}, {block_n}, bf16, {min_blocks}, {stages}>"
        smem = flash_wgmma.smem_bytes(d, cfg) + (8 if lie and i == 0 else 0)
        lines.append(f'static_assert({traits}::SMEM_BYTES == {smem}, "SMEM_BYTES D={d} {cfg}");')
    return "\n".join(lines) + "\n"


def nvrtc_compile(src: str) -> tuple[bool, str]:
    return nvrtc_probe(src, jit.options_for("sm_90a"))


SHIPPED = sorted({(d, flash_wgmma.tiles_for(d, causal))
                  for d in range(64, 257, 8) for causal in (False, True)})


def test_host_shared_memory_matches_the_kernel():
    assert len(SHIPPED) >= len(flash_wgmma.TILES)
    ok, log = nvrtc_compile(smem_probe(SHIPPED))
    assert ok, f"flash_wgmma.py and WgmmaTraits disagree:\n{log}"


def test_smem_probe_catches_a_wrong_size():
    ok, log = nvrtc_compile(smem_probe(SHIPPED[:1], lie=True))
    assert not ok and "SMEM_BYTES D=" in log, log
