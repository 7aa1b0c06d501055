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
