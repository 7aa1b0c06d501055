// append: write new key/value tokens into a (paged) KV cache in place.
//
// Layouts (strides in elements, the last dimension contiguous):
//   k_new, v_new  [B, S_new, Hkv, D]: token t of sequence b, KV head h at
//                 b * new_batch_stride + t * new_row_stride + h * new_head_stride
//   caches        as in common/paged.cuh; token t of sequence b lands at position
//                 seqlens[b] + t (seqlens: the lengths before this append)
// The lengths are not advanced here: the caller adds S_new afterwards (the decode
// call does, for its own view of them, when it appends).
//
// Threads: one block per (token, KV head, sequence), lanes over D; 16-byte copies
// where VEC (aligned pointers and strides, D % 8 == 0), elements otherwise.
#include "common/paged.cuh"

struct AppendParams {
  const void* k_new;
  const void* v_new;
  void* k_cache;
  void* v_cache;
  CacheParams cache;
  i64 k_new_batch_stride, k_new_row_stride, k_new_head_stride;
  i64 v_new_batch_stride, v_new_row_stride, v_new_head_stride;
  i64 k_page_stride, k_row_stride, k_head_stride;   // page (or batch), row, head
  i64 v_page_stride, v_row_stride, v_head_stride;
  i32 seqlen_new, head_dim;
};

constexpr int APPEND_THREADS = 64;

template <class T, bool VEC, bool PAGED>
__global__ void __launch_bounds__(APPEND_THREADS) append_kv(const AppendParams p) {
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  i64 page, row;
  KVCache<PAGED>::locate(p.cache, b, p.cache.seqlens[b] + t, page, row);
  const T* ks = static_cast<const T*>(p.k_new) + b * p.k_new_batch_stride +
                t * p.k_new_row_stride + h * p.k_new_head_stride;
  const T* vs = static_cast<const T*>(p.v_new) + b * p.v_new_batch_stride +
                t * p.v_new_row_stride + h * p.v_new_head_stride;
  T* kd = static_cast<T*>(p.k_cache) + page * p.k_page_stride + row * p.k_row_stride +
          h * p.k_head_stride;
  T* vd = static_cast<T*>(p.v_cache) + page * p.v_page_stride + row * p.v_row_stride +
          h * p.v_head_stride;
  if constexpr (VEC) {
    for (int c = threadIdx.x; c < p.head_dim / 8; c += APPEND_THREADS) {
      reinterpret_cast<uint4*>(kd)[c] = reinterpret_cast<const uint4*>(ks)[c];
      reinterpret_cast<uint4*>(vd)[c] = reinterpret_cast<const uint4*>(vs)[c];
    }
  } else {
    for (int d = threadIdx.x; d < p.head_dim; d += APPEND_THREADS) {
      kd[d] = ks[d];
      vd[d] = vs[d];
    }
  }
}
