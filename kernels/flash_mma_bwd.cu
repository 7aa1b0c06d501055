// flash_mma_bwd: the attention backward pass on tensor cores (fp16/bf16 in, fp32
// accumulate), FlashAttention-2 style, for sm_80 and newer.
//
// Math and notation as in flash_bwd.cu (s2 = q.k * scale*log2(e): the exp2 domain):
//   P  = exp2(s2 - lse*log2(e))   recomputed from the forward's LSE
//   dV = P^T dout    dP = dout V^T    dS = P (dP - delta)    delta_i = dout_i . o_i
//   dQ = scale * dS K                 dK = scale * dS^T Q
// Every product is an mma.m16n8k16 with fp32 accumulators; P and dS are rounded
// to 16 bits as the A operand of the products that consume them.
//
// Layouts: common/params.cuh (BwdParams). Kernels, in launch order
// (cupy_attention/families/flash_mma_bwd.py):
//   1. flash_bwd_delta (flash_bwd.cu): delta; zeroes dq_accum in atomic mode.
//   2. flash_mma_bwd_dkdv: one block per (BLOCK_N keys, KV head, batch). sK and sV
//      stay resident while the block walks the query tiles (BLOCK_M rows) of every
//      query head of the KV head's group, from the first tile that sees key n0
//      (causal). The next tile's Q, dout, lse and delta are copied (cp.async,
//      two buffers) while this one is computed. Per tile:
//        phase 1  S^T = K Q^T and dP^T = V dout^T with the keys as the mma M
//                 dimension: warp (kg, sw) owns the KM1 m16 key tiles of key group
//                 kg and the QW queries sw QW..; P^T and dS^T are formed in
//                 registers and stored as 16-bit values into sP, sdS [key][query].
//        phase 2  dV += P^T dout, dK += dS^T Q: warp (kg, sw) owns the 32 keys of
//                 key group kg and the head-dim blocks (16 columns) sw, sw + SPLIT2,
//                 ...; the fp32 accumulators stay in registers for the whole block.
//        phase 3  (ATOMIC_DQ) dQ tile = dS K, dS read from sdS transposed
//                 (ldmatrix.trans), added to dq_accum with fp32 reductions: their
//                 order varies from run to run. With DQ_ROWS8 dq_accum holds its
//                 rows in groups of 8 (common/bwd_tiles.cuh), so each reduction's
//                 8 rows x 8 columns are two whole 128-byte lines, not a sector in
//                 each of eight rows 4 D bytes apart: 1.07-1.21x at power-of-two
//                 lengths (H200; at S = 8000 the row-major rows ran as fast:
//                 benchmarks/results/notes-bwd-loops.md section 28).
//      Warps own two m16 tiles (32 rows) where the tiles allow: every B fragment
//      read from shared memory then feeds twice the MMAs.
//      Then dK * scale and dV are written: one block owns each key of a KV head,
//      so dK and dV need no atomics and are bitwise reproducible.
//   3. flash_bwd_dq_convert (flash_bwd.cu): dq = dq_accum * scale; or, in
//      deterministic mode,
//   3'. flash_mma_bwd_dq: one block per (BLOCK_M queries, query head, batch), the
//      forward's loop shape: per key tile S = Q K^T, dP = dout V^T, dS in
//      registers (an mma C fragment pair is the next A fragment), dQ += dS K;
//      no atomics.
// Shared memory (16-bit unless noted; sK, sV, sQ, sdO rows swizzled or padded
// (MmaBwdTraits::SWIZZLE), sP and sdS rows padded by 16 bytes, so the 8 row addresses
// of every ldmatrix land in distinct banks):
//   dkdv: sK, sV [BLOCK_N][SROW]   sQ, sdO [2][BLOCK_M][SROW]   sP, sdS [BLOCK_N][PROW]
//         sStats [2][2][BLOCK_M] fp32 (lse, then delta, per buffer)
//   dq:   sQ, sdO [BLOCK_M][SROW]  sK, sV [2][BLOCK_N][SROW]
// Masking: tiles that cross Sk or the causal diagonal are masked element by
// element (P selected to 0); query rows past Sq read lse = +inf (P = 0). Query
// rows that attend nothing (causal, i < Sk - Sq) are zero-filled in sQ and sdO,
// so NaN there cannot reach dK or dV through 0 * NaN, and their LSE of -inf is
// read as +inf, so P = exp2(-inf) = 0 and their dQ is exactly 0. dS is selected,
// not multiplied, where P = 0, so NaN in a masked-out V stays out.
// Constraints: D <= 256, padded to a multiple of 16 in shared memory and
// registers only. VEC needs 16-byte aligned q, k, v, dout (bases and strides) and
// D % 8 == 0. No dense masks (the Python side sends those to flash_bwd.cu).
#include "common/bwd_tiles.cuh"

template <int D_, int BLOCK_M_, int BLOCK_N_, int WARPS_, class T_, bool VEC_>
struct MmaBwdTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_PAD = RoundUp<D_, 16>::value;
  static constexpr int DB = D_PAD / 16;          // 16-column blocks of the head dim
  static constexpr int BLOCK_M = BLOCK_M_;       // query rows per tile
  static constexpr int BLOCK_N = BLOCK_N_;       // keys per block
  static constexpr int WARPS = WARPS_;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr bool VEC = VEC_;
  // sK, sV, sQ, sdO rows (common/copy.cuh): swizzled in 16-byte builds at D_PAD = 64,
  // 128 and 192, and at D_PAD = 256 on sm_90+, so a copy's 16-byte chunks of a 128-byte
  // line land in one shared line, not two (the padded rows' 2.2x the ideal wavefronts:
  // notes-bwd-loops.md section 23). H200: 1.05-1.06x at D = 256, 1.015-1.054x at
  // D = 128, 1.011-1.019x at D = 192 and 1.026-1.057x at D = 64 (section 27). The
  // other builds keep padded rows, which the host's size (Config.smem) always covers:
  // with the swizzle's lane addresses ptxas 12.9 spilled 28 bytes at D = 256 on sm_80
  // (causal, in sections) and 32 in an unaligned D = 120 build; at D = 64 the causal
  // atomic-dQ build spilled 8 bytes in sections, so it takes none
  // (flash_mma_bwd.dkdv_sections).
  static constexpr bool SWIZZLE_ROWS = VEC && (D_PAD == 64 || D_PAD == 128 || D_PAD == 192);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static constexpr bool SWIZZLE = D_PAD == 256 || SWIZZLE_ROWS;
#else
  static constexpr bool SWIZZLE = SWIZZLE_ROWS;
#endif
  using Rows = SmemRows<D_PAD, SWIZZLE>;
  static constexpr int SROW = Rows::STRIDE;      // their row stride (elements)
  static constexpr int PROW = BLOCK_M + 8;       // sP, sdS row stride
  // Phase 1: KM1 m16 key tiles per warp (2 when the query split still leaves each
  // warp whole n16 blocks of queries), KG1 key groups, SPLIT1 warps share a group.
  static constexpr int KM1 = (BLOCK_N % 32 == 0 && (BLOCK_M * BLOCK_N / (32 * WARPS)) % 16 == 0) ? 2 : 1;
  static constexpr int KG1 = BLOCK_N / (16 * KM1);
  static constexpr int SPLIT1 = WARPS / KG1;
  static constexpr int QW = BLOCK_M / SPLIT1;    // queries per warp
  static constexpr int Q_TILES = QW / 8;         // n8 tiles of S^T per m16 key tile
  // Phase 2: 32 keys (two m16 tiles) per warp, SPLIT2 warps share them along D.
  static constexpr int KG2 = BLOCK_N / 32;
  static constexpr int SPLIT2 = WARPS / KG2;
  static constexpr int KV_DB = CeilDiv<DB, SPLIT2>::value;  // head-dim blocks per warp
  // Phase 1's k16 steps run fully unrolled unless dK, dV (live throughout) and S^T,
  // dP^T (live in phase 1) hold 192 fp32 registers or more (P1_TIGHT: D_PAD = 112,
  // 128 at BLOCK_N = 128). There the full unroll spills in causal and unaligned
  // builds; a rolled loop (causal) or pairs of steps (not) do not. Elsewhere the
  // full unroll stays. The timings behind both choices:
  // benchmarks/results/notes-kernel-comments.md.
  static constexpr bool P1_TIGHT = 32 * KV_DB + 8 * KM1 * Q_TILES >= 192;
  // Phase 3: jobs of DQ_KM m16 query tiles by DQ_CB head-dim blocks, dealt to the
  // warps (32 accumulator registers at most, beside dK and dV).
  static constexpr int DQ_KM = BLOCK_M >= 32 ? 2 : 1;
  static constexpr int DQ_MT = BLOCK_M / (16 * DQ_KM);
  static constexpr int DQ_CB = cmin(4 / DQ_KM, ceil_div(DB, cmax(1, WARPS / DQ_MT)));
  static constexpr int DQ_JOBS = DQ_MT * ceil_div(DB, DQ_CB);
  static constexpr int SMEM_KV = BLOCK_N * SROW;
  static constexpr int SMEM_Q = BLOCK_M * SROW;  // one buffer of sQ or of sdO
  static constexpr int SMEM_P = BLOCK_N * PROW;
  static constexpr int SMEM_BYTES = (2 * SMEM_KV + 4 * SMEM_Q + 2 * SMEM_P) * 2 + 4 * BLOCK_M * 4;

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D >= 1 && D <= 256, "head dim 1..256");
  static_assert(BLOCK_N % 32 == 0 && WARPS % KG2 == 0 && WARPS % KG1 == 0,
                "whole key groups per warp");
  static_assert(QW % 16 == 0 && QW * SPLIT1 == BLOCK_M, "phase 1: whole n16 query blocks per warp");
  static_assert(BLOCK_M % 16 == 0 && 2 * BLOCK_M <= THREADS, "one thread per lse/delta value");
  static_assert(!VEC || D % 8 == 0, "16-byte copies need D % 8 == 0");
};

// Phase 1's products for one query tile: S^T = K Q^T and dP^T = V dout^T of the
// warp's 16 KM1 keys x QW queries, S^T over all query tiles, then dP^T (one
// operand's A fragments live at a time). Reads: sK (sV = + V_OFF) at k_x; the
// tile's sQ (sdO = + O_OFF) at q_y. Writes: s, dp (raw dot products).
template <class KT, class VT>
__device__ __forceinline__ void dkdv_scores(float (&s)[KT::KM1][KT::Q_TILES][4],
                                            float (&dp)[KT::KM1][KT::Q_TILES][4], u32 k_x,
                                            u32 q_y) {
  using T = typename KT::T;
  constexpr int KM1 = KT::KM1;
  constexpr u32 V_OFF = KT::SMEM_KV * 2, O_OFF = 2 * KT::SMEM_Q * 2;
  // k16 step ks of both products; the first starts the accumulators.
  const auto step = [&](int ks, bool first) {
#pragma unroll
    for (int op = 0; op < 2; ++op) {
      u32 a[KM1][4];
#pragma unroll
      for (int km = 0; km < KM1; ++km)
        ldmatrix_x4(a[km], KT::SWIZZLE
                               ? KT::Rows::step(k_x, 2 * ks) + op * V_OFF + km * 16 * KT::SROW * 2
                               : k_x + op * V_OFF + (km * 16 * KT::SROW + ks * 16) * 2);
#pragma unroll
      for (int nt = 0; nt < KT::Q_TILES; nt += 2) {
        u32 bq[4];
        ldmatrix_x4(bq, KT::SWIZZLE
                            ? KT::Rows::step(q_y, 2 * ks) + op * O_OFF + nt * 8 * KT::SROW * 2
                            : q_y + op * O_OFF + (nt * 8 * KT::SROW + ks * 16) * 2);
#pragma unroll
        for (int km = 0; km < KM1; ++km) {
          float(&acc)[KT::Q_TILES][4] = op == 0 ? s[km] : dp[km];
          if (first) {
            mma_16816_first(acc[nt], a[km], bq[0], bq[1], T{});
            mma_16816_first(acc[nt + 1], a[km], bq[2], bq[3], T{});
          } else {
            mma_16816(acc[nt], a[km], bq[0], bq[1], T{});
            mma_16816(acc[nt + 1], a[km], bq[2], bq[3], T{});
          }
        }
      }
    }
  };
  // The first step peeled (no registers cleared), but in tight unaligned builds:
  // there it spills (8-24 bytes at D = 111), and unpeeled it does not.
  constexpr bool PEEL = KT::VEC || !KT::P1_TIGHT;
  if constexpr (PEEL) {
    step(0, true);
  } else {
#pragma unroll
    for (int km = 0; km < KM1; ++km)
#pragma unroll
      for (int nt = 0; nt < KT::Q_TILES; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[km][nt][e] = dp[km][nt][e] = 0.f;
  }
#pragma unroll (KT::P1_TIGHT ? (VT::kCausal ? 1 : 2) : KT::DB)
  for (int ks = PEEL ? 1 : 0; ks < KT::DB; ++ks) step(ks, false);
}

// Phase 1's P^T and dS^T of the warp's keys x QW queries, through the variant
// (element masks only where VT::partial says), stored as 16-bit values into sP and
// sdS [key][query]. Reads: s, dp, the tile's lse and delta (s_lse, s_lse +
// BLOCK_M). Writes: sP at p_st (the thread's first C element), sdS at p_st + its
// offset (the caller's barrier publishes them).
template <class KT, class VT>
__device__ __forceinline__ void dkdv_p_ds(const FwdParams& f, float (&s)[KT::KM1][KT::Q_TILES][4],
                                          float (&dp)[KT::KM1][KT::Q_TILES][4],
                                          const float* s_lse, u32 p_st, int b, int h, int m0,
                                          int n0, int key1, int sw1, int lane) {
  using T = typename KT::T;
  constexpr int KM1 = KT::KM1;
  const int g = lane / 4, t = lane % 4;
  const float* s_delta = s_lse + KT::BLOCK_M;

  // P^T and dS^T; element masks only where the warp's keys x QW tile needs them
  // (VT::partial). Row g + 8 r of a C fragment is a key, column 2t + c a query.
  const int j0 = n0 + key1, i0 = m0 + sw1 * KT::QW;
  const bool edge = VT::partial(f, i0, i0 + KT::QW - 1, j0, j0 + 16 * KM1 - 1);
  // Per query column: lse in the exp2 domain (+inf past Sq and for rows that
  // attend nothing, so P = exp2(-inf) = 0) and delta.
  float lse2[KT::Q_TILES][2], dl[KT::Q_TILES][2];
#pragma unroll
  for (int nt = 0; nt < KT::Q_TILES; ++nt) {
    const int col = sw1 * KT::QW + nt * 8 + 2 * t;
    const float2 lse = *reinterpret_cast<const float2*>(s_lse + col);
    const float2 delta = *reinterpret_cast<const float2*>(s_delta + col);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float l = c ? lse.y : lse.x;
      lse2[nt][c] = (m0 + col + c < f.seqlen_q && l != -CA_INF) ? l * CA_LOG2E : CA_INF;
      dl[nt][c] = c ? delta.y : delta.x;
    }
  }
  // softcap's d s / d dot from the score (Scores::kScoreGrad: 1.09-1.16x, H200), except
  // on 128-query tiles under a window's lower bound, which spilled 8-16 bytes with it
  // (ptxas of CUDA 12.9, D = 40, packed sequences, unaligned)
  constexpr bool SCORE_GRAD = !(KT::BLOCK_M == 128 && VT::Band::kLo);
#pragma unroll
  for (int km = 0; km < KM1; ++km)
    Scores<VT>::template p_ds<true, SCORE_GRAD>(
        MmaFrag<KT::Q_TILES>(lane), [&](int x) -> float& { return s[km][x / 4][x % 4]; },
        [&](int x) -> float& { return dp[km][x / 4][x % 4]; }, f, b, h, i0, j0 + 16 * km, edge,
        [&](int, int c) { return lse2[c / 2][c % 2]; },
        [&](int, int c) { return dl[c / 2][c % 2]; });
#pragma unroll
  for (int km = 0; km < KM1; ++km)
#pragma unroll
    for (int nt = 0; nt < KT::Q_TILES; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const u32 at = p_st + ((16 * km + 8 * r) * KT::PROW + nt * 8) * 2;
        st_shared_u32(at, MmaType<T>::pack(s[km][nt][2 * r], s[km][nt][2 * r + 1]));
        st_shared_u32(at + KT::SMEM_P * 2, MmaType<T>::pack(dp[km][nt][2 * r], dp[km][nt][2 * r + 1]));
      }
}

// Phase 2: dV += P^T dout, dK += dS^T Q over the tile's BLOCK_M queries, for the
// warp's 32 keys and head-dim blocks sw2, sw2 + SPLIT2, ... Reads: sP (sdS = +
// DS_OFF) at p_x; the tile's sQ (sdO = + O_OFF) at q_x. Writes: dk, dv.
template <class KT>
__device__ __forceinline__ void dkdv_accumulate(float (&dk)[2][KT::KV_DB][2][4],
                                                float (&dv)[2][KT::KV_DB][2][4], u32 p_x,
                                                u32 q_x, int sw2) {
  using T = typename KT::T;
  constexpr u32 O_OFF = 2 * KT::SMEM_Q * 2, DS_OFF = KT::SMEM_P * 2;

#pragma unroll
  for (int ks = 0; ks < KT::BLOCK_M / 16; ++ks) {
    u32 ap[2][4], ads[2][4];
#pragma unroll
    for (int km = 0; km < 2; ++km) {
      ldmatrix_x4(ap[km], p_x + (km * 16 * KT::PROW + ks * 16) * 2);
      ldmatrix_x4(ads[km], p_x + DS_OFF + (km * 16 * KT::PROW + ks * 16) * 2);
    }
#pragma unroll
    for (int i = 0; i < KT::KV_DB; ++i) {
      const int cb = sw2 + KT::SPLIT2 * i;
      if (KT::DB % KT::SPLIT2 == 0 || cb < KT::DB) {
        const u32 off = (ks * 16 * KT::SROW + cb * 16) * 2;
        const u32 at = KT::SWIZZLE ? KT::Rows::step(q_x, 2 * cb) + ks * 16 * KT::SROW * 2 : q_x + off;
        u32 bo[4], bq[4];
        ldmatrix_x4_trans(bo, KT::SWIZZLE ? at + O_OFF : q_x + O_OFF + off);
#pragma unroll
        for (int km = 0; km < 2; ++km) {
          mma_16816(dv[km][i][0], ap[km], bo[0], bo[1], T{});
          mma_16816(dv[km][i][1], ap[km], bo[2], bo[3], T{});
        }
        ldmatrix_x4_trans(bq, at);
#pragma unroll
        for (int km = 0; km < 2; ++km) {
          mma_16816(dk[km][i][0], ads[km], bq[0], bq[1], T{});
          mma_16816(dk[km][i][1], ads[km], bq[2], bq[3], T{});
        }
      }
    }
  }

}

// Phase 3 (atomic dQ): the tile's dQ = dS K, jobs of DQ_KM m16 query tiles by
// DQ_CB head-dim blocks dealt to the warps, added to dq_accum (which holds dQ /
// scale) with fp32 reductions. Reads: sdS at ds_y, sK at kt_x (both .trans).
// ROWS8: dq_accum's rows in groups of 8 (common/bwd_tiles.cuh), where a reduction's
// 8 rows x 8 columns of a C fragment are 256 contiguous bytes.
template <class KT, bool ROWS8>
__device__ __forceinline__ void dkdv_dq_atomic(const BwdParams& p, int b, int h, int m0,
                                               u32 ds_y, u32 kt_x, int warp, int lane) {
  using T = typename KT::T;
  const FwdParams& f = p.fwd;
  const int g = lane / 4, t = lane % 4;

  constexpr int KM = KT::DQ_KM;
  float* dq_tile = p.dq_accum + (delta_row(p, b, h) + m0) * KT::D;
  constexpr int ROUNDS = ceil_div(KT::DQ_JOBS, KT::WARPS);  // 1 in every table config
#pragma unroll 1
  for (int round = 0; round < ROUNDS; ++round) {
    const int job = warp + round * KT::WARPS;
    if (KT::DQ_JOBS % KT::WARPS != 0 && job >= KT::DQ_JOBS) break;  // warp-uniform
    const int mt0 = (job % KT::DQ_MT) * KM, cb0 = (job / KT::DQ_MT) * KT::DQ_CB;
    float acc[KM][KT::DQ_CB][2][4];
#pragma unroll
    for (int km = 0; km < KM; ++km)
#pragma unroll
      for (int i = 0; i < KT::DQ_CB; ++i)
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[km][i][nn][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KT::BLOCK_N / 16; ++ks) {
      u32 a[KM][4];
#pragma unroll
      for (int km = 0; km < KM; ++km)
        ldmatrix_x4_trans(a[km], ds_y + (ks * 16 * KT::PROW + (mt0 + km) * 16) * 2);
#pragma unroll
      for (int i = 0; i < KT::DQ_CB; ++i) {
        if (KT::DB % KT::DQ_CB == 0 || cb0 + i < KT::DB) {
          u32 bk[4];
          ldmatrix_x4_trans(bk, KT::SWIZZLE ? KT::Rows::step(kt_x, 2 * (cb0 + i)) +
                                                  ks * 16 * KT::SROW * 2
                                            : kt_x + (ks * 16 * KT::SROW + (cb0 + i) * 16) * 2);
#pragma unroll
          for (int km = 0; km < KM; ++km) {
            mma_16816(acc[km][i][0], a[km], bk[0], bk[1], T{});
            mma_16816(acc[km][i][1], a[km], bk[2], bk[3], T{});
          }
        }
      }
    }
    // One address per job: each reduction's offset from it is a constant.
    const int row0 = mt0 * 16 + g, d0 = cb0 * 16 + 2 * t;
    float* dst0 = ROWS8 ? dq_tile + (row0 - g) * KT::D + cb0 * 128 + g * 8 + 2 * t
                        : dq_tile + row0 * KT::D + d0;
#pragma unroll
    for (int km = 0; km < KM; ++km)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (m0 + row0 + km * 16 + 8 * r >= f.seqlen_q) continue;
#pragma unroll
        for (int i = 0; i < KT::DQ_CB; ++i)
#pragma unroll
          for (int nn = 0; nn < 2; ++nn) {
            const int dd = i * 16 + nn * 8;  // d = d0 + dd
            float* dst = dst0 + (km * 16 + 8 * r) * KT::D + (ROWS8 ? 8 * dd : dd);
            const float a0 = acc[km][i][nn][2 * r], a1 = acc[km][i][nn][2 * r + 1];
            // d < D always where D is a multiple of 16 and the jobs tile DB
            constexpr bool kWhole = KT::D == KT::D_PAD && KT::DB % KT::DQ_CB == 0;
            if constexpr (KT::D % 2 == 0) {
              if (kWhole || d0 + dd < KT::D) red_add_f32x2(dst, a0, a1);
            } else {
              if (d0 + dd < KT::D) atomicAdd(dst, a0);
              if (d0 + dd + 1 < KT::D) atomicAdd(dst + 1, a1);
            }
          }
      }
  }
}

// dK * scale and dV of the warp's keys (below Sk) and head-dim blocks.
template <class KT>
__device__ __forceinline__ void store_dkdv(const BwdParams& p, float (&dk)[2][KT::KV_DB][2][4],
                                           float (&dv)[2][KT::KV_DB][2][4], int b, int h_kv,
                                           int n0, int key2, int sw2, int lane) {
  using T = typename KT::T;
  const FwdParams& f = p.fwd;
  const int g = lane / 4, t = lane % 4;

  T* dk_head = static_cast<T*>(p.dk) + b * p.dk_batch_stride + h_kv * p.dk_head_stride;
  T* dv_head = static_cast<T*>(p.dv) + b * p.dv_batch_stride + h_kv * p.dv_head_stride;
#pragma unroll
  for (int km = 0; km < 2; ++km)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = n0 + key2 + 16 * km + g + 8 * r;
      if (j >= f.seqlen_k) continue;
#pragma unroll
      for (int i = 0; i < KT::KV_DB; ++i) {
        const int cb = sw2 + KT::SPLIT2 * i;
        if (cb >= KT::DB) continue;
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int d = cb * 16 + nn * 8 + 2 * t + c;
            if (d < KT::D) {
              dk_head[j * p.dk_row_stride + d] = from_float<T>(dk[km][i][nn][2 * r + c] * f.scale);
              dv_head[j * p.dv_row_stride + d] = from_float<T>(dv[km][i][nn][2 * r + c]);
            }
          }
      }
    }
}

// Grid (key blocks, KV heads, B), or with SECTIONS section_block's (common/seqs.cuh:
// sections of (KV head, entry) pairs; the host's flash_mma_bwd.sections). Packed
// sequences (RaggedSeqs): x runs over the virtual key blocks of every sequence, z = 1,
// the sequence's params behind the tiles in shared memory.
// DQ_ROWS8 (ATOMIC_DQ, 16-byte builds, fixed lengths with Sq % 8 == 0): dq_accum's rows
// in groups of 8 (dkdv_dq_atomic), converted by flash_bwd_dq_convert<T, true>.
template <class KT, class VT, bool ATOMIC_DQ, bool SECTIONS, bool DQ_ROWS8 = false>
__global__ void __launch_bounds__(KT::THREADS, 1) flash_mma_bwd_dkdv(const BwdParams args) {
  static_assert(!DQ_ROWS8 || (ATOMIC_DQ && KT::VEC && !VT::Seqs::kRagged),
                "grouped dq_accum rows: atomic dQ, 16-byte rows, fixed lengths");
  using T = typename KT::T;
  extern __shared__ __align__(128) unsigned char smem[];
  int n_block, h_kv, b;
  const BwdParams& p = VT::Seqs::template bind_grid<T, KT::BLOCK_N, true, false, SECTIONS>(
      args, args.fwd.heads_kv, n_block, h_kv, b, smem + KT::SMEM_BYTES);
  const FwdParams& f = p.fwd;
  if (VT::Seqs::kRagged && n_block * KT::BLOCK_N >= f.seqlen_k) return;  // block-uniform
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + KT::SMEM_KV;
  T* sQ = sV + KT::SMEM_KV;
  T* sdO = sQ + 2 * KT::SMEM_Q;
  T* sP = sdO + 2 * KT::SMEM_Q;
  T* sdS = sP + KT::SMEM_P;
  float* sStats = reinterpret_cast<float*>(sdS + KT::SMEM_P);

  const int n0 = n_block * KT::BLOCK_N;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // This warp's first key within the block and its split index, per phase.
  const int key1 = 16 * KT::KM1 * (warp % KT::KG1), sw1 = KT::SPLIT1 == 1 ? 0 : warp / KT::KG1;
  const int key2 = 32 * (warp % KT::KG2), sw2 = warp / KT::KG2;

  const T* k_head = static_cast<const T*>(f.k) + b * f.k_batch_stride + h_kv * f.k_head_stride;
  const T* v_head = static_cast<const T*>(f.v) + b * f.v_batch_stride + h_kv * f.v_head_stride;

  using Walk = QueryTileWalk<KT::BLOCK_M, KT::BLOCK_N, VT>;
  const Walk walk(f, n0);
  const int n_iters = walk.iters;
  typename Walk::Tile tile = walk.tile0();  // iteration it's, then it + 1's

  // Tile `at` (iteration it) into buffer it % 2, as one cp.async group.
  auto load_q = [&](int it, typename Walk::Tile at) {
    const int h = h_kv * f.group + at.hg, m0 = at.m0;
    const int buf = it & 1;
    const T* q_head = static_cast<const T*>(f.q) + b * f.q_batch_stride + h * f.q_head_stride;
    const T* o_head =
        static_cast<const T*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride;
    const int lo = walk.row_lo(f, m0), hi = walk.row_hi(f, m0);
    copy_tile<KT::BLOCK_M, KT::D, KT::D_PAD, KT::SROW, KT::THREADS, KT::VEC, KT::SWIZZLE>(
        sQ + buf * KT::SMEM_Q, q_head + m0 * f.q_row_stride, f.q_row_stride, lo, hi, q_head);
    copy_tile<KT::BLOCK_M, KT::D, KT::D_PAD, KT::SROW, KT::THREADS, KT::VEC, KT::SWIZZLE>(
        sdO + buf * KT::SMEM_Q, o_head + m0 * p.dout_row_stride, p.dout_row_stride, lo, hi, o_head);
    const float* lse = f.lse + b * f.lse_batch_stride + h * f.lse_head_stride + m0;
    const float* delta = p.delta + delta_row(p, b, h) + m0;
    copy_row_stats<KT::BLOCK_M>(smem_addr(sStats + buf * 2 * KT::BLOCK_M), lse, delta, hi,
                               f.lse);
    cp_async_commit();
  };

  const int k_rows = f.seqlen_k - n0;
  copy_tile<KT::BLOCK_N, KT::D, KT::D_PAD, KT::SROW, KT::THREADS, KT::VEC, KT::SWIZZLE>(
      sK, k_head + n0 * f.k_row_stride, f.k_row_stride, 0, k_rows, k_head);
  copy_tile<KT::BLOCK_N, KT::D, KT::D_PAD, KT::SROW, KT::THREADS, KT::VEC, KT::SWIZZLE>(
      sV, v_head + n0 * f.v_row_stride, f.v_row_stride, 0, k_rows, v_head);
  if (n_iters > 0) {
    load_q(0, tile);  // K and V ride in tile 0's group
  } else {
    cp_async_commit();
  }

  float dk[2][KT::KV_DB][2][4], dv[2][KT::KV_DB][2][4];
#pragma unroll
  for (int km = 0; km < 2; ++km)
#pragma unroll
    for (int i = 0; i < KT::KV_DB; ++i)
#pragma unroll
      for (int nn = 0; nn < 2; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[km][i][nn][e] = dv[km][i][nn][e] = 0.f;

  // ldmatrix lane addressing (see common/mma.cuh), matrix lm = lane / 8, row lr = lane % 8:
  //   X: row lr + 8 (lm & 1), col 8 (lm >> 1): an A operand stored [m][k], or a
  //      B operand stored [k][n] read with .trans
  //   Y: row lr + 8 (lm >> 1), col 8 (lm & 1): a B operand stored [n][k], or an
  //      A operand stored [k][m] read with .trans
  const int lm = lane / 8, lr = lane % 8;
  const int x_row = lr + 8 * (lm & 1), x_col = 8 * (lm >> 1);
  const int y_row = lr + 8 * (lm >> 1), y_col = 8 * (lm & 1);
  // V, dout and dS addresses are their K, Q and P twins plus a constant (immediate
  // offsets in the phase functions: fewer live registers).
  // (swizzled rows through Rows::at; padded ones as the expressions always were, which
  // ptxas schedules best: another form of the same addresses ran D = 128 causal 0.98x)
  const auto row_at = [](T* tile, int r, int c) {
    return smem_addr(KT::SWIZZLE ? tile + KT::Rows::at(r, c) : tile + r * KT::SROW + c);
  };
  const u32 k_x = row_at(sK, key1 + x_row, x_col);          // phase 1 A
  const u32 q_y = row_at(sQ, sw1 * KT::QW + y_row, y_col);  // phase 1 B
  // phase 1's C fragments into sP (sdS = + its offset): row g, column 2t of the warp's tile
  const u32 p_st = smem_addr(sP + (key1 + lane / 4) * KT::PROW + sw1 * KT::QW + 2 * (lane % 4));
  const u32 p_x = smem_addr(sP + (key2 + x_row) * KT::PROW + x_col);      // phase 2 A
  const u32 q_x = row_at(sQ, x_row, x_col);                                // phase 2 B (.trans)
  const u32 ds_y = smem_addr(sdS + y_row * KT::PROW + y_col);             // phase 3 A (.trans)
  const u32 kt_x = row_at(sK, x_row, x_col);                               // phase 3 B (.trans)

  for (int it = 0; it < n_iters; ++it) {
    const int h = h_kv * f.group + tile.hg, m0 = tile.m0;
    const int buf = it & 1;
    const u32 q_buf = buf * KT::SMEM_Q * 2;  // bytes
    const float* s_lse = sStats + buf * 2 * KT::BLOCK_M;  // then delta
    cp_async_wait<0>();
    __syncthreads();  // tile it visible; every warp is done with tile it - 1 (its buffer, sP, sdS)
    walk.advance(tile);
    if (it + 1 < n_iters) load_q(it + 1, tile);

    // Phase 1: S^T and dP^T of 16 KM1 keys x QW queries, then P^T and dS^T.
    float s[KT::KM1][KT::Q_TILES][4], dp[KT::KM1][KT::Q_TILES][4];
    dkdv_scores<KT, VT>(s, dp, k_x, q_y + q_buf);
    dkdv_p_ds<KT, VT>(f, s, dp, s_lse, p_st, b, h, m0, n0, key1, sw1, lane);
    __syncthreads();  // sP, sdS complete
    dkdv_accumulate<KT>(dk, dv, p_x, q_x + q_buf, sw2);
    if constexpr (ATOMIC_DQ) dkdv_dq_atomic<KT, DQ_ROWS8>(p, b, h, m0, ds_y, kt_x, warp, lane);
  }
  cp_async_wait<0>();
  store_dkdv<KT>(p, dk, dv, b, h_kv, n0, key2, sw2, lane);
}

template <int D_, int BLOCK_N_, int WARPS_, class T_, bool VEC_>
struct MmaBwdDqTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_PAD = RoundUp<D_, 16>::value;
  static constexpr int WARPS = WARPS_;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int BLOCK_M = 16 * WARPS;     // one m16 query tile per warp
  static constexpr int BLOCK_N = BLOCK_N_;       // keys per tile
  static constexpr bool VEC = VEC_;
  static constexpr int SROW = D_PAD + 8;
  static constexpr int N_TILES = BLOCK_N / 8;    // n8 tiles of S per warp
  static constexpr int D_TILES = D_PAD / 8;      // n8 tiles of dQ per warp
  static constexpr int SMEM_Q = BLOCK_M * SROW;
  static constexpr int SMEM_KV = BLOCK_N * SROW;
  static constexpr int SMEM_BYTES = (2 * SMEM_Q + 4 * SMEM_KV) * 2;

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D >= 1 && D <= 256, "head dim 1..256");
  static_assert(BLOCK_N % 16 == 0, "key tiles are whole k16 steps of dS K");
  static_assert(!VEC || D % 8 == 0, "16-byte copies need D % 8 == 0");
};

// Deterministic dQ. Grid: x = query block (heaviest first when causal), y = query
// head, z = batch; with SECTIONS section_block's, as flash_mma_bwd_dkdv's.
template <class KT, class VT, bool SECTIONS>
__global__ void __launch_bounds__(KT::THREADS) flash_mma_bwd_dq(const BwdParams args) {
  using T = typename KT::T;
  extern __shared__ __align__(128) unsigned char smem[];
  int m_block, h, b;
  const BwdParams& p = VT::Seqs::template bind_grid<T, KT::BLOCK_M, false, VT::kCausal, SECTIONS>(
      args, args.fwd.heads_q, m_block, h, b, smem + KT::SMEM_BYTES);
  const FwdParams& f = p.fwd;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + KT::SMEM_Q;
  T* sK = sdO + KT::SMEM_Q;  // two buffers
  T* sV = sK + 2 * KT::SMEM_KV;

  const int h_kv = h / f.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int q0 = m_block * KT::BLOCK_M, row0 = 16 * warp;
  const int q_rows = cmin(KT::BLOCK_M, f.seqlen_q - q0);
  if (VT::Seqs::kRagged && q_rows <= 0) return;  // block-uniform

  const T* q_head = static_cast<const T*>(f.q) + b * f.q_batch_stride + h * f.q_head_stride;
  const T* o_head = static_cast<const T*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride;
  const T* k_head = static_cast<const T*>(f.k) + b * f.k_batch_stride + h_kv * f.k_head_stride;
  const T* v_head = static_cast<const T*>(f.v) + b * f.v_batch_stride + h_kv * f.v_head_stride;

  // Key tiles n_begin .. n_begin + n_blocks - 1: the band of the block's rows.
  const int n_begin = VT::kv_begin(f, q0) / KT::BLOCK_N;
  const int n_blocks = ceil_div(VT::kv_end(f, q0 + q_rows - 1), KT::BLOCK_N) - n_begin;
  auto load_kv = [&](int nb) {
    const int k0 = (n_begin + nb) * KT::BLOCK_N, rows = f.seqlen_k - k0;
    const int buf = (nb & 1) * KT::SMEM_KV;
    copy_tile<KT::BLOCK_N, KT::D, KT::D_PAD, KT::SROW, KT::THREADS, KT::VEC>(
        sK + buf, k_head + k0 * f.k_row_stride, f.k_row_stride, 0, rows, k_head);
    copy_tile<KT::BLOCK_N, KT::D, KT::D_PAD, KT::SROW, KT::THREADS, KT::VEC>(
        sV + buf, v_head + k0 * f.v_row_stride, f.v_row_stride, 0, rows, v_head);
    cp_async_commit();
  };
  // Rows that attend nothing are zero-filled (see the header).
  const int lo = cmax(0, VT::q_begin(f, 0) - q0);
  copy_tile<KT::BLOCK_M, KT::D, KT::D_PAD, KT::SROW, KT::THREADS, KT::VEC>(
      sQ, q_head + q0 * f.q_row_stride, f.q_row_stride, lo, q_rows, q_head);
  copy_tile<KT::BLOCK_M, KT::D, KT::D_PAD, KT::SROW, KT::THREADS, KT::VEC>(
      sdO, o_head + q0 * p.dout_row_stride, p.dout_row_stride, lo, q_rows, o_head);
  if (n_blocks > 0) {
    load_kv(0);  // Q and dout ride in tile 0's group
  } else {
    cp_async_commit();
  }

  // Rows g and g + 8 of the warp's m16 tile: lse in the exp2 domain (+inf where
  // the row attends nothing or lies past Sq) and delta.
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = q0 + row0 + g + 8 * r;
    lse2[r] = CA_INF;
    delta[r] = 0.f;
    if (i < f.seqlen_q) {
      const float l = f.lse[b * f.lse_batch_stride + h * f.lse_head_stride + i];
      lse2[r] = l == -CA_INF ? CA_INF : l * CA_LOG2E;
      delta[r] = p.delta[delta_row(p, b, h) + i];
    }
  }

  float acc[KT::D_TILES][4];
#pragma unroll
  for (int dt = 0; dt < KT::D_TILES; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[dt][e] = 0.f;

  // ldmatrix lane addressing as in flash_mma_bwd_dkdv (X: A operands and .trans B
  // operands; Y: B operands).
  const int lm = lane / 8, lr = lane % 8;
  const int x_row = lr + 8 * (lm & 1), x_col = 8 * (lm >> 1);
  const int y_row = lr + 8 * (lm >> 1), y_col = 8 * (lm & 1);
  const u32 q_x = smem_addr(sQ + (row0 + x_row) * KT::SROW + x_col);
  const u32 o_x = smem_addr(sdO + (row0 + x_row) * KT::SROW + x_col);
  const u32 k_y = smem_addr(sK + y_row * KT::SROW + y_col);
  const u32 v_y = smem_addr(sV + y_row * KT::SROW + y_col);
  const u32 k_x = smem_addr(sK + x_row * KT::SROW + x_col);

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int k0 = (n_begin + nb) * KT::BLOCK_N;
    const u32 kv_buf = (nb & 1) * KT::SMEM_KV * 2;  // bytes
    cp_async_wait<0>();
    __syncthreads();  // tile nb (and Q, dout) visible; every warp is done with tile nb - 1
    if (nb + 1 < n_blocks) load_kv(nb + 1);

    float s[KT::N_TILES][4], dp[KT::N_TILES][4];
#pragma unroll
    for (int nt = 0; nt < KT::N_TILES; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KT::D_PAD / 16; ++ks) {
      u32 aq[4], ao[4];
      ldmatrix_x4(aq, q_x + ks * 32);
      ldmatrix_x4(ao, o_x + ks * 32);
#pragma unroll
      for (int nt = 0; nt < KT::N_TILES; nt += 2) {
        const u32 off = kv_buf + (nt * 8 * KT::SROW + ks * 16) * 2;
        u32 bk[4], bv[4];
        ldmatrix_x4(bk, k_y + off);
        mma_16816(s[nt], aq, bk[0], bk[1], T{});
        mma_16816(s[nt + 1], aq, bk[2], bk[3], T{});
        ldmatrix_x4(bv, v_y + off);
        mma_16816(dp[nt], ao, bv[0], bv[1], T{});
        mma_16816(dp[nt + 1], ao, bv[2], bv[3], T{});
      }
    }

    Scores<VT>::p_ds(MmaFrag<KT::N_TILES>(lane), [&](int x) -> float& { return s[x / 4][x % 4]; },
                     [&](int x) -> float& { return dp[x / 4][x % 4]; }, f, b, h, q0 + row0, k0,
                     VT::partial(f, q0 + row0, q0 + row0 + 15, k0, k0 + KT::BLOCK_N - 1),
                     [&](int r, int) { return lse2[r]; }, [&](int r, int) { return delta[r]; });

    // dQ += dS K: dS stays in registers as A fragments; K is read with .trans.
#pragma unroll
    for (int ks = 0; ks < KT::BLOCK_N / 16; ++ks) {
      u32 a[4];
      a[0] = MmaType<T>::pack(dp[2 * ks][0], dp[2 * ks][1]);
      a[1] = MmaType<T>::pack(dp[2 * ks][2], dp[2 * ks][3]);
      a[2] = MmaType<T>::pack(dp[2 * ks + 1][0], dp[2 * ks + 1][1]);
      a[3] = MmaType<T>::pack(dp[2 * ks + 1][2], dp[2 * ks + 1][3]);
#pragma unroll
      for (int dt = 0; dt < KT::D_TILES; dt += 2) {
        u32 bk[4];
        ldmatrix_x4_trans(bk, k_x + kv_buf + (ks * 16 * KT::SROW + dt * 8) * 2);
        mma_16816(acc[dt], a, bk[0], bk[1], T{});
        mma_16816(acc[dt + 1], a, bk[2], bk[3], T{});
      }
    }
  }
  cp_async_wait<0>();

  T* dq_head = static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = q0 + row0 + g + 8 * r;
    if (i >= f.seqlen_q) continue;
#pragma unroll
    for (int dt = 0; dt < KT::D_TILES; ++dt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int d = dt * 8 + 2 * t + c;
        if (d < KT::D) dq_head[i * p.dq_row_stride + d] = from_float<T>(acc[dt][2 * r + c] * f.scale);
      }
  }
}
