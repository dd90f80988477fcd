// NF4 dequantization variants for the paper study (fastnf4 bench paper); not used by fastnf4's ops.
//
// All four kernels share bitsandbytes' blockwise structure and differ only in how a 4-bit code becomes a
// float: (0) a branching tree on the code bits (bitsandbytes <= 0.47), (1) a 16-entry table in global memory
// (bitsandbytes >= 0.48), (2) the table copied to shared memory once per thread block (Qi, Jiang, Annavaram
// 2026), (3) a 256-entry table of value pairs in shared memory: one 8-byte lookup per packed byte.
// Shape contract: packed holds ceil(numel/2) bytes (element 2i in the high nibble of byte i), absmax one
// float per blocksize elements, out numel bf16 values = round_nearest_even(code * absmax).
// Each thread handles 8 packed bytes (16 outputs, inside one quantization block as blocksize >= 32).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

__device__ float g_nf4[16] = {-0x1.0000000000000p+0f, -0x1.6473620000000p-1f, -0x1.0cd6600000000p-1f, -0x1.9465400000000p-2f, -0x1.23449a0000000p-2f, -0x1.7a6a7e0000000p-3f, -0x1.74f0e20000000p-4f, 0x0.0p+0f, 0x1.45f5fe0000000p-4f, 0x1.4995c60000000p-3f, 0x1.f809ba0000000p-3f, 0x1.5a06740000000p-2f, 0x1.c349700000000p-2f, 0x1.200f560000000p-1f, 0x1.7227660000000p-1f, 0x1.0000000000000p+0f};

__device__ __forceinline__ float tree_nf4(unsigned v) {
  if (v & 8) {
      if (v & 4) {
          if (v & 2) {
              if (v & 1) {
                  return 0x1.0000000000000p+0f;
                } else {
                  return 0x1.7227660000000p-1f;
                }
            } else {
              if (v & 1) {
                  return 0x1.200f560000000p-1f;
                } else {
                  return 0x1.c349700000000p-2f;
                }
            }
        } else {
          if (v & 2) {
              if (v & 1) {
                  return 0x1.5a06740000000p-2f;
                } else {
                  return 0x1.f809ba0000000p-3f;
                }
            } else {
              if (v & 1) {
                  return 0x1.4995c60000000p-3f;
                } else {
                  return 0x1.45f5fe0000000p-4f;
                }
            }
        }
    } else {
      if (v & 4) {
          if (v & 2) {
              if (v & 1) {
                  return 0x0.0p+0f;
                } else {
                  return -0x1.74f0e20000000p-4f;
                }
            } else {
              if (v & 1) {
                  return -0x1.7a6a7e0000000p-3f;
                } else {
                  return -0x1.23449a0000000p-2f;
                }
            }
        } else {
          if (v & 2) {
              if (v & 1) {
                  return -0x1.9465400000000p-2f;
                } else {
                  return -0x1.0cd6600000000p-1f;
                }
            } else {
              if (v & 1) {
                  return -0x1.6473620000000p-1f;
                } else {
                  return -0x1.0000000000000p+0f;
                }
            }
        }
    }
}

template <int VARIANT>
__global__ void nf4_dequant(const uint8_t* __restrict__ packed, const float* __restrict__ absmax,
                            __nv_bfloat16* __restrict__ out, long long n_bytes, long long numel, int log2_half_block) {
  __shared__ float s_lut[16];
  __shared__ float2 s_pair[256];
  if (VARIANT == 2) {
    if (threadIdx.x < 16) s_lut[threadIdx.x] = g_nf4[threadIdx.x];
    __syncthreads();
  }
  if (VARIANT == 3) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_pair[i] = make_float2(g_nf4[i >> 4], g_nf4[i & 15]);
    __syncthreads();
  }
  const long long base = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (base >= n_bytes) return;
  const float am = absmax[base >> log2_half_block];
  uint8_t b[8];
  if (base + 8 <= n_bytes) {
    const uint2 w = *reinterpret_cast<const uint2*>(packed + base);
#pragma unroll
    for (int j = 0; j < 4; ++j) { b[j] = (w.x >> (8 * j)) & 0xFF; b[4 + j] = (w.y >> (8 * j)) & 0xFF; }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = base + j < n_bytes ? packed[base + j] : 0;
  }
  float v[16];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const unsigned hi = b[j] >> 4, lo = b[j] & 15;
    if (VARIANT == 0) { v[2 * j] = tree_nf4(hi); v[2 * j + 1] = tree_nf4(lo); }
    if (VARIANT == 1) { v[2 * j] = g_nf4[hi]; v[2 * j + 1] = g_nf4[lo]; }
    if (VARIANT == 2) { v[2 * j] = s_lut[hi]; v[2 * j + 1] = s_lut[lo]; }
    if (VARIANT == 3) { const float2 p = s_pair[b[j]]; v[2 * j] = p.x; v[2 * j + 1] = p.y; }
  }
  __nv_bfloat162 o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = __floats2bfloat162_rn(v[2 * j] * am, v[2 * j + 1] * am);
  const long long e = 2 * base;
  if (e + 16 <= numel) {
    uint4* dst = reinterpret_cast<uint4*>(out + e);
    dst[0] = *reinterpret_cast<const uint4*>(&o[0]);
    dst[1] = *reinterpret_cast<const uint4*>(&o[4]);
  } else {
    for (int j = 0; j < 16 && e + j < numel; ++j) out[e + j] = (j & 1) ? o[j / 2].y : o[j / 2].x;
  }
}

extern "C" int nf4_study_dequant(int variant, const void* packed, const void* absmax, void* out, long long numel,
                                 int blocksize, void* stream) {
  const long long n_bytes = (numel + 1) / 2;
  if (numel <= 0) return 0;
  int log2_half = 0;
  while ((2 << log2_half) < blocksize) ++log2_half;  // blocksize / 2 bytes per block
  if ((1 << log2_half) * 2 != blocksize || blocksize < 32) return 1;
  const int threads = 256;
  const long long grid = (n_bytes + threads * 8 - 1) / (threads * 8);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint8_t* p = static_cast<const uint8_t*>(packed);
  const float* a = static_cast<const float*>(absmax);
  __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out);
  switch (variant) {
    case 0: nf4_dequant<0><<<grid, threads, 0, s>>>(p, a, o, n_bytes, numel, log2_half); break;
    case 1: nf4_dequant<1><<<grid, threads, 0, s>>>(p, a, o, n_bytes, numel, log2_half); break;
    case 2: nf4_dequant<2><<<grid, threads, 0, s>>>(p, a, o, n_bytes, numel, log2_half); break;
    case 3: nf4_dequant<3><<<grid, threads, 0, s>>>(p, a, o, n_bytes, numel, log2_half); break;
    default: return 2;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
