// What the kernels of gemv_mma.cu share (the fragment layout and the split-K scheme: gemv_mma.cu's header): the
// kernel parameters (Params), distributed shared memory loads, the m16n8k16 mma, the split-K partial sums and their
// settlement (put, sum_tile, settle_splits), the statistics of a 16-row tile (staged per phase, or fetched raw by
// cp.async a phase ahead and decoded), the cp.async copies and waits, and the 256-entry pair table (built in shared
// memory, entry v of lane l at word 64 v + l) with its one-PRMT lookups. The helpers shared with wgmma.cu are
// nf4_device.cuh's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "nf4_device.cuh"

namespace fastnf4_mma {

using fastnf4_common::cluster_barrier;
using fastnf4_common::cp_async_commit;
using fastnf4_common::Pair;
using fastnf4_common::pdl_launch_dependents;
using fastnf4_common::pdl_wait;

constexpr int kSlice = 128;   // K per warp step

struct Params {
  const uint8_t* packed;
  const void* absmax;          // float32, or uint8 codes with double quantization
  const float* nested_code;    // [256]
  const float* nested_absmax;
  const float* offset;         // [1]
  const void* x;               // [M, K] bf16 / fp16
  const void* bias;            // [N] or null
  void* y;                     // [M, N]
  float* partial;              // [S, M, N] when S > 1
  int* counters;               // [tiles], zero between launches
  long long M, N, K;
  long long blocksize;
  long long splits;            // S
  long long slices_per_split;
  const float* code;           // [16] values of the 4-bit codes (nf4 or fp4)
  long long code_const;        // code is fastnf4's own table, never written by a kernel: read before pdl_wait
  long long local;             // decode kernel: > 0 = U, split-K inside each block (see gemv_mma_pipe), else 0
  long long lcluster;          // with local: blocks per thread block cluster sharing the tiles (1: none)
  long long xs;                // decode kernel: > 0 = x staged in the table's top xs holes (see gemv_mma_pipe), else 0
  long long lsplit;            // with local and lcluster > 1: 1 = the cluster's warps split-major (see gemv_mma_pipe)
  long long gsplit;            // global settle, one item per warp: 1 = split-major items (see gemv_mma_pipe)
};

// Thread block clusters (sm_90+; the host never asks for them elsewhere; their barrier: nf4_device.cuh): the launch
// attribute, and ``ld_cluster_f32``, a load from the shared memory of the cluster's block ``rank`` at the address that
// is ``a`` in this block.
// (host side) the launch attribute of clusters of `size` blocks along x
inline void cluster_attr(cudaLaunchAttribute& a, int size) {
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = (unsigned)size;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t a, int rank) {
  float q = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %1, %2;\nld.shared::cluster.f32 %0, [ra];\n}\n"
               : "=f"(q) : "r"(a), "r"(rank) : "memory");
#else
  __trap();
#endif
  return q;
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// One output value of a work item: y (+ bias) without split-K, else this split's float32 partial.
template <typename T>
__device__ __forceinline__ void put(const Params& p, long long split, long long m, long long row, float v) {
  if (m >= p.M || row >= p.N) return;
  if (p.splits == 1) {
    Pair<T>::store(p.y, m * p.N + row, v + (p.bias ? Pair<T>::load(p.bias, row) : 0.f));
  } else {
    __stcg(p.partial + (split * p.M + m) * p.N + row, v);
  }
}

// Split-K sum of a 16-row tile whose S partials are all written: added in split order, so results are
// bitwise repeatable.
template <typename T>
__device__ __forceinline__ void sum_tile(const Params& p, long long tile, int lane) {
  const long long M = p.M, N = p.N;
  for (long long i = lane; i < 16 * M; i += 32) {  // each lane takes (m, row) pairs
    const long long m = i / 16, row = tile * 16 + (i % 16);
    if (row >= N) continue;
    float v = 0.f;
    for (long long s = 0; s < p.splits; ++s) v += __ldcg(p.partial + (s * M + m) * N + row);
    if (p.bias) v += Pair<T>::load(p.bias, row);
    Pair<T>::store(p.y, m * N + row, v);
  }
}

// Split-K end of a worker (a warp of the decode kernel, a block's warp of the GEMM kernel), once all of its
// work items have written their partial sums: one fence, then one arrival per item (an atomic counter per
// 16-row tile; lane i takes the worker's item i, so the atomics are in flight together), and the worker
// whose arrival completes a tile sums it and resets the counter. Items are first, first + stride, ... <
// items; item i covers tile (i / S) * mult + add. Settling at the end instead of after every item takes the
// fence and atomic round trips out of the main loop (H200, M = 1: 9-18% of the kernel time on the large
// weights; 22a8dd2:NOTES.md "(M <= 2) overheads").
template <typename T>
__device__ __forceinline__ void settle_splits(const Params& p, long long first, long long stride, long long items,
                                              long long mult, long long add, int lane) {
  const long long splits = p.splits;
  if (splits == 1) return;
  // Arrivals are acquire-release atomics after a warp barrier (release: cumulative over the partial sums the warp's
  // lanes wrote before the barrier; acquire: the arriving lane's, passed to the whole warp by a second warp barrier,
  // as CUTLASS's semaphore does with a block barrier), not a full fence per lane before the arrivals and another
  // before the reads: H200, two rounds, 0.2-0.3 us faster on the weights whose plans settle globally (Gemma down /
  // gate+up), the others unchanged (22a8dd2:NOTES.md "an H100 run").
  __syncwarp();  // the partial sums written by the warp's lanes precede every lane's arrival (release, cumulative)
  for (long long base = first; base < items; base += 32 * stride) {
    const long long item = base + lane * stride;
    const long long tile = (item / splits) * mult + add;
    bool last = false;
    if (item < items && tile * 16 < p.N) {
      unsigned old;
      asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(p.counters + tile) : "memory");
      last = old == static_cast<unsigned>(splits - 1);
    }
    unsigned todo = __ballot_sync(0xffffffffu, last);
    if (todo) __syncwarp();  // the arriving lanes' acquires precede the whole warp's reads of the partials
    while (todo) {
      const int src = __ffs(todo) - 1;
      todo &= todo - 1;
      const long long done = ((base + src * stride) / splits) * mult + add;
      sum_tile<T>(p, done, lane);
      __syncwarp();
      if (lane == 0) atomicExch(p.counters + done, 0);
    }
  }
}

// Statistics of a 16-row tile for the 8 slices from ``slice``: absmax of 32-code chunks [4 slice, 4 slice +
// 32) of every row, into the warp's table ``stats`` (row stride kStatStride floats). Lane l takes row l / 2,
// chunks 16 (l % 2) .. 16 (l % 2) + 15: coalesced, and the nested decode done once per chunk. Split in two so
// that a kernel can issue the loads a phase ahead (``load_stats``) and decode them when due (``store_stats``).
constexpr int kStatStride = 36;  // floats per row: 32 + 4 so that rows g and g + 1 differ by 4 banks
// A lane's 16 chunk values of a phase (row lane / 2, chunks 16 (lane % 2) ..) into the warp's table.
__device__ __forceinline__ void write_phase(float* stats, const float (&v)[16], int lane) {
  __syncwarp();  // every lane is done with the previous phase
  float4* dst = reinterpret_cast<float4*>(stats + (lane >> 1) * kStatStride + 16 * (lane & 1));
#pragma unroll
  for (int j = 0; j < 4; ++j) dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
  __syncwarp();
}

template <bool kNested> struct StatRaw {
  float a[kNested ? 2 : 16];    // absmax per chunk (0 outside), or the (at most two) nested absmax of the chunks
  uint32_t q[kNested ? 4 : 1];  // nested: the 16 uint8 absmax codes, 4 per word
  uint32_t bits;                // nested: bit j = chunk j inside the matrix, bit 16 + j = chunk j uses a[1]
};

template <bool kNested>
__device__ __forceinline__ void load_stats(const Params& p, StatRaw<kNested>& r, long long tile, int slice, int lane,
                                           int log2_bs, bool pair_shares_block) {
  const long long row = tile * 16 + (lane >> 1);
  const int K32 = static_cast<int>(p.K);
  const int k0 = slice * kSlice + 512 * (lane & 1);
  const bool row_ok = row < p.N;
  const long long e0 = row * p.K + k0;
  if constexpr (kNested) {
    const uint8_t* am = reinterpret_cast<const uint8_t*>(p.absmax);
    // 16 chunks are 512 codes: at most two nested blocks (256 blocks of >= 32 codes each)
    const long long nb0 = (e0 >> log2_bs) >> 8;
    uint32_t q[16], bits = 0;
    long long nlast = nb0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const bool on = row_ok && k0 + 32 * j < K32;
      const long long b = (e0 + 32 * j) >> log2_bs;
      if (on) {
        bits |= (1u << j) | ((b >> 8) != nb0 ? 1u << (16 + j) : 0u);
        nlast = b >> 8;
      }
      q[j] = ((j & 1) && pair_shares_block) ? q[j - 1] : on ? __ldg(am + b) : 0u;
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) r.q[w] = q[4 * w] | (q[4 * w + 1] << 8) | (q[4 * w + 2] << 16) | (q[4 * w + 3] << 24);
    r.bits = bits;
    r.a[0] = (bits & 1u) ? __ldg(p.nested_absmax + nb0) : 0.f;
    r.a[1] = (bits >> 16) ? __ldg(p.nested_absmax + nlast) : 0.f;
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const bool on = row_ok && k0 + 32 * j < K32;
      const long long b = on ? (e0 + 32 * j) >> log2_bs : 0;
      r.a[j] = ((j & 1) && pair_shares_block) ? r.a[j - 1]
                                               : on ? __ldg(reinterpret_cast<const float*>(p.absmax) + b) : 0.f;
    }
  }
}

// kPairs: each pair of chunks lies in one block (blocksize >= 64, K % 64 == 0: load_stats' pair_shares_block), so
// the odd chunk takes its even neighbour's value and the nested decode runs once per pair.
template <bool kNested, bool kPairs = false>
__device__ __forceinline__ void store_stats(const StatRaw<kNested>& r, float* stats, const float* nested_code,
                                            float offset, int lane) {
  float v[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if (kPairs && (j & 1)) {
      v[j] = v[j - 1];
    } else if constexpr (kNested) {
      const uint32_t q = (r.q[j >> 2] >> (8 * (j & 3))) & 0xffu;
      const float na = (r.bits >> (16 + j)) & 1u ? r.a[1] : r.a[0];
      // same float32 arithmetic as the dequantize reference: product rounded, then the offset added
      v[j] = (r.bits >> j) & 1u ? __fadd_rn(__fmul_rn(nested_code[q], na), offset) : 0.f;
    } else {
      v[j] = r.a[j];
    }
  }
  write_phase(stats, v, lane);
}

// The decode kernel's form: loads and decode in one go when the phase starts (each warp runs on its own there,
// so other warps cover the latency). Measured 10-14% faster in that kernel than load_stats + store_stats back
// to back (H200, M = 1: gate_up 125 vs 142 us, down 69 vs 79 us), so both forms stay.
template <bool kNested>
__device__ __forceinline__ void stage_stats(const Params& p, float* stats, const float* nested_code, float offset,
                                            long long tile, int slice, int lane, int log2_bs,
                                            bool pair_shares_block) {
  const long long row = tile * 16 + (lane >> 1);
  const int K32 = static_cast<int>(p.K);
  const int k0 = slice * kSlice + 512 * (lane & 1);
  const long long e0 = row * p.K + k0;
  const bool row_ok = row < p.N;
  float v[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if ((j & 1) && pair_shares_block) {
      v[j] = v[j - 1];
      continue;
    }
    const bool on = row_ok && k0 + 32 * j < K32;
    const long long b = on ? (e0 + 32 * j) >> log2_bs : 0;
    if constexpr (kNested) {
      const uint32_t q = on ? __ldg(reinterpret_cast<const uint8_t*>(p.absmax) + b) : 0u;
      const float na = on ? __ldg(p.nested_absmax + (b >> 8)) : 0.f;
      v[j] = on ? __fadd_rn(__fmul_rn(nested_code[q], na), offset) : 0.f;  // as the dequantize reference
    } else {
      v[j] = on ? __ldg(reinterpret_cast<const float*>(p.absmax) + b) : 0.f;
    }
  }
  write_phase(stats, v, lane);
}

// The decode kernel's asynchronous form, for blocksizes >= 64 with K % 64 == 0 (each 64-code chunk pair lies
// in one block) and a 16-byte aligned absmax array of whole 16-byte chunks: ``fetch_stats`` copies the raw
// statistics of a phase (16 rows, codes k0 .. k0 + 1023 of each) into the warp's raw area with 16-byte cp.async, a
// phase before ``decode_stats`` turns them into the warp's table. Each row's statistics of the phase lie in one
// window from the 16-byte boundary at or below its first block, which the row's two lanes copy between them:
// - without nesting, 80 bytes of float absmax at byte 80 r (lane 2 r 48 bytes, lane 2 r + 1 32); H200, M = 1,
//   double quant off: faster or equal on all 15 model weights than eight 4-byte copies of the lane's own words,
//   e.g. Llama gate_up 80.1 vs 85.8 us, Qwen down 29.8 vs 34.3 (22a8dd2:NOTES.md "statistics copies");
// - nested, 32 bytes of 8-bit codes at byte 48 r (16 bytes per lane); faster or equal on 14 of 15 model weights than
//   three 4-byte copies of the lane's own words, e.g. Llama gate_up 72.9 vs 75.1 us. The nested absmax
//   of the lane's first / last pair come by cached loads into two registers (``na_ldg``, staged-x builds), a phase
//   ahead as well (faster or equal on 14 of 15 weights than two more 4-byte copies per lane and phase, e.g. Qwen
//   gate_up 45.3 vs 46.6 us), or by copies into words 6 / 7 (word w of lane l at byte 128 w + 4 l;
//   register-x builds).
// This takes the global-load latency of ``stage_stats`` (a stall of the warp at every phase: 13-17% of
// the kernel time on the H200; 22a8dd2:NOTES.md "(M <= 2) overheads") off the warp's path.
struct PhaseAt {
  long long bf;  // block of the lane's first code
  int r;         // position of that code inside its block (a multiple of 64)
  int pairs;     // chunk pairs of the lane inside the matrix (0..8); pair i lies in block bf + ((r + 64 i) >> log2_bs)
};
__device__ __forceinline__ PhaseAt phase_at(const Params& p, long long tile, int slice, int lane, int log2_bs) {
  const long long row = tile * 16 + (lane >> 1);
  const int k0 = slice * kSlice + 512 * (lane & 1);
  const long long e0 = row * p.K + k0;
  PhaseAt a;
  a.bf = e0 >> log2_bs;
  a.r = static_cast<int>(e0 & ((1LL << log2_bs) - 1));
  a.pairs = row < p.N ? max(0, min(8, (static_cast<int>(p.K) - k0) / 64)) : 0;
  return a;
}

// Weight copies of the decode and GEMM kernels ask L2 for whole 128-byte lines (a warp's copy of one row covers
// half a line per slice; H200, M = 1: Llama gate_up / down 108.3 / 56.2 vs 112.0 / 58.9 us without, the
// other large weights within 1%): ``cp_async16_weights_if``'s .L2::128B
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int size) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(size));
}
// The weights are read once: their copies carry an L2 evict-first policy (``evict_first_policy``, made once per
// thread) besides the whole-line request.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// 16 bytes global -> shared, or 16 zero bytes where ``on`` is false: a predicate (PTX ignore-src: nothing is read)
// instead of a run-time source size, for which ptxas emits size arithmetic on every copy
__device__ __forceinline__ void cp_async16_if(uint32_t dst, const void* src, bool on) {
  asm volatile(
      "{\n .reg .pred off;\n setp.eq.u32 off, %2, 0;\n cp.async.cg.shared.global [%0], [%1], 16, off;\n}\n" ::"r"(dst),
      "l"(src), "r"(static_cast<uint32_t>(on)));
}
// The same for the weights, with the evict-first policy and the whole-line request
__device__ __forceinline__ void cp_async16_weights_if(uint32_t dst, const void* src, bool on, uint64_t policy) {
  asm volatile(
      "{\n .reg .pred off;\n setp.eq.u32 off, %2, 0;\n"
      " cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, off, %3;\n}\n" ::"r"(dst),
      "l"(src), "r"(static_cast<uint32_t>(on)), "l"(policy));
}

// the block of the first code of row tile * 16 + lane / 2 in the phase at ``slice``: its statistics window starts at
// or below it (fetch_stats, decode_stats)
__device__ __forceinline__ long long row_block0(const Params& p, long long tile, int slice, int lane, int log2_bs) {
  return (static_cast<long long>(tile * 16 + (lane >> 1)) * p.K + slice * kSlice) >> log2_bs;
}

// 16 bytes global -> shared through L1, of which the first ``size`` are read (the rest zero-filled)
__device__ __forceinline__ void cp_async16_ca(uint32_t dst, const void* src, int size) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(size));
}
// raw word of the first nested absmax (copied form; the code windows take words 0-5 of every lane)
constexpr int kNaWord = 6;

template <bool kNested>
__device__ __forceinline__ void fetch_stats(const Params& p, uint32_t raw_s, long long tile, int slice, int lane,
                                            int log2_bs, long long nblocks, float2* na_ldg = nullptr) {
  if constexpr (kNested) {
    const PhaseAt a = phase_at(p, tile, slice, lane, log2_bs);
    const uint8_t* am = reinterpret_cast<const uint8_t*>(p.absmax);
    const int span = (a.r + 64 * max(a.pairs - 1, 0)) >> log2_bs;  // last pair's block - bf
    {
      // the row's codes of the phase (at most 16 blocks from its first one, b0) lie in the aligned 32-byte window at
      // b0 & ~15: lane 2 r copies its first 16 bytes and lane 2 r + 1 the second to byte 48 r of the raw area
      const long long ws = (row_block0(p, tile, slice, lane, log2_bs) & ~15LL) + 16 * (lane & 1);
      const bool on = tile * 16 + (lane >> 1) < p.N && ws < nblocks;  // (the array's end: read what exists)
      cp_async16_ca(raw_s - 4 * lane + 48 * (lane >> 1) + 16 * (lane & 1), on ? am + ws : am,
                    on ? static_cast<int>(min(16LL, nblocks - ws)) : 0);
    }
    const float* na = p.nested_absmax + (a.bf >> 8);
    // the last pair's nested absmax (na or na + 1; a lambda: computed where used, as in the measured builds)
    auto na_last = [&]() { return na + (((a.bf & 255) + span) >> 8); };
    const int sz = a.pairs ? 4 : 0;
    if (na_ldg != nullptr) {  // the two nested absmax by cached loads into registers, used a phase later
      *na_ldg = sz ? make_float2(__ldg(na), __ldg(na_last())) : make_float2(0.f, 0.f);
    } else {
      cp_async4(raw_s + kNaWord * 128, sz ? na : p.nested_absmax, sz);
      cp_async4(raw_s + kNaWord * 128 + 128, sz ? na_last() : p.nested_absmax, sz);
    }
  } else {
    // the row's absmax of the phase (at most 16 blocks from its first one, b0) lie in the 80-byte window of floats
    // from b0 & ~3: lane 2 r copies its chunks 0-2, lane 2 r + 1 chunks 3-4, to byte 80 r of the raw area
    const long long row = tile * 16 + (lane >> 1);
    const long long ws = row_block0(p, tile, slice, lane, log2_bs) & ~3LL;
    const float* am = reinterpret_cast<const float*>(p.absmax);
    const uint32_t dst = raw_s - 4 * lane + 80 * (lane >> 1);
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      // (lane 2 r + 1 copies its chunk 4 twice: a third copy past it, even of nothing, would zero-fill the next row's)
      const int c = (lane & 1) ? min(3 + j, 4) : j;
      const long long st = ws + 4 * c;
      const bool on = row < p.N && st < nblocks;
      cp_async16_ca(dst + 16 * c, on ? am + st : am, on ? static_cast<int>(min(16LL, 4 * (nblocks - st))) : 0);
    }
  }
}

// 64 bytes of x at ``px`` (16-byte aligned), or zeros where ``on`` is false: four predicated loads off one
// address (written as C++, the compiler worked the address out again for each of them)
__device__ __forceinline__ void ldg_x4(uint4 (&v)[4], const void* px, bool on) {
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = make_uint4(0, 0, 0, 0);
  asm("{\n .reg .pred on;\n setp.ne.u32 on, %16, 0;\n"
      " @on ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%17];\n"
      " @on ld.global.nc.v4.u32 {%4, %5, %6, %7}, [%17 + 16];\n"
      " @on ld.global.nc.v4.u32 {%8, %9, %10, %11}, [%17 + 32];\n"
      " @on ld.global.nc.v4.u32 {%12, %13, %14, %15}, [%17 + 48];\n}\n"
      : "+r"(v[0].x), "+r"(v[0].y), "+r"(v[0].z), "+r"(v[0].w), "+r"(v[1].x), "+r"(v[1].y), "+r"(v[1].z),
        "+r"(v[1].w), "+r"(v[2].x), "+r"(v[2].y), "+r"(v[2].z), "+r"(v[2].w), "+r"(v[3].x), "+r"(v[3].y),
        "+r"(v[3].z), "+r"(v[3].w)
      : "r"(static_cast<uint32_t>(on)), "l"(px));
}

__device__ __forceinline__ uint32_t lds_u32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ float lds_f32(uint32_t a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a));
  return v;
}

// (raw_s / nested_s: shared addresses of the warp's raw area + 4 l (the windows lie at raw_s - 4 l + 48 r or 80 r,
// the copied nested absmax at raw_s + 128 w) and of the 256 nested code values; branch-free, with a blocksize-64
// form whose pair i is block bf + i)
template <bool kNested>
__device__ __forceinline__ void decode_stats(const Params& p, uint32_t raw_s, uint32_t nested_s, float* stats,
                                             float offset, long long tile, int slice, int lane, int log2_bs,
                                             const float2* na_ldg = nullptr) {
  float v[8];
  // the window a lane reads holds its partner lane's copies too: each lane has waited for its own, the warp barrier
  // makes the partner's visible (the memory model's requirement; H200: no time measured on it)
  __syncwarp();
  if constexpr (kNested) {
    const PhaseAt a = phase_at(p, tile, slice, lane, log2_bs);
    const int nb = static_cast<int>(a.bf & 255);
    // the lane's first code's byte in its row's window (0..23; see fetch_stats), and the aligned words from there on
    const long long ws = row_block0(p, tile, slice, lane, log2_bs) & ~15LL;
    const uint32_t wa = raw_s - 4 * lane + 48 * (lane >> 1) + (static_cast<uint32_t>(a.bf - ws) & ~3u);
    const uint32_t w0 = lds_u32(wa), w1 = lds_u32(wa + 4), w2 = lds_u32(wa + 8);
    const float na0 = na_ldg ? na_ldg->x : lds_f32(raw_s + kNaWord * 128);
    const float na1 = na_ldg ? na_ldg->y : lds_f32(raw_s + kNaWord * 128 + 128);
    // the 8-bit codes of the lane's blocks bf .. bf + 7: bytes 0-3 / 4-7 of lo / hi
    const uint32_t sh = 8 * static_cast<uint32_t>(a.bf & 3);
    const uint32_t lo = __funnelshift_r(w0, w1, sh), hi = __funnelshift_r(w1, w2, sh);
    // same float32 arithmetic as the dequantize reference: product rounded, then the offset added
    if (log2_bs == 6) {  // pair i is block bf + i: byte i, all offsets known here (half the instructions)
      // No zeroing of the pairs past K (pairs >= a.pairs): their weights and x are zero there, so their values (the
      // window's neighbouring codes times this row's nested absmax, finite wherever the row's result is) multiply
      // zero partial sums; rows past N are never written. (H200: 0.05-0.45 us faster at M = 1 on all 15 model
      // weights than the select per value, M = 2 equal; 22a8dd2:NOTES.md "statistics copies".)
      const int sw = 256 - nb;  // pairs i >= sw lie in the next nested block
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t q = __byte_perm(i < 4 ? lo : hi, 0u, 0x4440u | (i & 3));
        v[i] = __fadd_rn(__fmul_rn(lds_f32(nested_s + 4 * q), i < sw ? na0 : na1), offset);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int d = (a.r + 64 * i) >> log2_bs;  // 0..7
        const uint32_t q = ((d < 4 ? lo : hi) >> (8 * (d & 3))) & 0xffu;
        const float val = __fadd_rn(__fmul_rn(lds_f32(nested_s + 4 * q), nb + d < 256 ? na0 : na1), offset);
        v[i] = i < a.pairs ? val : 0.f;
      }
    }
  } else {
    // (pairs past K zeroed: the window's neighbouring floats are another row's absmax, which may be Inf)
    const PhaseAt a = phase_at(p, tile, slice, lane, log2_bs);
    const long long ws = row_block0(p, tile, slice, lane, log2_bs) & ~3LL;
    const uint32_t wa = raw_s - 4 * lane + 80 * (lane >> 1) + 4 * static_cast<uint32_t>(a.bf - ws);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t d = static_cast<uint32_t>((a.r + 64 * i) >> log2_bs);  // (i for blocksize 64)
      const float val = lds_f32(wa + 4 * d);
      v[i] = i < a.pairs ? val : 0.f;
    }
  }
  float v16[16];  // a chunk pair's value for both of its chunks
#pragma unroll
  for (int i = 0; i < 16; ++i) v16[i] = v[i / 2];
  write_phase(stats, v16, lane);
}

template <int j>
__device__ __forceinline__ uint32_t lookup_pipe(uint32_t table_s, uint32_t lane4, uint32_t w) {
  // bytes of the result: [4 l, byte j of w, 0, 0] -> (byte << 8) + 4 l
  const uint32_t off = __byte_perm(w, lane4, 0x5504u | (j << 4));
  uint32_t v;
  asm("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(table_s + off));
  return v;
}

// The same lookup with the table at a 64 KiB-aligned shared address: ``lane_base`` = table address | 4 l, so
// the permute alone yields the full address [4 l, byte j of w, table bytes 2-3] and the load needs no add
// (the add was one instruction per packed byte in the decode kernel's SASS).
template <int j>
__device__ __forceinline__ uint32_t lookup_based(uint32_t lane_base, uint32_t w) {
  const uint32_t addr = __byte_perm(w, lane_base, 0x7604u | (j << 4));
  uint32_t v;
  asm("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// The 256-entry pair table of the decode and GEMM kernels: entry v = (code[v >> 4], code[v & 15]) in the input dtype,
// lane l's copy at word 64 v + l (the entries' upper 128 bytes are left alone). Written with 16-byte stores, four
// lanes' copies at once: H200 (22a8dd2:NOTES.md "bounds the decode kernel"), 0.2-0.6 us faster per decode call than
// one 4-byte store per copy (the build sits between the launch and the first weight copies).
template <typename T>
__device__ __forceinline__ void build_pair_table(uint32_t* table, const float* code, int threads) {
  for (int i = threadIdx.x; i < 256 * 8; i += threads) {
    const int v = i >> 3;
    const uint32_t pr = Pair<T>::make(__ldg(code + (v >> 4)), __ldg(code + (v & 15)));
    *reinterpret_cast<uint4*>(table + v * 64 + 4 * (i & 7)) = make_uint4(pr, pr, pr, pr);
  }
}

// The same from ``code_l`` = code[lane % 16] held by every lane (the decode kernel loads it before its first weight
// copies and writes the table while they are in flight: no global load left in the build); threads % 32 == 0.
template <typename T>
__device__ __forceinline__ void build_pair_table_from(uint32_t* table, float code_l, int threads) {
  for (int i = threadIdx.x; i < 256 * 8; i += threads) {
    const int v = i >> 3;
    const uint32_t pr = Pair<T>::make(__shfl_sync(0xffffffffu, code_l, v >> 4), __shfl_sync(0xffffffffu, code_l, v & 15));
    *reinterpret_cast<uint4*>(table + v * 64 + 4 * (i & 7)) = make_uint4(pr, pr, pr, pr);
  }
}

template <int n>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(n)); }
// at most ``n`` (< kMax) of this thread's groups pending; the count is an immediate, hence the switch
template <int kMax>
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  static_assert(kMax <= 8, "extend the switch");
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: if constexpr (kMax > 1) cp_async_wait<1>(); break;
    case 2: if constexpr (kMax > 2) cp_async_wait<2>(); break;
    case 3: if constexpr (kMax > 3) cp_async_wait<3>(); break;
    case 4: if constexpr (kMax > 4) cp_async_wait<4>(); break;
    case 5: if constexpr (kMax > 5) cp_async_wait<5>(); break;
    case 6: if constexpr (kMax > 6) cp_async_wait<6>(); break;
    default: break;
  }
}

}  // namespace fastnf4_mma
