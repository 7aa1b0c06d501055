// Where key j of a sequence lives in a KV cache: contiguous, or paged through a
// block table (vLLM / FlashInfer / flash_attn_with_kvcache conventions).
//
// Layouts (strides in elements, the last dimension contiguous; the k_* and v_*
// strides of FwdParams, so one cache can be read by any family that takes them):
//   contiguous  k, v [B, Sk_max, Hkv, D] (or [B, Hkv, Sk_max, D]): key j of
//               sequence b, KV head hk at
//                 b * k_batch_stride + hk * k_head_stride + j * k_row_stride
//   paged       k, v [num_pages, page_size, Hkv, D], block_table int32
//               [B, max_pages]: key j of sequence b lies in page
//               block_table[b][j / page_size], row j % page_size, so
//                 page * k_batch_stride + hk * k_head_stride + (j % page_size) * k_row_stride
//               (k_batch_stride is the page stride). Any page size >= 1.
// Sequence b holds seqlens[b] keys; with seqlens null every sequence holds
// p.seqlen_k. Callers address rows below that length only, so block-table entries
// past a sequence's last page are never read and may hold anything (-1, stale ids).
// The host checks page ids where the table is on the host; a device table is
// trusted (an id out of range reads out of bounds, as in every paged kernel).
#pragma once
#include "copy.cuh"
#include "params.cuh"
#include "tma.cuh"

struct CacheParams {
  const i32* block_table;   // [B, max_pages], row stride block_table_stride; null: contiguous
  const i32* seqlens;       // [B] keys held by each sequence; null: p.seqlen_k for all
  i64 block_table_stride;
  i32 page_size;
  i32 max_pages;
  u32 page_magic;           // Divisor's m and s for page_size (the host's)
  i32 page_shift;
  // j / page_size and j % page_size by a multiply-high where a division took ~20
  // instructions per key row (paged only).
  __device__ __forceinline__ Divisor pages() const {
    return Divisor(page_size, page_magic, page_shift);
  }
};

// Element offsets of one key row (one KV head) in k and in v.
struct KVRow {
  i64 k, v;
};

template <bool PAGED>
struct KVCache {
  static constexpr bool kPaged = PAGED;

  __device__ __forceinline__ static int seqlen(const FwdParams& p, const CacheParams& c, int b) {
    return c.seqlens != nullptr ? c.seqlens[b] : p.seqlen_k;
  }
  // The page (or batch row) and the row in it of key j (< seqlen) of sequence b.
  // One block-table read when paged.
  __device__ __forceinline__ static void locate(const CacheParams& c, int b, int j, i64& page,
                                                i64& row) {
    if constexpr (PAGED) {
      const Divisor pages = c.pages();
      const int pj = pages.div(j);   // (pages.mod would divide again: +8 SASS in append_kv)
      page = c.block_table[b * c.block_table_stride + pj];
      row = j - pj * c.page_size;
    } else {
      page = b;
      row = j;
    }
  }
  // Key j of sequence b, KV head hk, in caches strided as p.k / p.v.
  __device__ __forceinline__ static KVRow row(const FwdParams& p, const CacheParams& c, int b,
                                              int hk, int j) {
    i64 page, r;
    locate(c, b, j, page, r);
    return {page * p.k_batch_stride + hk * p.k_head_stride + r * p.k_row_stride,
            page * p.v_batch_stride + hk * p.v_head_stride + r * p.v_row_stride};
  }
};

// The page ids of a kernel's key tiles in shared memory, so that no copy of a key row
// waits on a dependent block-table load: `fetch` issues one 4-byte cp.async per key
// of a tile (the caller commits it with an earlier tile's copies), `row` then locates
// key row x of the tile from shared memory. SLOTS tiles' ids are live at once: with
// the ids of tile t + STAGES - 1 fetched beside tile t's copies, the ring of STAGES
// tiles needs 2 (STAGES - 1) slots. Contiguous caches keep nothing and fetch nothing.
template <bool PAGED, int BLOCK_N, int STAGES>
struct PageRing {
  static constexpr bool kPaged = PAGED;
  static constexpr int SLOTS = PAGED ? 2 * (STAGES - 1) : 1;
  struct Ids {
    i32 id[PAGED ? SLOTS * BLOCK_N : 1];
  };
  __device__ __forceinline__ static int seqlen(const FwdParams& p, const CacheParams& c, int b) {
    return KVCache<PAGED>::seqlen(p, c, b);
  }
  // The page ids of keys [j0, j0 + BLOCK_N) below kv_hi into `slot` (zeros past it).
  __device__ __forceinline__ static void fetch(Ids& ids, const CacheParams& c, int b, int slot,
                                               int j0, int kv_hi) {
    if constexpr (PAGED) {
      const i32* table = c.block_table + b * c.block_table_stride;
      const Divisor pages = c.pages();
      for (int x = threadIdx.x; x < BLOCK_N; x += blockDim.x) {
        const int j = j0 + x;
        const bool ok = j < kv_hi;
        cp_async_4(smem_addr(&ids.id[slot * BLOCK_N + x]), ok ? table + pages.div(j) : table,
                   ok);
      }
    }
  }
  // Key j (row x of its tile, ids in `slot`) of sequence b, KV head hk.
  __device__ __forceinline__ static KVRow row(const Ids& ids, const FwdParams& p,
                                              const CacheParams& c, int b, int hk, int slot,
                                              int x, int j) {
    if constexpr (PAGED) {
      const i64 page = ids.id[slot * BLOCK_N + x], r = c.pages().mod(j);
      return {page * p.k_batch_stride + hk * p.k_head_stride + r * p.k_row_stride,
              page * p.v_batch_stride + hk * p.v_head_stride + r * p.v_row_stride};
    } else {
      return KVCache<false>::row(p, c, b, hk, j);
    }
  }
};

// Tiles of a KV cache through the copy engine (sm_90a), for a kernel whose tiles are
// SwizzledTiles (wgmma.cuh) of 64-column blocks: the rank-4 maps over the cache are
// (D, rows, Hkv, pages) for a paged cache, (D, Sk_max, Hkv, B) for a contiguous one.
// Boxes are 64 columns x BOX rows (BOX a multiple of 16 that divides the page size: a
// box never crosses a page; each box is one copy instruction, so BOX is as large as
// the pages allow) and, for exact tails, 16 rows (`rows16`) and 1, 2, 4 and 8 rows
// (`rows[i]`: 2^i rows), all five one kernel parameter.
struct CacheRowMaps {
  TmaMap rows16;   // 16 rows
  TmaMap rows[4];  // 2^i rows
};

template <int BLOCKS, bool PAGED>
struct CacheTiles {
  // 64-column block blk of a box of map `map` at (row, hk, page) into the tile's rows
  // from `at`.
  __device__ __forceinline__ static void box(u32 dst, u32 block_bytes, const TmaMap& map, int blk,
                                             int at, int row, int hk, int page, u32 bar) {
    tma_load_4d(dst + blk * block_bytes + at * 128, map, blk * 64, row, hk, page, bar);
  }
  // Keys [j0, j0 + rows) of sequence b (n keys), KV head hk, into the tile at `dst`
  // (its 64-column blocks `block_bytes` apart), completing rows * 128 * BLOCKS bytes
  // on `bar` (the caller announces them): boxes of `box` rows at their pages; boxes
  // wholly past n arrive as zeros (outside the map: row -box), the box that holds key
  // n - 1 holds the cache's rows past the sequence (K: masked scores are selected,
  // never multiplied). EXACT (V, whose rows P multiplies): that box too holds only the
  // sequence's rows and zeros, from boxes of 16, 8, 4, 2 and 1 rows, so no row of the
  // cache past a sequence's end (which may hold anything, NaN included) reaches the
  // tile. Every box lands at its own rows of the tile, where the swizzle of the whole
  // tile puts them (the copy engine swizzles by shared address). LANES threads (a
  // warp's lanes, or one thread) call it together, each issuing every LANES-th
  // (box, 64-column block).
  template <bool EXACT, int LANES>
  __device__ __forceinline__ static void load(u32 dst, u32 block_bytes, const TmaMap& map,
                                              const CacheRowMaps& exact, const CacheParams& c,
                                              int b, int hk, int j0, int rows, int box_rows, int n,
                                              u32 bar) {
    constexpr int STEP = LANES / BLOCKS > 0 ? LANES / BLOCKS : 1;  // boxes a round
    const int lane = LANES == 1 ? 0 : threadIdx.x % 32;
    if (LANES > 1 && lane >= STEP * BLOCKS) return;
    const int blk = LANES == 1 ? 0 : lane % BLOCKS;
    for (int x = (LANES == 1 ? 0 : lane / BLOCKS) * box_rows; x < rows; x += STEP * box_rows) {
      const int j = j0 + x, real = n - j;
      i64 page = 0, row = -box_rows;  // keys past the sequence: a box outside the map
      if (real > 0) KVCache<PAGED>::locate(c, b, j, page, row);
#pragma unroll
      for (int k = (LANES == 1 ? 0 : blk); k < (LANES == 1 ? BLOCKS : blk + 1); ++k) {
        if (!EXACT || real <= 0 || real >= box_rows) {
          box(dst, block_bytes, map, k, x, row, hk, page, bar);
          continue;
        }
        // 16 rows at a time: real ones, zeros, and in the one that holds both the real
        // rows as boxes of 8, 4, 2 and 1, then the zeros
        for (int at = 0; at < box_rows; at += 16) {
          const int r = cmin(cmax(real - at, 0), 16);
          if (r == 16 || r == 0) {
            box(dst, block_bytes, exact.rows16, k, x + at, r ? row + at : -16, hk, page, bar);
            continue;
          }
          int in = 0;
#pragma unroll
          for (int i = 3; i >= 0; --i) {
            if (r & (1 << i)) {
              box(dst, block_bytes, exact.rows[i], k, x + at + in, row + at + in, hk, page, bar);
              in += 1 << i;
            }
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if ((16 - r) & (1 << i)) {
              box(dst, block_bytes, exact.rows[i], k, x + at + in, -(1 << i), hk, page, bar);
              in += 1 << i;
            }
          }
        }
      }
    }
  }
};

// Tiles of a paged cache gathered row by row (sm_80+ cp.async; any page size), for a
// kernel whose tiles lay 16-byte chunks out as `Tile::offset(row, chunk)` (a
// SwizzledTile): THREADS threads share a tile. First `locate` puts the offset of
// each of its ROWS key rows into shared memory (`offsets`, 16-byte aligned, one u32 a
// row: the row's element offset / 8 in k and v, whose page, head and row strides are
// equal and multiples of 8; 0 past the sequence), one block-table read a row; after
// the caller's barrier `copy` issues the tile's 16-byte chunks, THREADS side by side,
// and commits them as one group. Rows past the sequence (`valid` on) and columns
// D..D_K arrive as zeros (cp.async's zero fill), so no cache row past a sequence
// reaches a tile.
// How THREADS threads share the copies of a tile's ROWS rows of CHUNKS 16-byte chunks
// (SLOTS chunk slots a tile row holds): a row's chunks over a power-of-two count of
// lanes, CPL chunks a lane LANES apart. Thread tid keeps chunk columns tid % LANES +
// LANES k (k < SLABS: those that reach into the row) of rows tid / LANES + i STEP
// (i < ROUNDS), one row address for its chunks of a row. CPL is the most (a power of
// two up to CPL_MAX) that leaves at least MIN_LANES lanes a row (16 MIN_LANES bytes of
// it a copy instruction), whole rounds of rows, and chunks LANES k wholly inside or
// wholly past the slots. (GatherTiles; decode.cu's load_kv.)
__host__ __device__ constexpr int chunks_per_lane(int c, int min_lanes, int lanes_all,
                                                  int rows, int threads, int slots) {
  return c <= 1 ? 1
         : lanes_all / c >= min_lanes && rows % (threads / (lanes_all / c)) == 0 &&
                 (lanes_all / c <= 8 || lanes_all <= slots)
             ? c
             : chunks_per_lane(c / 2, min_lanes, lanes_all, rows, threads, slots);
}

template <int CHUNKS, int ROWS, int THREADS, int SLOTS, int CPL_MAX, int MIN_LANES>
struct ChunkColumns {
  static constexpr int LANES_ALL = CHUNKS <= 8 ? 8 : CHUNKS <= 16 ? 16 : CHUNKS <= 32 ? 32 : 64;
  static constexpr int CPL = chunks_per_lane(CPL_MAX, MIN_LANES, LANES_ALL, ROWS, THREADS, SLOTS);
  static constexpr int LANES = LANES_ALL / CPL;
  static constexpr int STEP = THREADS / LANES;
  static constexpr int ROUNDS = ROWS / STEP;
  static constexpr int SLABS = cmin(CPL, CeilDiv<CHUNKS, LANES>::value);
  static_assert(THREADS % LANES == 0 && ROWS % STEP == 0,
                "chunk columns: a tile's rows in whole rounds of the threads");
  // In a SwizzledTile, the chunk dr rows below the one at `at` (dr a multiple of STEP,
  // a row x0 < STEP: both powers of two, so row x0 + dr swizzles as x0 ^ dr): dr rows on,
  // the chunk bits XORed by dr % 8 (an immediate and at most one constant XOR).
  __device__ __forceinline__ static u32 rows_below(u32 at, int dr) {
    return (at + dr * 128) ^ u32((dr % 8) << 4);
  }
};

template <class Tile, int ROWS, int D, int D_K, int THREADS, int BATCH, int CPL_MAX,
          int MIN_LANES>
struct GatherTiles {
  static constexpr int CHUNKS = D_K / 8;   // 16-byte chunks of a tile row
  // The chunk slots of the tile's 64-column blocks (a block's rows are 128 bytes,
  // whatever part of it D_K fills)
  static constexpr int BLOCK_CHUNKS = CeilDiv<D_K, 64>::value * 8;
  // The tile's chunk columns (ChunkColumns); the rows' offsets are stored side by
  // side (row x at (x % STEP) ROUNDS + x / STEP), GROUP to a load (four, or two or one
  // where ROUNDS is not a multiple of four). Lanes past the row's chunks zero-fill the
  // block's unused slots, or (past BLOCK_CHUNKS, with one chunk a lane) copy nothing;
  // a lane's chunks LANES k past the row's (never read: Q K^T's k16 steps and P V's N
  // stop at D_K) are not copied. Against one chunk a thread in turn, power-of-two lanes
  // took chunked prefill at D = 80-192 from 1.12x to 1.92x as fast (H200,
  // notes-decode.md section 37); several chunks a lane (8 lanes a row: two chunks a
  // lane at D = 72-128, four above) another 1.03-1.04x at D = 96 and 128, 1.11-1.15x at
  // D = 160-256; 4 lanes a row (four chunks) ran 0.95-1.02x of one chunk a lane at D =
  // 96 and 128 (section 38).
  using Cols = ChunkColumns<CHUNKS, ROWS, THREADS, BLOCK_CHUNKS, CPL_MAX, MIN_LANES>;
  static constexpr int LANES = Cols::LANES, STEP = Cols::STEP, ROUNDS = Cols::ROUNDS,
                       SLABS = Cols::SLABS;
  static constexpr int GROUP = ROUNDS % 4 == 0 ? 4 : ROUNDS % 2 == 0 ? 2 : 1;
  __device__ __forceinline__ static int slot(int x) { return (x % STEP) * ROUNDS + x / STEP; }
  // The copies of rounds [0, ROUNDS) of a thread (copy), in batches of B rounds: the
  // batch's offsets loaded, then its copies issued (BATCH 0: a load's GROUP at a time),
  // SLABS a row from one row address. WHOLE: every row of the tile is held, so a copy's
  // predicate is the lane's column alone (col_ok[k]), not a compare per row.
  static constexpr int B = BATCH == 0 ? GROUP : BATCH < ROUNDS ? BATCH : ROUNDS;
  static_assert(B % GROUP == 0, "GatherTiles: a batch of whole offset loads");
  template <bool WHOLE>
  __device__ __forceinline__ static void issue(const u32 (&dst)[SLABS], const char* src,
                                               const u32* mine, const int (&rows)[SLABS],
                                               const bool (&col_ok)[SLABS]) {
#pragma unroll
    for (int b0 = 0; b0 < ROUNDS; b0 += B) {
      u32 off[B];
#pragma unroll
      for (int q = 0; q < B; q += GROUP) {
        if (b0 + q < ROUNDS) load_group(off + q, mine + b0 + q);
      }
#pragma unroll
      for (int i = 0; i < B; ++i) {
        const int dr = (b0 + i) * STEP;
        if (b0 + i < ROUNDS) {
          const char* row = src + (u64(off[i]) << 4);
#pragma unroll
          for (int k = 0; k < SLABS; ++k) {
            cp_async_16(Cols::rows_below(dst[k], dr), row + LANES * k * 16,
                        WHOLE ? col_ok[k] : dr < rows[k]);
          }
        }
      }
    }
  }
  // GROUP offsets from shared memory in one load
  __device__ __forceinline__ static void load_group(u32* off, const u32* at) {
    if constexpr (GROUP == 4) {
      const uint4 o = *reinterpret_cast<const uint4*>(at);
      off[0] = o.x, off[1] = o.y, off[2] = o.z, off[3] = o.w;
    } else if constexpr (GROUP == 2) {
      const uint2 o = *reinterpret_cast<const uint2*>(at);
      off[0] = o.x, off[1] = o.y;
    } else {
      off[0] = *at;
    }
  }
  // TWO_STEP: through fetch and place (the form GatheredKV's prefetching builds were
  // timed with; the others keep this loop, whose SASS they had before).
  template <bool TWO_STEP = false>
  __device__ __forceinline__ static void locate(u32* offsets, const FwdParams& p,
                                                const CacheParams& c, int b, int j0, int n,
                                                int tid) {
    if constexpr (TWO_STEP) {
      Ahead a;
      fetch(a, c, b, j0, n, tid);
      place(offsets, a, p, c, j0, tid);
      return;
    }
    for (int x = tid; x < ROWS; x += THREADS) {
      const int j = j0 + x;
      // KV head 0: the caller's pointer holds the head's offset
      offsets[slot(x)] = j < n ? u32(KVCache<true>::row(p, c, b, 0, j).k >> 3) : 0u;
    }
  }
  // `locate` in two steps, so that the block table's latency can be kept off the way to
  // a tile's copies: `fetch` loads the table entries of a thread's rows (x = tid +
  // i THREADS) into registers (a tile ahead), `place` stores their offsets as `locate`
  // does. (Builds that do not fetch ahead keep `locate`'s loop: through these two they
  // ran 0.98-0.99x at D = 112 and 256, H200.)
  static constexpr int PER_THREAD = (ROWS + THREADS - 1) / THREADS;
  struct Ahead {
    int page[PER_THREAD];  // -1: past the sequence
  };
  __device__ __forceinline__ static void fetch(Ahead& a, const CacheParams& c, int b, int j0,
                                               int n, int tid) {
    const Divisor pages = c.pages();
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
      const int x = tid + i * THREADS, j = j0 + x;
      a.page[i] = x < ROWS && j < n ? c.block_table[b * c.block_table_stride + pages.div(j)]
                                    : -1;
    }
  }
  __device__ __forceinline__ static void place(u32* offsets, const Ahead& a,
                                               const FwdParams& p, const CacheParams& c,
                                               int j0, int tid) {
    const Divisor pages = c.pages();
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
      const int x = tid + i * THREADS, j = j0 + x;
      if (x < ROWS) {
        const i64 row = j - pages.div(j) * c.page_size;
        offsets[slot(x)] = a.page[i] >= 0 ? u32((i64(a.page[i]) * p.k_batch_stride +
                                                 row * p.k_row_stride) >> 3) : 0u;
      }
    }
  }
  // The rows located into `offsets` of the head at `head` (k or v plus the head's
  // offset) into the tile at shared address `dst`, rows from `valid` on as zeros.
  template <class T>
  __device__ __forceinline__ static void copy(u32 dst, const T* head, const u32* offsets,
                                              int valid, int tid) {
    const char* bytes = reinterpret_cast<const char*>(head);
    // Thread tid copies chunks ch + LANES k of rows x0 + i STEP: its sources and
    // destinations computed once (Cols::rows_below steps a destination down the rows;
    // chunk ch + LANES k is SwizzledTile::at's constant step from chunk ch).
    const int ch = tid % LANES, x0 = tid / LANES;
    if (LANES > BLOCK_CHUNKS && ch >= BLOCK_CHUNKS) {
      cp_async_commit();
      return;
    }
    // the lane's source in a register, so that a row's address is one multiply-add
    // of its offset (the compiler would rebuild it from element offsets: three)
    const char* src;
    asm("mov.b64 %0, %1;" : "=l"(src) : "l"(bytes + ch * 16));
    const u32 lane_dst = dst + Tile::offset(x0, ch);
    u32 dsts[SLABS];    // chunk ch + LANES k of row x0
    bool col_ok[SLABS];
    int rows[SLABS];    // row x0 + dr of chunk ch + LANES k is copied where dr < rows[k]
#pragma unroll
    for (int k = 0; k < SLABS; ++k) {
      dsts[k] = Tile::at(lane_dst, 0, LANES * k);
      col_ok[k] = (D == D_K && LANES * (k + 1) <= CHUNKS) || ch + LANES * k < D / 8;
      rows[k] = col_ok[k] ? valid - x0 : 0;
    }
    // Whole tiles without a compare per row: 1.00-1.03x at D = 64-112, 1.03-1.04x at
    // D = 144-192 (H200, notes-decode.md section 37)
    const u32* mine = offsets + x0 * ROUNDS;
    if (valid >= ROWS) {
      issue<true>(dsts, src, mine, rows, col_ok);
    } else {
      issue<false>(dsts, src, mine, rows, col_ok);
    }
    cp_async_commit();
  }
};
