// flash_wgmma_bwd: the attention backward pass on Hopper tensor cores (wgmma),
// sm_90a only; fp16/bf16 in, fp32 accumulate. FlashAttention-3's dK/dV loop.
//
// Math and notation as in flash_bwd.cu (s2 = q.k * scale*log2(e): the exp2 domain):
//   P  = exp2(s2 - lse*log2(e))   recomputed from the forward's LSE
//   dV = P^T dout    dP = dout V^T    dS = P (dP - delta)    delta_i = dout_i . o_i
//   dQ = scale * dS K                 dK = scale * dS^T Q
// Layouts: common/params.cuh (BwdParams); tiles, descriptors, fences: common/wgmma.cuh.
//
// Kernels, in launch order (cupy_attention/families/flash_wgmma_bwd.py):
//   1. flash_bwd_delta (flash_bwd.cu): delta; zeroes dq_accum in atomic mode.
//   2. The dK/dV kernel, one block per (BLOCK_N keys, KV head, batch) of two
//      warpgroups. sK and sV stay resident while the block walks the query tiles
//      (BLOCK_M rows) of every query head of the KV head's group, from the first
//      tile that sees key n0 (causal); the next tile's Q, dout, lse and delta are
//      copied (cp.async, two buffers) while this one is computed. Two ways to split
//      the work between the warpgroups:
//
//      flash_wgmma_bwd_dkdv, D = 64..128: BLOCK_N = 128 keys, warpgroup w owns keys
//      64w..64w+63, the M = 64 rows of its S^T, dP^T, dV and dK products, and inside
//      it warp k of the block owns keys 16k..16k+15. Per tile:
//        issue S^T  = K_w Q^T       wgmma ss, both K-major, N = BLOCK_M, over D_K
//        issue dP^T = V_w dout^T    wgmma ss, both K-major, N = BLOCK_M, over D_K
//        wait for S^T; P^T in registers (lse per column) while dP^T runs
//        issue dV_w += P^T dout     wgmma rs: P^T rounded to 16 bits is the A
//                                   fragment, dout MN-major, N = D
//        wait for dP^T; dS^T = P^T (dP^T - delta) in registers while dV runs
//        issue dK_w += dS^T Q       wgmma rs, Q MN-major, N = D
//        (ATOMIC_DQ) dS^T to sdS [key][query]; one barrier of the block, then
//        issue dQ = dS K            wgmma ss, A = dS (sdS read MN-major: TRANS_A),
//                                   B = K (MN-major), K = the block's 128 keys.
//                                   BLOCK_M = 64: warpgroup w computes the 64
//                                   columns of sK's block w and keeps those
//                                   below D (an MN-major B operand starts on a
//                                   block; one N for both warpgroups keeps ptxas
//                                   from serializing the wgmma of a divergent
//                                   path); BLOCK_M = 128: the queries 64w..
//        wait for everything
//      and at the start of the next tile, after its proxy fence and barrier, dQ /
//      scale is added into dq_accum with fp32 reductions (red.global.add.v2.f32;
//      their order varies from run to run). The proxy fence is a memory barrier:
//      placed after the reductions it waited for them (H200, bf16: up to 14%
//      slower, D = 128 causal the most).
//      The async MMAs overlap the warpgroup's own element-wise work; the block's
//      two warpgroups keep the tensor cores fed between each other's waits. No MMA
//      is in flight across iterations: in every variant tried that overlapped a
//      tile's dQ reductions with the next tile's MMAs, ptxas serialized all the
//      kernel's wgmma (C7515, "non wgmma instructions defining accumulator
//      registers ... between start and end of the pipeline stage").
//
//      flash_wgmma_bwd_dkdv_wide, D = 136..256: dK and dV of 64 keys take D
//      registers per thread, too many for one warpgroup beside S^T past D = 128, so
//      BLOCK_N = 64 keys and BLOCK_M = 64 queries, both warpgroups cover all 64 keys
//      (warp k of a warpgroup owns keys 16k..16k+15), and they split by role:
//      warpgroup 0 computes P^T and holds dV, warpgroup 1 computes dS^T and holds
//      dK. Both run one instruction stream with role-selected operands (ptxas sees
//      no wgmma on a divergent path). Per tile:
//        issue X^T = A B^T          wg 0: S^T = K Q^T; wg 1: dP^T = V dout^T
//                                   (ss, both K-major, N = 64, over D_K)
//        wg 0: P^T, stored to sP (fp32, each thread its own slots); arrive
//        wg 1: wait for sP; dS^T = P^T (dP^T - delta); (ATOMIC_DQ) dS^T to sdS,
//              arrive
//        issue acc += X^T C         wg 0: dV += P^T dout; wg 1: dK += dS^T Q
//                                   (rs, C MN-major, N = D)
//        (ATOMIC_DQ) wg 0 waits for sdS; then dQ = dS K, each warpgroup about
//        half of the columns (WgmmaBwdTraits::DQ_N: D = 136-192 in one round of
//        D - 64 columns from block w, D = 200-256 in two of 64, blocks w and
//        w + 2), each round's wgmma waited for and its dQ / scale added into
//        dq_accum right away.
//
//      Then dK * scale and dV are staged through sK, sV and written with 16-byte
//      stores: one block owns each key of a KV head, so dK and dV need no atomics
//      and are bitwise reproducible.
//   3. flash_bwd_dq_convert (flash_bwd.cu): dq = dq_accum * scale; or, in
//      deterministic mode (ATOMIC_DQ = false), flash_mma_bwd_dq (flash_mma_bwd.cu).
// Shared memory (16-bit swizzled tiles, SwizzledTile of wgmma.cuh; rows of D_K, D
// rounded up to 16, columns D..D_K zero-filled for the k16 steps, and the tiles
// themselves take whole 64-column blocks):
//   sK, sV [BLOCK_N][D_K]   sQ, sdO [2][BLOCK_M][D_K]   sdS [BLOCK_N][BLOCK_M]
//   (wide) sP [BLOCK_N * BLOCK_M] fp32   sStats [2][2][BLOCK_M] fp32 (lse, then
//   delta, per buffer)
// Writers to tiles that wgmma reads (cp.async copies, dS^T stores) run
// fence_proxy_async() before the barrier that publishes them.
// Masking: as flash_mma_bwd. Tiles that cross Sk or the causal diagonal are masked
// element by element (P selected to 0); query rows past Sq read lse = +inf (P = 0).
// Query rows that attend nothing (causal, i < Sk - Sq) are zero-filled in sQ and
// sdO, so NaN there cannot reach dK or dV through 0 * NaN, and their LSE of -inf is
// read as +inf, so P = 0 and their dQ is exactly 0. dS is selected, not
// multiplied, where P = 0, so NaN in a masked-out V stays out.
// Constraints: D a multiple of 8 from 64 to 256; 16-byte aligned base pointers and
// strides of q, k, v, dout (the host runs flash_mma_bwd otherwise). No dense masks.
#include "common/bwd_tiles.cuh"
#include "common/wgmma.cuh"

template <int D_, int BLOCK_M_, class T_>
struct WgmmaBwdTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_K = (D + 15) / 16 * 16;  // K of the K Q^T and V dout^T steps
  static constexpr bool WIDE = D > 128;           // flash_wgmma_bwd_dkdv_wide's split
  static constexpr int BLOCK_M = BLOCK_M_;        // queries per tile
  static constexpr int BLOCK_N = WIDE ? 64 : 128; // keys per block
  static constexpr int THREADS = 256;
  static constexpr int Q_TILES = BLOCK_M / 8;     // n8 column groups of S^T, dP^T per thread
  static constexpr int QK_STEPS = D_K / 16;       // k16 steps of K Q^T and V dout^T
  static constexpr int KV_STEPS = BLOCK_M / 16;   // k16 steps of P^T dout and dS^T Q
  static constexpr int DQ_STEPS = BLOCK_N / 16;   // k16 steps of dS K
  // dQ = dS K is m64 wgmmas of DQ_N columns per warpgroup, DQ_ROUNDS of them one
  // after another. BLOCK_M = 128: warpgroup w takes all D columns of queries 64w..
  // Otherwise both take the tile's 64 queries and split the columns; an MN-major B
  // operand starts on one of sK's 64-column blocks, and both warpgroups run one N
  // (ptxas serializes the wgmma of a divergent path), so with up to three blocks
  // warpgroup w computes DQ_N = max(64, D - 64) columns from 64w (past D = 128 the
  // two ranges overlap) and keeps those below DQ_SPLIT (w = 0, about half of D) or
  // from it on (w = 1); with four blocks, warpgroup w takes blocks w and w + 2.
  static constexpr bool DQ_SPLIT_ROWS = BLOCK_M == 128;
  static constexpr int D_BLOCKS = (D + 63) / 64;
  static constexpr int DQ_N = DQ_SPLIT_ROWS ? D : D_BLOCKS == 3 ? D - 64 : 64;
  static constexpr int DQ_ROUNDS = D_BLOCKS == 4 ? 2 : 1;
  // D / 2 rounded down to a multiple of 8 (in 64..D - 64 for three blocks)
  static constexpr int DQ_SPLIT = D_BLOCKS == 3 ? D / 16 * 8 : 64;
  // Round `round` of warpgroup w: its first column col0, and the columns it keeps,
  // col0 + [skip, cols).
  __device__ static constexpr int dq_col0(int round, int w) {
    return DQ_SPLIT_ROWS ? 0 : 64 * (DQ_ROUNDS * round + w);
  }
  __device__ static constexpr int dq_skip(int w) {
    return DQ_SPLIT_ROWS || DQ_ROUNDS > 1 || w == 0 ? 0 : DQ_SPLIT - 64;
  }
  __device__ static constexpr int dq_cols(int round, int w) {
    return DQ_SPLIT_ROWS ? D : DQ_ROUNDS > 1 || w == 1 ? D - dq_col0(round, w) : DQ_SPLIT;
  }
  using KVTile = SwizzledTile<BLOCK_N, D_K>;
  using QTile = SwizzledTile<BLOCK_M, D_K>;
  using DsTile = SwizzledTile<BLOCK_N, BLOCK_M>;  // dS^T: rows are keys
  static constexpr int SMEM_KV = KVTile::BYTES;
  static constexpr int SMEM_Q = QTile::BYTES;     // one buffer of sQ or of sdO
  static constexpr int SMEM_DS = DsTile::BYTES;
  static constexpr int SMEM_P = WIDE ? BLOCK_N * BLOCK_M * 4 : 0;
  static constexpr int SMEM_STATS = 2 * BLOCK_M * 4;  // one buffer: lse, delta
  // + 1024: the base is rounded up to the 1024-byte boundary the swizzle is defined on.
  static constexpr int SMEM_BYTES =
      2 * SMEM_KV + 4 * SMEM_Q + SMEM_DS + SMEM_P + 2 * SMEM_STATS + 1024;

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D % 8 == 0 && D >= 64 && D <= 256, "D a multiple of 8 from 64 to 256");
  static_assert(BLOCK_M == 64 || BLOCK_M == 128, "S^T = K Q^T is one wgmma m64n{BLOCK_M}");
  static_assert(!WIDE || BLOCK_M == 64, "the wide kernel takes 64-query tiles");
  static_assert(2 * BLOCK_M <= THREADS, "one thread per lse/delta value");
};

// Copy rows [0, ROWS) of a tile of D columns (row stride `stride`) into the
// swizzled tile at shared address `s`, zero-filling rows outside [row_lo, row_hi)
// and columns D..D_K. `head` is any valid address of the tensor, read by nothing
// (cp.async with 0 source bytes). Each thread takes one chunk slot (8 columns; 8, 16
// or 32 slots a row, those past D_K idle) at rows r0, r0 + PASS_ROWS, ...; those
// rows agree mod 8, so the swizzled destination advances by a constant.
// (flash_wgmma.cu's producer copies the same layout with 128 threads and partly
// unrolled loops; this kernel at 241-252 registers measured 12% slower at D = 64
// with that loop shape, so each kernel keeps its own.)
template <class K, class Tile, int ROWS>
__device__ __forceinline__ void load_rows(u32 s, const typename K::T* g, i64 stride, int row_lo,
                                          int row_hi, const typename K::T* head) {
  constexpr int CHUNKS = K::D / 8, K_CHUNKS = K::D_K / 8;
  constexpr int SLOTS = K_CHUNKS <= 8 ? 8 : K_CHUNKS <= 16 ? 16 : 32;
  constexpr int PASS_ROWS = K::THREADS / SLOTS;
  static_assert(ROWS % PASS_ROWS == 0 && PASS_ROWS % 8 == 0, "whole passes of 8-row groups");
  const int r0 = threadIdx.x / SLOTS, chunk = threadIdx.x % SLOTS;
  if (chunk >= K_CHUNKS) return;
  const bool data = chunk < CHUNKS;
  const u32 dst = s + Tile::offset(r0, chunk);
  const typename K::T* src = g + r0 * stride + (data ? chunk * 8 : 0);
#pragma unroll
  for (int i = 0; i < ROWS / PASS_ROWS; ++i) {
    const int r = r0 + i * PASS_ROWS;
    const bool ok = data && r >= row_lo && r < row_hi;
    cp_async_16(dst + i * PASS_ROWS * 128, ok ? src + i * PASS_ROWS * stride : head, ok);
  }
}

// What both dK/dV kernels share: the shared-memory layout, the block's place in the
// problem, the copies of K, V and the query tiles, the dQ reductions and the
// epilogue's stores.
template <class K, class VT>
struct DkdvBlock {
  using T = typename K::T;
  const BwdParams& p;
  unsigned char* const smem;
  const u32 sK, sV, sQ, sdO, sdS, sP, sStats;  // sQ, sdO, sStats: two buffers each
  const int n0, h_kv, b;
  const QueryTileWalk<K::BLOCK_M, K::BLOCK_N, VT> walk;

  __device__ __forceinline__ DkdvBlock(const BwdParams& p_, unsigned char* smem_)
      : p(p_), smem(smem_), sK((smem_addr(smem_) + 1023) & ~1023u), sV(sK + K::SMEM_KV),
        sQ(sV + K::SMEM_KV), sdO(sQ + 2 * K::SMEM_Q), sdS(sdO + 2 * K::SMEM_Q),
        sP(sdS + K::SMEM_DS), sStats(sP + K::SMEM_P), n0(blockIdx.x * K::BLOCK_N),
        h_kv(blockIdx.y), b(blockIdx.z), walk(p_.fwd, blockIdx.x * K::BLOCK_N) {}

  // Generic pointer to shared address `a`, for plain loads and stores.
  __device__ __forceinline__ unsigned char* at(u32 a) const {
    return smem + (a - smem_addr(smem));
  }
  __device__ __forceinline__ const float* lse(int buf) const {
    return reinterpret_cast<const float*>(at(sStats + buf * K::SMEM_STATS));
  }
  __device__ __forceinline__ const float* delta(int buf) const { return lse(buf) + K::BLOCK_M; }

  // Query tile `it` (Q, dout, lse, delta) into buffer it % 2, as one cp.async group.
  __device__ __forceinline__ void load_q(int it) const {
    const FwdParams& f = p.fwd;
    const int h = walk.head(it, h_kv, f.group), m0 = walk.m0(it);
    const int buf = it & 1;
    const T* q_head = static_cast<const T*>(f.q) + b * f.q_batch_stride + h * f.q_head_stride;
    const T* o_head =
        static_cast<const T*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride;
    const int lo = walk.row_lo(f, m0), hi = walk.row_hi(f, m0);
    load_rows<K, typename K::QTile, K::BLOCK_M>(sQ + buf * K::SMEM_Q, q_head + m0 * f.q_row_stride,
                                                f.q_row_stride, lo, hi, q_head);
    load_rows<K, typename K::QTile, K::BLOCK_M>(sdO + buf * K::SMEM_Q,
                                                o_head + m0 * p.dout_row_stride,
                                                p.dout_row_stride, lo, hi, o_head);
    const float* lse = f.lse + b * f.lse_batch_stride + h * f.lse_head_stride + m0;
    const float* delta = p.delta + (i64(b) * f.heads_q + h) * f.seqlen_q + m0;
    copy_row_stats<K::BLOCK_M>(sStats + buf * K::SMEM_STATS, lse, delta, hi, f.lse);
    cp_async_commit();
  }

  // The block's K and V, in the same cp.async group as query tile 0.
  __device__ __forceinline__ void load_first() const {
    const FwdParams& f = p.fwd;
    const T* k_head = static_cast<const T*>(f.k) + b * f.k_batch_stride + h_kv * f.k_head_stride;
    const T* v_head = static_cast<const T*>(f.v) + b * f.v_batch_stride + h_kv * f.v_head_stride;
    const int k_rows = f.seqlen_k - n0;
    load_rows<K, typename K::KVTile, K::BLOCK_N>(sK, k_head + n0 * f.k_row_stride, f.k_row_stride,
                                                 0, k_rows, k_head);
    load_rows<K, typename K::KVTile, K::BLOCK_N>(sV, v_head + n0 * f.v_row_stride, f.v_row_stride,
                                                 0, k_rows, v_head);
    if (walk.iters > 0) {
      load_q(0);
    } else {
      cp_async_commit();
    }
  }

  // dq_accum += a warpgroup's dQ of tile it (dq_accum holds dQ / scale):
  // dq[dt * 4 + 2 r + c] is query row0 + g + 8 r, column col0 + 8 dt + 2 t + c;
  // only columns col0 + [skip, cols) are added.
  template <int N>
  __device__ __forceinline__ void add_dq(int it, const float (&dq)[N / 2], int row0, int col0,
                                         int skip, int cols, int g, int t) const {
    const FwdParams& f = p.fwd;
    const int h = walk.head(it, h_kv, f.group), m0 = walk.m0(it);
    float* dq_tile = p.dq_accum + ((i64(b) * f.heads_q + h) * f.seqlen_q + m0) * K::D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + g + 8 * r;
      if (m0 + row < f.seqlen_q) {
#pragma unroll
        for (int dt = 0; dt < N / 8; ++dt)
          if (8 * dt >= skip && 8 * dt < cols)
            red_add_f32x2(dq_tile + row * K::D + col0 + 8 * dt + 2 * t, dq[dt * 4 + 2 * r],
                          dq[dt * 4 + 2 * r + 1]);
      }
    }
  }

  // Epilogue, one warp: its 16 keys key0.. of acc * mul (a warpgroup's dK or dV
  // fragment) staged in those rows of the tile at `stage`, then whole rows stored
  // to `out` (the KV head's rows of dK or dV) with 16-byte stores.
  __device__ __forceinline__ void store_keys(const float (&acc)[K::D / 2], float mul, u32 stage,
                                             T* out, i64 row_stride, int key0, int lane) const {
    const int g = lane / 4, t = lane % 4;
    unsigned char* bytes = at(stage);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int dt = 0; dt < K::D / 8; ++dt)
        *reinterpret_cast<u32*>(bytes + K::KVTile::offset(key0 + g + 8 * r, dt) + 4 * t) =
            MmaType<T>::pack(acc[dt * 4 + 2 * r] * mul, acc[dt * 4 + 2 * r + 1] * mul);
    __syncwarp();
    constexpr int CHUNKS = K::D / 8;
#pragma unroll
    for (int c = lane; c < 16 * CHUNKS; c += 32) {
      const int r = c / CHUNKS, chunk = c % CHUNKS;
      const int j = n0 + key0 + r;
      if (j < p.fwd.seqlen_k)
        *reinterpret_cast<uint4*>(out + j * row_stride + chunk * 8) =
            *reinterpret_cast<const uint4*>(bytes + K::KVTile::offset(key0 + r, chunk));
    }
  }
  __device__ __forceinline__ T* dk_head() const {
    return static_cast<T*>(p.dk) + b * p.dk_batch_stride + h_kv * p.dk_head_stride;
  }
  __device__ __forceinline__ T* dv_head() const {
    return static_cast<T*>(p.dv) + b * p.dv_batch_stride + h_kv * p.dv_head_stride;
  }
};

// P^T in place of S^T: s[nt * 4 + 2 r + c] is key j0 + g + 8 r, query m0 + 8 nt + 2 t
// + c; element masks only where the warp's 16 keys x the tile cross Sk or the
// causal diagonal.
template <class K, class VT>
__device__ __forceinline__ void p_from_s(float (&s)[K::BLOCK_M / 2], const FwdParams& f,
                                         const float* s_lse, int m0, int j0, int g, int t) {
  const bool edge = VT::partial(f, m0, m0 + K::BLOCK_M - 1, j0, j0 + 15);
#pragma unroll
  for (int nt = 0; nt < K::Q_TILES; ++nt) {
    const int col = nt * 8 + 2 * t;
    const float2 lse = *reinterpret_cast<const float2*>(s_lse + col);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int i = m0 + col + c;
      const float l = c ? lse.y : lse.x;
      // Rows past Sq and rows that attend nothing: +inf, so P = exp2(-inf) = 0.
      const float lse2 = (i < f.seqlen_q && l != -CA_INF) ? l * CA_LOG2E : CA_INF;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = j0 + g + 8 * r;
        const bool kept = !edge || VT::keep(f, i, j);
        float& x = s[nt * 4 + 2 * r + c];
        x = kept ? fast_exp2(fmaf(x, f.scale_log2, -lse2)) : 0.f;
      }
    }
  }
}

// dS^T = P^T (dP^T - delta) in place of dP^T, selected to 0 where P = 0.
template <class K>
__device__ __forceinline__ void ds_from_dp(float (&dp)[K::BLOCK_M / 2],
                                           const float (&pt)[K::BLOCK_M / 2],
                                           const float* s_delta, int t) {
#pragma unroll
  for (int nt = 0; nt < K::Q_TILES; ++nt) {
    const float2 delta = *reinterpret_cast<const float2*>(s_delta + nt * 8 + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int idx = nt * 4 + e;
      const float dl = e % 2 ? delta.y : delta.x;
      dp[idx] = pt[idx] == 0.f ? 0.f : pt[idx] * (dp[idx] - dl);
    }
  }
}

// Two n8 groups of an M = 64 accumulator are one k16 step of its 16-bit A operand.
template <class K>
__device__ __forceinline__ void pack_a(u32 (&a)[K::KV_STEPS][4], const float (&x)[K::BLOCK_M / 2]) {
#pragma unroll
  for (int ks = 0; ks < K::KV_STEPS; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      a[ks][e] = MmaType<typename K::T>::pack(x[8 * ks + 2 * e], x[8 * ks + 2 * e + 1]);
}

// dS^T [key][query] for dS K: da[ks][e] holds key key0 + g + 8 (e % 2), queries 16 ks
// + 8 (e / 2) + 2t, +1 (n8 group 2 ks + e / 2).
template <class K>
__device__ __forceinline__ void store_ds(unsigned char* ds_bytes, const u32 (&da)[K::KV_STEPS][4],
                                         int key0, int g, int t) {
#pragma unroll
  for (int ks = 0; ks < K::KV_STEPS; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      *reinterpret_cast<u32*>(ds_bytes + K::DsTile::offset(key0 + g + 8 * (e % 2), 2 * ks + e / 2) +
                              4 * t) = da[ks][e];
}

template <class K, class VT, bool ATOMIC_DQ>
__global__ void __launch_bounds__(K::THREADS, 1) flash_wgmma_bwd_dkdv(const BwdParams p) {
  static_assert(!K::WIDE, "D > 128 runs flash_wgmma_bwd_dkdv_wide");
  using T = typename K::T;
  using KVTile = typename K::KVTile;
  using QTile = typename K::QTile;
  using DsTile = typename K::DsTile;
  const FwdParams& f = p.fwd;
  extern __shared__ __align__(1024) unsigned char smem[];
  const DkdvBlock<K, VT> blk(p, smem);
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int key0 = 16 * warp;  // this warp's first key within the block
  const int n_iters = blk.walk.iters;
  blk.load_first();

  float dk[K::D / 2], dv[K::D / 2];  // this warpgroup's 64 keys x D
#pragma unroll
  for (int i = 0; i < K::D / 2; ++i) dk[i] = dv[i] = 0.f;
  float s[K::BLOCK_M / 2];           // S^T, then P^T: keys x the tile's queries
  float dp[K::BLOCK_M / 2];          // dP^T, then dS^T
  u32 pa[K::KV_STEPS][4];            // P^T in 16 bits: the A operand of P^T dout
  u32 da[K::KV_STEPS][4];            // dS^T in 16 bits: the A operand of dS^T Q
  float dq[K::DQ_N / 2];             // dQ tile slice (see DQ_SPLIT_ROWS)

  // dQ operands: rows (queries) or columns (head dim) of this warpgroup.
  const u32 dq_a = blk.sdS + (K::DQ_SPLIT_ROWS ? wg * K::BLOCK_N * 128 : 0);  // 64-column block wg
  const int dq_col0 = K::dq_col0(0, wg), dq_cols = K::dq_cols(0, wg);
  const u32 dq_b = blk.sK + (dq_col0 / 64) * (K::BLOCK_N * 128);
  const int dq_row0 = (K::DQ_SPLIT_ROWS ? 64 * wg : 0) + 16 * (warp % 4);

  for (int it = 0; it < n_iters; ++it) {
    const int m0 = blk.walk.m0(it);
    const int buf = it & 1;
    const u32 q_tile = blk.sQ + buf * K::SMEM_Q, o_tile = blk.sdO + buf * K::SMEM_Q;
    // Tile it visible to both proxies; every warpgroup is done with tile it - 1 (its
    // buffers and sdS: each waited for all its MMAs). Then tile it - 1's dQ goes
    // out: after the proxy fence, a memory barrier that would wait for it.
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if constexpr (ATOMIC_DQ) {
      if (it > 0) blk.template add_dq<K::DQ_N>(it - 1, dq, dq_row0, dq_col0, 0, dq_cols, g, t);
    }

    wgmma_fence();  // s, dp, dq were read by ordinary code
#pragma unroll
    for (int ks = 0; ks < K::QK_STEPS; ++ks)
      Wgmma<K::BLOCK_M>::ss(s, KVTile::kmajor(blk.sK, 64 * wg, ks), QTile::kmajor(q_tile, 0, ks),
                            ks > 0, T{});
    wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < K::QK_STEPS; ++ks)
      Wgmma<K::BLOCK_M>::ss(dp, KVTile::kmajor(blk.sV, 64 * wg, ks), QTile::kmajor(o_tile, 0, ks),
                            ks > 0, T{});
    wgmma_commit();
    if (it + 1 < n_iters) blk.load_q(it + 1);

    wgmma_wait<1>();
    fence_regs(s);
    p_from_s<K, VT>(s, f, blk.lse(buf), m0, blk.n0 + key0, g, t);
    pack_a<K>(pa, s);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < K::KV_STEPS; ++ks)
      Wgmma<K::D>::rs(dv, pa[ks], QTile::mnmajor(o_tile, ks), T{});
    wgmma_commit();

    wgmma_wait<1>();
    fence_regs(dp);
    ds_from_dp<K>(dp, s, blk.delta(buf), t);
    pack_a<K>(da, dp);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < K::KV_STEPS; ++ks)
      Wgmma<K::D>::rs(dk, da[ks], QTile::mnmajor(q_tile, ks), T{});
    wgmma_commit();

    if constexpr (ATOMIC_DQ) {
      store_ds<K>(blk.at(blk.sdS), da, key0, g, t);
      fence_proxy_async();
      __syncthreads();  // sdS complete
#pragma unroll
      for (int ks = 0; ks < K::DQ_STEPS; ++ks)
        Wgmma<K::DQ_N>::template ss<1, 1>(dq, DsTile::mnmajor(dq_a, ks),
                                          KVTile::mnmajor(dq_b, ks), ks > 0, T{});
      wgmma_commit();
    }
    wgmma_wait<0>();
    fence_regs(dk);
    fence_regs(dv);
    fence_regs(pa);
    fence_regs(da);
    if constexpr (ATOMIC_DQ) fence_regs(dq);
  }
  if constexpr (ATOMIC_DQ) {
    if (n_iters > 0)
      blk.template add_dq<K::DQ_N>(n_iters - 1, dq, dq_row0, dq_col0, 0, dq_cols, g, t);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warpgroup's MMAs on sK and sV are done

  // Each warp stages its own 16 keys of dK * scale and dV in its rows of sK and sV.
  blk.store_keys(dk, f.scale, blk.sK, blk.dk_head(), p.dk_row_stride, key0, lane);
  blk.store_keys(dv, 1.f, blk.sV, blk.dv_head(), p.dv_row_stride, key0, lane);
}

template <class K, class VT, bool ATOMIC_DQ>
__global__ void __launch_bounds__(K::THREADS, 1) flash_wgmma_bwd_dkdv_wide(const BwdParams p) {
  static_assert(K::WIDE, "D <= 128 runs flash_wgmma_bwd_dkdv");
  using T = typename K::T;
  using KVTile = typename K::KVTile;
  using QTile = typename K::QTile;
  using DsTile = typename K::DsTile;
  const FwdParams& f = p.fwd;
  extern __shared__ __align__(1024) unsigned char smem[];
  const DkdvBlock<K, VT> blk(p, smem);
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int key0 = 16 * (warp % 4);  // this warp's first key (and dQ's first query row)
  const int n_iters = blk.walk.iters;
  blk.load_first();
  // Named barriers: sP written by warpgroup 0, sdS by warpgroup 1 (0 is __syncthreads').
  constexpr int BAR_P = 1, BAR_DS = 2;

  float acc[K::D / 2];  // warpgroup 0: dV, 1: dK / scale; the block's 64 keys x D
#pragma unroll
  for (int i = 0; i < K::D / 2; ++i) acc[i] = 0.f;
  float x[K::BLOCK_M / 2];   // warpgroup 0: S^T, then P^T; 1: dP^T, then dS^T
  u32 xa[K::KV_STEPS][4];    // x in 16 bits: the A operand of acc's wgmma
  float dq[K::DQ_N / 2];     // one round's columns of the tile's dQ
  const u32 x_a = wg ? blk.sV : blk.sK;
  // P^T handed from warpgroup 0 to 1, float4 i of a thread at slot i * 128 + thread:
  // both warpgroups' accumulators of one shape, so thread k of each holds the same
  // elements.
  float4* p_slots = reinterpret_cast<float4*>(blk.at(blk.sP)) + threadIdx.x % 128;

  for (int it = 0; it < n_iters; ++it) {
    const int m0 = blk.walk.m0(it);
    const int buf = it & 1;
    const u32 q_tile = blk.sQ + buf * K::SMEM_Q, o_tile = blk.sdO + buf * K::SMEM_Q;
    // Tile it visible to both proxies; both warpgroups are done with tile it - 1.
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();

    wgmma_fence();  // x, dq were read by ordinary code
    const u32 x_b = wg ? o_tile : q_tile;
#pragma unroll
    for (int ks = 0; ks < K::QK_STEPS; ++ks)
      Wgmma<K::BLOCK_M>::ss(x, KVTile::kmajor(x_a, 0, ks), QTile::kmajor(x_b, 0, ks), ks > 0, T{});
    wgmma_commit();
    if (it + 1 < n_iters) blk.load_q(it + 1);
    wgmma_wait<0>();
    fence_regs(x);

    if (wg == 0) {
      p_from_s<K, VT>(x, f, blk.lse(buf), m0, blk.n0 + key0, g, t);
#pragma unroll
      for (int i = 0; i < K::BLOCK_M / 8; ++i)
        p_slots[i * 128] = make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
      named_barrier_arrive(BAR_P, K::THREADS);
    } else {
      named_barrier_sync(BAR_P, K::THREADS);
      float pt[K::BLOCK_M / 2];
#pragma unroll
      for (int i = 0; i < K::BLOCK_M / 8; ++i) {
        const float4 v = p_slots[i * 128];
        pt[4 * i] = v.x, pt[4 * i + 1] = v.y, pt[4 * i + 2] = v.z, pt[4 * i + 3] = v.w;
      }
      ds_from_dp<K>(x, pt, blk.delta(buf), t);
    }
    pack_a<K>(xa, x);
    if (ATOMIC_DQ && wg == 1) {
      store_ds<K>(blk.at(blk.sdS), xa, key0, g, t);
      fence_proxy_async();
      named_barrier_arrive(BAR_DS, K::THREADS);
    }
    wgmma_fence();
    const u32 c_tile = wg ? q_tile : o_tile;
#pragma unroll
    for (int ks = 0; ks < K::KV_STEPS; ++ks)
      Wgmma<K::D>::rs(acc, xa[ks], QTile::mnmajor(c_tile, ks), T{});
    wgmma_commit();

    if constexpr (ATOMIC_DQ) {
      if (wg == 0) named_barrier_sync(BAR_DS, K::THREADS);
#pragma unroll
      for (int round = 0; round < K::DQ_ROUNDS; ++round) {
        const int col0 = K::dq_col0(round, wg);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < K::DQ_STEPS; ++ks)
          Wgmma<K::DQ_N>::template ss<1, 1>(
              dq, DsTile::mnmajor(blk.sdS, ks),
              KVTile::mnmajor(blk.sK + (col0 / 64) * KVTile::BLOCK_BYTES, ks), ks > 0, T{});
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dq);
        blk.template add_dq<K::DQ_N>(it, dq, key0, col0, K::dq_skip(wg), K::dq_cols(round, wg), g,
                                     t);
      }
    }
    wgmma_wait<0>();
    fence_regs(acc);
    fence_regs(xa);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warpgroup's MMAs on sK and sV are done

  // Warpgroup 0 stages dV in sV, warpgroup 1 dK * scale in sK, each warp its 16 keys.
  if (wg == 0) {
    blk.store_keys(acc, 1.f, blk.sV, blk.dv_head(), p.dv_row_stride, key0, lane);
  } else {
    blk.store_keys(acc, f.scale, blk.sK, blk.dk_head(), p.dk_row_stride, key0, lane);
  }
}
