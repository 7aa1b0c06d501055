// flash: one fused forward kernel on CUDA cores with an online softmax
// (FlashAttention 2's loop order). O(S) extra memory: no score matrix anywhere.
//
// Layouts: see common/params.cuh. A block owns BLOCK_M query rows of one (b, h);
// shared memory holds fp32 tiles, whatever the storage dtype T:
//   sQ  [D][LDQ]         Q transposed (d-major), filled once
//   sKV [D][LDK]         K transposed for S = Q K^T, then reused as
//       [BLOCK_N][LDV]   V row-major for O += P V   (D padded to DP with zeros)
//   sP  [BLOCK_M][LDP]   P of the current tile, row-major
// Threads form a THREADS_M x THREADS_N grid (ty, tx); the THREADS_N threads of a
// row group are consecutive lanes, so row reductions are group shuffles. Thread
// (ty, tx) owns score rows ty*TM .. +TM-1 x keys tx*TN .. +TN-1, and output rows
// ty*TM .. +TM-1 x columns tx*2 + 2*THREADS_N*c (+0, +1) for c < COL_PAIRS.
// Steps, per block:
//   1. sQ <- Q tile (converted to fp32, rows past Sq zero)
//   2. for each key tile up to the causal end of the block's last row:
//      a. sKV <- K tile transposed; S = Q K^T in registers (float4/float2 reads:
//         broadcast along sQ, consecutive along sK)
//      b. mask S (bounds and causal only on tiles that straddle them, dense mask
//         per element), online softmax: m_i, l_i, acc *= alpha, sP <- exp2(S - m_i)
//      c. sKV <- V tile (zero-padded), noting whether it holds any Inf/NaN
//      d. acc += P V; where the V tile holds Inf/NaN, p = 0 terms are selected
//         away so masked-out values cannot leak (0 * NaN = NaN)
//   3. l_i summed over the row group; out = acc / l_i; lse (if requested)
// Grid: x = query block, y = query head, z = batch. Dynamic shared memory of
// exactly Traits::SMEM_BYTES (cupy_attention/families/flash.py computes the same).
// Constraints: D is a compile-time constant 1..256; no alignment is assumed for
// global rows (element loads), padding lives only in shared memory and registers.
#include "common/variant.cuh"
#include "common/softmax.cuh"

template <int D_, int BLOCK_M_, int BLOCK_N_, int THREADS_, class T_>
struct FlashTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int THREADS = THREADS_;
  static constexpr int WARPS = THREADS / 32;

  // Thread grid: 16 lanes per row group keeps the row shuffles inside a half warp.
  static constexpr int THREADS_N = 16;
  static constexpr int THREADS_M = THREADS / THREADS_N;
  static constexpr int TM = BLOCK_M / THREADS_M;   // rows per thread
  static constexpr int TN = BLOCK_N / THREADS_N;   // keys per thread in S
  // Output columns in float2 pairs, 2*THREADS_N = 32 columns per pass: a row group
  // reads one 128-byte sV row segment per pass, conflict-free.
  static constexpr int DP = RoundUp<D, 2 * THREADS_N>::value;
  static constexpr int COL_PAIRS = DP / (2 * THREADS_N);

  // Shared-memory strides in floats. The transposed fills write 8 head-dim
  // columns x 4 rows per warp; a stride of 4 (mod 32) puts those in 32 banks.
  static constexpr int LDQ = BLOCK_M + 4;
  static constexpr int LDK = BLOCK_N + 4;
  static constexpr int LDV = DP;
  // Padding makes the two half warps of a P read hit different banks.
  static constexpr int LDP = BLOCK_N + 4;
  static constexpr int FILL_D = 8;                 // head-dim columns per warp in a fill
  static constexpr int FILL_ROWS = 32 / FILL_D;    // rows per warp in a fill

  static constexpr int SQ_FLOATS = D * LDQ;
  static constexpr int SKV_FLOATS = cmax(D * LDK, BLOCK_N * LDV);
  static constexpr int SP_FLOATS = BLOCK_M * LDP;
  static constexpr int SMEM_BYTES = 4 * (SQ_FLOATS + SKV_FLOATS + SP_FLOATS);
  // fp32 inputs: split dot products and P V sums into short fp32 partials (see
  // tile_qk and tile_pv); 16-bit inputs: plain fp32 sums.
  static constexpr bool SPLIT_SUMS = sizeof(typename Accum<T>::type) == 8;
  static constexpr int DOT_CHUNK = 8;                  // head-dim steps per fp64 add
  static constexpr int PV_CHUNK = SPLIT_SUMS ? 8 : 4;  // keys per P V partial
  // __launch_bounds__ occupancy: blocks per SM that fit both H100's 228 KB of
  // shared memory (1 KB reserved per block) and its 64K registers, at most 3.
  // Registers per thread are estimated as the accumulators plus 66 for the S, P
  // and V fragments, softmax state and addresses, plus the fp64 dot products of
  // fp32 inputs (their fp32 partials fit in the 66); ptxas' report in CI confirms
  // that the cap this sets (65536 / (THREADS * MIN_BLOCKS)) causes no spills.
  static constexpr int ACC_FLOATS = TM * 2 * COL_PAIRS;
  static constexpr int DOT_EXTRA = SPLIT_SUMS ? 2 * TM * TN : 0;
  static constexpr int MIN_BLOCKS =
      cmax(1, cmin(3, cmin((228 * 1024) / (SMEM_BYTES + 1024),
                           65536 / (THREADS * (ACC_FLOATS + 66 + DOT_EXTRA)))));

  static_assert(D >= 1 && D <= 256, "head dim 1..256");
  static_assert(THREADS % 32 == 0 && THREADS_M * THREADS_N == THREADS, "whole warps, full grid");
  static_assert(TM * THREADS_M == BLOCK_M && (TM == 1 || TM == 2 || TM == 4),
                "rows per thread must be one vector load of sQ");
  static_assert(TN * THREADS_N == BLOCK_N && (TN == 1 || TN == 2 || TN == 4),
                "keys per thread must be one vector load of sK");
  static_assert(BLOCK_N % PV_CHUNK == 0 && PV_CHUNK % 4 == 0,
                "P V reads sP four keys at a time, whole chunks per tile");
  static_assert(BLOCK_M % (FILL_ROWS * WARPS) == 0 && BLOCK_N % (FILL_ROWS * WARPS) == 0,
                "the transposed fill covers whole tiles");
  static_assert(LDQ % 32 == 4 && LDK % 32 == 4, "conflict-free transposed fills");
  static_assert(LDP % 4 == 0 && LDV % 4 == 0 && SQ_FLOATS % 4 == 0 && SKV_FLOATS % 4 == 0,
                "16-byte aligned rows and buffers for vector loads");
  static_assert(SMEM_BYTES <= 163 * 1024, "shared memory must fit sm_80's 163 KB per block");
};

// N consecutive floats from shared memory in one vector load (N = 1, 2, 4).
template <int N>
__device__ __forceinline__ void lds(float (&dst)[N], const float* src) {
  if constexpr (N == 4) {
    const float4 x = *reinterpret_cast<const float4*>(src);
    dst[0] = x.x; dst[1] = x.y; dst[2] = x.z; dst[3] = x.w;
  } else if constexpr (N == 2) {
    const float2 x = *reinterpret_cast<const float2*>(src);
    dst[0] = x.x; dst[1] = x.y;
  } else {
    static_assert(N == 1, "vector width 1, 2 or 4");
    dst[0] = *src;
  }
}

template <int N>
__device__ __forceinline__ void sts(float* dst, const float (&src)[N]) {
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  } else if constexpr (N == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
  } else {
    static_assert(N == 1, "vector width 1, 2 or 4");
    *dst = src[0];
  }
}

// dst[d * ld + r] = g[(row0 + r) * stride + d] for r < ROWS, d < D; rows past
// `rows` are zero. A warp covers FILL_D consecutive d (one 32-byte fp32 sector
// per row) x FILL_ROWS rows.
template <class Tr, int ROWS>
__device__ __forceinline__ void fill_transposed(float* dst, int ld, const typename Tr::T* g,
                                                i64 stride, int row0, int rows) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int dl = lane % Tr::FILL_D, rl = warp * Tr::FILL_ROWS + lane / Tr::FILL_D;
  // Four head-dim steps per iteration bound the loads in flight: unrolled over
  // all of D (up to 32 loads at D = 128), ptxas spills under the 2-block cap.
#pragma unroll 4
  for (int d0 = 0; d0 < Tr::D; d0 += Tr::FILL_D) {
    const int d = d0 + dl;
#pragma unroll
    for (int r0 = 0; r0 < ROWS; r0 += Tr::FILL_ROWS * Tr::WARPS) {
      const int r = r0 + rl;
      if (d < Tr::D) dst[d * ld + r] = row0 + r < rows ? to_float(g[(row0 + r) * stride + d]) : 0.f;
    }
  }
}

// sV[n * LDV + d] = v[(k0 + n) * stride + d], zero past Sk and D. Returns whether
// this thread loaded any Inf or NaN (x * 0 is NaN exactly for those).
template <class Tr>
__device__ __forceinline__ bool fill_v(float* sV, const typename Tr::T* v, i64 stride, int k0,
                                       int seqlen_k) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float probe = 0.f;
#pragma unroll
  for (int n = warp; n < Tr::BLOCK_N; n += Tr::WARPS) {
#pragma unroll
    for (int d = lane; d < Tr::DP; d += 32) {
      const float x = (k0 + n < seqlen_k && d < Tr::D) ? to_float(v[(k0 + n) * stride + d]) : 0.f;
      probe = fmaf(x, 0.f, probe);
      sV[n * Tr::LDV + d] = x;
    }
  }
  return probe != probe;
}

// acc[r][c] += sum_n P[row r][n] * V[n][col c] over one key tile. With SPLIT_SUMS
// (fp32 inputs) each run of PV_CHUNK keys is summed into a fresh partial that is
// then added to acc: the long sum over Sk keys takes Sk / PV_CHUNK roundings at
// acc's magnitude instead of Sk, which halves an fp32 result's error for one extra
// add per 8 FMAs. 16-bit inputs accumulate straight into acc.
template <class Tr, bool GUARD>
__device__ __forceinline__ void tile_pv(float (&acc)[Tr::TM][Tr::COL_PAIRS][2], const float* sP,
                                        const float* sV, int tx, int ty) {
  constexpr int CH = Tr::PV_CHUNK;
  const float* p_rows = sP + ty * Tr::TM * Tr::LDP;
  const float* v_cols = sV + tx * 2;
#pragma unroll 1
  for (int n = 0; n < Tr::BLOCK_N; n += CH) {
    float pr[Tr::TM][CH];
#pragma unroll
    for (int r = 0; r < Tr::TM; ++r) {
#pragma unroll
      for (int kk = 0; kk < CH; kk += 4) {
        float four[4];
        lds<4>(four, p_rows + r * Tr::LDP + n + kk);
#pragma unroll
        for (int e = 0; e < 4; ++e) pr[r][kk + e] = four[e];
      }
    }
#pragma unroll
    for (int c = 0; c < Tr::COL_PAIRS; ++c) {
      float vv[CH][2];
#pragma unroll
      for (int kk = 0; kk < CH; ++kk) lds<2>(vv[kk], v_cols + (n + kk) * Tr::LDV + c * 2 * Tr::THREADS_N);
#pragma unroll
      for (int r = 0; r < Tr::TM; ++r) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float part = Tr::SPLIT_SUMS ? 0.f : acc[r][c][e];
#pragma unroll
          for (int kk = 0; kk < CH; ++kk) {
            const float pk = pr[r][kk];
            const float term = fmaf(pk, vv[kk][e], part);
            part = (GUARD && pk == 0.f) ? part : term;
          }
          acc[r][c][e] = Tr::SPLIT_SUMS ? acc[r][c][e] + part : part;
        }
      }
    }
  }
}

// acc[r][c] += Q[row r][d] * K[key c][d] for head-dim steps d0 .. d0 + STEPS - 1
// (those < D), one fp32 FMA each.
template <class Tr, int STEPS>
__device__ __forceinline__ void qk_steps(float (&acc)[Tr::TM][Tr::TN], const float* q_col,
                                         const float* k_col, int d0) {
#pragma unroll
  for (int dd = 0; dd < STEPS; ++dd) {
    const int d = d0 + dd;
    if (Tr::D % STEPS == 0 || d < Tr::D) {
      float qd[Tr::TM], kd[Tr::TN];
      lds<Tr::TM>(qd, q_col + d * Tr::LDQ);
      lds<Tr::TN>(kd, k_col + d * Tr::LDK);
#pragma unroll
      for (int r = 0; r < Tr::TM; ++r)
#pragma unroll
        for (int c = 0; c < Tr::TN; ++c) acc[r][c] = fmaf(qd[r], kd[c], acc[r][c]);
    }
  }
}

// s[r][c] = sum_d Q[row r][d] * K[key c][d] for this thread's TM x TN scores.
// fp32 inputs (Accum = double): each run of DOT_CHUNK head-dim steps is summed in
// fp32 and the partials in fp64, so the error is that of an 8-term fp32 sum
// whatever D (a large score's rounding is the largest error term of an fp32
// result), at one conversion and one fp64 add per 8 FMAs. 16-bit inputs: plain
// fp32, whose rounding their own dwarfs.
template <class Tr>
__device__ __forceinline__ void tile_qk(float (&s)[Tr::TM][Tr::TN], const float* sQ,
                                        const float* sK, int tx, int ty) {
  constexpr int TM = Tr::TM, TN = Tr::TN;
  const float* q_col = sQ + ty * TM;
  const float* k_col = sK + tx * TN;
  if constexpr (Tr::SPLIT_SUMS) {
    double dot[TM][TN] = {};
#pragma unroll 1
    for (int d0 = 0; d0 < Tr::D; d0 += Tr::DOT_CHUNK) {
      float part[TM][TN] = {};
      qk_steps<Tr, Tr::DOT_CHUNK>(part, q_col, k_col, d0);
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) dot[r][c] += part[r][c];
    }
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int c = 0; c < TN; ++c) s[r][c] = float(dot[r][c]);
  } else {
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int c = 0; c < TN; ++c) s[r][c] = 0.f;
#pragma unroll 1
    for (int d0 = 0; d0 < Tr::D; d0 += 4) qk_steps<Tr, 4>(s, q_col, k_col, d0);
  }
}

template <class Tr, class VT>
__global__ void __launch_bounds__(Tr::THREADS, Tr::MIN_BLOCKS) flash_fwd(const FwdParams p) {
  using T = typename Tr::T;
  constexpr int TM = Tr::TM, TN = Tr::TN;
  extern __shared__ float4 smem[];
  float* sQ = reinterpret_cast<float*>(smem);
  float* sKV = sQ + Tr::SQ_FLOATS;
  float* sP = sKV + Tr::SKV_FLOATS;
  {
    // A launch with less shared memory than the traits lay out would corrupt
    // silently; fail loudly instead.
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < u32(Tr::SMEM_BYTES)) __trap();
  }

  const int tx = threadIdx.x % Tr::THREADS_N, ty = threadIdx.x / Tr::THREADS_N;
  const int q0 = blockIdx.x * Tr::BLOCK_M, h = blockIdx.y, b = blockIdx.z, h_kv = h / p.group;
  const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;

  fill_transposed<Tr, Tr::BLOCK_M>(sQ, Tr::LDQ, q, p.q_row_stride, q0, seqlen_q);

  SoftmaxRow row[TM];
  float acc[TM][Tr::COL_PAIRS][2];
#pragma unroll
  for (int r = 0; r < TM; ++r) {
    row[r].init();
#pragma unroll
    for (int c = 0; c < Tr::COL_PAIRS; ++c) acc[r][c][0] = acc[r][c][1] = 0.f;
  }

  const int q_last = min(q0 + Tr::BLOCK_M, seqlen_q) - 1;
  const int k_end = VT::kv_end(p, q_last);
  for (int k0 = VT::kv_begin(p, q0) / Tr::BLOCK_N * Tr::BLOCK_N; k0 < k_end; k0 += Tr::BLOCK_N) {
    __syncthreads();  // the previous tile's P V is done with sKV and sP (first pass: nothing)
    fill_transposed<Tr, Tr::BLOCK_N>(sKV, Tr::LDK, k, p.k_row_stride, k0, seqlen_k);
    __syncthreads();

    float s[TM][TN];
    tile_qk<Tr>(s, sQ, sKV, tx, ty);

    // Block-uniform: only tiles crossing Sk or a band edge need an element test.
    // Masked scores are selected to -inf, not multiplied: Inf/NaN from masked-out K
    // stays out.
    Scores<VT>::template forward<true>(GridFrag<TM, TN, 1, 1>(ty * TM, tx * TN),
                                       [&](int x) -> float& { return s[x / TN][x % TN]; }, p, b, h,
                                       q0, k0, VT::partial(p, q0, q_last, k0, k0 + Tr::BLOCK_N - 1));
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      float tile_max = -CA_INF;
#pragma unroll
      for (int c = 0; c < TN; ++c) tile_max = fmaxf(tile_max, s[r][c]);
      const float alpha = row[r].rescale(group_max<Tr::THREADS_N>(tile_max));
      const float ref = row[r].ref();
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        s[r][c] = exact_exp2(s[r][c] - ref);
        // A per-thread partial sum: every lane of the group rescales by the same
        // alpha, so the group sum is taken once, at the end.
        row[r].l_i += s[r][c];
      }
      sts<TN>(sP + (ty * TM + r) * Tr::LDP + tx * TN, s[r]);
#pragma unroll
      for (int c = 0; c < Tr::COL_PAIRS; ++c) {
        acc[r][c][0] *= alpha;
        acc[r][c][1] *= alpha;
      }
    }
    // V is filled after the softmax, not overlapped with it: its loads in flight
    // next to S, acc and the dense-mask addresses would spill at D >= 224.
    __syncthreads();  // every S read of sK is done before V overwrites it
    const bool v_nonfinite_here = fill_v<Tr>(sKV, v, p.v_row_stride, k0, seqlen_k);
    // sV and sP complete; the guarded P V runs only where some V is Inf/NaN.
    if (__syncthreads_or(v_nonfinite_here)) {
      tile_pv<Tr, true>(acc, sP, sKV, tx, ty);
    } else {
      tile_pv<Tr, false>(acc, sP, sKV, tx, ty);
    }
  }

#pragma unroll
  for (int r = 0; r < TM; ++r) {
    row[r].l_i = group_sum<Tr::THREADS_N>(row[r].l_i);
    const int i = q0 + ty * TM + r;
    if (i >= seqlen_q) continue;
    const float inv_l = row[r].inv_l();
    T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + i * p.o_row_stride;
#pragma unroll
    for (int c = 0; c < Tr::COL_PAIRS; ++c) {
      const int col = c * 2 * Tr::THREADS_N + tx * 2;
      if (col < Tr::D) o[col] = from_float<T>(acc[r][c][0] * inv_l);
      if (col + 1 < Tr::D) o[col + 1] = from_float<T>(acc[r][c][1] * inv_l);
    }
    if (p.lse && tx == 0) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = row[r].lse();
  }
}
