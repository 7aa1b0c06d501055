// Forward-pass arguments, passed by value to every forward kernel.
//
// Tensors (strides in elements, last dimension contiguous):
//   q    [B, Hq,  Sq, D]   o   [B, Hq, Sq, D]   lse [B, Hq, Sq] float32 (natural log)
//   k, v [B, Hkv, Sk, D]
//   mask broadcast to [B, Hq, Sq, Sk] (stride 0 on broadcast axes): u8 (nonzero =
//        attend) or float32 (added to the scaled score)
// Both user layouts ([B,H,S,D] and [B,S,H,D]) are expressed by the strides alone.
// Query head h reads KV head h / group (group = Hq / Hkv; GQA and MQA).
//
// The Python mirror is cupy_attention/params.py; a CPU test checks that the two
// agree on every field offset.
#pragma once
#include "types.cuh"

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;           // null: LSE not requested
  const void* mask;     // null unless a dense mask policy is used
  float* scratch;       // [B, Hq, Sq, Sk] fp32 scores, for the O(S^2) kernels only
  // Packed sequences (RaggedSeqs, common/seqs.cuh): int32 [B + 1] prefix sums of the
  // query and key lengths; null otherwise.
  const i32* cu_seqlens_q;
  const i32* cu_seqlens_k;

  i64 q_batch_stride, q_head_stride, q_row_stride;
  i64 k_batch_stride, k_head_stride, k_row_stride;
  i64 v_batch_stride, v_head_stride, v_row_stride;
  i64 o_batch_stride, o_head_stride, o_row_stride;
  i64 mask_batch_stride, mask_head_stride, mask_row_stride, mask_col_stride;
  i64 lse_batch_stride, lse_head_stride;

  i32 batch, heads_q, heads_kv, group;
  i32 seqlen_q, seqlen_k, head_dim;
  // The band of keys row i sees (common/variant.cuh): i + band_lo <= j <= i + band_hi,
  // each bound read only by variants that have it. Causal, bottom-right aligned:
  // band_hi = seqlen_k - seqlen_q; a window (left, right) adds -left and right.
  i32 band_lo, band_hi;

  float scale;       // softmax scale (1/sqrt(D) by default)
  float scale_log2;     // scale * log2(e) rounded to fp32: scores live in the exp2 domain
  float scale_log2_lo;  // scale * log2(e) - scale_log2, so exp2_score rounds only once
  float softcap_scale;  // Softcap variant: scale / cap
  float softcap_log2;   // Softcap variant: cap * log2(e)
  float softcap_exp2;   // Softcap variant: 2 log2(e) scale / cap (tanh's ex2 argument per dot)
  float softcap_neg2;   // Softcap variant: -2 cap log2(e)
  float softcap_rlog2;  // Softcap variant: 1 / (cap log2(e))
  // AlibiBias (common/mask.cuh): fp32 slopes per query head, [Hq] (batch stride 0)
  // or [B, Hq]; null otherwise.
  const float* alibi_slopes;
  i64 alibi_batch_stride;
  // PhiloxDropout (common/dropout.cuh): the stream's key (seed words), offset, the
  // 16-bit drop threshold round(p * 65536) and 1 / (1 - threshold / 65536).
  u32 dropout_seed_lo, dropout_seed_hi, dropout_offset, dropout_threshold;
  float dropout_scale;
};

// dot * scale * log2(e) with a single rounding. The rounding of the constant alone
// would shift every score by a relative 2^-24: at |score| ~ 100 that is a 1e-5
// error in each probability, above an fp32 kernel's budget.
__device__ __forceinline__ float exp2_score(const FwdParams& p, float dot) {
  return fmaf(dot, p.scale_log2, dot * p.scale_log2_lo);
}

// Backward-pass arguments, passed by value to every backward kernel.
//
// `fwd` holds the forward problem unchanged (q, k, v, o = the forward output, lse
// as the forward wrote it, the mask, strides, sizes, scale), so the mask
// policies of common/mask.cuh apply to the backward as they are. Added tensors:
//   dout, dq  [B, Hq, Sq, D] (strided like q)    dk, dv [B, Hkv, Sk, D]
//   delta     [B, Hq, Sq] fp32: rowsum(dout * o); row (b, h) at b * delta_batch_stride
//             + h * delta_head_stride ([B, Hq, Sq] contiguous, or [Hq, total_q] for
//             packed sequences)
//   dq_accum  fp32, delta's rows times D: dQ / scale summed with atomics, or in a
//             fixed order (flash_wgmma_bwd's kDqOrdered, dq_turn_rows > 0: then
//             int32 turn counters [B, Hq, ceil(Sq / dq_turn_rows)] follow its B Hq Sq D
//             floats, zeroed by flash_bwd_delta with them: dq_turns; with
//             dq_store_first the first addition to each tile stores and only the
//             counters are zeroed); null in deterministic mode otherwise
//   dk_accum, dv_accum  fp32 [B, Hkv, Sk, D] contiguous, zeroed: dK and dV summed with
//             atomics when kv_splits > 1 blocks share a block of keys (flash_wgmma_bwd's
//             split of the query tiles); null otherwise
struct BwdParams {
  FwdParams fwd;
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* dq_accum;
  float* delta;
  float* dk_accum;
  float* dv_accum;

  i64 dout_batch_stride, dout_head_stride, dout_row_stride;
  i64 dq_batch_stride, dq_head_stride, dq_row_stride;
  i64 dk_batch_stride, dk_head_stride, dk_row_stride;
  i64 dv_batch_stride, dv_head_stride, dv_row_stride;
  i64 delta_batch_stride, delta_head_stride;
  int kv_splits;     // blocks per block of keys (1: one block owns it)
  int dq_turn_rows;  // query rows per turn counter (0: none; fixed-length sequences)
  int dq_store_first;  // the ordered dQ's first addition per tile stores: dq_accum unzeroed
  int dq_rotate;       // the ordered dQ's lockstep walk rotated per key block (full band)
};

// The turn counters behind dq_accum (dq_turn_rows > 0).
__device__ __forceinline__ int* dq_turns(const BwdParams& p) {
  const FwdParams& f = p.fwd;
  return reinterpret_cast<int*>(p.dq_accum + i64(f.batch) * f.heads_q * f.seqlen_q * f.head_dim);
}

// Row (b, h) of delta, and of dq_accum (times D).
__device__ __forceinline__ i64 delta_row(const BwdParams& p, int b, int h) {
  return b * p.delta_batch_stride + h * p.delta_head_stride;
}
