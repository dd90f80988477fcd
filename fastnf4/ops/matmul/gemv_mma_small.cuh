// The CUDA-core small-weight kernels of gemv_mma.cu (no pair table, no tensor cores): gemv_small (build ``small``,
// M <= 2) and gemv_split (build ``split``, M = 1 or 2: its kM).
// Shape contract (the host checks it, gemv_mma.py): x [M, K] and y [M, N] bf16 / fp16, contiguous, 16-byte aligned
// rows; M K sizeof(T) <= 32 KiB (x is staged whole); packed [N, K / 2] 16-byte aligned; K % 32 == 0; blocksize a
// power of two >= 32; absmax float32, or uint8 codes with nested statistics in blocks of 256; no split-K.
// Layout: gemv_small, blocks of 8 warps, one warp per weight row (the grid strides over the rows); gemv_split, blocks
// of 8 warps taking 8 weight rows at a time (4 groups of 2 rows, each group's 2 warps splitting K), launched over all
// row blocks. Dynamic shared memory: x [M, K] as T (32 KiB).
#pragma once

#include "gemv_mma_common.cuh"

namespace fastnf4_mma {

// Small-weight decode kernel (``small``, M <= 2, only when forced): one warp per weight row, CUDA cores, no shared pair table.
// For weights of a few MB the tensor-core decode kernel is bound by fixed costs (building its 64 KiB table,
// filling its pipeline, the split-K reduction), not by bytes; this one has none of them: x is staged in shared
// memory once per block, each lane reads 16-byte chunks (32 codes) of its row, looks codes up in a 16-entry float
// table (16 banks: conflict-free), sums code * x in float32 per chunk and scales by the chunk's float32 absmax
// (a chunk never straddles two quantization blocks: blocksize >= 32, K % 32 == 0); a warp shuffle reduction ends
// the row. The codes are not rounded to the input dtype (the tensor-core kernels' table is), so its error is at
// most that of cuBLAS on the dequantized weight plus the weight's own rounding.
namespace small {
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kXBytes = 32 * 1024;  // x rows as T: M * K * sizeof(T) must fit (the host checks)
constexpr int kGroup = 4;           // chunks per lane loaded before any is used
}  // namespace small

template <typename T>
__device__ __forceinline__ float2 x_pair(uint32_t v) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
}

template <typename T, bool kNested>
__global__ void __launch_bounds__(small::kThreads) gemv_small(const __grid_constant__ Params p) {
  using namespace small;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float code[16];
  __shared__ float nested_code[kNested ? 256 : 1];
  pdl_wait();
  if (threadIdx.x < 16) code[threadIdx.x] = __ldg(p.code + threadIdx.x);
  if constexpr (kNested) {
    for (int i = threadIdx.x; i < 256; i += kThreads) nested_code[i] = __ldg(p.nested_code + i);
  }
  const int M = static_cast<int>(p.M), K = static_cast<int>(p.K);
  const int xbytes = M * K * static_cast<int>(sizeof(T));  // a multiple of 64 (K % 32 == 0)
  const uint8_t* xg = reinterpret_cast<const uint8_t*>(p.x);
  for (int i = 16 * threadIdx.x; i < xbytes; i += 16 * kThreads) {
    *reinterpret_cast<uint4*>(smem + i) = __ldg(reinterpret_cast<const uint4*>(xg + i));
  }
  pdl_launch_dependents();
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int chunks = K >> 5;  // 32 codes = 16 bytes each
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const uint32_t* xs = reinterpret_cast<const uint32_t*>(smem);  // pairs of T
  const int xrow = K >> 1;                                       // pairs per x row
  for (long long row = (long long)blockIdx.x * kWarps + warp; row < p.N; row += (long long)gridDim.x * kWarps) {
    const uint4* wrow = reinterpret_cast<const uint4*>(p.packed + row * (K >> 1));
    const long long e0 = row * K;
    float acc[2] = {0.f, 0.f};
    for (int c0 = lane; c0 < chunks; c0 += 32 * kGroup) {
      uint4 w[kGroup];
      float a[kGroup];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {  // every load of the group first
        const int c = c0 + 32 * g;
        if (c < chunks) {
          w[g] = __ldcs(wrow + c);
          const long long blk = (e0 + 32LL * c) >> log2_bs;
          if constexpr (kNested) {
            const uint32_t q = __ldg(reinterpret_cast<const uint8_t*>(p.absmax) + blk);
            // as bitsandbytes' two steps: the product rounded, then the sum (no FMA)
            a[g] = __fadd_rn(__fmul_rn(nested_code[q], __ldg(p.nested_absmax + (blk >> 8))), offset);
          } else {
            a[g] = __ldg(reinterpret_cast<const float*>(p.absmax) + blk);
          }
        } else {
          w[g] = make_uint4(0, 0, 0, 0);
          a[g] = 0.f;
        }
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const int c = c0 + 32 * g;
        if (c >= chunks) break;
        const uint32_t words[4] = {w[g].x, w[g].y, w[g].z, w[g].w};
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          if (m >= M) break;
          const uint4* xc = reinterpret_cast<const uint4*>(xs + m * xrow + 16 * c);  // 32 x values of chunk c
          float s = 0.f;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint4 xv = xc[q];  // 8 x values: the 4 bytes of words[q] (hi nibble first in each byte)
            const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int b = 0; b < 4; ++b) {
              const uint32_t byte = (words[q] >> (8 * b)) & 0xffu;
              const float2 xf = x_pair<T>(xw[b]);
              s = fmaf(code[byte >> 4], xf.x, s);
              s = fmaf(code[byte & 15u], xf.y, s);
            }
          }
          acc[m] = fmaf(a[g], s, acc[m]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      if (m >= M) break;
      float v = acc[m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) Pair<T>::store(p.y, m * p.N + row, v + (p.bias ? Pair<T>::load(p.bias, row) : 0.f));
    }
  }
}

// M = 1 (and 2) small-weight kernel (``split``): like the small-weight kernel but with more, smaller pieces per row, so
// that a launch has every SM busy with several loads in flight per lane. A block takes 8 weight
// rows at a time: its warps form 4 groups of 2 rows, and the 2 warps of a group split K (kParts): lane l of part
// t takes the 16-byte chunks (32 codes) 32 (2 j + t) + l of both rows. All of a lane's chunks of one round
// (kGroup per row) and their statistics are loaded before any is used, and x is staged in shared memory once per
// block while the first loads are in flight; lookups and float32 sums as in the small-weight kernel; a warp
// shuffle reduction and a fixed-order sum of the two parts through shared memory end the rows. H200 (graph timing,
// commit 3c9bf34): k/v 4.5-6.7 us (small-weight kernel 6.8-9.3); above 16M elements the tensor-core decode kernels
// are faster (``gemv_mma.SPLIT_MAX_ELEMS``; results/h200-probe-decode-small-m1.txt).
namespace split {
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kXBytes = 32 * 1024;  // x as T: M * K * sizeof(T) must fit (the host checks)
constexpr int kParts = 2;           // warps per row group, splitting K
constexpr int kRows = 2;            // weight rows per warp
constexpr int kGroup = 4;           // chunks per lane and row loaded before any is used
constexpr int kBlockRows = kWarps / kParts * kRows;
}  // namespace split

template <typename T, bool kNested, int kM = 1>
__global__ void __launch_bounds__(split::kThreads, kM == 1 ? 3 : 2) gemv_split(const __grid_constant__ Params p) {
  using namespace split;
  static_assert(kM == 1 || kM == 2, "x rows: 1 or 2");
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float code[16];
  __shared__ float nested_code[kNested ? 256 : 1];
  __shared__ float red[kWarps][kM * kRows];  // [warp][x row x weight row] partial sums
  pdl_wait();
  const int K = static_cast<int>(p.K);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = warp / kParts, part = warp % kParts;
  const int chunks = K >> 5;  // 32 codes = 16 bytes each
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const uint32_t* xs = reinterpret_cast<const uint32_t*>(smem);  // pairs of T; x row m from xs + m K / 2
  bool staged = false;
  for (long long rb = blockIdx.x; rb * kBlockRows < p.N; rb += gridDim.x) {  // uniform over the block
    const long long row0 = rb * kBlockRows + group * kRows;
    float acc[kM][kRows];
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] = 0.f;
    for (int r0 = 0; r0 < chunks; r0 += 32 * kParts * kGroup) {  // rounds: uniform over the block
      const int base = r0 + 32 * part + lane;
      uint4 w[kRows][kGroup];
      uint32_t q[kRows][kGroup];  // float32 absmax bits, or the nested 8-bit code
      float s2[kRows][kGroup];    // nested: the code's scale
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {  // every load of the round first
        const int c = base + 32 * kParts * g;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const long long row = row0 + r;
          if (c < chunks && row < p.N) {
            const long long e = row * K + 32LL * c;
            w[r][g] = __ldcs(reinterpret_cast<const uint4*>(p.packed + (e >> 1)));
            const long long blk = e >> log2_bs;
            if constexpr (kNested) {
              q[r][g] = __ldg(reinterpret_cast<const uint8_t*>(p.absmax) + blk);
              s2[r][g] = __ldg(p.nested_absmax + (blk >> 8));
            } else {
              q[r][g] = __float_as_uint(__ldg(reinterpret_cast<const float*>(p.absmax) + blk));
              s2[r][g] = 0.f;
            }
          } else {
            w[r][g] = make_uint4(0, 0, 0, 0);
            q[r][g] = 0;
            s2[r][g] = 0.f;
          }
        }
      }
      if (!staged) {  // x and the tables, once per block, while its first weights are on their way
        staged = true;
        if (threadIdx.x < 16) code[threadIdx.x] = __ldg(p.code + threadIdx.x);
        if constexpr (kNested) nested_code[threadIdx.x] = __ldg(p.nested_code + threadIdx.x);  // kThreads == 256
        const int xbytes = kM * K * static_cast<int>(sizeof(T));  // a multiple of 64 (K % 32 == 0)
        const uint8_t* xg = reinterpret_cast<const uint8_t*>(p.x);
        for (int i = 16 * threadIdx.x; i < xbytes; i += 16 * kThreads) {
          *reinterpret_cast<uint4*>(smem + i) = __ldg(reinterpret_cast<const uint4*>(xg + i));
        }
        pdl_launch_dependents();
        __syncthreads();
      }
      const float offset = kNested ? __ldg(p.offset) : 0.f;
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const int c = base + 32 * kParts * g;
        if (c >= chunks) break;
        float am[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          // nested: as bitsandbytes' two steps, the product rounded, then the sum (no FMA)
          am[r] = kNested ? __fadd_rn(__fmul_rn(nested_code[q[r][g]], s2[r][g]), offset) : __uint_as_float(q[r][g]);
        }
        float s[kM][kRows];
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
          for (int r = 0; r < kRows; ++r) s[m][r] = 0.f;
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          uint32_t xw[kM][4];  // 8 x values of each row: the 4 bytes of word h (hi nibble first in each byte)
#pragma unroll
          for (int m = 0; m < kM; ++m) {  // the 32 x values of chunk c
            const uint4 xv = reinterpret_cast<const uint4*>(xs + m * (K >> 1) + 16 * c)[h];
            xw[m][0] = xv.x, xw[m][1] = xv.y, xw[m][2] = xv.z, xw[m][3] = xv.w;
          }
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            float2 xf[kM];
#pragma unroll
            for (int m = 0; m < kM; ++m) xf[m] = x_pair<T>(xw[m][b]);
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
              const uint32_t word = h == 0 ? w[r][g].x : h == 1 ? w[r][g].y : h == 2 ? w[r][g].z : w[r][g].w;
              const uint32_t byte = (word >> (8 * b)) & 0xffu;
              const float hi = code[byte >> 4], lo = code[byte & 15u];
#pragma unroll
              for (int m = 0; m < kM; ++m) {
                s[m][r] = fmaf(hi, xf[m].x, s[m][r]);
                s[m][r] = fmaf(lo, xf[m].y, s[m][r]);
              }
            }
          }
        }
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
          for (int r = 0; r < kRows; ++r) acc[m][r] = fmaf(am[r], s[m][r], acc[m][r]);
      }
    }
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float v = acc[m][r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[warp][m * kRows + r] = v;
      }
    __syncthreads();
    if (part == 0 && lane < kM * kRows) {  // the parts of a row added in a fixed order
      const int m = lane / kRows;
      const long long row = row0 + lane % kRows;
      if (row < p.N) {
        float v = 0.f;
#pragma unroll
        for (int t = 0; t < kParts; ++t) v += red[group * kParts + t][lane];
        Pair<T>::store(p.y, m * p.N + row, v + (p.bias ? Pair<T>::load(p.bias, row) : 0.f));
      }
    }
    __syncthreads();  // red is reused by the next row block
  }
}

}  // namespace fastnf4_mma
