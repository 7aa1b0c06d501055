// flash_mma: fused attention forward on tensor cores (fp16/bf16 in, fp32 accumulate),
// FlashAttention-2 style, for sm_80 and newer.
//
// Layouts: see common/params.cuh. One block computes BLOCK_M query rows of one
// (batch, query head); each warp owns 16 * M_TILES of those rows end to end, so
// softmax statistics never cross warps. With M_TILES = 2 every K/V fragment read
// from shared memory feeds two MMAs, halving shared-memory traffic per FLOP.
//
// Steps (per block):
//   1. cp.async Q and the first STAGES - 1 key/value tiles into shared memory.
//   2. for each key tile j (up to the causal bound):
//        wait for tile j; one barrier, after which tile j-1's buffer is free
//        issue cp.async of tile j + STAGES - 1 into that buffer
//        (STAGES = 1: V[j] issued here, K[j + 1] once every warp is past S)
//        S = Q K[j]^T              ldmatrix + mma.m16n8k16, fp32 accumulators
//        online softmax in registers (FragSoftmax; the scale folded into the
//        exp2 on tiles without a mask), acc rescaled
//        P = exp2(S - m_i) rounded to 16 bits, kept in registers as A fragments
//        acc += P V[j]             ldmatrix.trans + mma
//   3. acc /= l_i; stage the tile in shared memory; 16-byte stores; lse.
// Shared rows are padded by 16 bytes so the 8 row addresses of every ldmatrix
// land in distinct banks, or at D_PAD = 256 swizzled instead (SmemRows,
// common/copy.cuh).
//
// Constraints: D <= 256 (padded to a multiple of 16 in shared memory and registers
// only). VEC (16-byte aligned base pointers and strides, D % 8 == 0) uses cp.async
// and vector stores; otherwise tiles are staged with element loads. Causal blocks
// run heaviest first. Masked scores are selected to -inf, so NaN in masked K
// stays out; a NaN in a masked V still reaches the product (0 * NaN), as in
// FlashAttention.
#include "common/copy.cuh"
#include "common/mma.cuh"
#include "common/softmax.cuh"
#include "common/variant.cuh"

template <int D_, int BLOCK_M_, int BLOCK_N_, int WARPS_, int STAGES_, class T_, bool VEC_>
struct MmaTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_PAD = RoundUp<D_, 16>::value;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int WARPS = WARPS_;
  // Key/value tiles in flight: STAGES >= 2 buffers of both, tile j + STAGES - 1
  // loaded while tile j is computed; 1: one buffer of each, V of tile j loaded while
  // S of tile j is computed and K of tile j + 1 while P V of tile j is (FlashAttention-
  // 2's order: less shared memory, so two blocks an SM at D = 256 and 64 rows).
  static constexpr int STAGES = STAGES_;
  static constexpr int THREADS = WARPS * 32;
  static constexpr bool VEC = VEC_;
  static constexpr int M_TILES = BLOCK_M / (16 * WARPS);  // m16 tiles per warp
  static constexpr int WARP_ROWS = 16 * M_TILES;
  // Shared rows (common/copy.cuh): swizzled at D_PAD = 256, where the tile loop's
  // ldmatrix and copies keep shared memory busiest and the swizzle halves the
  // copies' wavefronts (H200: 1.08-1.13x). At D_PAD = 64 and 128 its lane addresses
  // took registers (12-28 bytes spilled under ptxas 13.5); at 192 it ran level.
  static constexpr bool SWIZZLE = D_PAD == 256;
  using Rows = SmemRows<D_PAD, SWIZZLE>;
  static constexpr int SROW = Rows::STRIDE;     // shared row stride in elements
  static constexpr int N_TILES = BLOCK_N / 8;   // n8 tiles of S per warp
  static constexpr int D_TILES = D_PAD / 8;     // n8 tiles of O per warp
  static constexpr int QK_STEPS = D_PAD / 16;   // k16 steps of Q K^T
  static constexpr int PV_STEPS = BLOCK_N / 16; // k16 steps of P V
  // Q fragments stay in registers when they fit beside acc and S; otherwise they
  // are re-read from shared memory for every key tile.
  static constexpr bool Q_IN_REGS = M_TILES * D_PAD <= 128;
  // The row max: lazy, acc rescaled only when a row of the warp moved it, on 32-row
  // warps; exact, acc rescaled every tile, on 16-row warps (D > 128), where the lazy
  // max's branches cost more than the multiplications they skip (H100:
  // benchmarks/results/notes-kernel-comments.md).
  static constexpr bool LAZY_MAX = M_TILES > 1;
  static constexpr int SMEM_Q = BLOCK_M * SROW;
  static constexpr int SMEM_KV = BLOCK_N * SROW;
  static constexpr int SMEM_BYTES = (SMEM_Q + 2 * STAGES * SMEM_KV) * 2;

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D >= 1 && D <= 256, "head dim 1..256");
  static_assert(M_TILES >= 1 && BLOCK_M == WARP_ROWS * WARPS, "BLOCK_M = 16 * M_TILES * WARPS");
  static_assert(BLOCK_N % 16 == 0, "key tiles are whole k16 steps of P V");
  static_assert(STAGES >= 1, "key/value buffers");
  static_assert(!VEC || D % 8 == 0, "16-byte copies need D % 8 == 0");
};

// A ROWS-row tile of this kernel's shape (see common/copy.cuh), rows >= rows_valid
// zero-filled.
template <class KT, int ROWS>
__device__ __forceinline__ void load_tile(typename KT::T* dst, const typename KT::T* g, i64 stride,
                                          int rows_valid, const typename KT::T* head) {
  copy_tile<ROWS, KT::D, KT::D_PAD, KT::SROW, KT::THREADS, KT::VEC, KT::SWIZZLE>(dst, g, stride, 0,
                                                                               rows_valid, head);
}

// The accumulators of one warp: MT m16 row tiles by N n8 column tiles, mma C
// fragments (see MmaFrag in common/variant.cuh).
template <class KT, int N>
using WarpTiles = float[KT::M_TILES][N][4];

template <class KT, int N>
__device__ __forceinline__ void zero(WarpTiles<KT, N>& x) {
#pragma unroll
  for (int mt = 0; mt < KT::M_TILES; ++mt)
#pragma unroll
    for (int nt = 0; nt < N; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[mt][nt][e] = 0.f;
}

// S = Q K_j^T for the warp's rows. Reads: Q's A fragments from qf (Q_IN_REGS) or
// from sQ at q_addr; K_j from shared memory at k_addr (the tile's buffer).
// Writes: s (raw dot products).
template <class KT>
__device__ __forceinline__ void qk_tile(WarpTiles<KT, KT::N_TILES>& s,
                                        const u32 (&qf)[KT::Q_IN_REGS ? KT::M_TILES : 1]
                                                       [KT::Q_IN_REGS ? KT::QK_STEPS : 1][4],
                                        u32 q_addr, u32 k_addr) {
  using T = typename KT::T;
  constexpr int MT = KT::M_TILES;
  constexpr u32 M_TILE_BYTES = 16 * KT::SROW * 2;
  zero<KT, KT::N_TILES>(s);
#pragma unroll
  for (int ks = 0; ks < KT::QK_STEPS; ++ks) {
    u32 a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (KT::Q_IN_REGS) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][ks][e];
      } else {
        ldmatrix_x4(a[mt], KT::SWIZZLE ? KT::Rows::step(q_addr, 2 * ks) + mt * M_TILE_BYTES
                                       : q_addr + mt * M_TILE_BYTES + ks * 32);
      }
    }
#pragma unroll
    for (int nt = 0; nt < KT::N_TILES; nt += 2) {
      u32 bk[4];
      ldmatrix_x4(bk, KT::SWIZZLE ? KT::Rows::step(k_addr, 2 * ks) + nt * 8 * KT::SROW * 2
                                  : k_addr + (nt * 8 * KT::SROW + ks * 16) * 2);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816(s[mt][nt], a[mt], bk[0], bk[1], T{});
        mma_16816(s[mt][nt + 1], a[mt], bk[2], bk[3], T{});
      }
    }
  }
}

// acc += P V_j. Reads: P from s (rounded to 16 bits as A fragments), V_j from
// shared memory at v_addr (the tile's buffer, read with ldmatrix.trans).
template <class KT>
__device__ __forceinline__ void pv_tile(WarpTiles<KT, KT::D_TILES>& acc,
                                        const WarpTiles<KT, KT::N_TILES>& s, u32 v_addr) {
  using T = typename KT::T;
  constexpr int MT = KT::M_TILES;
#pragma unroll
  for (int ks = 0; ks < KT::PV_STEPS; ++ks) {
    u32 a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = MmaType<T>::pack(s[mt][2 * ks][0], s[mt][2 * ks][1]);
      a[mt][1] = MmaType<T>::pack(s[mt][2 * ks][2], s[mt][2 * ks][3]);
      a[mt][2] = MmaType<T>::pack(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
      a[mt][3] = MmaType<T>::pack(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
    }
#pragma unroll
    for (int dt = 0; dt < KT::D_TILES; dt += 2) {
      u32 bv[4];
      ldmatrix_x4_trans(bv, KT::SWIZZLE ? KT::Rows::step(v_addr, dt) + ks * 16 * KT::SROW * 2
                                        : v_addr + (ks * 16 * KT::SROW + dt * 8) * 2);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816(acc[mt][dt], a[mt], bv[0], bv[1], T{});
        mma_16816(acc[mt][dt + 1], a[mt], bv[2], bv[3], T{});
      }
    }
  }
}

// Epilogue of one warp: finish the row sums across the quad, normalize, stage the
// warp's rows through its own rows of sQ, store whole rows of O, then lse. Waits
// on: nothing (the caller has drained cp.async and passed a block barrier, so no
// warp reads sQ any more). Writes: O rows q0 + row0 .. (below Sq), lse.
template <class KT>
__device__ __forceinline__ void store_o(const FwdParams& p, WarpTiles<KT, KT::D_TILES>& acc,
                                        FragSoftmax<KT::N_TILES> (&sm)[KT::M_TILES],
                                        typename KT::T* sQ, int b, int h, int q0, int q_rows,
                                        int row0, int lane) {
  using T = typename KT::T;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < KT::M_TILES; ++mt) {
    sm[mt].finish();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float inv_l = sm[mt].row[r].inv_l();
#pragma unroll
      for (int dt = 0; dt < KT::D_TILES; ++dt) {
        const u32 packed = MmaType<T>::pack(acc[mt][dt][2 * r] * inv_l, acc[mt][dt][2 * r + 1] * inv_l);
        *reinterpret_cast<u32*>(
            KT::SWIZZLE ? sQ + KT::Rows::at(row0 + 16 * mt + g + 8 * r, dt * 8 + 2 * t)
                        : sQ + (row0 + 16 * mt + g + 8 * r) * KT::SROW + dt * 8 + 2 * t) = packed;
      }
    }
  }
  __syncwarp();

  T* o_head = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride;
  const int rows_here = cmin(KT::WARP_ROWS, q_rows - row0);
  if constexpr (KT::VEC) {
    constexpr int CHUNKS = KT::D / 8;
    for (int c = lane; c < KT::WARP_ROWS * CHUNKS; c += 32) {
      const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
      if (r < rows_here) {
        *reinterpret_cast<uint4*>(o_head + (q0 + row0 + r) * p.o_row_stride + col) =
            *reinterpret_cast<const uint4*>(KT::SWIZZLE ? sQ + KT::Rows::at(row0 + r, col)
                                                        : sQ + (row0 + r) * KT::SROW + col);
      }
    }
  } else {
    for (int e = lane; e < KT::WARP_ROWS * KT::D; e += 32) {
      const int r = e / KT::D, col = e % KT::D;
      if (r < rows_here)
        o_head[(q0 + row0 + r) * p.o_row_stride + col] =
            KT::SWIZZLE ? sQ[KT::Rows::at(row0 + r, col)] : sQ[(row0 + r) * KT::SROW + col];
    }
  }
  if (p.lse && t == 0) {
#pragma unroll
    for (int mt = 0; mt < KT::M_TILES; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = q0 + row0 + 16 * mt + g + 8 * r;
        if (i < p.seqlen_q) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = sm[mt].row[r].lse();
      }
  }
}

// One block: BLOCK_M query rows of one (batch, query head), the key tiles of the
// variant's band. Grid: x = query block (heaviest first when causal), y = query
// head, z = batch; with SECTIONS section_block's (common/seqs.cuh: sections of
// (head, entry) pairs; the host's flash_mma.sections).
// Packed sequences (RaggedSeqs): x runs over the virtual query blocks of every
// sequence (common/seqs.cuh), z = 1; a block past its sequence's end returns.
template <class KT, class VT, bool SECTIONS>
__global__ void __launch_bounds__(KT::THREADS) flash_mma_fwd(const FwdParams args) {
  using T = typename KT::T;
  using Seqs = typename VT::Seqs;
  constexpr int MT = KT::M_TILES;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + KT::SMEM_Q;                   // STAGES buffers of BLOCK_N rows
  T* sV = sK + KT::STAGES * KT::SMEM_KV;

  // Packed sequences: the sequence's params live in shared memory behind the tiles
  // (the host adds their size), read where used; in registers they spilled at D = 128.
  int m_block, h, b;
  const FwdParams& p = Seqs::template bind_grid<T, KT::BLOCK_M, false, VT::kCausal, SECTIONS>(
      args, args.heads_q, m_block, h, b, smem + KT::SMEM_BYTES);
  const int h_kv = h / p.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = m_block * KT::BLOCK_M;
  const int q_rows = cmin(KT::BLOCK_M, p.seqlen_q - q0);
  if (Seqs::kRagged && q_rows <= 0) return;  // block-uniform
  const int row0 = warp * KT::WARP_ROWS;  // this warp's first row within the block

  const T* q_head = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
  const T* k_head = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const T* v_head = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;

  // Key tiles n_begin .. n_begin + n_blocks - 1: the band of the block's rows.
  const int n_begin = VT::kv_begin(p, q0) / KT::BLOCK_N;
  const int n_blocks = ceil_div(VT::kv_end(p, q0 + q_rows - 1), KT::BLOCK_N) - n_begin;

  // STAGES >= 2: tile j goes to buffer j % STAGES; one commit group per tile (empty
  // past the end) keeps the group count uniform, so "tile j landed" is
  // wait_group<STAGES - 2>. STAGES = 1: K and V of tile j in groups of their own
  // (load_k, load_v), each waited for whole.
  auto load_k = [&](int j) {
    const int k0 = (n_begin + j) * KT::BLOCK_N, rows = cmin(KT::BLOCK_N, p.seqlen_k - k0);
    load_tile<KT, KT::BLOCK_N>(sK, k_head + k0 * p.k_row_stride, p.k_row_stride, rows, k_head);
    cp_async_commit();
  };
  auto load_v = [&](int j) {
    const int k0 = (n_begin + j) * KT::BLOCK_N, rows = cmin(KT::BLOCK_N, p.seqlen_k - k0);
    load_tile<KT, KT::BLOCK_N>(sV, v_head + k0 * p.v_row_stride, p.v_row_stride, rows, v_head);
    cp_async_commit();
  };
  auto load_kv = [&](int j) {
    if (j < n_blocks) {
      const int k0 = (n_begin + j) * KT::BLOCK_N, rows = cmin(KT::BLOCK_N, p.seqlen_k - k0);
      const int buf = (j % KT::STAGES) * KT::SMEM_KV;
      load_tile<KT, KT::BLOCK_N>(sK + buf, k_head + k0 * p.k_row_stride, p.k_row_stride, rows, k_head);
      load_tile<KT, KT::BLOCK_N>(sV + buf, v_head + k0 * p.v_row_stride, p.v_row_stride, rows, v_head);
    }
    cp_async_commit();
  };
  load_tile<KT, KT::BLOCK_M>(sQ, q_head + q0 * p.q_row_stride, p.q_row_stride, q_rows, q_head);
  if constexpr (KT::STAGES == 1) {
    if (n_blocks > 0) load_k(0);  // Q rides in K's group of tile 0
    else cp_async_commit();
  }
#pragma unroll
  for (int j = 0; j < KT::STAGES - 1; ++j) load_kv(j);  // Q rides in tile 0's group

  float acc[MT][KT::D_TILES][4];
  zero<KT, KT::D_TILES>(acc);
  // Rows g and g + 8 of each m16 tile; l_i is this lane's partial sum until the end.
  FragSoftmax<KT::N_TILES> sm[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) sm[mt].init();
  u32 qf[KT::Q_IN_REGS ? MT : 1][KT::Q_IN_REGS ? KT::QK_STEPS : 1][4];

  // ldmatrix lane addressing (see common/mma.cuh): matrix lane / 8, row lane % 8.
  const int lm = lane / 8, lr = lane % 8;
  // (padded rows: every shared address below in the form it always had, which ptxas
  // schedules as before; forms of the same value moved the D = 128 kernels' SASS)
  const u32 q_addr = smem_addr(KT::SWIZZLE ? sQ + KT::Rows::at(row0 + lr + 8 * (lm & 1), 8 * (lm >> 1))
                                           : sQ + (row0 + lr + 8 * (lm & 1)) * KT::SROW + 8 * (lm >> 1));
  const u32 k_addr = smem_addr(KT::SWIZZLE ? sK + KT::Rows::at(lr + 8 * (lm >> 1), 8 * (lm & 1))
                                           : sK + (lr + 8 * (lm >> 1)) * KT::SROW + 8 * (lm & 1));
  const u32 v_addr = smem_addr(KT::SWIZZLE ? sV + KT::Rows::at(lr + 8 * (lm & 1), 8 * (lm >> 1))
                                           : sV + (lr + 8 * (lm & 1)) * KT::SROW + 8 * (lm >> 1));
  constexpr u32 M_TILE_BYTES = 16 * KT::SROW * 2;

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int k0 = (n_begin + nb) * KT::BLOCK_N;
    const u32 buf_bytes = (nb % KT::STAGES) * KT::SMEM_KV * 2;
    if constexpr (KT::STAGES == 1) {
      cp_async_wait<0>();
      __syncthreads();  // K of tile nb (and Q) visible; every warp is done with sV
      load_v(nb);
    } else {
      cp_async_wait<KT::STAGES - 2>();
      __syncthreads();  // tile nb (and Q) visible; every warp is done with tile nb - 1
      load_kv(nb + KT::STAGES - 1);
    }
    if constexpr (KT::Q_IN_REGS) {
      if (nb == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int ks = 0; ks < KT::QK_STEPS; ++ks)
            ldmatrix_x4(qf[mt][ks], KT::SWIZZLE
                                        ? KT::Rows::step(q_addr, 2 * ks) + mt * M_TILE_BYTES
                                        : q_addr + mt * M_TILE_BYTES + ks * 32);
      }
    }

    float s[MT][KT::N_TILES][4];
    qk_tile<KT>(s, qf, q_addr, k_addr + buf_bytes);
    if constexpr (KT::STAGES == 1) {
      cp_async_wait<0>();
      __syncthreads();  // V of tile nb visible; every warp is done with sK
      if (nb + 1 < n_blocks) load_k(nb + 1);
    }
    // The online softmax (FragSoftmax; the row max as KT::LAZY_MAX says). Plain
    // logits on a tile that needs no mask fold the scale into the exp2's FFMA, the
    // max taken on the raw dots; tiles that need a mask (VT::partial), a variant that
    // transforms the score and a negative scale (the max of the dots would be the min
    // of the scores) become scores first through the variant (Scores::forward: band,
    // logits, dense mask; masked -inf).
    // What was tried here: benchmarks/results/notes-kernel-comments.md.
    const bool edge = VT::partial(p, q0 + row0, q0 + row0 + KT::WARP_ROWS - 1, k0,
                                  k0 + KT::BLOCK_N - 1);
    const bool fold = !edge && !VT::kTransform && p.scale_log2 >= 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (!fold)
        Scores<VT>::forward(MmaFrag<KT::N_TILES>(lane), [&](int x) -> float& { return s[mt][x / 4][x % 4]; },
                            p, b, h, q0 + row0 + 16 * mt, k0, edge);
      const float scale = fold ? p.scale_log2 : 1.f;
      float(&st)[KT::N_TILES * 4] = reinterpret_cast<float(&)[KT::N_TILES * 4]>(s[mt]);
      sm[mt].maxes(st, scale, KT::LAZY_MAX);
      sm[mt].template rescale<KT::LAZY_MAX>(reinterpret_cast<float(&)[KT::D_TILES * 4]>(acc[mt]));
      sm[mt].exps(st, scale);
    }
    if constexpr (VT::Drop::enabled) {   // after the row sums: they stay those of P
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        VT::Drop::template fragment<KT::N_TILES>(
            p, b * p.heads_q + h, q0 + row0 + 16 * mt, k0, lane,
            reinterpret_cast<float(&)[KT::N_TILES * 4]>(s[mt]));
    }
    pv_tile<KT>(acc, s, v_addr + buf_bytes);
  }

  cp_async_wait<0>();
  __syncthreads();  // no copy into sQ is in flight and every warp is done reading it
  store_o<KT>(p, acc, sm, sQ, b, h, q0, q_rows, row0, lane);
}
