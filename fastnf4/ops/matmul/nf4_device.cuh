// Device helpers that fastnf4's two CUDA libraries share (gemv_mma.cu and its headers, wgmma.cu), written once:
// bf16 / fp16 element access (Pair), programmatic dependent launch (pdl_wait, pdl_launch_dependents), the thread block
// cluster barrier and the cp.async group commit. Header-only plain CUDA C (no PyTorch headers), namespace
// fastnf4_common; each library takes the names it uses into its own namespace with using-declarations. Everything is
// __forceinline__: no helper is a function of its own in the SASS.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace fastnf4_common {

// bf16 / fp16 element access; every float -> T conversion rounds to nearest even (the types' constructors).
template <typename T> struct Pair {
  using T2 = typename std::conditional<std::is_same<T, __nv_bfloat16>::value, __nv_bfloat162, __half2>::type;
  // (lo, hi) as one 32-bit word of two T
  static __device__ __forceinline__ uint32_t make(float lo, float hi) {
    T2 v = T2(T(lo), T(hi));
    return *reinterpret_cast<uint32_t*>(&v);
  }
  // the 16 bits of v as T
  static __device__ __forceinline__ uint16_t bits(float v) {
    T h = T(v);
    return *reinterpret_cast<uint16_t*>(&h);
  }
  static __device__ __forceinline__ void store(void* y, long long i, float v) { reinterpret_cast<T*>(y)[i] = T(v); }
  static __device__ __forceinline__ float load(const void* p, long long i) { return float(reinterpret_cast<const T*>(p)[i]); }
};

// Programmatic dependent launch (sm_90+). Launched with the PDL attribute, a grid may start while the previous
// kernel on the stream drains; ``pdl_wait`` returns once that kernel has finished and its writes are visible, so
// every global memory access comes after it. ``pdl_launch_dependents`` lets the next PDL grid be scheduled as
// soon as every block of this one has started (it waits the same way). Both are no-ops without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The thread block cluster barrier (sm_90+; the hosts never ask for clusters elsewhere): arrive with release, wait
// with acquire, so shared memory written before it is visible to every block of the cluster after it.
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// Closes this thread's current group of cp.async copies (each library writes its own wait: gemv_mma.cu's has no
// memory clobber, wgmma.cu's has one).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

}  // namespace fastnf4_common
