// merge: combine attention states (o, lse) computed over disjoint key sets into the
// state of their union: split-KV's partials (decode.cu), a shared prefix and a
// suffix (cascade inference), the blocks of ring attention.
//
// For one row and states s with outputs o_s (each normalized over its own keys)
// and natural-log LSEs lse_s:
//   M = max_s lse_s,  w_s = exp(lse_s - M),  L = sum_s w_s
//   o = sum_s w_s o_s / L,  lse = M + log L
// A state with lse = -inf (no keys) has weight exactly 0 and its o is selected
// away, not multiplied, so it merges exactly whatever it holds; every state -inf
// gives o = 0, lse = -inf.
// NaN in an LSE propagates to the row.
//
// Layouts (strides in elements; the last dimension of o contiguous): a state view
// is a stack of states, o [states, N0, N1, N2, D] and lse [states, N0, N1, N2],
// each axis with its own stride, so [B, H, S, D] and [B, S, H, D] tensors, a
// separate tensor per state or a stacked one all read in place. Two views (a, b)
// merge into one output; split-KV passes its partials as view a and no view b.
//
// Threads: one warp per row (N0 * N1 * N2 rows), lanes over D (and over states for
// the LSEs); fp32 arithmetic.
// Two kernels: merge_states, any views; merge_splits, split-KV's own partials (fp32,
// contiguous, D a multiple of 4), which loads a row's LSEs and first o rows at once
// where merge_states waits for its LSEs, for them again (the weights) and then for
// each batch of o rows.
// Split-KV launches its merge as decode.cu's programmatic dependent (common/pdl.cuh):
// its blocks may be resident before the decode ends and wait for it before any load.
#include "common/pdl.cuh"
#include "common/softmax.cuh"

struct StateView {
  const void* o;
  const float* lse;
  i64 o_stride[4];     // state, n0, n1, n2
  i64 lse_stride[4];
  i32 states;          // 0: the view is absent
};

struct MergeParams {
  StateView a, b;
  void* o;
  float* lse;          // may be null
  i64 o_stride[3];     // n0, n1, n2
  i64 lse_stride[3];
  i32 n0, n1, n2, head_dim;
};

constexpr int MERGE_WARPS = 4;

__device__ __forceinline__ float view_lse(const StateView& s, int k, int x0, int x1, int x2) {
  return s.lse[k * s.lse_stride[0] + x0 * s.lse_stride[1] + x1 * s.lse_stride[2] +
               x2 * s.lse_stride[3]];
}

// The states of a view are taken 32 at a time, lane k holding state k0 + k's LSE, so
// a row's LSE loads and its weights are one load and one exp2 per lane, and its o
// rows are loaded merge_unroll states at a time, independent of each other (split-KV
// at B = 1 merges 32 or more states: one dependent load per state was most of a
// decode step's time). Eight rows of 256 16-bit columns spilled (sm_90a): four.
__host__ __device__ constexpr int merge_unroll(int per_lane) { return per_lane <= 4 ? 8 : 4; }

// The merged row's LSE (natural log) from its weights' sum l against reference ref,
// stored where the output has an LSE.
__device__ __forceinline__ void store_lse(const MergeParams& p, i64 x0, i64 x1, i64 x2, float l,
                                          float ref) {
  if (p.lse != nullptr)
    p.lse[x0 * p.lse_stride[0] + x1 * p.lse_stride[1] + x2 * p.lse_stride[2]] =
        l == 0.f ? -CA_INF : ref + exact_log2(l) * CA_LN2;
}

// The largest LSE of view s at (x0, x1, x2) and m, by every lane; NaN if any is NaN.
__device__ __forceinline__ float view_max(const StateView& s, int x0, int x1, int x2, int lane,
                                          float m) {
  bool nan = m != m;
  for (int k0 = 0; k0 < s.states; k0 += 32) {
    const int k = k0 + lane;
    const float lse = k < s.states ? view_lse(s, k, x0, x1, x2) : -CA_INF;
    nan = nan || lse != lse;
    m = fmaxf(m, lse);
  }
  m = group_max<32>(m);
  return __any_sync(0xffffffffu, nan) ? CA_NAN : m;
}

// Adds w_k o_k of every state of view s, w_k = exp(lse_k - ref), to o[] (the lane's
// columns) and w_k to l. A state of weight 0 (LSE -inf: no keys) adds nothing: its o
// is selected away, not multiplied, so NaN there stays out.
template <class TIN, int PER_LANE>
__device__ __forceinline__ void view_accumulate(const StateView& s, int x0, int x1, int x2,
                                                float ref, int lane, int D, float (&o)[PER_LANE],
                                                float& l) {
  const TIN* base = static_cast<const TIN*>(s.o) + x0 * s.o_stride[1] + x1 * s.o_stride[2] +
                    x2 * s.o_stride[3];
  for (int k0 = 0; k0 < s.states; k0 += 32) {
    const int k = k0 + lane, n = cmin(32, s.states - k0);
    const float w_lane =
        k < s.states ? exact_exp2((view_lse(s, k, x0, x1, x2) - ref) * CA_LOG2E) : 0.f;
    l += group_sum<32>(w_lane);
    constexpr int UNROLL = merge_unroll(PER_LANE);
    for (int u0 = 0; u0 < n; u0 += UNROLL) {
      float x[UNROLL][PER_LANE], w[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        w[u] = __shfl_sync(0xffffffffu, w_lane, (u0 + u) % 32);
        const TIN* src = base + (k0 + u0 + u) * s.o_stride[0];
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) {
          const int d = lane + 32 * e;
          x[u][e] = u0 + u < n && d < D ? to_float(src[d]) : 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e)
          o[e] = u0 + u < n && w[u] != 0.f ? fmaf(w[u], x[u][e], o[e]) : o[e];
    }
  }
}

// TIN: the states' dtype (float for split-KV partials), TOUT: the output's; D <= 32 *
// PER_LANE.
template <class TIN, class TOUT, int PER_LANE>
__global__ void __launch_bounds__(32 * MERGE_WARPS) merge_states(const MergeParams p) {
  const int lane = threadIdx.x % 32;
  const i64 row = i64(blockIdx.x) * MERGE_WARPS + threadIdx.x / 32;
  if (row >= i64(p.n0) * p.n1 * p.n2) return;
  grid_dependency_wait();  // the states' writer, when launched as its dependent
  const int x2 = int(row % p.n2), x1 = int((row / p.n2) % p.n1), x0 = int(row / (i64(p.n2) * p.n1));

  float m = view_max(p.a, x0, x1, x2, lane, -CA_INF);
  m = view_max(p.b, x0, x1, x2, lane, m);
  const float ref = m == -CA_INF ? 0.f : m;
  float o[PER_LANE], l = 0.f;
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) o[e] = 0.f;
  view_accumulate<TIN, PER_LANE>(p.a, x0, x1, x2, ref, lane, p.head_dim, o, l);
  view_accumulate<TIN, PER_LANE>(p.b, x0, x1, x2, ref, lane, p.head_dim, o, l);

  const float inv_l = l == 0.f ? 0.f : 1.f / l;
  TOUT* dst = static_cast<TOUT*>(p.o) + x0 * p.o_stride[0] + x1 * p.o_stride[1] + x2 * p.o_stride[2];
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) {
    const int d = lane + 32 * e;
    if (d < p.head_dim) dst[d] = from_float<TOUT>(o[e] * inv_l);
  }
  if (lane == 0) store_lse(p, x0, x1, x2, l, ref);
}

// Split-KV's partials: view a only, o [states, rows, D] and lse [states, rows] fp32 and
// contiguous (the host's own buffers: a.o_stride[0] = rows x D, a.lse_stride[0] =
// rows), D a multiple of 4 and at most 128 VECS, at most MERGE_SPLITS states. Lane l
// holds columns 4 l + 128 v (v < VECS) as float4s. The first MERGE_BATCH states' o rows
// are loaded before the LSEs and with them, so a row of up to 8 states waits for memory
// once (more states: once more per batch); then the weights as in merge_states, whose
// results this kernel's match (a state of LSE -inf adds nothing, NaN propagates).
// Batches of 16 states (one wait for 16 splits) lost 2% at 16 splits of 1024 rows
// where 8 gained 3%; H200, notes-decode.md section 34.
constexpr int MERGE_SPLITS = 64, MERGE_BATCH = 8;
static_assert(MERGE_SPLITS == 64 && MERGE_BATCH % 32 != 0 && 32 % MERGE_BATCH == 0,
              "two LSE chunks, a batch inside one");

template <class TOUT, int VECS>
__global__ void __launch_bounds__(32 * MERGE_WARPS) merge_splits(const MergeParams p) {
  const int lane = threadIdx.x % 32;
  const i64 row = i64(blockIdx.x) * MERGE_WARPS + threadIdx.x / 32;
  if (row >= i64(p.n0) * p.n1 * p.n2) return;
  grid_dependency_wait();  // the decode, its partials' writer
  const int states = p.a.states, D = p.head_dim;
  const float* lse = p.a.lse + row;
  const float* o = static_cast<const float*>(p.a.o) + row * D + 4 * lane;
  const i64 o_state = p.a.o_stride[0];

  float4 x[MERGE_BATCH][VECS];
  auto load = [&](int k0) {
#pragma unroll
    for (int u = 0; u < MERGE_BATCH; ++u)
#pragma unroll
      for (int v = 0; v < VECS; ++v)
        x[u][v] = k0 + u < states && 4 * lane + 128 * v < D
                      ? *reinterpret_cast<const float4*>(o + (k0 + u) * o_state + 128 * v)
                      : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  load(0);
  // Lane l holds the LSEs of states l and 32 + l.
  float l2[MERGE_SPLITS / 32];
#pragma unroll
  for (int c = 0; c < MERGE_SPLITS / 32; ++c) {
    const int k = 32 * c + lane;
    l2[c] = k < states ? lse[k * p.a.lse_stride[0]] : -CA_INF;
  }
  bool nan = false;
  float m = -CA_INF;
#pragma unroll
  for (int c = 0; c < MERGE_SPLITS / 32; ++c) {
    nan = nan || l2[c] != l2[c];
    m = fmaxf(m, l2[c]);
  }
  m = group_max<32>(m);
  if (__any_sync(0xffffffffu, nan)) m = CA_NAN;
  const float ref = m == -CA_INF ? 0.f : m;
  float w2[MERGE_SPLITS / 32], l = 0.f;
#pragma unroll
  for (int c = 0; c < MERGE_SPLITS / 32; ++c) {
    w2[c] = 32 * c + lane < states ? exact_exp2((l2[c] - ref) * CA_LOG2E) : 0.f;
    l += w2[c];
  }
  l = group_sum<32>(l);

  float4 acc[VECS];
#pragma unroll
  for (int v = 0; v < VECS; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int k0 = 0; k0 < states; k0 += MERGE_BATCH) {
    if (k0 > 0) load(k0);
#pragma unroll
    for (int u = 0; u < MERGE_BATCH; ++u) {
      const int k = k0 + u;
      // state k's weight: lane k % 32's w2[k / 32] (a batch lies in one chunk)
      const float w = __shfl_sync(0xffffffffu, k0 < 32 ? w2[0] : w2[1], k % 32);
      if (k < states && w != 0.f) {
#pragma unroll
        for (int v = 0; v < VECS; ++v) {
          acc[v].x = fmaf(w, x[u][v].x, acc[v].x);
          acc[v].y = fmaf(w, x[u][v].y, acc[v].y);
          acc[v].z = fmaf(w, x[u][v].z, acc[v].z);
          acc[v].w = fmaf(w, x[u][v].w, acc[v].w);
        }
      }
    }
  }

  const float inv_l = l == 0.f ? 0.f : 1.f / l;
  const i64 x2 = row % p.n2, x1 = (row / p.n2) % p.n1, x0 = row / (i64(p.n2) * p.n1);
  TOUT* dst =
      static_cast<TOUT*>(p.o) + x0 * p.o_stride[0] + x1 * p.o_stride[1] + x2 * p.o_stride[2];
#pragma unroll
  for (int v = 0; v < VECS; ++v) {
    const int d = 4 * lane + 128 * v;
    if (d < D) {
      dst[d] = from_float<TOUT>(acc[v].x * inv_l);
      dst[d + 1] = from_float<TOUT>(acc[v].y * inv_l);
      dst[d + 2] = from_float<TOUT>(acc[v].z * inv_l);
      dst[d + 3] = from_float<TOUT>(acc[v].w * inv_l);
    }
  }
  if (lane == 0) store_lse(p, x0, x1, x2, l, ref);
}
