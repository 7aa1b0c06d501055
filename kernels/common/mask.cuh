// Mask policies. A forward kernel takes two: a causal policy and a dense policy.
//
// Causal policies (bottom-right aligned: query i keeps key j iff j <= i + offset,
// offset = Sk - Sq):
//   keep(i, j, offset)              element test
//   k_end(q_last, Sk, offset)       one past the last key any query <= q_last keeps
//   needs_mask(q_first, k_last, o)  false when a whole tile is kept (no per-element work)
//
// Dense policies (a user mask broadcast to [B, Hq, Sq, Sk]):
//   apply(p, b, h, i, j, s2)        the score in the exp2 domain after masking;
//                                   -inf means "not attended"
// Scores are selected, never multiplied, so NaN/Inf in masked K stays out.
#pragma once
#include "params.cuh"

struct NoCausal {
  static constexpr bool enabled = false;
  __device__ __forceinline__ static bool keep(int, int, int) { return true; }
  __device__ __forceinline__ static int k_end(int, int seqlen_k, int) { return seqlen_k; }
  __device__ __forceinline__ static bool needs_mask(int, int, int) { return false; }
};

struct Causal {
  static constexpr bool enabled = true;
  __device__ __forceinline__ static bool keep(int i, int j, int offset) { return j <= i + offset; }
  __device__ __forceinline__ static int k_end(int q_last, int seqlen_k, int offset) {
    int end = q_last + offset + 1;
    return end < 0 ? 0 : (end < seqlen_k ? end : seqlen_k);
  }
  __device__ __forceinline__ static bool needs_mask(int q_first, int k_last, int offset) {
    return k_last > q_first + offset;
  }
};

struct NoDense {
  static constexpr bool enabled = false;
  __device__ __forceinline__ static float apply(const FwdParams&, int, int, int, int, float s2) {
    return s2;
  }
};

__device__ __forceinline__ i64 mask_offset(const FwdParams& p, int b, int h, int i, int j) {
  return b * p.mask_batch_stride + h * p.mask_head_stride + i * p.mask_row_stride +
         j * p.mask_col_stride;
}

struct BoolDense {
  static constexpr bool enabled = true;
  __device__ __forceinline__ static float apply(const FwdParams& p, int b, int h, int i, int j,
                                                float s2) {
    const u8* m = static_cast<const u8*>(p.mask);
    return m[mask_offset(p, b, h, i, j)] ? s2 : -CA_INF;
  }
};

struct AddDense {
  static constexpr bool enabled = true;
  __device__ __forceinline__ static float apply(const FwdParams& p, int b, int h, int i, int j,
                                                float s2) {
    const float* m = static_cast<const float*>(p.mask);
    float bias = m[mask_offset(p, b, h, i, j)];
    // A -inf bias is "not attended" even where s2 is +inf or NaN.
    return bias == -CA_INF ? -CA_INF : s2 + bias * CA_LOG2E;
  }
};
