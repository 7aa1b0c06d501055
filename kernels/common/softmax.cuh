// Online softmax state of one query row, in the exp2 domain.
//
// Scores arrive already multiplied by scale*log2(e) (`s2`), so p = exp2(s2 - m_i)
// equals exp(s*scale - m_i*ln2): the tensor-core kernel computes it with one `ex2`
// instruction per score, the CUDA-core kernels with the exact exp2f. The per-row
// rescale and lse here are rare, so they take the exact functions.
//   m_i  running row max of s2        l_i  running sum of exp2(s2 - m_i)
// Processing a tile:  alpha = rescale(tile_max);  acc *= alpha;   (or rescale_lazy)
//                     p = exp2(s2 - ref());       l_i += sum(p);  acc += p V
// Finish:             out = acc * inv_l();        lse = lse()
//
// Hazard: a row whose scores so far are all masked has m_i = -inf, and
// -inf - -inf would give NaN; ref() uses 0 instead, so exp2(-inf - 0) = 0.
// A row masked to the end keeps l_i = 0: inv_l() gives 0 (output exactly 0) and
// lse() gives -inf. NaN in an attended score propagates (fmaxf skips it, but
// exp2(NaN) makes l_i NaN).
#pragma once
#include "types.cuh"

struct SoftmaxRow {
  float m_i;
  float l_i;

  __device__ __forceinline__ void init() {
    m_i = -CA_INF;
    l_i = 0.f;
  }
  __device__ __forceinline__ float ref() const { return m_i == -CA_INF ? 0.f : m_i; }

  // Raise the running max to cover a new tile; returns the factor that rescales
  // the accumulator (l_i is rescaled here).
  __device__ __forceinline__ float rescale(float tile_max) {
    float m_new = fmaxf(m_i, tile_max);
    float alpha = exact_exp2(m_i - (m_new == -CA_INF ? 0.f : m_new));
    m_i = m_new;
    l_i *= alpha;
    return alpha;
  }
  // rescale(), but m_i stays put while the tile's max exceeds it by at most
  // LAZY_MARGIN (FlashAttention-4's conditional rescaling): p = exp2(s2 - m_i) then
  // reaches 2^LAZY_MARGIN = 256, harmless in fp32 and in 16-bit P, and the factor
  // is exactly 1, so a caller can skip multiplying its accumulator. m_i only
  // serves as the reference of the exponent: out and lse come out the same. An
  // empty row (m_i = -inf) keeps alpha = 1 for an all-masked tile (acc and l_i are 0).
  static constexpr float LAZY_MARGIN = 8.f;
  static constexpr float LAZY_BOUND = 256.f;  // 2^LAZY_MARGIN: the largest p it allows
  __device__ __forceinline__ float rescale_lazy(float tile_max) {
    return tile_max <= m_i + LAZY_MARGIN ? 1.f : rescale(tile_max);
  }
  // Without a max at all: p = exp2(s2 - m_i) for a tile, against the current m_i
  // (finite, so l_i >= 1 already holds the p = 1 of the score that set it), is
  // exactly what rescale_lazy would have kept if every p <= LAZY_BOUND, and a sum of
  // them <= LAZY_BOUND proves that (p >= 0; a NaN or inf fails the test). A caller
  // whose sum fails must move m_i (flash_wgmma.cu: settle_fast).
  __device__ __forceinline__ float inv_l() const { return l_i == 0.f ? 0.f : 1.f / l_i; }
  __device__ __forceinline__ float lse() const {
    return l_i == 0.f ? -CA_INF : (m_i + exact_log2(l_i)) * CA_LN2;
  }
};

// Butterfly reductions over `WIDTH` consecutive lanes (a power of two <= 32).
template <int WIDTH>
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

template <int WIDTH, class V>
__device__ __forceinline__ V group_sum(V x) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// The online softmax of the two rows (g and g + 8) one thread holds of an m16 C
// fragment of N_TILES n8 column groups (common/variant.cuh: MmaFrag, element
// s[nt * 4 + 2 r + e]), as flash_wgmma's consumers run it. Per key tile, one of:
//   online(s, scale, exact)  scores s * scale (masked ones already -inf), a row max
//                            (lazy unless exact), p = exp2(s * scale - m_i) in place;
//                            alpha = the accumulator's rescale factors
//   fast(s, scale, sum)      no max at all (SoftmaxRow::LAZY_BOUND): p = exp2(s * scale
//                            - m_i) in place for rows whose m_i is finite, this
//                            thread's row sums in `sum`; false if a sum fails the
//                            bound, then settle(s, sum), else commit(sum)
//   settle(s, sum)           a fast tile that failed its bound: each row's largest p
//                            becomes its new reference; false if a p overflowed (the
//                            scores are lost: the caller recomputes them and runs
//                            online(.., exact = true))
// then rescale(acc) before the next P V, and at the end finish() (row sums across the
// quad), inv_l(r), lse(r).
template <int N_TILES>
struct FragSoftmax {
  SoftmaxRow row[2];
  float alpha[2];  // acc rescale factors of rows g, g + 8 for the current tile

  __device__ __forceinline__ static float& at(float (&s)[N_TILES * 4], int r, int nt, int e) {
    return s[nt * 4 + 2 * r + e];
  }
  __device__ __forceinline__ void init() {
    row[0].init();
    row[1].init();
  }
  // Row r: p = exp2(s * scale - ref) in place; returns this thread's part of the row sum.
  __device__ __forceinline__ static float exp_row(float (&s)[N_TILES * 4], int r, float scale,
                                                  float neg_ref) {
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt) {
      at(s, r, nt, 0) = fast_exp2(fmaf(at(s, r, nt, 0), scale, neg_ref));
      at(s, r, nt, 1) = fast_exp2(fmaf(at(s, r, nt, 1), scale, neg_ref));
      sum += at(s, r, nt, 0) + at(s, r, nt, 1);
    }
    return sum;
  }
  __device__ __forceinline__ static float row_max(const float (&s)[N_TILES * 4], int r, float init) {
    float mx = init;
#pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt)
      mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
    return group_max<4>(mx);
  }

  __device__ __forceinline__ void online(float (&s)[N_TILES * 4], float scale, bool exact) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float tile_max = row_max(s, r, -CA_INF) * scale;
      alpha[r] = exact ? row[r].rescale(tile_max) : row[r].rescale_lazy(tile_max);
      row[r].l_i += exp_row(s, r, scale, -row[r].ref());
    }
  }
  // online(s, scale, !lazy) in two halves, for a caller that rescales its
  // accumulator between them (fewer registers live at once: flash_mma). Both, like
  // online, take the max of s before scaling it: a scale below 0 would make it the
  // min, so callers pass negative scales as scores (scale 1).
  __device__ __forceinline__ void maxes(const float (&s)[N_TILES * 4], float scale, bool lazy) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float tile_max = row_max(s, r, -CA_INF) * scale;
      alpha[r] = lazy ? row[r].rescale_lazy(tile_max) : row[r].rescale(tile_max);
    }
  }
  __device__ __forceinline__ void exps(float (&s)[N_TILES * 4], float scale) {
#pragma unroll
    for (int r = 0; r < 2; ++r) row[r].l_i += exp_row(s, r, scale, -row[r].ref());
  }
  __device__ __forceinline__ bool fast(float (&s)[N_TILES * 4], float scale, float (&sum)[2]) {
    bool ok = true;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] = exp_row(s, r, scale, -row[r].m_i);
      ok = ok && sum[r] <= SoftmaxRow::LAZY_BOUND;
    }
    return ok;
  }
  // fast()'s sums of a tile whose p were computed (and masked p selected to 0) by the caller.
  __device__ __forceinline__ static bool sums(const float (&s)[N_TILES * 4], float (&sum)[2]) {
    bool ok = true;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] = 0.f;
#pragma unroll
      for (int nt = 0; nt < N_TILES; ++nt) sum[r] += s[nt * 4 + 2 * r] + s[nt * 4 + 2 * r + 1];
      ok = ok && sum[r] <= SoftmaxRow::LAZY_BOUND;
    }
    return ok;
  }
  __device__ __forceinline__ void commit(const float (&sum)[2]) {
    row[0].l_i += sum[0];
    row[1].l_i += sum[1];
    alpha[0] = alpha[1] = 1.f;
  }
  // A row's largest p gives its new reference m_i + log2(p_max); its p, l_i and acc
  // scale by 1 / p_max (alpha).
  __device__ __forceinline__ bool settle(float (&s)[N_TILES * 4], float (&sum)[2]) {
    float pmax[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) pmax[r] = row_max(s, r, 0.f);
    if (__any_sync(0xffffffffu, pmax[0] == CA_INF || pmax[1] == CA_INF)) return false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float a = 1.f;
      if (pmax[r] > SoftmaxRow::LAZY_BOUND) {
        const float shift = exact_log2(pmax[r]);
        a = exact_exp2(-shift);
        row[r].m_i += shift;
        sum[r] = 0.f;
#pragma unroll
        for (int nt = 0; nt < N_TILES; ++nt) {
          at(s, r, nt, 0) *= a;
          at(s, r, nt, 1) *= a;
          sum[r] += at(s, r, nt, 0) + at(s, r, nt, 1);
        }
      }
      row[r].l_i = row[r].l_i * a + sum[r];
      alpha[r] = a;
    }
    return true;
  }
  // acc *= alpha for an accumulator of D_TILES n8 groups (same fragment rows); with
  // SKIP, skipped when no row of the warp moved its max (the lazy max's common case;
  // under an exact max the vote rarely pays).
  template <bool SKIP = true, int ACC>
  __device__ __forceinline__ void rescale(float (&acc)[ACC]) const {
    if (!SKIP || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < ACC; ++i) acc[i] *= alpha[(i % 4) / 2];
    }
  }
  __device__ __forceinline__ void finish() {
    row[0].l_i = group_sum<4>(row[0].l_i);
    row[1].l_i = group_sum<4>(row[1].l_i);
  }
};
