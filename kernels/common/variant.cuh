// Attention variants: which keys a query row sees, and what becomes of its logits.
//
// A variant is one type, Variant<BandT, LogitsT, DenseT, SeqsT, DropT>, chosen on the
// host and instantiated into every kernel family; nothing of it exists at run time
// when it is off. Coordinates are those of one (batch, head): query row i in [0, Sq),
// key j in [0, Sk). Five independent parts:
//   band     row i sees the keys [row_begin(i), row_end(i)): one interval per row,
//            clipped to [0, Sk). Band<LO, HI> with each bound present or not; the
//            host folds the causal alignment and a window (left, right) into two
//            params: row i sees keys i + band_lo .. i + band_hi (FwdParams).
//              NoBand     every key
//              CausalBand j <= i + Sk - Sq            (band_hi = Sk - Sq)
//              Band<1,1>  a sliding window, causal or not
//   logits   the raw dot product q.k becomes the score s2 in the exp2 domain
//            (s2 = s * log2 e, where s is the score softmax sees):
//              PlainLogits  s2 = dot * scale * log2 e
//              Softcap      s2 = c tanh(dot * scale / c) * log2 e    (Gemma 2)
//   dense    a per-element mask or bias, applied after the logits: read from memory
//            (BoolDense, AddDense) or computed (AlibiBias); NoDense (mask.cuh).
//   seqs     where batch entry b's rows lie (FixedSeqs, RaggedSeqs for packed
//            sequences of different lengths, CachedSeqs for a batch of KV caches
//            of their own lengths: seqs.cuh). A kernel binds the params to
//            its tile's sequence (Seqs::bind) and everything above reads the bound
//            params, so band, logits and masks work per sequence unchanged.
//   drop     NoDropout, or PhiloxDropout: P times keep / (1 - p) after the softmax's
//            row sums, keep drawn per 16 x 16 block of an mma (or wgmma) accumulator
//            (dropout.cuh); the tensor-core families only.
//
// What a kernel asks of a variant (all warp-uniform unless it names a row):
//   kv_begin(p, q_first), kv_end(p, q_last)   the keys any row of [q_first, q_last]
//                                             sees: the key-tile loop's bounds
//   q_begin(p, k_first), q_end(p, k_last)     the query rows that see any key of
//                                             [k_first, k_last]: the backward's walk
//   partial(p, q_first, q_last, k_first, k_last)
//                                             false when the tile needs no
//                                             per-element work (every row sees every
//                                             key, no dense mask, no key past Sk)
//   kFastSoftmax                              the max-free softmax stays valid
//   kTransform                                the score is more than dot * scale
//                                             (a logits transform or a bias): no
//                                             kernel may fold the scale into exp2
//   Scores<V>::map (below)                    the one loop that applies band, logits
//                                             and dense mask to a thread's scores;
//                                             apply, forward and p_ds (the backward's
//                                             P and dS) are built on it
// Hazards: a masked score is *selected* to a fill value (-inf before a softmax, 0
// after an exp), never multiplied, so NaN/Inf in masked keys stays out.
#pragma once
#include "dropout.cuh"
#include "mask.cuh"
#include "seqs.cuh"

// ---------------------------------------------------------------------------
// Bands

template <bool LO, bool HI>
struct Band {
  static constexpr bool kLo = LO, kHi = HI;
  // First key row i sees (0 without a lower bound).
  __device__ __forceinline__ static int row_begin(const FwdParams& p, int i) {
    return LO ? cmax(i + p.band_lo, 0) : 0;
  }
  // One past the last key row i sees, in [0, Sk].
  __device__ __forceinline__ static int row_end(const FwdParams& p, int i) {
    if constexpr (HI) {
      const int end = i + p.band_hi + 1;
      return end < 0 ? 0 : (end < p.seqlen_k ? end : p.seqlen_k);
    } else {
      return p.seqlen_k;
    }
  }
  // The query rows that see key j: [col_begin(j), col_end(j)) (not clipped to Sq).
  __device__ __forceinline__ static int col_begin(const FwdParams& p, int j) {
    return HI ? j - p.band_hi : -(1 << 30);
  }
  __device__ __forceinline__ static int col_end(const FwdParams& p, int j) {
    return LO ? j - p.band_lo + 1 : (1 << 30);
  }
  // Every row of [q_first, q_last] sees every key of [k_first, k_last] (keys < Sk).
  __device__ __forceinline__ static bool covers(const FwdParams& p, int q_first, int q_last,
                                                int k_first, int k_last) {
    return (!HI || k_last <= q_first + p.band_hi) && (!LO || k_first >= q_last + p.band_lo);
  }
};
using NoBand = Band<false, false>;
using CausalBand = Band<false, true>;

// ---------------------------------------------------------------------------
// Logits

// s2(p, dot) and s2<true>(p, dot): EXACT rounds once (the fp32 CUDA-core kernels,
// whose results must stay within a few ulps of an fp32 reference); the tensor-core
// kernels take one multiplication, and fold even that into the FFMA of their exp2
// on tiles that need no mask (p = exp2(dot * scale_log2 - m)).
struct PlainLogits {
  static constexpr bool kTransform = false;
  template <bool EXACT = false>
  __device__ __forceinline__ static float s2(const FwdParams& p, float dot) {
    return EXACT ? exp2_score(p, dot) : dot * p.scale_log2;
  }
  // s2 + shift in one FMA (shift: the exp2's row reference, and a computed bias).
  __device__ __forceinline__ static float shifted(const FwdParams& p, float dot, float shift) {
    return fmaf(dot, p.scale_log2, shift);
  }
  // d s / d dot: the backward's dS (with respect to s) times this is the gradient
  // of the raw dot product, before the final multiplication by scale.
  template <bool EXACT = false>
  __device__ __forceinline__ static float grad(const FwdParams&, float) { return 1.f; }
};

// tanh(x) = 1 - 2 / (e^{2x} + 1) with ex2.approx and rcp.approx: two MUFU
// operations, absolute error about 3e-7 (tanh.approx.f32 takes one, but its relative
// error of 2^-11 moved the LSE of a softcapped row past the tolerance rule: at c = 30
// the score's error reached 1e-4). x -> +inf: e = inf, 1 / inf = 0; x -> -inf: e = 0.
__device__ __forceinline__ float fast_tanh(float x) {
  const float e = fast_exp2(x * 2.8853900817779268f);  // 2 log2(e)
  return fmaf(-2.f, fast_rcp(e + 1.f), 1.f);
}

// Logit softcapping (Gemma 2): s = c tanh(dot * scale / c). Params: softcap_scale =
// scale / c, softcap_log2 = c * log2 e.
struct Softcap {
  static constexpr bool kTransform = true;
  // s2 = c log2 e tanh(x) = c log2 e - 2 c log2 e / (e^{2x} + 1), x = dot * scale / c:
  // fast_tanh with its constants folded into one multiplication before the ex2 and
  // one FMA after the reciprocal (three FP32 operations per score, not six), the
  // constants params (softcap_exp2, softcap_neg2) that the FP32 instructions read in
  // place, not registers. (Measured beside it, H100: the reciprocal by Newton steps on
  // the FMA pipe, one MUFU operation fewer; notes-alibi.md.)
  template <bool EXACT = false>
  __device__ __forceinline__ static float s2(const FwdParams& p, float dot) {
    if constexpr (EXACT) return tanhf(dot * p.softcap_scale) * p.softcap_log2;
    return shifted(p, dot, 0.f);
  }
  // s2 + shift: the shift joins c log2 e in the last FMA (per row, not per score).
  __device__ __forceinline__ static float shifted(const FwdParams& p, float dot, float shift) {
    const float e = fast_exp2(dot * p.softcap_exp2);
    return fmaf(p.softcap_neg2, fast_rcp(e + 1.f), p.softcap_log2 + shift);
  }
  template <bool EXACT = false>
  __device__ __forceinline__ static float grad(const FwdParams& p, float dot) {
    const float t = tanh_of<EXACT>(dot * p.softcap_scale);
    return fmaf(-t, t, 1.f);
  }

 private:
  template <bool EXACT>
  __device__ __forceinline__ static float tanh_of(float x) {
    return EXACT ? tanhf(x) : fast_tanh(x);
  }
};

// ---------------------------------------------------------------------------
// Dropout: applied to the normalized probabilities, out = (P . keep / (1 - p)) V, so
// the softmax's row sums (and the LSE) are those of P itself; the backward redraws
// the same keep mask (common/dropout.cuh: one Philox stream per call, addressed by
// (sequence, head, row, key)).

struct NoDropout {
  static constexpr bool enabled = false;
};

struct PhiloxDropout {
  static constexpr bool enabled = true;
  __device__ __forceinline__ static DropoutDraw draw(const FwdParams& p) {
    return {p.dropout_seed_lo, p.dropout_seed_hi, p.dropout_offset, p.dropout_threshold,
            p.dropout_scale};
  }
  // The probabilities of an m16 x 8 N_TILES mma C fragment (MmaFrag<N_TILES>: flat
  // s[nt * 4 + 2 r + e]) of (sequence, head) row bh = b * Hq + h, whose first row i0
  // and first column j0 are multiples of 16, in place: kept ones times the scale,
  // dropped ones selected to 0. One Philox call per 16 x 16 block.
  // Each draw's halves decide their elements as drawn (half r * 4 + nt * 2 + e of block
  // m is flat element (2 m + nt) * 4 + 2 r + e).
  template <int N_TILES>
  __device__ __forceinline__ static void fragment(const FwdParams& p, int bh, int i0, int j0,
                                                  int lane, float (&s)[N_TILES * 4]) {
    const DropoutDraw d = draw(p);
#pragma unroll
    for (int m = 0; m < N_TILES / 2; ++m) {
      const Philox4 x = d.block(u32(bh), u32(i0 / 16), u32(j0 / 16 + m), u32(lane / 4),
                                u32(lane % 4));
#pragma unroll
      for (int h = 0; h < 8; ++h) {
        float& v = s[(2 * m + h / 2 % 2) * 4 + 2 * (h / 4) + h % 2];
        v = DropoutDraw::kept(x, h, d.threshold) ? d.scale * v : 0.f;
      }
    }
  }
  // The same for P already rounded to 16-bit A fragments (m16n8k16 / wgmma A from
  // registers: word e of k16 step m holds flat elements 8 m + 2 e in its low half and
  // 8 m + 2 e + 1 in its high half): dropped halves cleared, kept ones left as they are,
  // so the caller scales the product P V by dropout_scale (flash_wgmma: with 1 / l_i).
  // DIRECT: each draw word masks its pair as soon as it is drawn (block m's word w
  // holds the pair of row g + 8 (w / 2), n8 tile w % 2, which is A word e = 2 (w % 2) +
  // w / 2); packing the flags into one bit word first (fragment_row) costs as many
  // instructions as the draw itself, but keeps one block's draw live at a time: the
  // direct form spilled at D = 192 (packed sequences) and 256 (ALiBi).
  template <int N_TILES, bool DIRECT = true>
  __device__ __forceinline__ static void fragment_packed(const FwdParams& p, int bh, int i0,
                                                         int j0, int lane,
                                                         u32 (&a)[N_TILES / 2][4]) {
    if constexpr (DIRECT) {
      const DropoutDraw d = draw(p);
#pragma unroll
      for (int m = 0; m < N_TILES / 2; ++m) {
        const Philox4 x = d.block(u32(bh), u32(i0 / 16), u32(j0 / 16 + m), u32(lane / 4),
                                  u32(lane % 4));
#pragma unroll
        for (int e = 0; e < 4; ++e) a[m][e] &= d.word_mask(x.w[(e % 2) * 2 + e / 2]);
      }
    } else {
      static_assert(N_TILES <= 16, "as many flags as the word holds");
      const u64 bits = draw(p).fragment_row(u32(bh), u32(i0 / 16), u32(j0 / 16), N_TILES / 2,
                                            lane / 4, lane % 4);
#pragma unroll
      for (int m = 0; m < N_TILES / 2; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[m][e] &= DropoutDraw::pair_mask(bits, 8 * m + 2 * e);
    }
  }
  // The keep flags of a thread's C fragment over N_TILES n8 tiles (16 x 16 blocks of
  // 8 flags, bit x % 8 of bits[x / 8] for flat element x), rows g and g + 8 from row
  // corner r0, columns from c0 (multiples of 16); TRANSPOSED: rows are keys.
  template <bool TRANSPOSED, int N_TILES>
  __device__ __forceinline__ static void keep_bits(const FwdParams& p, int bh, int r0, int c0,
                                                   int g, int t, u32 (&bits)[N_TILES / 2]) {
    draw(p).template fragment_bits<TRANSPOSED, N_TILES>(u32(bh), r0, c0, g, t, bits);
  }
  // Flat element x's factor: the scale where kept, 0 where dropped (selected, so a
  // dropped inf or NaN stays out).
  template <int B>
  __device__ __forceinline__ static float factor(const FwdParams& p, const u32 (&bits)[B], int x) {
    return (bits[x / 8] >> (x % 8)) & 1u ? p.dropout_scale : 0.f;
  }
  // A transposed C fragment's 16-bit values instead of flags (the backward's S^T, rows
  // keys from r0, columns queries from c0): DropoutDraw::transposed_values of its
  // N_TILES / 2 blocks, whose word (x % 8) / 2 of block x / 8 holds flat element x in
  // half x % 2; the whole warp calls it.
  template <int N_TILES>
  __device__ __forceinline__ static void transposed_values(const FwdParams& p, int bh, int r0,
                                                           int c0, int g, int t,
                                                           u32 (&v)[N_TILES / 2][4]) {
    const DropoutDraw d = draw(p);
#pragma unroll
    for (int m = 0; m < N_TILES / 2; ++m)
      d.transposed_values(u32(bh), u32(c0 / 16 + m), u32(r0 / 16), g, t, v[m]);
  }
  template <int B>
  __device__ __forceinline__ static float factor(const FwdParams& p, const u32 (&v)[B][4], int x) {
    const DropoutDraw d = draw(p);
    const u32 w = v[x / 8][(x % 8) / 2];
    return (x % 2 ? d.kept_high(w) : d.kept_low(w)) ? d.scale : 0.f;
  }
};

// ---------------------------------------------------------------------------
// The variant

template <class BandT, class LogitsT = PlainLogits, class DenseT = NoDense,
          class SeqsT = FixedSeqs, class DropT = NoDropout>
struct Variant {
  using Band = BandT;
  using Logits = LogitsT;
  using Dense = DenseT;
  using Seqs = SeqsT;
  using Drop = DropT;
  // The max-free softmax (flash_wgmma: softmax_fast) needs no property of the
  // scores beyond being finite or -inf; every variant here keeps it valid.
  static constexpr bool kFastSoftmax = true;
  // It pays off only while a key tile's scores rarely rise 128 (exp2 domain) above
  // the row's maximum so far, or the tile is computed again from global memory. A
  // computed bias that peaks at the diagonal (ALiBi: slope * 128 * log2 e across a
  // tile of 128 keys, up to 92) would lift nearly every tile of an ascending walk past
  // it (0.09x the plain kernel, causal D = 128, H100); those variants walk the key
  // tiles from the diagonal outward (flash_wgmma's TileScheduler::key_block).
  static constexpr bool kDiagonalFirst = DenseT::enabled && !DenseT::reads;
  static constexpr bool kCausal = BandT::kHi;  // heaviest query tiles last: schedule them first
  // A computed bias that is a line in the key on either side of the diagonal
  // (Dense::kLinear: ALiBi), taken as one (line_side: which side a block lies on, 0
  // none; Scores::shifted_line) without a logits transform: beside softcap's two MUFU
  // operations per score the line saves little, and its code path spilled 8 bytes
  // (flash_wgmma D = 64 causal, the ordered backward at D = 128).
  static constexpr bool kLinearBias = DenseT::kLinear && !LogitsT::kTransform;
  static constexpr bool kTransform = LogitsT::kTransform || DenseT::enabled;

  __device__ __forceinline__ static int kv_begin(const FwdParams& p, int q_first) {
    return BandT::row_begin(p, q_first);
  }
  __device__ __forceinline__ static int kv_end(const FwdParams& p, int q_last) {
    return BandT::row_end(p, q_last);
  }
  // Query rows [q_begin, q_end) that see a key of [k_first, k_last], clipped to [0, Sq].
  __device__ __forceinline__ static int q_begin(const FwdParams& p, int k_first) {
    return cmax(0, BandT::col_begin(p, k_first));
  }
  __device__ __forceinline__ static int q_end(const FwdParams& p, int k_last) {
    return cmin(p.seqlen_q, BandT::col_end(p, k_last));
  }
  __device__ __forceinline__ static bool partial(const FwdParams& p, int q_first, int q_last,
                                                 int k_first, int k_last) {
    return DenseT::reads || k_last >= p.seqlen_k ||
           !BandT::covers(p, q_first, q_last, k_first, k_last);
  }
  __device__ __forceinline__ static float line_side(const FwdParams& p, int q_first, int q_last,
                                                    int k_first, int k_last) {
    if constexpr (kLinearBias) return DenseT::side(p, q_first, q_last, k_first, k_last);
    return 0.f;
  }
  // Key j lies in row i's band and below Sk (the dense mask is score's business).
  // Unclipped bounds: j >= 0 always and j < Sk is tested once, so a causal element
  // costs two compares (row_begin/row_end's clamps would add four instructions per
  // element wherever a kernel selects without branching).
  __device__ __forceinline__ static bool keep(const FwdParams& p, int i, int j) {
    return j < p.seqlen_k && (!BandT::kLo || j >= i + p.band_lo) &&
           (!BandT::kHi || j <= i + p.band_hi);
  }
  // The score in the exp2 domain of query i, key j of the head whose dense state
  // is `hd` (DenseT::head(p, b, h)): logits, then the dense mask or bias (EXACT as
  // PlainLogits says).
  using Head = typename DenseT::Head;
  template <bool EXACT = false>
  __device__ __forceinline__ static float score(const FwdParams& p, Head hd, int i, int j,
                                                float dot) {
    const float s2 = LogitsT::template s2<EXACT>(p, dot);
    return DenseT::enabled ? DenseT::apply(p, hd, i, j, s2) : s2;
  }
  template <bool EXACT = false>
  __device__ __forceinline__ static float score(const FwdParams& p, int b, int h, int i, int j,
                                                float dot) {
    return score<EXACT>(p, DenseT::head(p, b, h), i, j, dot);
  }
  // score(...) + shift (the exp2's argument against a row reference, shift = -m or
  // -lse2): without a mask read from memory the logits take the shift into their
  // last FMA, with a computed bias added to it first (Logits::shifted: FMA(dot,
  // scale, bias + shift) for plain logits).
  __device__ __forceinline__ static float shifted(const FwdParams& p, Head hd, int i, int j,
                                                  float dot, float shift) {
    if constexpr (DenseT::reads) return score(p, hd, i, j, dot) + shift;
    return LogitsT::shifted(p, dot, DenseT::enabled ? DenseT::apply(p, hd, i, j, shift) : shift);
  }
  // The logits' s2 from the score s2 (a computed bias taken back out): what a
  // backward that recovers the score from P needs for Logits::grad.
  __device__ __forceinline__ static float logits_of_score(const FwdParams& p, Head hd, int i,
                                                          int j, float s2) {
    static_assert(!DenseT::reads, "a dense mask read from memory cannot be taken back out");
    if constexpr (DenseT::enabled) return DenseT::unapply(p, hd, i, j, s2);
    return s2;
  }
};

// The variants of a kernel family without dense masks.
using NoCausal = Variant<NoBand>;
using Causal = Variant<CausalBand>;

// ---------------------------------------------------------------------------
// Applying a variant to the scores one thread holds

// The scores of one thread: ROWS x COLS elements of a tile. Element (r, c) lies at
// tile row row(r) and tile column col_lane + col(c), where col(c) is a compile-time
// constant. Layouts:
//   MmaFrag<N>   the C fragment of mma.m16n8 (and of wgmma m64nN, per warp) over
//                N n8 column groups: x[nt * 4 + 2 r + e] is row g + 8 r, column
//                8 nt + 2 t + e (g = lane / 4, t = lane % 4); ROWS = 2, COLS = 2 N
//   GridFrag<TM, TN, SM, SN>  the CUDA-core kernels' grid: x[r][c] is row
//                row_lane + SM r, column col_lane + SN c
template <int N_TILES>
struct MmaFrag {
  static constexpr int ROWS = 2, COLS = 2 * N_TILES;
  static constexpr bool kMma = true;   // the layout dropout's keep bits follow
  int row_lane, col_lane;  // g, 2t
  __device__ __forceinline__ explicit MmaFrag(int lane) : row_lane(lane / 4), col_lane(2 * (lane % 4)) {}
  __device__ __forceinline__ static constexpr int row(int r) { return 8 * r; }
  __device__ __forceinline__ static constexpr int col(int c) { return 8 * (c / 2) + c % 2; }
  // Index into a flat fragment (s[N_TILES * 4]).
  __device__ __forceinline__ static constexpr int at(int r, int c) { return (c / 2) * 4 + 2 * r + c % 2; }
};

template <int TM, int TN, int SM, int SN>
struct GridFrag {
  static constexpr int ROWS = TM, COLS = TN;
  static constexpr bool kMma = false;
  int row_lane, col_lane;
  __device__ __forceinline__ GridFrag(int row_lane_, int col_lane_)
      : row_lane(row_lane_), col_lane(col_lane_) {}
  __device__ __forceinline__ static constexpr int row(int r) { return SM * r; }
  __device__ __forceinline__ static constexpr int col(int c) { return SN * c; }
  __device__ __forceinline__ static constexpr int at(int r, int c) { return r * TN + c; }
};

template <class V, bool EXACT = false>
struct ScoreOp;
template <class LogitsT>
__device__ __forceinline__ float logits_grad_of_score(const FwdParams& p, float s2);

template <class V>
struct Scores {
  // x(r, c) = partial && (r, c) is masked (outside the band, key past Sk or query
  // past Sq) ? fill : op(x(r, c), r, c, i, j) for every
  // element of fragment `f`, whose tile corner is query i0, key j0. With TRANSPOSED
  // the fragment's rows are keys and its columns queries (the backward's S^T).
  // `at(idx)` returns a reference to flat element idx = Frag::at(r, c); `op` maps
  // the raw dot product (ScoreOp below). It runs on every element and the masked
  // ones are selected away, except under a dense mask, whose op reads memory and
  // runs on kept elements only.
  template <bool TRANSPOSED = false, class Frag, class At, class Op>
  __device__ __forceinline__ static void map(const Frag& f, At&& at, const FwdParams& p, int i0,
                                             int j0, bool partial, float fill, Op&& op) {
    const int row_base = (TRANSPOSED ? j0 : i0) + f.row_lane;
    const int col_base = (TRANSPOSED ? i0 : j0) + f.col_lane;
    if (!partial) {  // a branch, so an unmasked tile runs no compare
#pragma unroll
      for (int r = 0; r < Frag::ROWS; ++r)
#pragma unroll
        for (int c = 0; c < Frag::COLS; ++c) {
          float& x = at(Frag::at(r, c));
          const int row = row_base + Frag::row(r), col = col_base + Frag::col(c);
          x = op(x, r, c, TRANSPOSED ? col : row, TRANSPOSED ? row : col);
        }
      return;
    }
    // A row of S^T (a key) has a lower bound on its queries where the band has an
    // upper bound on keys, and the other way round.
    constexpr bool kLower = TRANSPOSED ? V::Band::kHi : V::Band::kLo;
#pragma unroll
    for (int r = 0; r < Frag::ROWS; ++r) {
      const int row = row_base + Frag::row(r);
      // The row's kept columns, relative to the fragment's first column: [lo, hi).
      // Queries past Sq (tile padding) keep nothing: their zero-filled q meets a
      // NaN key as NaN, which must not reach dK through a P that is not 0.
      int lo, hi;
      if constexpr (TRANSPOSED) {
        lo = V::Band::col_begin(p, row) - col_base;
        hi = (row < p.seqlen_k ? cmin(V::Band::col_end(p, row), p.seqlen_q) : -(1 << 30)) -
             col_base;
      } else {
        lo = V::Band::row_begin(p, row) - col_base;
        hi = row < p.seqlen_q ? V::Band::row_end(p, row) - col_base : -(1 << 30);
      }
#pragma unroll
      for (int c = 0; c < Frag::COLS; ++c) {
        const int cc = Frag::col(c);
        float& x = at(Frag::at(r, c));
        const int col = col_base + cc;
        const int i = TRANSPOSED ? col : row, j = TRANSPOSED ? row : col;
        const bool kept = (!kLower || cc >= lo) && cc < hi;
        if constexpr (V::Dense::reads) {
          x = kept ? op(x, r, c, i, j) : fill;  // op reads the mask: in bounds only
        } else {
          // op computed for every element, then selected: no branch, and the same
          // instruction stream as the unmasked tiles' (ptxas schedules it alike)
          const float y = op(x, r, c, i, j);
          x = kept ? y : fill;
        }
      }
    }
  }
  // map's result in the shape the CUDA-core and mma.sync kernels want: without a
  // dense mask, op runs once on every element (one copy of it in the code) and a
  // partial tile then selects its masked elements to fill; with a dense mask, map
  // (op reads memory: kept elements only). One copy of op keeps the plain kernels'
  // register allocation (map's two copies spill flash_mma at D = 128); the
  // backward's p_ds is the other way round.
  template <bool TRANSPOSED = false, class Frag, class At, class Op>
  __device__ __forceinline__ static void apply(const Frag& f, At&& at, const FwdParams& p, int i0,
                                               int j0, bool partial, float fill, Op&& op) {
    if constexpr (V::Dense::reads) {
      map<TRANSPOSED>(f, at, p, i0, j0, partial, fill, op);
    } else {
      map<TRANSPOSED>(f, at, p, i0, j0, false, fill, op);
      if (partial)
        map<TRANSPOSED>(f, at, p, i0, j0, true, fill, [](float x, int, int, int, int) { return x; });
    }
  }

  // x = op(V::shifted(x) with shift(r)) for every element of fragment `f` (tile
  // corner query i0, key j0) of a block without masked elements whose rows and keys
  // lie on one side `side` of the diagonal (V::line_side != 0): the bias of each row
  // is then a line in the key (Dense::line), one FFMA per score with a compile-time
  // column offset.
  template <class Frag, class At, class Shift, class Op>
  __device__ __forceinline__ static void shifted_line(const Frag& f, At&& at, const FwdParams& p,
                                                      typename V::Head hd, int i0, int j0,
                                                      float side, Shift&& shift, Op&& op) {
    static_assert(V::kLinearBias, "a bias that is a line in the key");
#pragma unroll
    for (int r = 0; r < Frag::ROWS; ++r) {
      const int i = i0 + f.row_lane + Frag::row(r);
      const auto line =
          V::Dense::line(hd, float(V::Dense::offset(p, i, j0 + f.col_lane)), side, shift(r));
#pragma unroll
      for (int c = 0; c < Frag::COLS; ++c) {
        float& x = at(Frag::at(r, c));
        x = op(V::Logits::shifted(p, x, fmaf(line.b, float(Frag::col(c)), line.a)));
      }
    }
  }

  // The forward's scores of one fragment: x = V::score(x) in the exp2 domain, -inf
  // where masked (EXACT as PlainLogits says).
  template <bool EXACT = false, class Frag, class At>
  __device__ __forceinline__ static void forward(const Frag& f, At&& at, const FwdParams& p, int b,
                                                 int h, int i0, int j0, bool partial) {
    if constexpr (V::kLinearBias && !EXACT) {  // off the diagonal: a line per row
      const int row = i0 + f.row_lane, col = j0 + f.col_lane;
      const float side =
          partial ? 0.f
                  : V::line_side(p, row + Frag::row(0), row + Frag::row(Frag::ROWS - 1),
                                 col + Frag::col(0), col + Frag::col(Frag::COLS - 1));
      if (side != 0.f) {
        shifted_line(f, at, p, V::Dense::head(p, b, h), i0, j0, side, [](int) { return 0.f; },
                     [](float x) { return x; });
        return;
      }
    }
    apply(f, at, p, i0, j0, partial, -CA_INF, ScoreOp<V, EXACT>{p, b, h});
  }

  // The backward's P and dS of one fragment, from the raw dot products in `s` and dP
  // in `dp` (the same layout): P = exp2(score(dot) - lse2), dS = P (dP - delta)
  // d s / d dot, the gradient of the raw dot before the final
  // multiplication by scale. Both are 0 where the variant masks the element and dS is 0 where P is
  // (selected, not multiplied: NaN in a masked-out V stays out). P replaces the dot
  // in `s`, dS replaces dP. lse2(r, c), delta(r, c): the statistics of element (r,
  // c)'s query (lse2 = +inf for rows that attend nothing or lie past Sq).
  // SCORE_GRAD: d s / d dot may come from the score (kScoreGrad; a kernel at its
  // register limit turns it off).
  template <bool TRANSPOSED = false, bool SCORE_GRAD = true, class Frag, class AtS, class AtDp,
            class Lse, class Delta>
  __device__ __forceinline__ static void p_ds(const Frag& f, AtS&& s, AtDp&& dp,
                                              const FwdParams& p, int b, int h, int i0, int j0,
                                              bool partial, Lse&& lse2, Delta&& delta) {
    // Dropout (V::Drop): out = (P fac) V with fac = keep / (1 - p) (0 where dropped),
    // so dS = P (fac dP - delta) with dP = dout V^T as given, and the P left in `s`
    // for dV is P fac (after dS is masked by P itself, which dropping leaves alone).
    // Transposed, the elements' 16-bit values (one draw a block, no flags: 4 words).
    static_assert(!V::Drop::enabled || Frag::kMma, "dropout draws for mma C fragments");
    constexpr int BLOCKS = V::Drop::enabled ? Frag::COLS / 4 : 1;
    using Draws = typename SelectType<TRANSPOSED, u32[BLOCKS][4], u32[BLOCKS]>::type;
    Draws bits;
    if constexpr (V::Drop::enabled && TRANSPOSED)
      V::Drop::template transposed_values<Frag::COLS / 2>(p, b * p.heads_q + h, j0, i0,
                                                          f.row_lane, f.col_lane / 2, bits);
    else if constexpr (V::Drop::enabled)
      V::Drop::template keep_bits<false, Frag::COLS / 2>(p, b * p.heads_q + h, i0, j0,
                                                         f.row_lane, f.col_lane / 2, bits);
    const auto op = [&](float dot, int r, int c, int i, int j) {
      // d s / d dot from the score (kScoreGrad) right away, so s2 and dot end there;
      // from the dot, last (computed early, it spilled flash_wgmma_bwd_dq with
      // softcap, ALiBi and dropout at D = 192)
      float grad = 1.f, pij;
      if constexpr (kScoreGrad<Frag, SCORE_GRAD>) {
        const float s2 = row_score(p, b, h, i, j, dot);
        grad = logits_grad_of_score<typename V::Logits>(p, s2);
        pij = fast_exp2(s2 - lse2(r, c));
      } else {
        pij = fast_exp2(row_score(p, b, h, i, j, dot) - lse2(r, c));
      }
      float& y = dp(Frag::at(r, c));
      float dpij = y;
      if constexpr (V::Drop::enabled) dpij = V::Drop::factor(p, bits, Frag::at(r, c)) * y;
      if constexpr (kScoreGrad<Frag, SCORE_GRAD>) y = pij * (dpij - delta(r, c)) * grad;
      else y = pij * (dpij - delta(r, c)) * V::Logits::grad(p, dot);
      return pij;
    };
    // map, not apply: its per-branch copies keep the mma backward's registers lower
    // (apply spills flash_mma_bwd_dkdv at D = 112). Outside partial tiles P = 0 only
    // by underflow or on rows past Sq, whose zero-filled dout and delta make dP -
    // delta = 0 (every key there lies below Sk): dS needs no select.
    if (partial) {
      map<TRANSPOSED>(f, s, p, i0, j0, true, 0.f, op);
#pragma unroll
      for (int r = 0; r < Frag::ROWS; ++r)
#pragma unroll
        for (int c = 0; c < Frag::COLS; ++c) {
          float& y = dp(Frag::at(r, c));
          y = s(Frag::at(r, c)) == 0.f ? 0.f : y;  // masked (P selected to 0), not dropped
        }
    } else {
      map<TRANSPOSED>(f, s, p, i0, j0, false, 0.f, op);
    }
    if constexpr (V::Drop::enabled) {
#pragma unroll
      for (int x = 0; x < Frag::ROWS * Frag::COLS; ++x)
        s(x) = V::Drop::factor(p, bits, x) * s(x);
    }
  }

  // Whether p_ds takes d s / d dot from the score s2 (exp2 domain) rather than the raw
  // dot: on the tensor-core fragments, for a transform without a bias (softcap:
  // 1 - tanh^2 with tanh = s2 / (c log2 e), an FMA and a multiplication where a
  // second tanh took two MUFU operations a score). Elsewhere from the dot: the
  // CUDA-core kernels keep their fp32 accuracy, and a bias would have to come out of
  // s2 first.
  template <class Frag, bool FROM_SCORE>
  static constexpr bool kScoreGrad =
      FROM_SCORE && Frag::kMma && V::Logits::kTransform && !V::Dense::enabled;

  // V::score of query i, key j; a row past Sq (tile padding, never stored) skips a
  // dense mask read from memory, which must not be read there.
  template <bool EXACT = false>
  __device__ __forceinline__ static float row_score(const FwdParams& p, int b, int h, int i,
                                                    int j, float dot) {
    return !V::Dense::reads || i < p.seqlen_q
               ? V::template score<EXACT>(p, b, h, i, j, dot)
               : V::Logits::template s2<EXACT>(p, dot);
  }
};

// The forward's op for Scores<V>::map: the score s2 of query i, key j.
template <class V, bool EXACT>
struct ScoreOp {
  const FwdParams& p;
  int b, h;
  __device__ __forceinline__ float operator()(float dot, int, int, int i, int j) const {
    return Scores<V>::template row_score<EXACT>(p, b, h, i, j, dot);
  }
};

// d s / d dot from the score itself, s2 (exp2 domain, no dense mask applied): what a
// backward that keeps P rather than the raw dot needs (s2 = log2 P + lse2).
template <class LogitsT>
__device__ __forceinline__ float logits_grad_of_score(const FwdParams& p, float s2);
template <>
__device__ __forceinline__ float logits_grad_of_score<PlainLogits>(const FwdParams&, float) {
  return 1.f;
}
// Softcap: s2 = c tanh(x) log2 e, so tanh(x) = s2 / softcap_log2 and d s / d dot =
// 1 - tanh^2 (Softcap::grad's value). A multiplication by the param 1 / softcap_log2,
// not a division: an IEEE division per score is a dozen instructions and a branch.
template <>
__device__ __forceinline__ float logits_grad_of_score<Softcap>(const FwdParams& p, float s2) {
  const float t = s2 * p.softcap_rlog2;
  return fmaf(-t, t, 1.f);
}
