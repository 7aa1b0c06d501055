// naive: attention in three plain kernels through a full score matrix in global
// memory. The debugging baseline of the ladder: O(Sq*Sk) extra memory, no reuse
// of anything through shared memory, one thread per output element.
//
// Layouts: see common/params.cuh. scratch is [B, Hq, Sq, Sk] fp32, contiguous.
// Steps:
//   1. naive_scores   scratch[b,h,i,j] = mask(q_i . k_j * scale * log2e)   (exp2 domain)
//   2. naive_softmax  per row: m = max, l = sum exp2(s - m); scratch <- p = exp2(s - m) / l;
//                     lse = (m + log2 l) * ln2
//   3. naive_pv       out[b,h,i,d] = sum_j p[i,j] * v[j,d]   (p = 0 terms skipped)
// Grid: x covers the row (or row*col) index, y = query head, z = batch.
// Constraints: any head dim (the loops run over D in global memory).
#include "common/variant.cuh"
#include "common/softmax.cuh"

__device__ __forceinline__ i64 score_row(const FwdParams& p, int b, int h, int i) {
  return ((i64(b) * p.heads_q + h) * p.seqlen_q + i) * p.seqlen_k;
}

template <class T, class VT>
__global__ void naive_scores(const FwdParams p) {
  const int h = blockIdx.y, b = blockIdx.z;
  const i64 idx = i64(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= i64(p.seqlen_q) * p.seqlen_k) return;
  const int i = int(idx / p.seqlen_k), j = int(idx % p.seqlen_k);
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + i * p.q_row_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + (h / p.group) * p.k_head_stride + j * p.k_row_stride;
  float s2 = -CA_INF;
  if (VT::keep(p, i, j)) {
    typename Accum<T>::type dot = 0;
    for (int d = 0; d < p.head_dim; ++d) dot += to_float(q[d]) * to_float(k[d]);
    s2 = VT::template score<true>(p, b, h, i, j, float(dot));
  }
  p.scratch[score_row(p, b, h, i) + j] = s2;
}

__global__ void naive_softmax(const FwdParams p) {
  const int h = blockIdx.y, b = blockIdx.z;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.seqlen_q) return;
  float* s = p.scratch + score_row(p, b, h, i);
  SoftmaxRow row;
  row.init();
  float m = -CA_INF;
  for (int j = 0; j < p.seqlen_k; ++j) m = fmaxf(m, s[j]);
  row.rescale(m);
  double l = 0;  // the baseline sums in fp64 whatever the dtype: exact enough to debug against
  for (int j = 0; j < p.seqlen_k; ++j) l += exact_exp2(s[j] - row.ref());
  row.l_i = float(l);
  for (int j = 0; j < p.seqlen_k; ++j) s[j] = l == 0 ? 0.f : float(exact_exp2(s[j] - row.ref()) / l);
  if (p.lse) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = row.lse();
}

template <class T, class VT>
__global__ void naive_pv(const FwdParams p) {
  const int h = blockIdx.y, b = blockIdx.z;
  const i64 idx = i64(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= i64(p.seqlen_q) * p.head_dim) return;
  const int i = int(idx / p.head_dim), d = int(idx % p.head_dim);
  const float* prow = p.scratch + score_row(p, b, h, i);
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + (h / p.group) * p.v_head_stride + d;
  const int k_end = VT::kv_end(p, i);
  typename Accum<T>::type acc = 0;
  for (int j = VT::kv_begin(p, i); j < k_end; ++j) {
    const float pj = prow[j];
    if (pj != 0.f) acc += pj * to_float(v[j * p.v_row_stride]);
  }
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + i * p.o_row_stride;
  o[d] = from_float<T>(float(acc));
}
