// flash_wgmma: fused attention forward on Hopper tensor cores (wgmma), sm_90a only;
// fp16/bf16 in, fp32 accumulate.
//
// Layouts: see common/params.cuh; shared-memory tiles and wgmma facts: common/wgmma.cuh.
// Warp-specialized (FlashAttention-3's structure):
//   warpgroup 0, the producer, copies Q once (cp.async, all 128 threads); then one
//     thread has the copy engine bring K_j, V_j tile after tile into STAGES shared
//     buffers each (TMA, common/tma.cuh): a handful of instructions per tile, so
//     the consumers keep the issue slots. It keeps 40 registers (32 beside three
//     consumers; setmaxnreg.dec).
//   warpgroups 1..CONSUMERS (1 to 3), the consumers (setmaxnreg.inc), each own 64
//     query rows of the block (one wgmma M tile); inside one, a warp owns 16 rows end
//     to end, so softmax statistics never leave the warp.
// Buffers change hands through mbarriers: full_k[s] completes when the bytes of a
// K tile have landed (the copy engine counts them), empty_k[s] when every
// consumer warp is done reading it (after its wgmma wait); the same for V. Nothing
// waits for the whole block, so the consumers drift apart, and one named "turn"
// barrier per consumer keeps them in a round robin (FA3's ping-pong, generalized):
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
//   overlap): on most tiles without a row max at all (p = exp2(s * scale - m_i), the
//   row sums proving every p <= 256: softmax_fast), else scaled into the exp2 domain,
//   masked on edge/diagonal tiles, lazy max (softmax)
//   wait for P V, release V_{j-1}'s buffer; rescale acc; round P_j to 16-bit A fragments
// and last acc += P_{n-1} V_{n-1}; then acc /= l_i; each warp stages its 16 rows in
// its own rows of sQ; 16-byte stores; lse.
//
// Constraints: D % 8 == 0 and D <= 256; 16-byte aligned base pointers and strides,
// and K and V rows that are not all one row (a row stride of 0 has no tensor map);
// the host runs flash_mma otherwise. Q K^T steps over D_K = D rounded up to 16
// (columns D..D_K zero-filled: at most 8 padded columns), P V computes exactly D
// columns (wgmma's N is any multiple of 8). Shared rows are 64-column blocks
// (SwizzledTile), so the tiles themselves take D rounded up to 64 columns.
// Causal blocks run heaviest first. Masked scores are selected to -inf; a NaN in a
// masked V still reaches the product (0 * NaN), as in flash_mma and FlashAttention.
#include "common/mask.cuh"
#include "common/mma.cuh"
#include "common/softmax.cuh"
#include "common/tma.cuh"
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
  static constexpr int SMEM_BARS = (1 + 4 * STAGES) * 8;
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

// The producer's copy of Q's ROWS x D tile (row stride `stride`) into the swizzled
// tile at shared address `s`, zero-filling rows >= rows_valid (<= ROWS) and
// columns D..D_K (columns D_K.. of the last 64-column block are never read and
// never written); `tid` is the thread's index among the producer's 128. Per
// 64-column block the 128 threads cover 16 rows x 8 chunks, and a thread's rows
// r0, r0 + 16, ... agree mod 8, so its swizzled destination advances by a constant:
// four instructions per 16-byte copy whatever the head dim. `head` is any valid
// address of the tensor, read by nothing (cp.async with 0 source bytes).
template <class K, class Tile, int ROWS>
__device__ __forceinline__ void load_tile(u32 s, const typename K::T* g, i64 stride, int rows_valid,
                                          const typename K::T* head, int tid) {
  static_assert(ROWS % 16 == 0, "16 rows per pass");
  const int r0 = tid / 8;
  // Partly unrolled: the producer has 40 registers.
#pragma unroll 1
  for (int blk = 0; blk < CeilDiv<K::D_K, 64>::value; ++blk) {
    const int chunk = blk * 8 + tid % 8;
    if (chunk * 8 < K::D_K) {
      const bool col_ok = chunk * 8 < K::D;
      const u32 dst = s + Tile::offset(r0, chunk);
      const typename K::T* src = g + r0 * stride + chunk * 8;
#pragma unroll 4
      for (int i = 0; i < ROWS / 16; ++i) {
        const bool ok = col_ok && r0 + 16 * i < rows_valid;
        cp_async_16(dst + i * 16 * 128, ok ? src : head, ok);
        src += 16 * stride;
      }
    }
  }
}

template <class K, class CausalT>
__global__ void __launch_bounds__(K::THREADS, K::MIN_BLOCKS)
    flash_wgmma_fwd(const FwdParams p, const __grid_constant__ TmaMap k_map,
                    const __grid_constant__ TmaMap v_map) {
  using T = typename K::T;
  constexpr int S = K::STAGES;
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 sQ = (smem_addr(smem) + 1023) & ~1023u;
  const u32 sK = sQ + K::SMEM_Q;          // S buffers of SMEM_KV bytes each
  const u32 sV = sK + S * K::SMEM_KV;     // S buffers
  const u32 sL = sV + S * K::SMEM_KV;     // see the main loop
  const u32 q_full = sL + K::SMEM_L;      // mbarriers, 8 bytes each
  const u32 full_k = q_full + 8, full_v = full_k + 8 * S;
  const u32 empty_k = full_v + 8 * S, empty_v = empty_k + 8 * S;

  const int m_block = CausalT::enabled ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, h_kv = h / p.group;
  // Warp-uniform by construction; broadcast from lane 0 so that the compiler knows
  // it too and keeps what derives from it (barrier ids, Q's descriptor) in
  // uniform registers.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  const int q0 = m_block * K::BLOCK_M;
  const int q_rows = cmin(K::BLOCK_M, p.seqlen_q - q0);
  const int k_end = CausalT::k_end(q0 + q_rows - 1, p.seqlen_k, p.causal_offset);
  const int n_blocks = ceil_div(k_end, K::BLOCK_N);

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 128);
    for (int s = 0; s < S; ++s) {
      mbarrier_init(full_k + 8 * s, 1);  // the producer's arrival with the byte count
      mbarrier_init(full_v + 8 * s, 1);
      mbarrier_init(empty_k + 8 * s, 4 * K::CONSUMERS);
      mbarrier_init(empty_v + 8 * s, 4 * K::CONSUMERS);
    }
  }
  __syncthreads();  // the only block-wide barrier

  if (wg == 0) {
    // Producer: Q, then K_j and V_{j-1} for j = 0..n_blocks (each tile's V is used
    // one step after its K). Use u of buffer s waits for the release of use u - 1.
    setmaxnreg_dec<K::PRODUCER_REGS>();
    const int tid = threadIdx.x;
    const T* q_head = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
    load_tile<K, typename K::QTile, K::BLOCK_M>(sQ, q_head + q0 * p.q_row_stride, p.q_row_stride,
                                                q_rows, q_head, tid);
    cp_async_mbarrier_arrive(q_full);
    if (tid == 0) {
      // Map coordinates: a broadcast (stride 0) head or batch axis is a map of size 1.
      const int k_h = p.k_head_stride ? h_kv : 0, k_b = p.k_batch_stride ? b : 0;
      const int v_h = p.v_head_stride ? h_kv : 0, v_b = p.v_batch_stride ? b : 0;
      // Tile j of `map` into buffer j % S of `buf` once its previous use is released.
      auto load = [&](const TmaMap& map, int hc, int bc, u32 buf, u32 full, u32 empty, int j) {
        const int s = j % S;
        if (j >= S) mbarrier_wait(empty + 8 * s, (j / S - 1) & 1);
        mbarrier_arrive_expect_tx(full + 8 * s, K::SMEM_KV);
#pragma unroll
        for (int blk = 0; blk < CeilDiv<K::D_K, 64>::value; ++blk)
          tma_load_4d(buf + s * K::SMEM_KV + blk * K::BLOCK_N * 128, map, blk * 64, j * K::BLOCK_N,
                      hc, bc, full + 8 * s);
      };
      for (int j = 0; j <= n_blocks; ++j) {
        if (j < n_blocks) load(k_map, k_h, k_b, sK, full_k, empty_k, j);
        if (j >= 1) load(v_map, v_h, v_b, sV, full_v, empty_v, j - 1);
      }
    }
    cp_async_wait<0>();
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

  auto k_ready = [&](int j) { mbarrier_wait(full_k + 8 * (j % S), (j / S) & 1); };
  auto v_ready = [&](int j) { mbarrier_wait(full_v + 8 * (j % S), (j / S) & 1); };
  auto release_k = [&](int j) { if (lane == 0) mbarrier_arrive(empty_k + 8 * (j % S)); };
  auto release_v = [&](int j) { if (lane == 0) mbarrier_arrive(empty_v + 8 * (j % S)); };

  float acc[K::D_TILES * 4];
#pragma unroll
  for (int i = 0; i < K::D_TILES * 4; ++i) acc[i] = 0.f;
  // Rows g and g + 8 of the warp; l_i is this lane's partial sum until the end.
  SoftmaxRow row[2];
  row[0].init();
  row[1].init();
  float s[K::N_TILES * 4];   // S of the current tile, then P = exp2(S - m_i)
  u32 pa[K::PV_STEPS][4];    // P of the previous tile in 16 bits: the A operand of P V
  float alpha[2];            // acc rescale factors of rows g, g + 8 for the current tile

  // This warpgroup's 64 rows of Q against all BLOCK_N rows of K_j.
  // Descriptors: one per tile, advanced per k16 step (desc_advance).
  const u64 q_desc = K::QTile::kmajor(sQ, c * 64, 0);
  auto issue_qk = [&](int j) {  // s = Q K_j^T
    const u64 k_desc = K::KVTile::kmajor(sK + (j % S) * K::SMEM_KV, 0, 0);
#pragma unroll
    for (int ks = 0; ks < K::QK_STEPS; ++ks)
      Wgmma<K::BLOCK_N>::ss(s, desc_advance(q_desc, K::QTile::kmajor_offset(ks)),
                            desc_advance(k_desc, K::KVTile::kmajor_offset(ks)), ks > 0, T{});
    wgmma_commit();
  };
  auto issue_pv = [&](int j) {  // acc += P_j V_j
    const u64 v_desc = K::KVTile::mnmajor(sV + (j % S) * K::SMEM_KV, 0);
#pragma unroll
    for (int ks = 0; ks < K::PV_STEPS; ++ks)
      Wgmma<K::D>::rs(acc, pa[ks], desc_advance(v_desc, K::KVTile::mnmajor_offset(ks)), T{});
    wgmma_commit();
  };
  // Tiles that need a mask: the last key tile and tiles crossing the causal diagonal
  // (one column limit per row covers both). Warp-uniform.
  auto needs_mask = [&](int j) {
    const int k0 = j * K::BLOCK_N;
    return k0 + K::BLOCK_N > p.seqlen_k ||
           CausalT::needs_mask(q0 + row0, k0 + K::BLOCK_N - 1, p.causal_offset);
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
    const int k0 = j * K::BLOCK_N;
    float scale = p.scale_log2;
    if (needs_mask(j) || scale < 0.f) {
#pragma unroll
      for (int i = 0; i < K::N_TILES * 4; ++i) s[i] *= scale;
      scale = 1.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = q0 + row0 + g + 8 * r;
        const int col_end = CausalT::k_end(i, p.seqlen_k, p.causal_offset) - k0;
#pragma unroll
        for (int nt = 0; nt < K::N_TILES; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (nt * 8 + 2 * t + e >= col_end) s[nt * 4 + 2 * r + e] = -CA_INF;
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
  // The common case without the max (SoftmaxRow::LAZY_BOUND): an interior tile
  // under a scale >= 0 in a warp whose rows all have a finite m_i. P in s, this
  // thread's parts of the row sums in `sum` (not yet added to l_i); false if a sum
  // fails the bound (then settle_fast).
  auto softmax_fast = [&](float (&sum)[2]) {
    bool ok = true;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] = exp_row(r, p.scale_log2, -row[r].m_i);
      ok = ok && sum[r] <= SoftmaxRow::LAZY_BOUND;
    }
    return ok;
  };
  // The raw scores of key tile j in this thread's fragment, in fp32 from Q's shared
  // tile and K in global memory (K_j's buffer may already hold a later tile). Rolled
  // loops for a path this rare: each n8 group's four scores enter at the end of s,
  // which shifts down by four, so every register index stays a constant.
  auto scores_from_global = [&](int j) {
    const T* k_tile = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride +
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

  mbarrier_wait(q_full, 0);
  if (n_blocks > 0) {
    fence_proxy_async();  // Q landed through the generic proxy, wgmma reads async
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
      const bool fast = __all_sync(0xffffffffu, !needs_mask(j) && p.scale_log2 >= 0.f &&
                                                     row[0].m_i != -CA_INF && row[1].m_i != -CA_INF);
      if (fast) {
        float sum[2];
        if (__any_sync(0xffffffffu, !softmax_fast(sum))) {
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
    v_ready(n_blocks - 1);
    my_turn();
    wgmma_fence();
    issue_pv(n_blocks - 1);
    pass_turn();
    wgmma_wait<0>();
    fence_regs(acc);
  }
  if (c == 0) my_turn();  // consumes the last consumer's last pass_turn: the counts balance

  // Epilogue: finish the row sums across the quad, normalize, stage through this
  // warp's own 16 rows of sQ (read only by its own, completed, MMAs), then store
  // whole rows.
  unsigned char* q_bytes = smem + (sQ - smem_addr(smem));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r].l_i = group_sum<4>(row[r].l_i);
    const float inv_l = row[r].inv_l();
#pragma unroll
    for (int dt = 0; dt < K::D / 8; ++dt) {
      const u32 packed = MmaType<T>::pack(acc[dt * 4 + 2 * r] * inv_l, acc[dt * 4 + 2 * r + 1] * inv_l);
      *reinterpret_cast<u32*>(q_bytes + K::QTile::offset(row0 + g + 8 * r, dt) + 4 * t) = packed;
    }
  }
  __syncwarp();

  T* o_head = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride;
  const int rows_here = cmin(16, q_rows - row0);
  constexpr int CHUNKS = K::D / 8;
#pragma unroll
  for (int e = lane; e < 16 * CHUNKS; e += 32) {
    const int r = e / CHUNKS, chunk = e % CHUNKS;
    if (r < rows_here) {
      *reinterpret_cast<uint4*>(o_head + (q0 + row0 + r) * p.o_row_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(q_bytes + K::QTile::offset(row0 + r, chunk));
    }
  }
  if (p.lse && t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = q0 + row0 + g + 8 * r;
      if (i < p.seqlen_q) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = row[r].lse();
    }
  }
}
