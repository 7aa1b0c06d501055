// Hopper (sm_90a) tensor memory access: bulk copies of a tile from global memory
// into shared memory by the copy engine, described by a tensor map.
//
// A tensor map (128 opaque bytes, CUtensorMap in the driver's API) is encoded on
// the host by cuTensorMapEncodeTiled (cupy_attention/tma.py) and passed by value
// as a __grid_constant__ kernel parameter; the copy instruction takes its generic
// address. The maps here are rank 4 over a [B, H, S, D] view: dimension 0 is the
// head dim (contiguous), then rows, heads and batches with the view's strides; a
// box is 64 columns x BLOCK_N rows, written to shared memory with the 128-byte
// swizzle, which is the layout SwizzledTile (wgmma.cuh) defines. Elements outside
// the map (rows >= S, columns >= D) arrive as zeros.
//
// One thread issues a copy; an mbarrier counts its bytes: the thread announces
// them (mbarrier_arrive_expect_tx, one arrival) and the copy engine completes the
// transaction when they land, which completes the phase. The copies write through
// the async proxy, which wgmma reads through too: no proxy fence between them.
#pragma once
#include "types.cuh"

struct alignas(64) TmaMap {
  u64 words[16];
};

// mbarriers (8 bytes of shared memory each): a phase completes after `count`
// arrivals; a waiter names the parity of the phase it waits for (0, 1, 0, ...).
__device__ __forceinline__ void mbarrier_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(u32 bar, int parity) {
  asm volatile(
      "{.reg .pred done;\n"
      "wait_%=: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;}" :: "r"(bar), "r"(parity) : "memory");
}
// Orders this thread's earlier generic-proxy accesses of shared memory before its
// later async-proxy ones (a copy engine write into a buffer it has read).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The same for global memory: this thread's generic accesses (a counter's acquire or
// release) ordered against its copy engine operations (bulk reductions) on the other
// side of the fence.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// One arrival on mbarrier `bar` once every cp.async this thread issued before has
// landed (the arrival is one of the count the barrier was initialized with: .noinc).
__device__ __forceinline__ void mbarrier_arrive_on_copies(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes)
               : "memory");
}

// The box at (column x, row y, head h, batch b) of `map` into shared address `dst`
// (1024-byte aligned for the swizzle), completing `bytes` on mbarrier `bar`.
__device__ __forceinline__ void tma_load_4d(u32 dst, const TmaMap& map, int x, int y, int h, int b,
                                            u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];"
      :: "r"(dst), "l"(reinterpret_cast<u64>(&map)), "r"(x), "r"(y), "r"(h), "r"(b), "r"(bar)
      : "memory");
}

// The box at (x, y, z, h, b) of a rank-5 `map` into shared address `dst`, completing
// on mbarrier `bar` (the decode's paged maps: column, row, 64-column block, head, page).
__device__ __forceinline__ void tma_load_5d(u32 dst, const TmaMap& map, int x, int y, int z,
                                            int h, int b, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
      :: "r"(dst), "l"(reinterpret_cast<u64>(&map)), "r"(x), "r"(y), "r"(z), "r"(h), "r"(b),
         "r"(bar)
      : "memory");
}

// The BLOCKS 64-column blocks of a SwizzledTile (wgmma.cuh), `block_bytes` apart
// from shared address `dst`, from rows `row`.. of head h, batch b of `map`: one box
// each (columns 64 blk..), completing on mbarrier `bar`.
template <int BLOCKS>
__device__ __forceinline__ void tma_load_blocks(u32 dst, u32 block_bytes, const TmaMap& map,
                                                int row, int h, int b, u32 bar) {
#pragma unroll
  for (int blk = 0; blk < BLOCKS; ++blk)
    tma_load_4d(dst + blk * block_bytes, map, blk * 64, row, h, b, bar);
}

// The box at (column x, row y, head h, batch b) of fp32 `map` += the box at shared
// address `src` (laid out as the map's swizzle says), element by element atomically,
// by the copy engine; elements outside the map are skipped. In the thread's current
// bulk group (bulk_commit, bulk_wait_read, bulk_wait below).
__device__ __forceinline__ void tma_reduce_add_4d(const TmaMap& map, u32 src, int x, int y, int h,
                                                  int b) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];"
      :: "l"(reinterpret_cast<u64>(&map)), "r"(src), "r"(x), "r"(y), "r"(h), "r"(b)
      : "memory");
}

// The same box stored, not added (the elements outside the map are not written).
__device__ __forceinline__ void tma_store_4d(const TmaMap& map, u32 src, int x, int y, int h,
                                             int b) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];"
      :: "l"(reinterpret_cast<u64>(&map)), "r"(src), "r"(x), "r"(y), "r"(h), "r"(b)
      : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` into
// shared `dst` by the copy engine, completing on mbarrier `bar`: a bulk copy with no
// tensor map, for rows whose addresses come from data (a paged cache's block table).
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// dst[i] += src[i] for `bytes` / 4 floats, global `dst` from shared `src` (both 16-byte
// aligned, bytes a multiple of 16), by the copy engine, each element's addition
// atomic; in the thread's current bulk group (bulk_commit). The shared source may be
// rewritten after bulk_wait_read, the sums are complete after bulk_wait.
__device__ __forceinline__ void bulk_reduce_add(float* dst, u32 src, u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
// dst[i] = src[i], the same copy without the addition.
__device__ __forceinline__ void bulk_store(float* dst, u32 src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
}
