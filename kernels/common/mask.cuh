// Dense mask policies, the third part of a variant (common/variant.cuh): a user
// mask broadcast to [B, Hq, Sq, Sk], read per element.
//   apply(p, b, h, i, j, s2)        the score in the exp2 domain after masking;
//                                   -inf means "not attended"
// Scores are selected, never multiplied, so NaN/Inf in masked K stays out.
#pragma once
#include "params.cuh"

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
