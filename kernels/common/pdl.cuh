// Programmatic dependent launch (sm_90+). A kernel launched with the programmatic
// stream-serialization attribute (jit.LoadedKernel.launch_packed(dependent=True)) may
// be scheduled while the kernel before it on the stream still runs; it calls
// grid_dependency_wait() before it reads anything that kernel wrote (the wait returns
// once that grid has completed and its writes are visible). The kernel before it calls
// launch_dependents() to let it be scheduled that early, before its own end. Both are
// no-ops below sm_90 and in launches without the attribute.
#pragma once

__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
