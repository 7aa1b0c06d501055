// Dense policies, the third part of a variant (common/variant.cuh): a mask or bias
// of every (query, key) element, applied to the score after the logits.
//   enabled                         the policy does anything
//   reads                           it reads memory per element (a user mask
//                                   broadcast to [B, Hq, Sq, Sk]): every tile is
//                                   partial and only kept elements are read. A
//                                   computed bias (ALiBi) reads nothing per element
//                                   and leaves the band's partial test alone.
//   Head, head(p, b, h)             what the policy needs of one (batch, head),
//                                   computed once: a kernel that holds a head's
//                                   tile for long (flash_wgmma's consumers) keeps
//                                   it in registers instead of recomputing b and h
//   apply(p, hd, i, j, s2)          the score in the exp2 domain after masking;
//                                   -inf means "not attended"
//   kLinear; side(), line()         (a computed bias only) the bias is a line in the
//                                   key on either side of the diagonal (ALiBi)
// Scores are selected, never multiplied, so NaN/Inf in masked K stays out.
#pragma once
#include "params.cuh"

struct NoDense {
  static constexpr bool enabled = false, reads = false, kLinear = false;
  struct Head {};
  __device__ __forceinline__ static Head head(const FwdParams&, int, int) { return {}; }
  __device__ __forceinline__ static float apply(const FwdParams&, Head, int, int, float s2) {
    return s2;
  }
};

// A user mask: Head is the offset of (b, h)'s [Sq, Sk] plane.
struct MaskHead {
  i64 base;
};
__device__ __forceinline__ MaskHead mask_head(const FwdParams& p, int b, int h) {
  return {b * p.mask_batch_stride + h * p.mask_head_stride};
}
__device__ __forceinline__ i64 mask_offset(const FwdParams& p, MaskHead hd, int i, int j) {
  return hd.base + i * p.mask_row_stride + j * p.mask_col_stride;
}

struct BoolDense {
  static constexpr bool enabled = true, reads = true, kLinear = false;
  using Head = MaskHead;
  __device__ __forceinline__ static Head head(const FwdParams& p, int b, int h) {
    return mask_head(p, b, h);
  }
  __device__ __forceinline__ static float apply(const FwdParams& p, Head hd, int i, int j,
                                                float s2) {
    const u8* m = static_cast<const u8*>(p.mask);
    return m[mask_offset(p, hd, i, j)] ? s2 : -CA_INF;
  }
};

struct AddDense {
  static constexpr bool enabled = true, reads = true, kLinear = false;
  using Head = MaskHead;
  __device__ __forceinline__ static Head head(const FwdParams& p, int b, int h) {
    return mask_head(p, b, h);
  }
  __device__ __forceinline__ static float apply(const FwdParams& p, Head hd, int i, int j,
                                                float s2) {
    const float* m = static_cast<const float*>(p.mask);
    float bias = m[mask_offset(p, hd, i, j)];
    // A -inf bias is "not attended" even where s2 is +inf or NaN.
    return bias == -CA_INF ? -CA_INF : s2 + bias * CA_LOG2E;
  }
};

// ALiBi (Press et al. 2022; BLOOM, MPT): the score of query i, key j gains
// -slope * |i + Sk - Sq - j| (FlashAttention's definition, bottom-right aligned like
// the causal band; per sequence under RaggedSeqs, whose bound params hold its
// lengths). The slope is per query head: alibi_slopes[b * alibi_batch_stride + h],
// fp32 ([Hq]: batch stride 0, or [B, Hq]); Head is it in the exp2 domain.
struct AlibiBias {
  static constexpr bool enabled = true, reads = false, kLinear = true;
  struct Head {
    float slope2;
  };
  __device__ __forceinline__ static Head head(const FwdParams& p, int b, int h) {
    return {__ldg(p.alibi_slopes + b * p.alibi_batch_stride + h) * CA_LOG2E};
  }
  __device__ __forceinline__ static float apply(const FwdParams& p, Head hd, int i, int j,
                                                float s2) {
    return fmaf(-hd.slope2, distance(p, i, j), s2);
  }
  // kLinear: on one side of the diagonal the bias is a line in the key. side() of
  // rows [i_first, i_last] x keys [j_first, j_last]: +1 where every key lies at or
  // left of every row's diagonal (j <= i + Sk - Sq), -1 at or right of it, 0 where
  // the diagonal crosses them. line(): row i's bias + shift over the keys j0 + c of
  // such a block, a + b c, from off = offset(p, i, j0) as a float (a kernel that
  // walks many rows adds compile-time steps to one conversion); one FFMA with a
  // compile-time c per score (Scores::shifted_line) where apply spends four
  // instructions.
  __device__ __forceinline__ static float side(const FwdParams& p, int i_first, int i_last,
                                               int j_first, int j_last) {
    return offset(p, i_first, j_last) >= 0 ? 1.f : offset(p, i_last, j_first) <= 0 ? -1.f : 0.f;
  }
  __device__ __forceinline__ static int offset(const FwdParams& p, int i, int j) {
    return i - j + (p.seqlen_k - p.seqlen_q);
  }
  struct Line {
    float a, b;
  };
  __device__ __forceinline__ static Line line(Head hd, float off, float side, float shift) {
    const float b = side * hd.slope2;  // |offset(i, j0 + c)| = side (off - c)
    return {fmaf(-b, off, shift), b};
  }
  // The score before the bias: what a backward that recovers the logits from P
  // (s2 = log2 P + lse2) needs under a logits transform.
  __device__ __forceinline__ static float unapply(const FwdParams& p, Head hd, int i, int j,
                                                  float s2) {
    return fmaf(hd.slope2, distance(p, i, j), s2);
  }

 private:
  // |i + Sk - Sq - j| as a float with no int-to-float conversion per element (those
  // issue at a quarter of the FP32 rate on sm_80/sm_90, beside the softmax's exp2):
  // the integer x is added into the mantissa of 1.5 * 2^23, exact for |x| < 2^22
  // (the host refuses longer sequences), and i - j + const folds into that add.
  __device__ __forceinline__ static float distance(const FwdParams& p, int i, int j) {
    const int x = offset(p, i, j);
    return fabsf(__int_as_float(0x4B400000 + x) - 12582912.f);
  }
};
