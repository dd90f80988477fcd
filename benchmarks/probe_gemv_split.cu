// Probe (not used by the package): a CUDA-core M = 1 GEMV whose weight rows are split over several warps of a block
// (kS warps per row group, kRW rows per warp), every lane's weight chunks (16 bytes = 32 codes each) and statistics
// loaded before any is used, x staged in shared memory once per block, and the kS partial sums of a row added in a
// fixed order through shared memory. Question: is gemv_small's time on the few-MB weights (one warp per row, one
// block per SM on k/v: few loads in flight, two dependent rounds per row) a latency problem that more, smaller
// pieces per row fix, and how far up in weight size does such a kernel stay ahead of the tensor-core decode kernel?
// benchmarks/probe_gemv_split.py drives it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace probe_split {

struct Args {
  const uint8_t* packed;
  const void* absmax;  // float32, or uint8 codes (nested)
  const float* nested_code;
  const float* nested_absmax;
  const float* offset;
  const float* code;
  const __nv_bfloat16* x;  // [K]
  __nv_bfloat16* y;        // [N]
  int N, K, log2_bs;
};

constexpr int kWarps = 8, kThreads = 32 * kWarps;

template <bool kNested, int kS, int kRW, int kJ>
__global__ void __launch_bounds__(kThreads, 3) gemv_split(const __grid_constant__ Args a) {
  extern __shared__ __align__(16) uint8_t xs[];  // x as bf16, K values
  __shared__ float code[16];
  __shared__ float ncode[kNested ? 256 : 1];
  __shared__ float red[kWarps][kRW];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = warp / kS, part = warp % kS;
  constexpr int kRowsPerBlock = (kWarps / kS) * kRW;
  const int row0 = blockIdx.x * kRowsPerBlock + group * kRW;
  const int C = a.K >> 5;  // chunks per row
  float acc[kRW];
#pragma unroll
  for (int r = 0; r < kRW; ++r) acc[r] = 0.f;
  bool staged = false;
  for (int r0 = 0; r0 < C; r0 += 32 * kS * kJ) {  // rounds: uniform over the block (barrier in the first)
    const int base = r0 + part * 32 + lane;
    uint4 w[kRW][kJ];
    uint32_t q[kRW][kJ];
    float s2[kRW][kJ];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int c = base + 32 * kS * j;
#pragma unroll
      for (int r = 0; r < kRW; ++r) {
        const int row = row0 + r;
        if (c < C && row < a.N) {
          const long long e = static_cast<long long>(row) * a.K + 32LL * c;
          w[r][j] = __ldcs(reinterpret_cast<const uint4*>(a.packed + (e >> 1)));
          const long long blk = e >> a.log2_bs;
          if constexpr (kNested) {
            q[r][j] = __ldg(reinterpret_cast<const uint8_t*>(a.absmax) + blk);
            s2[r][j] = __ldg(a.nested_absmax + (blk >> 8));
          } else {
            q[r][j] = __float_as_uint(__ldg(reinterpret_cast<const float*>(a.absmax) + blk));
            s2[r][j] = 0.f;
          }
        } else {
          w[r][j] = make_uint4(0, 0, 0, 0);
          q[r][j] = 0;
          s2[r][j] = 0.f;
        }
      }
    }
    if (!staged) {  // x and the tables, once, while the first weights are on their way
      staged = true;
      const int xbytes = 2 * a.K;
      for (int i = 16 * threadIdx.x; i < xbytes; i += 16 * kThreads)
        *reinterpret_cast<uint4*>(xs + i) = __ldg(reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(a.x) + i));
      if (threadIdx.x < 16) code[threadIdx.x] = __ldg(a.code + threadIdx.x);
      if constexpr (kNested) ncode[threadIdx.x] = __ldg(a.nested_code + threadIdx.x);
      __syncthreads();
    }
    const float offset = kNested ? __ldg(a.offset) : 0.f;
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int c = base + 32 * kS * j;
      if (c >= C) break;
      const uint4* xc = reinterpret_cast<const uint4*>(xs + 64 * c);
      float s[kRW];
#pragma unroll
      for (int r = 0; r < kRW; ++r) s[r] = 0.f;
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const uint4 xv = xc[h];
        const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const float x0 = __uint_as_float(xw[b] << 16), x1 = __uint_as_float(xw[b] & 0xffff0000u);
#pragma unroll
          for (int r = 0; r < kRW; ++r) {
            const uint32_t word = h == 0 ? w[r][j].x : h == 1 ? w[r][j].y : h == 2 ? w[r][j].z : w[r][j].w;
            const uint32_t byte = (word >> (8 * b)) & 0xffu;
            s[r] = fmaf(code[byte >> 4], x0, s[r]);
            s[r] = fmaf(code[byte & 15u], x1, s[r]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kRW; ++r) {
        float am;
        if constexpr (kNested) am = __fadd_rn(__fmul_rn(ncode[q[r][j]], s2[r][j]), offset);
        else am = __uint_as_float(q[r][j]);
        acc[r] = fmaf(am, s[r], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRW; ++r) {
    float v = acc[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[warp][r] = v;
  }
  __syncthreads();
  if (part == 0 && lane < kRW && row0 + lane < a.N) {
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < kS; ++p) v += red[group * kS + p][lane];
    a.y[row0 + lane] = __float2bfloat16_rn(v);
  }
}

template <bool kN, int kS, int kRW>
void* pick_j(int j) {
  switch (j) {
    case 2: return (void*)gemv_split<kN, kS, kRW, 2>;
    case 4: return (void*)gemv_split<kN, kS, kRW, 4>;
    case 6: return (void*)gemv_split<kN, kS, kRW, 6>;
    default: return nullptr;
  }
}
template <bool kN, int kS>
void* pick_rw(int rw, int j) { return rw == 1 ? pick_j<kN, kS, 1>(j) : rw == 2 ? pick_j<kN, kS, 2>(j) : nullptr; }
template <bool kN>
void* pick_s(int s, int rw, int j) {
  switch (s) {
    case 1: return pick_rw<kN, 1>(rw, j);
    case 2: return pick_rw<kN, 2>(rw, j);
    case 4: return pick_rw<kN, 4>(rw, j);
    case 8: return pick_rw<kN, 8>(rw, j);
    default: return nullptr;
  }
}

}  // namespace probe_split

using probe_split::Args;
using probe_split::kWarps;
using probe_split::kThreads;

extern "C" {
int probe_args_size() { return (int)sizeof(Args); }

// rows per block of a configuration
int probe_rows_per_block(int s, int rw) { return (kWarps / s) * rw; }

int probe_gemv_split(const Args* a, int nested, int s, int rw, int j, int grid, cudaStream_t stream) {
  void* f = nested ? probe_split::pick_s<true>(s, rw, j) : probe_split::pick_s<false>(s, rw, j);
  if (f == nullptr) return (int)cudaErrorInvalidValue;
  const int smem = 2 * a->K;
  if (smem > 48 * 1024 && cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
    return (int)cudaGetLastError();
  void* args[] = {(void*)a};
  return (int)cudaLaunchKernel(f, dim3(grid), dim3(kThreads), args, smem, stream);
}
}
