// Shared memory as a type. A kernel family lays its shared memory out as one struct
// (`KT::Storage`, fields alignas(1024) where the 128-byte swizzle needs it), and
// `sizeof` is the only truth for its size: the kernel reads the struct, the host
// reads `smem_bytes<KT>` out of the compiled cubin (jit.py: a __constant__ symbol
// read from the ELF, no GPU needed), and no formula is written twice.
//
// Dynamic shared memory is only 16-byte aligned at the start: a Storage that needs
// 1024-byte alignment gets 1024 bytes of slack (SMEM_SLACK) and is placed at the
// first 1024-byte boundary (storage_at).
#pragma once
#include "types.cuh"

constexpr int SMEM_SLACK = 1024;

// Bytes a launch of traits KT must ask for; KT::SMEM_BYTES defines it.
template <class KT>
__constant__ u32 smem_bytes = KT::SMEM_BYTES;

// The Storage at the first 1024-byte boundary of dynamic shared memory `smem`.
template <class StorageT>
__device__ __forceinline__ StorageT& storage_at(unsigned char* smem) {
  // The shared-window address: what the swizzle and the copy engine see.
  const u32 base = static_cast<u32>(__cvta_generic_to_shared(smem));
  return *reinterpret_cast<StorageT*>(smem + ((SMEM_SLACK - base % SMEM_SLACK) % SMEM_SLACK));
}
