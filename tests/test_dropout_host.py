"""Dropout's host-side random stream: the Philox4x32-10 known answers (Random123's
kat_vectors) and the keep mask's statistics, determinism and counter mapping."""

import numpy as np
import pytest

from cupy_attention import dropout


@pytest.mark.parametrize("counter, key, expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, expected):
    assert tuple(int(w) for w in dropout.philox4x32_10(counter, key)) == expected


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_fraction_within_5_sigma(p):
    mask = dropout.keep_mask(1234, 7, 2, 3, 100, 130, p)
    keep = 1 - dropout.threshold(p) / 65536
    sigma = np.sqrt(keep * (1 - keep) / mask.size)
    assert abs(mask.mean() - keep) < 5 * sigma


def test_keep_mask_deterministic_and_seeded():
    a = dropout.keep_mask(1 << 40 | 5, 3, 2, 2, 40, 50, 0.3)
    assert np.array_equal(a, dropout.keep_mask(1 << 40 | 5, 3, 2, 2, 40, 50, 0.3))
    assert not np.array_equal(a, dropout.keep_mask(5, 3, 2, 2, 40, 50, 0.3))   # seed's high word
    assert not np.array_equal(a, dropout.keep_mask(1 << 40 | 5, 4, 2, 2, 40, 50, 0.3))


def test_keep_mask_is_a_prefix():
    """An element's bit depends on (b, h, i, j) only, not on the problem's size."""
    big = dropout.keep_mask(9, 0, 2, 4, 64, 80, 0.5)
    assert np.array_equal(big[:1, :3, :17, :33], dropout.keep_mask(9, 0, 1, 3, 17, 33, 0.5))


def test_counter_mapping_one_element():
    seed, offset, Hq, b, h, i, j = (3 << 32) | 11, 5, 3, 1, 2, 21, 37
    ri, rj = i % 16, j % 16
    words = dropout.philox4x32_10(
        ((j // 16) * 32 + (ri % 8) * 4 + (rj % 8) // 2, i // 16, b * Hq + h, offset),
        (seed & 0xFFFFFFFF, seed >> 32))
    half = (ri // 8) * 4 + (rj // 8) * 2 + rj % 2
    u = (int(words[half // 2]) >> (16 * (half % 2))) & 0xFFFF
    p = 0.5
    assert dropout.keep_mask(seed, offset, 2, Hq, 32, 48, p)[b, h, i, j] == (u >= 32768)


def test_p_zero_keeps_everything():
    assert dropout.keep_mask(1, 0, 1, 1, 20, 20, 0.0).all()
    assert dropout.keep_scale(0.0) == 1.0


def test_generator_advances_and_reseeds():
    g = dropout.Generator()
    g.manual_seed(42)
    assert [g.next(), g.next()] == [(42, 0), (42, 1)]
    g.manual_seed(42)
    assert g.next() == (42, 0)


@pytest.mark.parametrize("p, seed, offset, error", [
    ("0.1", None, None, dropout.DTypeError), (True, None, None, dropout.DTypeError),
    (1.0, None, None, dropout.ShapeError), (-0.1, None, None, dropout.ShapeError),
    (1 - 2.0 ** -18, None, None, dropout.ShapeError),  # would round to T = 65536
    (0.1, 1.5, None, dropout.DTypeError), (0.1, 1 << 64, None, dropout.ShapeError),
    (0.1, -1, None, dropout.ShapeError), (0.1, 1, 1 << 32, dropout.ShapeError),
])
def test_argument_errors(p, seed, offset, error):
    with pytest.raises(error, match="dropout_"):
        dropout.check_args(p, seed, offset)


def test_backward_needs_the_seed():
    with pytest.raises(dropout.ShapeError, match="dropout_seed"):
        dropout.check_args(0.1, None, None, need_seed=True)
    dropout.check_args(0.0, None, None, need_seed=True)
    dropout.check_args(0.5, (1 << 64) - 1, (1 << 32) - 1, need_seed=True)


# ---------------------------------------------------------------------------
# kernels/common/dropout.cuh, compiled by the host's C++ compiler, against the NumPy stream

_DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "dropout.cuh"
int main(int argc, char** argv) {
  // seed offset B Hq Sq Sk threshold; prints Philox KATs, then per (b, h, i, j) four
  // flags: keep(), the fragment() and fragment_transposed() bits of the element, and
  // its transposed_values() half against the threshold.
  unsigned long long seed = strtoull(argv[1], 0, 10);
  u32 offset = u32(strtoul(argv[2], 0, 10));
  int B = atoi(argv[3]), H = atoi(argv[4]), S = atoi(argv[5]), K = atoi(argv[6]);
  DropoutDraw d{u32(seed), u32(seed >> 32), offset, u32(atoi(argv[7])), 1.f};
  Philox4 z = philox4x32_10(0, 0, 0, 0, 0, 0);
  printf("%08x %08x %08x %08x\n", z.w[0], z.w[1], z.w[2], z.w[3]);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < S; ++i)
        for (int j = 0; j < K; ++j) {
          const u32 bh = u32(b * H + h);
          const int g = i % 8, t = (j % 8) / 2;
          const u32 bits = d.fragment(bh, i / 16, j / 16, g, t);
          const int bit = ((j % 16) / 8) * 4 + 2 * ((i % 16) / 8) + j % 2;
          // transposed: the thread holding key j as row g' = j % 8, query i as column
          // 2t' + e = i % 8
          const u32 tbits = d.fragment_transposed(bh, i / 16, j / 16, j % 8, (i % 8) / 2);
          const int tbit = ((i % 16) / 8) * 4 + 2 * ((j % 16) / 8) + i % 2;
          // transposed_values: word 2 ((i % 16) / 8) + (j % 16) / 8, half i % 2
          u32 v[4];
          d.transposed_values(bh, i / 16, j / 16, j % 8, (i % 8) / 2, v);
          const u32 word = v[2 * ((i % 16) / 8) + (j % 16) / 8];
          printf("%d%d%d%d", int(d.keep(bh, i, j)), int((bits >> bit) & 1),
                 int((tbits >> tbit) & 1), int(i % 2 ? d.kept_high(word) : d.kept_low(word)));
        }
  printf("\n");
  return 0;
}
"""


def test_device_header_draws_the_host_stream(tmp_path):
    """dropout.cuh's Philox, keep(), fragment(), fragment_transposed() and
    transposed_values() (the host's form: both draws, no lane trade) give the bits
    keep_mask gives, for a seed with both words set, a nonzero offset and sizes that are
    not multiples of 16."""
    import shutil
    import subprocess

    from cupy_attention import jit

    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = tmp_path / "driver.cpp"
    src.write_text(_DRIVER)
    exe = tmp_path / "driver"
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{jit.kernels_dir()}/common", str(src), "-o",
                    str(exe)], check=True, capture_output=True)
    seed, offset, B, H, S, K, p = (1 << 40) + 12345, 7, 2, 3, 37, 50, 0.3
    out = subprocess.run([str(exe), str(seed), str(offset), str(B), str(H), str(S), str(K),
                          str(dropout.threshold(p))], check=True, capture_output=True,
                         text=True).stdout.split()
    assert tuple(int(w, 16) for w in out[:4]) == \
        tuple(int(w) for w in dropout.philox4x32_10((0, 0, 0, 0), (0, 0)))
    flags = np.array([int(c) for c in out[4]], dtype=bool).reshape(B, H, S, K, 4)
    want = dropout.keep_mask(seed, offset, B, H, S, K, p)
    for n in range(4):
        assert np.array_equal(flags[..., n], want), n


_WGMMA_DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "dropout.cuh"
// One warpgroup's wgmma m64nN accumulator (PTX ISA, "wgmma D fragment"): thread T
// (warp w = T / 32, lane: g = lane / 4, t = lane % 4) holds element i < N / 2 at row
// 16 w + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 t + (i & 1). For each element of a
// tile it prints "query key flags unrolled", unrolled = its bit of fragment_bits
// (flash_mma) and flags what the Hopper kernels take: forward, 2 * (its half of the
// pair_mask of its packed 16-bit pair: P's A fragments, fragment_packed's word path) +
// its bit of fragment_row; backward (S^T), its half of transposed_values' word of its
// pair (the A fragments of P^T and the factor of dP^T alike), twice.
template <bool TRANSPOSED, int N>
void tile(const DropoutDraw& d, u32 bh, int r_corner, int c_corner) {
  for (int T = 0; T < 128; ++T) {
    const int w = T / 32, g = (T % 32) / 4, t = T % 4, r0 = r_corner + 16 * w;
    if (r0 < 0) continue;   // rows before the sequence (a shifted query block)
    const u64 row = TRANSPOSED ? 0 : d.fragment_row(bh, u32(r0 / 16), u32(c_corner / 16), N / 16, g, t);
    u32 unrolled[N / 16];
    d.fragment_bits<TRANSPOSED, N / 8>(bh, r0, c_corner, g, t, unrolled);
    for (int i = 0; i < N / 2; ++i) {
      const int r = r0 + g + 8 * ((i >> 1) & 1), c = c_corner + 8 * (i >> 2) + 2 * t + (i & 1);
      int flag;
      if (TRANSPOSED) {   // k16 step i / 8 of the queries, A word (i % 8) / 2, half i % 2
        u32 v[4];
        d.transposed_values(bh, u32(c_corner / 16 + i / 8), u32(r0 / 16), g, t, v);
        const u32 word = v[(i % 8) / 2];
        flag = 3 * int(i & 1 ? d.kept_high(word) : d.kept_low(word));
      } else {            // packed word i / 2, half i % 2; bit i
        flag = int((DropoutDraw::pair_mask(row, i & ~1) >> (16 * (i & 1))) & 1u) * 2 +
               int((row >> i) & 1u);
      }
      printf("%d %d %d %d\n", TRANSPOSED ? c : r, TRANSPOSED ? r : c, flag,
             int((unrolled[i / 8] >> (i % 8)) & 1u));
    }
  }
}
int main(int argc, char** argv) {
  // seed offset threshold; then lines "fwd|bwd bh row_corner col_corner N" on stdin, each
  // answered by its elements and a line "end"
  unsigned long long seed = strtoull(argv[1], 0, 10);
  DropoutDraw d{u32(seed), u32(seed >> 32), u32(strtoul(argv[2], 0, 10)),
                u32(atoi(argv[3])), 1.f};
  char kind[8];
  unsigned bh;
  int rc, cc, n;
  while (scanf("%7s %u %d %d %d", kind, &bh, &rc, &cc, &n) == 5) {
    const bool fwd = kind[0] == 'f';
    switch (n * 2 + fwd) {
      case 64 * 2 + 1: tile<false, 64>(d, bh, rc, cc); break;
      case 80 * 2 + 1: tile<false, 80>(d, bh, rc, cc); break;
      case 96 * 2 + 1: tile<false, 96>(d, bh, rc, cc); break;
      case 112 * 2 + 1: tile<false, 112>(d, bh, rc, cc); break;
      case 128 * 2 + 1: tile<false, 128>(d, bh, rc, cc); break;
      case 64 * 2: tile<true, 64>(d, bh, rc, cc); break;
      default: return 2;
    }
    printf("end\n");
  }
  return 0;
}
"""


def _wgmma_cases():
    """(kind, b, h, row corner, column corner, N) of the tiles the Hopper kernels draw.

    Forward (flash_wgmma, Consumer::rescale_and_pack): consumer c of a work tile from
    query q0 holds rows q0 + 64 c .. of an m64 x BLOCK_N S tile at key k0 (a multiple
    of BLOCK_N); q0 a multiple of 16, negative for a shifted first block. Backward
    (flash_wgmma_bwd): a warpgroup's m64 x BLOCK_M S^T tile, its keys from n0 + 64 wg
    (the narrow kernel, BLOCK_N = 128) or n0 (the wide one, BLOCK_N = 64), queries from
    m0, a multiple of BLOCK_M."""
    out = []
    for n, q0, c, kb in ((128, 0, 0, 0), (128, 192, 2, 1), (112, -48, 0, 2), (112, 144, 1, 0),
                         (96, 64, 1, 3), (80, 0, 2, 1), (64, -16, 0, 4), (64, 256, 1, 3)):
        out.append(("fwd", 1, 2, q0 + 64 * c, kb * n, n))
    for bm, n0, wg, mb in ((64, 0, 0, 0), (64, 128, 1, 3), (64, 256, 1, 5), (64, 384, 0, 2)):
        out.append(("bwd", 0, 1, n0 + 64 * wg, mb * bm, bm))   # narrow kernel
    for n0, mb in ((64, 2), (192, 0)):
        out.append(("bwd", 1, 0, n0, mb * 64, 64))               # wide kernel
    return out


def test_wgmma_fragments_draw_the_host_mask(tmp_path):
    """The keep flags the Hopper kernels give each element of their wgmma accumulators
    (the PTX layout of an m64nN fragment, written out here independently of the
    kernels) are keep_mask's, bit for bit: fragment_row's bits and pair_mask on P packed
    as A fragments (the forward's P V past D = 128), transposed_values (the backward's
    P^T and dP^T, S^T's keys as rows) and the unrolled fragment_bits (flash_mma)
    alike; every element of each tile is drawn exactly once."""
    import shutil
    import subprocess

    from cupy_attention import jit

    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = tmp_path / "wgmma.cpp"
    src.write_text(_WGMMA_DRIVER)
    exe = tmp_path / "wgmma"
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{jit.kernels_dir()}/common", str(src), "-o",
                    str(exe)], check=True, capture_output=True)
    seed, offset, Hq, p = (5 << 36) + 987, 3, 3, 0.4
    cases = _wgmma_cases()
    stdin = "".join(f"{k} {b * Hq + h} {r} {c} {n}\n" for k, b, h, r, c, n in cases)
    out = subprocess.run([str(exe), str(seed), str(offset), str(dropout.threshold(p))],
                         input=stdin, check=True, capture_output=True, text=True).stdout
    blocks = out.split("end\n")
    assert len(blocks) == len(cases) + 1 and blocks[-1] == ""
    want = dropout.keep_mask(seed, offset, 2, Hq, 512, 1024, p)
    for (kind, b, h, r, c, n), block in zip(cases, blocks):
        rows = np.array([[int(x) for x in line.split()] for line in block.splitlines()])
        q, k = rows[:, 0], rows[:, 1]
        keep = want[b, h, q, k]
        assert np.array_equal(rows[:, 2] & 1, keep) and np.array_equal(rows[:, 2] >> 1, keep)
        if kind == "fwd":   # rows of the 64 x N tile from r, those >= 0
            tile = {(i, j) for i in range(max(r, 0), r + 64) for j in range(c, c + n)}
        else:               # keys r .. r + 63, queries c .. c + n - 1
            tile = {(i, j) for i in range(c, c + n) for j in range(r, r + 64)}
        assert np.array_equal(rows[:, 3], keep), (kind, r, c, n)
        assert len(rows) == len(tile) and set(zip(q.tolist(), k.tolist())) == tile
        assert 0 < keep.mean() < 1


def test_device_header_compiles_with_nvrtc():
    from cupy_attention import jit

    from helpers import nvrtc_probe

    src = ('#include "common/dropout.cuh"\n'
           'extern "C" __global__ void k(DropoutDraw d, unsigned* out) {\n'
           '  out[threadIdx.x] = d.fragment(1, 2, 3, threadIdx.x / 4, threadIdx.x % 4) |\n'
           '                     (d.fragment_transposed(1, 2, 3, threadIdx.x / 4, threadIdx.x % 4) << 8) |\n'
           '                     (d.keep(1, threadIdx.x, 5) << 16);\n'
           '  unsigned v[4];\n'
           '  d.transposed_values(1, 2, 3, threadIdx.x / 4, threadIdx.x % 4, v);\n'
           '  out[32 + threadIdx.x] = v[0] ^ v[1] ^ v[2] ^ d.kept_high(v[3]);\n}\n')
    for arch in ("sm_80", "sm_90a"):
        ok, log = nvrtc_probe(src, ["-std=c++17", f"-I{jit.kernels_dir()}", f"-arch={arch}"])
        assert ok, log


# ---------------------------------------------------------------------------
# The float64 references with dropout

def _qkv(seed, B=2, H=2, Sq=20, Sk=24, D=8):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s) for s in ((B, H, Sq, D), (B, H, Sk, D), (B, H, Sk, D)))


def test_reference_drops_the_normalized_probabilities():
    """out = (softmax(scores) * keep / (1 - p)) V with keep_mask's bits; the LSE is the
    undropped softmax's."""
    from cupy_attention.reference import attention_reference

    q, k, v = _qkv(0)
    p, seed, offset = 0.25, (3 << 33) + 9, 11
    out, lse = attention_reference(q, k, v, causal=True, dropout=(p, seed, offset))
    plain_out, plain_lse = attention_reference(q, k, v, causal=True)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    i, j = np.arange(20)[:, None] + 4, np.arange(24)[None, :]
    s = np.where(j <= i, s, -np.inf)
    probs = np.exp(s - s.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    keep = dropout.keep_mask(seed, offset, 2, 2, 20, 24, p)
    np.testing.assert_allclose(out, (probs * keep * dropout.keep_scale(p)) @ v, rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_array_equal(lse, plain_lse)
    assert not np.allclose(out, plain_out)
    same, _ = attention_reference(q, k, v, causal=True, dropout=(0.0, seed, offset))
    np.testing.assert_array_equal(same, plain_out)


def test_dropout_is_unbiased_over_streams():
    """The mean over many offsets of the dropped output approaches the plain output
    (the 1 / (1 - p) scale): within 5 standard errors per element."""
    from cupy_attention.reference import attention_reference

    q, k, v = _qkv(1, B=1, H=1, Sq=8, Sk=16)
    plain, _ = attention_reference(q, k, v)
    outs = np.stack([attention_reference(q, k, v, dropout=(0.4, 77, off))[0]
                     for off in range(400)])
    err = np.abs(outs.mean(0) - plain)
    assert (err <= 5 * outs.std(0) / np.sqrt(len(outs)) + 1e-12).all()


@pytest.mark.parametrize("causal", [False, True])
def test_backward_reference_with_dropout_matches_finite_differences(causal):
    from cupy_attention.reference import attention_backward_reference, attention_reference

    q, k, v = _qkv(2, B=1, H=2, Sq=5, Sk=7, D=3)
    dout = np.random.default_rng(4).standard_normal(q.shape)
    kw = dict(causal=causal, dropout=(0.3, 123, 5))
    grads = attention_backward_reference(dout, q, k, v, **kw)
    eps = 1e-6
    for n, g in enumerate(grads):
        for idx in ((0, 0, 1, 2), (0, 1, 4, 0)):
            args = [x.copy() for x in (q, k, v)]
            args[n][idx] += eps
            plus = attention_reference(*args, **kw)[0]
            args[n][idx] -= 2 * eps
            minus = attention_reference(*args, **kw)[0]
            num = ((plus - minus) * dout).sum() / (2 * eps)
            assert abs(num - g[idx]) < 1e-6 * max(1.0, abs(num))


def test_variant_spells_the_dropout_policy():
    from cupy_attention.variant import Variant, dropout_params

    v = Variant(causal=True, dropout=True)
    assert v.cpp().endswith("FixedSeqs, PhiloxDropout>") and v.suffix().endswith(",dropout")
    assert Variant(ragged=True, dropout=True).cpp().endswith("RaggedSeqs, PhiloxDropout>")
    assert "Dropout" not in Variant(causal=True).cpp()
    f = dropout_params(0.1, (5 << 32) + 7, 3)
    assert (f["dropout_seed_lo"], f["dropout_seed_hi"], f["dropout_offset"]) == (7, 5, 3)
    assert f["dropout_threshold"] == dropout.threshold(0.1)
    assert f["dropout_scale"] == pytest.approx(dropout.keep_scale(0.1))


# ---------------------------------------------------------------------------
# Arguments, dispatch and params on the host

def _problem(**kw):
    from cupy_attention.problem import validate

    from helpers import standin

    q = standin((2, 4, 100, 64), "float16")
    k = standin((2, 2, 120, 64), "float16")
    return validate(q, k, k, causal=True, **kw)


def test_problem_carries_the_stream_and_the_variant_the_policy():
    p = _problem(dropout_p=0.1, dropout_seed=42, dropout_offset=3)
    assert (p.dropout_p, p.dropout_seed, p.dropout_offset) == (0.1, 42, 3)
    assert p.variant.dropout and "PhiloxDropout" in p.variant.cpp()
    plain = _problem()
    assert plain.dropout_p == 0 and not plain.variant.dropout
    drawn = [_problem(dropout_p=0.1) for _ in range(2)]   # the default generator advances
    assert drawn[0].dropout_seed == drawn[1].dropout_seed
    assert drawn[1].dropout_offset == drawn[0].dropout_offset + 1


def test_dispatch_sends_dropout_to_the_tensor_core_families():
    """flash_wgmma (forward and backward) on Hopper, flash_mma elsewhere; the others
    decline dropout and say which families take it."""
    from cupy_attention import dispatch

    p = _problem(dropout_p=0.2, dropout_seed=1, dropout_offset=0)
    assert dispatch.choose(p, "auto", 80).name == "flash_mma"
    assert dispatch.choose(p, "auto", 90).name == "flash_wgmma"
    assert dispatch.FAMILIES["flash_mma"].check(p, 90) is None
    for name in ("decode", "flash", "tiled", "naive"):
        assert "dropout (flash_mma and flash_wgmma do)" in (dispatch.FAMILIES[name].check(p, 90)
                                                           or ""), name
    assert dispatch.choose_backward(p, "auto", 90, 227 * 1024).name == "flash_wgmma"
    assert dispatch.choose_backward(p, "auto", 80, 163 * 1024).name == "flash_mma"
    assert "dropout" in dispatch.BACKWARD_FAMILIES["flash"].check(p, 90, 227 * 1024)


def test_wgmma_tiles_with_dropout():
    """flash_wgmma's rows with dropout: the table's, but three consumers whose acc and P
    exceed DROPOUT_LIVE_REGS (D = 160) become two; causal query blocks shift by
    multiples of 16 only (a warp's rows stay one row block of the mask)."""
    from cupy_attention.families import flash_wgmma
    from cupy_attention.variant import Variant

    for d in range(64, 257, 8):
        for causal in (False, True):
            plain = flash_wgmma.tiles_for(d, causal)
            cfg = flash_wgmma.tiles_for(d, causal, dropout=True)
            assert (cfg != plain) == (d == 160), d
            assert flash_wgmma.dropout_live(d, cfg[0], cfg[1]) <= \
                flash_wgmma.DROPOUT_LIVE_REGS[cfg[0]]
            assert flash_wgmma.smem_bytes(d, cfg) <= flash_wgmma.SMEM_LIMIT
            both = flash_wgmma.tiles_for(d, causal, True, True)
            assert both[1] <= flash_wgmma.tiles_for(d, causal, True)[1]
            cands = flash_wgmma.candidates(d, causal, dropout=True)
            assert cands[0] == cfg
            assert all(flash_wgmma.config_fits(d, c, dropout=True) for c in cands[1:])
    assert flash_wgmma.spec(64, "bfloat16", Variant(dropout=True)).name.endswith(",dropout]")
    for sq, sk in ((200, 200), (130, 700), (1000, 1000), (65, 64), (300, 4000)):
        for bm, bn in ((192, 128), (128, 128), (128, 64), (192, 96)):
            shift = flash_wgmma.query_shift(sq, sk, bm, bn, True)
            assert shift % 16 == 0 and 0 <= shift <= -(-sq // bm) * bm - sq
    assert flash_wgmma.query_shift(145, 245, 128, 128) == 111   # unaligned without dropout
    assert flash_wgmma.query_shift(145, 245, 128, 128, True) == 0


def test_wgmma_backward_tiles_with_dropout():
    """The flash_wgmma backward takes 64-query tiles with dropout at every head dim (the
    plain kernel has 128 up to D = 80, causal ones up to D = 64), and the producer
    warpgroup in the atomic dQ mode up to D = 128; deterministic, its dK/dV kernel adds
    dQ in order up to D = 128; past it both modes run the dQ pass flash_wgmma_bwd_dq,
    which draws the same mask."""
    from cupy_attention.families import flash_wgmma_bwd
    from cupy_attention.variant import Variant

    for d in range(64, 257, 8):
        vt = Variant(False, dropout=True)
        assert flash_wgmma_bwd.config(d, vt).block_m == 64
        assert flash_wgmma_bwd.config(d, vt).threads("atomic", vt) == (384 if d <= 128 else 256)
        assert flash_wgmma_bwd.config(d, Variant()).block_m == (
            128 if d == 64 else 80 if 88 <= d <= 128 else 64)   # (80: non-causal, unsplit)
        assert flash_wgmma_bwd.config(d, Variant(True)).block_m == (128 if d <= 64 else 64)
        vt = Variant(d % 16 == 0, dropout=True)
        for deterministic in (False, True):
            kernels = flash_wgmma_bwd.specs(flash_wgmma_bwd.config(d, vt), "bfloat16", vt,
                                            deterministic)
            separate = d > 128
            assert sum("PhiloxDropout" in s.expr for s in kernels) == 1 + separate
            assert any("ordered-dq" in s.name for s in kernels) == (deterministic and d <= 128)


def test_fwd_params_hold_the_draw():
    from cupy_attention.families.base import Tensors, fwd_params
    from cupy_attention.variant import dropout_params

    class Arr:
        def __init__(self, shape):
            self.shape, self.itemsize = shape, 2
            self.strides = tuple(int(np.prod(shape[i + 1:])) * 2 for i in range(len(shape)))
            self.data = type("Ptr", (), {"ptr": 4096})()

    p = _problem(dropout_p=0.3, dropout_seed=(9 << 32) + 5, dropout_offset=77)
    t = Tensors(Arr((2, 4, 100, 64)), Arr((2, 2, 120, 64)), Arr((2, 2, 120, 64)),
                Arr((2, 4, 100, 64)))
    fp = fwd_params(p, t)
    for name, value in dropout_params(0.3, (9 << 32) + 5, 77).items():
        assert fp[name] == pytest.approx(value), name


def test_backward_requires_the_forward_stream():
    from cupy_attention.errors import ShapeError

    from helpers import standin

    q = standin((1, 2, 16, 32), "float16")
    with pytest.raises(ShapeError, match="dropout_seed"):
        ca_backward(q, dropout_p=0.1)


def ca_backward(q, **kw):
    import cupy_attention as ca

    lse = np.zeros((1, 2, 16), np.float32)
    return ca.attention_backward(q, q, q, q, q, lse, kernel="reference", **kw)


def test_reference_kernel_takes_dropout():
    import cupy_attention as ca
    from cupy_attention.reference import attention_reference

    q, k, v = (x.astype(np.float32) for x in _qkv(5, B=1, H=2, Sq=12, Sk=12, D=16))
    out = ca.attention(q, k, v, causal=True, kernel="reference", dropout_p=0.5,
                       dropout_seed=99, dropout_offset=2)
    want, _ = attention_reference(q, k, v, causal=True, dropout=(0.5, 99, 2))
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=1e-6, atol=1e-6)
    grads = ca.attention_backward(np.ones_like(q), q, k, v, out, np.zeros((1, 2, 12), np.float32),
                                  causal=True, kernel="reference", dropout_p=0.5, dropout_seed=99,
                                  dropout_offset=2)
    assert all(np.isfinite(g).all() for g in grads)


def test_packed_sequences_draw_as_batch_entries():
    """Sequence b of a packed batch draws as batch entry b: keep_mask's first_batch
    equals the slice of a batch's mask, and attention_varlen (reference kernel)
    drops each sequence with it."""
    import cupy_attention as ca
    from cupy_attention.reference import attention_reference

    full = dropout.keep_mask(11, 2, 3, 2, 9, 13, 0.4)
    np.testing.assert_array_equal(dropout.keep_mask(11, 2, 1, 2, 5, 7, 0.4, first_batch=2),
                                  full[2:3, :, :5, :7])
    rng = np.random.default_rng(8)
    lq, lk = (5, 0, 7), (6, 4, 9)
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q = rng.standard_normal((sum(lq), 2, 8)).astype(np.float32)
    k = rng.standard_normal((sum(lk), 1, 8)).astype(np.float32)
    v = rng.standard_normal((sum(lk), 1, 8)).astype(np.float32)
    out = ca.attention_varlen(q, k, v, cu_q, cu_k, causal=True, kernel="reference",
                              dropout_p=0.4, dropout_seed=11, dropout_offset=2)
    for b in (0, 2):
        q0, k0 = cu_q[b], cu_k[b]
        want, _ = attention_reference(q[None, q0:q0 + lq[b]], k[None, k0:k0 + lk[b]],
                                      v[None, k0:k0 + lk[b]], causal=True, layout="bshd",
                                      dropout=(0.4, 11, 2, b))
        np.testing.assert_allclose(np.asarray(out[q0:q0 + lq[b]], np.float64), want[0],
                                   rtol=1e-6, atol=1e-6)
    plain = ca.attention_varlen(q, k, v, cu_q, cu_k, causal=True, kernel="reference")
    assert not np.allclose(out, plain)
