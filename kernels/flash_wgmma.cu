// flash_wgmma: fused attention forward on Hopper tensor cores (wgmma), sm_90a only;
// fp16/bf16 in, fp32 accumulate. FlashAttention-3's structure; docs/architecture.md
// tells the design, docs/kernels.md the measurements behind it.
//
// Layouts: common/params.cuh; shared-memory tiles and wgmma facts: common/wgmma.cuh;
// the variant (band, logits): common/variant.cuh.
// A persistent block (one per SM) is four roles:
//   TileScheduler  which work tile (BLOCK_M query rows of one head and batch) the
//                  block takes next: claimed from a counter in global memory, the
//                  heaviest causal tiles first; each tile's key range comes from
//                  the variant (kv_begin, kv_end); packed sequences' virtual blocks
//                  (common/seqs.cuh).
//   Producer       warpgroup 0, one thread (a KV cache: one warp, or the warpgroup
//                  when it gathers rows): per work tile the first K tile, each
//                  consumer's 64 rows of Q, then K_j and V_{j-1} tile after tile into
//                  STAGES shared buffers each, from a K/V source: the tensor maps of k
//                  and v (TiledKV), a contiguous or paged cache in tensor-map boxes
//                  (CachedKV, the kernel flash_wgmma_cache_fwd), or a paged cache's
//                  rows gathered with cp.async (GatheredKV, flash_wgmma_gather_fwd).
//                  It keeps 32-40 registers (setmaxnreg.dec).
//   Consumer       warpgroups 1..CONSUMERS (1 to 3; setmaxnreg.inc), 64 query rows
//                  each (one wgmma M tile); a warp owns 16 rows end to end, so
//                  softmax statistics never leave the warp. Per key tile j (step):
//                    wait for K_j and V_{j-1}; wait for the turn
//                    issue S_j = Q K_j^T      wgmma, A = Q and B = K from shared memory
//                    issue acc += P_{j-1} V_{j-1}   A = P from registers, B = V (MN-major)
//                    pass the turn; wait for S_j; release K_j
//                    softmax of tile j (FragSoftmax, common/softmax.cuh) while P V runs
//                    wait for P V; release V_{j-1}; rescale acc; P_j to 16-bit fragments
//                    (dropout: the dropped halves cleared, VT::Drop::fragment_packed)
//                  One named "turn" barrier per consumer keeps them in a round robin
//                  (FA3's ping-pong, generalized): a softmax runs while the other
//                  warpgroups' MMAs keep the tensor cores busy. Under a band a
//                  consumer computes only the key tiles its own 64 rows see
//                  (own_keys) and idles through the other turns (idle_turn).
//   Epilogue       acc / l_i (times 1 / (1 - p) under dropout) stored from registers
//                  (16 bytes a thread after a transpose in the quad), and the LSE.
// Buffers change hands through mbarriers (Storage): full_k[i] completes when a K
// tile's bytes have landed (the copy engine counts them), empty_k[i] when every
// consumer warp is done reading it; the same for V, and q_full[c], q_empty[c] for
// consumer c's rows of Q. Both sides step through the buffers with a PipelineState
// per tile loaded or consumed. Nothing waits for the whole block.
//
// Softmax: the scale is folded into the exp2's FFMA on tiles that need no mask; the
// row max is lazy (FA4's conditional rescaling: m_i moves only when a tile's max
// exceeds it by more than 8) and, once a row has a reference m_i, dropped entirely
// (FragSoftmax::fast: the row sums prove every p <= 256). Masked tiles go through the
// variant (Scores<VT>::map): scores selected to -inf before a max, or p to 0 after
// the exp2 (causal diagonal tiles on the fast path).
//
// Constraints: D % 8 == 0 and D <= 256; 16-byte aligned base pointers and strides,
// and Q, K and V rows that are not all one row (a row stride of 0 has no tensor
// map); the host runs flash_mma otherwise. Q K^T steps over D_K = D rounded up to 16
// (columns D..D_K zero-filled), P V computes exactly D columns (wgmma's N is any
// multiple of 8). Shared rows are 64-column blocks (SwizzledTile), so the tiles take
// D rounded up to 64 columns. Masked scores are selected, never multiplied; a NaN in
// a masked V still reaches the product (0 * NaN), as in flash_mma and FlashAttention.
#include "common/mma.cuh"
#include "common/paged.cuh"
#include "common/softmax.cuh"
#include "common/storage.cuh"
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
  // ALiBi's line per row (softmax_fast, VT::kLinearBias): a third copy of the score
  // loop, which spilled 8-76 bytes past D = 224 (D = 256; packed sequences from
  // D = 232; ptxas of CUDA 13).
  static constexpr bool LINE_BIAS = D <= 224;
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
  static constexpr int D_BLOCKS = CeilDiv<D_K, 64>::value;  // 64-column swizzle blocks
  using QTile = SwizzledTile<BLOCK_M, D_K>;
  using KVTile = SwizzledTile<BLOCK_N, D_K>;
  static constexpr int Q_SLICE_BYTES = D_BLOCKS * 64 * 128;  // one consumer's 64 rows of Q

  // Shared memory, placed at a 1024-byte boundary (storage_at): the tiles first,
  // each a whole number of 1024-byte swizzle atoms.
  struct Storage {
    unsigned char q[QTile::BYTES];
    unsigned char k[STAGES][KVTile::BYTES];
    unsigned char v[STAGES][KVTile::BYTES];
    float2 l_slot[128 * CONSUMERS];  // one per consumer thread (Consumer::step)
    int tile_slot[2][8];             // work tiles published by the producer (TileSlot)
    u64 q_full[CONSUMERS], q_empty[CONSUMERS];
    u64 full_k[STAGES], full_v[STAGES], empty_k[STAGES], empty_v[STAGES];
  };
  static constexpr int SMEM_BYTES = sizeof(Storage) + SMEM_SLACK;

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit inputs");
  static_assert(D % 8 == 0 && D <= 256, "16-byte copies need D % 8 == 0; D <= 256");
  static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256,
                "S = Q K^T is one wgmma m64n{BLOCK_N}; P V steps over BLOCK_N in k16");
  static_assert(CONSUMERS >= 1 && CONSUMERS <= 3, "one to three consumer warpgroups");
  static_assert(CONSUMER_REGS >= LAUNCH_REGS && LAUNCH_REGS >= PRODUCER_REGS,
                "too many blocks per SM for the register file");
  static_assert(QTile::BYTES % 1024 == 0 && KVTile::BYTES % 1024 == 0,
                "tiles stay on the 1024-byte boundaries of the swizzle");
};

// Named barriers (bar.sync ids): 0 is __syncthreads', 1..4 warpgroup_barrier's
// (1 + warpgroup), then one turn barrier per consumer.
enum WgmmaBarrier : int { kBarTurn0 = 5 };

extern __shared__ __align__(1024) unsigned char wgmma_smem[];

// The Storage fields' shared addresses from one 32-bit base (storage.cuh), and plain
// pointers for the few fields read or written by ordinary loads and stores.
template <class KT>
struct Smem {
  using S = typename KT::Storage;
  u32 base;
  __device__ __forceinline__ u32 q() const { return CA_FIELD(base, S, q); }
  __device__ __forceinline__ u32 k(int i) const { return CA_FIELD(base, S, k) + i * KT::KVTile::BYTES; }
  __device__ __forceinline__ u32 v(int i) const { return CA_FIELD(base, S, v) + i * KT::KVTile::BYTES; }
  __device__ __forceinline__ u32 q_full(int c) const { return CA_FIELD(base, S, q_full) + 8 * c; }
  __device__ __forceinline__ u32 q_empty(int c) const { return CA_FIELD(base, S, q_empty) + 8 * c; }
  __device__ __forceinline__ u32 full_k(int i) const { return CA_FIELD(base, S, full_k) + 8 * i; }
  __device__ __forceinline__ u32 full_v(int i) const { return CA_FIELD(base, S, full_v) + 8 * i; }
  __device__ __forceinline__ u32 empty_k(int i) const { return CA_FIELD(base, S, empty_k) + 8 * i; }
  __device__ __forceinline__ u32 empty_v(int i) const { return CA_FIELD(base, S, empty_v) + 8 * i; }
  __device__ __forceinline__ float2* l_slot() const {
    return shared_ptr<float2>(wgmma_smem, CA_FIELD(base, S, l_slot));
  }
  // Slot u % 2 of work tile u: [0] the tile (-1: no more), then for packed
  // sequences its block, head, batch entry and the sequence's extent (TileSlot).
  __device__ __forceinline__ int* tile_slot(int u) const {
    return shared_ptr<int>(wgmma_smem, CA_FIELD(base, S, tile_slot)) + 8 * (u & 1);
  }
  __device__ __forceinline__ const unsigned char* q_bytes() const {
    return shared_ptr<unsigned char>(wgmma_smem, q());
  }
};

// ---------------------------------------------------------------------------
// Tile scheduler

struct WorkTile {
  int m_block, h, b;
};

// What the producer publishes with a work tile (Storage::tile_slot): the tile, and
// for packed sequences what the consumers cannot compute cheaply (the search for
// its sequence, the sequence's extent); for KV caches the entry's key count.
struct TileSlot {
  template <class Seqs>
  __device__ __forceinline__ static void write(int* slot, int tile, const WorkTile& w,
                                               const typename Seqs::Extent& e) {
    slot[0] = tile;
    if constexpr (Seqs::kRagged) {
      slot[1] = w.m_block, slot[2] = w.h, slot[3] = w.b;
      slot[4] = e.q_start, slot[5] = e.k_start, slot[6] = e.seqlen_q, slot[7] = e.seqlen_k;
    } else if constexpr (Seqs::kCached) {
      slot[1] = e.seqlen_k;
    }
  }
  // Lane 0 reads for the warp (see Consumer::run).
  __device__ __forceinline__ static int read(const int* slot, int i) {
    return __shfl_sync(0xffffffffu, threadIdx.x % 32 == 0 ? slot[i] : 0, 0);
  }
};

// Work tiles: BLOCK_M query rows of one (head, batch). The query blocks of a head are
// consecutive, the heaviest first under a causal band (the last rows see the most
// keys), so the blocks running together share K and V in L2. Block x starts with
// tile x; after that each block's producer claims the next unclaimed tile from a
// counter in global memory (atomicAdd), so a block that drew light tiles takes more
// of them and the blocks finish together. Without a counter (a launch captured into
// a CUDA graph in a stream that had none yet) the blocks take fixed turns: round r
// gives block x tile rG + x, or rG + G - 1 - x in odd rounds. Block m starts at
// query row m * BLOCK_M - q_shift: with 0 < q_shift <= m_blocks * BLOCK_M - Sq (the
// host picks it, causal only; a multiple of 16 under dropout, whose keep mask comes
// in 16-row blocks) the partial block of a length that is not a multiple
// of BLOCK_M comes first, where the causal band leaves the fewest keys. Its rows
// before row 0 are zeros from the copy engine and never stored.
// Order: with section = 0, head after head; with section = G > 0 (the host's choice:
// how many heads' K and V fit in L2), the (head, batch) pairs go in sections of G,
// and inside a section block by block, each block for all G heads (FlashAttention-3's
// LPT order): tiles of one cost run together while those heads' K and V stay in L2.
// Packed sequences (RaggedSeqs): head after head, and in each head the virtual query
// blocks of every sequence (common/seqs.cuh), the last first under a causal band;
// section and q_shift are 0. Only the producer calls work() then (a search).
template <class KT, class VT>
struct TileScheduler {
  using Seqs = typename VT::Seqs;
  const FwdParams& p;
  u32* const counter;
  const int q_shift, section, m_blocks, tiles;

  __device__ __forceinline__ TileScheduler(const FwdParams& p_, u32* counter_, int q_shift_,
                                           int section_)
      : p(p_), counter(counter_), q_shift(q_shift_), section(section_),
        m_blocks(Seqs::kRagged ? RaggedSeqs::blocks(p_.seqlen_q, p_.batch, KT::BLOCK_M)
                               : ceil_div(p_.seqlen_q, KT::BLOCK_M)),
        tiles(m_blocks * p_.heads_q * (Seqs::kRagged ? 1 : p_.batch)) {}

  __device__ __forceinline__ WorkTile work(int tile) const {
    if constexpr (Seqs::kRagged) {
      const int v = tile % m_blocks;
      WorkTile w{0, tile / m_blocks, 0};
      RaggedSeqs::locate_thread(p.cu_seqlens_q, p.batch, KT::BLOCK_M,
                                VT::kCausal ? m_blocks - 1 - v : v, w.b, w.m_block);
      return w;
    }
    int m, hb;
    if (section > 0) {
      const int per = m_blocks * section, first = tile / per * section;
      const int heads = cmin(section, p.heads_q * p.batch - first), r = tile % per;
      m = r / heads;
      hb = first + r % heads;
    } else {
      m = tile % m_blocks;
      hb = tile / m_blocks;
    }
    return {VT::kCausal ? m_blocks - 1 - m : m, hb % p.heads_q, hb / p.heads_q};
  }
  // First query row of block m (negative rows: a shifted partial block).
  __device__ __forceinline__ int q0(int m_block) const { return m_block * KT::BLOCK_M - q_shift; }
  // The tile's key tiles [n_begin, n_begin + n_blocks): the variant's band of its rows
  // (p: the params bound to the tile's sequence).
  __device__ __forceinline__ static void keys(const FwdParams& p, int q0, int& n_begin,
                                              int& n_blocks) {
    const int q_last = cmin(q0 + KT::BLOCK_M, p.seqlen_q) - 1;
    n_begin = VT::kv_begin(p, cmax(q0, 0)) / KT::BLOCK_N;
    n_blocks = cmax(0, ceil_div(VT::kv_end(p, q_last), KT::BLOCK_N) - n_begin);
    if (Seqs::kRagged && q0 >= p.seqlen_q) n_blocks = 0;  // a sequence's spare block
  }
  // Under VT::kDiagonalFirst the key tiles go from the block of the work tile's last
  // diagonal key (its last row's key i + Sk - Sq, clipped to the tiles) back to
  // n_begin, then on from the diagonal: key tile j is block key_block(j, n_begin,
  // back) with back = diagonal(...) - n_begin; otherwise block n_begin + j (back = 0).
  __device__ __forceinline__ static int diagonal(const FwdParams& p, int q0, int n_begin,
                                                 int n_blocks) {
    if constexpr (!VT::kDiagonalFirst) return 0;
    return cmin(cmax((q0 + KT::BLOCK_M - 1 + p.seqlen_k - p.seqlen_q) / KT::BLOCK_N, n_begin),
                n_begin + n_blocks - 1) - n_begin;
  }
  __device__ __forceinline__ static int key_block(int j, int n_begin, int back) {
    if constexpr (!VT::kDiagonalFirst) return n_begin + j;
    return n_begin + (j <= back ? back - j : j);
  }
  __device__ __forceinline__ int first() const { return blockIdx.x; }
  __device__ __forceinline__ int claim() const {
    return counter ? int(atomicAdd(counter, 1u)) : 0;
  }
  // The tile after `done` tiles of this block, given its last claim. Claims 0, 1, ...
  // go to tiles G, G + 1, ...; each block's last claim is past the end, so there are
  // exactly `tiles` claims, and the last one resets the counter for the next launch
  // in this stream.
  __device__ __forceinline__ int next(int done, int claimed, bool leader = true) const {
    const int grid = gridDim.x, x = blockIdx.x;
    if (!counter) return done * grid + (done & 1 ? grid - 1 - x : x);
    if (leader && claimed == tiles - 1) atomicExch(counter, 0u);
    return claimed + grid;
  }
};

// ---------------------------------------------------------------------------
// K and V sources: where the producer's key tiles come from. A source gives a work
// tile's sequence extent (extent), its coordinates (tile), the copies of key tile
// [j0, j0 + BLOCK_N) of K or V into a buffer and their completion on its full
// mbarrier (load: the count-th K or V tile, is_v a constant at every call; the
// barrier expects kArrivals arrivals), and, for a cache, the address of one key row
// for the consumers' rare recompute (k_row; fixed and packed sequences address K from
// the params). kLanes threads of the producer warpgroup run it.
//   TiledKV     k and v through their tensor maps, one box of BLOCK_N rows per 64
//               columns (rows past the map arrive as zeros); fixed or packed
//               sequences. Thread 0.
//   CachedKV    a KV cache (CachedSeqs): boxes of as many rows as the pages allow at
//               the block table's pages (common/paged.cuh: CacheTiles), V's last
//               rows exact. Warp 0.
//   GatheredKV  a paged cache gathered row by row with cp.async (GatherTiles): any
//               page size, and pages too small for boxes to keep up (16 rows: 2 KB
//               boxes). The whole warpgroup.

template <class KT, class Seqs>
struct TiledKV {
  static constexpr int kLanes = 1;      // the producer: thread 0
  static constexpr int kArrivals = 1;   // its announcement of the bytes
  const TmaMap& k_map;
  const TmaMap& v_map;
  // Map coordinates: a broadcast (stride 0) head or batch axis is a map of size 1;
  // packed sequences are one batch entry, the sequence's rows from its first on.
  struct Tile {
    int k_h, k_b, v_h, v_b, row0;
  };
  __device__ __forceinline__ typename Seqs::Extent extent(const FwdParams& p,
                                                          const WorkTile& w) const {
    if constexpr (Seqs::kRagged) return Seqs::extent(p, w.b);
    return {};
  }
  __device__ __forceinline__ Tile tile(const FwdParams& p, const WorkTile& w,
                                       const typename Seqs::Extent& seq) const {
    const int h_kv = w.h / p.group;
    Tile t{p.k_head_stride ? h_kv : 0, p.k_batch_stride ? w.b : 0, p.v_head_stride ? h_kv : 0,
           p.v_batch_stride ? w.b : 0, 0};
    if constexpr (Seqs::kRagged) t.row0 = seq.k_start;
    return t;
  }
  __device__ __forceinline__ void load(bool is_v, const Tile& t, u32 dst, u32 bar, int j0,
                                       int) const {
    mbarrier_arrive_expect_tx(bar, KT::KVTile::BYTES);
    tma_load_blocks<KT::D_BLOCKS>(dst, KT::KVTile::BLOCK_BYTES, is_v ? v_map : k_map,
                                  t.row0 + j0, is_v ? t.v_h : t.k_h, is_v ? t.v_b : t.k_b, bar);
  }
  __device__ __forceinline__ void prepare(const Tile&, int, int) const {}
  __device__ __forceinline__ void prefetch(const Tile&, int) const {}
  __device__ __forceinline__ void settle() const {}
};

// What the cache sources share: a work tile's batch entry, KV head and key count, and
// key rows in global memory for the consumers.
template <class Seqs>
struct CacheSource {
  static_assert(Seqs::kCached, "a cache source reads a KV cache (CachedSeqs)");
  const CacheParams& cache;
  struct Tile {
    int b, hk, n;
  };
  __device__ __forceinline__ typename Seqs::Extent extent(const FwdParams& p,
                                                          const WorkTile& w) const {
    return {KVCache<Seqs::kPaged>::seqlen(p, cache, w.b)};
  }
  __device__ __forceinline__ Tile tile(const FwdParams& p, const WorkTile& w,
                                       const typename Seqs::Extent& seq) const {
    return {w.b, w.h / p.group, seq.seqlen_k};
  }
  // Key j, clipped to the sequence's last key (the block table past it may hold anything).
  template <class T>
  __device__ __forceinline__ const T* k_row(const FwdParams& p, const WorkTile& w, int j) const {
    const KVRow r = KVCache<Seqs::kPaged>::row(p, cache, w.b, w.h / p.group, cmin(j, p.seqlen_k - 1));
    return static_cast<const T*>(p.k) + r.k;
  }
  __device__ __forceinline__ void prepare(const Tile&, int, int) const {}
  __device__ __forceinline__ void prefetch(const Tile&, int) const {}
  __device__ __forceinline__ void settle() {}
};

template <class KT, class Seqs>
struct CachedKV : CacheSource<Seqs> {
  using Tiles = CacheTiles<KT::D_BLOCKS, Seqs::kPaged>;
  using typename CacheSource<Seqs>::Tile;
  // The producer: warp 0, its lanes issuing a tile's boxes side by side (with boxes of
  // 16 rows one thread issued 16 copies per K or V tile at D = 128)
  static constexpr int kLanes = 32;
  static constexpr int kArrivals = 1;  // lane 0's announcement of the bytes
  const TmaMap& k_map;  // boxes of box_rows rows
  const TmaMap& v_map;
  const CacheRowMaps& v_rows;  // V's boxes of 16, and of 1, 2, 4 and 8 rows
  const int box_rows;
  __device__ __forceinline__ void load(bool is_v, const Tile& t, u32 dst, u32 bar, int j0,
                                       int) const {
    if (threadIdx.x == 0) mbarrier_arrive_expect_tx(bar, KT::KVTile::BYTES);
    __syncwarp();  // the bytes are announced before any lands
    if (is_v)
      Tiles::template load<true, kLanes>(dst, KT::KVTile::BLOCK_BYTES, v_map, v_rows, this->cache,
                                         t.b, t.hk, j0, KT::BLOCK_N, box_rows, t.n, bar);
    else
      Tiles::template load<false, kLanes>(dst, KT::KVTile::BLOCK_BYTES, k_map, v_rows,
                                          this->cache, t.b, t.hk, j0, KT::BLOCK_N, box_rows, t.n,
                                          bar);
  }
};

// The producer warpgroup's 128 threads gather a K tile's rows: each locates one row
// (a block-table read) into shared memory ahead of the tile (prepare: one K tile
// ahead, so that the table's latency is off the copies' path), a barrier of the
// warpgroup when the tile's buffer is free, then all copy the tile's 16-byte chunks
// side by side (GatherTiles). A V tile is its K tile's rows one load later: it reuses
// their offsets (the ring keeps three K tiles': the offsets of K tile c are written
// after the barrier of tile c - 1, which every thread passes only after its copies of
// V tile c - 3). cp.async writes through the generic proxy and wgmma reads through the
// async one, so a thread arrives on a tile's full barrier (128 arrivals) once its
// copies landed and it ran the proxy fence: one tile behind, after issuing the next
// (settle: at once, before the producer waits on the consumers, which may need that
// tile first). Measured beside arrivals made by the copies themselves
// (cp.async.mbarrier.arrive, no fence), with and without a fence by the consumers after
// their wait: as fast or faster (H100, notes-decode.md section 13); against the latter
// again with this producer, 0.99-1.16x (H200, section 37).
// Chunks of a row a gathering thread copies from one row address, keeping at least
// kMinLanes lanes a row (GatherTiles' CPL_MAX and MIN_LANES; notes-decode.md section 38)
constexpr int kChunksPerLane = 4, kMinLanes = 8;

template <class KT, class Seqs>
struct GatheredKV : CacheSource<Seqs> {
  static_assert(Seqs::kPaged, "GatheredKV reads a paged cache");
  using T = typename KT::T;
  // Row offsets a producer thread loads before its copies: 16 in 40 registers (two
  // consumers; 1.02-1.07x at D = 128-256); with 32 registers (three) a load's four at a
  // time, where 8 ran 0.92-1.00x at D = 64-144 (H200, notes-decode.md section 37).
  using Rows = GatherTiles<typename KT::KVTile, KT::BLOCK_N, KT::D, KT::D_K, 128,
                           KT::PRODUCER_REGS >= 40 ? 16 : 0, kChunksPerLane, kMinLanes>;
  using typename CacheSource<Seqs>::Tile;
  static constexpr int kLanes = 128;
  static constexpr int kArrivals = 128;
  // Shared memory after the Storage (the kernel's launch adds kSmemBytes and 16 bytes
  // of alignment): the row offsets of three K tiles, and the slots a claimed work
  // tile reaches the warpgroup through.
  struct alignas(16) Ring {
    u32 rows[3][KT::BLOCK_N];
    int claim[2];
  };
  static constexpr int kSmemBytes = sizeof(Ring);
  const FwdParams& p;
  Ring* const ring;
  u32 pending = 0;  // the full barrier of the last tile issued, not yet arrived on
  int parity = 0;   // the next claim slot

  // kPrefetch: each K tile's block-table entries are loaded a tile before its offsets
  // are placed (prefetch, then prepare), where the tiles hold 128 keys in two stages:
  // there the producer runs at most a tile ahead of the consumers, and the table reads
  // in prepare held up the next copies. H200, chunked prefill at D = 128 (causal):
  // 1.005-1.054x (D = 120 takes the same tiles; not timed). Not elsewhere: 64 keys
  // (D = 256) lost 4-5% with it, 96 keys (D = 104-112) up to 3% at page 16, three
  // stages (D = 64) 1-2% (benchmarks/results/notes-decode.md section 36).
  static constexpr bool kPrefetch = KT::STAGES == 2 && KT::BLOCK_N == 128;
  typename Rows::Ahead ahead{};
  int ahead_j0 = -1;  // the key tile whose table entries `ahead` holds
  // The offsets of the count-th K tile, keys [j0, j0 + BLOCK_N): from the entries
  // fetched for it, else read here.
  __device__ __forceinline__ void prepare(const Tile& t, int j0, int count) {
    if (kPrefetch && ahead_j0 == j0) {
      Rows::place(ring->rows[count % 3], ahead, p, this->cache, j0, threadIdx.x);
      ahead_j0 = -1;
    } else {
      Rows::template locate<kPrefetch>(ring->rows[count % 3], p, this->cache, t.b, j0, t.n,
                                       threadIdx.x);
    }
  }
  // The table entries of the K tile after the next prepared one, into registers.
  __device__ __forceinline__ void prefetch(const Tile& t, int j0) {
    if constexpr (kPrefetch) {
      Rows::fetch(ahead, this->cache, t.b, j0, t.n, threadIdx.x);
      ahead_j0 = j0;
    }
  }
  __device__ __forceinline__ void load(bool is_v, const Tile& t, u32 dst, u32 bar, int j0,
                                       int count) {
    if (!is_v) warpgroup_barrier(0);  // every thread's prepare of this tile
    Rows::copy(dst, static_cast<const T*>(is_v ? p.v : p.k) + t.hk * p.k_head_stride,
               ring->rows[count % 3], t.n - j0, threadIdx.x);
    if (pending) {
      cp_async_wait<1>();
      fence_proxy_async();
      mbarrier_arrive(pending);
    }
    pending = bar;
  }
  __device__ __forceinline__ void settle() {
    if (pending) {
      cp_async_wait<0>();
      fence_proxy_async();
      mbarrier_arrive(pending);
      pending = 0;
    }
  }
  // Claim c of the leader (thread 0), for every thread of the warpgroup.
  __device__ __forceinline__ int share(int c) {
    if (threadIdx.x == 0) ring->claim[parity] = c;
    warpgroup_barrier(0);
    c = ring->claim[parity];
    parity ^= 1;
    return c;
  }
};

// ---------------------------------------------------------------------------
// Producer

// Warpgroup 0 (the source's kLanes threads). Reads: the scheduler's tiles, Q through
// its tensor map, K and V through the source. Waits on: q_empty[c] before loading
// consumer c's next Q, empty_k/v before reusing a buffer. Signals: q_full[c] (Q and
// the published tile slot), full_k/v (through the source). Per work tile: K_0, each
// consumer's Q once it released the previous tile's, then K_j and V_{j-1} for j =
// 1..n_blocks (each tile's V is used one step after its K). The next tile is claimed
// with the last load, about STAGES key tiles before the consumers finish this one:
// early enough to load its Q and K_0 in time, late enough that a block busy with a
// long tile leaves the tiles after it to blocks that are free sooner. Work tile u
// (counted over the block's life) is published in tile_slot[u % 2] together with its
// Q, -1 after the last one; a slot is rewritten two tiles later, when every consumer
// has released that tile's Q.
template <class KT, class VT, class Source>
__device__ __forceinline__ void produce(const Smem<KT> st, const TileScheduler<KT, VT>& sched,
                                        const TmaMap& q_map, Source& src) {
  const FwdParams& p = sched.p;
  // Source::kLanes threads run this (thread 0, warp 0 or the warpgroup, sharing the K
  // and V copies): each waits, one (the leader) announces Q, claims and publishes.
  constexpr int LANES = Source::kLanes;
  const bool leader = LANES == 1 || threadIdx.x == 0;
  const auto claim = [&] {
    const int c = leader ? sched.claim() : 0;
    if constexpr (LANES == 1) return c;
    else if constexpr (LANES == 32) return __shfl_sync(0xffffffffu, c, 0);
    else return src.share(c);
  };
  PipelineState<KT::STAGES> k_pipe, v_pipe;
  // The count-th K or V tile into the pipeline's next buffer, once its previous use is
  // released. bufs, full, empty: the first buffer's and mbarriers' addresses (8 bytes
  // apart).
  auto load = [&](bool is_v, const typename Source::Tile& kv, u32 bufs, u32 full, u32 empty,
                  PipelineState<KT::STAGES>& pipe, int count, int j0) {
    if (count >= KT::STAGES) mbarrier_wait(empty + 8 * pipe.index(), pipe.phase() ^ 1);
    src.load(is_v, kv, bufs + pipe.index() * KT::KVTile::BYTES, full + 8 * pipe.index(), j0,
             count);
    pipe.advance();
  };
  using Seqs = typename VT::Seqs;
  int done = 0, loads = 0;  // work tiles, and K (or V) tiles loaded so far
  for (int tile = sched.first();;) {
    if (tile >= sched.tiles) {
      src.settle();
      if (leader) st.tile_slot(done)[0] = -1;
      for (int c = 0; c < KT::CONSUMERS; ++c) {
        if (done > 0) mbarrier_wait(st.q_empty(c), (done - 1) & 1);
        if (leader) mbarrier_arrive(st.q_full(c));
      }
      return;
    }
    const WorkTile w = sched.work(tile);
    const typename Seqs::Extent seq = src.extent(p, w);
    if (leader) TileSlot::write<Seqs>(st.tile_slot(done), tile, w, seq);
    const int q0 = sched.q0(w.m_block);
    int n_begin, n_blocks;
    const auto& bound = Seqs::template bind<typename KT::T>(p, seq);
    sched.keys(bound, q0, n_begin, n_blocks);
    // Q's map coordinates: as TiledKV's (a broadcast axis is a map of size 1, packed
    // sequences are one batch entry).
    const int q_h = p.q_head_stride ? w.h : 0, q_b = p.q_batch_stride ? w.b : 0;
    int q_row0 = q0;
    if constexpr (Seqs::kRagged) q_row0 += seq.q_start;
    const typename Source::Tile kv = src.tile(p, w, seq);
    const int back = sched.diagonal(bound, q0, n_begin, n_blocks);
    const auto key_row = [&](int j) { return sched.key_block(j, n_begin, back) * KT::BLOCK_N; };
    // K_0 first: its buffer is free before the consumers hand back Q. A source
    // prepares each K tile before its load (GatheredKV: one tile ahead; the table
    // entries of the tile after that one fetched with it, where kPrefetch).
    if (n_blocks > 0) {
      src.prepare(kv, key_row(0), loads);
      load(false, kv, st.k(0), st.full_k(0), st.empty_k(0), k_pipe, loads, key_row(0));
      if (n_blocks > 1) src.prepare(kv, key_row(1), loads + 1);
      if (n_blocks > 2) src.prefetch(kv, key_row(2));
    }
    src.settle();
    for (int c = 0; c < KT::CONSUMERS; ++c) {
      if (done > 0) mbarrier_wait(st.q_empty(c), (done - 1) & 1);
      if (leader) {
        const u32 bar = st.q_full(c);
        mbarrier_arrive_expect_tx(bar, KT::Q_SLICE_BYTES);
        tma_load_blocks<KT::D_BLOCKS>(st.q() + c * 64 * 128, KT::QTile::BLOCK_BYTES, q_map,
                                      q_row0 + 64 * c, q_h, q_b, bar);
      }
    }
    int claimed = n_blocks > 0 ? 0 : claim();
    for (int j = 1; j <= n_blocks; ++j) {
      if (j < n_blocks) {
        load(false, kv, st.k(0), st.full_k(0), st.empty_k(0), k_pipe, loads + j, key_row(j));
      } else {
        claimed = claim();
      }
      load(true, kv, st.v(0), st.full_v(0), st.empty_v(0), v_pipe, loads + j - 1, key_row(j - 1));
      if (j + 1 < n_blocks) src.prepare(kv, key_row(j + 1), loads + j + 1);
      if (j + 2 < n_blocks) src.prefetch(kv, key_row(j + 2));
    }
    loads += n_blocks;
    ++done;
    tile = sched.next(done, claimed, leader);
  }
}

// ---------------------------------------------------------------------------
// Consumer

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

// One consumer warpgroup (index c) and its registers: the output accumulator, the
// scores of the current key tile, the previous tile's P as 16-bit A fragments, the
// softmax state. Reads: Q, K, V from shared memory. Waits on: q_full[c], full_k/v,
// its turn. Signals: empty_k/v (lane 0 of each warp), q_empty[c], the next turn.
template <class KT, class VT, class Source>
struct Consumer {
  using T = typename KT::T;
  using Frag = MmaFrag<KT::N_TILES>;
  const Smem<KT> st;
  using Seqs = typename VT::Seqs;
  const TileScheduler<KT, VT>& sched;
  // K's rows in global memory for scores_from_global: a cache's source (CachedKV);
  // fixed and packed sequences address K from the params (NoKeyRows)
  const Source src;
  // The params, bound to the current tile's sequence (packed sequences and KV caches:
  // a copy per tile; otherwise the kernel's own).
  typename Seqs::template Bound<FwdParams> p;
  const int c, lane, g, t, row0;  // row0: this warp's first row within the work tile
  PipelineState<KT::STAGES> pipe;  // K_j's buffer; V_{j-1}'s is pipe.prev()
  // The current work tile: its index, first query row, key tiles [n_begin, n_begin + n_blocks).
  // Head and batch come from the scheduler where needed, which keeps registers free
  // (packed sequences: from the tile's slot, in `ragged`).
  int tile = 0, q0 = 0, n_begin = 0, n_blocks = 0, back = 0;  // back: TileScheduler::diagonal
  WorkTile ragged{};
  int bh = 0;  // dropout (VT::Drop): the tile's (batch entry or sequence) * Hq + head
  typename VT::Head dense{};  // the variant's dense state of the tile's head (ALiBi: its slope)
  float acc[KT::D_TILES * 4];
  float s[KT::N_TILES * 4];   // S of the current tile, then P = exp2(S - m_i)
  u32 pa[KT::PV_STEPS][4];    // P of the previous tile in 16 bits: the A operand of P V
  FragSoftmax<KT::N_TILES> sm;

  __device__ __forceinline__ Consumer(Smem<KT> st_, const TileScheduler<KT, VT>& sched_,
                                      const Source& src_, int c_)
      : st(st_), sched(sched_), src(src_), p(sched_.p), c(c_), lane(threadIdx.x % 32), g(lane / 4),
        t(lane % 4), row0((threadIdx.x - 128) / 32 * 16) {}

  // Round robin: consumer c issues its MMAs after barrier kBarTurn0 + c, then lets
  // the next one go (bar.arrive); the last consumer lets consumer 0 start.
  static constexpr bool TURNS = KT::CONSUMERS > 1;
  __device__ __forceinline__ void my_turn() const {
    if constexpr (TURNS) named_barrier_sync(kBarTurn0 + c, 256);
  }
  __device__ __forceinline__ void pass_turn() const {
    if constexpr (TURNS) named_barrier_arrive(kBarTurn0 + (c + 1) % KT::CONSUMERS, 256);
  }
  __device__ __forceinline__ void k_ready() const {
    mbarrier_wait(st.full_k(pipe.index()), pipe.phase());
  }
  __device__ __forceinline__ void v_ready() const {
    mbarrier_wait(st.full_v(pipe.prev().index()), pipe.prev().phase());
  }
  __device__ __forceinline__ void release_k() const {
    if (lane == 0) mbarrier_arrive(st.empty_k(pipe.index()));
  }
  __device__ __forceinline__ void release_v() const {
    if (lane == 0) mbarrier_arrive(st.empty_v(pipe.prev().index()));
  }
  // After a key step: V_j is next for P V (pipe.prev()), K_{j+1} for Q K^T.
  __device__ __forceinline__ void advance() { pipe.advance(); }

  // s = this warpgroup's 64 rows of Q against the BLOCK_N rows of K in pipe's buffer.
  // Descriptors: one per tile, advanced per k16 step (desc_advance).
  __device__ __forceinline__ void issue_qk() {
    const u64 q_desc = KT::QTile::kmajor(st.q(), c * 64, 0);
    const u64 k_desc = KT::KVTile::kmajor(st.k(pipe.index()), 0, 0);
#pragma unroll
    for (int ks = 0; ks < KT::QK_STEPS; ++ks)
      Wgmma<KT::BLOCK_N>::ss(s, desc_advance(q_desc, KT::QTile::kmajor_offset(ks)),
                             desc_advance(k_desc, KT::KVTile::kmajor_offset(ks)), ks > 0, T{});
    wgmma_commit();
  }
  // acc += P V with V in the buffer one tile behind K's.
  __device__ __forceinline__ void issue_pv() {
    const u64 v_desc = KT::KVTile::mnmajor(st.v(pipe.prev().index()), 0);
#pragma unroll
    for (int ks = 0; ks < KT::PV_STEPS; ++ks)
      Wgmma<KT::D>::rs(acc, pa[ks], desc_advance(v_desc, KT::KVTile::mnmajor_offset(ks)), T{});
    wgmma_commit();
  }

  // First key of tile j (relative to n_begin), and whether this warp's 16 rows need
  // per-element work on it (the variant's partial test, warp-uniform).
  __device__ __forceinline__ int k0(int j) const {
    return sched.key_block(j, n_begin, back) * KT::BLOCK_N;
  }
  __device__ __forceinline__ bool partial(int j) const {
    return VT::partial(p, q0 + row0, q0 + row0 + 15, k0(j), k0(j) + KT::BLOCK_N - 1);
  }

  // The variant's score s2 of query i, key j (logits, then a computed bias).
  __device__ __forceinline__ float score(int i, int j, float dot) const {
    return VT::score(p, dense, i, j, dot);
  }

  // Scores into the exp2 domain and the online softmax with a row max (P in s, the
  // rescale factors in sm.alpha). Plain logits on an interior tile fold the scale
  // into the exp2's FFMA (the max taken on raw scores); tiles that need a mask, a
  // variant that transforms the score or a negative scale become s2 first and the
  // masked ones -inf, so no masked score meets the scale. The max is lazy unless
  // `exact`.
  __device__ __forceinline__ void softmax(int j, bool exact) {
    float scale = p.scale_log2;
    const bool masked = partial(j);
    if (masked || VT::kTransform || scale < 0.f) {
      Scores<VT>::map(Frag(lane), [&](int i) -> float& { return s[i]; }, p, q0 + row0, k0(j),
                      masked, -CA_INF,
                      [&](float x, int, int, int i, int jj) { return score(i, jj, x); });
      scale = 1.f;
    }
    sm.online(s, scale, exact);
  }

  // The common case without the max: a tile under a scale >= 0 in a warp whose rows
  // all have a finite m_i. P in s; false if a row sum fails the bound (then
  // settle_fast). A tile that needs a mask takes this path under a causal band (the
  // diagonal): a masked p is selected to 0 after its exp2, whatever its score.
  // (Without a causal band only the last key tile needs one; it stays with softmax,
  // which keeps the plain kernel's code as it was.)
  __device__ __forceinline__ bool softmax_fast(float (&sum)[2], int j, bool masked) {
    if (VT::kTransform || (VT::kCausal && masked)) {
      if constexpr (VT::kLinearBias && KT::LINE_BIAS) {  // ALiBi off the diagonal: a line per row
        const float side =
            masked ? 0.f
                   : VT::line_side(p, q0 + row0, q0 + row0 + 15, k0(j), k0(j) + KT::BLOCK_N - 1);
        if (side != 0.f) {
          Scores<VT>::shifted_line(
              Frag(lane), [&](int i) -> float& { return s[i]; }, p, dense, q0 + row0, k0(j), side,
              [&](int r) { return -sm.row[r].m_i; }, [](float x) { return fast_exp2(x); });
          return FragSoftmax<KT::N_TILES>::sums(s, sum);
        }
      }
      Scores<VT>::map(Frag(lane), [&](int i) -> float& { return s[i]; }, p, q0 + row0, k0(j),
                      masked, 0.f, [&](float x, int r, int, int i, int jj) {
                        return fast_exp2(VT::kTransform
                                             ? VT::shifted(p, dense, i, jj, x, -sm.row[r].m_i)
                                             : fmaf(x, p.scale_log2, -sm.row[r].m_i));
                      });
      return FragSoftmax<KT::N_TILES>::sums(s, sum);
    }
    return sm.fast(s, p.scale_log2, sum);
  }

  // The raw scores of key tile j in this thread's fragment, in fp32 from Q's shared
  // tile and K in global memory (K_j's buffer may already hold a later tile). Rolled
  // loops for a path this rare: each n8 group's four scores enter at the end of s,
  // which shifts down by four, so every register index stays a constant.
  __device__ __forceinline__ WorkTile work() const {
    if constexpr (Seqs::kRagged) return ragged;
    return sched.work(tile);
  }

  __device__ __forceinline__ void scores_from_global(int j) {
    const WorkTile w = work();
    const T* k_tile = static_cast<const T*>(p.k) + w.b * p.k_batch_stride +
                      (w.h / p.group) * p.k_head_stride + (i64(k0(j)) + 2 * t) * p.k_row_stride;
    const unsigned char* q_bytes = st.q_bytes();
#pragma unroll 1
    for (int nt = 0; nt < KT::N_TILES; ++nt) {
      float dot[4] = {0.f, 0.f, 0.f, 0.f};  // (row g + 8r, column 8nt + 2t + e) at 2r + e
#pragma unroll 1
      for (int x = 0; x < KT::D; x += 2) {  // two columns at a time: few registers
        const u32 q_at = KT::QTile::offset(row0 + g, x / 8) + (x % 8) * 2;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const T* k_at = k_tile + (nt * 8 + e) * p.k_row_stride;
          if constexpr (Seqs::kCached) k_at = src.template k_row<T>(p, w, k0(j) + nt * 8 + 2 * t + e);
          const u32 kw = *reinterpret_cast<const u32*>(k_at + x);
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
      for (int i = 0; i < KT::N_TILES * 4 - 4; ++i) s[i] = s[i + 4];
#pragma unroll
      for (int i = 0; i < 4; ++i) s[KT::N_TILES * 4 - 4 + i] = dot[i];
    }
  }

  // A fast tile that failed its bound (rare), settled without the max. A p that
  // overflowed (a score 128 above m_i) has lost the score: then the warp computes its
  // scores again and takes softmax(j, exact).
  __device__ __forceinline__ void settle_fast(int j, float (&sum)[2]) {
    if (sm.settle(s, sum)) return;
    // P V's A fragments stay put until it completes; then they are dead (the next
    // pack rewrites them), and zeros give their registers to this path.
    wgmma_wait<0>();
    fence_regs(pa);
#pragma unroll
    for (int ks = 0; ks < KT::PV_STEPS; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[ks][i] = 0u;
    scores_from_global(j);
    softmax(j, true);
  }

  // acc *= alpha (acc must be complete), then P of key tile j -> 16-bit A fragments:
  // two n8 groups of S are one k16 step of P V. Dropout applies here, after the row
  // sums (they and the LSE stay those of P): the dropped halves of the A fragments are
  // cleared, and 1 / (1 - p) joins 1 / l_i in store(). This warp's 16 rows of the m64
  // S tile are an m16n8 C fragment, so its keep flags are an mma fragment's (q0 + row0
  // is a multiple of 16: the host shifts query blocks by multiples of 16 under
  // dropout); acc and P alone are live, so the Philox rounds run here.
  __device__ __forceinline__ void rescale_and_pack(int j) {
    sm.rescale(acc);
#pragma unroll
    for (int ks = 0; ks < KT::PV_STEPS; ++ks) {
      const float* s0 = s + 8 * ks;
      pa[ks][0] = MmaType<T>::pack(s0[0], s0[1]);
      pa[ks][1] = MmaType<T>::pack(s0[2], s0[3]);
      pa[ks][2] = MmaType<T>::pack(s0[4], s0[5]);
      pa[ks][3] = MmaType<T>::pack(s0[6], s0[7]);
    }
    if constexpr (VT::Drop::enabled)
      VT::Drop::template fragment_packed<KT::N_TILES, (KT::D <= 128)>(sched.p, bh, q0 + row0,
                                                                      k0(j), lane, pa);
  }

  // Key step j >= 1: Q K_j^T and P_{j-1} V_{j-1} in flight, the softmax of tile j
  // beside P V, then acc rescaled and P_j packed.
  __device__ __forceinline__ void step(int j) {
    k_ready();
    v_ready();
    my_turn();
    wgmma_fence();  // s, pa and acc were written by ordinary code
    issue_qk();
    issue_pv();
    pass_turn();
    wgmma_wait<1>();
    fence_regs(s);
    release_k();
    const bool masked = partial(j);
    const bool fast =
        VT::kFastSoftmax &&
        __all_sync(0xffffffffu, (VT::kCausal || !masked) && p.scale_log2 >= 0.f &&
                                    sm.row[0].m_i != -CA_INF && sm.row[1].m_i != -CA_INF);
    if (fast) {
      float sum[2];
      if (__any_sync(0xffffffffu, !softmax_fast(sum, j, masked))) {
        settle_fast(j, sum);
      } else {
        sm.commit(sum);
      }
    } else {
      softmax(j, false);
    }
    // ptxas hoists the wait above independent arithmetic, which would run the softmax
    // after P V instead of beside it. Arithmetic moves across barriers, shared-memory
    // stores do not: storing l_i (it depends on every exp of the tile) before a
    // warpgroup barrier pins the softmax ahead of the wait.
    st.l_slot()[threadIdx.x - 128] = make_float2(sm.row[0].l_i, sm.row[1].l_i);
    warpgroup_barrier(c + 1);
    wgmma_wait<0>();
    fence_regs(acc);
    fence_regs(pa);
    release_v();
    rescale_and_pack(j);
  }

  // Turn j of a work tile (n_blocks + 1 turns: turn j reads K_j, j < n_blocks, and
  // V_{j-1}, j > 0) in which this consumer computes nothing: it takes the turn and
  // hands each buffer back once it has landed (a release before that would count
  // toward the buffer's previous use).
  __device__ __forceinline__ void idle_turn(int j) {
    if (j < n_blocks) {
      k_ready();
      release_k();
    }
    if (j > 0) {
      v_ready();
      release_v();
    }
    my_turn();
    pass_turn();
    if (j < n_blocks) advance();
  }

  // A work tile none of whose 64 rows of this consumer lie in [0, Sq) (a partial
  // block): nothing to compute or store, every turn idle.
  __device__ __forceinline__ void skip_tile() {
    for (int j = 0; n_blocks > 0 && j <= n_blocks; ++j) idle_turn(j);
  }

  // kOwnKeys: a band whose edges cross the work tile leaves some key tiles masked for
  // every row of one consumer's 64 (the causal diagonal past its last row, a window's
  // lower edge below its first): the consumer computes only the key tiles [lo, hi) of
  // [0, n_blocks) its own rows see, and idles through the other turns, which hands
  // the tensor cores to the other consumers. Where BLOCK_M > BLOCK_N these are whole
  // tiles of every causal work tile's diagonal (BLOCK_M = 192 against BLOCK_N = 128:
  // 1.5 tiles of 3 n_blocks, 10% of the work at S = 1k) and of a window's lower edge.
  // Tiles of BLOCK_M <= BLOCK_N (D = 128 under the causal mask) save none at Sq = Sk
  // nor under windows of 2^k - 1 keys, so they keep the loop as it was. Not under
  // kDiagonalFirst (its walk is not in key order).
  static constexpr bool kOwnKeys = (VT::Band::kLo || VT::Band::kHi) &&
                                   KT::BLOCK_M > KT::BLOCK_N && !VT::kDiagonalFirst;
  __device__ __forceinline__ void own_keys(int& lo, int& hi) const {
    lo = 0, hi = n_blocks;
    if constexpr (kOwnKeys) {
      const int first = cmax(q0 + 64 * c, 0), last = cmin(q0 + 64 * c + 63, p.seqlen_q - 1);
      const int a = cmax(VT::kv_begin(p, first) / KT::BLOCK_N - n_begin, 0);
      const int e = cmin(ceil_div(VT::kv_end(p, last), KT::BLOCK_N) - n_begin, n_blocks);
      if (a < e) lo = a, hi = e;  // rows that see no key keep the whole range, as before
    }
  }

  // The key loop of one work tile over its key tiles [lo, hi) (own_keys; the other
  // turns idle); Q's rows go back to the producer once no softmax will read them
  // again (scores_from_global), so the next tile's Q lands while this one finishes.
  __device__ __forceinline__ void run_tile(int lo, int hi) {
#pragma unroll
    for (int i = 0; i < KT::D_TILES * 4; ++i) acc[i] = 0.f;
    sm.init();
    if (n_blocks > 0) {
      if constexpr (kOwnKeys) {
        for (int j = 0; j < lo; ++j) idle_turn(j);
      }
      k_ready();
      if (kOwnKeys && lo > 0) {  // V_{lo-1}: no P V of this consumer's reads it
        v_ready();
        release_v();
      }
      my_turn();
      wgmma_fence();
      issue_qk();
      pass_turn();
      wgmma_wait<0>();
      fence_regs(s);
      release_k();
      softmax(lo, false);
      rescale_and_pack(lo);
      advance();
      for (int j = lo + 1; j < hi; ++j) {
        step(j);
        advance();
      }
    }
    if (lane == 0) mbarrier_arrive(st.q_empty(c));
    if (n_blocks > 0) {
      v_ready();
      const bool more = kOwnKeys && hi < n_blocks;  // K_hi: no Q K^T of this consumer's reads it
      if (more) {
        k_ready();
        release_k();
      }
      my_turn();
      wgmma_fence();
      issue_pv();
      pass_turn();
      wgmma_wait<0>();
      fence_regs(acc);
      release_v();
      if (more) advance();
      if constexpr (kOwnKeys) {
        for (int j = hi + 1; j <= n_blocks; ++j) idle_turn(j);
      }
    }
  }

  // Epilogue: finish the row sums across the quad, normalize, and store: a quad holds
  // four n8 column groups of a row as 4-byte pairs, and after a transpose within the
  // quad each thread stores one group's 16 contiguous bytes (whole 32-byte sectors per
  // quad; 4-byte stores would write every sector in halves).
  __device__ __forceinline__ void store() {
    const WorkTile w = work();
    T* o_head = static_cast<T*>(p.o) + w.b * p.o_batch_stride + w.h * p.o_head_stride;
    sm.finish();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float inv_l = sm.row[r].inv_l();
      if constexpr (VT::Drop::enabled) inv_l *= sched.p.dropout_scale;  // rescale_and_pack
      const int i = q0 + row0 + g + 8 * r;
      T* o_row = o_head + i64(i) * p.o_row_stride;
#pragma unroll
      for (int dt0 = 0; dt0 < KT::D_TILES; dt0 += 4) {
        u32 x[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int dt = cmin(dt0 + k, KT::D_TILES - 1);  // past D: a copy, never stored
          x[k] = MmaType<T>::pack(acc[dt * 4 + 2 * r] * inv_l, acc[dt * 4 + 2 * r + 1] * inv_l);
        }
        quad_transpose(x, t);
        if (i >= 0 && i < p.seqlen_q && dt0 + t < KT::D_TILES)
          *reinterpret_cast<uint4*>(o_row + (dt0 + t) * 8) = make_uint4(x[0], x[1], x[2], x[3]);
      }
      if (p.lse && t == 0 && i >= 0 && i < p.seqlen_q)
        p.lse[w.b * p.lse_batch_stride + w.h * p.lse_head_stride + i] = sm.row[r].lse();
    }
  }

  // Work tiles until the producer publishes -1.
  __device__ __forceinline__ void run() {
    if (c == KT::CONSUMERS - 1) pass_turn();
    for (int done = 0;; ++done) {  // work tiles finished
      mbarrier_wait(st.q_full(c), done & 1);
      // Lane 0 reads the slot for the warp: the producer rewrites it once lane 0's
      // release of this tile's Q (run_tile) has come, which orders only lane 0's read.
      const int* slot = st.tile_slot(done);
      tile = TileSlot::read(slot, 0);
      if (tile < 0) break;
      if constexpr (Seqs::kRagged) {
        ragged = {TileSlot::read(slot, 1), TileSlot::read(slot, 2), TileSlot::read(slot, 3)};
        const typename Seqs::Extent seq{TileSlot::read(slot, 4), TileSlot::read(slot, 5),
                                        TileSlot::read(slot, 6), TileSlot::read(slot, 7)};
        p = Seqs::template bind<T>(sched.p, seq);
        q0 = sched.q0(ragged.m_block);
        dense = VT::Dense::head(p, ragged.b, ragged.h);
        if constexpr (VT::Drop::enabled) bh = ragged.b * p.heads_q + ragged.h;
      } else {
        const WorkTile w = sched.work(tile);
        if constexpr (Seqs::kCached) p = Seqs::template bind<T>(sched.p, {TileSlot::read(slot, 1)});
        q0 = sched.q0(w.m_block);
        dense = VT::Dense::head(p, w.b, w.h);
        if constexpr (VT::Drop::enabled) bh = w.b * p.heads_q + w.h;
      }
      sched.keys(p, q0, n_begin, n_blocks);
      back = sched.diagonal(p, q0, n_begin, n_blocks);
      if (q0 + 64 * c >= p.seqlen_q || q0 + 64 * (c + 1) <= 0) {
        skip_tile();
        if (lane == 0) mbarrier_arrive(st.q_empty(c));
        continue;
      }
      int lo, hi;
      own_keys(lo, hi);
      run_tile(lo, hi);
      store();
    }
    if (c == 0) my_turn();  // consumes the last consumer's last pass_turn: the counts balance
  }
};

// ---------------------------------------------------------------------------
// The kernels: set up the barriers, then one role per warpgroup.

// The K and V source of the consumers where they read none of it.
struct NoKeyRows {};

// make_source(): the kernel's K and V source, made in the roles that use it (a source
// made before the roles split kept the maps' addresses in registers of every warp).
template <class KT, class VT, class MakeSource>
__device__ __forceinline__ void flash_wgmma_roles(const FwdParams& p, const TmaMap& q_map,
                                                  MakeSource make_source, u32* tile_counter,
                                                  int q_shift, int section) {
  using Source = decltype(make_source());
  const Smem<KT> st{storage_base(wgmma_smem)};
  const TileScheduler<KT, VT> sched(p, tile_counter, q_shift, section);
  if (threadIdx.x == 0) {
    for (int c = 0; c < KT::CONSUMERS; ++c) {
      mbarrier_init(st.q_full(c), 1);   // the producer's arrival with the byte count
      mbarrier_init(st.q_empty(c), 4);  // lane 0 of each of the consumer's warps
    }
    for (int i = 0; i < KT::STAGES; ++i) {
      mbarrier_init(st.full_k(i), Source::kArrivals);
      mbarrier_init(st.full_v(i), Source::kArrivals);
      mbarrier_init(st.empty_k(i), 4 * KT::CONSUMERS);
      mbarrier_init(st.empty_v(i), 4 * KT::CONSUMERS);
    }
  }
  __syncthreads();  // the only block-wide barrier

  // Warp-uniform by construction; broadcast from lane 0 so that the compiler knows it
  // too and keeps what derives from it (barrier ids, Q's descriptor) uniform.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (wg == 0) {
    setmaxnreg_dec<KT::PRODUCER_REGS>();
    if (threadIdx.x < Source::kLanes) {
      Source src = make_source();
      produce<KT, VT>(st, sched, q_map, src);
    }
    return;
  }
  setmaxnreg_inc<KT::CONSUMER_REGS>();
  if constexpr (VT::Seqs::kCached) {
    Consumer<KT, VT, Source> consumer(st, sched, make_source(), wg - 1);
    consumer.run();
  } else {
    Consumer<KT, VT, NoKeyRows> consumer(st, sched, NoKeyRows{}, wg - 1);
    consumer.run();
  }
}

// Fixed-length or packed sequences: K and V through their tensor maps (TiledKV).
template <class KT, class VT>
__global__ void __launch_bounds__(KT::THREADS, KT::MIN_BLOCKS)
    flash_wgmma_fwd(const FwdParams p, const __grid_constant__ TmaMap q_map,
                    const __grid_constant__ TmaMap k_map, const __grid_constant__ TmaMap v_map,
                    u32* tile_counter, int q_shift, int section) {
  static_assert(!VT::Seqs::kCached, "KV caches take flash_wgmma_cache_fwd");
  flash_wgmma_roles<KT, VT>(
      p, q_map, [&] { return TiledKV<KT, typename VT::Seqs>{k_map, v_map}; }, tile_counter,
      q_shift, section);
}

// A batch of KV caches (CachedSeqs: attention_decode's chunked prefill), contiguous or
// paged: k_map and v_map in boxes of box_rows rows (a multiple of 16 that divides
// BLOCK_N and the page size), V's maps of 16, 1, 2, 4 and 8 rows for the exact last
// rows of a sequence (CachedKV, common/paged.cuh).
template <class KT, class VT>
__global__ void __launch_bounds__(KT::THREADS, KT::MIN_BLOCKS)
    flash_wgmma_cache_fwd(const FwdParams p, const __grid_constant__ TmaMap q_map,
                          const __grid_constant__ TmaMap k_map,
                          const __grid_constant__ TmaMap v_map, u32* tile_counter, int q_shift,
                          int section, const __grid_constant__ CacheParams cache, int box_rows,
                          const __grid_constant__ CacheRowMaps v_rows) {
  static_assert(VT::Seqs::kCached, "flash_wgmma_cache_fwd reads KV caches (CachedSeqs)");
  flash_wgmma_roles<KT, VT>(
      p, q_map,
      [&] { return CachedKV<KT, typename VT::Seqs>{{cache}, k_map, v_map, v_rows, box_rows}; },
      tile_counter, q_shift, section);
}

// A paged cache gathered row by row (GatheredKV): any page size. The launch asks for
// GatheredKV's kSmemBytes beyond the Storage.
template <class KT, class VT>
__global__ void __launch_bounds__(KT::THREADS, KT::MIN_BLOCKS)
    flash_wgmma_gather_fwd(const FwdParams p, const __grid_constant__ TmaMap q_map,
                           u32* tile_counter, int q_shift, int section,
                           const __grid_constant__ CacheParams cache) {
  static_assert(VT::Seqs::kPaged, "flash_wgmma_gather_fwd reads paged caches");
  using Source = GatheredKV<KT, typename VT::Seqs>;
  flash_wgmma_roles<KT, VT>(
      p, q_map,
      [&] {
        const u32 ring = (storage_base(wgmma_smem) + sizeof(typename KT::Storage) + 15) & ~15u;
        return Source{{cache}, p, shared_ptr<typename Source::Ring>(wgmma_smem, ring)};
      },
      tile_counter, q_shift, section);
}
