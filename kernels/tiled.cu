// tiled: attention in three kernels through a full score matrix in global memory,
// like naive, but each stage reuses its operands through shared memory.
// O(Sq*Sk) extra memory; the rung between naive and flash.
//
// Layouts: see common/params.cuh. scratch is [B, Hq, Sq, Sk] fp32, contiguous.
// Traits: TiledTraits<TILE, THREADS>; a block owns one TILE x TILE output tile and
// each thread TILE / (THREADS / TILE) of its rows (rows ty, ty + ROW_STEP, ...) in
// one column tx, so a warp (one ty) shares its row operand by broadcast.
// Steps:
//   1. tiled_scores   block = TILE queries x TILE keys; Q and K staged through
//                     shared memory TILE head-dim columns at a time;
//                     scratch <- mask(q . k * scale * log2e)   (exp2 domain).
//                     Tiles wholly above the causal diagonal get -inf, no dot products.
//   2. tiled_softmax  one warp per row, shuffle reductions: m = max, l = sum exp2(s - m)
//                     over the keys the row can see; scratch <- p = exp2(s - m) / l
//                     (0 past the causal end); lse = (m + log2 l) * ln2.
//   3. tiled_pv       block = TILE queries x TILE head-dim columns; P and V staged
//                     through shared memory TILE keys at a time; out = P V.
//                     p = 0 terms are selected away so NaN/Inf in masked-out V stays out.
// Grid: y = query head, z = batch; x = query tile * key tiles + key tile (scores),
// a block of WARPS rows (softmax), query tile * head-dim tiles + head-dim tile (pv).
// Constraints: any head dim (D is walked TILE columns at a time, tails zero-filled).
#include "common/variant.cuh"
#include "common/softmax.cuh"

template <int TILE_, int THREADS_>
struct TiledTraits {
  static constexpr int TILE = TILE_;
  static constexpr int THREADS = THREADS_;
  static constexpr int ROW_STEP = THREADS / TILE;         // rows apart for one thread
  static constexpr int ROWS_PER_THREAD = TILE / ROW_STEP;
  static constexpr int LOADS_PER_THREAD = TILE * TILE / THREADS;
  static constexpr int WARPS = THREADS / 32;
  // One padding column: the scores kernel reads sK[tx][c] down a column, and an
  // odd row stride puts the 32 lanes in 32 different banks.
  static constexpr int LDS = TILE + 1;

  static_assert(TILE == 32, "a warp spans one tile row: lane = column");
  static_assert(THREADS % TILE == 0 && TILE % ROW_STEP == 0, "threads must tile the rows");
  static_assert(THREADS % 32 == 0, "the softmax gives one warp per row");
};

__device__ __forceinline__ i64 tiled_score_row(const FwdParams& p, int b, int h, int i) {
  return ((i64(b) * p.heads_q + h) * p.seqlen_q + i) * p.seqlen_k;
}

template <class Tr, class T, class VT>
__global__ void __launch_bounds__(Tr::THREADS) tiled_scores(const FwdParams p) {
  __shared__ float sQ[Tr::TILE][Tr::LDS];
  __shared__ float sK[Tr::TILE][Tr::LDS];
  const int h = blockIdx.y, b = blockIdx.z;
  const int k_tiles = ceil_div(p.seqlen_k, Tr::TILE);
  const int q0 = (blockIdx.x / k_tiles) * Tr::TILE, k0 = (blockIdx.x % k_tiles) * Tr::TILE;
  const int tx = threadIdx.x % Tr::TILE, ty = threadIdx.x / Tr::TILE;
  const int q_last = min(q0 + Tr::TILE, p.seqlen_q) - 1;
  float* out = p.scratch + tiled_score_row(p, b, h, q0);

  if (k0 >= VT::kv_end(p, q_last) || k0 + Tr::TILE <= VT::kv_begin(p, q0)) {
    // Block-uniform: no row of this tile sees any of its keys.
#pragma unroll
    for (int r = 0; r < Tr::ROWS_PER_THREAD; ++r) {
      const int row = ty + r * Tr::ROW_STEP, j = k0 + tx;
      if (q0 + row < p.seqlen_q && j < p.seqlen_k) out[i64(row) * p.seqlen_k + j] = -CA_INF;
    }
    return;
  }

  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + (h / p.group) * p.k_head_stride;
  using acc_t = typename Accum<T>::type;
  acc_t dot[Tr::ROWS_PER_THREAD] = {};
  for (int d0 = 0; d0 < p.head_dim; d0 += Tr::TILE) {
    // Lanes walk the head dim: coalesced global reads, one bank per lane.
#pragma unroll
    for (int l = 0; l < Tr::LOADS_PER_THREAD; ++l) {
      const int e = threadIdx.x + l * Tr::THREADS, r = e / Tr::TILE, c = e % Tr::TILE;
      const int d = d0 + c, i = q0 + r, j = k0 + r;
      sQ[r][c] = (i < p.seqlen_q && d < p.head_dim) ? to_float(q[i * p.q_row_stride + d]) : 0.f;
      sK[r][c] = (j < p.seqlen_k && d < p.head_dim) ? to_float(k[j * p.k_row_stride + d]) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < Tr::TILE; ++c) {
      const float kc = sK[tx][c];
#pragma unroll
      for (int r = 0; r < Tr::ROWS_PER_THREAD; ++r) dot[r] += acc_t(sQ[ty + r * Tr::ROW_STEP][c]) * kc;
    }
    __syncthreads();
  }

  float s2[Tr::ROWS_PER_THREAD];
#pragma unroll
  for (int r = 0; r < Tr::ROWS_PER_THREAD; ++r) s2[r] = float(dot[r]);
  Scores<VT>::template forward<true>(GridFrag<Tr::ROWS_PER_THREAD, 1, Tr::ROW_STEP, 1>(ty, tx),
                                     [&](int x) -> float& { return s2[x]; }, p, b, h, q0, k0,
                                     VT::partial(p, q0, q_last, k0, k0 + Tr::TILE - 1));
#pragma unroll
  for (int r = 0; r < Tr::ROWS_PER_THREAD; ++r) {
    const int row = ty + r * Tr::ROW_STEP;
    if (q0 + row < p.seqlen_q && k0 + tx < p.seqlen_k) out[i64(row) * p.seqlen_k + k0 + tx] = s2[r];
  }
}

template <class Tr, class VT>
__global__ void __launch_bounds__(Tr::THREADS) tiled_softmax(const FwdParams p) {
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % 32;
  const int i = blockIdx.x * Tr::WARPS + threadIdx.x / 32;
  if (i >= p.seqlen_q) return;  // warp-uniform: the shuffles below see full warps
  float* s = p.scratch + tiled_score_row(p, b, h, i);
  // Keys outside [k_begin, k_end) hold -inf: read only those, write 0 elsewhere.
  const int k_begin = VT::kv_begin(p, i), k_end = VT::kv_end(p, i);

  float m = -CA_INF;
  for (int j = k_begin + lane; j < k_end; j += 32) m = fmaxf(m, s[j]);
  SoftmaxRow row;
  row.init();
  row.rescale(group_max<32>(m));
  const float ref = row.ref();
  double l = 0;  // the baseline sums in fp64 whatever the dtype
  for (int j = k_begin + lane; j < k_end; j += 32) l += exact_exp2(s[j] - ref);
  l = group_sum<32>(l);
  row.l_i = float(l);
  for (int j = lane; j < p.seqlen_k; j += 32)
    s[j] = (j >= k_begin && j < k_end && l != 0) ? float(exact_exp2(s[j] - ref) / l) : 0.f;
  if (p.lse && lane == 0) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = row.lse();
}

template <class Tr, class T, class VT>
__global__ void __launch_bounds__(Tr::THREADS) tiled_pv(const FwdParams p) {
  // Both tiles are read along a row (sP broadcast, sV one bank per lane): no padding.
  __shared__ float sP[Tr::TILE][Tr::TILE];
  __shared__ float sV[Tr::TILE][Tr::TILE];
  const int h = blockIdx.y, b = blockIdx.z;
  const int d_tiles = ceil_div(p.head_dim, Tr::TILE);
  const int q0 = (blockIdx.x / d_tiles) * Tr::TILE, d0 = (blockIdx.x % d_tiles) * Tr::TILE;
  const int tx = threadIdx.x % Tr::TILE, ty = threadIdx.x / Tr::TILE;
  const int q_last = min(q0 + Tr::TILE, p.seqlen_q) - 1;
  // The softmax wrote p = 0 outside each row's own band, so the block only has to
  // cover its rows' union of bands.
  const int k_end = VT::kv_end(p, q_last);
  const float* prob = p.scratch + tiled_score_row(p, b, h, q0);
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + (h / p.group) * p.v_head_stride;

  using acc_t = typename Accum<T>::type;
  acc_t acc[Tr::ROWS_PER_THREAD] = {};
  for (int k0 = VT::kv_begin(p, q0) / Tr::TILE * Tr::TILE; k0 < k_end; k0 += Tr::TILE) {
#pragma unroll
    for (int l = 0; l < Tr::LOADS_PER_THREAD; ++l) {
      const int e = threadIdx.x + l * Tr::THREADS, r = e / Tr::TILE, c = e % Tr::TILE;
      const int i = q0 + r, j = k0 + c, kv = k0 + r, d = d0 + c;
      sP[r][c] = (i < p.seqlen_q && j < p.seqlen_k) ? prob[i64(r) * p.seqlen_k + j] : 0.f;
      sV[r][c] = (kv < p.seqlen_k && d < p.head_dim) ? to_float(v[kv * p.v_row_stride + d]) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < Tr::TILE; ++c) {
      const float vc = sV[c][tx];
#pragma unroll
      for (int r = 0; r < Tr::ROWS_PER_THREAD; ++r) {
        const float pc = sP[ty + r * Tr::ROW_STEP][c];
        acc[r] = pc != 0.f ? acc[r] + acc_t(pc) * vc : acc[r];
      }
    }
    __syncthreads();
  }

  const int d = d0 + tx;
  if (d >= p.head_dim) return;
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + d;
#pragma unroll
  for (int r = 0; r < Tr::ROWS_PER_THREAD; ++r) {
    const int i = q0 + ty + r * Tr::ROW_STEP;
    if (i < p.seqlen_q) o[i * p.o_row_stride] = from_float<T>(float(acc[r]));
  }
}
