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
//   1. flash_bwd_delta (flash_bwd.cu): delta; zeroes dq_accum (and the ordered dQ's
//      turn counters) where there is one; only the counters where the ordered dQ's
//      first key block of each query tile stores its dQ (p.dq_store_first: the host
//      sets it where every tile has a key block; Epilogue::reduce_dq).
//   2. The dK/dV kernel, one block per (BLOCK_N keys, KV head, batch) of two
//      warpgroups (or kv_splits blocks: SPLIT below). sK and sV stay resident while
//      the block walks the query tiles (BLOCK_M rows) of every query head of the KV
//      head's group, from the first tile that sees key n0 (causal); the next tile's
//      Q and dout arrive through the copy engine (tensor maps, issued by one
//      thread) and its lse and delta (lse as lse2 = lse log2(e), +inf for rows
//      past Sq or that attend nothing: by plain loads whose values are stored later
//      in the tile, or by the producer warpgroup's stats warps; packed sequences in
//      the narrow kernel without that warpgroup copy lse and delta by cp.async)
//      into the other of two stages, while this one is computed (Producer). Three
//      ways to split the work between the warpgroups (the third,
//      flash_wgmma_bwd_dkdv_mid at D = 136..192 in the default mode over fixed
//      lengths, is described where it is defined, below the wide kernel):
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
//        (DQ_HERE) once the other warpgroup's dQ of the last tile is done with
//        sdS (kBarDsFree), dS^T to sdS [key][query] (one stmatrix a k16 step);
//        the two warpgroups meet
//        (kBarDs: sdS complete), then (with the producer warpgroup, dK is issued
//        after dQ instead, and dQ staged while dK runs)
//        issue dQ = dS K            wgmma ss, A = dS (sdS read MN-major: TRANS_A),
//                                   B = K (MN-major), K = the block's 128 keys.
//                                   BLOCK_M = 64: warpgroup w computes the 64
//                                   columns of sK's block w and keeps those
//                                   below D (an MN-major B operand starts on a
//                                   block; one N for both warpgroups keeps ptxas
//                                   from serializing the wgmma of a divergent
//                                   path); BLOCK_M = 128: the queries 64w..;
//                                   BLOCK_M = 80 (non-causal D = 88-128, the
//                                   producer warpgroup): dQ^T = K^T dS^T, the 64
//                                   head-dim rows of sK's block w, N = 80, staged
//                                   transposed into one sdQ buffer. dV is issued
//                                   after dS^T is computed (LATE_DV) at BLOCK_M =
//                                   80, and at 64 without a logits transform or
//                                   dropout (FlashAttention-4's Hopper order)
//        wait for everything; release the stage; dQ / scale into sdQ
//      buffer it % 2 (fp32, the 128-byte swizzle of 32-column blocks: no bank
//      conflicts beyond the two wavefronts of a warp's float2 stores); after the
//      next tile's kBarDs barrier (which every staging thread reached past its
//      proxy fence) one thread adds it into dq_accum with the copy engine's
//      reduction through dq_accum's tensor map (cp.reduce.async.bulk.tensor .add,
//      boxes of 32 columns; rows past Sq lie outside the map), and waits for its
//      read before the barrier two tiles on, when that buffer is staged again.
//      (two sdQ buffers, one at BLOCK_M = 80; at D = 72-80 the 128-query tiles left
//      no room for sdQ, and their dQ added from registers ran 0.94-0.96x the
//      64-query tiles). Over fixed lengths of whole query tiles (FLAT, the host's
//      flat_dq; dQ, not dQ^T) a tile is staged in its fragments' own order instead,
//      by 16-byte stores, and added as one 1-D bulk reduction into its rows' place in
//      dq_accum; flash_wgmma_bwd_dq_convert puts the rows back in order. The order of
//      the additions varies from run to run (kDqAtomic), except in the
//      deterministic mode's kDqOrdered and kDqStaggered (fixed lengths):
//      there the key blocks that reach a query tile add into it one after another
//      in a fixed order, each waiting for its turn on the tile's counter
//      (Epilogue::wait_turn, pass_turn; the orders and why they cannot deadlock:
//      TileScheduler), so dQ is bitwise reproducible. In those two modes and in
//      the atomic one over fixed lengths without a split (64- and 80-query tiles,
//      and in the ordered modes the 128-query tiles at D = 64, whose warpgroups
//      then write P^T to sP and dS^T to sdS and issue dV and dK from there; under
//      dropout only for the atomic dQ, DROP_FITS) a third warpgroup, the producer (BwdLaunch::PRODUCER_WG,
//      setmaxnreg), takes every copy and the dQ additions off the MMA warpgroups:
//      its first thread issues the tensor copies, two warps the lse and delta
//      copies (they join each tile's kBarDs meeting, after which the tile's stats
//      are free), and its last warp waits for each staged sdQ buffer (mbarrier
//      dq_full), takes the turn (ordered), adds, waits for the addition (or its
//      read), passes the turn and frees the buffer (dq_empty) for the staging two
//      tiles on (produce); the MMA warpgroups then issue dQ before dK and stage
//      it while dK runs. The
//      MMA warpgroups meet only at
//      kBarDs (and kBarDsFree); without dQ (kDqSeparate) not at all: each waits
//      for its tile's copies, and the producer for the release of a stage by every
//      warp (mbarriers full and empty, Producer). The async MMAs overlap the
//      warpgroup's own element-wise work; the block's two warpgroups keep the
//      tensor cores fed between each other's waits. No MMA is in flight across
//      iterations: in every variant tried that overlapped a tile's dQ reductions
//      with the next tile's MMAs, ptxas serialized all the kernel's wgmma (C7515,
//      "non wgmma instructions defining accumulator registers ... between start
//      and end of the pipeline stage"). Measurements and the variants that lost:
//      benchmarks/results/notes-bwd-producer.md.
//
//      flash_wgmma_bwd_dkdv_wide, D = 136..256, without dQ (kDqSeparate: dQ is
//      flash_wgmma_bwd_dq's, below): dK and dV of 64 keys take D
//      registers per thread, too many for one warpgroup beside S^T past D = 128, so
//      BLOCK_N = 64 keys and BLOCK_M = 64 queries, both warpgroups cover all 64 keys
//      (warp k of a warpgroup owns keys 16k..16k+15), and they split by role:
//      warpgroup 0 computes P^T and holds dV, warpgroup 1 computes dS^T and holds
//      dK. Both run one instruction stream with role-selected operands (ptxas sees
//      no wgmma on a divergent path). Per tile:
//        issue X^T = A B^T          wg 0: S^T = K Q^T; wg 1: dP^T = V dout^T
//                                   (ss, both K-major, N = 64, over D_K)
//        wg 0: P^T, stored to sP (fp32, each thread its own slots); arrive
//        wg 1: wait for sP; dS^T = P^T (dP^T - delta)
//        issue acc += X^T C         wg 0: dV += P^T dout; wg 1: dK += dS^T Q
//                                   (rs, C MN-major, N = D)
//      sP is a single buffer. The warpgroups meet only at its hand-overs (kBarP;
//      kBarPFree, warpgroup 1 done with sP), so warpgroup 0 starts the next tile's
//      S^T while 1 still finishes the last (1.01-1.06x over a barrier of the block
//      at each tile's start: notes-bwd-loops.md §20). Its dQ (64 keys a reduction
//      from registers, computed here until 2026-11-28) cost more than a pass of its
//      own: benchmarks/results/notes-bwd-dq-pass.md.
//
//      Then dK * scale and dV (times 1 / (1 - p) under dropout) are staged through
//      sK, sV and written with 16-byte stores: one block owns each key of a KV head,
//      so dK and dV need no atomics and are bitwise reproducible. Split (SPLIT,
//      atomic dQ mode only: the host's kv_splits, where the grid is small):
//      kv_splits blocks share a block of keys, each a contiguous share of its query
//      tiles (TileScheduler), and add the same dK and dV into zeroed fp32 dk_accum,
//      dv_accum (red.global.add).
//   3. flash_bwd_dq_convert (flash_bwd.cu): dq = dq_accum * scale; in the ordered
//      modes flash_wgmma_bwd_dq_convert (below) instead, this kernel's programmatic
//      dependent, each query tile once its turns are complete (and a tile a block
//      after FLAT's atomic dQ, launched after this kernel); or, with
//      kDqSeparate, a dQ pass of its own: flash_wgmma_bwd_dq (below: after the wide
//      kernel, in both modes) or flash_mma_bwd_dq
//      (flash_mma_bwd.cu: the deterministic mode where the ordered dQ does not run,
//      packed sequences).
//   4. (SPLIT) flash_bwd_dkdv_convert (flash_bwd.cu): dk, dv from the fp32 sums.
// Roles: TileScheduler (the block's keys and the query tiles that see them),
// Producer (the copies into the stage its PipelineState names, and the rows it
// zeroes), the consumer steps (scores, P^T, dS^T, the accumulating wgmma, dQ),
// Epilogue (dQ staging and reductions, dK and dV stores); the two kernels at the
// end run them.
// Shared memory: WgmmaBwdTraits::Storage (16-bit swizzled tiles, SwizzledTile of
// wgmma.cuh; rows of D_K, D rounded up to 16, columns D..D_K zero-filled for the
// k16 steps, and the tiles themselves take whole 64-column blocks); its sizeof plus
// the alignment slack is SMEM_BYTES (storage.cuh: smem_bytes<KT>), which the host's
// Config.smem must equal (tests/test_wgmma_bwd_storage.py); the stages' mbarriers
// live in that slack (slack_addr). Generic writers to tiles that the async proxy
// reads (dS^T and sdQ stores, rows zeroed by Producer::fix) run fence_proxy_async()
// before the barrier that publishes them.
// Variant: p_from_s applies it once per tile (VT::score: logits and a computed bias,
// and VT::keep element by element only where the warp's keys x the tile's queries
// are partial: Sk, the band's edges); query rows past Sq read lse2 = +inf (P = 0). A
// logits transform (softcap) enters dS^T as d s / d dot (logits_grad_of_score,
// variant.cuh) of the score s2, the bias taken back out: taken from the exp2's own
// argument as P^T is computed (p_grad_from_s: the narrow kernel without dropout,
// where it spills nothing, and the wide kernel), else recomputed from P as s2 =
// log2 P + lse2 (p_times_grad), so no register holds S^T past P^T.
// Dropout (VT::Drop, DropDraws): each thread draws its S^T elements' 16-bit values one
// 16 x 16 block at a time, as P^T is packed (one Philox call and a trade of halves with
// the neighbouring lane: DropoutDraw::transposed_values), and decides P^T's and dP^T's
// elements from them as drawn; dV takes P^T keep (the dropped halves of P^T's A
// fragments zero, 1 / (1 - p) applied at the store) and dS^T = P^T (fac dP^T - delta)
// with fac = keep / (1 - p), delta unchanged (dout . out). The narrow kernel waits for
// dP^T before dV under dropout, so one draw serves both; in the wide kernel warpgroup 0
// draws for P^T and warpgroup 1 for dP^T (the same elements of their accumulators).
// Query rows that attend nothing (causal, i < Sq - Sk) are zeroed in sQ and sdO
// (Producer::fix; under packed sequences also the rows and keys past the sequence,
// which hold the next one's), so NaN there cannot reach dK or dV through 0 * NaN,
// and their LSE of -inf is read as +inf, so P = 0 and their dQ is exactly 0. dS is
// selected, not multiplied, where P = 0, so NaN in a masked-out V stays out.
// p_from_s: warps whose keys x the tile need no per-element test run code without
// one (SPLIT_P; not the 128-query tiles past D = 64, which spilled with both).
// Constraints: D a multiple of 8 from 64 to 256; 16-byte aligned base pointers and
// strides of q, k, v, dout, and views a tensor map takes (cupy_attention/tma.py:
// tileable); the host runs flash_mma_bwd otherwise. No dense masks.
#include "common/bwd_tiles.cuh"
#include "common/pdl.cuh"
#include "common/storage.cuh"
#include "common/wgmma.cuh"

template <int D_, int BLOCK_M_, class T_>
struct WgmmaBwdTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_K = (D + 15) / 16 * 16;  // K of the K Q^T and V dout^T steps
  static constexpr bool WIDE = D > 128;           // flash_wgmma_bwd_dkdv_wide's split
  static constexpr int BLOCK_M = BLOCK_M_;        // queries per tile
  static constexpr int BLOCK_N = WIDE ? 64 : 128; // keys per block
  static constexpr int CONSUMERS = 256;           // the two MMA warpgroups' threads
  static constexpr int THREADS = CONSUMERS;       // (BwdLaunch: a producer warpgroup too)
  // D <= 128 with 64-query tiles: room for a third warpgroup (BwdLaunch) that issues
  // the tensor copies and the dQ reductions, so the MMA warpgroups never wait for a
  // copy engine operation or a turn (FlashAttention-3's layout). It gives up
  // registers (setmaxnreg) to the consumers: 168 a thread at launch, 24 and 240 after.
  // The 128-query tiles (D <= 64) fit it only with dV and dK issued from shared
  // memory (KV_SS_FITS): their A fragments of P^T and dS^T (32 registers each) stay
  // out of the registers.
  static constexpr bool KV_SS_FITS = BLOCK_M == 128 && D <= 64;
  static constexpr bool PRODUCER_WG_FITS = !WIDE && (BLOCK_M == 64 || BLOCK_M == 80 || KV_SS_FITS);
  // (128-query tiles: two rows of lse and delta a stats thread spilled 8 bytes at 24)
  static constexpr int PRODUCER_REGS = KV_SS_FITS ? 32 : 24;
  // at most (168 * 384 - PRODUCER_REGS * 128) / 256, a multiple of 8
  static constexpr int CONSUMER_REGS = KV_SS_FITS ? 232 : 240;
  static constexpr int kStages = 2;               // query-tile buffers: Q, dout, lse, delta
  // Threads that copy a tile's lse and delta, one value each: the first STAT_THREADS
  // (consumer) threads; thread 0, or the producer warpgroup's first, issues the
  // tensor copies.
  static constexpr int STAT_THREADS = 2 * BLOCK_M;
  // kBarDs with the producer warpgroup: the consumers and its two stats warps
  static constexpr int DS_MEETING = CONSUMERS + 64;
  // p_from_s: tiles that need no per-element test in code of their own (H100: causal
  // 1.11-1.18x at D = 64 and 128, S >= 4k), except the 128-query tiles past D = 64,
  // where ptxas (CUDA 12.9) spilled 32-140 bytes with the second copy. (The 80-query
  // tiles spilled too while p_from_s turned lse into lse2 per column; with lse2 staged
  // they do not, and run 1.04-1.07x at D = 128: notes-bwd-loops.md §24.)
  static constexpr bool SPLIT_P = !(BLOCK_M == 128 && D > 64);
  static constexpr int Q_TILES = BLOCK_M / 8;     // n8 column groups of S^T, dP^T per thread
  static constexpr int QK_STEPS = D_K / 16;       // k16 steps of K Q^T and V dout^T
  static constexpr int KV_STEPS = BLOCK_M / 16;   // k16 steps of P^T dout and dS^T Q
  static constexpr int DQ_STEPS = BLOCK_N / 16;   // k16 steps of dS K
  // The narrow kernel's dQ = dS K is one m64 wgmma of DQ_N columns per warpgroup
  // (the wide kernel has no dQ). BLOCK_M = 128: warpgroup w takes all D columns of
  // queries 64w.. Otherwise both take the tile's 64 queries and split the columns:
  // an MN-major B operand starts on one of sK's 64-column blocks, and both
  // warpgroups run one N (ptxas serializes the wgmma of a divergent path), so
  // warpgroup w computes the 64 columns of block w and keeps those below D.
  // BLOCK_M = 80 (FlashAttention-3's non-causal tile at D = 128: S^T, dP^T and dQ at
  // N = 80 read 4.5 KB of shared memory per 40 clocks against N = 64's 4 KB per 32):
  // no m64 tile of queries, so dQ^T = K^T dS^T (DQ_TRANSPOSED), warpgroup w the 64
  // rows of D in sK's block w (A = sK read MN-major, B = sdS [key][query] MN-major),
  // N = BLOCK_M; rows past D are zeros (sK's columns past D are) and not staged.
  static constexpr bool DQ_SPLIT_ROWS = BLOCK_M == 128;
  static constexpr bool DQ_TRANSPOSED = BLOCK_M % 64 != 0;
  static constexpr int D_BLOCKS = (D + 63) / 64;
  static constexpr int DQ_N = DQ_TRANSPOSED ? BLOCK_M : DQ_SPLIT_ROWS ? D : 64;
  // Warpgroup w's first column of dQ, and how many from it it keeps (a constant where
  // every warpgroup keeps DQ_N: stage_dq's column tests then fold away).
  __device__ static constexpr int dq_col0(int w) { return DQ_SPLIT_ROWS ? 0 : 64 * w; }
  __device__ static constexpr int dq_cols(int w) {
    return DQ_SPLIT_ROWS ? D : D >= 128 ? 64 : cmin(D - 64 * w, 64);
  }
  using KVTile = SwizzledTile<BLOCK_N, D_K>;
  using QTile = SwizzledTile<BLOCK_M, D_K>;
  using DsTile = SwizzledTile<BLOCK_N, BLOCK_M>;  // dS^T: rows are keys

  // Shared memory, placed at a 1024-byte boundary (storage_base): the swizzled tiles
  // first, each a whole number of 1024-byte swizzle atoms.
  struct Tiles {
    unsigned char k[KVTile::BYTES];                // the block's keys, resident
    unsigned char v[KVTile::BYTES];
    unsigned char q[kStages][QTile::BYTES];        // the query tile, per stage
    unsigned char dout[kStages][QTile::BYTES];
    unsigned char ds[DsTile::BYTES];               // dS^T [key][query], for dQ = dS K
    float stats[kStages][2][BLOCK_M];              // per stage: lse, then delta
  };
  // The wide kernel (no dQ, so no sdS) hands P^T from warpgroup 0 to 1 in fp32.
  struct WideTiles {
    unsigned char k[KVTile::BYTES];
    unsigned char v[KVTile::BYTES];
    unsigned char q[kStages][QTile::BYTES];
    unsigned char dout[kStages][QTile::BYTES];
    float stats[kStages][2][BLOCK_M];
    float p[BLOCK_N * BLOCK_M];
  };
  // The narrow kernel stages a tile's dQ / scale in fp32, two tiles' worth, added into
  // dq_accum by the copy engine (a tensor map's reduction, DQ_BOXES boxes of 32
  // columns). Layout: the 128-byte swizzle of 32-column
  // (128-byte) blocks, SwizzledTile's bytes: float column c of row r at byte
  // offset(r, c / 4) + 4 (c % 4), so a warp's float2 stores of an accumulator
  // fragment meet no bank twice beyond the two wavefronts they need (rows of D
  // floats met each bank eight times).
  static constexpr int DQ_BOXES = WIDE ? 1 : (D + 31) / 32;  // (the wide kernel has no sdQ)
  // FLAT (the dK/dV kernel's, the host's flat_dq; the tiles of dQ, not dQ^T): a tile's
  // dQ in its own order instead. Warpgroup w's fragment (64 rows x dq_cols(w) columns)
  // at float 64 DQ_N w, its thread x's dq[4 j .. 4 j + 3] (rows g and g + 8 of the
  // thread's 16, columns 8 j + 2 t and + 1) the float4 128 j + x of it; whole, so a
  // tile's BLOCK_M x D floats fill its rows' place in dq_accum (one 1-D bulk
  // reduction), put back in row order by the conversion (convert_flat_tile).
  static constexpr bool DQ_FLAT_FITS = !WIDE && !DQ_TRANSPOSED;
  using DqTile = SwizzledTile<BLOCK_M, 64 * DQ_BOXES>;
  // Two sdQ buffers where they fit; one at BLOCK_M = 80 (D = 128: 217 KB with it),
  // which only the producer warpgroup's handshake (dq_full, dq_empty) runs.
  template <int BUFFERS>
  struct StagedTiles : Tiles {
    alignas(1024) unsigned char dq[BUFFERS][DqTile::BYTES];
  };
  static constexpr bool TWO_DQ = !WIDE && sizeof(StagedTiles<2>) + SMEM_SLACK <= 227 * 1024;
  static constexpr int DQ_BUFFERS = TWO_DQ ? 2 : 1;
  // The 128-query tiles with the producer warpgroup (KV_SS_FITS) keep P^T in a tile
  // of its own, [key][query] as sdS, which dV reads while dS^T goes to sdS: 227 KB
  // (the atomic mode's kernels at D = 64, on two warpgroups, leave it unused).
  struct PtTiles : StagedTiles<2> {
    alignas(1024) unsigned char pt[DsTile::BYTES];
  };
  using Storage = typename SelectType<
      WIDE, WideTiles,
      typename SelectType<KV_SS_FITS, PtTiles,
                          StagedTiles<DQ_BUFFERS>>::type>::type;
  static constexpr int SMEM_BYTES = sizeof(Storage) + SMEM_SLACK;
  // The stages' mbarriers, in the alignment slack (slack_addr: a Storage may fill
  // shared memory to the last 1024 bytes): full[i] completes when stage i's copies landed,
  // empty[i] when every warp of the block is done with it.
  struct Barriers {
    u64 full[kStages], empty[kStages];
    // PRODUCER_WG: sdQ buffer i staged by every consumer warp (dq_full[i]), and
    // read by the copy engine's reduction (dq_empty[i], the reducer).
    u64 dq_full[2], dq_empty[2];
  };

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D % 8 == 0 && D >= 64 && D <= 256, "D a multiple of 8 from 64 to 256");
  static_assert(BLOCK_M == 64 || BLOCK_M == 80 || BLOCK_M == 128,
                "S^T = K Q^T is one wgmma m64n{BLOCK_M}");
  static_assert(!DQ_TRANSPOSED || !WIDE, "dQ^T is staged (one buffer)");
  static_assert(WIDE || TWO_DQ || (DQ_TRANSPOSED && SMEM_BYTES <= 227 * 1024),
                "the narrow kernel stages dQ: two sdQ buffers beside the tiles (dQ^T: one)");
  static_assert(!WIDE || BLOCK_M == 64, "the wide kernel takes 64-query tiles");
  static_assert(STAT_THREADS <= CONSUMERS, "one consumer thread per lse/delta value");
  static_assert(168 * (CONSUMERS + 128) >= PRODUCER_REGS * 128 + CONSUMER_REGS * CONSUMERS,
                "the consumers take no more registers than the producer gave up");
  static_assert(!KV_SS_FITS || (TWO_DQ && SMEM_BYTES <= 227 * 1024), "sP beside two sdQ buffers");
  static_assert(KVTile::BYTES % 1024 == 0 && QTile::BYTES % 1024 == 0 && DsTile::BYTES % 1024 == 0,
                "tiles stay on the 1024-byte boundaries of the swizzle");
};

// Named barriers (bar.sync ids; 0 is __syncthreads', 1 and 2 warpgroup_barrier's).
enum WgmmaBwdBarrier : int {
  kBarP = 3,        // wide: sP written by warpgroup 0, read by 1
  kBarDs = 4,       // sdS written (wide: by warpgroup 1; narrow: both), read by both (dQ);
                    // narrow with the producer warpgroup, its stats threads too (DS_MEETING)
  kBarDsFree0 = 5,  // narrow: warpgroup 1 is done reading sdS, 0 may write it (+1: 1, 0);
                    // wide: warpgroup 0 is done reading sdS, 1 may write it
  kBarPFree = 6,    // wide without dQ: warpgroup 1 is done reading sP and the stage's
                    // delta, 0 may write sP and reload the stats (the narrow kernel's
                    // 6 is kBarDsFree0 + 1)
  kBarFix = 7,      // a tile's rows zeroed after its copies landed (Producer::fix)
  kBarMmaDone = 8,  // narrow with the producer warpgroup: the consumers' MMAs on sK, sV done
  kBarMidP = 9,       // mid: P^T in sPt (warpgroup 0 arrives, 1 waits)
  kBarMidPFree = 10,  // mid: warpgroup 1 has read P, 0 may store the next tile's
  kBarMidDsFree = 11, // mid: warpgroup 0's dQ is done with sdSt, 1 may store the next dS^T
};

// Where the dK/dV kernel's dQ goes (its template parameter DQ).
enum WgmmaBwdDq : int {
  kDqSeparate = 0,  // nowhere: flash_mma_bwd_dq computes it (deterministic mode)
  kDqAtomic = 1,    // added into dq_accum in whatever order the blocks get there
  kDqOrdered = 2,   // added into dq_accum in a fixed order of key blocks (deterministic
                    // mode; narrow kernel, fixed lengths): TileScheduler's
  kDqStaggered = 3, // turns, in its lockstep order or (an upper bound) its staggered one
};

// Whether the narrow kernel's instantiation runs the producer warpgroup, and its
// threads (the host's Config.threads says the same). The ordered dQ takes it (there
// it measured 1.20-1.32x at D = 128: its turns and completions leave the MMA
// warpgroups), and so does the atomic dQ over fixed lengths without a split, where
// with dQ issued before dK (the kernel's DQ_FIRST) it measured 0.98-1.05x at D = 128
// (alone 0.99-1.01x; H100; benchmarks/results/notes-deterministic-dq.md,
// notes-bwd-loops.md §11). Under dropout only for the atomic dQ, without softcap or a
// window's lower bound (DROP_FITS: 32, 96 and 8 bytes spilled otherwise, ptxas of CUDA
// 13.5; 1.03-1.05x at D = 80, 0.99-1.03x at D = 128, H100: notes-dropout.md). Not, for
// the atomic dQ, with packed sequences, a split or softcap with ALiBi (108-124, 8 and 12
// bytes spilled at the consumers' 240 registers). The 128-query tiles (KV_SS_FITS) take
// it in the ordered modes only (the atomic mode ran 0.89-0.96x there:
// notes-bwd-loops.md §14) and not with ALiBi (64 bytes spilled under causal at 232).
template <class KT, class VT, int DQ, bool SPLIT>
struct BwdLaunch {
  static constexpr bool ATOMIC_FITS = !SPLIT && !VT::Seqs::kRagged &&
                                      !(VT::Logits::kTransform && VT::Dense::enabled);
  static constexpr bool KV_SS_OK = !KT::KV_SS_FITS || (DQ >= kDqOrdered && !VT::Dense::enabled);
  static constexpr bool DROP_FITS =
      KT::BLOCK_M == 64 && DQ == kDqAtomic && !VT::Logits::kTransform && !VT::Band::kLo;
  static constexpr bool PRODUCER_WG = KT::PRODUCER_WG_FITS &&
                                      (!VT::Drop::enabled || DROP_FITS) && KV_SS_OK &&
                                      (DQ >= kDqOrdered || (DQ == kDqAtomic && ATOMIC_FITS));
  static constexpr int THREADS = PRODUCER_WG ? KT::CONSUMERS + 128 : KT::CONSUMERS;
};

extern __shared__ __align__(1024) unsigned char wgmma_bwd_smem[];

// A kernel's shared memory by address: its Storage from `base` (1024-byte aligned,
// storage_base; the fields' addresses from that one 32-bit base, storage.cuh) and its
// Barriers in the alignment slack (slack_addr). BwdSmem, MidSmem and DqSmem name the
// fields of their kernels' Storage and Barriers, and plain pointers for the fields
// read or written by ordinary loads and stores.
template <class KT>
struct SmemView {
  using S = typename KT::Storage;
  using B = typename KT::Barriers;
  u32 base, bars;
  __device__ __forceinline__ explicit SmemView(u32 base_)
      : base(base_), bars(slack_addr<B, S>(wgmma_bwd_smem, base_)) {}
  __device__ __forceinline__ unsigned char* bytes(u32 a) const {
    return shared_ptr<unsigned char>(wgmma_bwd_smem, a);
  }
};

template <class KT>
struct BwdSmem : SmemView<KT> {
  using V = SmemView<KT>;
  using typename V::S, V::base, V::bars, V::bytes;
  using V::V;
  __device__ __forceinline__ u32 full(int stage) const { return bars + 8 * stage; }
  __device__ __forceinline__ u32 empty(int stage) const { return bars + 8 * (KT::kStages + stage); }
  __device__ __forceinline__ u32 dq_full(int buf) const { return bars + 8 * (2 * KT::kStages + buf); }
  __device__ __forceinline__ u32 dq_empty(int buf) const {
    return bars + 8 * (2 * KT::kStages + 2 + buf);
  }
  __device__ __forceinline__ u32 k() const { return CA_FIELD(base, S, k); }
  __device__ __forceinline__ u32 v() const { return CA_FIELD(base, S, v); }
  __device__ __forceinline__ u32 q(int stage) const {
    return CA_FIELD(base, S, q) + stage * KT::QTile::BYTES;
  }
  __device__ __forceinline__ u32 dout(int stage) const {
    return CA_FIELD(base, S, dout) + stage * KT::QTile::BYTES;
  }
  __device__ __forceinline__ u32 ds() const { return CA_FIELD(base, S, ds); }
  __device__ __forceinline__ u32 pt() const { return CA_FIELD(base, S, pt); }  // KV_SS_FITS
  __device__ __forceinline__ u32 stats(int stage) const {
    return CA_FIELD(base, S, stats) + stage * (2 * KT::BLOCK_M * 4);
  }
  __device__ __forceinline__ const float* lse(int stage) const {
    return shared_ptr<const float>(wgmma_bwd_smem, stats(stage));
  }
  __device__ __forceinline__ const float* delta(int stage) const { return lse(stage) + KT::BLOCK_M; }
  __device__ __forceinline__ float* p_slots() const {  // the wide kernel's P^T
    return shared_ptr<float>(wgmma_bwd_smem, CA_FIELD(base, S, p));
  }
  __device__ __forceinline__ u32 dq(int buf) const {  // narrow: buffer buf of sdQ
    return CA_FIELD(base, S, dq) + buf * KT::DqTile::BYTES;
  }
};

// ---------------------------------------------------------------------------
// Tile scheduler: the block's work. Keys n0.. of KV head h_kv, batch b, against the
// query tiles that see them (QueryTileWalk: the variant's q_begin, q_end, over each
// query head of the KV head's group in turn): iterations [begin, end) of that walk.
// Reads params only (f: bound to the block's sequence; packed sequences: key block
// n_block of sequence b, bind_block). No claim counter: the grid is fixed,
//   SPLIT = false: one block per (key block, KV head, batch), grid (x, y, z) = those,
//                  and the block takes the whole walk;
//   SPLIT = true:  kv_splits blocks per (key block, KV head, batch), each a contiguous
//                  share of the walk, their dK and dV summed with atomics (the host
//                  splits where the grid would leave SMs idle or a causal tail: a
//                  small batch x KV heads). A 1-D grid, the key block slowest: under a
//                  causal band the first key blocks, which see the most query tiles,
//                  start first. Fixed-length sequences only.
//   ORDERED:       (kDqOrdered, kDqStaggered) one block per (key block, KV head,
//                  batch) as above;
//                  the key blocks that reach a query tile add their dQ into it one
//                  after another (turn: how many come before this one), in the
//                  order in which they get there, and the grid starts every block
//                  after the blocks it waits for, so a waiting block never holds an
//                  SM that an awaited one needs. Two orders (the host's choice):
//     STAGGERED (kDqStaggered, under an upper bound: causal): the default walk,
//                  from the diagonal down; block n + 1 reaches each tile it shares
//                  with n one or more iterations before n (its walk starts further
//                  down and, per GQA head, is shorter), so the turns go from the
//                  highest key block down, and the grid runs the key blocks of a
//                  group from the last
//                  (n_block = N - 1 - blockIdx.x). A block hands its turn on one
//                  tile later (Epilogue::pass_turn's wait then finds the addition
//                  long complete). The shortest walks start first, so the longest
//                  run last: the host takes this order where the grid holds many
//                  blocks per SM.
//     lockstep (kDqOrdered): the walk runs LOCKSTEP (bwd_tiles.cuh: from the
//                  last tile up, a GQA group's heads innermost), so the key blocks
//                  that reach a tile get there on the same iteration (without a
//                  lower bound; with one, lower blocks earlier), the turns go from
//                  the lowest key block that reaches the tile up and the grid runs
//                  the blocks in its own order. A block waits for its predecessor's
//                  addition of the same iteration, so it hands its turn on as soon
//                  as its own addition completed.
//       rotated (p.dq_rotate: no band, N key blocks <= T query tiles, and a head's N
//                  blocks fit the GPU at once): block n's walk starts n tiles further
//                  on and wraps, so at each iteration the blocks of a head sit on
//                  different tiles; tile q's turns go in the order the blocks reach
//                  it (block n at iteration j, by rotated_turn), each on an addition
//                  made an iteration or more before. Its predecessors include
//                  higher-numbered blocks, hence the residency condition (the host's
//                  rotated_turns): the earliest unfinished head then always gets
//                  its remaining blocks onto the GPU.
template <class KT, class VT_, bool ORDERED = false, bool STAGGERED_ = false>
struct TileScheduler {
  using VT = VT_;
  static constexpr bool kOrdered = ORDERED;
  static constexpr bool STAGGERED = STAGGERED_;
  static_assert(!STAGGERED || (ORDERED && VT::Band::kHi), "staggered turns need an upper bound");
  // (80-query tiles walk in lockstep in the atomic mode too: the default walk's
  // registers spilled 24-88 bytes there, at the consumers' 240)
  using Walk = QueryTileWalk<KT::BLOCK_M, KT::BLOCK_N, VT,
                             (ORDERED && !STAGGERED) || KT::DQ_TRANSPOSED>;
  const FwdParams& f;
  const int n_block, n0, h_kv, b;
  const Walk walk;
  const int begin, end;
  const bool rotated;  // ORDERED lockstep: the rotated walk (p.dq_rotate)

  __device__ __forceinline__ TileScheduler(const FwdParams& f_, int n_block_, int h_kv_, int b_,
                                           int split = 0, int splits = 1, bool rotate = false)
      : f(f_), n_block(n_block_), n0(n_block_ * KT::BLOCK_N), h_kv(h_kv_), b(b_),
        walk(f_, n_block_ * KT::BLOCK_N), begin(walk.iters * split / splits),
        end(walk.iters * (split + 1) / splits), rotated(ORDERED && !STAGGERED && rotate) {}
  // SPLIT's block: blockIdx.x = ((n_block * Hkv + h_kv) * B + b) * kv_splits + split.
  __device__ __forceinline__ static void locate(const BwdParams& p, int& n_block, int& h_kv,
                                                int& b, int& split) {
    int x = blockIdx.x;
    split = x % p.kv_splits, x /= p.kv_splits;
    b = x % p.fwd.batch, x /= p.fwd.batch;
    h_kv = x % p.fwd.heads_kv, n_block = x / p.fwd.heads_kv;
  }
  __device__ __forceinline__ int head(int it) const { return walk.head(it, h_kv, f.group); }
  __device__ __forceinline__ int m0(int it) const {
    if (!rotated) return walk.m0(it, f.group);
    int q = walk.tiles - 1 - walk.by.div(it) - n_block;  // the walk's tile, n_block on
    if (q < 0) q += walk.tiles;
    return (walk.first + q) * KT::BLOCK_M;
  }
  // The rotated walk's turn of block n on the tile it reaches at iteration j (N key
  // blocks, T tiles, N <= T): the blocks that reach that tile earlier are n + 1 ..
  // n + j modulo T, those below N counted.
  __device__ __forceinline__ static int rotated_turn(int n, int j, int N, int T) {
    return n + j < T ? cmin(j, N - 1 - n) : N - 1 - n + cmin(n + j - T + 1, N);
  }
  // ORDERED: the key block the grid's block x of a (KV head, batch) runs.
  __device__ __forceinline__ static int ordered_block(const FwdParams& f, int x) {
    return STAGGERED ? ceil_div(f.seqlen_k, KT::BLOCK_N) - 1 - x : x;
  }
  // ORDERED: how many key blocks add into tile it's dQ before this one.
  __device__ __forceinline__ int turn(int it) const {
    if (rotated)
      return rotated_turn(n_block, walk.by.div(it), ceil_div(f.seqlen_k, KT::BLOCK_N), walk.tiles);
    const int m0_ = m0(it);
    return STAGGERED ? Walk::highest_block(f, m0_) - n_block
                     : n_block - Walk::lowest_block(f, m0_);
  }
};

// ---------------------------------------------------------------------------
// Producer: the copy engine (tensor maps, one thread) loads K and V once and each
// query tile's Q and dout; the first STAT_THREADS threads copy the tile's lse and
// delta (cp.async). A stage's mbarrier full[stage] completes when all of it landed:
// the copy engine's bytes, the arrival of the thread that announced them, and one
// arrival from each stats thread once its copy landed (mbarrier_arrive_on_copies).
// A stage is reloaded once every warp released it (empty[stage], lane 0 of each warp
// after its last MMA of the tile): no barrier of the block. The copy engine fills
// rows and columns outside the tensors with zeros (rows past Sq or Sk, columns D..
// D_K); rows it fills with data the block must not use are zeroed by fix().

// Rows outside [lo, hi) of the swizzled tile `tile` (ROWS rows) set to zero, 16
// bytes a store by every thread (a row of a 64-column block is 128 contiguous bytes).
template <class KT, class Tile, int ROWS>
__device__ __forceinline__ void zero_rows(unsigned char* tile, int lo, int hi) {
  constexpr int CHUNKS = Tile::BYTES / 16;
  for (int c = threadIdx.x; c < CHUNKS; c += KT::CONSUMERS) {  // consumer threads
    const int r = c / 8 % ROWS;
    if (r < lo || r >= hi) *reinterpret_cast<uint4*>(tile + 16 * c) = make_uint4(0, 0, 0, 0);
  }
}

// lse2 = lse log2(e) of a row, +inf for a row that is not one (`row`: past Sq or the
// sequence) or attends nothing (lse = -inf), so that P = exp2(s2 - lse2) = 0 there.
__device__ __forceinline__ float lse2_of(bool row, float l) {
  return row && l != -CA_INF ? l * CA_LOG2E : CA_INF;
}

// Writes: sK, sV once; per query tile, its stage's sQ, sdO, lse and delta (stage
// from `next`, advanced per tile). Waits on: empty[stage] before reloading a stage.
// Signals: full[stage].
template <class KT, class Sched>
struct Producer {
  using T = typename KT::T;
  using VT = typename Sched::VT;
  using Walk = typename Sched::Walk;
  const BwdParams& p;  // bound to the block's sequence
  const BwdSmem<KT> st;
  const Sched& sched;
  const TmaMap &q_map, &k_map, &v_map, &dout_map;
  PipelineState<KT::kStages> next;  // the stage of the next query tile loaded

  // A stats thread's value of a query tile loaded ahead (load_q's DEFER) and the
  // stage that publish_stats stores it into.
  struct PendingStats {
    float v;
    int stage;
  };
  // Query tile `it` (Q, dout, lse, delta) into stage next.index(); with_kv: the
  // block's K and V too, on the same mbarrier. STATS_FREE: the caller knows that
  // every warp is past its reads of the stage's lse and delta (a barrier of the
  // block since), so only the copy engine's loads wait for the stage's release.
  // The first STAT_THREADS threads, thread ISSUER the issuer (the producer warpgroup
  // calls issue_copies and copy_stats itself: produce). An ISSUER past the stats
  // threads (STATS_FREE only) waits for the stage's release alone. DEFER (the narrow
  // kernel on two warpgroups, the wide kernel): each stats thread's value (c: lse,
  // then delta) is loaded into a register and returned, for publish_stats to store
  // later in the tile, so that the load's latency hides behind the tile's work.
  template <bool STATS_FREE, int ISSUER = 0, bool DEFER = false>
  __device__ __forceinline__ PendingStats load_q(int it, bool with_kv = false) {
    static_assert(ISSUER == 0 || (STATS_FREE && ISSUER >= KT::STAT_THREADS), "the issuer");
    const int h = sched.head(it), m0 = sched.m0(it), stage = next.index();
    PendingStats pending{0.f, stage};
    if (ISSUER != 0 && threadIdx.x == ISSUER) {
      if (it - sched.begin >= KT::kStages) mbarrier_wait(st.empty(stage), next.phase() ^ 1);
      issue_copies(stage, h, m0, with_kv);
    }
    if (threadIdx.x < KT::STAT_THREADS) {
      if ((!STATS_FREE || (ISSUER == 0 && threadIdx.x == 0)) && it - sched.begin >= KT::kStages)
        mbarrier_wait(st.empty(stage), next.phase() ^ 1);
      if (ISSUER == 0 && threadIdx.x == 0) issue_copies(stage, h, m0, with_kv);
      if constexpr (DEFER) {
        const int c = threadIdx.x, r = c < KT::BLOCK_M ? c : c - KT::BLOCK_M;
        if (r < Walk::row_hi(p.fwd, m0))
          pending.v = __ldg((c < KT::BLOCK_M ? lse_rows(h, m0) : delta_rows(h, m0)) + r);
      } else {
        copy_stats(stage, h, m0, threadIdx.x);
      }
    }
    next.advance();
    return pending;
  }
  // The issuer: the announcement of the bytes of query tile (head h, rows m0..) and
  // its tensor copies into `stage` (with_kv: K and V too).
  __device__ __forceinline__ void issue_copies(int stage, int h, int m0, bool with_kv) const {
    const FwdParams& f = p.fwd;
    const u32 full = st.full(stage);
    constexpr u32 Q_BYTES = 2 * KT::QTile::BYTES, KV_BYTES = 2 * KT::KVTile::BYTES;
    mbarrier_arrive_expect_tx(full, with_kv ? Q_BYTES + KV_BYTES : Q_BYTES);
    // map coordinates: broadcast (stride 0) head or batch axes are maps of size
    // 1; packed sequences are one batch entry, rows from the sequence's first
    int q_row = m0, k_row = sched.n0;
    if constexpr (VT::Seqs::kRagged)
      q_row += f.cu_seqlens_q[sched.b], k_row += f.cu_seqlens_k[sched.b];
    const int b = sched.b, h_kv = sched.h_kv;
    constexpr int BLOCKS = KT::D_BLOCKS;
    constexpr u32 Q_BLOCK = KT::QTile::BLOCK_BYTES, KV_BLOCK = KT::KVTile::BLOCK_BYTES;
    tma_load_blocks<BLOCKS>(st.q(stage), Q_BLOCK, q_map, q_row, f.q_head_stride ? h : 0,
                            f.q_batch_stride ? b : 0, full);
    tma_load_blocks<BLOCKS>(st.dout(stage), Q_BLOCK, dout_map, q_row,
                            p.dout_head_stride ? h : 0, p.dout_batch_stride ? b : 0, full);
    if (with_kv) {
      tma_load_blocks<BLOCKS>(st.k(), KV_BLOCK, k_map, k_row, f.k_head_stride ? h_kv : 0,
                              f.k_batch_stride ? b : 0, full);
      tma_load_blocks<BLOCKS>(st.v(), KV_BLOCK, v_map, k_row, f.v_head_stride ? h_kv : 0,
                              f.v_batch_stride ? b : 0, full);
    }
  }
  // The lse and delta of the query tile (head h, rows from m0) in global memory.
  __device__ __forceinline__ const float* lse_rows(int h, int m0) const {
    const FwdParams& f = p.fwd;
    return f.lse + sched.b * f.lse_batch_stride + h * f.lse_head_stride + m0;
  }
  __device__ __forceinline__ const float* delta_rows(int h, int m0) const {
    return p.delta + delta_row(p, sched.b, h) + m0;
  }
  // Value c (< STAT_THREADS: lse, then delta) of the query tile (head h, rows m0..)
  // into `stage`, one arrival on the stage's full barrier once the copy landed.
  __device__ __forceinline__ void copy_stats(int stage, int h, int m0, int c) const {
    const FwdParams& f = p.fwd;
    copy_row_stats<KT::BLOCK_M>(st.stats(stage), lse_rows(h, m0), delta_rows(h, m0),
                                Walk::row_hi(f, m0), f.lse, c);
    mbarrier_arrive_on_copies(st.full(stage));
  }
  // The producer warpgroup's stats thread: lse and delta of row r of the query tile
  // (head h, rows m0..) into `stage` (copy_row_stats' layout: zeros past the rows),
  // then one arrival, whose release orders the stores before the consumers' wait.
  // Plain loads and stores: the thread has nothing else to do. (Two values a thread
  // through copy_stats spilled at the producer's 24 registers.)
  __device__ __forceinline__ void copy_stats_row(int stage, int h, int m0, int r) const {
    float lse = CA_INF, delta = 0.f;  // lse2_of: +inf past the rows
    if (r < Walk::row_hi(p.fwd, m0)) {
      lse = lse2_of(true, lse_rows(h, m0)[r]);
      delta = delta_rows(h, m0)[r];
    }
    const u32 dst = st.stats(stage) + 4 * r;
    st_shared_u32(dst, __float_as_uint(lse));
    st_shared_u32(dst + 4 * KT::BLOCK_M, __float_as_uint(delta));
    mbarrier_arrive(st.full(stage));
  }

  // A value of load_q<.., DEFER> for query tile `it` into its stage (lse as lse2_of),
  // then this thread's arrival on the stage's full barrier.
  __device__ __forceinline__ void publish_stats(int it, PendingStats s) const {
    const int c = threadIdx.x;
    if (c < KT::STAT_THREADS) {
      float v = s.v;
      if (c < KT::BLOCK_M) v = lse2_of(c < Walk::row_hi(p.fwd, sched.m0(it)), v);
      st_shared_u32(st.stats(s.stage) + 4 * c, __float_as_uint(v));
      mbarrier_arrive(st.full(s.stage));
    }
  }

  // The block's K and V with its first query tile (nothing without query tiles);
  // DEFER: its stats through load_q's DEFER, published at once.
  template <bool DEFER = false>
  __device__ __forceinline__ void load_first() {
    if (sched.end <= sched.begin) return;
    if constexpr (DEFER) publish_stats(sched.begin, load_q<true, 0, true>(sched.begin, true));
    else load_q<true>(sched.begin, true);
  }

  // Every thread, once tile it's copies in `stage` landed (first: the block's first
  // tile, with K and V): rows the copy engine filled with data the kernel must read
  // as zeros are zeroed, then published to the async proxy and the block. Query
  // rows that attend nothing (causal, i < Sq - Sk: rows before row_lo), so that a
  // NaN there cannot reach dK or dV through 0 * NaN; under packed sequences, the
  // rows past the sequence's queries (and, with the first tile, keys: dQ = dS K),
  // which hold the next sequence's. Block-uniform; nothing to do for most tiles.
  __device__ __forceinline__ void fix(int it, int stage, bool first) const {
    const FwdParams& f = p.fwd;
    constexpr bool RAGGED = VT::Seqs::kRagged;
    const int m0 = sched.m0(it), lo = Walk::row_lo(f, m0);
    const int hi = RAGGED ? Walk::row_hi(f, m0) : KT::BLOCK_M;
    const int k_rows = RAGGED && first ? f.seqlen_k - sched.n0 : KT::BLOCK_N;
    if (lo <= 0 && hi >= KT::BLOCK_M && k_rows >= KT::BLOCK_N) return;
    zero_rows<KT, typename KT::QTile, KT::BLOCK_M>(st.bytes(st.q(stage)), lo, hi);
    zero_rows<KT, typename KT::QTile, KT::BLOCK_M>(st.bytes(st.dout(stage)), lo, hi);
    if (k_rows < KT::BLOCK_N)
      zero_rows<KT, typename KT::KVTile, KT::BLOCK_N>(st.bytes(st.k()), 0, k_rows);
    fence_proxy_async();
    named_barrier_sync(kBarFix, KT::CONSUMERS);
  }
};

// The stage's release: lane 0 of each warp, after the warp's last MMA reading it and
// (__syncwarp) every lane's last read of its lse and delta.
template <class KT>
__device__ __forceinline__ void release(const BwdSmem<KT>& st, int stage, int lane) {
  __syncwarp();
  if (lane == 0) mbarrier_arrive(st.empty(stage));
}

// ---------------------------------------------------------------------------
// Consumer steps: one warp's registers; the caller fences and waits around them.

// lse2 of query i from its lse l (lse2_of).
__device__ __forceinline__ float query_lse2(const FwdParams& f, int i, float l) {
  return lse2_of(i < f.seqlen_q, l);
}

// P^T in place of S^T, from the raw dots: s[nt * 4 + 2 r + c] is key j0 + g + 8 r,
// query m0 + 8 nt + 2 t + c, of the query head whose dense state is `hd`
// (VT::Dense::head). The variant: its score (VT::score: logits, a computed bias),
// and where
// the warp's 16 keys x the tile are partial (VT::partial: Sk, the band's edges) its
// per-element test VT::keep, P selected to 0 where it fails. Column pairs outer,
// rows inner, each column's lse loaded once: Scores<VT>::map<true>, rows outer,
// kept more registers live and spilled at D = 72-80 on 128-query tiles (ptxas of
// CUDA 13). Reads lse of the tile's stage: lse2 where LSE2 (staged: lse2_of),
// else lse.
// TEST: the variant's per-element test (0: none, 1: every element, 2: where
// `partial`), or TEST_LINE: none, and the warp's keys x the tile lie on one side
// `side` of the diagonal under a bias that is a line in the key (VT::kLinearBias,
// ALiBi): per query column the line along this thread's two keys j0 + g + 8 r
// (Dense::line from one conversion per tile), so a score costs one FFMA beside the
// logits' (the one with r = 0 none).
constexpr int TEST_LINE = 3;
template <class KT, class VT, int TEST, bool LSE2>
__device__ __forceinline__ void p_from_s_tile(float (&s)[KT::BLOCK_M / 2], const FwdParams& f,
                                              const float* s_lse, typename VT::Head hd, int m0,
                                              int j0, int g, int t, bool partial,
                                              float side = 0.f) {
  [[maybe_unused]] float off0 = 0.f;
  if constexpr (TEST == TEST_LINE) off0 = float(VT::Dense::offset(f, m0 + 2 * t, j0 + g));
#pragma unroll
  for (int nt = 0; nt < KT::Q_TILES; ++nt) {
    const int col = nt * 8 + 2 * t;
    const float2 lse = *reinterpret_cast<const float2*>(s_lse + col);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int i = m0 + col + c;
      const float lse2 = LSE2 ? (c ? lse.y : lse.x) : query_lse2(f, i, c ? lse.y : lse.x);
      [[maybe_unused]] const auto line = [&] {
        if constexpr (TEST == TEST_LINE)
          return VT::Dense::line(hd, off0 + float(8 * nt + c), side, -lse2);
        else
          return 0;
      }();
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = j0 + g + 8 * r;
        float& x = s[nt * 4 + 2 * r + c];
        const auto p_of = [&](float dot) {
          if constexpr (VT::kTransform) return fast_exp2(VT::shifted(f, hd, i, j, dot, -lse2));
          else return fast_exp2(fmaf(dot, f.scale_log2, -lse2));
        };
        if constexpr (TEST == TEST_LINE) {
          x = fast_exp2(VT::Logits::shifted(f, x, fmaf(line.b, float(8 * r), line.a)));
        } else if constexpr (TEST == 2) {  // the exp2 under the test: fewer registers live
          x = !partial || VT::keep(f, i, j) ? p_of(x) : 0.f;
        } else {
          const float e = p_of(x);
          x = TEST == 0 || VT::keep(f, i, j) ? e : 0.f;
        }
      }
    }
  }
}
// The per-element test of a warp's keys x the tile, as p_from_s_tile's TEST:
// `step(Int<TEST>{})` with 2 (one copy, the test where `partial`) without SPLIT_P,
// else 1 where partial and 0 elsewhere (warp-uniform: tiles that need no test run
// code without it).
template <int N> struct Int { static constexpr int value = N; };
template <class KT, class Step>
__device__ __forceinline__ void with_test(bool partial, Step&& step) {
  if constexpr (!KT::SPLIT_P) step(Int<2>{});
  else if (partial) step(Int<1>{});
  else step(Int<0>{});
}
// Returns whether the warp's keys x the tile are partial (warp-uniform).
template <class KT, class VT, bool LSE2 = false>
__device__ __forceinline__ bool p_from_s(float (&s)[KT::BLOCK_M / 2], const FwdParams& f,
                                         const float* s_lse, typename VT::Head hd, int m0,
                                         int j0, int lane) {
  static_assert(!VT::Dense::reads, "no dense masks in this family");
  const int g = lane / 4, t = lane % 4;
  const bool partial = VT::partial(f, m0, m0 + KT::BLOCK_M - 1, j0, j0 + 15);
  if constexpr (VT::kLinearBias && KT::SPLIT_P) {  // warp-uniform; a third copy spilled
                                                   // the 128-query tiles at D = 80
    const float side = partial ? 0.f : VT::line_side(f, m0, m0 + KT::BLOCK_M - 1, j0, j0 + 15);
    if (side != 0.f) {
      p_from_s_tile<KT, VT, TEST_LINE, LSE2>(s, f, s_lse, hd, m0, j0, g, t, false, side);
      return false;
    }
  }
  with_test<KT>(partial, [&](auto test) {
    p_from_s_tile<KT, VT, decltype(test)::value, LSE2>(s, f, s_lse, hd, m0, j0, g, t, partial);
  });
  return partial;
}

// Under a logits transform (the narrow kernel: without dropout): P^T and P^T times
// d s / d dot of each element in one pass, handed to `out(idx, p, pg)` (elements idx = nt * 4 + 2 r + c,
// read from s first) and, per column pair, to `pair(nt, r, p0, p1)`. d s / d dot
// comes from the exp2's own argument (s2 = y + lse2, a computed bias taken back out),
// not from log2 P as p_times_grad recovers it: one MUFU operation a score fewer. TEST
// as p_from_s_tile's 0 to 2 (masked elements: P and the product selected to 0).
template <class KT, class VT, int TEST, bool LSE2, class Out, class Pair>
__device__ __forceinline__ void p_grad_from_s_tile(const float (&s)[KT::BLOCK_M / 2],
                                                   const FwdParams& f, const float* s_lse,
                                                   typename VT::Head hd, int m0, int j0, int g,
                                                   int t, bool partial, Out&& out, Pair&& pair) {
#pragma unroll
  for (int nt = 0; nt < KT::Q_TILES; ++nt) {
    const int col = nt * 8 + 2 * t;
    const float2 lse = *reinterpret_cast<const float2*>(s_lse + col);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = j0 + g + 8 * r;
      float p[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int i = m0 + col + c, idx = nt * 4 + 2 * r + c;
        const float lse2 = LSE2 ? (c ? lse.y : lse.x) : query_lse2(f, i, c ? lse.y : lse.x);
        const bool kept = TEST == 0 || (TEST == 2 && !partial) || VT::keep(f, i, j);
        const float y = VT::shifted(f, hd, i, j, s[idx], -lse2);
        p[c] = kept ? fast_exp2(y) : 0.f;
        // P = 0 wherever lse2 is +inf (rows past Sq, rows that attend nothing): y + lse2
        // is NaN there
        const float s2 = VT::logits_of_score(f, hd, i, j, y + lse2);
        out(idx, p[c], p[c] == 0.f ? 0.f : p[c] * logits_grad_of_score<typename VT::Logits>(f, s2));
      }
      pair(nt, r, p[0], p[1]);
    }
  }
}
// p_grad_from_s_tile over the warp's keys x the tile; returns whether they are partial.
template <class KT, class VT, bool LSE2, class Out, class Pair>
__device__ __forceinline__ bool p_grad_from_s(const float (&s)[KT::BLOCK_M / 2],
                                              const FwdParams& f, const float* s_lse,
                                              typename VT::Head hd, int m0, int j0, int lane,
                                              Out&& out, Pair&& pair) {
  static_assert(VT::Logits::kTransform && !VT::kLinearBias, "a transform, no line bias");
  const int g = lane / 4, t = lane % 4;
  const bool partial = VT::partial(f, m0, m0 + KT::BLOCK_M - 1, j0, j0 + 15);
  with_test<KT>(partial, [&](auto test) {
    p_grad_from_s_tile<KT, VT, decltype(test)::value, LSE2>(s, f, s_lse, hd, m0, j0, g, t,
                                                            partial, out, pair);
  });
  return partial;
}

// Under a logits transform (softcap) where p_grad_from_s does not run (the narrow
// kernel under dropout, and at D = 120-128 with packed sequences or the ordered dQ),
// dS^T needs P^T times d s / d dot of the raw
// dot: `pg` = that, from P^T in `pt` (the score recomputed as s2 = log2 P + lse2, no
// register kept from S^T; a computed bias taken back out), selected to 0 where P =
// 0. Reads lse (LSE2: lse2) of the stage; hd, m0, j0 as p_from_s.
template <class KT, class VT, bool LSE2 = false>
__device__ __forceinline__ void p_times_grad(float (&pg)[KT::BLOCK_M / 2],
                                             const float (&pt)[KT::BLOCK_M / 2],
                                             const FwdParams& f, const float* s_lse,
                                             typename VT::Head hd, int m0, int j0, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < KT::Q_TILES; ++nt) {
    const int col = nt * 8 + 2 * t;
    const float2 lse = *reinterpret_cast<const float2*>(s_lse + col);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      // P = 0 wherever lse2 would be +inf (rows past Sq, rows that attend nothing)
      const float p = pt[nt * 4 + e], l = e % 2 ? lse.y : lse.x, lse2 = LSE2 ? l : l * CA_LOG2E;
      const int i = m0 + col + e % 2, j = j0 + g + 8 * (e / 2);
      const float s2 = VT::logits_of_score(f, hd, i, j, __log2f(p) + lse2);
      pg[nt * 4 + e] = p == 0.f ? 0.f : p * logits_grad_of_score<typename VT::Logits>(f, s2);
    }
  }
}

// dS^T = P^T (dP^T - delta) in place of dP^T (`pt` is P^T, or P^T * d s / d dot
// under a logits transform), with SELECT selected to 0 where P = 0: where the warp's
// keys x the tile are partial (p_from_s), a masked key's dP^T - delta may be NaN
// (non-finite values past Sk or under the mask), 0 * NaN. Elsewhere P = 0 only by
// underflow, beside finite dP^T - delta. Reads delta of the stage.
template <class KT, bool SELECT = true>
__device__ __forceinline__ void ds_from_dp(float (&dp)[KT::BLOCK_M / 2],
                                           const float (&pt)[KT::BLOCK_M / 2],
                                           const float* s_delta, int t) {
#pragma unroll
  for (int nt = 0; nt < KT::Q_TILES; ++nt) {
    const float2 delta = *reinterpret_cast<const float2*>(s_delta + nt * 8 + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int idx = nt * 4 + e;
      const float dl = e % 2 ? delta.y : delta.x;
      dp[idx] = SELECT && pt[idx] == 0.f ? 0.f : pt[idx] * (dp[idx] - dl);
    }
  }
}

// Two n8 groups of an M = 64 accumulator are one k16 step of its 16-bit A operand.
template <class T, int STEPS>
__device__ __forceinline__ void pack_a(u32 (&a)[STEPS][4], const float (&x)[8 * STEPS]) {
#pragma unroll
  for (int ks = 0; ks < STEPS; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      a[ks][e] = MmaType<T>::pack(x[8 * ks + 2 * e], x[8 * ks + 2 * e + 1]);
}

// Dropout (VT::Drop): this thread's S^T elements (keys j0 + g + 8 r, queries m0 + 8 nt +
// 2 t + c: an m16n8 C fragment transposed, per warp of the m64 wgmma accumulator) of
// query head h, drawn one 16 x 16 block (k16 step ks) at a time as the 16-bit values
// of P^T's A fragment pairs (DropoutDraw::transposed_values) and decided as they are
// used; nothing when dropout is off. The forward's P V took P fac (fac = keep / (1 -
// p), 0 where dropped): dV takes P^T keep (pack_kept: the dropped halves of its A
// fragments zero; the scale at the store) and dS^T = P^T (fac dP^T - delta)
// (scale_kept on dP^T).
template <class KT, class VT>
struct DropDraws {
  DropoutDraw d;
  u32 bh, ib0, jb;
  int g, t;
  __device__ __forceinline__ DropDraws(const FwdParams& f, int b, int h, int m0, int j0, int lane)
      : bh(u32(b * f.heads_q + h)), ib0(u32(m0 / 16)), jb(u32(j0 / 16)), g(lane / 4),
        t(lane % 4) {
    if constexpr (VT::Drop::enabled) d = VT::Drop::draw(f);
  }
  __device__ __forceinline__ void values(int ks, u32 (&v)[4]) const {
    d.transposed_values(bh, ib0 + u32(ks), jb, g, t, v);
  }
  // op(ks, e, x, lo, hi) for word e of k16 step ks of P^T's A fragments, which pairs
  // flat elements x and x + 1, kept or not (lo, hi): one draw a k16 step.
  template <class Op>
  __device__ __forceinline__ void each_pair(Op&& op) const {
#pragma unroll
    for (int ks = 0; ks < KT::KV_STEPS; ++ks) {
      u32 v[4];
      values(ks, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) op(ks, e, 8 * ks + 2 * e, d.kept_low(v[e]), d.kept_high(v[e]));
    }
  }
  __device__ __forceinline__ static u32 kept_pair(const float (&x)[KT::BLOCK_M / 2], int i,
                                                  bool lo, bool hi) {
    return MmaType<typename KT::T>::pack(lo ? x[i] : 0.f, hi ? x[i + 1] : 0.f);
  }
  __device__ __forceinline__ void scale_pair(float (&x)[KT::BLOCK_M / 2], int i, bool lo,
                                             bool hi) const {
    x[i] = lo ? d.scale * x[i] : 0.f;
    x[i + 1] = hi ? d.scale * x[i + 1] : 0.f;
  }
  // P^T (x) packed as A fragments with the dropped elements 0 (pack_a otherwise).
  __device__ __forceinline__ void pack_kept(u32 (&a)[KT::KV_STEPS][4],
                                            const float (&x)[KT::BLOCK_M / 2]) const {
    each_pair([&](int ks, int e, int i, bool lo, bool hi) { a[ks][e] = kept_pair(x, i, lo, hi); });
  }
  // dP^T (x) times its elements' fac, in place.
  __device__ __forceinline__ void scale_kept(float (&x)[KT::BLOCK_M / 2]) const {
    each_pair([&](int, int, int i, bool lo, bool hi) { scale_pair(x, i, lo, hi); });
  }
  // Both from one draw a block (the narrow kernel, whose warpgroup holds P^T and dP^T).
  __device__ __forceinline__ void pack_and_scale(u32 (&a)[KT::KV_STEPS][4],
                                                 const float (&pt)[KT::BLOCK_M / 2],
                                                 float (&dp)[KT::BLOCK_M / 2]) const {
    each_pair([&](int ks, int e, int i, bool lo, bool hi) {
      a[ks][e] = kept_pair(pt, i, lo, hi);
      scale_pair(dp, i, lo, hi);
    });
  }
};

// Fragment (ks, e) of a [key][query] tile in 16 bits: of A fragments (held: pack_a),
// or converted from the fp32 accumulator just before its store (KV_SS, which holds
// no A fragments).
template <class KT>
__device__ __forceinline__ u32 ds_fragment(const u32 (&da)[KT::KV_STEPS][4], int ks, int e) {
  return da[ks][e];
}
template <class KT>
__device__ __forceinline__ u32 ds_fragment(const float (&x)[KT::BLOCK_M / 2], int ks, int e) {
  return MmaType<typename KT::T>::pack(x[8 * ks + 2 * e], x[8 * ks + 2 * e + 1]);
}

// dS^T (or P^T: sP) [key][query] for dS K: fragment (ks, e) holds key key0 + g + 8
// (e % 2), queries 16 ks + 8 (e / 2) + 2t, +1 (n8 group 2 ks + e / 2), so the four
// fragments of a k16 step are the four 8x8 matrices of one stmatrix: lane l gives row
// key0 + l % 8 + 8 (l / 8 % 2) at chunk 2 ks + l / 16 (DsTile::at: one XOR a step).
// STMATRIX = false: a 32-bit store a fragment (with a logits transform, where ptxas
// of CUDA 13 spilled 8 bytes at D = 128 with stmatrix). The caller fences and
// publishes.
template <class KT, bool STMATRIX = true, class Src>
__device__ __forceinline__ void store_ds(u32 ds_tile, const Src& x, int key0, int lane) {
  if constexpr (STMATRIX) {
    const u32 base = KT::DsTile::lane(ds_tile, key0 + lane % 8 + 8 * (lane / 8 % 2), lane / 16);
#pragma unroll
    for (int ks = 0; ks < KT::KV_STEPS; ++ks) {
      const u32 r[4] = {ds_fragment<KT>(x, ks, 0), ds_fragment<KT>(x, ks, 1),
                        ds_fragment<KT>(x, ks, 2), ds_fragment<KT>(x, ks, 3)};
      stmatrix_x4(KT::DsTile::at(base, 0, 2 * ks), r);
    }
  } else {
    const u32 base = KT::DsTile::lane(ds_tile, key0 + lane / 4, 0) + 4 * (lane % 4);
#pragma unroll
    for (int ks = 0; ks < KT::KV_STEPS; ++ks)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st_shared_u32(KT::DsTile::at(base, 8 * (e % 2), 2 * ks + e / 2), ds_fragment<KT>(x, ks, e));
  }
}

// Issue x (=) A B^T over D_K: 64 keys of `a_tile` (from row a_row0, K-major) against
// the tile's queries of `b_tile` (K-major); one commit group. S^T = K Q^T, dP^T = V dout^T.
template <class KT>
__device__ __forceinline__ void issue_transposed(float (&x)[KT::BLOCK_M / 2], u32 a_tile,
                                                 int a_row0, u32 b_tile) {
  const u64 a_desc = KT::KVTile::kmajor(a_tile, a_row0, 0), b_desc = KT::QTile::kmajor(b_tile, 0, 0);
#pragma unroll
  for (int ks = 0; ks < KT::QK_STEPS; ++ks)
    Wgmma<KT::BLOCK_M>::ss(x, desc_advance(a_desc, KT::KVTile::kmajor_offset(ks)),
                           desc_advance(b_desc, KT::QTile::kmajor_offset(ks)), ks > 0,
                           typename KT::T{});
  wgmma_commit();
}

// Issue acc += X^T C: the 16-bit A fragments xa (keys x queries) against the tile
// `c_tile` (queries x D, MN-major); one commit group. dV += P^T dout, dK += dS^T Q.
template <class KT>
__device__ __forceinline__ void issue_accumulate(float (&acc)[KT::D / 2],
                                                 const u32 (&xa)[KT::KV_STEPS][4], u32 c_tile) {
  const u64 c_desc = KT::QTile::mnmajor(c_tile, 0);
#pragma unroll
  for (int ks = 0; ks < KT::KV_STEPS; ++ks)
    Wgmma<KT::D>::rs(acc, xa[ks], desc_advance(c_desc, KT::QTile::mnmajor_offset(ks)),
                     typename KT::T{});
  wgmma_commit();
}

// Issue acc += X^T C with X^T from shared memory: A = the 64 rows (keys) from row0 of
// the [key][query] tile `x_tile` (sP: P^T; sdS: dS^T; K-major over the queries), C =
// `c_tile` (queries x D, MN-major); one commit group. KV_SS's dV += P^T dout and
// dK += dS^T Q.
template <class KT>
__device__ __forceinline__ void issue_accumulate_ss(float (&acc)[KT::D / 2], u32 x_tile, int row0,
                                                    u32 c_tile) {
  const u64 a_desc = KT::DsTile::kmajor(x_tile, row0, 0), c_desc = KT::QTile::mnmajor(c_tile, 0);
#pragma unroll
  for (int ks = 0; ks < KT::KV_STEPS; ++ks)
    Wgmma<KT::D>::template ss<0, 1>(acc, desc_advance(a_desc, KT::DsTile::kmajor_offset(ks)),
                                    desc_advance(c_desc, KT::QTile::mnmajor_offset(ks)), 1,
                                    typename KT::T{});
  wgmma_commit();
}

// Issue dQ over the block's keys, both operands MN-major (TRANS_A, TRANS_B), K = the
// block's keys; one commit group. dQ = dS K: A = sdS at `a` (ATile = DsTile), B = sK's
// columns at `b` (BTile = KVTile). DQ_TRANSPOSED, dQ^T = K^T dS^T: A = sK's 64-column
// block at `a`, B = sdS [key][query] (N = BLOCK_M); dq[nt * 4 + 2 r + c] is then
// head-dim row 16 k + g + 8 r of the block (warp k of the warpgroup), query 8 nt +
// 2 t + c.
template <class KT, class ATile = typename KT::DsTile, class BTile = typename KT::KVTile>
__device__ __forceinline__ void issue_dq(float (&dq)[KT::DQ_N / 2], u32 a, u32 b) {
  const u64 a_desc = ATile::mnmajor(a, 0), b_desc = BTile::mnmajor(b, 0);
#pragma unroll
  for (int ks = 0; ks < KT::DQ_STEPS; ++ks)
    Wgmma<KT::DQ_N>::template ss<1, 1>(dq, desc_advance(a_desc, ATile::mnmajor_offset(ks)),
                                       desc_advance(b_desc, BTile::mnmajor_offset(ks)),
                                       ks > 0, typename KT::T{});
  wgmma_commit();
}
template <class KT>
__device__ __forceinline__ void issue_dq_t(float (&dq)[KT::DQ_N / 2], u32 k_a, u32 ds_b) {
  issue_dq<KT, typename KT::KVTile, typename KT::DsTile>(dq, k_a, ds_b);
}

// ---------------------------------------------------------------------------
// kDqOrdered, kDqStaggered, by the thread that adds a tile's dQ (BLOCK_M rows): tile
// it's turn counter (dq_turns, one per batch, query head and query tile: the additions
// done). wait spins until the key blocks before this one (Sched::turn; wait_for: `mine`
// of them) have added theirs, then orders the copy engine's addition after that read,
// and returns the counter; pass waits for this block's addition of the tile to complete (all but the
// thread's PENDING latest bulk groups) and counts it, a release that the next block's
// acquire reads.
template <int BLOCK_M>
struct DqTurn {
  template <class Sched>
  __device__ __forceinline__ static int* counter(const BwdParams& p, const Sched& sched, int it) {
    const FwdParams& f = p.fwd;
    const int tiles = ceil_div(f.seqlen_q, BLOCK_M);
    return dq_turns(p) + (i64(sched.b) * f.heads_q + sched.head(it)) * tiles +
           sched.m0(it) / BLOCK_M;
  }
  __device__ __forceinline__ static void wait_for(const int* c, int mine) {
    while (ld_acquire_gpu(c) != mine) {
    }
    fence_proxy_async_global();
  }
  template <class Sched>
  __device__ __forceinline__ static int* wait(const BwdParams& p, const Sched& sched, int it) {
    int* c = counter(p, sched, it);
    wait_for(c, sched.turn(it));
    return c;
  }
  template <int PENDING>
  __device__ __forceinline__ static void pass(int* c) {
    bulk_wait<PENDING>();
    fence_proxy_async_global();
    red_release_gpu_add(c, 1);
  }
};

// ---------------------------------------------------------------------------
// Epilogue: the dQ reductions (per tile) and the dK, dV stores (once).
template <class KT, class Sched, bool FLAT = false>
struct Epilogue {
  using T = typename KT::T;
  using VT = typename Sched::VT;
  const BwdParams& p;
  const BwdSmem<KT> st;
  const Sched& sched;

  // The narrow kernel's dQ path. stage_dq: a warpgroup's dQ fragment (dq / scale:
  // dq[dt * 4 + 2 r + c] is query row0 + g + 8 r, column col0 + 8 dt + 2 t + c, of
  // which columns col0 + [skip, cols)) into buffer `buf` of sdQ (StagedTiles' layout); rows past
  // a packed sequence as zeros (its boxes reach into the next sequence's rows).
  // reduce_dq (one thread, after the block's staging writers fenced and met it at a
  // barrier): sdQ buffer `buf` added into tile it's rows of dq_accum, whose rows
  // past Sq the map skips, by the copy engine, one bulk group; the thread waits for
  // its read (bulk_wait_read) before that buffer is staged again, two tiles later.
  // FLAT over packed sequences: the tiles whole within their sequence only (flat_tile);
  // a sequence's last, partial tile keeps its rows in order (its box's rows past the
  // sequence, zeros, land in the next sequence's rows).
  __device__ __forceinline__ bool flat_tile(int it) const {
    if constexpr (!VT::Seqs::kRagged) return FLAT;
    else return FLAT && sched.m0(it) + KT::BLOCK_M <= p.fwd.seqlen_q;
  }
  template <int N>
  __device__ __forceinline__ void stage_dq(const float (&dq)[N / 2], int it, int buf, int row0,
                                           int col0, int skip, int cols, int g, int t) const {
    if (flat_tile(it)) {   // (every row kept; the columns below `cols`, from 0)
      const u32 at = st.dq(buf) + (threadIdx.x / 128) * (64 * N * 4) + (threadIdx.x % 128) * 16;
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        if (8 * j < cols)
          st_shared_f32x4(at + 2048 * j, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
      }
    } else if constexpr (!FLAT || VT::Seqs::kRagged) {
      // Column col0 + 8 dt + 2t is chunk col0 / 4 + 2 dt + t / 2 (col0 a multiple of 64:
      // the chunk's low bit is the lane's, dt's bits above it), bytes 8 (t % 2) on.
      const u32 lane = KT::DqTile::lane(st.dq(buf), row0 + g, col0 / 4 + t / 2) + 8 * (t % 2);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const bool zero = VT::Seqs::kRagged && sched.m0(it) + row0 + g + 8 * r >= p.fwd.seqlen_q;
#pragma unroll
        for (int dt = 0; dt < N / 8; ++dt) {
          if (8 * dt >= skip && 8 * dt < cols)
            st_shared_f32x2(KT::DqTile::at(lane, 8 * r, 2 * dt), zero ? 0.f : dq[dt * 4 + 2 * r],
                            zero ? 0.f : dq[dt * 4 + 2 * r + 1]);
        }
      }
    }
  }
  // DQ_TRANSPOSED: a warpgroup's dQ^T fragment (issue_dq_t's layout; head-dim rows
  // d0 + g + 8 r, d0 = 64 w + 16 k) into buffer `buf` of sdQ, transposed: one float a
  // store, a warp's 32 of one instruction in 8 distinct chunks of 4 rows (the
  // swizzle), no bank twice. Rows of D past the head dim are not staged.
  __device__ __forceinline__ void stage_dq_t(const float (&dq)[KT::DQ_N / 2], int it, int buf,
                                             int d0, int g, int t) const {
    // Float column d = d0 + g + 8 r is chunk d0 / 4 + g / 4 + 2 r, bytes 4 (g % 4) on
    // (d0 a multiple of 16: 2 r misses the chunk's low bit, g / 4); query row 8 nt + 2 t
    // + c: one lane address per c (DqTile::lane, at).
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const u32 lane = KT::DqTile::lane(st.dq(buf), 2 * t + c, d0 / 4 + g / 4) + 4 * (g % 4);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (d0 + 8 * r < KT::D) {  // warp-uniform: D is a multiple of 8
#pragma unroll
          for (int nt = 0; nt < KT::Q_TILES; ++nt) {
            const bool zero =
                VT::Seqs::kRagged && sched.m0(it) + 8 * nt + 2 * t + c >= p.fwd.seqlen_q;
            st_shared_u32(KT::DqTile::at(lane, 8 * nt, 2 * r),
                          __float_as_uint(zero ? 0.f : dq[nt * 4 + 2 * r + c]));
          }
        }
      }
    }
  }
  // In the ordered modes where the host says so (p.dq_store_first: every query tile
  // has a key block, so dq_accum's floats are not zeroed), the tile's first key block
  // (turn 0) stores its sdQ instead.
  __device__ __forceinline__ void reduce_dq(const TmaMap& dq_map, int it, int buf) const {
    const int h = sched.head(it);
    int row = sched.m0(it), b = sched.b;
    const bool store = Sched::kOrdered && p.dq_store_first && sched.turn(it) == 0;
    if (flat_tile(it)) {   // the tile's floats in its rows' place, one bulk copy
      // (the tile's first row of dq_accum in 32 bits: B Hq Sq < 2^32, delta's 16 GB;
      // the producer warpgroup's 24 registers spilled with the 64-bit products; packed
      // sequences: p's rows start at the sequence's, its batch strides are 0)
      constexpr u32 BYTES = KT::BLOCK_M * KT::D * 4;
      const u32 first = u32(b) * u32(p.delta_batch_stride) + u32(h) * u32(p.delta_head_stride) +
                        u32(row);
      float* dst = p.dq_accum + u64(first) * KT::D;
      if (store) bulk_store(dst, st.dq(buf), BYTES);
      else bulk_reduce_add(dst, st.dq(buf), BYTES);
    } else if constexpr (!FLAT || VT::Seqs::kRagged) {
      if constexpr (VT::Seqs::kRagged) row += p.fwd.cu_seqlens_q[b], b = 0;  // (the map's rows)
#pragma unroll
      for (int box = 0; box < KT::DQ_BOXES; ++box) {
        const u32 src = st.dq(buf) + box * KT::DqTile::BLOCK_BYTES;
        if (store) tma_store_4d(dq_map, src, 32 * box, row, h, b);
        else tma_reduce_add_4d(dq_map, src, 32 * box, row, h, b);
      }
    }
    bulk_commit();
  }

  // kDqOrdered, kDqStaggered: DqTurn's, for tile it.
  __device__ __forceinline__ int* wait_turn(int it) const {
    return DqTurn<KT::BLOCK_M>::wait(p, sched, it);
  }
  template <int PENDING>
  __device__ __forceinline__ void pass_turn(int* counter) const {
    DqTurn<KT::BLOCK_M>::template pass<PENDING>(counter);
  }
  template <int PENDING>
  __device__ __forceinline__ void pass_turn(int it) const {
    pass_turn<PENDING>(DqTurn<KT::BLOCK_M>::counter(p, sched, it));
  }

  // One warp: its 16 keys key0.. of acc * mul (a warpgroup's dK or dV fragment)
  // staged in those rows of the tile at `stage` (sK or sV: the caller has waited
  // for every MMA reading it), then whole rows stored to `out` (the KV head's rows
  // of dK or dV) with 16-byte stores.
  __device__ __forceinline__ void store_keys(const float (&acc)[KT::D / 2], float mul, u32 stage,
                                             T* out, i64 row_stride, int key0, int lane) const {
    const int g = lane / 4, t = lane % 4;
    unsigned char* bytes = st.bytes(stage);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int dt = 0; dt < KT::D / 8; ++dt)
        *reinterpret_cast<u32*>(bytes + KT::KVTile::offset(key0 + g + 8 * r, dt) + 4 * t) =
            MmaType<T>::pack(acc[dt * 4 + 2 * r] * mul, acc[dt * 4 + 2 * r + 1] * mul);
    __syncwarp();
    constexpr int CHUNKS = KT::D / 8;
#pragma unroll
    for (int c = lane; c < 16 * CHUNKS; c += 32) {
      const int r = c / CHUNKS, chunk = c % CHUNKS;
      const int j = sched.n0 + key0 + r;
      if (j < p.fwd.seqlen_k)
        *reinterpret_cast<uint4*>(out + j * row_stride + chunk * 8) =
            *reinterpret_cast<const uint4*>(bytes + KT::KVTile::offset(key0 + r, chunk));
    }
  }
  // SPLIT: one warp's 16 keys of acc * mul added into `accum` (dk_accum or dv_accum:
  // [B, Hkv, Sk, D] fp32) with fp32 reductions, in the fragment's own layout.
  __device__ __forceinline__ void add_keys(const float (&acc)[KT::D / 2], float mul,
                                           float* accum, int key0, int lane) const {
    const int g = lane / 4, t = lane % 4;
    float* rows = accum + (i64(sched.b) * p.fwd.heads_kv + sched.h_kv) * p.fwd.seqlen_k * KT::D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = sched.n0 + key0 + g + 8 * r;
      if (j < p.fwd.seqlen_k) {
#pragma unroll
        for (int dt = 0; dt < KT::D / 8; ++dt)
          red_add_f32x2(rows + i64(j) * KT::D + 8 * dt + 2 * t, acc[dt * 4 + 2 * r] * mul,
                        acc[dt * 4 + 2 * r + 1] * mul);
      }
    }
  }
  template <bool SPLIT>
  __device__ __forceinline__ void store_dk(const float (&dk)[KT::D / 2], int key0, int lane) const {
    if constexpr (SPLIT) {
      if (sched.end > sched.begin) add_keys(dk, p.fwd.scale, p.dk_accum, key0, lane);
      return;
    }
    T* out = static_cast<T*>(p.dk) + sched.b * p.dk_batch_stride + sched.h_kv * p.dk_head_stride;
    store_keys(dk, p.fwd.scale, st.k(), out, p.dk_row_stride, key0, lane);
  }
  // dV was summed from P^T with the dropped elements cleared: 1 / (1 - p) here.
  template <bool SPLIT>
  __device__ __forceinline__ void store_dv(const float (&dv)[KT::D / 2], int key0, int lane) const {
    const float mul = VT::Drop::enabled ? p.fwd.dropout_scale : 1.f;
    if constexpr (SPLIT) {
      if (sched.end > sched.begin) add_keys(dv, mul, p.dv_accum, key0, lane);
      return;
    }
    T* out = static_cast<T*>(p.dv) + sched.b * p.dv_batch_stride + sched.h_kv * p.dv_head_stride;
    store_keys(dv, mul, st.v(), out, p.dv_row_stride, key0, lane);
  }
};

// The block's (key block, KV head, batch) and its share of the walk: from the grid
// (SPLIT: TileScheduler::locate) or, packed sequences, the sequence's key block.
// Fixed lengths: section_block's grid over key blocks and (KV head, batch) pairs
// (the host's bwd_section): under a causal band key block 0 walks the most query
// tiles, so a section's longest walks start first.
template <class KT, class VT, bool SPLIT>
__device__ __forceinline__ typename VT::Seqs::template Bound<BwdParams> bind_keys(
    const BwdParams& args, int& n_block, int& h_kv, int& b, int& split) {
  static_assert(!(SPLIT && VT::Seqs::kRagged), "packed sequences are not split");
  split = 0;
  if constexpr (SPLIT) {
    TileScheduler<KT, VT>::locate(args, n_block, h_kv, b, split);
    return args;
  } else if constexpr (VT::Seqs::kRagged) {
    h_kv = blockIdx.y;
    return VT::Seqs::template bind_block_regs<typename KT::T, KT::BLOCK_N, true>(args, blockIdx.x,
                                                                                 b, n_block);
  } else {
    section_block<false>(ceil_div(args.fwd.seqlen_k, KT::BLOCK_N), args.fwd.heads_kv, n_block,
                         h_kv, b);
    return args;
  }
}

// ---------------------------------------------------------------------------
// The kernels: thread 0 and the stats threads produce (Producer), every thread
// consumes (wgmma). The tensor maps: q and dout in boxes of BLOCK_M rows, k and v
// in boxes of BLOCK_N rows, 64 columns each (cupy_attention/tma.py).

// The stages' mbarriers initialized and published to the block, before the block's
// first loads.
template <class KT, bool PRODUCER_WG = false>
__device__ __forceinline__ void init_barriers(const BwdSmem<KT>& st) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < KT::kStages; ++i) {
      // the announcer, the stats threads (the producer warpgroup's: one per row)
      mbarrier_init(st.full(i), 1 + (PRODUCER_WG ? KT::BLOCK_M : KT::STAT_THREADS));
      mbarrier_init(st.empty(i), KT::CONSUMERS / 32);   // lane 0 of each consumer warp
    }
    if (PRODUCER_WG) {
      for (int i = 0; i < 2; ++i) {
        mbarrier_init(st.dq_full(i), KT::CONSUMERS / 32);
        mbarrier_init(st.dq_empty(i), 1);
      }
    }
  }
  __syncthreads();
}

// The producer warpgroup (BwdLaunch::PRODUCER_WG), after setmaxnreg. Its first
// thread issues a query tile's tensor copies once the consumers released the stage
// (empty); its next two warps copy the tile's lse and delta once the consumers met
// at kBarDs of the tile the stage held; its last warp adds each staged sdQ buffer
// into dq_accum (REDUCE): it waits for the buffer (dq_full), takes the tile's turn
// (ORDERED), issues the copy engine's reduction and, once that has read the buffer
// (ORDERED: completed, and the turn passed), frees it (dq_empty) for the consumers'
// staging two tiles on.
template <class KT, bool ORDERED, bool REDUCE, class Sched, class Epi>
__device__ __forceinline__ void produce(const Producer<KT, Sched>& producer,
                                        const Epi& epi, const BwdSmem<KT>& st,
                                        const TmaMap& dq_map,
                                        const Sched& sched) {
  const int warp = (int(threadIdx.x) - KT::CONSUMERS) / 32;
  if (warp == 0) {
    if (threadIdx.x == KT::CONSUMERS) {
      PipelineState<KT::kStages> next;
      for (int it = sched.begin; it < sched.end; ++it, next.advance()) {
        if (it - sched.begin >= KT::kStages)
          mbarrier_wait(st.empty(next.index()), next.phase() ^ 1);
        producer.issue_copies(next.index(), sched.head(it), sched.m0(it), it == sched.begin);
      }
    }
  } else if (warp < 3) {  // warps 1 and 2: lse and delta of rows r, r + 64, ...
    // A stage's lse and delta are free once the consumers met at kBarDs of the tile
    // it held (past their last reads of them; earlier than its release): these
    // warps take part in every tile's kBarDs, waiting in it before each reload.
    const int r = int(threadIdx.x) - KT::CONSUMERS - 32;
    PipelineState<KT::kStages> next;
    for (int it = sched.begin; it < sched.end; ++it, next.advance()) {
      if (it - sched.begin >= KT::kStages) role_barrier_sync(kBarDs, KT::DS_MEETING);
      producer.copy_stats_row(next.index(), sched.head(it), sched.m0(it), r);
      if (KT::BLOCK_M > 64 && r + 64 < KT::BLOCK_M)  // (a loop spilled at 24 registers)
        producer.copy_stats_row(next.index(), sched.head(it), sched.m0(it), r + 64);
    }
    // the last tiles' meetings, each waited for: an arrival on a meeting that has
    // not completed would count toward it, not the next one
    for (int it = max(sched.begin, sched.end - KT::kStages); it < sched.end; ++it)
      role_barrier_sync(kBarDs, KT::DS_MEETING);
  } else if (REDUCE && warp == 3) {
    const bool leader = threadIdx.x % 32 == 0;
    for (int it = sched.begin; it < sched.end; ++it) {
      const int rel = it - sched.begin, buf = rel % KT::DQ_BUFFERS;
      mbarrier_wait(st.dq_full(buf), (rel / KT::DQ_BUFFERS) & 1);
      if (leader) {
        if constexpr (ORDERED) {
          int* counter = epi.wait_turn(it);
          epi.reduce_dq(dq_map, it, buf);
          epi.template pass_turn<0>(counter);
        } else {
          epi.reduce_dq(dq_map, it, buf);
          bulk_wait_read<0>();
        }
        if (it + KT::DQ_BUFFERS < sched.end) mbarrier_arrive(st.dq_empty(buf));
      }
      __syncwarp();
    }
    if (leader) bulk_wait<0>();
  }
}

// D <= 128: warpgroup w owns keys 64w..64w+63. Per tile: wait for the tile's copies,
// S^T, dP^T, dV, dK, dQ as the header describes, every MMA waited for before the
// next tile; the warpgroups meet once a tile, when both halves of sdS are written.
// kDqOrdered: thread 0 takes tile it - 1's turn before it adds that tile's sdQ and
// passes it on once the addition completed (kDqStaggered: tile it - 2's, a tile later).
template <class KT, class VT, int DQ, bool SPLIT, bool FLAT = false>
__global__ void __launch_bounds__((BwdLaunch<KT, VT, DQ, SPLIT>::THREADS), 1)
    flash_wgmma_bwd_dkdv(const BwdParams args, const __grid_constant__ TmaMap q_map,
                         const __grid_constant__ TmaMap k_map, const __grid_constant__ TmaMap v_map,
                         const __grid_constant__ TmaMap dout_map,
                         const __grid_constant__ TmaMap dq_map) {
  static_assert(!KT::WIDE, "D > 128 runs flash_wgmma_bwd_dkdv_wide");
  constexpr bool ORDERED = DQ >= kDqOrdered, DQ_HERE = DQ != kDqSeparate;
  constexpr bool PWG = BwdLaunch<KT, VT, DQ, SPLIT>::PRODUCER_WG;
  // lse staged as lse2 (lse2_of): by the producer warpgroup's stats warps, or on two
  // warpgroups by load_q (DEFER) and publish_stats; not for packed sequences on two
  // warpgroups, which spilled 40-44 bytes that way (D = 64, causal; CUDA 12.9 and
  // 13.5), and copy lse and delta by cp.async (load_first, load_q)
  constexpr bool LSE2 = PWG || !VT::Seqs::kRagged;
  // With the producer warpgroup, dQ is issued before dK and staged while dK runs
  // (dK's wgmma reads only Q from shared memory): 1.00-1.04x in the deterministic
  // mode; without it, on the atomic dQ, 0.98-1.02x (H100; notes-bwd-loops.md §11).
  constexpr bool DQ_FIRST = PWG;
  // 128-query tiles with the producer warpgroup: P^T goes through this warpgroup's
  // rows of sP and dS^T through those of sdS (FlashAttention-3 keeps P^T and dS^T in
  // shared memory too), and dV and dK read them from there (issue_accumulate_ss).
  constexpr bool KV_SS = PWG && KT::KV_SS_FITS;
  static_assert(!KV_SS || (DQ_FIRST && !VT::Logits::kTransform && !VT::Drop::enabled),
                "dV from sP: P^T unscaled and undropped, dQ before dK");
  constexpr bool DS_SPLIT = KT::SPLIT_P && !VT::Seqs::kRagged;
  // Dropout decides P^T's and dP^T's elements from one draw as it is made (after dP^T
  // is waited for; dV issued later): 64-query tiles only (on 128, with every block's
  // draw unrolled, ptxas spilled 400-488 bytes; the host's _narrow_rows)
  static_assert(!VT::Drop::enabled || KT::BLOCK_M == 64, "dropout: 64-query tiles");
  static_assert(!ORDERED || (!SPLIT && !VT::Seqs::kRagged),
                "ordered dQ: fixed lengths, one block per key block");
  static_assert(!FLAT || (KT::DQ_FLAT_FITS && DQ_HERE && (!VT::Seqs::kRagged || DQ == kDqAtomic)),
                "dQ in its own order: the tiles of dQ; packed sequences in the atomic mode");
  static_assert(!FLAT || KT::BLOCK_M * KT::D * 4 <= KT::DqTile::BYTES,
                "a tile's dQ in its own order fits its sdQ buffer");
  // The ordered modes: flash_wgmma_bwd_dq_convert, this grid's programmatic dependent,
  // may start on the SMs it leaves (it waits on each tile's turn count)
  if constexpr (DQ >= kDqOrdered) launch_dependents();
  int n_block, h_kv, b, split;  // packed sequences: the sequence's params (a copy; D =
                                // 80 has no shared memory left for them)
  typename VT::Seqs::template Bound<BwdParams> p =
      bind_keys<KT, VT, SPLIT>(args, n_block, h_kv, b, split);
  const FwdParams& f = p.fwd;
  if (VT::Seqs::kRagged && n_block * KT::BLOCK_N >= f.seqlen_k) return;  // block-uniform
  const BwdSmem<KT> st(storage_base(wgmma_bwd_smem));
  using Sched = TileScheduler<KT, VT, ORDERED, DQ == kDqStaggered>;
  if constexpr (ORDERED) n_block = Sched::ordered_block(f, n_block);
  const Sched sched(f, n_block, h_kv, b, split, SPLIT ? p.kv_splits : 1,
                    p.dq_rotate != 0);
  Producer<KT, Sched> producer{p, st, sched, q_map, k_map, v_map, dout_map};
  const Epilogue<KT, Sched, FLAT> epi{p, st, sched};
  // wg through a shuffle: ptxas then knows it is warp-uniform, and the wgmma
  // descriptors derived from it stay in uniform registers (no R2UR per wgmma). Not
  // under dropout, whose builds then spilled 8-88 bytes (the wide kernel's do not).
  const int wg = VT::Drop::enabled ? int(threadIdx.x / 128)
                                   : __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int key0 = 16 * warp;  // this warp's first key within the block
  init_barriers<KT, PWG>(st);
  if constexpr (PWG) {
    if (threadIdx.x >= KT::CONSUMERS) {  // the producer warpgroup
      setmaxnreg_dec<KT::PRODUCER_REGS>();
      // Returns without a block barrier: nothing it reads or writes is reused after
      // (the reducer waited for its last reduction), and the consumers meet at
      // kBarMmaDone among themselves (one __syncthreads in both roles would be two
      // barrier instructions, which bar.sync's .aligned semantics forbid).
      produce<KT, ORDERED, DQ_HERE>(producer, epi, st, dq_map, sched);
      return;
    }
    setmaxnreg_inc<KT::CONSUMER_REGS>();
  } else {
    producer.template load_first<LSE2>();
  }

  float dk[KT::D / 2], dv[KT::D / 2];  // this warpgroup's 64 keys x D
#pragma unroll
  for (int i = 0; i < KT::D / 2; ++i) dk[i] = dv[i] = 0.f;
  float s[KT::BLOCK_M / 2];           // S^T, then P^T (times d s / d dot): keys x queries
  float dp[KT::BLOCK_M / 2];          // dP^T, then dS^T
  u32 pa[KT::KV_STEPS][4];            // P^T in 16 bits: the A operand of P^T dout
  u32 da[KT::KV_STEPS][4];            // dS^T in 16 bits: the A operand of dS^T Q
  float dq[KT::DQ_N / 2];             // dQ tile slice (see DQ_SPLIT_ROWS)

  // dQ operands: rows (queries) or columns (head dim) of this warpgroup (DQ_TRANSPOSED:
  // dq^T's A is sK's block wg, its B sdS).
  const u32 dq_a = KT::DQ_TRANSPOSED
                       ? st.k() + wg * (KT::BLOCK_N * 128)
                       : st.ds() + (KT::DQ_SPLIT_ROWS ? wg * KT::BLOCK_N * 128 : 0);
  const int dq_col0 = KT::dq_col0(wg), dq_cols = KT::dq_cols(wg);
  const u32 dq_b = KT::DQ_TRANSPOSED ? st.ds() : st.k() + (dq_col0 / 64) * (KT::BLOCK_N * 128);
  const int dq_row0 = (KT::DQ_SPLIT_ROWS ? 64 * wg : 0) + 16 * (warp % 4);
  static_assert(!KT::DQ_TRANSPOSED || PWG || !DQ_HERE,
                "dQ^T's single sdQ buffer takes the producer warpgroup's handshake");
  // dV issued once dS^T is computed, not while (LATE_DV): on the 80-query tiles P^T's
  // 16-bit copy is then not live beside S^T and dP^T in fp32 (584-900 B spilled with
  // it); on the 64-query tiles as FlashAttention-4's Hopper kernel does, 1.004-1.022x
  // at D = 96 and 128, causal (H200; notes-bwd-loops.md §43). Not where P^T is rescaled.
  constexpr bool LATE_DV = KT::DQ_TRANSPOSED || (KT::BLOCK_M == 64 && !VT::Logits::kTransform &&
                                                 !VT::Drop::enabled);
  static_assert(!LATE_DV || (!VT::Logits::kTransform && !VT::Drop::enabled),
                "dV after dS^T: P^T must not be scaled by d s / d dot yet, nor dP^T by dropout");

  PipelineState<KT::kStages> read;  // the stage of the tile consumed
  typename Producer<KT, Sched>::PendingStats next_stats{};  // two warpgroups: tile it + 1's
  for (int it = sched.begin; it < sched.end; ++it, read.advance()) {
    const int m0 = sched.m0(it), stage = read.index();
    const u32 q_tile = st.q(stage), o_tile = st.dout(stage);
    mbarrier_wait(st.full(stage), read.phase());
    producer.fix(it, stage, it == sched.begin);
    wgmma_fence();  // s, dp, dq were read by ordinary code
    issue_transposed<KT>(s, st.k(), 64 * wg, q_tile);
    issue_transposed<KT>(dp, st.v(), 64 * wg, o_tile);
    // lse and delta of tile it - 1 were read before that tile's sdS barrier
    if constexpr (!PWG) {
      if (it + 1 < sched.end) {
        if constexpr (LSE2) next_stats = producer.template load_q<DQ_HERE, 0, true>(it + 1);
        else producer.template load_q<DQ_HERE>(it + 1);
      }
    }

    wgmma_wait<1>();
    fence_regs(s);
    const typename VT::Head hd = VT::Dense::head(f, sched.b, sched.head(it));
    // P^T with its gradient factor in one pass (softcap without dropout: p_grad_from_s;
    // H200, S = 4k: 1.49-1.53x at D = 64 and 96, with ALiBi 1.27-1.35x), except at
    // D = 120-128 with packed sequences or the ordered dQ, where ptxas 12.9 spilled
    // 4-16 bytes with it
    constexpr bool GRAD_IN_P = VT::Logits::kTransform && !VT::Drop::enabled &&
                               (KT::D <= 112 || (!VT::Seqs::kRagged && DQ == kDqAtomic));
    const bool partial = [&] {
      if constexpr (GRAD_IN_P)  // P^T into pa, P^T * d s / d dot in place of S^T
        return p_grad_from_s<KT, VT, LSE2>(
            s, f, st.lse(stage), hd, m0, sched.n0 + key0, lane,
            [&](int idx, float, float pg) { s[idx] = pg; },
            [&](int nt, int r, float p0, float p1) {
              pa[nt / 2][2 * (nt % 2) + r] = MmaType<typename KT::T>::pack(p0, p1);
            });
      else
        return p_from_s<KT, VT, LSE2>(s, f, st.lse(stage), hd, m0, sched.n0 + key0, lane);
    }();
    const DropDraws<KT, VT> drop(f, sched.b, sched.head(it), m0, sched.n0 + key0, lane);
    const auto issue_dv = [&] {
      if constexpr (KV_SS) {
        // P^T into this warpgroup's rows of sP, which its dV of tile it - 1 (waited
        // for) was the last to read
        store_ds<KT>(st.pt(), s, key0, lane);
        fence_proxy_async();
        warpgroup_barrier(wg);
        wgmma_fence();
        issue_accumulate_ss<KT>(dv, st.pt(), 64 * wg, o_tile);
        return;
      }
      // dV from P^T keep (1 / (1 - p) at the store); s keeps P^T for dS^T. Dropout
      // decides P^T's and dP^T's elements from one draw, so dP^T is waited for first.
      if constexpr (VT::Drop::enabled) drop.pack_and_scale(pa, s, dp);
      else if constexpr (!GRAD_IN_P) pack_a<typename KT::T>(pa, s);
      if constexpr (VT::Logits::kTransform && !GRAD_IN_P)
        p_times_grad<KT, VT, LSE2>(s, s, f, st.lse(stage), hd, m0, sched.n0 + key0, lane);
      wgmma_fence();
      issue_accumulate<KT>(dv, pa, o_tile);
    };
    if constexpr (!LATE_DV) {
      if constexpr (VT::Drop::enabled) {
        wgmma_wait<0>();
        fence_regs(dp);
      }
      issue_dv();
    }

    // (Under dropout dP^T was waited for above and this wait finds only dV in flight;
    // without it ptxas spilled 16 bytes at D = 128 with window, softcap, packed
    // sequences and dropout.)
    wgmma_wait<LATE_DV ? 0 : 1>();
    fence_regs(dp);
    // dS^T's select only where the tile is partial: in code of its own where that
    // spills nothing (not the 80- or 128-query tiles past D = 64, nor packed
    // sequences: 16-260 bytes, ptxas of CUDA 13)
    if (!DS_SPLIT || partial) ds_from_dp<KT>(dp, s, st.delta(stage), t);  // warp-uniform
    else ds_from_dp<KT, false>(dp, s, st.delta(stage), t);
    if constexpr (LATE_DV) issue_dv();
    if constexpr (!KV_SS) pack_a<typename KT::T>(da, dp);
    if constexpr (!DQ_FIRST) {
      wgmma_fence();
      issue_accumulate<KT>(dk, da, q_tile);
    }

    if constexpr (DQ_HERE) {
      // sdS is free once the other warpgroup's dQ of tile it - 1 is done. (The
      // producer warpgroup, the first tile: a barrier all the same, between the
      // delta reads above and the kBarDs meeting, which orders them before the stats
      // warps' stores two tiles on; racecheck reports those stores without one:
      // notes-bwd-loops.md §16 and §20.)
      if (it > sched.begin) named_barrier_sync(kBarDsFree0 + wg, KT::CONSUMERS);
      else if constexpr (PWG) warpgroup_barrier(wg);
      if constexpr (KV_SS) store_ds<KT>(st.ds(), dp, key0, lane);
      else store_ds<KT, !VT::Logits::kTransform>(st.ds(), da, key0, lane);
      fence_proxy_async();  // also publishes sdQ of tile it - 1 (staged below)
      if (!PWG && threadIdx.x == 0)
        bulk_wait_read<0>();  // tile it - 2's sdQ read
      // sdS complete; sdQ of tile it - 1 too (PWG: the stats warps join: produce)
      if constexpr (PWG) role_barrier_sync(kBarDs, KT::DS_MEETING);
      else named_barrier_sync(kBarDs, KT::CONSUMERS);
      if constexpr (DQ_FIRST) wgmma_fence();
      if constexpr (KT::DQ_TRANSPOSED) issue_dq_t<KT>(dq, dq_a, dq_b);
      else issue_dq<KT>(dq, dq_a, dq_b);
      if constexpr (KV_SS) issue_accumulate_ss<KT>(dk, st.ds(), 64 * wg, q_tile);
      else if constexpr (DQ_FIRST) issue_accumulate<KT>(dk, da, q_tile);
      if constexpr (!PWG) {
        if (threadIdx.x == 0 && it > sched.begin) {
          if constexpr (ORDERED) epi.wait_turn(it - 1);
          epi.reduce_dq(dq_map, it - 1, (it - 1) & 1);
          if constexpr (Sched::STAGGERED) {
            if (it - 2 >= sched.begin) epi.template pass_turn<1>(it - 2);
          } else if constexpr (ORDERED) {
            epi.template pass_turn<0>(it - 1);
          }
        }
      }
    }
    if constexpr (!PWG && LSE2) {  // tile it + 1's stats, loaded at the tile's start
      if (it + 1 < sched.end) producer.publish_stats(it + 1, next_stats);
    }
    // Every MMA of the tile done: its registers and its stage free.
    const auto retire = [&] {
      wgmma_wait<0>();
      fence_regs(dk);
      fence_regs(dv);
      fence_regs(pa);
      fence_regs(da);
      release(st, stage, lane);
    };
    if constexpr (DQ_FIRST) wgmma_wait<1>();  // dQ done, dK may run on
    else retire();
    if constexpr (DQ_HERE) {
      fence_regs(dq);
      if (it + 1 < sched.end) named_barrier_arrive(kBarDsFree0 + 1 - wg, KT::CONSUMERS);
      if constexpr (PWG) {
        // sdQ buffer `buf` once the reduction DQ_BUFFERS tiles back has read it;
        // then handed to the producer's reducer (dq_full)
        constexpr int B = KT::DQ_BUFFERS;
        const int rel = it - sched.begin, buf = rel % B;
        if (rel >= B) mbarrier_wait(st.dq_empty(buf), ((rel / B) - 1) & 1);
        if constexpr (KT::DQ_TRANSPOSED)
          epi.stage_dq_t(dq, it, buf, 64 * wg + 16 * (warp % 4), g, t);
        else
          epi.template stage_dq<KT::DQ_N>(dq, it, buf, dq_row0, dq_col0, 0, dq_cols, g, t);
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbarrier_arrive(st.dq_full(buf));
      } else {
        epi.template stage_dq<KT::DQ_N>(dq, it, it & 1, dq_row0, dq_col0, 0, dq_cols, g, t);
      }
    }
    if constexpr (DQ_FIRST) retire();
  }
  if constexpr (DQ_HERE && !PWG)
    fence_proxy_async();  // the last tile's sdQ
  // every warpgroup's MMAs on sK and sV are done
  if constexpr (PWG) named_barrier_sync(kBarMmaDone, KT::CONSUMERS);
  else __syncthreads();
  if constexpr (DQ_HERE && !PWG) {
    if (sched.end > sched.begin && threadIdx.x == 0) {
      if constexpr (ORDERED) {
        if (Sched::STAGGERED && sched.end - 2 >= sched.begin)
          epi.template pass_turn<0>(sched.end - 2);
        epi.wait_turn(sched.end - 1);
      }
      epi.reduce_dq(dq_map, sched.end - 1, (sched.end - 1) & 1);
      if constexpr (ORDERED) epi.template pass_turn<0>(sched.end - 1);
      else bulk_wait<0>();
    }
  }

  // Each warp stages its own 16 keys of dK * scale and dV in its rows of sK and sV
  // (SPLIT: adds them into dk_accum, dv_accum).
  epi.template store_dk<SPLIT>(dk, key0, lane);
  epi.template store_dv<SPLIT>(dv, key0, lane);
}

// dQ = dq_accum * scale for query rows m0 .. m0 + BLOCK_M of head h, batch b (all below
// Sq), from a tile in its own order (KT::DQ_FLAT_FITS' layout), by one block of 256
// threads: each reads float4s of the tile in order, i.e. rows a and a + 8 of columns
// c, c + 1, puts their 16-bit values in their rows of `rows` (shared; rows of D * 2
// bytes padded to 4 words past a multiple of 8, so a warp's 8 rows x 4 words meet
// every bank once), and the block writes whole rows with 16-byte stores (dq's rows
// 16-byte aligned: the host's flat_dq).
template <class KT, bool L2_ONLY>
__device__ __forceinline__ void convert_flat_tile(const BwdParams& p, int m0, int h, int b) {
  using T = typename KT::T;
  static_assert(KT::DQ_FLAT_FITS && KT::D % 8 == 0, "dQ's tiles in their own order");
  constexpr int STRIDE = KT::D * 2 + (KT::D / 2 % 8 == 0 ? 16 : 0), CHUNKS = KT::D / 8;
  constexpr int WG_FLOAT4S = 16 * KT::DQ_N;   // a warpgroup's share: 64 x DQ_N floats
  __shared__ __align__(16) unsigned char rows[KT::BLOCK_M * STRIDE];
  const FwdParams& f = p.fwd;
  const float4* acc =
      reinterpret_cast<const float4*>(p.dq_accum + (delta_row(p, b, h) + m0) * KT::D);
#pragma unroll
  for (int v = threadIdx.x; v < KT::BLOCK_M * KT::D / 4; v += 256) {
    const float4 a = L2_ONLY ? __ldcg(acc + v) : acc[v];
    const int w = v / WG_FLOAT4S, j = v % WG_FLOAT4S / 128, x = v % 128;
    const int row = 16 * (x / 32) + x % 32 / 4 + (KT::DQ_SPLIT_ROWS ? 64 * w : 0);
    const int col = 8 * j + 2 * (x % 4) + (KT::DQ_SPLIT_ROWS ? 0 : 64 * w);
    unsigned char* at = rows + row * STRIDE + col * 2;
    *reinterpret_cast<u32*>(at) = MmaType<T>::pack(a.x * f.scale, a.y * f.scale);
    *reinterpret_cast<u32*>(at + 8 * STRIDE) = MmaType<T>::pack(a.z * f.scale, a.w * f.scale);
  }
  __syncthreads();
  T* out = static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride +
           m0 * p.dq_row_stride;
#pragma unroll
  for (int c = threadIdx.x; c < KT::BLOCK_M * CHUNKS; c += 256) {
    const int r = c / CHUNKS, chunk = c % CHUNKS;
    *reinterpret_cast<uint4*>(out + r * p.dq_row_stride + chunk * 8) =
        *reinterpret_cast<const uint4*>(rows + r * STRIDE + chunk * 16);
  }
}

// dq = dq_accum * scale for one query tile (BLOCK_M rows of query head h, batch b) a
// block. TURNS (after the ordered dQ: kDqOrdered, kDqStaggered): the block waits until
// the tile's turn counter (dq_turns) reaches the key blocks whose walks reach it
// (QueryTileWalk's lowest_block .. highest_block; none where no row of it attends a
// key), i.e. until their additions completed, then converts. Launched as the dK/dV
// kernel's programmatic dependent, so its blocks start on the SMs that grid's last
// blocks leave and convert the tiles already complete while the rest run (it never
// waits for the whole grid). Rows as flash_bwd_dq_convert's (convert_row), the sums
// read through the L2 only; FLAT: a tile in its own order (convert_flat_tile). Without
// TURNS (the atomic dQ in its own order), launched after the dK/dV kernel; over packed
// sequences (the atomic FLAT only) a sequence's last, partial tile is in rows.
// Grid: (query tiles, Hq, B), packed sequences (virtual query tiles, Hq, 1); 256
// threads (at most 41 registers: ptxas held __launch_bounds__(256) alone to 32 and
// spilled 8 bytes).
template <class KT, class VT, bool FLAT = false, bool TURNS = true>
__global__ void __launch_bounds__(256, 1) flash_wgmma_bwd_dq_convert(const BwdParams p) {
  using T = typename KT::T;
  using Walk = QueryTileWalk<KT::BLOCK_M, KT::BLOCK_N, VT>;
  const FwdParams& f = p.fwd;
  int m0 = blockIdx.x * KT::BLOCK_M, h = blockIdx.y, b = blockIdx.z;
  int rows = cmin(KT::BLOCK_M, f.seqlen_q - m0);
  static_assert(!VT::Seqs::kRagged || (FLAT && !TURNS), "packed sequences: the atomic FLAT");
  if constexpr (VT::Seqs::kRagged) {   // grid (virtual query tiles, Hq, 1): seqs.cuh
    int m;
    VT::Seqs::locate_warp(f.cu_seqlens_q, f.batch, KT::BLOCK_M, blockIdx.x, b, m);
    const int start = f.cu_seqlens_q[b];
    rows = cmin(KT::BLOCK_M, f.cu_seqlens_q[b + 1] - start - m * KT::BLOCK_M);
    if (rows <= 0) return;
    m0 = start + m * KT::BLOCK_M, b = 0;
  }
  if (TURNS && threadIdx.x == 0) {
    const int lo = VT::kv_begin(f, m0), hi = VT::kv_end(f, m0 + KT::BLOCK_M - 1);
    const int adders =
        hi > lo ? Walk::highest_block(f, m0) - Walk::lowest_block(f, m0) + 1 : 0;
    const int* counter = dq_turns(p) + (i64(b) * f.heads_q + h) * gridDim.x + blockIdx.x;
    while (ld_acquire_gpu(counter) < adders) __nanosleep(256);
  }
  // (the acquire's thread, then the block: the sums are visible)
  if constexpr (TURNS) __syncthreads();
  if (FLAT && rows == KT::BLOCK_M) {   // (a partial tile: rows)
    if constexpr (FLAT) convert_flat_tile<KT, TURNS>(p, m0, h, b);
  } else {
    for (int r = threadIdx.x / ROW_LANES; r < rows; r += ROW_BLOCK)
      convert_row<T, TURNS>(static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride +
                                (m0 + r) * p.dq_row_stride,
                            p.dq_accum + (delta_row(p, b, h) + m0 + r) * KT::D, KT::D, f.scale,
                            threadIdx.x % ROW_LANES);
  }
}

// D > 128: both warpgroups cover the block's 64 keys; warpgroup 0 computes P^T and
// holds dV, warpgroup 1 computes dS^T and holds dK, one instruction stream with
// role-selected operands. Per tile: X^T, the hand-over of P^T (kBarP), acc += X^T C.
// No dQ: flash_wgmma_bwd_dq computes it.
template <class KT, class VT, int DQ, bool SPLIT>
__global__ void __launch_bounds__(KT::THREADS, 1)
    flash_wgmma_bwd_dkdv_wide(const BwdParams args, const __grid_constant__ TmaMap q_map,
                              const __grid_constant__ TmaMap k_map,
                              const __grid_constant__ TmaMap v_map,
                              const __grid_constant__ TmaMap dout_map) {
  static_assert(KT::WIDE, "D <= 128 runs flash_wgmma_bwd_dkdv");
  static_assert(DQ == kDqSeparate, "past D = 128 dQ is flash_wgmma_bwd_dq's");
  int n_block, h_kv, b, split;  // packed sequences: the sequence's params (a copy)
  typename VT::Seqs::template Bound<BwdParams> p =
      bind_keys<KT, VT, SPLIT>(args, n_block, h_kv, b, split);
  const FwdParams& f = p.fwd;
  if (VT::Seqs::kRagged && n_block * KT::BLOCK_N >= f.seqlen_k) return;  // block-uniform
  const BwdSmem<KT> st(storage_base(wgmma_bwd_smem));
  using Sched = TileScheduler<KT, VT>;
  const Sched sched(f, n_block, h_kv, b, split, SPLIT ? p.kv_splits : 1);
  Producer<KT, Sched> producer{p, st, sched, q_map, k_map, v_map, dout_map};
  const Epilogue<KT, Sched> epi{p, st, sched};
  // wg through a shuffle: ptxas then knows it is warp-uniform, and the wgmma
  // descriptors derived from it stay in uniform registers (no R2UR per wgmma).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = lane % 4;
  const int key0 = 16 * (warp % 4);  // this warp's first key
  // lse staged as lse2 (lse2_of) by warpgroup 0's threads: plain loads at the point
  // of the old copies, stored once dV is issued (load_q's DEFER, publish_stats)
  init_barriers(st);
  producer.template load_first<true>();
  // dS^T's select only where the warp's keys x the tile are partial (the narrow
  // kernel's DS_SPLIT); packed sequences select everywhere
  constexpr bool DS_SPLIT = !VT::Seqs::kRagged;

  float acc[KT::D / 2];  // warpgroup 0: dV, 1: dK / scale; the block's 64 keys x D
#pragma unroll
  for (int i = 0; i < KT::D / 2; ++i) acc[i] = 0.f;
  float x[KT::BLOCK_M / 2];     // warpgroup 0: S^T, then P^T; 1: dP^T, then dS^T
  u32 xa[KT::KV_STEPS][4];      // x in 16 bits: the A operand of acc's wgmma
  const u32 x_a = wg ? st.v() : st.k();
  // P^T (times d s / d dot) handed from warpgroup 0 to 1, float4 i of a thread at
  // slot i * 128 + thread: both warpgroups' accumulators of one shape, so thread k
  // of each holds the same elements.
  float4* p_slots = reinterpret_cast<float4*>(st.p_slots()) + threadIdx.x % 128;

  PipelineState<KT::kStages> read;  // the stage of the tile consumed
  typename Producer<KT, Sched>::PendingStats next_stats{};  // warpgroup 0: tile it + 1's
  for (int it = sched.begin; it < sched.end; ++it, read.advance()) {
    const int h = sched.head(it), m0 = sched.m0(it), stage = read.index();
    const u32 q_tile = st.q(stage), o_tile = st.dout(stage);
    // Tile it landed. The warpgroups do not meet at the tile's start: sP (and the
    // stats of tile it - 1's stage, reloaded below) are free once warpgroup 1
    // arrived at kBarPFree past its sP and delta reads.
    mbarrier_wait(st.full(stage), read.phase());
    producer.fix(it, stage, it == sched.begin);
    // Both warpgroups hold the same elements of their X^T: warpgroup 0 draws them for
    // P^T's A fragments, 1 for dP^T.
    const DropDraws<KT, VT> drop(f, sched.b, h, m0, sched.n0 + key0, lane);

    wgmma_fence();  // x was read by ordinary code
    issue_transposed<KT>(x, x_a, 0, wg ? o_tile : q_tile);
    // Tile it + 1 into tile it - 1's stage. Warpgroup 1's first thread issues its
    // tensor copies: warpgroup 1 runs behind 0 (it waits for P^T), so the release it
    // waits for is its own. (Warpgroup 0's threads load the stats once past
    // kBarPFree, below, and store them once dV is issued.)
    if (it + 1 < sched.end && wg == 1) producer.template load_q<true, 128, true>(it + 1);
    wgmma_wait<0>();
    fence_regs(x);

    if (wg == 0) {
      const typename VT::Head hd = VT::Dense::head(f, sched.b, h);
      float pg[KT::BLOCK_M / 2];  // a transform: what warpgroup 1 multiplies, P^T * d s / d dot
      if constexpr (VT::Logits::kTransform)
        p_grad_from_s<KT, VT, true>(
            x, f, st.lse(stage), hd, m0, sched.n0 + key0, lane,
            [&](int idx, float p, float g) { x[idx] = p, pg[idx] = g; }, [](int, int, float, float) {});
      else
        p_from_s<KT, VT, true>(x, f, st.lse(stage), hd, m0, sched.n0 + key0, lane);
      if (it > sched.begin) named_barrier_sync(kBarPFree, KT::THREADS);
      if (it + 1 < sched.end) next_stats = producer.template load_q<true, 128, true>(it + 1);
      if constexpr (VT::Logits::kTransform) {
#pragma unroll
        for (int i = 0; i < KT::BLOCK_M / 8; ++i)
          p_slots[i * 128] = make_float4(pg[4 * i], pg[4 * i + 1], pg[4 * i + 2], pg[4 * i + 3]);
      } else {
#pragma unroll
        for (int i = 0; i < KT::BLOCK_M / 8; ++i)
          p_slots[i * 128] = make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
      }
      named_barrier_arrive(kBarP, KT::THREADS);
    } else {
      named_barrier_sync(kBarP, KT::THREADS);
      float pt[KT::BLOCK_M / 2];
#pragma unroll
      for (int i = 0; i < KT::BLOCK_M / 8; ++i) {
        const float4 v = p_slots[i * 128];
        pt[4 * i] = v.x, pt[4 * i + 1] = v.y, pt[4 * i + 2] = v.z, pt[4 * i + 3] = v.w;
      }
      if constexpr (VT::Drop::enabled) drop.scale_kept(x);
      const int j0 = sched.n0 + key0;
      if (!DS_SPLIT || VT::partial(f, m0, m0 + KT::BLOCK_M - 1, j0, j0 + 15))  // warp-uniform
        ds_from_dp<KT>(x, pt, st.delta(stage), t);
      else
        ds_from_dp<KT, false>(x, pt, st.delta(stage), t);
      // (kBarPFree orders these delta reads before the stats copies two tiles on;
      // racecheck reported them now and then without a barrier of their own between
      // (1 run in 4), never with this one, which costs nothing measurable:
      // notes-bwd-loops.md §16.)
      warpgroup_barrier(1);
      if (it + 1 < sched.end) named_barrier_arrive(kBarPFree, KT::THREADS);
    }
    if (VT::Drop::enabled && wg == 0) drop.pack_kept(xa, x);  // dV from P^T keep
    else pack_a<typename KT::T>(xa, x);
    wgmma_fence();
    issue_accumulate<KT>(acc, xa, wg ? q_tile : o_tile);
    if (wg == 0 && it + 1 < sched.end) producer.publish_stats(it + 1, next_stats);
    wgmma_wait<0>();
    fence_regs(acc);
    fence_regs(xa);
    release(st, stage, lane);
  }
  __syncthreads();  // every warpgroup's MMAs on sK and sV are done

  // Warpgroup 0 stages dV in sV, warpgroup 1 dK * scale in sK, each warp its 16 keys
  // (SPLIT: adds them into dv_accum, dk_accum).
  if (wg == 0) {
    epi.template store_dv<SPLIT>(acc, key0, lane);
  } else {
    epi.template store_dk<SPLIT>(acc, key0, lane);
  }
}

// ---------------------------------------------------------------------------
// flash_wgmma_bwd_dkdv_mid, D = 136..192 over fixed lengths, both dQ modes: dK and dV
// as their transposes (head dim on wgmma's M: FlashAttention-3's dKV_swapAB at these
// head dims), the two consumer warpgroups split by role over the block's keys.
// BLOCK_N = 96 keys a block, BLOCK_M = 64 queries a tile. Per tile:
//   warpgroup 0: issue S = Q K^T          ss, both K-major, m64n96, over D_K
//                P = exp2(S scale log2 e - lse2) (Scores::map); release the Q stage's
//                lse; P^T to sPt [key][query] (stmatrix .trans) once warpgroup 1 has
//                read the last tile's (kBarMidPFree); hand it over (kBarMidP)
//                issue dV^T += dout^T P   ss, A MN-major (D_BLOCKS m64 tiles), B K-major
//   warpgroup 1: issue dP = dout V^T      as S; release dout and delta
//                P read back from sPt (ldmatrix .trans), dS = P (dP - delta); dS^T to
//                sdSt once warpgroup 0's dQ of the last tile is done with it
//                (kBarMidDsFree); hand it over (kBarDs)
//                issue dK^T += Q^T dS      as dV^T
//   both:        issue dQ = dS K          ss, both MN-major, over the block's 96 keys:
//                                          warpgroup 0 the first DQ_BLOCKS0 64-column
//                                          blocks of D (the fewer: it computes P), 1 the
//                                          rest (an MN-major B in the 128-byte swizzle
//                                          starts on a 64-column block)
//                release dout (0, after dV^T) or the Q stage (1, after dK^T); dQ staged
//                in its own order (FLAT: convert_flat_tile's layout, 64-column blocks)
//                for the reducer, or, for a tile past Sq's last whole one, added from
//                registers in rows (kDqAtomic only: the host gives the ordered modes
//                whole tiles). kDqOrdered, kDqStaggered: the reducer takes each tile's
//                turn (TileScheduler's orders, DqTurn) before its addition and passes
//                it once the addition completed.
// Every GEMM runs at N = 96 (two m64n48 halves asked about 1.4x the shared-memory
// bandwidth a key), and warpgroup 0's S and P of the next tile overlap warpgroup 1's
// dS and dK^T. Every consumer thread waits for the Q stage first (K and V land with the
// first tile's Q; warpgroup 1's dP reads V before anything of the stage) and releases
// its own reads (racecheck credits a thread's arrival for its reads only).
// Registers a consumer thread: dV^T or dK^T 3 x 48, S or dP 48, dQ 32 a column block.
// The two warpgroups' different roles and dQ widths: the tile loop is compiled once
// per warpgroup (a wgmma on a branch of wg serialized every wgmma: ptxas C7519), so
// their barriers are barrier.sync / barrier.arrive (not .aligned across the block).
// The producer warpgroup (setmaxnreg 24): warp 0's first thread loads Q (two stages; K
// and V with the first) and dout (one buffer), warp 1 stores lse2 with each Q stage,
// warp 2 delta with dout, warp 3 adds each staged dQ into dq_accum (one bulk reduction
// a tile). Shared memory at D = 192:
// K, V 36 KB each, Q 2 x 24, dout 24, sPt and sdSt 12 each, sdQ 48 (fp32): 217 KB.
// dK * scale and dV are staged transposed back through sK and sV (stmatrix .trans)
// and written with 16-byte stores: one block owns each key of a KV head.
template <int D_, class T_>
struct WgmmaBwdMidTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_K = (D + 15) / 16 * 16;
  static constexpr int BLOCK_M = 64;            // queries per tile
  static constexpr int BLOCK_N = 96;            // keys per block
  static constexpr int CONSUMERS = 256;
  static constexpr int THREADS = CONSUMERS + 128;
  static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;
  static constexpr int D_BLOCKS = (D + 63) / 64;   // 64-column blocks; m64 tiles of dK^T, dV^T
  static constexpr int QK_STEPS = D_K / 16;
  static constexpr int KV_STEPS = BLOCK_M / 16;
  static constexpr int DQ_STEPS = BLOCK_N / 16;
  // warpgroup 0's column blocks of dQ: the fewer, since its P's exponentials are the
  // longer of the two roles' work off the tensor pipe (one of three blocks against two:
  // 1.04-1.13x, notes-bwd-loops.md section 40)
  static constexpr int DQ_BLOCKS0 = D_BLOCKS / 2;
  // (TileScheduler, convert_flat_tile: dQ's tile in its own order by 64-column blocks)
  static constexpr bool DQ_TRANSPOSED = false, DQ_SPLIT_ROWS = false, DQ_FLAT_FITS = true;
  static constexpr int DQ_N = 64;
  using KVTile = SwizzledTile<BLOCK_N, D_K>;
  using QTile = SwizzledTile<BLOCK_M, D_K>;
  using PdsTile = SwizzledTile<BLOCK_N, BLOCK_M>;  // P^T, dS^T: rows are keys
  struct Storage {
    unsigned char k[KVTile::BYTES];
    unsigned char v[KVTile::BYTES];
    unsigned char q[2][QTile::BYTES];
    unsigned char dout[QTile::BYTES];
    unsigned char pt[PdsTile::BYTES];
    unsigned char ds[PdsTile::BYTES];
    float dq[BLOCK_M * D];                 // a tile's dQ in its own order
    float lse[2][BLOCK_M];                 // lse2 (lse2_of), per Q stage
    float delta[BLOCK_M];
  };
  static constexpr int SMEM_BYTES = sizeof(Storage) + SMEM_SLACK;
  struct Barriers {
    u64 q_full[2], q_empty[2], do_full, do_empty, dq_full, dq_empty;
  };
  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D % 8 == 0 && D > 128 && D <= 192, "D a multiple of 8 from 136 to 192");
  static_assert(SMEM_BYTES <= 227 * 1024, "227 KB of shared memory");
  static_assert(168 * THREADS >= PRODUCER_REGS * 128 + CONSUMER_REGS * CONSUMERS,
                "the consumers take no more registers than the producer gave up");
};

template <class KT>
struct MidSmem : SmemView<KT> {
  using V = SmemView<KT>;
  using typename V::S, V::base, V::bars, V::bytes;
  using V::V;
  __device__ __forceinline__ u32 q_full(int s) const { return bars + 8 * s; }
  __device__ __forceinline__ u32 q_empty(int s) const { return bars + 16 + 8 * s; }
  __device__ __forceinline__ u32 do_full() const { return bars + 32; }
  __device__ __forceinline__ u32 do_empty() const { return bars + 40; }
  __device__ __forceinline__ u32 dq_full() const { return bars + 48; }
  __device__ __forceinline__ u32 dq_empty() const { return bars + 56; }
  __device__ __forceinline__ u32 k() const { return CA_FIELD(base, S, k); }
  __device__ __forceinline__ u32 v() const { return CA_FIELD(base, S, v); }
  __device__ __forceinline__ u32 q(int s) const { return CA_FIELD(base, S, q) + s * KT::QTile::BYTES; }
  __device__ __forceinline__ u32 dout() const { return CA_FIELD(base, S, dout); }
  __device__ __forceinline__ u32 pt() const { return CA_FIELD(base, S, pt); }
  __device__ __forceinline__ u32 ds() const { return CA_FIELD(base, S, ds); }
  __device__ __forceinline__ u32 dq() const { return CA_FIELD(base, S, dq); }
  __device__ __forceinline__ u32 lse(int s) const { return CA_FIELD(base, S, lse) + s * KT::BLOCK_M * 4; }
  __device__ __forceinline__ u32 delta() const { return CA_FIELD(base, S, delta); }
  __device__ __forceinline__ float stat(u32 a) const { return *shared_ptr<const float>(wgmma_bwd_smem, a); }
};

// A warp's m64nN accumulator x (rows row0 + g + 8 r, columns col0 + 8 nt + 2 t + c at
// x[nt * 4 + 2 r + c]) times mul, in 16 bits, stored transposed into the swizzled
// tile at `tile` (Tile: rows are x's columns): x's column col0 + j in row j, its
// rows in chunks chunk0 (rows row0..row0 + 7) and chunk0 + 1 (row0 + 8..). N / 16
// stmatrix .x4, each two n8 groups x both row halves.
template <class Tile, class T, int N>
__device__ __forceinline__ void store_transposed(u32 tile, const float (&x)[N / 2], float mul,
                                                 int chunk0, int lane) {
  const int i = lane / 8, k = lane % 8;
#pragma unroll
  for (int q = 0; q < N / 16; ++q) {
    u32 r[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int nt = 2 * q + m / 2, h = m % 2;
      r[m] = MmaType<T>::pack(x[nt * 4 + 2 * h] * mul, x[nt * 4 + 2 * h + 1] * mul);
    }
    stmatrix_x4_trans(tile + Tile::offset(8 * (2 * q + i / 2) + k, chunk0 + i % 2), r);
  }
}
// The inverse: p[e] the 16-bit pair of x[2 e], x[2 e + 1] (store_transposed's layout)
// read back from the tile by ldmatrix .trans.
template <class Tile, int N>
__device__ __forceinline__ void load_transposed(u32 tile, u32 (&p)[N / 4], int chunk0, int lane) {
  const int i = lane / 8, k = lane % 8;
#pragma unroll
  for (int q = 0; q < N / 16; ++q) {
    u32 r[4];
    ldmatrix_x4_trans(r, tile + Tile::offset(8 * (2 * q + i / 2) + k, chunk0 + i % 2));
#pragma unroll
    for (int m = 0; m < 4; ++m) p[2 * (2 * q + m / 2) + m % 2] = r[m];
  }
}

template <class KT, class VT, int DQ = kDqAtomic>
__global__ void __launch_bounds__(KT::THREADS, 1)
    flash_wgmma_bwd_dkdv_mid(const BwdParams args, const __grid_constant__ TmaMap q_map,
                             const __grid_constant__ TmaMap k_map,
                             const __grid_constant__ TmaMap v_map,
                             const __grid_constant__ TmaMap dout_map) {
  using T = typename KT::T;
  static_assert(!VT::Seqs::kRagged && !VT::Drop::enabled && !VT::Logits::kTransform,
                "fixed lengths, no dropout, no logits transform");
  static_assert(!VT::Dense::reads, "no dense masks in this family");
  static_assert(DQ != kDqSeparate, "dQ in the kernel");
  constexpr bool ORDERED = DQ >= kDqOrdered;
  // The ordered modes: flash_wgmma_bwd_dq_convert, this grid's programmatic dependent,
  // may start on the SMs it leaves (it waits on each tile's turn count)
  if constexpr (ORDERED) launch_dependents();
  const BwdParams& p = args;
  const FwdParams& f = p.fwd;
  int n_block, h_kv, b;
  section_block<false>(ceil_div(f.seqlen_k, KT::BLOCK_N), f.heads_kv, n_block, h_kv, b);
  const MidSmem<KT> st(storage_base(wgmma_bwd_smem));
  using Sched = TileScheduler<KT, VT, ORDERED, DQ == kDqStaggered>;
  using Walk = typename Sched::Walk;
  if constexpr (ORDERED) n_block = Sched::ordered_block(f, n_block);
  const Sched sched(f, n_block, h_kv, b, 0, 1, p.dq_rotate != 0);
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(st.q_full(s), 33);   // the announcement, and each lane's lse2
      mbarrier_init(st.q_empty(s), KT::CONSUMERS);   // every consumer thread
    }
    mbarrier_init(st.do_full(), 33);
    mbarrier_init(st.do_empty(), KT::CONSUMERS);
    mbarrier_init(st.dq_full(), KT::CONSUMERS);
    mbarrier_init(st.dq_empty(), 1);
  }
  __syncthreads();
  // A tile whose rows are all below Sq stages its dQ for the reducer; the last of a
  // head whose rows reach past Sq adds its rows from registers.
  const auto whole = [&](int it) { return sched.m0(it) + KT::BLOCK_M <= f.seqlen_q; };

  if (threadIdx.x >= KT::CONSUMERS) {  // the producer warpgroup
    setmaxnreg_dec<KT::PRODUCER_REGS>();
    const int warp = (int(threadIdx.x) - KT::CONSUMERS) / 32;
    constexpr u32 Q_BYTES = KT::QTile::BYTES, KV_BYTES = KT::KVTile::BYTES;
    constexpr u32 Q_BLOCK = KT::QTile::BLOCK_BYTES, KV_BLOCK = KT::KVTile::BLOCK_BYTES;
    if (warp == 0) {  // its first thread: Q into two stages (K and V with the first), dout
      if (lane == 0) {
        PipelineState<2> next;
#pragma unroll 1
        for (int it = sched.begin; it < sched.end; ++it, next.advance()) {
          const int s = next.index(), h = sched.head(it), m0 = sched.m0(it);
          const bool first = it == sched.begin;
          if (it - sched.begin >= 2) mbarrier_wait(st.q_empty(s), next.phase() ^ 1);
          mbarrier_arrive_expect_tx(st.q_full(s), first ? Q_BYTES + 2 * KV_BYTES : Q_BYTES);
          if (first) {
            tma_load_blocks<KT::D_BLOCKS>(st.k(), KV_BLOCK, k_map, sched.n0,
                                          f.k_head_stride ? h_kv : 0, f.k_batch_stride ? b : 0,
                                          st.q_full(s));
            tma_load_blocks<KT::D_BLOCKS>(st.v(), KV_BLOCK, v_map, sched.n0,
                                          f.v_head_stride ? h_kv : 0, f.v_batch_stride ? b : 0,
                                          st.q_full(s));
          }
          tma_load_blocks<KT::D_BLOCKS>(st.q(s), Q_BLOCK, q_map, m0, f.q_head_stride ? h : 0,
                                        f.q_batch_stride ? b : 0, st.q_full(s));
          if (!first) mbarrier_wait(st.do_empty(), (it - sched.begin - 1) & 1);
          mbarrier_arrive_expect_tx(st.do_full(), Q_BYTES);
          tma_load_blocks<KT::D_BLOCKS>(st.dout(), Q_BLOCK, dout_map, m0,
                                        p.dout_head_stride ? h : 0, p.dout_batch_stride ? b : 0,
                                        st.do_full());
        }
      }
      return;
    }
    if (warp == 1) {  // lse2 of each tile's rows, with its Q stage
      PipelineState<2> next;
#pragma unroll 1
      for (int it = sched.begin; it < sched.end; ++it, next.advance()) {
        const int s = next.index(), h = sched.head(it), m0 = sched.m0(it);
        if (it - sched.begin >= 2) mbarrier_wait(st.q_empty(s), next.phase() ^ 1);
        const float* lse = f.lse + b * f.lse_batch_stride + h * f.lse_head_stride + m0;
        const int rows = Walk::row_hi(f, m0);
#pragma unroll
        for (int r = lane; r < KT::BLOCK_M; r += 32)
          st_shared_u32(st.lse(s) + 4 * r,
                        __float_as_uint(lse2_of(r < rows, r < rows ? lse[r] : 0.f)));
        mbarrier_arrive(st.q_full(s));
      }
      return;
    }
    if (warp == 2) {  // delta of each tile's rows, with dout
#pragma unroll 1
      for (int it = sched.begin; it < sched.end; ++it) {
        const int h = sched.head(it), m0 = sched.m0(it);
        if (it > sched.begin) mbarrier_wait(st.do_empty(), (it - sched.begin - 1) & 1);
        const float* delta = p.delta + delta_row(p, b, h) + m0;
        const int rows = Walk::row_hi(f, m0);
#pragma unroll
        for (int r = lane; r < KT::BLOCK_M; r += 32)
          st_shared_u32(st.delta() + 4 * r, __float_as_uint(r < rows ? delta[r] : 0.f));
        mbarrier_arrive(st.do_full());
      }
      return;
    }
    if (warp == 3 && lane == 0) {  // each whole tile's staged dQ into dq_accum
      int staged = 0;
#pragma unroll 1
      for (int it = sched.begin; it < sched.end; ++it) {
        const int m0 = sched.m0(it), h = sched.head(it);
        if (m0 + KT::BLOCK_M > f.seqlen_q) continue;   // (whole tiles only)
        mbarrier_wait(st.dq_full(), staged++ & 1);
        // (the tile's first row of dq_accum in 32 bits, as Epilogue::reduce_dq)
        const u32 first = u32(b) * u32(p.delta_batch_stride) + u32(h) * u32(p.delta_head_stride) +
                          u32(m0);
        float* dst = p.dq_accum + u64(first) * KT::D;
        constexpr u32 BYTES = KT::BLOCK_M * KT::D * 4;
        if constexpr (ORDERED) {
          // the tile's turn (DqTurn); the first stores where the host says every tile
          // has one (p.dq_store_first)
          int* counter = DqTurn<KT::BLOCK_M>::counter(p, sched, it);
          const int turn = sched.turn(it);
          DqTurn<KT::BLOCK_M>::wait_for(counter, turn);
          if (p.dq_store_first && turn == 0) bulk_store(dst, st.dq(), BYTES);
          else bulk_reduce_add(dst, st.dq(), BYTES);
          bulk_commit();
          bulk_wait_read<0>();
          mbarrier_arrive(st.dq_empty());   // sdQ free once read; the turn once added
          DqTurn<KT::BLOCK_M>::pass<0>(counter);
        } else {
          bulk_reduce_add(dst, st.dq(), BYTES);
          bulk_commit();
          bulk_wait_read<0>();
          mbarrier_arrive(st.dq_empty());
        }
      }
      bulk_wait<0>();
    }
    return;
  }
  setmaxnreg_inc<KT::CONSUMER_REGS>();

  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  const int wq = threadIdx.x / 32 % 4;   // the warp's rows 16 wq.. of an m64 tile
  const int g = lane / 4, t = lane % 4;
  const int row = 16 * wq + g;           // this thread's rows row, row + 8 of a tile
  // Roles (each warpgroup over all 96 keys): warpgroup 0 S, P and dV^T, warpgroup 1 dP,
  // dS and dK^T; dQ by both, warpgroup 0 the first DQ_BLOCKS0 64-column blocks.
  const auto consume = [&](auto w_) {
    constexpr int W = decltype(w_)::value;
    constexpr int N = KT::BLOCK_N;
    constexpr int DQ_B0 = W ? KT::DQ_BLOCKS0 : 0;                       // first column block
    constexpr int DQ_NB = W ? KT::D_BLOCKS - KT::DQ_BLOCKS0 : KT::DQ_BLOCKS0;
    float acc[KT::D_BLOCKS][N / 2];   // warpgroup 0: dV^T, 1: dK^T / scale (head dim x keys)
#pragma unroll
    for (int mt = 0; mt < KT::D_BLOCKS; ++mt)
#pragma unroll
      for (int e = 0; e < N / 2; ++e) acc[mt][e] = 0.f;
    // acc += X^T Y over a tile's queries: X (dout or Q) MN-major, its 64-column blocks
    // on M; Y (sPt or sdSt) K-major, the block's keys on N
    const auto accumulate_transposed = [&](u32 x, u32 y) {
      wgmma_fence();
#pragma unroll
      for (int mt = 0; mt < KT::D_BLOCKS; ++mt) {
        const u64 a = KT::QTile::mnmajor(x + mt * KT::QTile::BLOCK_BYTES, 0);
        const u64 b = KT::PdsTile::kmajor(y, 0, 0);
#pragma unroll
        for (int ks = 0; ks < KT::KV_STEPS; ++ks)
          Wgmma<N>::template ss<1, 0>(acc[mt], desc_advance(a, KT::QTile::mnmajor_offset(ks)),
                                      desc_advance(b, KT::PdsTile::kmajor_offset(ks)), 1, T{});
      }
      wgmma_commit();
    };
    PipelineState<2> read;
    int staged = 0;   // whole tiles' dQ staged so far (the reducer's count)
    for (int it = sched.begin; it < sched.end; ++it, read.advance()) {
      const int s_idx = read.index(), m0 = sched.m0(it), h = sched.head(it);
      const int do_parity = (it - sched.begin) & 1;
      const u32 q_tile = st.q(s_idx);
      // (both warpgroups: K and V land with the first tile's Q, and warpgroup 1's dP
      // reads V before anything else of the stage)
      mbarrier_wait(st.q_full(s_idx), read.phase());
      if (Walk::row_lo(f, m0) > 0) {   // block-uniform: rows that attend nothing zeroed
        mbarrier_wait(st.do_full(), do_parity);
        const int lo = Walk::row_lo(f, m0);
        zero_rows<KT, typename KT::QTile, KT::BLOCK_M>(st.bytes(q_tile), lo, KT::BLOCK_M);
        zero_rows<KT, typename KT::QTile, KT::BLOCK_M>(st.bytes(st.dout()), lo, KT::BLOCK_M);
        fence_proxy_async();
        role_barrier_sync(kBarFix, KT::CONSUMERS);
      }
      const int i0 = m0 + 16 * wq, j0 = sched.n0;
      const bool partial = VT::partial(f, i0, i0 + 15, j0, j0 + N - 1);
      float x[N / 2];   // warpgroup 0: S, then P; 1: dP, then dS
      float dq[32 * DQ_NB];
      if constexpr (W == 0) {
        // S = Q K^T over the block's keys; P (Scores::map: the variant's score, masked
        // elements selected to 0 where the warp's rows x keys are partial); P^T to sPt
        // once warpgroup 1 has read the last tile's (kBarMidPFree), handed over
        // (kBarMidP); dV^T += dout^T P
        wgmma_fence();
        {
          const u64 a = KT::QTile::kmajor(q_tile, 0, 0), bk = KT::KVTile::kmajor(st.k(), 0, 0);
#pragma unroll
          for (int ks = 0; ks < KT::QK_STEPS; ++ks)
            Wgmma<N>::ss(x, desc_advance(a, KT::QTile::kmajor_offset(ks)),
                         desc_advance(bk, KT::KVTile::kmajor_offset(ks)), ks > 0, T{});
          wgmma_commit();
        }
        const float lse2[2] = {st.stat(st.lse(s_idx) + 4 * row),
                               st.stat(st.lse(s_idx) + 4 * (row + 8))};
        wgmma_wait<0>();
        fence_regs(x);
        mbarrier_arrive(st.q_empty(s_idx));   // (this thread's reads of Q and lse done)
        const typename VT::Head hd = VT::Dense::head(f, b, h);
        Scores<VT>::map(MmaFrag<N / 8>(lane), [&](int e) -> float& { return x[e]; }, f, i0, j0,
                        partial, 0.f, [&](float dot, int r, int, int i, int j) {
                          return fast_exp2(VT::shifted(f, hd, i, j, dot, -lse2[r]));
                        });
        if (it > sched.begin) role_barrier_sync(kBarMidPFree, KT::CONSUMERS);
        store_transposed<typename KT::PdsTile, T, N>(st.pt(), x, 1.f, 2 * wq, lane);
        fence_proxy_async();
        role_barrier_arrive(kBarMidP, KT::CONSUMERS);
        warpgroup_barrier(0);
        mbarrier_wait(st.do_full(), do_parity);
        accumulate_transposed(st.dout(), st.pt());
        role_barrier_sync(kBarDs, KT::CONSUMERS);   // this tile's dS^T in sdSt
      } else {
        // dP = dout V^T over the block's keys; dS = P (dP - delta), P read back from sPt;
        // dS^T to sdSt once warpgroup 0's dQ of the last tile is done with it
        // (kBarMidDsFree), handed over (kBarDs); dK^T += Q^T dS
        mbarrier_wait(st.do_full(), do_parity);
        wgmma_fence();
        {
          const u64 a = KT::QTile::kmajor(st.dout(), 0, 0), bv = KT::KVTile::kmajor(st.v(), 0, 0);
#pragma unroll
          for (int ks = 0; ks < KT::QK_STEPS; ++ks)
            Wgmma<N>::ss(x, desc_advance(a, KT::QTile::kmajor_offset(ks)),
                         desc_advance(bv, KT::KVTile::kmajor_offset(ks)), ks > 0, T{});
          wgmma_commit();
        }
        const float delta[2] = {st.stat(st.delta() + 4 * row), st.stat(st.delta() + 4 * (row + 8))};
        wgmma_wait<0>();
        fence_regs(x);
        mbarrier_arrive(st.do_empty());   // (this thread's reads of dout and delta done)
        role_barrier_sync(kBarMidP, KT::CONSUMERS);
        u32 pp[N / 4];   // P in 16 bits, the C fragments' pairs
        load_transposed<typename KT::PdsTile, N>(st.pt(), pp, 2 * wq, lane);
        if (it + 1 < sched.end) role_barrier_arrive(kBarMidPFree, KT::CONSUMERS);
#pragma unroll
        for (int e = 0; e < N / 4; ++e) {   // (selected where P = 0 on partial warps: NaN
                                            // past Sk or under the mask)
          const float p0 = to_float(T{u16(pp[e] & 0xFFFFu)}), p1 = to_float(T{u16(pp[e] >> 16)});
          const float dl = delta[e % 2];
          x[2 * e] = partial && p0 == 0.f ? 0.f : p0 * (x[2 * e] - dl);
          x[2 * e + 1] = partial && p1 == 0.f ? 0.f : p1 * (x[2 * e + 1] - dl);
        }
        if (it > sched.begin) role_barrier_sync(kBarMidDsFree, KT::CONSUMERS);
        store_transposed<typename KT::PdsTile, T, N>(st.ds(), x, 1.f, 2 * wq, lane);
        fence_proxy_async();
        role_barrier_arrive(kBarDs, KT::CONSUMERS);
        warpgroup_barrier(1);
        accumulate_transposed(q_tile, st.ds());
      }
      {   // dQ = dS K: this warpgroup's column blocks
        const u64 a = KT::PdsTile::mnmajor(st.ds(), 0);
        const u64 bk = KT::KVTile::mnmajor(st.k() + DQ_B0 * KT::KVTile::BLOCK_BYTES, 0);
#pragma unroll
        for (int ks = 0; ks < KT::DQ_STEPS; ++ks)
          Wgmma<64 * DQ_NB>::template ss<1, 1>(dq, desc_advance(a, KT::PdsTile::mnmajor_offset(ks)),
                                               desc_advance(bk, KT::KVTile::mnmajor_offset(ks)),
                                               ks > 0, T{});
        wgmma_commit();
      }
      wgmma_wait<1>();   // dV^T (dK^T) done: dout (the Q stage) free
      if constexpr (W == 0) mbarrier_arrive(st.do_empty());
      else mbarrier_arrive(st.q_empty(s_idx));
      wgmma_wait<0>();   // dQ done
      fence_regs(dq);
#pragma unroll
      for (int mt = 0; mt < KT::D_BLOCKS; ++mt) fence_regs(acc[mt]);
      if (W == 0 && it + 1 < sched.end) role_barrier_arrive(kBarMidDsFree, KT::CONSUMERS);
      // dQ: the fragment of column block DQ_B0 + c, float4 j of thread x at float4
      // 1024 (DQ_B0 + c) + 128 j + x of the tile (convert_flat_tile's layout)
      if (whole(it)) {
        if (staged > 0) mbarrier_wait(st.dq_empty(), (staged - 1) & 1);
        const u32 at = st.dq() + DQ_B0 * 16384 + (threadIdx.x % 128) * 16;
#pragma unroll
        for (int j = 0; j < 8 * DQ_NB; ++j)
          if (64 * DQ_B0 + 8 * j < KT::D)
            st_shared_f32x4(at + 2048 * j, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
        fence_proxy_async();
        mbarrier_arrive(st.dq_full());
        ++staged;
      } else if constexpr (!ORDERED) {   // rows below Sq, in row order (the ordered modes:
                                         // whole tiles only, the host's flat_dq)
        float* rows = p.dq_accum + (delta_row(p, b, h) + m0) * KT::D;
#pragma unroll
        for (int r = 0; r < 2; ++r)
          if (row + 8 * r < f.seqlen_q - m0) {
#pragma unroll
            for (int j = 0; j < 8 * DQ_NB; ++j) {
              const int col = 64 * DQ_B0 + 8 * j + 2 * t;
              if (64 * DQ_B0 + 8 * j < KT::D)
                red_add_f32x2(rows + (row + 8 * r) * KT::D + col, dq[4 * j + 2 * r],
                              dq[4 * j + 2 * r + 1]);
            }
          }
      }
    }
    // every warpgroup's MMAs on sK and sV done: dK^T * scale and dV^T staged there
    // transposed, then written out in rows of 16 bytes
    role_barrier_sync(kBarMmaDone, KT::CONSUMERS);
#pragma unroll
    for (int mt = 0; mt < KT::D_BLOCKS; ++mt)
      store_transposed<typename KT::KVTile, T, N>(W ? st.k() : st.v(), acc[mt], W ? f.scale : 1.f,
                                                 8 * mt + 2 * wq, lane);
  };
  if (wg == 0) consume(Int<0>{});
  else consume(Int<1>{});
  role_barrier_sync(kBarMmaDone, KT::CONSUMERS);   // sK, sV staged
  constexpr int CHUNKS = KT::D / 8;
  T* dk = static_cast<T*>(p.dk) + b * p.dk_batch_stride + h_kv * p.dk_head_stride;
  T* dv = static_cast<T*>(p.dv) + b * p.dv_batch_stride + h_kv * p.dv_head_stride;
  const unsigned char* sk = st.bytes(st.k());
  const unsigned char* sv = st.bytes(st.v());
  for (int c = threadIdx.x; c < KT::BLOCK_N * CHUNKS; c += KT::CONSUMERS) {
    const int r = c / CHUNKS, chunk = c % CHUNKS, j = sched.n0 + r;
    if (j < f.seqlen_k) {
      const u32 off = KT::KVTile::offset(r, chunk);
      *reinterpret_cast<uint4*>(dk + j * p.dk_row_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(sk + off);
      *reinterpret_cast<uint4*>(dv + j * p.dv_row_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(sv + off);
    }
  }
}

// ---------------------------------------------------------------------------
// flash_wgmma_bwd_dq: dQ in a pass of its own, query-parallel (the forward's loop
// shape), for the wide dK/dV kernel (D = 136..256), which then runs without dQ
// (kDqSeparate) in both modes. There the dK/dV kernel's own dQ (64 keys a reduction
// from registers) cost more than this pass: on an H200 it ran 2.2x as long with it as
// without (benchmarks/results/notes-bwd-dq-pass.md). One block per (BLOCK_M = 128
// query rows, query head, batch), the heaviest first under a causal band: warpgroup 0
// is the producer (its first thread issues every tensor copy), warpgroups 1 and 2
// consume 64 rows each. Q and dout of the block's rows land once (q_full); K_j and V_j
// of each key tile of the variant's band go into K_STAGES and V_STAGES buffers
// (full_k, empty_k, full_v, empty_v: lane 0 of each consumer warp releases). Per key
// tile a consumer warpgroup:
//   issue S  = Q K_j^T        wgmma ss, both K-major, N = BLOCK_N, over D_K
//   (V_j landed) issue dP = dout V_j^T
//   wait (for tile j - 1's dQ too); release V_j and K_{j-1}
//   P = exp2(score - lse2), dS = P (dP - delta) d s / d dot: Scores::p_ds, the
//   variant's masks, logits, bias and dropout, as flash_mma_bwd_dq
//   issue dQ += dS K_j        wgmma rs: dS in 16 bits is the A fragment, K MN-major,
//                             N = D; in flight while the next tile's S and dP issue
// then dQ * scale is stored in the input dtype: no dq_accum, no atomics, no convert,
// bitwise reproducible. Rows past Sq arrive as zeros with lse2 = +inf (P = 0) and are
// not stored; rows that attend nothing see no key tile (dQ = 0) or only masked ones.
// Packed sequences: the grid covers every sequence's virtual query blocks
// (common/seqs.cuh), the block's sequence params live behind the Storage
// (bind_block), and the tensor maps address the packed rows from the sequence's
// first; rows of the next sequence that a box brings in are past this one's Sq
// (not stored) or Sk (masked: P and dS selected to 0).
template <int D_, int BLOCK_N_, class T_>
struct WgmmaBwdDqTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_K = (D + 15) / 16 * 16;  // K of Q K^T and dout V^T
  static constexpr int D_BLOCKS = (D_K + 63) / 64;
  static constexpr int CONSUMERS = 2;
  static constexpr int BLOCK_M = 64 * CONSUMERS;  // query rows a block
  static constexpr int BLOCK_N = BLOCK_N_;        // keys a tile
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  // 168 registers a thread at launch; the producer keeps 24, the consumers take the
  // rest: dQ D/2, S and dP BLOCK_N/2 each, dS's A fragments BLOCK_N/4.
  static constexpr int PRODUCER_REGS = 24;
  static constexpr int CONSUMER_REGS = 240;
  static constexpr int N_TILES = BLOCK_N / 8;   // n8 column groups of S, dP per thread
  static constexpr int D_TILES = D / 8;         // n8 column groups of dQ per thread
  static constexpr int QK_STEPS = D_K / 16;     // k16 steps of Q K^T and dout V^T
  static constexpr int DQ_STEPS = BLOCK_N / 16; // k16 steps of dS K
  using QTile = SwizzledTile<BLOCK_M, D_K>;
  using KVTile = SwizzledTile<BLOCK_N, D_K>;
  static constexpr int Q_SLICE = 64 * 128;      // bytes to a consumer's rows in a 64-column block
  // K is read at a tile's start (S) and end (dQ), V in between (dP): two K buffers,
  // and two V buffers where they fit beside Q and dout (not past D = 192: 225 KB
  // with one at D = 256).
  static constexpr int K_STAGES = 2;
  static constexpr int V_STAGES =
      2 * QTile::BYTES + 4 * KVTile::BYTES + SMEM_SLACK <= 227 * 1024 ? 2 : 1;
  struct Storage {
    unsigned char q[QTile::BYTES];
    unsigned char dout[QTile::BYTES];
    unsigned char k[K_STAGES][KVTile::BYTES];
    unsigned char v[V_STAGES][KVTile::BYTES];
  };
  // In the alignment slack (slack_addr).
  struct Barriers {
    u64 q_full;
    u64 full_k[K_STAGES], empty_k[K_STAGES], full_v[V_STAGES], empty_v[V_STAGES];
  };
  static constexpr int SMEM_BYTES = sizeof(Storage) + SMEM_SLACK;

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D % 8 == 0 && D >= 64 && D <= 256, "D a multiple of 8 from 64 to 256");
  static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256, "S = Q K^T is one wgmma m64n{BLOCK_N}");
  static_assert(SMEM_BYTES <= 227 * 1024, "Q, dout and the K and V buffers fit");
  static_assert(168 * THREADS >= PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * CONSUMERS,
                "the consumers take no more registers than the producer gave up");
  static_assert(QTile::BYTES % 1024 == 0 && KVTile::BYTES % 1024 == 0,
                "tiles stay on the 1024-byte boundaries of the swizzle");
};

template <class KT>
struct DqSmem : SmemView<KT> {
  using V = SmemView<KT>;
  using typename V::S, typename V::B, V::base, V::bars, V::bytes;
  using V::V;
  __device__ __forceinline__ u32 q() const { return CA_FIELD(base, S, q); }
  __device__ __forceinline__ u32 dout() const { return CA_FIELD(base, S, dout); }
  __device__ __forceinline__ u32 k(int i) const {
    return CA_FIELD(base, S, k) + i * KT::KVTile::BYTES;
  }
  __device__ __forceinline__ u32 v(int i) const {
    return CA_FIELD(base, S, v) + i * KT::KVTile::BYTES;
  }
  __device__ __forceinline__ u32 q_full() const { return CA_FIELD(bars, B, q_full); }
  __device__ __forceinline__ u32 full_k(int i) const { return CA_FIELD(bars, B, full_k) + 8 * i; }
  __device__ __forceinline__ u32 empty_k(int i) const { return CA_FIELD(bars, B, empty_k) + 8 * i; }
  __device__ __forceinline__ u32 full_v(int i) const { return CA_FIELD(bars, B, full_v) + 8 * i; }
  __device__ __forceinline__ u32 empty_v(int i) const { return CA_FIELD(bars, B, empty_v) + 8 * i; }
};

// The producer's first thread: Q and dout of the block's rows (two boxes of 64 rows
// each, a consumer's), then K_j and V_j of key tiles n_begin.. into their buffers once
// released; nothing where the rows see no key (the consumers wait for no copy then,
// and none may still be landing when the block exits). Map coordinates as TiledKV's:
// a broadcast (stride 0) head or batch axis is a map of size 1; q_row0, k_row0 are the
// sequence's first query and key row in the maps (packed sequences; 0 otherwise).
template <class KT>
__device__ __forceinline__ void produce_dq(const DqSmem<KT>& st, const BwdParams& p,
                                           const TmaMap& q_map, const TmaMap& k_map,
                                           const TmaMap& v_map, const TmaMap& dout_map, int q0,
                                           int h, int b, int n_begin, int n_blocks, int q_row0,
                                           int k_row0) {
  if (n_blocks == 0) return;  // no copy left in flight: the consumers wait for none
  const FwdParams& f = p.fwd;
  const int h_kv = h / f.group;
  q0 += q_row0;
  mbarrier_arrive_expect_tx(st.q_full(), 2 * KT::QTile::BYTES);
#pragma unroll
  for (int c = 0; c < KT::CONSUMERS; ++c) {
    tma_load_blocks<KT::D_BLOCKS>(st.q() + c * KT::Q_SLICE, KT::QTile::BLOCK_BYTES, q_map,
                                  q0 + 64 * c, f.q_head_stride ? h : 0,
                                  f.q_batch_stride ? b : 0, st.q_full());
    tma_load_blocks<KT::D_BLOCKS>(st.dout() + c * KT::Q_SLICE, KT::QTile::BLOCK_BYTES, dout_map,
                                  q0 + 64 * c, p.dout_head_stride ? h : 0,
                                  p.dout_batch_stride ? b : 0, st.q_full());
  }
  const int k_h = f.k_head_stride ? h_kv : 0, k_b = f.k_batch_stride ? b : 0;
  const int v_h = f.v_head_stride ? h_kv : 0, v_b = f.v_batch_stride ? b : 0;
  PipelineState<KT::K_STAGES> kp;
  PipelineState<KT::V_STAGES> vp;
  for (int j = 0; j < n_blocks; ++j) {
    const int k0 = (n_begin + j) * KT::BLOCK_N + k_row0;
    if (j >= KT::K_STAGES) mbarrier_wait(st.empty_k(kp.index()), kp.phase() ^ 1);
    mbarrier_arrive_expect_tx(st.full_k(kp.index()), KT::KVTile::BYTES);
    tma_load_blocks<KT::D_BLOCKS>(st.k(kp.index()), KT::KVTile::BLOCK_BYTES, k_map, k0, k_h, k_b,
                                  st.full_k(kp.index()));
    kp.advance();
    if (j >= KT::V_STAGES) mbarrier_wait(st.empty_v(vp.index()), vp.phase() ^ 1);
    mbarrier_arrive_expect_tx(st.full_v(vp.index()), KT::KVTile::BYTES);
    tma_load_blocks<KT::D_BLOCKS>(st.v(vp.index()), KT::KVTile::BLOCK_BYTES, v_map, k0, v_h, v_b,
                                  st.full_v(vp.index()));
    vp.advance();
  }
}

// Grid: bind_grid's over query blocks (the last first under a causal band) and
// (query head, batch) pairs, in sections (section_block) but under dropout: there
// the computed head and entry, live through the loop, spilled 12 bytes under ptxas
// 12.9 at D = 256 with softcap and ALiBi (the host's dq_section). Packed sequences:
// x = the virtual blocks of every sequence, y = query head, z = 1 (the sequence's
// params behind the Storage).
template <class KT, class VT>
__global__ void __launch_bounds__(KT::THREADS, 1)
    flash_wgmma_bwd_dq(const BwdParams args, const __grid_constant__ TmaMap q_map,
                       const __grid_constant__ TmaMap k_map, const __grid_constant__ TmaMap v_map,
                       const __grid_constant__ TmaMap dout_map) {
  using T = typename KT::T;
  int m_block, h, b;
  const BwdParams& p =
      VT::Seqs::template bind_grid<T, KT::BLOCK_M, false, VT::kCausal, !VT::Drop::enabled>(
          args, args.fwd.heads_q, m_block, h, b, wgmma_bwd_smem + KT::SMEM_BYTES);
  const FwdParams& f = p.fwd;
  const int q0 = m_block * KT::BLOCK_M;
  if (VT::Seqs::kRagged && q0 >= f.seqlen_q) return;  // a sequence's spare block: block-uniform
  const DqSmem<KT> st(storage_base(wgmma_bwd_smem));
  // Key tiles [n_begin, n_begin + n_blocks): the variant's band of the block's rows.
  const int n_begin = VT::kv_begin(f, q0) / KT::BLOCK_N;
  const int n_blocks = cmax(
      0, ceil_div(VT::kv_end(f, cmin(q0 + KT::BLOCK_M, f.seqlen_q) - 1), KT::BLOCK_N) - n_begin);
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  if (threadIdx.x == 0) {
    mbarrier_init(st.q_full(), 1);
    for (int i = 0; i < KT::K_STAGES; ++i) {
      mbarrier_init(st.full_k(i), 1);
      mbarrier_init(st.empty_k(i), 4 * KT::CONSUMERS);  // lane 0 of each consumer warp
    }
    for (int i = 0; i < KT::V_STAGES; ++i) {
      mbarrier_init(st.full_v(i), 1);
      mbarrier_init(st.empty_v(i), 4 * KT::CONSUMERS);
    }
  }
  __syncthreads();
  if (wg == 0) {
    setmaxnreg_dec<KT::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      int q_row0 = 0, k_row0 = 0;
      if constexpr (VT::Seqs::kRagged) {
        const RaggedSeqs::Extent e = RaggedSeqs::extent(args.fwd, b);
        q_row0 = e.q_start, k_row0 = e.k_start;
      }
      produce_dq<KT>(st, p, q_map, k_map, v_map, dout_map, q0, h, b, n_begin, n_blocks, q_row0,
                     k_row0);
    }
    return;
  }
  setmaxnreg_inc<KT::CONSUMER_REGS>();

  const int c = wg - 1, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = 64 * c + 16 * (threadIdx.x / 32 % 4);  // this warp's first row in the block
  // Rows g and g + 8 of the warp: lse in the exp2 domain (+inf where the row attends
  // nothing or lies past Sq) and delta. (flash_mma_bwd_dq's loop too; one helper for
  // both spilled this kernel at D = 192 with softcap, ALiBi and dropout:
  // benchmarks/results/notes-bwd-dq-pass.md.)
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
  float acc[KT::D_TILES * 4];
#pragma unroll
  for (int i = 0; i < KT::D_TILES * 4; ++i) acc[i] = 0.f;
  float s[KT::N_TILES * 4], dp[KT::N_TILES * 4];
  u32 da[KT::DQ_STEPS][4];  // dS in 16 bits: the A operand of dS K

  const u64 q_desc = KT::QTile::kmajor(st.q(), 64 * c, 0);
  const u64 o_desc = KT::QTile::kmajor(st.dout(), 64 * c, 0);
  PipelineState<KT::K_STAGES> kp;
  PipelineState<KT::V_STAGES> vp;
  if (n_blocks > 0) mbarrier_wait(st.q_full(), 0);
  for (int j = 0; j < n_blocks; ++j) {
    const int k0 = (n_begin + j) * KT::BLOCK_N;
    mbarrier_wait(st.full_k(kp.index()), kp.phase());
    wgmma_fence();  // s, dp were written by ordinary code
    const u64 k_desc = KT::KVTile::kmajor(st.k(kp.index()), 0, 0);
#pragma unroll
    for (int ks = 0; ks < KT::QK_STEPS; ++ks)
      Wgmma<KT::BLOCK_N>::ss(s, desc_advance(q_desc, KT::QTile::kmajor_offset(ks)),
                             desc_advance(k_desc, KT::KVTile::kmajor_offset(ks)), ks > 0, T{});
    mbarrier_wait(st.full_v(vp.index()), vp.phase());
    const u64 v_desc = KT::KVTile::kmajor(st.v(vp.index()), 0, 0);
#pragma unroll
    for (int ks = 0; ks < KT::QK_STEPS; ++ks)
      Wgmma<KT::BLOCK_N>::ss(dp, desc_advance(o_desc, KT::QTile::kmajor_offset(ks)),
                             desc_advance(v_desc, KT::KVTile::kmajor_offset(ks)), ks > 0, T{});
    wgmma_commit();
    wgmma_wait<0>();  // S, dP, and the last tile's dQ
    fence_regs(s);
    fence_regs(dp);
    fence_regs(acc);
    fence_regs(da);
    if (lane == 0) {
      mbarrier_arrive(st.empty_v(vp.index()));
      if (j > 0) mbarrier_arrive(st.empty_k(kp.prev().index()));
    }
    vp.advance();

    Scores<VT>::p_ds(MmaFrag<KT::N_TILES>(lane), [&](int x) -> float& { return s[x]; },
                     [&](int x) -> float& { return dp[x]; }, f, b, h, q0 + row0, k0,
                     VT::partial(f, q0 + row0, q0 + row0 + 15, k0, k0 + KT::BLOCK_N - 1),
                     [&](int r, int) { return lse2[r]; }, [&](int r, int) { return delta[r]; });
    pack_a<T>(da, dp);
    wgmma_fence();  // da was written by ordinary code
    const u64 kt_desc = KT::KVTile::mnmajor(st.k(kp.index()), 0);
#pragma unroll
    for (int ks = 0; ks < KT::DQ_STEPS; ++ks)
      Wgmma<KT::D>::rs(acc, da[ks], desc_advance(kt_desc, KT::KVTile::mnmajor_offset(ks)), T{});
    wgmma_commit();
    kp.advance();
  }
  wgmma_wait<0>();
  fence_regs(acc);

  T* dq_head = static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = q0 + row0 + g + 8 * r;
    if (i >= f.seqlen_q) continue;
#pragma unroll
    for (int dt = 0; dt < KT::D_TILES; ++dt)
      *reinterpret_cast<u32*>(dq_head + i * p.dq_row_stride + dt * 8 + 2 * t) =
          MmaType<T>::pack(acc[dt * 4 + 2 * r] * f.scale, acc[dt * 4 + 2 * r + 1] * f.scale);
  }
}
