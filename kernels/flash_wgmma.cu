// flash_wgmma: fused attention forward on Hopper tensor cores (wgmma), sm_90a only;
// fp16/bf16 in, fp32 accumulate.
//
// Layouts: see common/params.cuh; shared-memory tiles and wgmma facts: common/wgmma.cuh.
// Persistent: the grid is one block per SM (per SM slot of the config), and each
// block works through tiles of BLOCK_M query rows of one (head, batch), claimed
// from a counter (work_tile), so the next tile's Q, K and V load while the current
// one finishes instead of behind a block launch.
// Warp-specialized (FlashAttention-3's structure):
//   warpgroup 0, the producer: one thread has the copy engine bring, per work tile,
//     K_0, each consumer's 64 rows of Q, then K_j, V_j tile after tile into STAGES
//     shared buffers each (TMA, common/tma.cuh): a handful of instructions per tile, so
//     the consumers keep the issue slots. It keeps 40 registers (32 beside three
//     consumers; setmaxnreg.dec).
//   warpgroups 1..CONSUMERS (1 to 3), the consumers (setmaxnreg.inc), each own 64
//     query rows of the tile (one wgmma M tile); inside one, a warp owns 16 rows end
//     to end, so softmax statistics never leave the warp.
// Buffers change hands through mbarriers: full_k[s] completes when the bytes of a
// K tile have landed (the copy engine counts them), empty_k[s] when every
// consumer warp is done reading it (after its wgmma wait); the same for V, and
// q_full[c], q_empty[c] for consumer c's rows of Q. Nothing waits for the whole
// block, so the consumers drift apart, and one named "turn" barrier per consumer
// keeps them in a round robin (FA3's ping-pong, generalized):
// consumer c issues its MMAs only after consumer c - 1 issued its own, so a softmax
// runs while the other warpgroups' MMAs occupy the tensor cores. With three
// consumers a softmax hides behind two warpgroups' MMAs: at small head dims, where
// the exp2 of a score costs nearly as much as its MMAs, one is not enough.
//
// Consumer steps, for each key tile j (up to the causal bound):
//   wait for K_j and V_{j-1} (full barriers); wait for the turn
//   issue S_j = Q K_j^T          wgmma m64n{BLOCK_N}k16, A = Q and B = K in shared memory
//   issue acc += P_{j-1} V_{j-1} wgmma m64n{D}k16, A = P in registers, B = V (MN-major)
//   pass the turn; wait for S_j only, release K_j's buffer; online softmax in
//   registers (m_i, l_i) while P V still runs (FlashAttention-3's intra-warpgroup
//   overlap): once a row has a reference m_i, without a row max at all (p = exp2(s *
//   scale - m_i), masked p selected to 0 on edge/diagonal tiles, the row sums proving
//   every p <= 256: softmax_fast), else (a row's first tile, a negative scale) scaled
//   into the exp2 domain, masked, lazy max (softmax)
//   wait for P V, release V_{j-1}'s buffer; rescale acc; round P_j to 16-bit A fragments
// and last acc += P_{n-1} V_{n-1} (Q's rows already handed back); then acc /= l_i,
// stored from the registers (16 bytes a thread after a transpose in the quad); lse.
//
// Constraints: D % 8 == 0 and D <= 256; 16-byte aligned base pointers and strides,
// and Q, K and V rows that are not all one row (a row stride of 0 has no tensor
// map); the host runs flash_mma otherwise. Q K^T steps over D_K = D rounded up to 16
// (columns D..D_K zero-filled: at most 8 padded columns), P V computes exactly D
// columns (wgmma's N is any multiple of 8). Shared rows are 64-column blocks
// (SwizzledTile), so the tiles themselves take D rounded up to 64 columns.
// Causal work tiles run heaviest first. Masked scores are selected to -inf; a NaN in a
// masked V still reaches the product (0 * NaN), as in flash_mma and FlashAttention.
#include "common/mma.cuh"
#include "common/softmax.cuh"
#include "common/tma.cuh"
#include "common/variant.cuh"
#include "common/wgmma.cuh"

template <int D_, int CONSUMERS_, int BLOCK_N_, class T_, int MIN_BLOCKS_, int STAGES_>
struct WgmmaTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_K = RoundUp<D_, 16>::value;    // K of Q K^T (k16 steps); P V's N is D
  static constexpr int CONSUMERS = CONSUMERS_;
  static constexpr int BLOCK_M = 64 * CONSUMERS;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int STAGES = STAGES_;
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;       // blocks per SM
  // Registers per thread at launch (ptxas allocates the __launch_bounds__ cap when
  // the kernel hands registers around); the producer gives registers up and the
  // consumers take exactly what it freed (setmaxnreg.inc would wait forever for more).
  static constexpr int LAUNCH_REGS = 65536 / (THREADS * MIN_BLOCKS) / 8 * 8;
  static constexpr int PRODUCER_REGS = CONSUMERS == 3 ? 32 : 40;
  static constexpr int CONSUMER_REGS =
      cmin((LAUNCH_REGS * THREADS - 128 * PRODUCER_REGS) / (128 * CONSUMERS) / 8 * 8, 240);
  static constexpr int N_TILES = BLOCK_N / 8;          // n8 column groups of S per thread
  static constexpr int D_TILES = D / 8;                // n8 column groups of O per thread
  static constexpr int QK_STEPS = D_K / 16;            // k16 steps of Q K^T
  static constexpr int PV_STEPS = BLOCK_N / 16;        // k16 steps of P V
  using QTile = SwizzledTile<BLOCK_M, D_K>;  // 64-column blocks: D_K rounded up to 64
  using KVTile = SwizzledTile<BLOCK_N, D_K>;
  static constexpr int SMEM_Q = QTile::BYTES;
  static constexpr int SMEM_KV = KVTile::BYTES;
  static constexpr int SMEM_L = 128 * CONSUMERS * 8;   // one float2 per consumer thread
  static constexpr int Q_SLICE_BYTES = CeilDiv<D_K, 64>::value * 64 * 128;  // one consumer's rows
  static constexpr int SMEM_BARS = 8 + (2 * CONSUMERS + 4 * STAGES) * 8;  // + the tile slots
  // + 1024: the base is rounded up to the 1024-byte boundary the swizzle is defined on.
  static constexpr int SMEM_BYTES = SMEM_Q + 2 * STAGES * SMEM_KV + SMEM_L + SMEM_BARS + 1024;

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D % 8 == 0 && D <= 256, "16-byte copies need D % 8 == 0; D <= 256");
  static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256,
                "S = Q K^T is one wgmma m64n{BLOCK_N}; P V steps over BLOCK_N in k16");
  static_assert(CONSUMERS >= 1 && CONSUMERS <= 3, "one to three consumer warpgroups");
  static_assert(CONSUMER_REGS >= LAUNCH_REGS && LAUNCH_REGS >= PRODUCER_REGS,
                "too many blocks per SM for the register file");
};

// Work tiles: BLOCK_M query rows of one (head, batch). The query blocks of a head
// are consecutive, the heaviest first under the causal mask (the last rows see
// the most keys), so the blocks running together share K and V in L2. Block x
// starts with tile x; after that each block's producer claims the next unclaimed
// tile from a counter in global memory (atomicAdd), so a block that drew light
// tiles takes more of them and the blocks finish together. (A fixed order, block x
// taking every G-th tile, ran 0.61-0.85x at S >= 8k under the causal mask; it
// remains the fallback where there is no counter.) Block m starts at query row
// m * BLOCK_M - q_shift: with 0 < q_shift <= m_blocks * BLOCK_M - seqlen_q (the host
// picks it, under the causal mask only) the partial block of a length that is not
// a multiple of BLOCK_M comes first, where the causal mask leaves the fewest keys,
// instead of last, with the most. Its rows before row 0 are zeros from the copy
// engine and never stored; a consumer whose 64 rows all lie there sits the tile out.
struct WorkTile {
  int m_block, h, b;
};

template <class VT>
__device__ __forceinline__ WorkTile work_tile(const FwdParams& p, int m_blocks, int tile) {
  const int m = tile % m_blocks, hb = tile / m_blocks;
  return {VT::kCausal ? m_blocks - 1 - m : m, hb % p.heads_q, hb / p.heads_q};
}

// 4 x 4 transpose across a quad (t = lane % 4): afterwards x[j] is what lane j of
// the quad held in x[t]. Two exchanges of 2 x 2 blocks (lanes t ^ 2, then t ^ 1).
__device__ __forceinline__ void quad_transpose(u32 (&x)[4], int t) {
  const bool hi = t & 2, odd = t & 1;
  u32 a = __shfl_xor_sync(0xffffffffu, hi ? x[0] : x[2], 2);
  u32 b = __shfl_xor_sync(0xffffffffu, hi ? x[1] : x[3], 2);
  x[0] = hi ? a : x[0];  // selects, not an indexed store: x stays in registers
  x[1] = hi ? b : x[1];
  x[2] = hi ? x[2] : a;
  x[3] = hi ? x[3] : b;
  a = __shfl_xor_sync(0xffffffffu, odd ? x[0] : x[1], 1);
  b = __shfl_xor_sync(0xffffffffu, odd ? x[2] : x[3], 1);
  x[0] = odd ? a : x[0];
  x[1] = odd ? x[1] : a;
  x[2] = odd ? b : x[2];
  x[3] = odd ? x[3] : b;
}

template <class K, class VT>
__global__ void __launch_bounds__(K::THREADS, K::MIN_BLOCKS)
    flash_wgmma_fwd(const FwdParams p, const __grid_constant__ TmaMap q_map,
                    const __grid_constant__ TmaMap k_map, const __grid_constant__ TmaMap v_map,
                    u32* tile_counter, int q_shift) {
  using T = typename K::T;
  constexpr int S = K::STAGES;
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 sQ = (smem_addr(smem) + 1023) & ~1023u;
  const u32 sK = sQ + K::SMEM_Q;          // S buffers of SMEM_KV bytes each
  const u32 sV = sK + S * K::SMEM_KV;     // S buffers
  const u32 sL = sV + S * K::SMEM_KV;     // see the main loop
  const u32 s_tile = sL + K::SMEM_L;      // two work tile slots (int each)
  const u32 q_full = s_tile + 8;          // mbarriers, 8 bytes each: one per consumer
  const u32 q_empty = q_full + 8 * K::CONSUMERS;
  const u32 full_k = q_empty + 8 * K::CONSUMERS, full_v = full_k + 8 * S;
  const u32 empty_k = full_v + 8 * S, empty_v = empty_k + 8 * S;

  int* tile_slot = reinterpret_cast<int*>(smem + (s_tile - smem_addr(smem)));
  const int m_blocks = ceil_div(p.seqlen_q, K::BLOCK_M);
  const int tiles = m_blocks * p.heads_q * p.batch;
  // Warp-uniform by construction; broadcast from lane 0 so that the compiler knows
  // it too and keeps what derives from it (barrier ids, Q's descriptor) in
  // uniform registers.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  // The current work tile, its first query row and its number of key tiles (set
  // per tile by both sides alike); its head and batch come from cur() where
  // needed, which keeps two registers free in the consumers' loop.
  int tile_now = 0, q0 = 0, n_blocks = 0;
  auto start_tile = [&](int tile) {
    tile_now = tile;
    const WorkTile w = work_tile<VT>(p, m_blocks, tile);
    q0 = w.m_block * K::BLOCK_M - q_shift;
    const int q_last = cmin(q0 + K::BLOCK_M, p.seqlen_q) - 1;
    n_blocks = ceil_div(VT::kv_end(p, q_last), K::BLOCK_N);
    return w;
  };
  auto cur = [&]() { return work_tile<VT>(p, m_blocks, tile_now); };

  if (threadIdx.x == 0) {
    for (int c = 0; c < K::CONSUMERS; ++c) {
      mbarrier_init(q_full + 8 * c, 1);  // the producer's arrival with the byte count
      mbarrier_init(q_empty + 8 * c, 4);  // lane 0 of each of the consumer's warps
    }
    for (int s = 0; s < S; ++s) {
      mbarrier_init(full_k + 8 * s, 1);
      mbarrier_init(full_v + 8 * s, 1);
      mbarrier_init(empty_k + 8 * s, 4 * K::CONSUMERS);
      mbarrier_init(empty_v + 8 * s, 4 * K::CONSUMERS);
    }
  }
  __syncthreads();  // the only block-wide barrier

  if (wg == 0) {
    // Producer, one thread: per work tile K_0, each consumer's 64 rows of Q once it
    // released the previous tile's, then K_j and V_{j-1} for j = 1..n_blocks (each
    // tile's V is used one step after its K). The K and V buffers run on across
    // work tiles: load u (counted over the block's whole life) goes to buffer
    // u % S once use u - S is released.
    setmaxnreg_dec<K::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      auto load = [&](const TmaMap& map, int hc, int bc, u32 buf, u32 full, u32 empty, int u,
                      int row) {
        const int s = u % S;
        if (u >= S) mbarrier_wait(empty + 8 * s, (u / S - 1) & 1);
        mbarrier_arrive_expect_tx(full + 8 * s, K::SMEM_KV);
#pragma unroll
        for (int blk = 0; blk < CeilDiv<K::D_K, 64>::value; ++blk)
          tma_load_4d(buf + s * K::SMEM_KV + blk * K::KVTile::BLOCK_BYTES, map, blk * 64, row, hc,
                      bc, full + 8 * s);
      };
      // Work tile u (counted over the block's life) is published in s_tile slot
      // u % 2 together with its Q (q_full[c] completes after both), -1 after the
      // last one. A slot is rewritten two tiles later, when every consumer has
      // released that tile's Q.
      int done = 0, kv = 0;  // work tiles and K (or V) tiles loaded so far
      int tile = blockIdx.x;
      while (true) {
        tile_slot[done & 1] = tile < tiles ? tile : -1;
        if (tile >= tiles) {
          for (int c = 0; c < K::CONSUMERS; ++c) {
            if (done > 0) mbarrier_wait(q_empty + 8 * c, (done - 1) & 1);
            mbarrier_arrive(q_full + 8 * c);
          }
          break;
        }
        const WorkTile w = start_tile(tile);
        const int h = w.h, b = w.b, h_kv = h / p.group;
        // Map coordinates: a broadcast (stride 0) head or batch axis is a map of size 1.
        const int q_h = p.q_head_stride ? h : 0, q_b = p.q_batch_stride ? b : 0;
        const int k_h = p.k_head_stride ? h_kv : 0, k_b = p.k_batch_stride ? b : 0;
        const int v_h = p.v_head_stride ? h_kv : 0, v_b = p.v_batch_stride ? b : 0;
        // K_0 first: its buffer is free before the consumers hand back Q.
        if (n_blocks > 0) load(k_map, k_h, k_b, sK, full_k, empty_k, kv, 0);
        for (int c = 0; c < K::CONSUMERS; ++c) {
          if (done > 0) mbarrier_wait(q_empty + 8 * c, (done - 1) & 1);
          mbarrier_arrive_expect_tx(q_full + 8 * c, K::Q_SLICE_BYTES);
#pragma unroll
          for (int blk = 0; blk < CeilDiv<K::D_K, 64>::value; ++blk)
            tma_load_4d(sQ + blk * K::QTile::BLOCK_BYTES + c * 64 * 128, q_map, blk * 64,
                        q0 + 64 * c, q_h, q_b, q_full + 8 * c);
        }
        // The next tile is claimed with the last load, about STAGES key tiles before
        // the consumers finish this one: early enough to load its Q and K_0 in
        // time, late enough that a block busy with a long tile leaves the tiles
        // after it to blocks that are free sooner. Claims 0, 1, ... go to tiles G,
        // G + 1, ...; each block's last claim is past the end, so there are exactly
        // `tiles` claims, and the last one resets the counter for the next launch
        // in this stream.
        // Without a counter (a launch captured into a CUDA graph in a stream that
        // had none yet) the blocks take fixed turns instead: round r gives block x
        // tile rG + x, or rG + G - 1 - x in odd rounds.
        auto claim_next = [&]() { return tile_counter ? int(atomicAdd(tile_counter, 1u)) : 0; };
        int claim = n_blocks > 0 ? 0 : claim_next();
        for (int j = 1; j <= n_blocks; ++j) {
          if (j < n_blocks)
            load(k_map, k_h, k_b, sK, full_k, empty_k, kv + j, j * K::BLOCK_N);
          else
            claim = claim_next();
          load(v_map, v_h, v_b, sV, full_v, empty_v, kv + j - 1, (j - 1) * K::BLOCK_N);
        }
        kv += n_blocks;
        ++done;
        const int grid = gridDim.x, x = blockIdx.x;
        if (!tile_counter) {
          tile = done * grid + (done & 1 ? grid - 1 - x : x);
        } else {
          if (claim == tiles - 1) atomicExch(tile_counter, 0u);
          tile = claim + grid;
        }
      }
    }
    return;
  }

  setmaxnreg_inc<K::CONSUMER_REGS>();
  const int c = wg - 1;                              // consumer index
  const int ctid = threadIdx.x - 128;                // thread index among the consumers
  const int warp = ctid / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = warp * 16;  // this warp's first row within the block

  // Round robin: consumer c issues its MMAs after barrier TURN + c, then lets the next
  // one go (bar.arrive); the last consumer lets consumer 0 start.
  constexpr int TURN = 2 + K::CONSUMERS;  // named barriers 1.. are warpgroup_barrier's
  constexpr bool TURNS = K::CONSUMERS > 1;
  auto my_turn = [&]() { if constexpr (TURNS) named_barrier_sync(TURN + c, 256); };
  auto pass_turn = [&]() {
    if constexpr (TURNS) named_barrier_arrive(TURN + (c + 1) % K::CONSUMERS, 256);
  };
  if (c == K::CONSUMERS - 1) pass_turn();

  // Key tile j of the current work tile is the block's K (and V) load kv + j.
  int kv = 0;
  auto k_ready = [&](int j) { mbarrier_wait(full_k + 8 * ((kv + j) % S), ((kv + j) / S) & 1); };
  auto v_ready = [&](int j) { mbarrier_wait(full_v + 8 * ((kv + j) % S), ((kv + j) / S) & 1); };
  auto release_k = [&](int j) { if (lane == 0) mbarrier_arrive(empty_k + 8 * ((kv + j) % S)); };
  auto release_v = [&](int j) { if (lane == 0) mbarrier_arrive(empty_v + 8 * ((kv + j) % S)); };

  float acc[K::D_TILES * 4];
  // Rows g and g + 8 of the warp; l_i is this lane's partial sum until the end.
  SoftmaxRow row[2];
  float s[K::N_TILES * 4];   // S of the current tile, then P = exp2(S - m_i)
  u32 pa[K::PV_STEPS][4];    // P of the previous tile in 16 bits: the A operand of P V
  float alpha[2];            // acc rescale factors of rows g, g + 8 for the current tile

  // This warpgroup's 64 rows of Q against all BLOCK_N rows of K_j.
  // Descriptors: one per tile, advanced per k16 step (desc_advance).
  const u64 q_desc = K::QTile::kmajor(sQ, c * 64, 0);
  auto issue_qk = [&](int j) {  // s = Q K_j^T
    const u64 k_desc = K::KVTile::kmajor(sK + ((kv + j) % S) * K::SMEM_KV, 0, 0);
#pragma unroll
    for (int ks = 0; ks < K::QK_STEPS; ++ks)
      Wgmma<K::BLOCK_N>::ss(s, desc_advance(q_desc, K::QTile::kmajor_offset(ks)),
                            desc_advance(k_desc, K::KVTile::kmajor_offset(ks)), ks > 0, T{});
    wgmma_commit();
  };
  auto issue_pv = [&](int j) {  // acc += P_j V_j
    const u64 v_desc = K::KVTile::mnmajor(sV + ((kv + j) % S) * K::SMEM_KV, 0);
#pragma unroll
    for (int ks = 0; ks < K::PV_STEPS; ++ks)
      Wgmma<K::D>::rs(acc, pa[ks], desc_advance(v_desc, K::KVTile::mnmajor_offset(ks)), T{});
    wgmma_commit();
  };
  // Tiles that need a mask: the last key tile and tiles crossing the causal diagonal
  // (one column limit per row covers both). Warp-uniform.
  auto needs_mask = [&](int j) {
    const int k0 = j * K::BLOCK_N;
    return VT::partial(p, q0 + row0, q0 + row0 + 15, k0, k0 + K::BLOCK_N - 1);
  };
  // The first masked column of key tile j in this thread's row r (causal bound
  // and end of the keys).
  auto col_end = [&](int r, int j) {
    return VT::kv_end(p, q0 + row0 + g + 8 * r) - j * K::BLOCK_N;
  };
  // Row r of the tile: p = exp2(s * scale - ref) in place; returns this thread's
  // part of the row sum.
  auto exp_row = [&](int r, float scale, float neg_ref) {
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < K::N_TILES; ++nt) {
      s[nt * 4 + 2 * r] = fast_exp2(fmaf(s[nt * 4 + 2 * r], scale, neg_ref));
      s[nt * 4 + 2 * r + 1] = fast_exp2(fmaf(s[nt * 4 + 2 * r + 1], scale, neg_ref));
      sum += s[nt * 4 + 2 * r] + s[nt * 4 + 2 * r + 1];
    }
    return sum;
  };
  // Scores into the exp2 domain and online softmax with the row max; leaves P in s
  // and the rescale factors in alpha. Interior tiles fold the scale into the FFMA
  // before ex2 (p = exp2(s * scale - m_i), the row max taken on raw scores). Tiles
  // that need a mask scale first, then select -inf, so no masked score meets the
  // scale; so does every tile under a negative scale (the row max of raw scores
  // would be the wrong end). The max is lazy (SoftmaxRow::rescale_lazy) unless
  // `exact`.
  auto softmax = [&](int j, bool exact) {
    float scale = p.scale_log2;
    if (needs_mask(j) || scale < 0.f) {
#pragma unroll
      for (int i = 0; i < K::N_TILES * 4; ++i) s[i] *= scale;
      scale = 1.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int end = col_end(r, j);
#pragma unroll
        for (int nt = 0; nt < K::N_TILES; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (nt * 8 + 2 * t + e >= end) s[nt * 4 + 2 * r + e] = -CA_INF;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -CA_INF;
#pragma unroll
      for (int nt = 0; nt < K::N_TILES; ++nt)
        mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
      const float tile_max = group_max<4>(mx) * scale;
      alpha[r] = exact ? row[r].rescale(tile_max) : row[r].rescale_lazy(tile_max);
      row[r].l_i += exp_row(r, scale, -row[r].ref());
    }
  };
  // The common case without the max (SoftmaxRow::LAZY_BOUND): a tile under a scale
  // >= 0 in a warp whose rows all have a finite m_i. P in s, this thread's parts of
  // the row sums in `sum` (not yet added to l_i); false if a sum fails the bound
  // (then settle_fast). Under the causal mask a tile that needs one (`masked`: the
  // diagonal, the last key tile) takes this path too, a masked p selected to 0 after
  // its exp2: no max to protect, and whatever its score, nothing of it is left.
  // (Without the causal mask only the last key tile needs one; it stays with
  // softmax, which keeps this kernel's code as it was: 0.92-0.95x at S = 512 with
  // the masked variant compiled in, H200.)
  auto softmax_fast = [&](float (&sum)[2], int j, bool masked) {
    bool ok = true;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (VT::kCausal && masked) {
        const int end = col_end(r, j);
        sum[r] = 0.f;
#pragma unroll
        for (int nt = 0; nt < K::N_TILES; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[nt * 4 + 2 * r + e];
            const float pe = fast_exp2(fmaf(x, p.scale_log2, -row[r].m_i));
            x = nt * 8 + 2 * t + e < end ? pe : 0.f;
            sum[r] += x;
          }
      } else {
        sum[r] = exp_row(r, p.scale_log2, -row[r].m_i);
      }
      ok = ok && sum[r] <= SoftmaxRow::LAZY_BOUND;
    }
    return ok;
  };
  // The raw scores of key tile j in this thread's fragment, in fp32 from Q's shared
  // tile and K in global memory (K_j's buffer may already hold a later tile). Rolled
  // loops for a path this rare: each n8 group's four scores enter at the end of s,
  // which shifts down by four, so every register index stays a constant.
  auto scores_from_global = [&](int j) {
    const WorkTile w = cur();
    const T* k_tile = static_cast<const T*>(p.k) + w.b * p.k_batch_stride +
                      (w.h / p.group) * p.k_head_stride +
                      (i64(j) * K::BLOCK_N + 2 * t) * p.k_row_stride;
    const unsigned char* q_bytes = smem + (sQ - smem_addr(smem));
#pragma unroll 1
    for (int nt = 0; nt < K::N_TILES; ++nt) {
      float dot[4] = {0.f, 0.f, 0.f, 0.f};  // (row g + 8r, column 8nt + 2t + e) at 2r + e
#pragma unroll 1
      for (int x = 0; x < K::D; x += 2) {  // two columns at a time: few registers
        const u32 q_at = K::QTile::offset(row0 + g, x / 8) + (x % 8) * 2;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const u32 kw = *reinterpret_cast<const u32*>(k_tile + (nt * 8 + e) * p.k_row_stride + x);
          const T* kv = reinterpret_cast<const T*>(&kw);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            // row g + 8 sits 8 rows on: same swizzle phase, 8 * 128 bytes further
            const u32 qw = *reinterpret_cast<const u32*>(q_bytes + q_at + r * 8 * 128);
            const T* qv = reinterpret_cast<const T*>(&qw);
            dot[2 * r + e] = fmaf(to_float(qv[0]), to_float(kv[0]), dot[2 * r + e]);
            dot[2 * r + e] = fmaf(to_float(qv[1]), to_float(kv[1]), dot[2 * r + e]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < K::N_TILES * 4 - 4; ++i) s[i] = s[i + 4];
#pragma unroll
      for (int i = 0; i < 4; ++i) s[K::N_TILES * 4 - 4 + i] = dot[i];
    }
  };
  // A fast tile that failed its bound (rare), settled without the max: a row's
  // largest p gives its new reference m_i + log2(p_max), and its p, l_i and acc
  // scale by 1 / p_max (alpha). A p that overflowed (a score 128 above m_i) has lost
  // the score: then the warp computes its scores again and takes softmax(j, true).
  auto settle_fast = [&](int j, float (&sum)[2]) {
    float pmax[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x = 0.f;
#pragma unroll
      for (int nt = 0; nt < K::N_TILES; ++nt)
        x = fmaxf(x, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
      pmax[r] = group_max<4>(x);
    }
    if (__any_sync(0xffffffffu, pmax[0] == CA_INF || pmax[1] == CA_INF)) {
      // P V's A fragments stay put until it completes; then they are dead (the next
      // pack rewrites them), and zeros give their registers to this path.
      wgmma_wait<0>();
      fence_regs(pa);
#pragma unroll
      for (int ks = 0; ks < K::PV_STEPS; ++ks)
#pragma unroll
        for (int i = 0; i < 4; ++i) pa[ks][i] = 0u;
      scores_from_global(j);
      softmax(j, true);
      return;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float a = 1.f;
      if (pmax[r] > SoftmaxRow::LAZY_BOUND) {
        const float shift = exact_log2(pmax[r]);
        a = exact_exp2(-shift);
        row[r].m_i += shift;
        sum[r] = 0.f;
#pragma unroll
        for (int nt = 0; nt < K::N_TILES; ++nt) {
          s[nt * 4 + 2 * r] *= a;
          s[nt * 4 + 2 * r + 1] *= a;
          sum[r] += s[nt * 4 + 2 * r] + s[nt * 4 + 2 * r + 1];
        }
      }
      row[r].l_i = row[r].l_i * a + sum[r];
      alpha[r] = a;
    }
  };
  // acc *= alpha (acc must be complete; skipped when no row of the warp moved its
  // max), then P -> 16-bit A fragments: two n8 groups of S are one k16 step of P V.
  auto rescale_and_pack = [&]() {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int dt = 0; dt < K::D_TILES; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt * 4 + e] *= alpha[e / 2];
    }
#pragma unroll
    for (int ks = 0; ks < K::PV_STEPS; ++ks) {
      const float* s0 = s + 8 * ks;
      pa[ks][0] = MmaType<T>::pack(s0[0], s0[1]);
      pa[ks][1] = MmaType<T>::pack(s0[2], s0[3]);
      pa[ks][2] = MmaType<T>::pack(s0[4], s0[5]);
      pa[ks][3] = MmaType<T>::pack(s0[6], s0[7]);
    }
  };

  // Per work tile: Q's rows from the producer, the key loop, then the output
  // straight from the accumulators (Q's rows go back to the producer once the last
  // softmax is done, so the next tile's Q lands while this one finishes).
  for (int done = 0;; ++done) {  // work tiles finished
    mbarrier_wait(q_full + 8 * c, done & 1);
    // Lane 0 reads the slot for the warp: the producer rewrites it once lane 0's
    // release of this tile's Q (below) has come, which orders only lane 0's own read.
    const int tile = __shfl_sync(0xffffffffu, lane == 0 ? tile_slot[done & 1] : 0, 0);
    if (tile < 0) break;
    start_tile(tile);
    if (q0 + 64 * c >= p.seqlen_q || q0 + 64 * (c + 1) <= 0) {
      // All of this consumer's rows lie past the last query or before the first
      // (a partial block): nothing to compute or store. It still takes its turns,
      // and hands each buffer back once it has landed (a release before that would
      // count toward the buffer's previous use).
      for (int j = 0; n_blocks > 0 && j <= n_blocks; ++j) {  // n_blocks + 1 turns, as below
        if (j < n_blocks) {
          k_ready(j);
          release_k(j);
        }
        if (j > 0) {
          v_ready(j - 1);
          release_v(j - 1);
        }
        my_turn();
        pass_turn();
      }
      if (lane == 0) mbarrier_arrive(q_empty + 8 * c);
      kv += n_blocks;
      continue;
    }
#pragma unroll
    for (int i = 0; i < K::D_TILES * 4; ++i) acc[i] = 0.f;
    row[0].init();
    row[1].init();
    if (n_blocks > 0) {
      k_ready(0);
      my_turn();
      wgmma_fence();
      issue_qk(0);
      pass_turn();
      wgmma_wait<0>();
      fence_regs(s);
      release_k(0);
      softmax(0, false);
      rescale_and_pack();
      for (int j = 1; j < n_blocks; ++j) {
        k_ready(j);
        v_ready(j - 1);
        my_turn();
        wgmma_fence();  // s, pa and acc were written by ordinary code
        issue_qk(j);
        issue_pv(j - 1);
        pass_turn();
        wgmma_wait<1>();
        fence_regs(s);
        release_k(j);
        const bool masked = needs_mask(j);
        const bool fast =
            __all_sync(0xffffffffu, (VT::kCausal || !masked) && p.scale_log2 >= 0.f &&
                                        row[0].m_i != -CA_INF && row[1].m_i != -CA_INF);
        if (fast) {
          float sum[2];
          if (__any_sync(0xffffffffu, !softmax_fast(sum, j, masked))) {
            settle_fast(j, sum);
          } else {
            row[0].l_i += sum[0];
            row[1].l_i += sum[1];
            alpha[0] = alpha[1] = 1.f;
          }
        } else {
          softmax(j, false);
        }
        // ptxas hoists the wait above independent arithmetic, which would run the
        // softmax after P V instead of beside it. Arithmetic moves across barriers,
        // shared-memory stores do not: storing l_i (it depends on every exp of the
        // tile) before a warpgroup barrier pins the softmax ahead of the wait.
        *reinterpret_cast<float2*>(smem + (sL - smem_addr(smem)) + ctid * 8) =
            make_float2(row[0].l_i, row[1].l_i);
        warpgroup_barrier(wg);
        wgmma_wait<0>();
        fence_regs(acc);
        fence_regs(pa);
        release_v(j - 1);
        rescale_and_pack();
      }
    }
    // Every Q K^T is complete and no softmax will read Q again (scores_from_global).
    if (lane == 0) mbarrier_arrive(q_empty + 8 * c);
    if (n_blocks > 0) {
      v_ready(n_blocks - 1);
      my_turn();
      wgmma_fence();
      issue_pv(n_blocks - 1);
      pass_turn();
      wgmma_wait<0>();
      fence_regs(acc);
      release_v(n_blocks - 1);
    }

    // Epilogue: finish the row sums across the quad, normalize, and store: a quad
    // holds four n8 column groups of a row as 4-byte pairs, and after a transpose
    // within the quad each thread stores one group's 16 contiguous bytes (whole
    // 32-byte sectors per quad; 4-byte stores would write every sector in halves).
    const WorkTile w = cur();
    T* o_head = static_cast<T*>(p.o) + w.b * p.o_batch_stride + w.h * p.o_head_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row[r].l_i = group_sum<4>(row[r].l_i);
      const float inv_l = row[r].inv_l();
      const int i = q0 + row0 + g + 8 * r;
      T* o_row = o_head + i64(i) * p.o_row_stride;
#pragma unroll
      for (int dt0 = 0; dt0 < K::D_TILES; dt0 += 4) {
        u32 x[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int dt = cmin(dt0 + k, K::D_TILES - 1);  // past D: a copy, never stored
          x[k] = MmaType<T>::pack(acc[dt * 4 + 2 * r] * inv_l, acc[dt * 4 + 2 * r + 1] * inv_l);
        }
        quad_transpose(x, t);
        if (i >= 0 && i < p.seqlen_q && dt0 + t < K::D_TILES)
          *reinterpret_cast<uint4*>(o_row + (dt0 + t) * 8) = make_uint4(x[0], x[1], x[2], x[3]);
      }
      if (p.lse && t == 0 && i >= 0 && i < p.seqlen_q)
        p.lse[w.b * p.lse_batch_stride + w.h * p.lse_head_stride + i] = row[r].lse();
    }
    kv += n_blocks;
  }
  if (c == 0) my_turn();  // consumes the last consumer's last pass_turn: the counts balance
}
