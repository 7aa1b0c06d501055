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

// The shared-window address (what mbarriers, the copy engine and wgmma descriptors
// take) of a Storage placed at the first 1024-byte boundary of dynamic shared memory
// `smem`. Kernels keep this one 32-bit base and address fields with field_addr: a
// generic 64-bit pointer to the struct would hold two more registers throughout.
__device__ __forceinline__ u32 storage_base(const unsigned char* smem) {
  const u32 base = static_cast<u32>(__cvta_generic_to_shared(smem));
  return (base + SMEM_SLACK - 1) & ~u32(SMEM_SLACK - 1);
}
// The address of Storage field `field` at shared address `base`: base + the field's
// offset, spelled as pointer arithmetic on the address (NVRTC takes no offsetof of
// a type that depends on a template parameter); nothing is dereferenced.
#define CA_FIELD(base, StorageT, field) \
  u32(reinterpret_cast<size_t>(&reinterpret_cast<StorageT*>(size_t(base))->field))
// A plain pointer to shared address `a`, through the kernel's dynamic shared array.
template <class T>
__device__ __forceinline__ T* shared_ptr(unsigned char* smem, u32 a) {
  return reinterpret_cast<T*>(smem + (a - static_cast<u32>(__cvta_generic_to_shared(smem))));
}
// The shared address of a small struct `Small` (mbarriers) kept out of Storage, in
// the alignment slack around it: just below the Storage at `base` where the slack
// before it has room, else just after it, where the rest of the slack is. A Storage
// that fills the block's shared memory to the last 1024 bytes keeps its barriers.
template <class Small, class Storage>
__device__ __forceinline__ u32 slack_addr(const unsigned char* smem, u32 base) {
  constexpr u32 BYTES = (sizeof(Small) + 7) / 8 * 8, AFTER = (sizeof(Storage) + 7) / 8 * 8;
  // before: base - raw >= BYTES; after: base - raw < BYTES, so the struct ends below
  // raw + 2 BYTES + AFTER <= raw + sizeof(Storage) + SMEM_SLACK
  static_assert(2 * BYTES + 8 <= SMEM_SLACK, "two of them fit the slack");
  const u32 raw = static_cast<u32>(__cvta_generic_to_shared(smem));
  return base - raw >= BYTES ? base - BYTES : base + AFTER;
}
