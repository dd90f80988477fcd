// Read bandwidth of the weight-stream patterns of the tensor-core kernels, alone (no decode, no MMA, no x):
// a block owns 128 rows of a [N, K/2] byte matrix and walks K with a ring of shared-memory stages, as wgmma.cu
// does. Variants: cp.async of kPiece bytes per row per stage (wgmma.cu: 32 = one 64-code step; 128 = a whole
// line), and TMA boxes of kPiece bytes x 128 rows with one mbarrier per stage. benchmarks/probe_stream.py drives it.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kRows = 128, kThreads = 256;

__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a)
               : "memory");
  return v;
}

template <int kPiece, int kStages>
__global__ void __launch_bounds__(kThreads, 2) stream_cp(const uint8_t* w, long long row_bytes, int nstages,
                                                         uint32_t* sink) {
  extern __shared__ __align__(1024) uint8_t sm[];
  constexpr int kStageBytes = kRows * kPiece, kPer = kStageBytes / 16 / kThreads, kParts = kPiece / 16;
  const int tid = threadIdx.x;
  const uint8_t* base = w + static_cast<long long>(blockIdx.x) * kRows * row_bytes;
  const uint32_t s0 = saddr(sm);
  auto issue = [&](int s) {
    if (s < nstages) {
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        const int idx = c * kThreads + tid, row = idx / kParts, part = idx % kParts;
        const uint32_t dst = s0 + (s % kStages) * kStageBytes + row * kPiece + 16 * part;
        const uint8_t* src = base + row * row_bytes + static_cast<long long>(s) * kPiece + 16 * part;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  uint32_t acc = 0;
  for (int s = 0; s < nstages; ++s) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    issue(s + kStages - 1);
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
      const uint4 v = lds128(s0 + (s % kStages) * kStageBytes + 16 * (c * kThreads + tid));
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // practically never: keeps the reads
}

template <int kPiece, int kStages>
__global__ void __launch_bounds__(kThreads, 2) stream_tma(const __grid_constant__ CUtensorMap map, int nstages,
                                                          uint32_t* sink) {
  extern __shared__ __align__(1024) uint8_t sm[];
  constexpr int kStageBytes = kRows * kPiece, kPer = kStageBytes / 16 / kThreads;
  const int tid = threadIdx.x;
  const uint32_t s0 = (saddr(sm) + 1023u) & ~1023u, bars = s0 + kStages * kStageBytes;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bars + 8 * i));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int s) {
    if (tid == 0 && s < nstages) {
      const uint32_t bar = bars + 8 * (s % kStages);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(kStageBytes)
                   : "memory");
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
          "[%4];\n" ::"r"(s0 + (s % kStages) * kStageBytes), "l"(reinterpret_cast<uint64_t>(&map)), "r"(s * kPiece),
          "r"(static_cast<int>(blockIdx.x) * kRows), "r"(bar)
          : "memory");
    }
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  uint32_t acc = 0;
  for (int s = 0; s < nstages; ++s) {
    __syncthreads();  // stage (s - 1) % kStages consumed by every thread: thread 0 refills it
    issue(s + kStages - 1);
    const uint32_t bar = bars + 8 * (s % kStages), parity = (s / kStages) & 1;
    asm volatile(
        "{\n.reg .pred done;\nwait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
      const uint4 v = lds128(s0 + (s % kStages) * kStageBytes + 16 * (c * kThreads + tid));
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

template <typename F>
int launch(F f, int smem, int grid, cudaStream_t st, void** args) {
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(f), cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
      cudaSuccess)
    return -1;
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(f), dim3(grid), dim3(kThreads), args, smem, st));
}

// extra shared memory keeps the occupancy at two blocks per SM, as in wgmma.cu
constexpr int kPad = 80 * 1024;

template <int kPiece, int kStages>
int run_cp(const uint8_t* w, long long n, long long row_bytes, uint32_t* sink, cudaStream_t st) {
  int nst = static_cast<int>(row_bytes / kPiece);
  void* args[] = {(void*)&w, (void*)&row_bytes, (void*)&nst, (void*)&sink};
  const int smem = kStages * kRows * kPiece > kPad ? kStages * kRows * kPiece : kPad;
  return launch(stream_cp<kPiece, kStages>, smem, static_cast<int>(n / kRows), st, args);
}

template <int kPiece, int kStages>
int run_tma(const uint8_t* w, long long n, long long row_bytes, uint32_t* sink, cudaStream_t st) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess || fn == nullptr)
      return -2;
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  CUtensorMap map;
  const cuuint64_t dims[2] = {(cuuint64_t)row_bytes, (cuuint64_t)n};
  const cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
  const cuuint32_t box[2] = {(cuuint32_t)kPiece, (cuuint32_t)kRows};
  const cuuint32_t unit[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(w), dims, strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, kPiece == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return -3;
  int nst = static_cast<int>(row_bytes / kPiece);
  void* args[] = {(void*)&map, (void*)&nst, (void*)&sink};
  const int need = 1024 + kStages * kRows * kPiece + 8 * kStages;
  return launch(stream_tma<kPiece, kStages>, need > kPad ? need : kPad, static_cast<int>(n / kRows), st, args);
}

}  // namespace

extern "C" int probe_stream(int variant, const uint8_t* w, long long n, long long row_bytes, uint32_t* sink,
                            cudaStream_t st) {
  switch (variant) {
    case 0: return run_cp<32, 6>(w, n, row_bytes, sink, st);    // wgmma.cu today: 32 B per row per step, 6 stages
    case 1: return run_cp<32, 12>(w, n, row_bytes, sink, st);
    case 2: return run_cp<64, 6>(w, n, row_bytes, sink, st);
    case 3: return run_cp<128, 2>(w, n, row_bytes, sink, st);
    case 4: return run_cp<128, 3>(w, n, row_bytes, sink, st);
    case 5: return run_tma<32, 6>(w, n, row_bytes, sink, st);
    case 6: return run_tma<128, 2>(w, n, row_bytes, sink, st);
    case 7: return run_tma<128, 3>(w, n, row_bytes, sink, st);
    case 8: return run_tma<128, 4>(w, n, row_bytes, sink, st);
  }
  return -4;
}
