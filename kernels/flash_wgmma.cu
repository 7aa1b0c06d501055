// flash_wgmma: fused attention forward on Hopper tensor cores (wgmma), sm_90a only;
// fp16/bf16 in, fp32 accumulate.
//
// Layouts: see common/params.cuh; shared-memory tiles and wgmma facts: common/wgmma.cuh.
// One block computes BLOCK_M = 64 * WARPGROUPS query rows of one (batch, query head).
// Warpgroup w owns rows 64w..64w+63 (one wgmma M tile) and, inside it, warp k of the
// block owns rows 16k..16k+15 end to end, so softmax statistics never leave the warp.
//
// Steps (per block):
//   1. cp.async Q, K_0 and V_0 into swizzled shared tiles (two buffers each for K, V).
//   2. S_0 = Q K_0^T; softmax; then for each further key tile j (up to the causal bound):
//        wait for K_j and V_{j-1}; proxy fence; one barrier, after which the buffers
//        of K_{j-1} and V_{j-2} are free
//        issue S_j = Q K_j^T          wgmma m64n{BLOCK_N}k16, A = Q and B = K in shared memory
//        issue acc += P_{j-1} V_{j-1} wgmma m64n{D_K}k16, A = P in registers, B = V (MN-major)
//        cp.async K_{j+1} and V_j into the free buffers
//        wait for S_j only; scale into the exp2 domain; mask only edge/diagonal tiles;
//        online softmax in registers (m_i, l_i) while P V still runs
//        wait for P V; rescale acc; round P_j to 16-bit A fragments in registers
//      and last acc += P_{n-1} V_{n-1}. (FlashAttention-3's intra-warpgroup overlap.)
//   3. acc /= l_i; each warp stages its 16 rows in its own rows of sQ; 16-byte stores; lse.
// Barriers keep the warpgroups of a block in step; each one waits only for its own MMAs.
//
// Constraints: D % 8 == 0 and D <= 256; 16-byte aligned base pointers and strides
// (the host runs flash_mma otherwise). Q K^T steps over D_K = D rounded up to 16
// (columns D..D_K zero-filled) and P V computes D_K columns, D of them stored: the
// MMAs pay for at most 8 padded columns. Shared rows are 64-column blocks
// (SwizzledTile), so the tiles themselves take D rounded up to 64 columns.
// Causal blocks run heaviest first. Masked scores are selected to -inf; a NaN in a
// masked V still reaches the product (0 * NaN), as in flash_mma and FlashAttention.
#include "common/mask.cuh"
#include "common/mma.cuh"
#include "common/softmax.cuh"
#include "common/wgmma.cuh"

template <int D_, int WARPGROUPS_, int BLOCK_N_, class T_, int MIN_BLOCKS_>
struct WgmmaTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_K = RoundUp<D_, 16>::value;    // tile columns; K of Q K^T, N of P V
  static constexpr int WARPGROUPS = WARPGROUPS_;
  static constexpr int BLOCK_M = 64 * WARPGROUPS;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int THREADS = 128 * WARPGROUPS;
  // Blocks per SM for __launch_bounds__: 2 caps registers at 65536 / (2 * THREADS).
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int N_TILES = BLOCK_N / 8;          // n8 column groups of S per thread
  static constexpr int D_TILES = D_K / 8;              // n8 column groups of O per thread
  static constexpr int QK_STEPS = D_K / 16;            // k16 steps of Q K^T
  static constexpr int PV_STEPS = BLOCK_N / 16;        // k16 steps of P V
  using QTile = SwizzledTile<BLOCK_M, D_K>;  // 64-column blocks: D_K rounded up to 64
  using KVTile = SwizzledTile<BLOCK_N, D_K>;
  static constexpr int SMEM_Q = QTile::BYTES;
  static constexpr int SMEM_KV = KVTile::BYTES;
  // + 1024: the base is rounded up to the 1024-byte boundary the swizzle is defined on.
  static constexpr int SMEM_BYTES = SMEM_Q + 4 * SMEM_KV + THREADS * 8 + 1024;  // Q, 2 K, 2 V, sL

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D % 8 == 0 && D <= 256, "16-byte copies need D % 8 == 0; D <= 256");
  static_assert(BLOCK_N % 64 == 0 && BLOCK_N <= 256, "S = Q K^T is one wgmma m64n{BLOCK_N}");
};

// Copy a ROWS x D tile (row stride `stride`) into the swizzled tile at shared address
// `s`, zero-filling rows >= rows_valid (<= ROWS) and columns D..D_K. `head` is any
// valid address of the tensor, read by nothing (cp.async with 0 source bytes).
template <class K, class Tile, int ROWS>
__device__ __forceinline__ void load_tile(u32 s, const typename K::T* g, i64 stride, int rows_valid,
                                          const typename K::T* head) {
  constexpr int CHUNKS = K::D_K / 8;
  constexpr int PASS_ROWS = K::THREADS / CHUNKS;  // rows one pass of the block covers
  if constexpr (K::THREADS % CHUNKS == 0 && PASS_ROWS % 8 == 0) {
    // Each thread copies one chunk column at rows r0, r0 + PASS_ROWS, ...; those rows
    // agree mod 8, so the swizzled destination advances by a constant.
    const int r0 = threadIdx.x / CHUNKS, chunk = threadIdx.x % CHUNKS;
    const bool col_ok = chunk * 8 < K::D;
    const u32 dst = s + Tile::offset(r0, chunk);

    const typename K::T* src = g + r0 * stride + chunk * 8;
#pragma unroll
    for (int i = 0; i < CeilDiv<ROWS, PASS_ROWS>::value; ++i) {
      const int r = r0 + i * PASS_ROWS;
      if (ROWS % PASS_ROWS == 0 || r < ROWS) {  // a zero-fill past ROWS would hit the next tile
        const bool ok = col_ok && r < rows_valid;
        cp_async_16(dst + i * PASS_ROWS * 128, ok ? src + i * PASS_ROWS * stride : head, ok);
      }
    }
  } else {
#pragma unroll
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += K::THREADS) {
      const int r = c / CHUNKS, chunk = c % CHUNKS;
      const bool ok = r < rows_valid && chunk * 8 < K::D;
      cp_async_16(s + Tile::offset(r, chunk), ok ? g + r * stride + chunk * 8 : head, ok);
    }
  }
}

template <class K, class CausalT>
__global__ void __launch_bounds__(K::THREADS, K::MIN_BLOCKS) flash_wgmma_fwd(const FwdParams p) {
  using T = typename K::T;
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 sQ = (smem_addr(smem) + 1023) & ~1023u;
  const u32 sK = sQ + K::SMEM_Q;  // two buffers of SMEM_KV bytes each
  const u32 sV = sK + 2 * K::SMEM_KV;
  const u32 sL = sV + 2 * K::SMEM_KV;  // one float2 per thread, see the main loop

  const int m_block = CausalT::enabled ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, h_kv = h / p.group;
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int q0 = m_block * K::BLOCK_M;
  const int q_rows = cmin(K::BLOCK_M, p.seqlen_q - q0);
  const int row0 = warp * 16;  // this warp's first row within the block

  const T* q_head = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
  const T* k_head = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const T* v_head = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;

  const int k_end = CausalT::k_end(q0 + q_rows - 1, p.seqlen_k, p.causal_offset);
  const int n_blocks = ceil_div(k_end, K::BLOCK_N);

  // K_j goes to K buffer j % 2 and V_j to V buffer j % 2. Commit group j holds K_j
  // and V_{j-1} (group 0 also Q): a tile's V is used one step after its K (below),
  // so with two buffers each both arrive a whole step ahead of use, and each step
  // waits for every copy issued so far (wait_group 0).
  auto load_group = [&](int j) {
    if (j < n_blocks) {
      const int k0 = j * K::BLOCK_N;
      load_tile<K, typename K::KVTile, K::BLOCK_N>(sK + (j % 2) * K::SMEM_KV, k_head + k0 * p.k_row_stride,
                               p.k_row_stride, cmin(K::BLOCK_N, p.seqlen_k - k0), k_head);
    }
    if (j >= 1 && j - 1 < n_blocks) {
      const int k0 = (j - 1) * K::BLOCK_N;
      load_tile<K, typename K::KVTile, K::BLOCK_N>(sV + ((j - 1) % 2) * K::SMEM_KV, v_head + k0 * p.v_row_stride,
                               p.v_row_stride, cmin(K::BLOCK_N, p.seqlen_k - k0), v_head);
    }
    cp_async_commit();
  };
  // Wait for this thread's copies, hand them to the async proxy, publish them to the
  // block; after the barrier every warpgroup is also done with the previous step.
  auto tile_landed = [&]() {
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
  };
  load_tile<K, typename K::QTile, K::BLOCK_M>(sQ, q_head + q0 * p.q_row_stride, p.q_row_stride, q_rows, q_head);
  load_group(0);
  load_group(1);


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

  // This warpgroup's 64 rows of Q against all BLOCK_N rows of K_j (buffer j % 2).
  auto issue_qk = [&](int j) {  // s = Q K_j^T
    const u32 k_tile = sK + (j % 2) * K::SMEM_KV;
#pragma unroll
    for (int ks = 0; ks < K::QK_STEPS; ++ks)
      Wgmma<K::BLOCK_N>::ss(s, K::QTile::kmajor(sQ, wg * 64, ks), K::KVTile::kmajor(k_tile, 0, ks),
                            ks > 0, T{});
    wgmma_commit();
  };
  auto issue_pv = [&](int j) {  // acc += P_j V_j
    const u32 v_tile = sV + (j % 2) * K::SMEM_KV;
#pragma unroll
    for (int ks = 0; ks < K::PV_STEPS; ++ks)
      Wgmma<K::D_K>::rs(acc, pa[ks], K::KVTile::mnmajor(v_tile, ks), T{});
    wgmma_commit();
  };
  // Scale into the exp2 domain; mask only tiles that need it (the last key tile,
  // tiles crossing the causal diagonal: one column limit per row covers both);
  // online softmax. Leaves P in s and the rescale factors in alpha.
  auto softmax = [&](int j) {
    const int k0 = j * K::BLOCK_N;
#pragma unroll
    for (int i = 0; i < K::N_TILES * 4; ++i) s[i] *= p.scale_log2;
    const bool edge = k0 + K::BLOCK_N > p.seqlen_k ||
                      CausalT::needs_mask(q0 + row0, k0 + K::BLOCK_N - 1, p.causal_offset);
    if (edge) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = q0 + row0 + g + 8 * r;
        const int col_end = CausalT::k_end(i, p.seqlen_k, p.causal_offset) - k0;
#pragma unroll
        for (int nt = 0; nt < K::N_TILES; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            if (nt * 8 + 2 * t + c >= col_end) s[nt * 4 + 2 * r + c] = -CA_INF;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -CA_INF;
#pragma unroll
      for (int nt = 0; nt < K::N_TILES; ++nt)
        mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
      alpha[r] = row[r].rescale(group_max<4>(mx));
      const float ref = row[r].ref();
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < K::N_TILES; ++nt) {
        s[nt * 4 + 2 * r] = fast_exp2(s[nt * 4 + 2 * r] - ref);
        s[nt * 4 + 2 * r + 1] = fast_exp2(s[nt * 4 + 2 * r + 1] - ref);
        sum += s[nt * 4 + 2 * r] + s[nt * 4 + 2 * r + 1];
      }
      row[r].l_i += sum;
    }
  };
  // acc *= alpha (acc must be complete), then P -> 16-bit A fragments: two n8
  // groups of S are one k16 step of P V.
  auto rescale_and_pack = [&]() {
#pragma unroll
    for (int dt = 0; dt < K::D_TILES; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[dt * 4 + e] *= alpha[e / 2];
#pragma unroll
    for (int ks = 0; ks < K::PV_STEPS; ++ks) {
      const float* s0 = s + 8 * ks;
      pa[ks][0] = MmaType<T>::pack(s0[0], s0[1]);
      pa[ks][1] = MmaType<T>::pack(s0[2], s0[3]);
      pa[ks][2] = MmaType<T>::pack(s0[4], s0[5]);
      pa[ks][3] = MmaType<T>::pack(s0[6], s0[7]);
    }
  };

  // Software pipeline within each warpgroup: step j issues S_j = Q K_j^T and then
  // acc += P_{j-1} V_{j-1}; the softmax of S_j runs while P V is on the tensor cores.
  if (n_blocks > 0) {
    tile_landed();  // groups 0 and 1: Q, K_0, V_0
    wgmma_fence();
    issue_qk(0);
    wgmma_wait<0>();
    fence_regs(s);
    softmax(0);
    rescale_and_pack();
    for (int j = 1; j < n_blocks; ++j) {
      tile_landed();  // group j: K_j, V_{j-1}; buffers of K_{j-1} and V_{j-2} are free
      wgmma_fence();  // s, pa and acc were written by ordinary code
      issue_qk(j);
      issue_pv(j - 1);
      load_group(j + 1);  // address math and copies while the MMAs run
      wgmma_wait<1>();
      fence_regs(s);
      softmax(j);
      // ptxas hoists the wait above independent arithmetic, which would run the
      // softmax after P V instead of beside it. Arithmetic moves across barriers,
      // shared-memory stores do not: storing l_i (it depends on every exp of the
      // tile) before a warpgroup barrier pins the softmax ahead of the wait.
      *reinterpret_cast<float2*>(smem + (sL - smem_addr(smem)) + threadIdx.x * 8) =
          make_float2(row[0].l_i, row[1].l_i);
      warpgroup_barrier(wg);
      wgmma_wait<0>();
      fence_regs(acc);
      fence_regs(pa);
      rescale_and_pack();
    }
    tile_landed();  // group n_blocks: V_{n_blocks - 1}
    wgmma_fence();
    issue_pv(n_blocks - 1);
    wgmma_wait<0>();
    fence_regs(acc);
  }

  // Epilogue: finish the row sums across the quad, normalize, stage through this
  // warp's own 16 rows of sQ (read only by its own, completed, MMAs), then store
  // whole rows. The barrier covers a block with no key tile, whose Q copies (made
  // by every thread) were never waited for.
  cp_async_wait<0>();
  __syncthreads();
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
  for (int c = lane; c < 16 * CHUNKS; c += 32) {
    const int r = c / CHUNKS, chunk = c % CHUNKS;
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
