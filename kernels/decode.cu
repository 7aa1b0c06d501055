// decode: attention of a few query rows per sequence against a (paged) KV cache,
// split over the keys (flash-decoding), fp16/bf16 in, fp32 accumulation, sm_80+.
//
// Layouts: q, o, lse as in common/params.cuh; the cache as in common/paged.cuh.
// Query rows are packed per KV group: a block owns ROWS packed rows r of one
// (batch b, KV head hk), r = i * group + g for query i in [0, Sq) and query head
// h = hk * group + g, so every query head of a group reads each K/V byte from the
// same shared-memory tile (GQA / MQA packing; Sq > 1 is speculative decoding).
// Causal and windows are aligned bottom-right against each sequence's own length:
// the host passes the band for Sk = 0 and the block adds its sequence's length.
//
// Work split: grid (row blocks * splits, Hkv, B). Split s of a sequence covers keys
// [s * split_keys, (s + 1) * split_keys), the last one to the sequence's end (the
// host plans for a length that may be short of it); with one split the block writes o and lse,
// otherwise it writes fp32 o and lse partials that merge.cu combines.
//
// Threads: a key row of D elements is CHUNKS 16-byte chunks; LANES lanes (CHUNKS
// rounded up to a power of two) hold one key each, so a warp holds 32 / LANES keys
// at once and a block SLOTS of them ("slots"). Each lane keeps its 8 columns of
// every packed query row in registers (rQ) and of every output row (acc).
//
// Steps (per block):
//   1. rQ <- q (8 columns per lane, fp32); the block's key range from the variant
//      (kv_begin / kv_end over its rows) clipped to its split.
//   2. cp.async the first STAGES - 1 tiles of BLOCK_N = SLOTS * KEYS_PER_SLOT keys
//      (K and V, 16-byte chunks, the page-table walk per row) into the ring.
//   3. per tile: wait, one barrier, issue the tile STAGES - 1 ahead; each slot takes
//      keys slot, slot + SLOTS, ...: s = VT::score(q . k) (a butterfly over the
//      key's LANES lanes), masked by VT::keep; the online softmax per row
//      (SoftmaxRow); acc = acc * alpha + p v.
//   4. the slots' (m_i, l_i, acc) meet in shared memory (the ring's space) and
//      merge; o = acc / l_i and lse, or the split's partials.
//
// Constraints: D <= 256 (padded to a multiple of 8 in shared memory and registers
// only). VEC (16-byte aligned base pointers and strides, D % 8 == 0) copies with
// cp.async; otherwise tiles are staged with element loads. Keys past a block's
// range are zero-filled and masked; rows past a sequence's length are never read.
// Masked scores are selected to -inf, and a key masked for some row of the block
// adds p v by selection (p = 0 adds nothing), so NaN/Inf in masked K or V stays out.
#include "common/copy.cuh"
#include "common/paged.cuh"
#include "common/softmax.cuh"
#include "common/storage.cuh"
#include "common/variant.cuh"

// Lanes per key: CHUNKS rounded up to a power of two.
__host__ __device__ constexpr int decode_lanes(int chunks) {
  return chunks <= 1 ? 1 : 2 * decode_lanes((chunks + 1) / 2);
}

template <int D_, int ROWS_, int WARPS_, int STAGES_, class T_, bool VEC_, bool PAGED_>
struct DecodeTraits {
  using T = T_;
  using Cache = KVCache<PAGED_>;
  static constexpr int D = D_;
  static constexpr int D_PAD = RoundUp<D_, 8>::value;
  static constexpr int CHUNKS = D_PAD / 8;               // 16-byte chunks per key row
  static constexpr int LANES = decode_lanes(CHUNKS);     // lanes per key
  static constexpr int ROWS = ROWS_;                     // packed query rows per block
  static constexpr int WARPS = WARPS_;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int STAGES = STAGES_;
  static constexpr int SLOTS = WARPS * (32 / LANES);     // keys the block holds at once
  // keys per slot per tile: 8 query rows leave registers for 2 (rQ, acc: 128)
  static constexpr int KEYS_PER_SLOT = ROWS_ > 4 ? 2 : 4;
  static constexpr int BLOCK_N = SLOTS * KEYS_PER_SLOT;
  static constexpr bool VEC = VEC_;

  struct Storage {
    union {
      struct {
        T k[STAGES][BLOCK_N * D_PAD];
        T v[STAGES][BLOCK_N * D_PAD];
      } ring;
      struct {
        float acc[SLOTS][ROWS][D_PAD];
        float m[SLOTS][ROWS];
        float l[SLOTS][ROWS];
      } merge;
    };
  };
  static constexpr int SMEM_BYTES = sizeof(Storage);

  static_assert(sizeof(T) == 2, "decode takes 16-bit inputs");
  static_assert(D >= 1 && D <= 256, "head dim 1..256");
  static_assert(LANES <= 32, "one key per warp at most");
  static_assert(ROWS >= 1 && ROWS <= 8, "rQ and acc hold 16 * ROWS registers");
  static_assert(STAGES >= 2, "the ring needs two buffers");
};

// Arguments: the forward params (q, o, lse, strides, scale, band for Sk = 0; k and
// v point at the caches), the cache's page table and lengths, and the partials.
//   o_part   [num_splits, B, Hq, Sq, D] fp32, contiguous (used when num_splits > 1)
//   lse_part [num_splits, B, Hq, Sq] fp32, natural log
struct DecodeParams {
  FwdParams fwd;
  CacheParams cache;
  float* o_part;
  float* lse_part;
  i32 num_splits;
  i32 split_keys;   // keys per split, a multiple of BLOCK_N
};

// 8 consecutive 16-bit values as fp32.
template <class T>
__device__ __forceinline__ void unpack8(float (&x)[8], const uint4& u) {
  const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    T lo, hi;
    lo.bits = u16(w[e] & 0xffffu);
    hi.bits = u16(w[e] >> 16);
    x[2 * e] = to_float(lo);
    x[2 * e + 1] = to_float(hi);
  }
}

// The block's rows: ROWS (query head of the group, query row) pairs r0.. of KV head hk,
// batch b; rows past the last repeat it (computed, never stored).
template <class KT>
struct DecodeRows {
  int i[KT::ROWS], h[KT::ROWS];  // query row and query head of each
  int r0, r_last;
  __device__ __forceinline__ DecodeRows(const FwdParams& p, int row_block, int hk) {
    const int group = p.group;
    r0 = row_block * KT::ROWS;
    r_last = cmin(r0 + KT::ROWS, group * p.seqlen_q) - 1;
#pragma unroll
    for (int r = 0; r < KT::ROWS; ++r) {
      const int pr = cmin(r0 + r, r_last);
      i[r] = pr / group;
      h[r] = hk * group + pr % group;
    }
  }
};

// Q of the block's rows into registers: this lane's 8 columns from `col`.
template <class KT>
__device__ __forceinline__ void load_q(float (&rQ)[KT::ROWS][8], const FwdParams& p,
                                       const DecodeRows<KT>& rows, int b, int chunk, int col) {
  using T = typename KT::T;
#pragma unroll
  for (int r = 0; r < KT::ROWS; ++r) {
    const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + rows.h[r] * p.q_head_stride +
                 rows.i[r] * p.q_row_stride;
    if constexpr (KT::VEC) {
      uint4 u = make_uint4(0, 0, 0, 0);
      if (chunk < KT::CHUNKS) u = *reinterpret_cast<const uint4*>(q + col);
      unpack8<T>(rQ[r], u);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) rQ[r][e] = col + e < KT::D ? to_float(q[col + e]) : 0.f;
    }
  }
}

// Producer (every thread): the keys [j0, j0 + BLOCK_N) of K and V, below kv_hi, into
// ring buffer `stage` (cp.async with VEC, element copies otherwise; zeros past kv_hi).
template <class KT>
__device__ __forceinline__ void load_kv(typename KT::Storage& st, const FwdParams& p,
                                        const CacheParams& cache, int b, int hk,
                                        int stage, int j0, int kv_hi) {
  using T = typename KT::T;
  constexpr int CHUNKS = KT::CHUNKS;
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
#pragma unroll
  for (int c = threadIdx.x; c < KT::BLOCK_N * CHUNKS; c += KT::THREADS) {
    const int row = c / CHUNKS, cc = (c % CHUNKS) * 8, j = j0 + row;
    const bool ok = j < kv_hi;
    const KVRow at = ok ? KT::Cache::row(p, cache, b, hk, j) : KVRow{0, 0};
    T* sk = &st.ring.k[stage][row * KT::D_PAD + cc];
    T* sv = &st.ring.v[stage][row * KT::D_PAD + cc];
    if constexpr (KT::VEC) {
      cp_async_16(smem_addr(sk), k + at.k + cc, ok);
      cp_async_16(smem_addr(sv), v + at.v + cc, ok);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        T xk, xv;
        xk.bits = xv.bits = 0;
        if (ok && cc + e < KT::D) {
          xk = k[at.k + cc + e];
          xv = v[at.v + cc + e];
        }
        sk[e] = xk;
        sv[e] = xv;
      }
    }
  }
}

// Consumer step: the key tile in buffer `stage` (first key j0) against the block's
// rows. Each slot of LANES lanes takes keys slot, slot + SLOTS, ...: scores through
// the variant, the online softmax per row, acc += P V over the slot's keys.
template <class KT, class VT>
__device__ __forceinline__ void consume_tile(const typename KT::Storage& st, const FwdParams& p,
                                             const DecodeRows<KT>& rows,
                                             const float (&rQ)[KT::ROWS][8], int b, int stage,
                                             int j0, int slot, int chunk, int col,
                                             SoftmaxRow (&sm)[KT::ROWS],
                                             float (&acc)[KT::ROWS][8]) {
  using T = typename KT::T;
  constexpr int ROWS = KT::ROWS, KEYS = KT::KEYS_PER_SLOT;
  float s[ROWS][KEYS];
  bool every_row[KEYS];   // the key is kept by every row of the block
#pragma unroll
  for (int n = 0; n < KEYS; ++n) {
    const int row = n * KT::SLOTS + slot, j = j0 + row;
    // bands are intervals moving with i: the first and the last row bound them all
    every_row[n] = VT::keep(p, rows.i[0], j) && VT::keep(p, rows.i[ROWS - 1], j);
    float kf[8];
    uint4 u = make_uint4(0, 0, 0, 0);
    if (chunk < KT::CHUNKS) u = *reinterpret_cast<const uint4*>(&st.ring.k[stage][row * KT::D_PAD + col]);
    unpack8<T>(kf, u);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(rQ[r][e], kf[e], dot);
      dot = group_sum<KT::LANES>(dot);
      const float s2 = VT::score(p, b, rows.h[r], rows.i[r], j, dot);
      s[r][n] = VT::keep(p, rows.i[r], j) ? s2 : -CA_INF;
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float tile_max = s[r][0];
#pragma unroll
    for (int n = 1; n < KEYS; ++n) tile_max = fmaxf(tile_max, s[r][n]);
    const float alpha = sm[r].rescale(tile_max);
    const float ref = sm[r].ref();
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < KEYS; ++n) {
      s[r][n] = fast_exp2(s[r][n] - ref);
      sum += s[r][n];
    }
    sm[r].l_i += sum;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r][e] *= alpha;
  }
#pragma unroll
  for (int n = 0; n < KEYS; ++n) {
    const int row = n * KT::SLOTS + slot;
    float vf[8];
    uint4 u = make_uint4(0, 0, 0, 0);
    if (chunk < KT::CHUNKS) u = *reinterpret_cast<const uint4*>(&st.ring.v[stage][row * KT::D_PAD + col]);
    unpack8<T>(vf, u);
    if (every_row[n]) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][e] = fmaf(s[r][n], vf[e], acc[r][e]);
    } else {   // masked for some row: p = 0 selects, so NaN/Inf in v stays out
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e)
          acc[r][e] = s[r][n] == 0.f ? acc[r][e] : fmaf(s[r][n], vf[e], acc[r][e]);
    }
  }
}

// Epilogue: the slots' states merge in shared memory (the ring is free: every copy
// landed, the caller's barrier passed), then each row's output and LSE: the split's
// fp32 partial state (num_splits > 1, merged by merge.cu) or the final O in T.
template <class KT>
__device__ __forceinline__ void store(typename KT::Storage& st, const DecodeParams& dp,
                                      const FwdParams& p, const DecodeRows<KT>& rows, int b,
                                      int hk, int split, int slot, int chunk, int col,
                                      const SoftmaxRow (&sm)[KT::ROWS],
                                      const float (&acc)[KT::ROWS][8]) {
  using T = typename KT::T;
  constexpr int ROWS = KT::ROWS, D = KT::D, SLOTS = KT::SLOTS;
  if (chunk < KT::CHUNKS) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int e = 0; e < 8; ++e) st.merge.acc[slot][r][col + e] = acc[r][e];
      if (chunk == 0) {
        st.merge.m[slot][r] = sm[r].m_i;
        st.merge.l[slot][r] = sm[r].l_i;
      }
    }
  }
  __syncthreads();

  const bool partial = dp.num_splits > 1;
  const int group = p.group;
  for (int x = threadIdx.x; x < ROWS * D; x += KT::THREADS) {
    const int r = x / D, d = x % D, pr = rows.r0 + r;
    if (pr > rows.r_last) break;   // x grows with r: no later x is a stored row
    SoftmaxRow row;
    row.m_i = -CA_INF;
#pragma unroll
    for (int sl = 0; sl < SLOTS; ++sl) row.m_i = fmaxf(row.m_i, st.merge.m[sl][r]);
    const float ref = row.ref();
    row.l_i = 0.f;
    float o = 0.f;
#pragma unroll
    for (int sl = 0; sl < SLOTS; ++sl) {
      const float w = exact_exp2(st.merge.m[sl][r] - ref);
      row.l_i = fmaf(w, st.merge.l[sl][r], row.l_i);
      o = fmaf(w, st.merge.acc[sl][r][d], o);
    }
    o *= row.inv_l();
    const int i = pr / group, h = hk * group + pr % group;
    if (partial) {
      const i64 at = ((i64(split) * p.batch + b) * p.heads_q + h) * p.seqlen_q + i;
      dp.o_part[at * D + d] = o;
      if (d == 0) dp.lse_part[at] = row.lse();
    } else {
      T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride +
               i * p.o_row_stride;
      out[d] = from_float<T>(o);
      if (d == 0 && p.lse != nullptr)
        p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = row.lse();
    }
  }
}

// One block: ROWS rows of KV head hk (y), batch b (z), keys of split x % num_splits;
// x / num_splits is the row block.
template <class KT, class VT>
__global__ void __launch_bounds__(KT::THREADS) decode_fwd(const DecodeParams dp) {
  constexpr int ROWS = KT::ROWS, STAGES = KT::STAGES, BLOCK_N = KT::BLOCK_N;
  extern __shared__ __align__(16) unsigned char smem[];
  auto& st = *reinterpret_cast<typename KT::Storage*>(smem);

  const int b = blockIdx.z, hk = blockIdx.y;
  const int row_block = blockIdx.x / dp.num_splits, split = blockIdx.x % dp.num_splits;
  const int lane = threadIdx.x % 32;
  const int slot = threadIdx.x / KT::LANES, chunk = lane % KT::LANES;
  const int col = chunk * 8;   // this lane's first column

  // The sequence's own problem: its length, the band aligned to it.
  FwdParams p = dp.fwd;
  const int seqlen = KT::Cache::seqlen(dp.fwd, dp.cache, b);
  p.band_lo += seqlen;
  p.band_hi += seqlen;
  p.seqlen_k = seqlen;
  const DecodeRows<KT> rows(p, row_block, hk);

  // The block's key range: the band of its rows within the split (the last split runs
  // to the sequence's end, whatever length the host planned for).
  const int kv_lo = cmax(VT::kv_begin(p, rows.r0 / p.group), split * dp.split_keys);
  const int split_end = split + 1 == dp.num_splits ? seqlen : (split + 1) * dp.split_keys;
  const int kv_hi = cmax(cmin(VT::kv_end(p, rows.r_last / p.group), split_end), kv_lo);
  p.seqlen_k = kv_hi;   // keys at or past kv_hi belong to the next split: masked by keep

  float rQ[ROWS][8];
  load_q<KT>(rQ, p, rows, b, chunk, col);
  SoftmaxRow sm[ROWS];
  float acc[ROWS][8];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    sm[r].init();
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r][e] = 0.f;
  }

  // Tile t goes to buffer t % STAGES, one commit group per tile (empty past the end).
  const int n_tiles = ceil_div(kv_hi - kv_lo, BLOCK_N);
#pragma unroll
  for (int t = 0; t < STAGES - 1; ++t) {
    if (t < n_tiles) load_kv<KT>(st, p, dp.cache, b, hk, t % STAGES, kv_lo + t * BLOCK_N, kv_hi);
    cp_async_commit();
  }
  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();   // tile t landed everywhere; tile t - 1's buffer is free
    const int next = t + STAGES - 1;
    if (next < n_tiles)
      load_kv<KT>(st, p, dp.cache, b, hk, next % STAGES, kv_lo + next * BLOCK_N, kv_hi);
    cp_async_commit();
    consume_tile<KT, VT>(st, p, rows, rQ, b, t % STAGES, kv_lo + t * BLOCK_N, slot, chunk, col,
                         sm, acc);
  }

  cp_async_wait<0>();
  __syncthreads();
  store<KT>(st, dp, p, rows, b, hk, split, slot, chunk, col, sm, acc);
}
