"""flash_wgmma on TESTING.md's edge lengths (5) and causal alignment (1, 2) at
head dims that exercise each row of its tile table: 64 (three consumers,
BLOCK_N = 128), 72 (BLOCK_N = 112; Q K^T's last k16 step half zero-padding, P V's
N = 72 stops 8 columns into a 64-column block), 80, 96 (BLOCK_N = 96, three
stages), 112 (two stages), 128 (three consumers at BLOCK_N = 64, two at 128 under
the causal mask), 160 (three consumers, three column blocks), 192 (two consumers,
BLOCK_N = 112) and 256 (BLOCK_N = 64, four column blocks). Each length lands
differently on the 64-row consumer tiles and the key tiles, so the producer's
zero-fill, the fully masked rows and the pipeline's prologue and epilogue (one key
tile, two, more than the STAGES buffers) are all covered."""

from __future__ import annotations

import pytest

from cupy_attention.dispatch import FAMILIES

from helpers import (as_float, check_attention, make_qkv, plain_attention, problem_for,
                     run_and_check, seed_for, to_bhsd)

pytestmark = pytest.mark.gpu

NAME = "flash_wgmma"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("variant", ["square", "square-causal", "q17", "k113-causal", "q-long-causal"])
@pytest.mark.parametrize("L", [1, 2, 5, 17, 113, 1023])
@pytest.mark.parametrize("D", [64, 72, 80, 96, 112, 128, 160, 192, 256])
def test_lengths_off_every_tile(D, L, variant, dtype, device_cc):
    Sq, Sk = {"square": (L, L), "square-causal": (L, L), "q17": (17, L),
              "k113-causal": (L, 113), "q-long-causal": (L + 300, L)}[variant]
    shape = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=Sq, seqlen_k=Sk, head_dim=D,
                 dtype=dtype, layout="bhsd", causal=variant.endswith("causal"))
    reason = FAMILIES[NAME].check(problem_for(**shape), device_cc)
    if reason:
        pytest.skip(reason)
    run_and_check(NAME, seed=seed_for(NAME, D, L, variant, dtype), meta=dict(part="wgmma-lengths"),
                  **shape)


@pytest.mark.parametrize("which", ["kv", "q"])
@pytest.mark.parametrize("how", ["broadcast-heads", "broadcast-batch", "reversed-rows",
                                 "one-row-repeated", "bshd-strided"])
@pytest.mark.parametrize("D", [72, 128])
def test_views_and_tensor_maps(D, how, which, device_cc):
    """Q, K and V reach flash_wgmma through tensor maps: a broadcast head or batch
    axis (stride 0) is a map axis of size 1, read at coordinate 0; views no map can
    describe (rows reversed, every row the same row) run flash_mma's kernel. The
    view is taken of K and V together, or of Q alone; each must match the plain
    implementation."""
    import cupy
    import cupy_attention as ca

    from cupy_attention import tma
    from cupy_attention.families.base import bhs_strides

    B, Hq, Hkv, Sq, Sk, dtype = 2, 4, 2, 77, 113, "bfloat16"
    layout = "bshd" if how == "bshd-strided" else "bhsd"
    reason = FAMILIES[NAME].check(problem_for(batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq,
                                              seqlen_k=Sk, head_dim=D, dtype=dtype), device_cc)
    if reason:
        pytest.skip(reason)
    seed = seed_for(NAME, "views", D, how, which)
    q, k, v, _ = make_qkv(cupy, seed, batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq,
                          seqlen_k=Sk, head_dim=D, dtype=dtype, layout=layout)
    heads, rows = (Hkv, Sk) if which == "kv" else (Hq, Sq)

    def view(x):
        if how == "broadcast-heads":
            return cupy.broadcast_to(x[:, :1], x.shape)
        if how == "broadcast-batch":
            return cupy.broadcast_to(x[:1], x.shape)
        if how == "reversed-rows":
            return x[:, :, ::-1]
        if how == "one-row-repeated":
            return cupy.broadcast_to(x[:, :, 5:6], x.shape)
        # bshd with heads of a wider buffer: row stride 3 * heads * D
        return cupy.concatenate([x, x, x], axis=2)[:, :, heads:2 * heads]

    if which == "kv":
        k, v = view(k), view(v)
        viewed = (k, v)
    else:
        q = view(q)
        viewed = (q,)
    wants_map = how in ("broadcast-heads", "broadcast-batch", "bshd-strided")
    assert all(tma.tileable(B, heads, rows, bhs_strides(x, layout)) for x in viewed) == wants_map
    out, lse = ca.attention(q, k, v, layout=layout, return_lse=True, kernel=NAME)
    ref, ref_lse = plain_attention(q, k, v, layout=layout)
    same, same_lse = plain_attention(q, k, v, layout=layout, precision=dtype)
    check_attention(to_bhsd(as_float(out), layout), ref, same, dtype, lse=lse.astype(cupy.float64),
                    ref_lse=ref_lse, same_lse=same_lse,
                    log=dict(kernel=NAME, dtype=dtype, D=D, view=f"{which}-{how}", part="wgmma-views"))


@pytest.mark.parametrize("shift", [1, 40, 64, 100, "overhang"])
@pytest.mark.parametrize("Sq, Sk", [(450, 700), (450, 300), (70, 900)])
@pytest.mark.parametrize("D", [64, 72])
def test_causal_query_blocks_start_anywhere(D, Sq, Sk, shift, monkeypatch, device_cc):
    """Under the causal mask the host may start the query blocks up to the last
    block's overhang before row 0 (query_shift). Whatever it picks, the rows
    before 0 are never stored, a consumer with none of the real rows sits its tile
    out, and a warp that straddles row 0 (shifts 1, 40, 100) mixes rows that exist
    with rows that do not. Sk > Sq: rows before 0 still see keys; Sk < Sq: the
    first real rows see none (out 0, lse -inf)."""
    from cupy_attention.families import flash_wgmma

    shape = dict(batch=2, heads_q=6, heads_kv=2, seqlen_q=Sq, seqlen_k=Sk, head_dim=D,
                 dtype="bfloat16", layout="bhsd", causal=True)
    reason = FAMILIES[NAME].check(problem_for(**shape), device_cc)
    if reason:
        pytest.skip(reason)
    block_m = 64 * flash_wgmma.tiles_for(D, True)[0]
    overhang = -(-Sq // block_m) * block_m - Sq
    value = overhang if shift == "overhang" else shift
    if value > overhang:
        pytest.skip(f"{Sq} rows in blocks of {block_m} overhang by {overhang} < {value}")
    monkeypatch.setattr(flash_wgmma, "query_shift", lambda *_: value)
    run_and_check(NAME, seed=seed_for(NAME, "shift", D, Sq, Sk, shift),
                  meta=dict(part="wgmma-query-shift"), **shape)


@pytest.mark.parametrize("variant", ["square", "square-causal", "q-long-causal", "big-logits"])
@pytest.mark.parametrize("D", [64, 72, 128, 256])
def test_many_work_tiles_per_block(D, variant, device_cc):
    """flash_wgmma is persistent: one block per SM walks the work tiles (BLOCK_M
    query rows of one head and batch). With several tiles per block, the K and V
    buffers' phases, Q's hand-over from one tile to the next, the consumers' turn
    barriers, tiles with no key tile at all (query rows before the causal
    diagonal starts, Sq > Sk) and the rare overflow path of the max-free softmax
    (large logits) all carry over from tile to tile."""
    import cupy

    from cupy_attention.device import multiprocessor_count
    from cupy_attention.families.flash_wgmma import tiles_for

    Sq, Sk = (700, 400) if variant == "q-long-causal" else (450, 450)
    causal = variant != "square"
    shape = dict(batch=3, heads_q=40, heads_kv=8, seqlen_q=Sq, seqlen_k=Sk, head_dim=D,
                 dtype="bfloat16", layout="bshd", causal=causal)
    reason = FAMILIES[NAME].check(problem_for(**shape), device_cc)
    if reason:
        pytest.skip(reason)
    block_m = 64 * tiles_for(D, causal)[0]
    tiles = -(-Sq // block_m) * 40 * 3
    sms = multiprocessor_count(cupy.cuda.runtime.getDevice())
    assert tiles >= 2 * sms, f"{tiles} work tiles do not give each of {sms} blocks two"
    run_and_check(NAME, seed=seed_for(NAME, "persistent", D, variant),
                  magnitude=4.0 if variant == "big-logits" else 1.0,
                  meta=dict(part="wgmma-persistent"), **shape)


def test_work_tile_counter_per_stream(device_cc):
    """Blocks claim work tiles from a counter per stream, which the last claim sets
    back to 0: launches in two streams at once each get their own, and every
    launch leaves it at 0 for the next one in its stream."""
    import cupy
    import cupy_attention as ca

    from cupy_attention.families.flash_wgmma import tile_counter

    shape = dict(batch=2, heads_q=48, heads_kv=48, seqlen_q=640, seqlen_k=640, head_dim=128,
                 dtype="bfloat16", layout="bhsd")
    reason = FAMILIES[NAME].check(problem_for(**shape), device_cc)
    if reason:
        pytest.skip(reason)
    dev = cupy.cuda.runtime.getDevice()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    inputs = [make_qkv(cupy, seed_for(NAME, "streams", n), **shape)[:3] for n in range(2)]
    cupy.cuda.Device().synchronize()
    outs = []
    for rep in range(3):  # the second and third launches in a stream reuse its counter
        for stream, (q, k, v) in zip(streams, inputs):
            with stream:
                outs.append(ca.attention(q, k, v, causal=rep % 2 == 1, kernel=NAME))
    cupy.cuda.Device().synchronize()
    counters = [tile_counter(dev, s) for s in streams]
    assert counters[0].data.ptr != counters[1].data.ptr
    assert all(int(c.get()[0]) == 0 for c in counters)
    for n, out in enumerate(outs):
        q, k, v = inputs[n % 2]
        causal = (n // 2) % 2 == 1
        ref, _ = plain_attention(q, k, v, causal=causal)
        same, _ = plain_attention(q, k, v, causal=causal, precision="bfloat16")
        check_attention(as_float(out), ref, same, "bfloat16",
                        log=dict(kernel=NAME, part="wgmma-streams", launch=n))


@pytest.mark.parametrize("warm_stream", [False, True])
def test_cuda_graph_capture(warm_stream, device_cc):
    """A call captured into a CUDA graph (torch.cuda.graph) replays correctly. In a
    stream that has run flash_wgmma before, the graph keeps that stream's work tile
    counter; in one that has not, nothing is allocated during the capture and the
    kernel takes its tiles in the fixed order instead."""
    torch = pytest.importorskip("torch")
    import cupy
    import cupy_attention as ca

    from cupy_attention.families import flash_wgmma

    shape = dict(batch=2, heads_q=24, heads_kv=8, seqlen_q=700, seqlen_k=700, head_dim=128,
                 dtype="bfloat16", layout="bhsd")
    reason = FAMILIES[NAME].check(problem_for(**shape), device_cc)
    if reason:
        pytest.skip(reason)
    gen = torch.Generator(device="cuda").manual_seed(seed_for(NAME, "graph", warm_stream))
    q, k, v = (torch.randn(2, h, 700, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (24, 8, 8))
    stream = torch.cuda.Stream()
    ca.attention(q, k, v, causal=True, kernel=NAME)  # compile and load outside the capture
    if warm_stream:
        with torch.cuda.stream(stream):
            ca.attention(q, k, v, causal=True, kernel=NAME)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = ca.attention(q, k, v, causal=True, kernel=NAME)
    has_counter = (torch.cuda.current_device(), stream.cuda_stream) in flash_wgmma._counters
    assert has_counter == warm_stream
    for rep in range(3):  # new inputs in the captured buffers each replay
        for x in (q, k, v):
            x.copy_(torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        qc, kc, vc, oc = (cupy.from_dlpack(x.detach()) for x in (q, k, v, out))
        ref, _ = plain_attention(qc, kc, vc, causal=True)
        same, _ = plain_attention(qc, kc, vc, causal=True, precision="bfloat16")
        check_attention(as_float(oc), ref, same, "bfloat16",
                        log=dict(kernel=NAME, part="wgmma-graph", warm=warm_stream, replay=rep))
