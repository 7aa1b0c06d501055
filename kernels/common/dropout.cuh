// Attention dropout's random bits: Philox4x32-10 (Salmon, Moraes, Dror and Shaw,
// "Parallel random numbers: as easy as 1, 2, 3", SC 2011) and the keep decision of
// each element, the stream cupy_attention/dropout.py draws on the host (its
// docstring defines the counter mapping; tests/test_dropout_host.py compiles this
// header with the host's C++ compiler and checks every bit against it).
//
// Element (b, h, i, j) of a (batch or packed sequence, query head) is kept iff its
// 16-bit value u >= threshold, threshold = round(p * 65536); kept probabilities are
// scaled by 1 / (1 - threshold / 65536). One Philox call gives the 8 values of the
// elements an mma C fragment's thread holds in one 16 x 16 block (rows g, g + 8 of
// the block; columns 2t, 2t + 1, 8 + 2t, 9 + 2t):
//   counter = (jb * 32 + (i % 8) * 4 + (j % 8) / 2, ib, b * Hq + h, offset)
//   key     = (seed low word, seed high word)
// with ib = i / 16, jb = j / 16; the element takes half (i % 16 / 8) * 4 + (j % 16 / 8)
// * 2 + j % 2 of the four output words (word w: half 2w in its low 16 bits, 2w + 1
// in its high ones). A warp's 16 rows of a wgmma m64nN accumulator are laid out as
// an mma C fragment, so flash_wgmma draws the same way (fragment_row: the blocks one
// after the other, for its register budget; transposed for the backward's S^T).
#pragma once
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#include "types.cuh"
#define CA_HD __host__ __device__ __forceinline__
#else   // the host compiler of the bit-exactness test
#include <cstdint>
typedef uint32_t u32;
typedef uint64_t u64;
#define CA_HD inline
#endif

struct Philox4 {
  u32 w[4];
};

// The 32 high bits of a * b.
CA_HD u32 mul_hi(u32 a, u32 b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return u32((u64(a) * u64(b)) >> 32);
#endif
}

CA_HD Philox4 philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
  constexpr u32 M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += W0;
      k1 += W1;
    }
    const u32 hi0 = mul_hi(M0, c0), lo0 = M0 * c0;
    const u32 hi1 = mul_hi(M1, c2), lo1 = M1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return {{c0, c1, c2, c3}};
}

// What a kernel needs to draw its mask: the key, the stream offset, the threshold and
// the scale of kept values.
struct DropoutDraw {
  u32 k0, k1, offset, threshold;
  float scale;   // 1 / (1 - threshold / 65536)

  // The four words of 16 x 16 block (ib, jb) of head row bh = b * Hq + h, for the
  // thread whose rows are i % 8 = ri8 (and + 8) and columns j % 8 / 2 = cj2.
  CA_HD Philox4 block(u32 bh, u32 ib, u32 jb, u32 ri8, u32 cj2) const {
    return philox4x32_10(jb * 32u + ri8 * 4u + cj2, ib, bh, offset, k0, k1);
  }
  // Half `half` (0..7) of a block's words passes the threshold.
  CA_HD static bool kept(const Philox4& x, int half, u32 threshold) {
    return ((x.w[half >> 1] >> ((half & 1) * 16)) & 0xffffu) >= threshold;
  }
  // Element (i, j) alone (one Philox call per element: for references and CUDA-core
  // code; the tensor-core kernels take a block's 8 elements per call, fragment()).
  CA_HD bool keep(u32 bh, u32 i, u32 j) const {
    const Philox4 x = block(bh, i / 16, j / 16, i % 8, (j % 8) / 2);
    return kept(x, int((i % 16) / 8 * 4 + (j % 16) / 8 * 2 + j % 2), threshold);
  }
  // The 8 keep flags of an mma C fragment's thread in one 16 x 16 block whose first
  // row and column are multiples of 16 (ib, jb), as bits in the fragment's order
  // over its two n8 tiles: bit nt * 4 + 2 r + e is row g + 8 r, column 8 nt + 2 t + e
  // (g = lane / 4, t = lane % 4; MmaFrag in common/variant.cuh).
  CA_HD u32 fragment(u32 bh, u32 ib, u32 jb, int g, int t) const {
    const Philox4 x = block(bh, ib, jb, u32(g), u32(t));
    u32 bits = 0;
    for (int nt = 0; nt < 2; ++nt)
      for (int r = 0; r < 2; ++r)
        for (int e = 0; e < 2; ++e)
          bits |= u32(kept(x, r * 4 + nt * 2 + e, threshold)) << (nt * 4 + 2 * r + e);
    return bits;
  }
  // The 16-bit values themselves for a transposed fragment, in the order of P^T's
  // 16-bit A fragment pairs: word w = 2 nt + r holds key g + 8 r, query 8 nt + 2 t + c
  // of block (ib, jb) in half c (so `kept_low` and `kept_high` of word w decide the
  // pair an A fragment's word w holds). On the device the whole warp calls it: lane
  // (g, t) draws the forward's fragment of query rows 2t + g % 2 (+ 8), keys g / 2 * 2
  // .. + 1 (+ 8), which holds half g % 2 of its own words, and trades the other halves
  // with lane (g ^ 1, t), which drew rows 2t + 1 - g % 2: one Philox call, two
  // shuffles and six byte permutations, no flag bits. The host draws both.
  CA_HD void transposed_values(u32 bh, u32 ib, u32 jb, int g, int t, u32 (&v)[4]) const {
#if defined(__CUDA_ARCH__)
    const bool odd = g & 1;
    const Philox4 x = block(bh, ib, jb, u32(2 * t + (g & 1)), u32(g / 2));
    // the halves the partner needs (odd: its low halves; even: its high ones), two a word
    const u32 give = odd ? 0x5410u : 0x7632u;
    const u32 take0 = __shfl_xor_sync(0xffffffffu, __byte_perm(x.w[0], x.w[1], give), 4);
    const u32 take1 = __shfl_xor_sync(0xffffffffu, __byte_perm(x.w[2], x.w[3], give), 4);
    // query c = g % 2 from this lane's word, the other from the partner's
    const u32 even_w = odd ? 0x3254u : 0x5410u, odd_w = odd ? 0x3276u : 0x7610u;
    v[0] = __byte_perm(x.w[0], take0, even_w);
    v[1] = __byte_perm(x.w[1], take0, odd_w);
    v[2] = __byte_perm(x.w[2], take1, even_w);
    v[3] = __byte_perm(x.w[3], take1, odd_w);
#else
    for (int w = 0; w < 4; ++w) {
      v[w] = 0;
      for (int c = 0; c < 2; ++c) {
        const Philox4 x = block(bh, ib, jb, u32(2 * t + c), u32(g / 2));
        v[w] |= ((x.w[w] >> (16 * (g % 2))) & 0xffffu) << (16 * c);
      }
    }
#endif
  }
  // Whether the value in the low, or the high, half of a word passes the threshold
  // (threshold <= 65535: dropout.py's check_args).
  CA_HD bool kept_low(u32 v) const { return (v & 0xffffu) >= threshold; }
  CA_HD bool kept_high(u32 v) const { return v >= (threshold << 16); }
  // The same for a transposed fragment (the backward's S^T: rows are keys, columns
  // queries): bit nt * 4 + 2 r + e is key g + 8 r, query 8 nt + 2 t + e of block (ib,
  // jb). Its elements sit in two threads' draws of the forward's order: lanes (2t + e)
  // * 4 + g / 2, e = 0, 1 (query rows 2t + e modulo 8, keys g / 2 * 2 .. + 1 modulo 8),
  // their bits r * 4 + 2 nt + g % 2. On the device the whole warp calls it for one
  // block, g = lane / 4 and t = lane % 4: each lane draws its own forward fragment (one
  // Philox call) and takes its flags from those two lanes (two shuffles). The host
  // (the references and the bit-exactness test) draws both itself.
  CA_HD u32 fragment_transposed(u32 bh, u32 ib, u32 jb, int g, int t) const {
    u32 bits = 0;
#if defined(__CUDA_ARCH__)
    const u32 own = fragment(bh, ib, jb, g, t);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const u32 x = __shfl_sync(0xffffffffu, own, (2 * t + e) * 4 + g / 2) >> (g % 2);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          bits |= ((x >> (r * 4 + 2 * nt)) & 1u) << (nt * 4 + 2 * r + e);
    }
#else
    for (int e = 0; e < 2; ++e) {
      const Philox4 x = block(bh, ib, jb, u32(2 * t + e), u32(g / 2));
      for (int nt = 0; nt < 2; ++nt)
        for (int r = 0; r < 2; ++r)
          bits |= u32(kept(x, nt * 4 + r * 2 + g % 2, threshold)) << (nt * 4 + 2 * r + e);
    }
#endif
    return bits;
  }
  // fragment()'s flags of the n <= 8 blocks (rb, cb0 + m), m < n, of a block row, block
  // m's in bits 8 m .. 8 m + 7. One block after the other in a rolled loop, which keeps
  // one block's Philox registers live (flash_wgmma's forward past D = 128, whose
  // accumulators leave few).
  CA_HD u64 fragment_row(u32 bh, u32 rb, u32 cb0, int n, int g, int t) const {
    u64 bits = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
    for (int m = 0; m < n; ++m) bits |= u64(fragment(bh, rb, cb0 + u32(m), g, t)) << (8 * m);
    return bits;
  }
  // The AND mask of one output word of a block's draw (halves 2w and 2w + 1: one row
  // of the fragment, columns 2t and 2t + 1 of one n8 tile) that clears the dropped
  // halves of the 16-bit pair holding the same two elements.
  CA_HD u32 word_mask(u32 w) const {
    return (kept_low(w) ? 0x0000ffffu : 0u) | (kept_high(w) ? 0xffff0000u : 0u);
  }
  // The AND mask that clears the dropped halves of a 16-bit pair holding flat elements x
  // (low half) and x + 1 (high half) of a fragment_row() (x even): P packed as an A
  // fragment (flash_wgmma).
  CA_HD static u32 pair_mask(u64 bits, int x) {
    const u32 b = u32(bits >> x);
    return (b & 1u ? 0x0000ffffu : 0u) | (b & 2u ? 0xffff0000u : 0u);
  }
  // A thread's keep flags over an accumulator of N_TILES n8 groups in the m16n8 C
  // layout: an mma.sync C fragment, or one warp's 16 rows of a wgmma m64nN
  // accumulator (the same layout per warp). Flat element x = nt * 4 + 2 r + e is row
  // r0 + g + 8 r, column c0 + 8 nt + 2 t + e (r0, c0 multiples of 16); its flag is bit
  // x % 8 of bits[x / 8], one word per 16 x 16 block. TRANSPOSED: rows are keys and
  // columns queries (the backward's S^T).
  template <bool TRANSPOSED, int N_TILES>
  CA_HD void fragment_bits(u32 bh, int r0, int c0, int g, int t,
                           u32 (&bits)[N_TILES / 2]) const {
    static_assert(N_TILES % 2 == 0, "whole 16 x 16 blocks");
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int m = 0; m < N_TILES / 2; ++m)
      bits[m] = TRANSPOSED ? fragment_transposed(bh, u32(c0 / 16 + m), u32(r0 / 16), g, t)
                           : fragment(bh, u32(r0 / 16), u32(c0 / 16 + m), g, t);
  }
};
