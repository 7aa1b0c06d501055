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
