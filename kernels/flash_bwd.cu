// flash_bwd: the attention backward pass on CUDA cores (FlashAttention 2's loop
// order), fp32 arithmetic for every storage dtype T, O(S) extra memory.
//
// Gradients of out = softmax(q k^T * scale + mask) v, with s2 = q.k * scale*log2(e)
// (+ mask * log2(e)) in the exp2 domain as in the forward:
//   delta_i = sum_d dout[i,d] * o[i,d]
//   P       = exp2(s2 - lse * log2(e))      recomputed from the forward's LSE
//   dV      = P^T dout       dP = dout V^T       dS = P * (dP - delta)
//   dQ      = scale * dS K   dK = scale * dS^T Q
// GQA / MQA: the query heads h of KV head h_kv (h / group == h_kv) add into its dK, dV.
//
// Layouts: common/params.cuh (BwdParams); any strides with a unit last stride.
// Kernels, in launch order:
//   1. flash_bwd_delta       ROW_LANES lanes per query row: delta_i; where there is
//                            a dq_accum it also zeroes the row (and its turn counter:
//                            flash_wgmma_bwd's ordered dQ, params.cuh's dq_turns).
//   2. flash_bwd_dkdv        a block owns BLOCK_N keys of one (b, h_kv): sK, sV stay
//                            resident while it loops over the group's query heads
//                            and the query tiles that can see those keys:
//        a. sQ, sdO <- query tile; sLse, sDelta <- its row statistics
//        b. S, dP in registers -> P, dS into sP, sdS          (tile_p_ds)
//        c. dV += P^T dout, dK += dS^T Q in registers          (tile_dkdv)
//        d. ATOMIC_DQ: dQ tile = dS K, atomicAdd into dq_accum (tile_dq); the
//           order of those additions varies from run to run.
//      then writes dK * scale and dV. One block owns each KV head's keys, so dK
//      and dV need no atomics and come out bitwise reproducible.
//   3. flash_bwd_dq_convert  dq = dq_accum * scale in T (atomic mode), or
//   3'. flash_bwd_dq         deterministic mode: a block owns BLOCK_M queries of
//                            one (b, h), loops over key tiles recomputing P and dS,
//                            and writes dQ = scale * dS K directly (no atomics).
// Shared memory (fp32 whatever T; one layout for both tile kernels, `sP` unused by
// flash_bwd_dq):
//   sK, sV [BLOCK_N][LDD]   sQ, sdO [BLOCK_M][LDD]   sP, sdS [BLOCK_M][LDS]
//   sLse, sDelta [BLOCK_M]
// Rows hold DP = D rounded up to 32 (zeros past D and past the sequence ends) and
// are padded to an odd stride (LDD = DP + 1), so threads that read one column of
// consecutive rows hit distinct banks.
// Thread mappings (THREADS = 256, 8 warps):
//   scores  (tile_p_ds)  a 16 x 16 grid: thread (ty, tx) owns rows ty + 16 r, keys
//                        tx + 16 c. Q / dout reads broadcast along a row group; K / V
//                        reads walk consecutive rows (odd stride: no conflicts).
//   rows    (dK, dV, dQ) warp w owns rows w + 8 r, lane l columns l + 32 c: P / dS
//                        reads are warp broadcasts, Q / dout / K reads are
//                        consecutive words, global stores and atomics coalesce.
// Hazards:
//   - A row that attends nothing has lse = -inf; storing +inf instead makes every P
//     of the row exp2(-inf) = 0 (-inf - -inf would be NaN): zero gradients.
//   - dS = P (dP - delta) and the dV/dK/dQ products select, not multiply, where P
//     or dS is 0 (only when the tile holds Inf/NaN: block-uniform flags), so Inf/NaN
//     in masked-out K, V or in unattended query rows cannot leak (0 * NaN = NaN).
//     NaN at attended positions propagates.
// Constraints: D is a compile-time constant 1..256; no alignment is assumed for
// global rows (element loads). cupy_attention/families/flash_bwd.py mirrors
// SMEM_BYTES; the tile kernels trap if launched with less.
#include "common/bwd_tiles.cuh"
#include "common/variant.cuh"
#include "common/softmax.cuh"

template <int D_, int BLOCK_M_, int BLOCK_N_, class T_>
struct BwdTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int THREADS = 256;
  static constexpr int WARPS = THREADS / 32;

  static constexpr int THREADS_N = 16;                 // score grid: lanes along keys
  static constexpr int THREADS_M = THREADS / THREADS_N;
  static constexpr int TM = BLOCK_M / THREADS_M;       // score rows per thread
  static constexpr int TN = BLOCK_N / THREADS_N;       // score keys per thread
  static constexpr int DP = RoundUp<D, 32>::value;
  static constexpr int COLS = DP / 32;                 // head-dim columns per lane
  static constexpr int ROWS_M = BLOCK_M / WARPS;       // dQ rows per warp
  static constexpr int ROWS_N = BLOCK_N / WARPS;       // dK / dV rows per warp

  static constexpr int LDD = DP + 1;
  static constexpr int LDS = BLOCK_N + 1;
  static constexpr int SQ_FLOATS = BLOCK_M * LDD;      // sQ, sdO each
  static constexpr int SK_FLOATS = BLOCK_N * LDD;      // sK, sV each
  static constexpr int SP_FLOATS = BLOCK_M * LDS;      // sP, sdS each
  static constexpr int SMEM_BYTES = 4 * (2 * SK_FLOATS + 2 * SQ_FLOATS + 2 * SP_FLOATS + 2 * BLOCK_M);
  // __launch_bounds__ occupancy: two blocks per SM where both H100's 228 KB of
  // shared memory and a register estimate (the dK, dV and dQ accumulators plus 64
  // for scores, addresses and loop state) allow it, else one (255 registers).
  static constexpr int ACC_FLOATS = (2 * ROWS_N + ROWS_M) * COLS;
  static constexpr int MIN_BLOCKS =
      cmax(1, cmin(2, cmin((228 * 1024) / (SMEM_BYTES + 1024),
                           65536 / (THREADS * (ACC_FLOATS + 64)))));

  static_assert(D >= 1 && D <= 256, "head dim 1..256");
  static_assert(TM * THREADS_M == BLOCK_M && TN * THREADS_N == BLOCK_N,
                "tiles cover the 16 x 16 score grid");
  static_assert(ROWS_M * WARPS == BLOCK_M && ROWS_N * WARPS == BLOCK_N,
                "tiles cover whole rows per warp");
  static_assert(BLOCK_M <= THREADS, "one thread per row loads the row statistics");
  static_assert(SMEM_BYTES <= 163 * 1024, "shared memory must fit sm_80's 163 KB per block");
};

template <class Tr>
__device__ __forceinline__ void trap_if_short_smem() {
  // A launch with less shared memory than the traits lay out would corrupt
  // silently; fail loudly instead.
  u32 dyn;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < u32(Tr::SMEM_BYTES)) __trap();
}

// acc + a * b, or acc unchanged where a == 0 (when GUARD: b may be Inf/NaN there).
template <bool GUARD>
__device__ __forceinline__ float fma_sel(float a, float b, float acc) {
  const float t = fmaf(a, b, acc);
  return (GUARD && a == 0.f) ? acc : t;
}

// dst[r * LDD + d] = g[(row0 + r) * stride + d] as fp32 for r < ROWS, d < DP; zero
// past `rows` and past D. Returns whether this thread loaded an Inf or NaN.
template <class Tr, int ROWS>
__device__ __forceinline__ bool load_tile(float* dst, const typename Tr::T* g, i64 stride,
                                          int row0, int rows) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float probe = 0.f;
  // Two rows per iteration bound the loads in flight while the dK/dV accumulators
  // hold their registers.
#pragma unroll 2
  for (int r0 = 0; r0 < ROWS; r0 += Tr::WARPS) {
    const int r = r0 + warp;
    const bool in = row0 + r < rows;
#pragma unroll
    for (int c = 0; c < Tr::COLS; ++c) {
      const int d = lane + 32 * c;
      const float x = (in && d < Tr::D) ? to_float(g[(row0 + r) * stride + d]) : 0.f;
      probe = fmaf(x, 0.f, probe);
      dst[r * Tr::LDD + d] = x;
    }
  }
  return probe != probe;
}

// sLse[m] = lse of query m0 + m in the exp2 domain (+inf for rows that attend
// nothing and rows past Sq), sDelta[m] = its delta.
template <class Tr>
__device__ __forceinline__ void load_row_stats(const BwdParams& p, float* sLse, float* sDelta,
                                               int b, int h, int m0) {
  const FwdParams& f = p.fwd;
  const int m = threadIdx.x;
  if (m >= Tr::BLOCK_M) return;
  const int i = m0 + m;
  float lse2 = CA_INF, delta = 0.f;
  if (i < f.seqlen_q) {
    const float lse = f.lse[b * f.lse_batch_stride + h * f.lse_head_stride + i];
    lse2 = lse == -CA_INF ? CA_INF : lse * CA_LOG2E;
    delta = p.delta[delta_row(p, b, h) + i];
  }
  sLse[m] = lse2;
  sDelta[m] = delta;
}

// P and dS of the tile (queries m0.., keys n0..) into sP (if NEED_P) and sdS.
template <class Tr, class VT, bool NEED_P>
__device__ __forceinline__ void tile_p_ds(const BwdParams& p, const float* sQ, const float* sdO,
                                          const float* sK, const float* sV, const float* sLse,
                                          const float* sDelta, float* sP, float* sdS, int b,
                                          int h, int m0, int n0) {
  constexpr int TM = Tr::TM, TN = Tr::TN;
  const FwdParams& f = p.fwd;
  const int tx = threadIdx.x % Tr::THREADS_N, ty = threadIdx.x / Tr::THREADS_N;
  float s[TM][TN] = {}, dp[TM][TN] = {};
#pragma unroll 4
  for (int d = 0; d < Tr::D; ++d) {
    float qd[TM], od[TM], kd[TN], vd[TN];
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      qd[r] = sQ[(ty + r * Tr::THREADS_M) * Tr::LDD + d];
      od[r] = sdO[(ty + r * Tr::THREADS_M) * Tr::LDD + d];
    }
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      kd[c] = sK[(tx + c * Tr::THREADS_N) * Tr::LDD + d];
      vd[c] = sV[(tx + c * Tr::THREADS_N) * Tr::LDD + d];
    }
#pragma unroll
    for (int r = 0; r < TM; ++r) {
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        s[r][c] = fmaf(qd[r], kd[c], s[r][c]);
        dp[r][c] = fmaf(od[r], vd[c], dp[r][c]);
      }
    }
  }
  // Block-uniform: only tiles crossing Sk or a band edge need an element test (rows
  // past Sq read lse2 = +inf: P = 0).
  Scores<VT>::p_ds(GridFrag<TM, TN, Tr::THREADS_M, Tr::THREADS_N>(ty, tx),
                   [&](int x) -> float& { return s[x / TN][x % TN]; },
                   [&](int x) -> float& { return dp[x / TN][x % TN]; }, f, b, h, m0, n0,
                   VT::partial(f, m0, m0 + Tr::BLOCK_M - 1, n0, n0 + Tr::BLOCK_N - 1),
                   [&](int r, int) { return sLse[ty + r * Tr::THREADS_M]; },
                   [&](int r, int) { return sDelta[ty + r * Tr::THREADS_M]; });
#pragma unroll
  for (int r = 0; r < TM; ++r) {
    const int m = ty + r * Tr::THREADS_M;
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      const int n = tx + c * Tr::THREADS_N;
      if (NEED_P) sP[m * Tr::LDS + n] = s[r][c];
      sdS[m * Tr::LDS + n] = dp[r][c];
    }
  }
}

// dv[r][c] += sum_m P[m][n] dout[m][d], dk[r][c] += sum_m dS[m][n] Q[m][d] for the
// warp's keys n = warp + WARPS r and the lane's columns d = lane + 32 c.
template <class Tr, bool GUARD>
__device__ __forceinline__ void tile_dkdv(float (&dk)[Tr::ROWS_N][Tr::COLS],
                                          float (&dv)[Tr::ROWS_N][Tr::COLS], const float* sQ,
                                          const float* sdO, const float* sP, const float* sdS) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll 2
  for (int m = 0; m < Tr::BLOCK_M; ++m) {
    float qm[Tr::COLS], om[Tr::COLS];
#pragma unroll
    for (int c = 0; c < Tr::COLS; ++c) {
      qm[c] = sQ[m * Tr::LDD + lane + 32 * c];
      om[c] = sdO[m * Tr::LDD + lane + 32 * c];
    }
#pragma unroll
    for (int r = 0; r < Tr::ROWS_N; ++r) {
      const int n = warp + r * Tr::WARPS;
      const float pmn = sP[m * Tr::LDS + n], dsmn = sdS[m * Tr::LDS + n];
#pragma unroll
      for (int c = 0; c < Tr::COLS; ++c) {
        dv[r][c] = fma_sel<GUARD>(pmn, om[c], dv[r][c]);
        dk[r][c] = fma_sel<GUARD>(dsmn, qm[c], dk[r][c]);
      }
    }
  }
}

// dq[r][c] += sum_n dS[m][n] K[n][d] for the warp's queries m = warp + WARPS r and
// the lane's columns d = lane + 32 c.
template <class Tr, bool GUARD>
__device__ __forceinline__ void tile_dq(float (&dq)[Tr::ROWS_M][Tr::COLS], const float* sdS,
                                        const float* sK) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll 2
  for (int n = 0; n < Tr::BLOCK_N; ++n) {
    float kn[Tr::COLS];
#pragma unroll
    for (int c = 0; c < Tr::COLS; ++c) kn[c] = sK[n * Tr::LDD + lane + 32 * c];
#pragma unroll
    for (int r = 0; r < Tr::ROWS_M; ++r) {
      const float dsmn = sdS[(warp + r * Tr::WARPS) * Tr::LDS + n];
#pragma unroll
      for (int c = 0; c < Tr::COLS; ++c) dq[r][c] = fma_sel<GUARD>(dsmn, kn[c], dq[r][c]);
    }
  }
}

// The row kernels (delta, dq_convert, dkdv_convert): ROW_LANES lanes per row,
// ROW_BLOCK rows per block of 256 threads. A row whose arrays all start 16 bytes
// aligned, with D a multiple of a chunk, moves in 16-byte chunks (Chunk<T>: 8
// 16-bit or 4 fp32 elements, fp32 sums in float4); other rows element by element.
// The branch is per row, so it holds for any strides; shuffles stay outside it.
// (ROW_LANES, Chunk, convert_row: common/bwd_tiles.cuh, which flash_wgmma_bwd's
// per-tile conversion shares.)

// Grid: x = query row / ROW_BLOCK, y = query head, z = batch.
template <class T>
__global__ void __launch_bounds__(256) flash_bwd_delta(const BwdParams p) {
  using C = Chunk<T>;
  const FwdParams& f = p.fwd;
  const int lane = threadIdx.x % ROW_LANES;
  const int i = blockIdx.x * ROW_BLOCK + threadIdx.x / ROW_LANES, h = blockIdx.y,
            b = blockIdx.z;
  const bool live = i < f.seqlen_q;
  const T* o = static_cast<const T*>(f.o) + b * f.o_batch_stride + h * f.o_head_stride +
               i * f.o_row_stride;
  const T* dout = static_cast<const T*>(p.dout) + b * p.dout_batch_stride +
                  h * p.dout_head_stride + i * p.dout_row_stride;
  float acc = 0.f;
  if (live && f.head_dim % C::E == 0 && aligned16(o) && aligned16(dout)) {
    for (int c = lane; c < f.head_dim / C::E; c += ROW_LANES) {
      C x, y;
      x.raw = __ldg(reinterpret_cast<const uint4*>(o) + c);
      y.raw = __ldg(reinterpret_cast<const uint4*>(dout) + c);
#pragma unroll
      for (int e = 0; e < C::E; ++e) acc = fmaf(to_float(y.e[e]), to_float(x.e[e]), acc);
    }
  } else if (live) {
    for (int d = lane; d < f.head_dim; d += ROW_LANES)
      acc = fmaf(to_float(dout[d]), to_float(o[d]), acc);
  }
  acc = group_sum<ROW_LANES>(acc);  // every lane of the warp: rows past the end add 0
  if (!live) return;
  const i64 row = delta_row(p, b, h) + i;
  if (lane == 0) p.delta[row] = acc;
  if (p.dq_accum) {
    float* zero = p.dq_accum + row * f.head_dim;
    if (p.dq_store_first) {
      // (the floats are stored by each tile's first key block: flash_wgmma_bwd)
    } else if (f.head_dim % 4 == 0 && aligned16(zero)) {
      for (int c = lane; c < f.head_dim / 4; c += ROW_LANES)
        reinterpret_cast<float4*>(zero)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      for (int d = lane; d < f.head_dim; d += ROW_LANES) zero[d] = 0.f;
    }
    if (p.dq_turn_rows && lane == 0 && i % p.dq_turn_rows == 0)
      dq_turns(p)[(i64(b) * f.heads_q + h) * ceil_div(f.seqlen_q, p.dq_turn_rows) +
                  i / p.dq_turn_rows] = 0;
  }
}

// Grid: x = key block, y = KV head, z = batch.
template <class Tr, class VT, bool ATOMIC_DQ>
__global__ void __launch_bounds__(Tr::THREADS, Tr::MIN_BLOCKS) flash_bwd_dkdv(const BwdParams p) {
  using T = typename Tr::T;
  extern __shared__ float4 smem[];
  float* sK = reinterpret_cast<float*>(smem);
  float* sV = sK + Tr::SK_FLOATS;
  float* sQ = sV + Tr::SK_FLOATS;
  float* sdO = sQ + Tr::SQ_FLOATS;
  float* sP = sdO + Tr::SQ_FLOATS;
  float* sdS = sP + Tr::SP_FLOATS;
  float* sLse = sdS + Tr::SP_FLOATS;
  float* sDelta = sLse + Tr::BLOCK_M;
  trap_if_short_smem<Tr>();

  const FwdParams& f = p.fwd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n0 = blockIdx.x * Tr::BLOCK_N, h_kv = blockIdx.y, b = blockIdx.z;
  const T* k = static_cast<const T*>(f.k) + b * f.k_batch_stride + h_kv * f.k_head_stride;
  const T* v = static_cast<const T*>(f.v) + b * f.v_batch_stride + h_kv * f.v_head_stride;
  const bool k_probe = load_tile<Tr, Tr::BLOCK_N>(sK, k, f.k_row_stride, n0, f.seqlen_k);
  // V reaches only dP, which tile_p_ds selects away where P = 0: no probe needed.
  load_tile<Tr, Tr::BLOCK_N>(sV, v, f.v_row_stride, n0, f.seqlen_k);
  const bool k_nonfinite = __syncthreads_or(k_probe);

  float dk[Tr::ROWS_N][Tr::COLS] = {}, dv[Tr::ROWS_N][Tr::COLS] = {};
  // The query tiles whose rows see one of the block's keys (the variant's band).
  const int m_begin = VT::q_begin(f, n0) / Tr::BLOCK_M * Tr::BLOCK_M;
  const int m_end = VT::q_end(f, n0 + Tr::BLOCK_N - 1);
  for (int h = h_kv * f.group; h < (h_kv + 1) * f.group; ++h) {
    const T* q = static_cast<const T*>(f.q) + b * f.q_batch_stride + h * f.q_head_stride;
    const T* dout = static_cast<const T*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride;
    for (int m0 = m_begin; m0 < m_end; m0 += Tr::BLOCK_M) {
      __syncthreads();  // the previous tile is done with sQ, sdO, sP, sdS and the stats
      bool probe = load_tile<Tr, Tr::BLOCK_M>(sQ, q, f.q_row_stride, m0, f.seqlen_q);
      probe |= load_tile<Tr, Tr::BLOCK_M>(sdO, dout, p.dout_row_stride, m0, f.seqlen_q);
      load_row_stats<Tr>(p, sLse, sDelta, b, h, m0);
      const bool q_nonfinite = __syncthreads_or(probe);  // also: sK, sV, sQ, sdO complete
      tile_p_ds<Tr, VT, true>(p, sQ, sdO, sK, sV, sLse, sDelta, sP, sdS, b, h, m0, n0);
      __syncthreads();
      if (q_nonfinite) {
        tile_dkdv<Tr, true>(dk, dv, sQ, sdO, sP, sdS);
      } else {
        tile_dkdv<Tr, false>(dk, dv, sQ, sdO, sP, sdS);
      }
      if constexpr (ATOMIC_DQ) {
        float dq[Tr::ROWS_M][Tr::COLS] = {};
        if (k_nonfinite) {
          tile_dq<Tr, true>(dq, sdS, sK);
        } else {
          tile_dq<Tr, false>(dq, sdS, sK);
        }
#pragma unroll
        for (int r = 0; r < Tr::ROWS_M; ++r) {
          const int i = m0 + warp + r * Tr::WARPS;
          if (i >= f.seqlen_q) continue;
          float* row = p.dq_accum + (delta_row(p, b, h) + i) * Tr::D;
#pragma unroll
          for (int c = 0; c < Tr::COLS; ++c) {
            const int d = lane + 32 * c;
            if (d < Tr::D) atomicAdd(row + d, dq[r][c]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < Tr::ROWS_N; ++r) {
    const int j = n0 + warp + r * Tr::WARPS;
    if (j >= f.seqlen_k) continue;
    T* dk_row = static_cast<T*>(p.dk) + b * p.dk_batch_stride + h_kv * p.dk_head_stride +
                j * p.dk_row_stride;
    T* dv_row = static_cast<T*>(p.dv) + b * p.dv_batch_stride + h_kv * p.dv_head_stride +
                j * p.dv_row_stride;
#pragma unroll
    for (int c = 0; c < Tr::COLS; ++c) {
      const int d = lane + 32 * c;
      if (d < Tr::D) {
        dk_row[d] = from_float<T>(dk[r][c] * f.scale);
        dv_row[d] = from_float<T>(dv[r][c]);
      }
    }
  }
}

// Grid: x = query row / ROW_BLOCK, y = query head, z = batch. ROWS8: dq_accum's rows
// in groups of 8 (common/bwd_tiles.cuh; flash_mma_bwd_dkdv's DQ_ROWS8).
template <class T, bool ROWS8 = false>
__global__ void __launch_bounds__(256) flash_bwd_dq_convert(const BwdParams p) {
  const FwdParams& f = p.fwd;
  const int i = blockIdx.x * ROW_BLOCK + threadIdx.x / ROW_LANES, h = blockIdx.y,
            b = blockIdx.z;
  if (i >= f.seqlen_q) return;
  const i64 row = delta_row(p, b, h) + i;
  convert_row<T, false, ROWS8>(
      static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride + i * p.dq_row_stride,
      p.dq_accum + (ROWS8 ? (row & ~i64(7)) * f.head_dim + (row & 7) * 8 : row * f.head_dim),
      f.head_dim, f.scale, threadIdx.x % ROW_LANES);
}

// dK and dV of a split backward (flash_wgmma_bwd, kv_splits > 1), which its blocks
// summed into dk_accum (already times scale) and dv_accum: converted to T.
// Grid: x = key row / ROW_BLOCK, y = KV head, z = batch.
template <class T>
__global__ void __launch_bounds__(256) flash_bwd_dkdv_convert(const BwdParams p) {
  const FwdParams& f = p.fwd;
  const int j = blockIdx.x * ROW_BLOCK + threadIdx.x / ROW_LANES, h = blockIdx.y,
            b = blockIdx.z;
  if (j >= f.seqlen_k) return;
  const i64 row = (i64(b) * f.heads_kv + h) * f.seqlen_k + j;
  const int lane = threadIdx.x % ROW_LANES;
  convert_row(static_cast<T*>(p.dk) + b * p.dk_batch_stride + h * p.dk_head_stride +
                  j * p.dk_row_stride,
              p.dk_accum + row * f.head_dim, f.head_dim, 1.f, lane);
  convert_row(static_cast<T*>(p.dv) + b * p.dv_batch_stride + h * p.dv_head_stride +
                  j * p.dv_row_stride,
              p.dv_accum + row * f.head_dim, f.head_dim, 1.f, lane);
}

// Deterministic dQ. Grid: x = query block, y = query head, z = batch.
template <class Tr, class VT>
__global__ void __launch_bounds__(Tr::THREADS, Tr::MIN_BLOCKS) flash_bwd_dq(const BwdParams p) {
  using T = typename Tr::T;
  extern __shared__ float4 smem[];
  float* sK = reinterpret_cast<float*>(smem);
  float* sV = sK + Tr::SK_FLOATS;
  float* sQ = sV + Tr::SK_FLOATS;
  float* sdO = sQ + Tr::SQ_FLOATS;
  float* sdS = sdO + Tr::SQ_FLOATS + Tr::SP_FLOATS;
  float* sLse = sdS + Tr::SP_FLOATS;
  float* sDelta = sLse + Tr::BLOCK_M;
  trap_if_short_smem<Tr>();

  const FwdParams& f = p.fwd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int m0 = blockIdx.x * Tr::BLOCK_M, h = blockIdx.y, b = blockIdx.z, h_kv = h / f.group;
  const T* q = static_cast<const T*>(f.q) + b * f.q_batch_stride + h * f.q_head_stride;
  const T* dout = static_cast<const T*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride;
  const T* k = static_cast<const T*>(f.k) + b * f.k_batch_stride + h_kv * f.k_head_stride;
  const T* v = static_cast<const T*>(f.v) + b * f.v_batch_stride + h_kv * f.v_head_stride;
  // dQ = dS K never multiplies Q or dout, so their Inf/NaN need no probe.
  load_tile<Tr, Tr::BLOCK_M>(sQ, q, f.q_row_stride, m0, f.seqlen_q);
  load_tile<Tr, Tr::BLOCK_M>(sdO, dout, p.dout_row_stride, m0, f.seqlen_q);
  load_row_stats<Tr>(p, sLse, sDelta, b, h, m0);

  float dq[Tr::ROWS_M][Tr::COLS] = {};
  const int q_last = min(m0 + Tr::BLOCK_M, f.seqlen_q) - 1;
  const int k_end = VT::kv_end(f, q_last);
  for (int n0 = VT::kv_begin(f, m0) / Tr::BLOCK_N * Tr::BLOCK_N; n0 < k_end; n0 += Tr::BLOCK_N) {
    __syncthreads();  // the previous tile is done with sK, sV, sdS (first pass: sQ... complete)
    const bool probe = load_tile<Tr, Tr::BLOCK_N>(sK, k, f.k_row_stride, n0, f.seqlen_k);
    load_tile<Tr, Tr::BLOCK_N>(sV, v, f.v_row_stride, n0, f.seqlen_k);
    const bool k_nonfinite = __syncthreads_or(probe);
    tile_p_ds<Tr, VT, false>(p, sQ, sdO, sK, sV, sLse, sDelta, nullptr, sdS, b, h,
                                          m0, n0);
    __syncthreads();
    if (k_nonfinite) {
      tile_dq<Tr, true>(dq, sdS, sK);
    } else {
      tile_dq<Tr, false>(dq, sdS, sK);
    }
  }

#pragma unroll
  for (int r = 0; r < Tr::ROWS_M; ++r) {
    const int i = m0 + warp + r * Tr::WARPS;
    if (i >= f.seqlen_q) continue;
    T* dq_row = static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride +
                i * p.dq_row_stride;
#pragma unroll
    for (int c = 0; c < Tr::COLS; ++c) {
      const int d = lane + 32 * c;
      if (d < Tr::D) dq_row[d] = from_float<T>(dq[r][c] * f.scale);
    }
  }
}
