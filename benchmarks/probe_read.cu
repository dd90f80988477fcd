// What a pure read of an NF4 weight's packed bytes costs per call when the launch is small (the M = 1 decode's fixed
// cost question, NOTES.md sessions 20-28): no decode, no MMA, no x; every loaded word is folded into one xor per warp so
// that the loads stay. benchmarks/probe_read.py drives it and compares with fastnf4.linear at M = 1 in the same run.
//   contig<U>: 256-thread blocks, thread i of block b loads U 16-byte words (b U + u) 4096 + 16 i: the dequantize's
//              pattern (whole lines per warp instruction).
//   tile<W, U>: one block of W warps per 16-row tile, the decode kernel's fragment pattern: lane (g, t) of warp w reads
//              16 bytes of rows g and g + 8 at byte 64 s + 16 t of the slices s = w, w + W, ...; U slices' loads are
//              issued before any is used.
//   tile<W, U> with table: as tile, plus 64 KiB of dynamic shared memory per block and 32 KiB of it written (the
//              decode kernels' pair table) while the first loads are in flight: what the table costs in residency.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

template <int U>
__global__ void __launch_bounds__(256) read_contig(const uint4* w, long long words, uint32_t* sink) {
  uint4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = (static_cast<long long>(blockIdx.x) * U + u) * 256 + threadIdx.x;
    v[u] = i < words ? __ldcs(w + i) : make_uint4(0, 0, 0, 0);
  }
  uint32_t x = 0;
#pragma unroll
  for (int u = 0; u < U; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x ^= __shfl_xor_sync(0xffffffffu, x, o);
  if ((threadIdx.x & 31) == 0) sink[(blockIdx.x * 8 + (threadIdx.x >> 5)) & 0xffff] = x;
}

template <int W, int U, bool kTable>
__global__ void __launch_bounds__(W * 32) read_tile(const uint8_t* w, long long N, long long K, uint32_t* sink) {
  extern __shared__ __align__(16) uint8_t sm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long row = static_cast<long long>(blockIdx.x) * 16 + g;
  const long long rb = K >> 1;
  const uint8_t* pa = w + (row < N ? row : 0) * rb + 16 * t;
  const uint8_t* pb = w + (row + 8 < N ? row + 8 : 0) * rb + 16 * t;
  const int slices = static_cast<int>(K >> 7);
  uint32_t x = 0;
  bool built = !kTable;
  for (int s0 = warp; s0 < slices; s0 += W * U) {
    uint4 a[U], b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + W * u;
      const bool on = s < slices;
      a[u] = on ? __ldcs(reinterpret_cast<const uint4*>(pa + 64LL * s)) : make_uint4(0, 0, 0, 0);
      b[u] = on ? __ldcs(reinterpret_cast<const uint4*>(pb + 64LL * s)) : make_uint4(0, 0, 0, 0);
    }
    if (!built) {
      built = true;
      for (int i = threadIdx.x; i < 2048; i += W * 32) {
        reinterpret_cast<uint4*>(sm)[(i >> 3) * 16 + (i & 7)] = make_uint4(i, i, i, i);
      }
      __syncthreads();
      x ^= reinterpret_cast<const uint32_t*>(sm)[lane * 64 + warp];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) x ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w ^ b[u].x ^ b[u].y ^ b[u].z ^ b[u].w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x ^= __shfl_xor_sync(0xffffffffu, x, o);
  if (lane == 0) sink[(blockIdx.x * W + warp) & 0xffff] = x;
}

template <int W, int U, bool kTable>
int launch_tile(const uint8_t* w, long long N, long long K, uint32_t* sink, cudaStream_t st) {
  const int smem = kTable ? 65536 : 0;
  if (kTable) cudaFuncSetAttribute(read_tile<W, U, kTable>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  read_tile<W, U, kTable><<<static_cast<unsigned>((N + 15) / 16), W * 32, smem, st>>>(w, N, K, sink);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int probe_read(int variant, const void* w, long long N, long long K, void* sink, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  auto pw = static_cast<const uint8_t*>(w);
  auto ps = static_cast<uint32_t*>(sink);
  const long long words = N * K / 32;
  switch (variant) {
    case 0: read_contig<4><<<static_cast<unsigned>((words + 1023) / 1024), 256, 0, st>>>(
                static_cast<const uint4*>(w), words, ps);
            return static_cast<int>(cudaGetLastError());
    case 1: read_contig<8><<<static_cast<unsigned>((words + 2047) / 2048), 256, 0, st>>>(
                static_cast<const uint4*>(w), words, ps);
            return static_cast<int>(cudaGetLastError());
    case 2: return launch_tile<4, 4, false>(pw, N, K, ps, st);
    case 3: return launch_tile<8, 4, false>(pw, N, K, ps, st);
    case 4: return launch_tile<16, 4, false>(pw, N, K, ps, st);
    case 5: return launch_tile<8, 8, false>(pw, N, K, ps, st);
    case 6: return launch_tile<16, 2, false>(pw, N, K, ps, st);
    case 7: return launch_tile<8, 4, true>(pw, N, K, ps, st);
    case 8: return launch_tile<16, 4, true>(pw, N, K, ps, st);
  }
  return -1;
}
