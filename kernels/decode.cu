// decode: attention of a few query rows per sequence against a (paged) KV cache on
// tensor cores (mma.sync m16n8k16, fp16/bf16 in, fp32 accumulation), split over the
// keys (flash-decoding), sm_80+.
//
// Layouts: q, o, lse as in common/params.cuh; the cache as in common/paged.cuh.
// Query rows are packed per KV group: a block owns ROWS = 16 * ROW_WARPS packed rows
// r of one (batch b, KV head hk), r = i * group + g for query i in [0, Sq) and query
// head h = hk * group + g, so every query head of a group reads each K/V byte from
// the same shared-memory tile (GQA / MQA packing; Sq > 1 is speculative decoding).
// The packed rows are the M of the mma: group x Sq rows cost the arithmetic of 16.
// Causal and windows are aligned bottom-right against each sequence's own length:
// the host passes the band for Sk = 0 and the block adds its sequence's length.
//
// Work split: grid (row blocks * splits, Hkv, B). Split s of a sequence covers keys
// [s * split_keys, (s + 1) * split_keys), the last one to the sequence's end (the
// host plans for a length that may be short of it); with one split the block writes
// o and lse, otherwise fp32 o and lse partials that merge.cu combines.
//
// Warps: ROW_WARPS x KEY_WARPS. Warp (rw, kw) owns packed rows [16 rw, 16 rw + 16)
// and keys [kw * WARP_KEYS, (kw + 1) * WARP_KEYS) of every tile of BLOCK_N keys, with
// its own online softmax; the KEY_WARPS states of a row merge once, at the end.
//
// Steps (per block):
//   1. the block's key range from the variant (kv_begin / kv_end over its rows),
//      clipped to its split; Q's packed rows into shared memory (zero columns past D).
//   2. producer (every thread): cp.async tile t (K and V, 16-byte chunks) into ring
//      buffer t % STAGES, STAGES - 1 tiles ahead. Paged caches: the tile's page ids
//      were copied into shared memory (one 4-byte cp.async per key) in the commit
//      group STAGES - 1 tiles earlier, so no copy waits on a block-table load. On
//      sm_90, with TMA traits (the host's use_tma: contiguous caches, and paged ones
//      whose pages hold a multiple of 16 rows), tensor-map copies (thread 0's, or under
//      the paged warpgroup tiles past D = 64 every warp's lane 0's: ISSUERS), boxes
//      of 64 columns (paged mma.sync tiles at D = 128, 192, 256: one box of all of them
//      per 16 keys, FUSED_BOXES), into the swizzled layout of wgmma.cuh's SwizzledTile
//      (ldmatrix reads it through kv_at); GATHER traits fill the same layout by
//      cp.async (caches without tensor maps under the warpgroup tile); otherwise paged
//      rows of 256 bytes or more by one bulk copy each. Maps and bulk copies complete
//      on a stage's mbarrier. PRODUCER traits (the one-block warpgroup tile, paged at
//      64 < D <= 128, contiguous at D = 128) leave the copies and page lookups to a
//      producer warpgroup of their own (produce_paged, produce_contiguous), the
//      consumers releasing buffers on mbarriers.
//   3. consumer (per warp and tile): S = Q K^T (ldmatrix + mma), the variant's scores
//      (masks and logit transforms through VT::keep / VT::score on partial tiles or
//      transforming variants only), the online softmax (FragSoftmax), P rounded to 16
//      bits as A fragments, acc += P V (ldmatrix.trans + mma). WGMMA traits (sm_90a,
//      64 packed rows, the swizzled ring, Q in registers): a warpgroup per key warp, whose
//      S = Q K^T and acc += P V are wgmma m64 over its keys; the softmax is the warps'
//      own.
//   4. the key warps' (m_i, l_i, acc) meet in shared memory (the ring's space) and
//      merge; o = acc / l_i and lse, or the split's partials.
//   Launches (sm_90+, common/pdl.cuh): the decode is the programmatic dependent of
//   the kernel before it on the stream (it waits for that kernel before its first
//   memory access, so only its launch overlaps), and with splits merge.cu's launch is
//   the decode's dependent: every block lets it be scheduled from its start, so its
//   launch and block start overlap the last splits' work; it waits for this grid's
//   end before reading the partials.
//
// Constraints: D <= 256 (padded to a multiple of 16 in shared memory and registers
// only; pad columns are zero-filled, so they add exact zeros). VEC (16-byte aligned
// base pointers and strides, D % 8 == 0) copies with cp.async; otherwise tiles are
// staged with element loads. Keys past a block's range are zero-filled and masked;
// rows past a sequence's length are never read. Masked scores are selected to -inf;
// as in flash_mma, a NaN in a V row that some packed row masks (Sq > 1, causal) still
// reaches that row's product (0 * NaN), so caches must hold finite values in the
// rows they hold.
#include "common/copy.cuh"
#include "common/mma.cuh"
#include "common/paged.cuh"
#include "common/pdl.cuh"
#include "common/softmax.cuh"
#include "common/storage.cuh"
#include "common/tma.cuh"
#include "common/variant.cuh"
#include "common/wgmma.cuh"

template <int D_, int ROW_WARPS_, int KEY_WARPS_, int WARP_KEYS_, int STAGES_, class T_,
          bool VEC_, bool PAGED_, bool TMA_ = false, bool WGMMA_ = false, bool GATHER_ = false,
          int PAGE_BOX_ = 16, bool HALVES_ = false, bool ROW_COPIES_ = true>
struct DecodeTraits {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int D_PAD = RoundUp<D_, 16>::value;
  static constexpr int SROW = D_PAD + 8;                // shared row stride (ldmatrix banks)
  static constexpr int CHUNKS = D_PAD / 8;              // 16-byte chunks per shared row
  static constexpr int ROW_WARPS = ROW_WARPS_;
  static constexpr int KEY_WARPS = KEY_WARPS_;
  static constexpr int ROWS = 16 * ROW_WARPS;           // packed query rows per block
  static constexpr int WARPS = ROW_WARPS * KEY_WARPS;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int WARP_KEYS = WARP_KEYS_;
  static constexpr int BLOCK_N = KEY_WARPS * WARP_KEYS;  // keys per tile
  static constexpr int STAGES = STAGES_;
  static constexpr int N_TILES = WARP_KEYS / 8;         // n8 tiles of S per warp
  static constexpr int D_TILES = D_PAD / 8;             // n8 tiles of O per warp
  static constexpr int QK_STEPS = D_PAD / 16;
  static constexpr int PV_STEPS = WARP_KEYS / 16;
  static constexpr bool Q_IN_REGS = D_PAD <= 128 || WGMMA_;   // else re-read per tile
  static constexpr bool VEC = VEC_;
  using Pages = PageRing<PAGED_, BLOCK_N, STAGES>;
  static constexpr int MROW = D_PAD + 4;                // merge row stride (floats)
  // TMA (sm_90): the ring's tiles are SwizzledTile<BLOCK_N, D_PAD> (wgmma.cuh: 64-column
  // blocks of 128-byte rows, the 128-byte swizzle), loaded by tensor-map boxes of 64
  // columns x BOX_ROWS rows: the whole tile's rows (contiguous caches) or PAGE_BOX_
  // (paged caches: 16 on pages of a multiple of 16 rows, 64 on pages of a multiple of
  // 64 (the host's Plan.page_box), tiles starting on a multiple of it, so a box never
  // straddles pages); otherwise rows of SROW elements. GATHER: the same
  // swizzled tiles filled by every thread's cp.async instead (load_kv: caches that have
  // no tensor map, such as pages of one row), for the warpgroup tile on sm_90a.
  static constexpr bool TMA = TMA_;
  static constexpr bool GATHER = GATHER_;
  // ROW_COPIES: paged rows of 256 bytes or more without tensor maps are copied by the
  // copy engine on sm_90, a bulk copy per row (decode_fwd's BULK); false (the host's
  // Plan.row_copies, for blocks of few keys): 16-byte cp.async, a row located once by
  // one lane for the lanes that copy it (load_kv). Per-row copies issue in a loop over
  // a warp's lanes, one at a time: two tiles of them before the first computed tile
  // held a block of a short sequence 2-3 us (H200, 2026-11-29, page 1, B = 1, Sk = 1k:
  // 9.1 -> 8.0 us a call with cp.async; notes-decode.md section 34).
  static constexpr bool ROW_COPIES = ROW_COPIES_;
  // Rows the copy engine takes one by one (decode_fwd's BULK, where ROW_COPIES): paged
  // 16-byte aligned rows of 256 bytes or more without maps, 16 or more copies a thread.
  static constexpr bool ROW_COPY_SHAPE = PAGED_ && VEC_ && !TMA_ && D_ * sizeof(T_) >= 256 &&
                                         BLOCK_N * CHUNKS * 2 >= 16 * THREADS;
  static constexpr bool MAPS = TMA_ && !GATHER_;   // tensor-map copies on sm_90
  static constexpr int D_BOXES = (D_PAD + 63) / 64;
  static constexpr int BOX_ROWS = PAGED_ ? PAGE_BOX_ : BLOCK_N;
  // FUSED_BOXES: the mma.sync tiles over paged maps past D = 64, D a multiple of 64,
  // keep the ring's tiles in chunks of BOX_ROWS rows, each with all D_BOXES column
  // blocks of its rows (SwizzledTile's chunks), so that one rank-5 box (column, row,
  // column block, head, page) fills a chunk: a copy per 16 keys where there were
  // D_BOXES (H200, 2026-11-29, B = 8, Sk = 8k, D = 128, Sq = 1, page 16: 1.72 -> 2.04
  // TB/s at one split, 1.011-1.013x under the plans). Not the warpgroup tile: its
  // K-major S = Q K^T then takes a wgmma of N = 16 per chunk (rows 1024 bytes apart in
  // eights, which chunks break), which cost more than the boxes saved (notes-decode.md
  // section 31).
  static constexpr bool FUSED_BOXES = MAPS && PAGED_ && !WGMMA_ && D_PAD > 64 && D_ % 64 == 0;
  // PRODUCER: the one-block warpgroup tile (two consumer warpgroups, one block an SM)
  // over paged maps at 64 < D <= 128 takes a warpgroup of its own (the block's last)
  // that looks up the pages and issues the boxes a ring ahead, the consumers releasing
  // each buffer on an `empty` mbarrier, so no consumer issues copies and no barrier
  // joins them per tile (produce_paged; notes-decode.md section 31). A whole
  // warpgroup, so that it can hand its registers to the consumers (setmaxnreg; with
  // one warp more, three warps on a scheduler capped every thread at 168 and the
  // consumers spilled); past D = 128 the consumers' 250 or so registers leave none.
  // Over contiguous maps at D = 128 too (produce_contiguous: a tile's four boxes, one a
  // warp): H200, 2026-11-29, Sq = 16, B = 8, Sk = 8k one split 3.72 -> 3.86 TB/s, under
  // the plans 1.03-1.075x from 4k keys; not at D = 96 (one split 3.17 -> 2.97) or 120
  // (0.984x; notes-decode.md section 32).
  static constexpr bool PRODUCER_SHAPE =   // (the gathered tiles of that shape: none)
      WGMMA_ && KEY_WARPS == 2 && 64 < D_PAD && D_PAD <= 128 && (PAGED_ || D_ == 128);
  static constexpr bool PRODUCER = MAPS && PRODUCER_SHAPE;
  // V_FUSED: paged PRODUCER traits with D a multiple of 64 keep V's tiles in chunks as
  // FUSED_BOXES does, one box of both column blocks per BOX_ROWS keys (V's MN-major P V
  // takes a chunk per k16 step with no narrower wgmma); K stays whole: 24 boxes a tile
  // at D = 128 where there were 32 (H200, 2026-11-29, B = 8, Sk = 8k, Sq = 16, page 16:
  // 3.33 -> 3.39 TB/s at one split, 1.00-1.016x under the plans; notes-decode.md
  // section 32).
  static constexpr bool V_FUSED = PRODUCER && PAGED_ && D_ % 64 == 0;
  // The ring's K and V tiles (KV_ROW: a key row's elements in either)
  using KTile = SwizzledTile<BLOCK_N, D_PAD, FUSED_BOXES ? BOX_ROWS : BLOCK_N>;
  using VTile = SwizzledTile<BLOCK_N, D_PAD, FUSED_BOXES || V_FUSED ? BOX_ROWS : BLOCK_N>;
  static constexpr int KV_ROW = TMA ? KTile::BYTES / (2 * BLOCK_N) : SROW;
  static constexpr u32 STAGE_BYTES = BLOCK_N * KV_ROW * 2;   // a ring buffer of K (or V)
  static constexpr int BLOCK_THREADS = THREADS + (PRODUCER ? 128 : 0);
  static constexpr int LAUNCH_REGS = 65536 / BLOCK_THREADS / 8 * 8;
  static constexpr int PRODUCER_REGS = 40;
  static constexpr int PRODUCER_WARPS = 4;   // each issues a share of a tile's boxes
  static constexpr int CONSUMER_REGS =
      cmin((LAUNCH_REGS * BLOCK_THREADS - 128 * PRODUCER_REGS) / THREADS / 8 * 8, 240);
  // The threads that issue a tile's tensor copies and arrive on its full barrier
  // otherwise: lane 0 of every warp for the other warpgroup tiles over paged caches
  // past D = 64 (load_kv_tma), thread 0 elsewhere: the mma.sync tiles run two blocks an SM
  // (four issuers there measured 0.99x at B = 64-256, Sq = 1), and the D = 64 warpgroup
  // tile's tiles have half the boxes (0.96-1.02x; notes-decode.md section 30).
  static constexpr int ISSUERS = PAGED_ && WGMMA_ && D_PAD > 64 && !PRODUCER ? THREADS / 32 : 1;
  // HALVES (HALVES_, the host's Plan.halves): under PRODUCER traits over paged maps each
  // consumer warpgroup's keys of a tile (its WARP_KEYS, a half) land on a full barrier
  // of their own and are released on an empty one of their own, so a warpgroup starts
  // once its half landed and the producer refills a half once its warpgroup is done
  // with it. H200, 2026-11-29, Sq = 16, D = 128, B = 8, one split (64 blocks): page 16
  // 3.37 -> 3.65 TB/s; under the plans grids of at most half the SMs gained (B = 8,
  // Sk = 1k-4k 1.031-1.059x page 16, 1.035-1.063x page 64; B = 4, Hq/Hkv 64/8 1.110 /
  // 1.033) and grids of 128 blocks lost (0.90-0.98x), so the host takes them on the
  // former only (notes-decode.md section 33).
  // full[STAGES * HALVES] (tile or half landed), then under PRODUCER's tile shapes as
  // many empty (every consumer warp of the tile or half done with the buffer; unused by
  // the gathered tiles of those shapes)
  static constexpr int HALVES = PRODUCER_SHAPE && PAGED_ && HALVES_ ? KEY_WARPS : 1;
  static constexpr int BARRIERS = (PRODUCER_SHAPE ? 2 : 1) * STAGES * HALVES;
  // full barrier `half` of ring buffer `stage` (from the first, `full`), its empty one
  __device__ __forceinline__ static u32 full_bar(u32 full, int stage, int half = 0) {
    return full + 8 * (stage * HALVES + half);
  }
  __device__ __forceinline__ static u32 empty_bar(u32 full, int stage, int half = 0) {
    return full + 8 * ((STAGES + stage) * HALVES + half);
  }
  // WGMMA (TMA traits, four row warps): a warpgroup per key warp, warp w the row warp
  // w % 4 of key warp w / 4. On sm_90a each warpgroup computes S = Q K^T and acc +=
  // P V over its WARP_KEYS keys with wgmma m64 (wgmma.cuh) from the ring's swizzled
  // tiles, Q and P from registers in the A-fragment layout that mma.sync takes too,
  // so the 64 packed rows are one instruction stream reading each K and V row from
  // shared memory once. The host selects them on sm_90a only; elsewhere the kernel traps.
  static constexpr bool WGMMA = WGMMA_;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static constexpr bool USE_WGMMA = WGMMA_;
#else
  static constexpr bool USE_WGMMA = false;
#endif
  // Byte offset in a ring tile of K (IS_V: of V) of 16-byte chunk c (columns 8c..8c+7)
  // of key row r.
  template <bool IS_V>
  __device__ __forceinline__ static u32 kv_offset(int r, int c) {
    if constexpr (TMA) return IS_V ? VTile::offset(r, c) : KTile::offset(r, c);
    return (r * SROW + c * 8) * 2;
  }
  // A lane's ldmatrix rows: row r0 + x, chunk c0 + y of a tile (c0 < 2; x a multiple of
  // 16 and y even, both compile-time in the loops; r0 % 16 + 15 rows stay in one of the
  // tile's chunks) is at kv_at<IS_V>(lane, kv_key(r0, c0), x, y), lane the address of (r0,
  // c0) (TMA: of (r0, 0)): padded rows are linear in x and y; the swizzle XORs the
  // chunk within its 64-column block with the row's low three bits, which x keeps.
  __device__ __forceinline__ static u32 kv_key(int r0, int c0) {
    return TMA ? u32((c0 ^ (r0 % 8)) << 4) : 0u;
  }
  template <bool IS_V>
  __device__ __forceinline__ static u32 kv_at(u32 lane, u32 key, int x, int y) {
    using Tile = typename SelectType<IS_V, VTile, KTile>::type;
    if constexpr (TMA)
      return lane + Tile::row_offset(x) + (y / 8) * Tile::BLOCK_BYTES + (key ^ ((y % 8) << 4));
    return lane + (x * SROW + y * 8) * 2;
  }

  struct Storage {
    union {
      struct {
        T k[STAGES][BLOCK_N * KV_ROW];
        T v[STAGES][BLOCK_N * KV_ROW];
      } ring;
      struct {
        float acc[KEY_WARPS][ROWS][MROW];
        float m[KEY_WARPS][ROWS];
        float l[KEY_WARPS][ROWS];
      } merge;
    };
    T q[ROWS * SROW];
    typename Pages::Ids ids;
    alignas(8) u64 full[BARRIERS];   // sm_90 bulk copies: tile landed (one phase per use)
  };
  // TMA: Storage is placed at the first 1024-byte boundary (storage.cuh).
  static constexpr int SMEM_BYTES = sizeof(Storage) + (TMA ? SMEM_SLACK : 0);

  static_assert(sizeof(T) == 2, "decode takes 16-bit inputs");
  static_assert(D >= 1 && D <= 256, "head dim 1..256");
  static_assert(ROW_WARPS >= 1 && KEY_WARPS >= 1 && WARPS <= 8, "1..8 warps");
  static_assert(WARP_KEYS % 16 == 0, "a warp's keys are whole k16 steps of P V");
  static_assert(STAGES >= 2, "a tile in flight while another is computed");
  static_assert(!VEC || D % 8 == 0, "16-byte copies need D % 8 == 0");
  static_assert(!TMA || (VEC && BLOCK_N % 16 == 0 && BLOCK_N <= 256), "TMA: aligned, box rows");
  static_assert(!HALVES_ || (PRODUCER && PAGED_), "halves: the paged producer's tile");
  static_assert((PAGE_BOX_ == 16 || (PAGE_BOX_ == 64 && MAPS && PAGED_)) &&
                BLOCK_N % BOX_ROWS == 0, "paged boxes of 16 rows, or 64 on pages of 64k rows");
  static_assert(!WGMMA || (TMA && ROW_WARPS == 4 && Q_IN_REGS),
                "wgmma: the swizzled ring, warpgroups of 64 rows, Q in registers");
  static_assert(!GATHER || TMA, "gather: cp.async into the swizzled ring");
  static_assert(ROW_COPIES || ROW_COPY_SHAPE,
                "ROW_COPIES_ = false only where decode_fwd would take per-row copies (BULK)");
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

// The block's packed rows r0 .. r_last (rows past the last repeat it: computed,
// never stored), and the query row and head of the two fragment rows (g, g + 8 of
// the warp's m16 tile) this thread holds.
template <class KT>
struct DecodeRows {
  int i[2], h[2];
  int r0, r_last;
  __device__ __forceinline__ DecodeRows(const FwdParams& p, int row_block, int hk, int rw,
                                        int lane) {
    const int group = p.group;
    r0 = row_block * KT::ROWS;
    r_last = cmin(r0 + KT::ROWS, group * p.seqlen_q) - 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int pr = cmin(r0 + 16 * rw + lane / 4 + 8 * r, r_last);
      i[r] = pr / group;
      h[r] = hk * group + pr % group;
    }
  }
};

// Q's packed rows into shared memory (plain loads; the caller's barrier publishes them).
template <class KT>
__device__ __forceinline__ void load_q(typename KT::Storage& st, const FwdParams& p,
                                       const DecodeRows<KT>& rows, int b, int hk) {
  using T = typename KT::T;
  for (int c = threadIdx.x; c < KT::ROWS * KT::CHUNKS; c += KT::THREADS) {
    const int r = c / KT::CHUNKS, col = (c % KT::CHUNKS) * 8;
    const int pr = cmin(rows.r0 + r, rows.r_last);
    const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride +
                 (hk * p.group + pr % p.group) * p.q_head_stride + (pr / p.group) * p.q_row_stride;
    T* s = &st.q[r * KT::SROW + col];
    if constexpr (KT::VEC) {
      uint4 u = make_uint4(0, 0, 0, 0);
      if (col < KT::D) u = *reinterpret_cast<const uint4*>(q + col);
      *reinterpret_cast<uint4*>(s) = u;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        T x;
        x.bits = 0;
        if (col + e < KT::D) x = q[col + e];
        s[e] = x;
      }
    }
  }
}

// One 16-byte chunk (columns cc..cc+7 of key row `row`) of K and V into ring buffer
// `stage`, from the rows at offsets `at` (zeros where !ok and past D), in the ring's
// layout (KT::kv_offset; TMA traits below sm_90 too): cp.async with VEC, element copies
// otherwise.
template <class KT>
__device__ __forceinline__ void copy_kv_chunk(typename KT::Storage& st, const typename KT::T* k,
                                              const typename KT::T* v, int stage, int row, int cc,
                                              bool ok, const KVRow& at) {
  using T = typename KT::T;
  T* sk;
  T* sv;
  if constexpr (KT::TMA) {   // the swizzled layout (TMA traits below sm_90)
    sk = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(&st.ring.k[stage][0]) +
                              KT::template kv_offset<false>(row, cc / 8));
    sv = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(&st.ring.v[stage][0]) +
                              KT::template kv_offset<true>(row, cc / 8));
  } else {
    sk = &st.ring.k[stage][row * KT::SROW + cc];
    sv = &st.ring.v[stage][row * KT::SROW + cc];
  }
  if constexpr (KT::VEC) {
    const bool in = ok && cc < KT::D;
    cp_async_16_l2_256(smem_addr(sk), k + at.k + (in ? cc : 0), in);
    cp_async_16_l2_256(smem_addr(sv), v + at.v + (in ? cc : 0), in);
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

// Producer (every thread): the keys [j0, j0 + BLOCK_N) of K and V, below kv_hi, into
// ring buffer `stage` (zeros past kv_hi and past D). Paged rows are located through the
// page ids of ring slot `ids`, once per chunk (copy_kv_chunk), except:
// - SHARED, for the gathered warpgroup tile and the tiles that take cp.async for their
//   per-row copies (!ROW_COPIES), where a warp's chunks of the tile cover at most 32
//   rows: lane m locates the warp's m-th row, and the lanes copying that row's chunks
//   take its offsets by shuffle (H200, page 1, Sq = 16, GQA 4, against a lookup a
//   chunk: 1.19-1.23x; the other mma.sync tiles at Sq <= 4 moved -2% to +1% and keep
//   their lookups; notes-decode.md section 36);
// - COLUMNS, for the paged gathered tile where SHARED does not apply (D = 96, 192,
//   ...): each thread locates its rows itself and copies their chunk columns
//   (1.16-1.23x at D = 96 and 192; at D = 64 it ran 0.86-1.02x SHARED, at 128 and 256
//   0.99-1.01x; section 38).
template <class KT>
__device__ __forceinline__ void load_kv(typename KT::Storage& st, const FwdParams& p,
                                        const CacheParams& cache, int b, int hk, int stage,
                                        int ids, int j0, int kv_hi) {
  using T = typename KT::T;
  constexpr int CHUNKS = KT::CHUNKS;
  constexpr bool SHARED = (KT::GATHER || !KT::ROW_COPIES) && KT::Pages::kPaged &&
                          32 % CHUNKS == 0 && KT::BLOCK_N <= KT::THREADS &&
                          KT::BLOCK_N * CHUNKS % KT::THREADS == 0;
  constexpr bool COLUMNS = KT::GATHER && KT::VEC && KT::Pages::kPaged && !SHARED;
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  if constexpr (SHARED) {
    constexpr int RPW = 32 / CHUNKS;              // a warp's rows a round
    constexpr int STRIDE = KT::THREADS / CHUNKS;  // rows between a warp's rounds
    const int lane = threadIdx.x % 32;
    const int mine = threadIdx.x / 32 * RPW + lane % RPW + lane / RPW * STRIDE;
    KVRow at_mine{0, 0};
    if (lane < RPW * (KT::BLOCK_N * CHUNKS / KT::THREADS) && j0 + mine < kv_hi)
      at_mine = KT::Pages::row(st.ids, p, cache, b, hk, ids, mine, j0 + mine);
#pragma unroll
    for (int c = threadIdx.x, round = 0; c < KT::BLOCK_N * CHUNKS; c += KT::THREADS, ++round) {
      const int row = c / CHUNKS, src = lane / CHUNKS + round * RPW;
      const KVRow at{__shfl_sync(0xffffffffu, at_mine.k, src),
                     __shfl_sync(0xffffffffu, at_mine.v, src)};
      copy_kv_chunk<KT>(st, k, v, stage, row, (c % CHUNKS) * 8, j0 + row < kv_hi, at);
    }
  } else if constexpr (COLUMNS) {
    // The tile's chunk columns (paged.cuh's ChunkColumns, as GatherTiles takes them),
    // each thread locating its own rows once and copying their chunk columns ch + LANES k
    // of K and V: the destinations constant steps from the lane's first (rows STEP
    // apart), the sources immediates past the row's address. Chunks wholly past the
    // row's (never read) are not copied, nor any past the slots a row holds (the
    // 64-column blocks of the swizzled tile). At least 8 lanes a row: 4 (more chunks a
    // lane) ran 0.76-1.01x at D = 96 and 128 (section 38).
    constexpr int SLOTS = CeilDiv<KT::D_PAD, 64>::value * 8;
    using Cols = ChunkColumns<CHUNKS, KT::BLOCK_N, KT::THREADS, SLOTS, 4, 8>;
    constexpr int LANES = Cols::LANES, STEP = Cols::STEP, SLABS = Cols::SLABS;
    static_assert(KT::TMA && KT::KTile::BYTES == KT::VTile::BYTES &&
                      KT::KTile::BLOCK_BYTES == KT::BLOCK_N * 128,
                  "chunk columns: K and V in one whole-tile swizzled layout");
    // chunk ch + dc of row x0 + dr, constant steps from the lane's (x0, ch) at `lane`
    const auto step = [](u32 lane, int dr, int dc) {
      return Cols::rows_below(KT::KTile::at(lane, 0, dc), dr);
    };
    const int ch = threadIdx.x % LANES, x0 = threadIdx.x / LANES;
    const u32 k_lane = smem_addr(&st.ring.k[stage][0]) + KT::template kv_offset<false>(x0, ch);
    const u32 v_lane = smem_addr(&st.ring.v[stage][0]) + KT::template kv_offset<true>(x0, ch);
    // a row at a time (unrolled: 0.99-1.01x, section 38)
#pragma unroll 1
    for (int dr = 0; dr < KT::BLOCK_N; dr += STEP) {
      const int x = x0 + dr, j = j0 + x;
      const bool ok = j < kv_hi;
      const KVRow at = ok ? KT::Pages::row(st.ids, p, cache, b, hk, ids, x, j) : KVRow{0, 0};
      const T* k_row = k + at.k + ch * 8;
      const T* v_row = v + at.v + ch * 8;
#pragma unroll
      for (int s = 0; s < SLABS; ++s) {
        const int dc = LANES * s;  // chunk ch + dc
        if (LANES * (s + 1) <= SLOTS || ch + dc < SLOTS) {
          // a chunk inside the head's columns for every lane, else this lane's test
          const bool in = ok && (8 * (dc + LANES) <= KT::D || 8 * (ch + dc) < KT::D);
          cp_async_16_l2_256(step(k_lane, dr, dc), in ? k_row + 8 * dc : k, in);
          cp_async_16_l2_256(step(v_lane, dr, dc), in ? v_row + 8 * dc : v, in);
        }
      }
    }
  } else {
#pragma unroll
    for (int c = threadIdx.x; c < KT::BLOCK_N * CHUNKS; c += KT::THREADS) {
      const int row = c / CHUNKS, cc = (c % CHUNKS) * 8, j = j0 + row;
      const bool ok = j < kv_hi;
      const KVRow at = ok ? KT::Pages::row(st.ids, p, cache, b, hk, ids, row, j) : KVRow{0, 0};
      copy_kv_chunk<KT>(st, k, v, stage, row, cc, ok, at);
    }
  }
}

// Producer on sm_90 (every thread, VEC only): each K and V row of the tile below kv_hi
// is one bulk copy of D * 2 bytes by the copy engine, located once per row (load_kv
// locates a paged row once per 16-byte chunk), completing on mbarrier `bar`; thread 0
// announces the bytes. Rows past kv_hi are zeroed with plain stores (published by the
// consumers' barrier).
template <class KT>
__device__ __forceinline__ void load_kv_bulk(typename KT::Storage& st, const FwdParams& p,
                                             const CacheParams& cache, int b, int hk, int stage,
                                             int ids, int j0, int kv_hi, u32 bar) {
  using T = typename KT::T;
  constexpr u32 ROW_BYTES = KT::D * sizeof(T);
  const int rows = cmin(KT::BLOCK_N, kv_hi - j0);
  if (threadIdx.x == 0) mbarrier_arrive_expect_tx(bar, 2 * rows * ROW_BYTES);
  fence_proxy_async();   // this thread's earlier generic accesses of the buffer come first
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  for (int x = threadIdx.x; x < 2 * KT::BLOCK_N; x += KT::THREADS) {
    const int row = x % KT::BLOCK_N;
    const bool is_v = x >= KT::BLOCK_N;
    T* dst = is_v ? &st.ring.v[stage][row * KT::SROW] : &st.ring.k[stage][row * KT::SROW];
    if (row < rows) {
      const KVRow at = KT::Pages::row(st.ids, p, cache, b, hk, ids, row, j0 + row);
      bulk_load(smem_addr(dst), is_v ? v + at.v : k + at.k, ROW_BYTES, bar);
    } else {
#pragma unroll
      for (int c = 0; c < KT::CHUNKS; ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
    }
  }
}

// The paged maps' boxes of BOX_ROWS keys (row `row` of page `page`, KV head hk) into
// tile rows x.. of K's and V's ring buffers at k_dst + base, v_dst + base: a chunked
// tile's (KTile, VTile) in one rank-5 box, a whole tile's in a box per 64-column block;
// completing on mbarrier `bar`.
template <class KT>
__device__ __forceinline__ void load_box_rows(u32 k_dst, u32 v_dst, u32 base, int x,
                                              const TmaMap& k_map, const TmaMap& v_map, int row,
                                              int hk, int page, u32 bar) {
  using KTile = typename KT::KTile;
  using VTile = typename KT::VTile;
  // (rank-5 maps, a box of every column block: FUSED_BOXES, and V_FUSED's V)
  constexpr bool K_CHUNKED = KT::FUSED_BOXES, V_CHUNKED = KT::FUSED_BOXES || KT::V_FUSED;
  if constexpr (!K_CHUNKED && !V_CHUNKED) {
    const u32 at = base + KTile::row_offset(x);
#pragma unroll
    for (int c = 0; c < KT::D_BOXES; ++c) {
      tma_load_4d(k_dst + at + c * KTile::BLOCK_BYTES, k_map, 64 * c, row, hk, page, bar);
      tma_load_4d(v_dst + at + c * KTile::BLOCK_BYTES, v_map, 64 * c, row, hk, page, bar);
    }
  } else {
    auto load = [&](auto tile, bool chunked, u32 dst, const TmaMap& map) {
      using Tile = decltype(tile);
      dst += base + Tile::row_offset(x);
      if (chunked)
        tma_load_5d(dst, map, 0, row, 0, hk, page, bar);
      else
        tma_load_blocks<KT::D_BOXES>(dst, Tile::BLOCK_BYTES, map, row, hk, page, bar);
    };
    load(KTile{}, K_CHUNKED, k_dst, k_map);
    load(VTile{}, V_CHUNKED, v_dst, v_map);
  }
}

// Producer on sm_90: the keys [j0, j0 + BLOCK_N) of K and V of (batch b, KV head hk)
// by the copy engine through the caches' tensor maps, completing on mbarrier `bar`:
// D_BOXES boxes of 64 columns per BOX_ROWS rows. Contiguous: maps over [B, Hkv,
// Sk_max, D], one box row range per tile, from thread 0. Paged: maps over the page
// pool [pages, Hkv, page_size, D], a box per 16 keys at (page id from ring slot `slot`,
// row in the page), only those with a key below kv_hi, dealt to KT::ISSUERS threads
// (`issuer`: the boxes issuer, issuer + ISSUERS, ...), each announcing its own bytes.
// Every issue of a tensor copy is a loop over the distinct values of its operands in
// the warp (ptxas: ELECT, BRA.U.ANY), about 20 instructions a box beside a page id's
// load; from one thread they held every other warp at the tile's barrier
// (notes-decode.md sections 29, 30). Rows past a map's extent and columns past D
// arrive as zeros; other rows from kv_hi on as the cache holds them (the caller zeroes
// V's there).
template <class KT>
__device__ __forceinline__ void load_kv_tma(u32 k_dst, u32 v_dst, const TmaMap& k_map,
                                            const TmaMap& v_map,
                                            const typename KT::Pages::Ids& ids,
                                            const CacheParams& cache, int b, int hk, int slot,
                                            int j0, int kv_hi, u32 bar, int issuer) {
  constexpr u32 BLOCK = KT::KTile::BLOCK_BYTES, BOX = KT::BOX_ROWS * 128;
  if constexpr (!KT::Pages::kPaged) {
    mbarrier_arrive_expect_tx(bar, 2 * KT::D_BOXES * BOX);
#pragma unroll
    for (int c = 0; c < KT::D_BOXES; ++c) {
      tma_load_4d(k_dst + c * BLOCK, k_map, 64 * c, j0, hk, b, bar);
      tma_load_4d(v_dst + c * BLOCK, v_map, 64 * c, j0, hk, b, bar);
    }
  } else {
    const int boxes = ceil_div(cmin(KT::BLOCK_N, kv_hi - j0), KT::BOX_ROWS);
    const int mine =
        KT::ISSUERS == 1 ? boxes : boxes > issuer ? ceil_div(boxes - issuer, KT::ISSUERS) : 0;
    mbarrier_arrive_expect_tx(bar, 2 * KT::D_BOXES * mine * BOX);
    const Divisor pages = cache.pages();
    for (int x = issuer * KT::BOX_ROWS; x < boxes * KT::BOX_ROWS;
         x += KT::ISSUERS * KT::BOX_ROWS) {
      const int page = ids.id[slot * KT::BLOCK_N + x], row = pages.mod(j0 + x);
      load_box_rows<KT>(k_dst, v_dst, 0, x, k_map, v_map, row, hk, page, bar);
    }
  }
}

// A producer lane before tile t: half `half` of its ring buffer free again (every
// consumer warp of the half released the tile STAGES before it there, on the empty
// barrier); returns the half's full barrier.
template <class KT>
__device__ __forceinline__ u32 await_released(u32 full, int t, int half = 0) {
  constexpr int STAGES = KT::STAGES;
  const int stage = t % STAGES;
  if (t >= STAGES) mbarrier_wait(KT::empty_bar(full, stage, half), (t / STAGES + 1) & 1);
  return KT::full_bar(full, stage, half);
}

// Producer warp pw (0..3) of PRODUCER traits' warpgroup: tiles 0 .. n_tiles - 1 of
// keys [kv_lo, kv_hi) of (batch b, KV head hk) through the paged maps, each half
// (KT::HALVES; else the whole tile) of tile t into ring buffer t % STAGES once the
// half's consumer warps released the tile before it there (empty barrier), on the
// half's full barrier, where each producer warp announces its own bytes (whole tiles)
// or the half's first lane the half's (HALVES). A half's box rows (BOX_ROWS keys each)
// are dealt round the half's warps (all four, or two under HALVES, so that a warp
// waits for one half: lanes of a warp waiting on both spun for both, H200, page 16,
// 0.84-0.94x under the plans): a lane owns at most one, reads its page id from the
// block table two tiles ahead (the loads' latency under two tiles' issue, as the other
// tiles' cp.async ids) and issues its boxes. Four warps, because ptxas issues a box
// once per lane that has one (section 29): from one warp, a tile's 32 boxes at D = 128
// went out one after another, and long sequences lost 1-2.4% (notes-decode.md
// section 31).
template <class KT>
__device__ __forceinline__ void produce_paged(typename KT::Storage& st, const TmaMap& k_map,
                                              const TmaMap& v_map, const CacheParams& cache,
                                              int b, int hk, int kv_lo, int kv_hi, int n_tiles,
                                              u32 full, int pw, int lane) {
  constexpr int STAGES = KT::STAGES, BLOCK_N = KT::BLOCK_N, ROWS = KT::BOX_ROWS;
  constexpr int PER_HALF = BLOCK_N / ROWS / KT::HALVES;   // box rows of a half
  constexpr int WARPS = KT::PRODUCER_WARPS / KT::HALVES;  // producer warps of a half
  static_assert(KT::HALVES * WARPS == KT::PRODUCER_WARPS && PER_HALF <= 32 * WARPS,
                "a half's warps, a lane per box row");
  const i32* table = cache.block_table + b * cache.block_table_stride;
  const Divisor pages = cache.pages();
  const u32 k_ring = smem_addr(&st.ring.k[0][0]), v_ring = smem_addr(&st.ring.v[0][0]);
  const int half = KT::HALVES > 1 ? pw / WARPS : 0, hw = pw % WARPS;   // warp hw of its half
  const int y = hw + WARPS * lane;        // this lane's box row of its half
  const int x = half * PER_HALF + y;      // ... of the tile
  auto page_of = [&](int t) {             // this lane's page in tile t (0 where it has no keys)
    const int j = kv_lo + t * BLOCK_N + ROWS * x;
    return y < PER_HALF && t < n_tiles && j < kv_hi ? table[pages.div(j)] : 0;
  };
  int page = page_of(0), next = page_of(1);
  constexpr u32 BOX_BYTES = 2 * KT::D_BOXES * ROWS * 128;   // K's and V's of a box row
  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % STAGES;
    const int j0 = kv_lo + t * BLOCK_N;
    const int boxes = ceil_div(cmin(BLOCK_N, kv_hi - j0), ROWS);   // of the tile
    auto issue = [&](u32 bar) {
      const int row = pages.mod(j0 + ROWS * x);
      load_box_rows<KT>(k_ring, v_ring, stage * KT::STAGE_BYTES, ROWS * x, k_map, v_map, row,
                        hk, page, bar);
    };
    int after;   // (the page ids two tiles ahead: read before or after the wait, as measured)
    if constexpr (KT::HALVES > 1) {
      // each lane with a box row waits for its half and issues at once; the half's first
      // announces the half's bytes, one arrival (each warp its own after a __syncwarp, as
      // below, measured 0.97-0.98x of this at page 16: notes-decode.md section 33)
      after = page_of(t + 2);
      if (y < PER_HALF) {
        const u32 bar = await_released<KT>(full, t, half);
        fence_proxy_async();   // the consumers' reads of the buffer (their release) come first
        if (y == 0)   // (with no box too: the half's consumers wait on the barrier)
          mbarrier_arrive_expect_tx(bar, cmax(cmin(boxes - x, PER_HALF), 0) * BOX_BYTES);
        if (x < boxes) issue(bar);
      }
    } else {
      // each warp announces its own bytes (the per-lane form above measured down to
      // 0.91x of this on grids of 128 blocks)
      const u32 bar = await_released<KT>(full, t);
      after = page_of(t + 2);
      const int mine = boxes > hw ? ceil_div(boxes - hw, WARPS) : 0;
      if (lane == 0) {
        fence_proxy_async();   // the consumers' reads of the buffer (their release) come first
        mbarrier_arrive_expect_tx(bar, mine * BOX_BYTES);
      }
      __syncwarp();
      if (lane < mine) issue(bar);
    }
    page = next;
    next = after;
  }
}

// Producer warp pw of PRODUCER traits' warpgroup over contiguous maps: box pw of each
// tile (K's column blocks, then V's; BLOCK_N rows from the tile's first key), into
// ring buffer t % STAGES once the consumers released it, on its full barrier.
template <class KT>
__device__ __forceinline__ void produce_contiguous(typename KT::Storage& st, const TmaMap& k_map,
                                                   const TmaMap& v_map, int b, int hk, int kv_lo,
                                                   int n_tiles, u32 full, int pw, int lane) {
  constexpr int STAGES = KT::STAGES, BLOCK_N = KT::BLOCK_N, BLOCKS = KT::D_BOXES;
  static_assert(2 * BLOCKS == KT::PRODUCER_WARPS, "a box a warp");
  if (lane != 0) return;
  const int c = pw % BLOCKS;
  const TmaMap& map = pw < BLOCKS ? k_map : v_map;
  const u32 dst = smem_addr(pw < BLOCKS ? &st.ring.k[0][0] : &st.ring.v[0][0]) +
                  c * KT::KTile::BLOCK_BYTES;
  for (int t = 0; t < n_tiles; ++t) {
    const u32 bar = await_released<KT>(full, t);
    fence_proxy_async();   // the consumers' reads of the buffer (their release) come first
    mbarrier_arrive_expect_tx(bar, BLOCK_N * 128);
    tma_load_4d(dst + t % STAGES * KT::STAGE_BYTES, map, 64 * c, kv_lo + t * BLOCK_N, hk, b, bar);
  }
}

// The roles of PRODUCER traits: the producer warpgroup hands its registers over, runs
// produce_paged or produce_contiguous and returns true; the consumers take the
// registers and return false.
template <class KT>
__device__ __forceinline__ bool produced(typename KT::Storage& st, const TmaMap& k_map,
                                         const TmaMap& v_map, const CacheParams& cache, int b,
                                         int hk, int kv_lo, int kv_hi, int n_tiles, u32 full,
                                         int warp, int lane) {
  // (warp-uniform; through a shuffle so that the compiler knows it too)
  const int uwarp = __shfl_sync(0xffffffffu, warp, 0);
  if (uwarp >= KT::WARPS) {
    setmaxnreg_dec<KT::PRODUCER_REGS>();
    if constexpr (KT::Pages::kPaged)
      produce_paged<KT>(st, k_map, v_map, cache, b, hk, kv_lo, kv_hi, n_tiles, full,
                        uwarp - KT::WARPS, lane);
    else
      produce_contiguous<KT>(st, k_map, v_map, b, hk, kv_lo, n_tiles, full, uwarp - KT::WARPS,
                             lane);
    return true;
  }
  setmaxnreg_inc<KT::CONSUMER_REGS>();
  return false;
}

// The consumers' barrier: the block's, or theirs alone beside a producer warpgroup
// (which meets them at the start only).
template <class KT>
__device__ __forceinline__ void consumers_sync() {
  if constexpr (KT::PRODUCER)
    named_barrier_sync(1, KT::THREADS);
  else
    __syncthreads();
}

// Consumer step of one warp: its WARP_KEYS keys (first key k0) of the tile in ring
// buffer `stage` against its 16 packed rows. s = Q K^T; the variant's scores where
// the tile is partial, the variant transforms them or the scale is negative (the max
// of the dots would be the min of the scores); otherwise the scale joins the exp2's
// FMA; the online softmax (max-free once the warp's rows have a reference); acc += P V.
// k_lane, v_lane: the lane's ldmatrix addresses in the buffer (KT::kv_at); with
// USE_WGMMA the buffer's own address, which the warpgroup's descriptors take (the
// four warps run the step together: S and P V as wgmma m64 of the 64 rows, every
// warp whichever softmax branch it takes).
template <class KT, class VT>
__device__ __forceinline__ void consume_tile(const FwdParams& p, const DecodeRows<KT>& rows,
                                             const u32 (&qf)[KT::Q_IN_REGS ? KT::QK_STEPS : 1][4],
                                             u32 q_addr, u32 k_lane, u32 k_key, u32 v_lane,
                                             u32 v_key, int b, int k0, bool partial, int lane,
                                             FragSoftmax<KT::N_TILES>& sm,
                                             float (&acc)[KT::D_TILES * 4]) {
  using T = typename KT::T;
  float s[KT::N_TILES * 4];
  // s = Q K^T: by the warpgroup's wgmma (USE_WGMMA and `group`: the four warps call it
  // together), or by this warp's mma.sync chain (the recompute below, which one warp
  // may take alone; with USE_WGMMA its ldmatrix addresses follow from the buffer's).
  auto scores = [&](bool group) {
#pragma unroll
    for (int x = 0; x < KT::N_TILES * 4; ++x) s[x] = 0.f;
    if constexpr (KT::USE_WGMMA) {
      if (group) {
        const u64 k_desc = KT::KTile::kmajor(k_lane, 0, 0);
        wgmma_fence();   // s was zeroed and Q written by ordinary code
#pragma unroll
        for (int ks = 0; ks < KT::QK_STEPS; ++ks)
          Wgmma<KT::WARP_KEYS>::template rs<0>(
              s, qf[ks], desc_advance(k_desc, KT::KTile::kmajor_offset(ks)), T{});
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(s);
        return;
      }
    }
    const u32 k_warp = KT::USE_WGMMA ? k_lane + (lane % 8 + 8 * (lane / 16)) * 128 : k_lane;
#pragma unroll
    for (int ks = 0; ks < KT::QK_STEPS; ++ks) {
      u32 a[4];
      if constexpr (KT::Q_IN_REGS) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = qf[ks][e];
      } else {
        ldmatrix_x4(a, q_addr + ks * 32);
      }
#pragma unroll
      for (int nt = 0; nt < KT::N_TILES; nt += 2) {
        u32 bk[4];
        ldmatrix_x4(bk, KT::template kv_at<false>(k_warp, k_key, nt * 8, 2 * ks));
        mma_16816(*reinterpret_cast<float(*)[4]>(&s[nt * 4]), a, bk[0], bk[1], T{});
        mma_16816(*reinterpret_cast<float(*)[4]>(&s[nt * 4 + 4]), a, bk[2], bk[3], T{});
      }
    }
  };
  scores(true);
  const bool plain = !partial && !VT::kTransform && p.scale_log2 >= 0.f;
  // The max-free softmax (FragSoftmax::fast) where every row of the warp has a finite
  // m_i: no row max, no rescale unless a sum fails its bound (then settle; if a p
  // overflowed, the scores again from K, still in its buffer, under the exact max).
  if (VT::kFastSoftmax &&
      __all_sync(0xffffffffu, plain && sm.row[0].m_i != -CA_INF && sm.row[1].m_i != -CA_INF)) {
    float sum[2];
    if (!__any_sync(0xffffffffu, !sm.fast(s, p.scale_log2, sum))) {
      sm.commit(sum);
    } else {
      if (!sm.settle(s, sum)) {
        scores(false);
        sm.online(s, p.scale_log2, true);
      }
      sm.rescale(acc);
    }
  } else if (plain) {
    sm.online(s, p.scale_log2, false);
    sm.rescale(acc);
  } else {
    const int j_lane = k0 + 2 * (lane % 4);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const typename VT::Head hd = VT::Dense::head(p, b, rows.h[r]);
#pragma unroll
      for (int nt = 0; nt < KT::N_TILES; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j_lane + 8 * nt + e;
          float& x = s[nt * 4 + 2 * r + e];
          const float y = VT::score(p, hd, rows.i[r], j, x);
          x = !partial || VT::keep(p, rows.i[r], j) ? y : -CA_INF;
        }
    }
    sm.online(s, 1.f, false);
    sm.rescale(acc);
  }
  if constexpr (KT::USE_WGMMA) {
    u32 pa[KT::PV_STEPS][4];
#pragma unroll
    for (int ks = 0; ks < KT::PV_STEPS; ++ks)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        pa[ks][e] = MmaType<T>::pack(s[8 * ks + 2 * e], s[8 * ks + 2 * e + 1]);
    const u64 v_desc = KT::VTile::mnmajor(v_lane, 0);
    wgmma_fence();   // P and the rescaled acc were written by ordinary code
#pragma unroll
    for (int ks = 0; ks < KT::PV_STEPS; ++ks)
      Wgmma<KT::D_PAD>::rs(acc, pa[ks], desc_advance(v_desc, KT::VTile::mnmajor_offset(ks)), T{});
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(acc);
    fence_regs(pa);
  } else {
#pragma unroll
    for (int ks = 0; ks < KT::PV_STEPS; ++ks) {
      u32 a[4];
      a[0] = MmaType<T>::pack(s[8 * ks + 0], s[8 * ks + 1]);
      a[1] = MmaType<T>::pack(s[8 * ks + 2], s[8 * ks + 3]);
      a[2] = MmaType<T>::pack(s[8 * ks + 4], s[8 * ks + 5]);
      a[3] = MmaType<T>::pack(s[8 * ks + 6], s[8 * ks + 7]);
#pragma unroll
      for (int dt = 0; dt < KT::D_TILES; dt += 2) {
        u32 bv[4];
        ldmatrix_x4_trans(bv, KT::template kv_at<true>(v_lane, v_key, ks * 16, dt));
        mma_16816(*reinterpret_cast<float(*)[4]>(&acc[dt * 4]), a, bv[0], bv[1], T{});
        mma_16816(*reinterpret_cast<float(*)[4]>(&acc[dt * 4 + 4]), a, bv[2], bv[3], T{});
      }
    }
  }
}

// Epilogue: the key warps' states meet in shared memory (the ring is free: every
// copy landed, the caller's barrier passed) and merge, each row's weights computed
// once; then each row's output and LSE: the split's fp32 partial state (num_splits >
// 1, merged by merge.cu) or the final O in T.
template <class KT>
__device__ __forceinline__ void store(typename KT::Storage& st, const DecodeParams& dp,
                                      const FwdParams& p, const DecodeRows<KT>& rows, int b,
                                      int hk, int split, int rw, int kw, int lane,
                                      FragSoftmax<KT::N_TILES>& sm,
                                      const float (&acc)[KT::D_TILES * 4]) {
  using T = typename KT::T;
  constexpr int ROWS = KT::ROWS, D = KT::D, KEY_WARPS = KT::KEY_WARPS;
  sm.finish();
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 16 * rw + g + 8 * r;
#pragma unroll
    for (int dt = 0; dt < KT::D_TILES; ++dt)
      *reinterpret_cast<float2*>(&st.merge.acc[kw][row][8 * dt + 2 * t]) =
          make_float2(acc[dt * 4 + 2 * r], acc[dt * 4 + 2 * r + 1]);
    if (t == 0) {
      st.merge.m[kw][row] = sm.row[r].m_i;
      st.merge.l[kw][row] = sm.row[r].l_i;
    }
  }
  consumers_sync<KT>();
  // Each row's merge once, by one thread: in place of the warps' m, their weights
  // exp2(m_w - m) / l (l = sum of the weighted l_w), and the row's LSE in place of
  // the first warp's l (a row's slots are read and written by its thread alone).
  const int stored = rows.r_last - rows.r0 + 1;
  if (threadIdx.x < cmin(ROWS, stored)) {
    const int r = threadIdx.x;
    SoftmaxRow row;
    row.m_i = -CA_INF;
#pragma unroll
    for (int w = 0; w < KEY_WARPS; ++w) row.m_i = fmaxf(row.m_i, st.merge.m[w][r]);
    const float ref = row.ref();
    float wt[KEY_WARPS];
    row.l_i = 0.f;
#pragma unroll
    for (int w = 0; w < KEY_WARPS; ++w) {
      wt[w] = exact_exp2(st.merge.m[w][r] - ref);
      row.l_i = fmaf(wt[w], st.merge.l[w][r], row.l_i);
    }
    const float inv_l = row.inv_l();
#pragma unroll
    for (int w = 0; w < KEY_WARPS; ++w) st.merge.m[w][r] = wt[w] * inv_l;
    st.merge.l[0][r] = row.lse();
  }
  consumers_sync<KT>();

  // COLS consecutive columns a thread (four where the aligned path's 16-byte strides and
  // D allow: o_part rows are D floats, out's rows aligned to 16 bytes)
  constexpr int COLS = KT::VEC && D % 4 == 0 ? 4 : 1;
  const bool partial = dp.num_splits > 1;
  const int group = p.group;
  for (int x = threadIdx.x; x < ROWS * D / COLS; x += KT::THREADS) {
    const int r = x / (D / COLS), d = x % (D / COLS) * COLS, pr = rows.r0 + r;
    if (pr > rows.r_last) break;   // x grows with r: no later x is a stored row
    float o[COLS];
#pragma unroll
    for (int e = 0; e < COLS; ++e) o[e] = 0.f;
#pragma unroll
    for (int w = 0; w < KEY_WARPS; ++w) {
      const float wt = st.merge.m[w][r];
      float a[COLS];
      if constexpr (COLS == 4) {
        const float4 q4 = *reinterpret_cast<const float4*>(&st.merge.acc[w][r][d]);
        a[0] = q4.x, a[1] = q4.y, a[2] = q4.z, a[3] = q4.w;
      } else {
        a[0] = st.merge.acc[w][r][d];
      }
#pragma unroll
      for (int e = 0; e < COLS; ++e) o[e] = fmaf(wt, a[e], o[e]);
    }
    const float lse = st.merge.l[0][r];
    const int i = pr / group, h = hk * group + pr % group;
    if (partial) {
      const i64 at = ((i64(split) * p.batch + b) * p.heads_q + h) * p.seqlen_q + i;
      if constexpr (COLS == 4)
        *reinterpret_cast<float4*>(dp.o_part + at * D + d) = make_float4(o[0], o[1], o[2], o[3]);
      else
        dp.o_part[at * D + d] = o[0];
      if (d == 0) dp.lse_part[at] = lse;
    } else {
      T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride +
               i * p.o_row_stride + d;
      if constexpr (COLS == 4) {
        T y[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) y[e] = from_float<T>(o[e]);
        *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(y);
      } else {
        out[0] = from_float<T>(o[0]);
      }
      if (d == 0 && p.lse != nullptr)
        p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = lse;
    }
  }
}

// Scheduler: the block's key range [kv_lo, kv_hi) for the split `split` of its rows
// (i_first .. i_last) in a sequence of `seqlen` keys: the band of its rows within the
// split; the last split runs to the sequence's end, whatever length the host planned
// for. (Paged tensor-map tiles start on a multiple of 16 keys, so that no box straddles
// pages: the keys below the band that adds are masked, and a split starts on one.)
template <class KT, class VT>
__device__ __forceinline__ void key_range(const DecodeParams& dp, const FwdParams& p, int split,
                                          int seqlen, int i_first, int i_last, int& kv_lo,
                                          int& kv_hi) {
  constexpr int KV_ALIGN = KT::MAPS && KT::Pages::kPaged ? KT::BOX_ROWS : 1;
  kv_lo = cmax(VT::kv_begin(p, i_first), split * dp.split_keys) / KV_ALIGN * KV_ALIGN;
  const int split_end = split + 1 == dp.num_splits ? seqlen : (split + 1) * dp.split_keys;
  kv_hi = cmax(cmin(VT::kv_end(p, i_last), split_end), kv_lo);
}

// Producer set-up for the copy engine (BULK: per-row bulk copies; TMA: tensor maps):
// the ring's mbarriers, and (BULK) the columns past D, which no copy writes, zeroed
// once in every buffer. The caller's barrier publishes both.
template <class KT, bool BULK, bool TMA>
__device__ __forceinline__ void init_ring(typename KT::Storage& st, u32 full) {
  if constexpr (BULK && KT::D != KT::D_PAD) {
    constexpr int PAD = (KT::D_PAD - KT::D) / 8;
    for (int x = threadIdx.x; x < 2 * KT::STAGES * KT::BLOCK_N * PAD; x += KT::THREADS) {
      const int row = x / PAD, c = KT::D / 8 + x % PAD;
      reinterpret_cast<uint4*>(&st.ring.k[0][0])[(row * KT::SROW) / 8 + c] = make_uint4(0, 0, 0, 0);
    }
  }
  if constexpr (BULK || TMA) {   // (BULK: thread 0 announces the bytes)
    // (full: each paged producer half's first lane (HALVES), every producer warp, or the
    // issuers)
    constexpr int ARRIVALS = !TMA                ? 1
                             : KT::HALVES > 1    ? 1
                             : KT::PRODUCER      ? KT::PRODUCER_WARPS
                                                 : KT::ISSUERS;
    constexpr int FULL = KT::STAGES * KT::HALVES;
    if (threadIdx.x < FULL) mbarrier_init(full + 8 * threadIdx.x, ARRIVALS);
    if constexpr (KT::PRODUCER) {   // empty: one arrival per consumer warp of the half
      if (threadIdx.x < FULL)
        mbarrier_init(full + 8 * (FULL + threadIdx.x), KT::WARPS / KT::HALVES);
    }
  }
}

// After a tensor-map tile landed in ring buffer `stage`: its V rows from `valid` on
// came as the cache holds them (the next split's keys, or rows past the sequence
// that may hold anything), so they are zeroed, and P = 0 there adds exact zeros. K's
// rows there are masked by select. The caller's barrier publishes the zeros. Rows
// `valid` .. end - 1 (the tile's, or a half's), by THREADS threads (`thread` this one).
template <class KT, int THREADS = KT::THREADS>
__device__ __forceinline__ void zero_v_tail(typename KT::Storage& st, int stage, int valid,
                                            int end = KT::BLOCK_N, int thread = threadIdx.x) {
  if (valid >= end) return;
  unsigned char* v_tile = reinterpret_cast<unsigned char*>(&st.ring.v[stage][0]);
  constexpr int CHUNKS = KT::D_BOXES * 8;   // 16-byte chunks of a swizzled row
  for (int x = thread; x < (end - valid) * CHUNKS; x += THREADS) {
    const int row = valid + x / CHUNKS, c = x % CHUNKS;
    *reinterpret_cast<uint4*>(v_tile + KT::template kv_offset<true>(row, c)) = make_uint4(0, 0, 0, 0);
  }
  if constexpr (KT::USE_WGMMA) fence_proxy_async();   // wgmma reads through the async proxy
}

// A consumer lane's shared-memory addresses (ldmatrix lane addressing, common/mma.cuh:
// matrix lane / 8, row lane % 8): Q's fragment rows, and its rows and chunks of K (B of
// Q K^T) and V (B of P V, transposed) in ring buffer 0 (kv_at's `lane` and `key`); with
// USE_WGMMA the warpgroup's own key rows, which its descriptors take.
template <class KT>
struct ConsumerLanes {
  u32 q, k, v, k_key, v_key;
  int key0;   // the warp's first key row in a tile
  __device__ __forceinline__ ConsumerLanes(typename KT::Storage& st, int rw, int kw, int lane) {
    const int lm = lane / 8, lr = lane % 8;
    q = smem_addr(&st.q[(16 * rw + lr + 8 * (lm & 1)) * KT::SROW + 8 * (lm >> 1)]);
    key0 = kw * KT::WARP_KEYS;
    const int k_r0 = key0 + lr + 8 * (lm >> 1), k_c0 = lm & 1;
    const int v_r0 = key0 + lr + 8 * (lm & 1), v_c0 = lm >> 1;
    k = KT::USE_WGMMA ? smem_addr(&st.ring.k[0][0]) + KT::KTile::row_offset(key0)
        : KT::TMA      ? smem_addr(&st.ring.k[0][0]) + KT::KTile::row_offset(k_r0)
                       : smem_addr(&st.ring.k[0][k_r0 * KT::SROW + 8 * k_c0]);
    v = KT::USE_WGMMA ? smem_addr(&st.ring.v[0][0]) + KT::VTile::row_offset(key0)
        : KT::TMA      ? smem_addr(&st.ring.v[0][0]) + KT::VTile::row_offset(v_r0)
                       : smem_addr(&st.ring.v[0][v_r0 * KT::SROW + 8 * v_c0]);
    k_key = KT::kv_key(k_r0, k_c0);
    v_key = KT::kv_key(v_r0, v_c0);
  }
};

// A consumer of warpgroup kw under PRODUCER traits before tile t (`valid` of its keys
// in range): the tile (HALVES: the warpgroup's half) landed in its buffer; the last
// one's V rows past the keys zeroed and published (the condition is the block's, or
// the warpgroup's: named barrier 2 + kw), no barrier otherwise.
template <class KT>
__device__ __forceinline__ void await_produced(typename KT::Storage& st, u32 full, int t,
                                               int valid, int kw) {
  const int stage = t % KT::STAGES;
  if constexpr (KT::HALVES > 1) {
    mbarrier_wait(KT::full_bar(full, stage, kw), (t / KT::STAGES) & 1);
    const int end = (kw + 1) * KT::WARP_KEYS;
    if (valid < end) {   // (the other half may not have landed)
      zero_v_tail<KT, 128>(st, stage, cmax(valid, kw * KT::WARP_KEYS), end, threadIdx.x % 128);
      named_barrier_sync(2 + kw, 128);
    }
  } else {
    mbarrier_wait(KT::full_bar(full, stage), (t / KT::STAGES) & 1);
    if (valid < KT::BLOCK_N) {
      zero_v_tail<KT>(st, stage, valid);
      consumers_sync<KT>();
    }
  }
}

// One block: ROWS packed rows of KV head hk (y), batch b (z), keys of split
// x % num_splits; x / num_splits is the row block.
// k_map, v_map: the caches' tensor maps (KT::TMA; ignored otherwise).
template <class KT, class VT>
__global__ void __launch_bounds__(KT::BLOCK_THREADS)
    decode_fwd(const DecodeParams dp, const __grid_constant__ TmaMap k_map,
               const __grid_constant__ TmaMap v_map) {
  constexpr int STAGES = KT::STAGES, BLOCK_N = KT::BLOCK_N;
  using Pages = typename KT::Pages;
  extern __shared__ __align__(16) unsigned char smem[];
  auto& st = *reinterpret_cast<typename KT::Storage*>(
      KT::TMA ? shared_ptr<unsigned char>(smem, storage_base(smem)) : smem);

  if constexpr (KT::WGMMA && !KT::USE_WGMMA) {
    __trap();   // the host selects WGMMA traits on sm_90a only (use_wgmma)
    return;
  }
  // sm_90+: launched as the programmatic dependent of the kernel before it (the host's
  // DecodeLaunch), so nothing is read or written before that kernel has finished;
  // and the merge of the splits, its own dependent, may be scheduled from here.
  grid_dependency_wait();
  launch_dependents();
  const int b = blockIdx.z, hk = blockIdx.y;
  const int row_block = blockIdx.x / dp.num_splits, split = blockIdx.x % dp.num_splits;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // (WGMMA: a warpgroup's four warps are its four row warps, one key warp's keys)
  const int rw = KT::WGMMA ? warp % 4 : warp / KT::KEY_WARPS;
  const int kw = KT::WGMMA ? warp / 4 : warp % KT::KEY_WARPS;

  // The sequence's own problem: its length, the band aligned to it.
  FwdParams p = dp.fwd;
  const int seqlen = Pages::seqlen(dp.fwd, dp.cache, b);
  p.band_lo += seqlen;
  p.band_hi += seqlen;
  p.seqlen_k = seqlen;
  const DecodeRows<KT> rows(p, row_block, hk, rw, lane);
  const int i_first = rows.r0 / p.group, i_last = rows.r_last / p.group;

  int kv_lo, kv_hi;
  key_range<KT, VT>(dp, p, split, seqlen, i_first, i_last, kv_lo, kv_hi);
  p.seqlen_k = kv_hi;   // keys at or past kv_hi belong to the next split: masked by keep
  const int n_tiles = ceil_div(kv_hi - kv_lo, BLOCK_N);

  // Tile t goes to ring buffer t % STAGES, its page ids to slot t % Pages::SLOTS; the
  // commit group of tile t also carries the ids of tile t + STAGES - 1 (empty groups
  // past the end keep the count uniform). Paged: the first STAGES - 1 tiles' ids first.
  auto ids_of = [&](int t) {
    if (!KT::PRODUCER && t < n_tiles)   // (the producer warpgroup reads the table itself)
      Pages::fetch(st.ids, dp.cache, b, t % Pages::SLOTS, kv_lo + t * BLOCK_N, kv_hi);
  };
  // Without TMA traits, paged caches on sm_90 copy aligned rows of 256 bytes or more
  // with the copy engine (load_kv_bulk) where cp.async would take each thread 16 copies
  // or more per tile; elsewhere cp.async. H100, bf16, Hq/Hkv 32/8, B = 8, Sk = 8k, page
  // 16, TB/s: D = 256 2.16 -> 2.59, D = 128 2.48 -> 2.52; contiguous caches gained
  // nothing and 64-row tiles (8 cp.async per thread) lost 1.76 -> 1.61 (notes-decode.md).
#if __CUDA_ARCH__ >= 900
  constexpr bool TMA = KT::MAPS;
  constexpr bool BULK = KT::ROW_COPIES && KT::ROW_COPY_SHAPE;
#else
  constexpr bool BULK = false, TMA = false;   // TMA traits: cp.async into the same layout
#endif
  const u32 full = smem_addr(&st.full[0]);
  constexpr u32 STAGE_BYTES = KT::STAGE_BYTES;
  auto issue = [&](int t) {
    if (t < n_tiles) {
      if constexpr (TMA) {
        // (the warp index through a shuffle, so that ptxas keeps the copies' coordinates
        // in uniform registers)
        const int issuer = KT::ISSUERS == 1 ? 0 : __shfl_sync(0xffffffffu, warp, 0);
        if (KT::ISSUERS == 1 ? threadIdx.x == 0 : lane == 0) {
          fence_proxy_async();   // this thread's reads of the buffer come first
          load_kv_tma<KT>(smem_addr(&st.ring.k[0][0]) + (t % STAGES) * STAGE_BYTES,
                          smem_addr(&st.ring.v[0][0]) + (t % STAGES) * STAGE_BYTES, k_map, v_map,
                          st.ids, dp.cache, b, hk, t % Pages::SLOTS, kv_lo + t * BLOCK_N, kv_hi,
                          KT::full_bar(full, t % STAGES), issuer);
        }
      } else if constexpr (BULK)
        load_kv_bulk<KT>(st, p, dp.cache, b, hk, t % STAGES, t % Pages::SLOTS,
                         kv_lo + t * BLOCK_N, kv_hi, KT::full_bar(full, t % STAGES));
      else
        load_kv<KT>(st, p, dp.cache, b, hk, t % STAGES, t % Pages::SLOTS, kv_lo + t * BLOCK_N,
                    kv_hi);
    }
    ids_of(t + STAGES - 1);
    cp_async_commit();
  };
  init_ring<KT, BULK, TMA>(st, full);
  if constexpr (Pages::kPaged && !KT::PRODUCER) {
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) ids_of(t);
    cp_async_commit();
  }
  if constexpr (Pages::kPaged || BULK || TMA) {
    cp_async_wait<0>();
    __syncthreads();   // the first tiles' page ids are in; the mbarriers are initialized
  }
  if constexpr (KT::PRODUCER) {
    if (produced<KT>(st, k_map, v_map, dp.cache, b, hk, kv_lo, kv_hi, n_tiles, full, warp, lane))
      return;
  } else {
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) issue(t);
  }
  // Q's loads wait for their data; the first tiles' copies are in flight by then
  // (the loop's first barrier publishes Q)
  load_q<KT>(st, p, rows, b, hk);

  FragSoftmax<KT::N_TILES> sm;
  sm.init();
  float acc[KT::D_TILES * 4];
#pragma unroll
  for (int x = 0; x < KT::D_TILES * 4; ++x) acc[x] = 0.f;
  u32 qf[KT::Q_IN_REGS ? KT::QK_STEPS : 1][4];
  const ConsumerLanes<KT> at(st, rw, kw, lane);

  if constexpr (KT::PRODUCER) consumers_sync<KT>();   // Q visible
  for (int t = 0; t < n_tiles; ++t) {
    if constexpr (KT::PRODUCER) {
      await_produced<KT>(st, full, t, kv_hi - (kv_lo + t * BLOCK_N), kw);
    } else {
      cp_async_wait<STAGES - 2>();
      if constexpr (BULK || TMA) mbarrier_wait(KT::full_bar(full, t % STAGES), (t / STAGES) & 1);
      if constexpr (TMA) zero_v_tail<KT>(st, t % STAGES, kv_hi - (kv_lo + t * BLOCK_N));
      // gathered tiles: this thread's cp.async writes (generic proxy) before wgmma's reads
      if constexpr (KT::USE_WGMMA && !TMA) fence_proxy_async();
      __syncthreads();   // tile t (and Q) visible; every warp is done with tile t - 1
      issue(t + STAGES - 1);
    }
    if constexpr (KT::Q_IN_REGS) {
      if (t == 0) {
#pragma unroll
        for (int ks = 0; ks < KT::QK_STEPS; ++ks) ldmatrix_x4(qf[ks], at.q + ks * 32);
      }
    }
    const int k0 = kv_lo + t * BLOCK_N + at.key0;
    const bool partial = VT::partial(p, i_first, i_last, k0, k0 + KT::WARP_KEYS - 1);
    const u32 buf = (t % STAGES) * STAGE_BYTES;
    consume_tile<KT, VT>(p, rows, qf, at.q, at.k + buf, at.k_key, at.v + buf, at.v_key, b, k0,
                         partial, lane, sm, acc);
    if constexpr (KT::PRODUCER) {   // this warp is done with the buffer
      __syncwarp();
      if (lane == 0) mbarrier_arrive(KT::empty_bar(full, t % STAGES, KT::HALVES > 1 ? kw : 0));
    }
  }

  cp_async_wait<0>();
  consumers_sync<KT>();
  store<KT>(st, dp, p, rows, b, hk, split, rw, kw, lane, sm, acc);
}
