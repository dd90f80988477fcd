// Decode-size NF4 matmul (M <= 32) on tensor cores: y[M, N] = x[M, K] @ dequant(W[N, K]).T (+ bias).
//
// Two kernels, one fragment layout. Warp tile: 16 rows of W x one 128-wide K slice per step. Lane
// (g = lane / 4, t = lane % 4) holds 16 packed bytes (32 codes, one "chunk") of rows n0 + g and n0 + g + 8 at K
// offset 32 t of the slice. The k order inside an mma is free as long as A and B agree, so mma step s (0..7)
// takes codes 4s..4s+3 of every lane's chunk: byte 2s feeds A registers a0a1 / a2a3 and byte 2s + 1 feeds
// a4a5 / a6a7, with B built from x at the same positions. Each packed byte is decoded by one PRMT (the byte,
// merged with the lane's offset, is the shared-memory address) and one load from a 256-entry table of value
// pairs replicated per lane (no bank conflicts whatever the codes).
//
// * gemv_mma_pipe (M <= 2, "decode"): the table holds code pairs rounded to the input dtype, so the lookup is
//   the A operand; the per-block absmax is applied after the mma in float32. Quantization blocks (>= 32 codes)
//   never split a chunk, but one slice can hold four blocks, so B column j stands for (x row j / 4, chunk
//   j % 4) and only lanes with g % 4 == t carry x: C column j holds one row of x times one chunk's codes, which
//   is scaled by that chunk's absmax after every slice. CG groups of 8 columns cover M <= 2 CG.
// * gemm_mma_pipe (2 < M <= 32): the same table, but every mma takes its 16 k values from one chunk (lane t
//   supplies word t of it), so each chunk's two mma go into a fresh fragment that is scaled by the chunk's
//   absmax in float32 and added up; B is plain x (column = x row) and MT = M / 8 tiles of 8 columns share
//   every decoded A fragment. A block's warps work on adjacent 16-row tiles of the same K slices, and x for
//   those slices is staged once per block in shared memory (cp.async ring shared with the weights) instead of
//   being read by every warp.
//
// Split-K: a work item is (row tile(s), K range). With S > 1 ranges the warps write float32 partial sums and
// the last of them (an atomic counter per 16-row tile, reset by that warp) adds the S partials in a fixed
// order, so results do not depend on timing. Warps/blocks are persistent: grid = resident blocks. The decode
// kernel can instead keep the S ranges of a tile inside one block, or one thread block cluster of C blocks
// (Params::local, Params::lcluster): the first U = (tiles per round) x S warps of the block / cluster take the
// items, the float32 partial sums stay in shared memory, and after one block / cluster barrier the blocks add them
// in the same split order (the same bits; a cluster's blocks read each other's over distributed shared memory): no
// fence, atomics or global partials.
//
// Requirements checked by the caller: K % 32 == 0, K < 2^31, x and y contiguous with 16-byte aligned rows,
// packed 16-byte aligned, blocksize >= 32, nested statistics in blocks of 256 (bitsandbytes' only value).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace fastnf4_mma {

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

// bf16 / fp16 element access; every float -> T conversion rounds to nearest even (the types' constructors).
template <typename T> struct Pair {
  using T2 = typename std::conditional<std::is_same<T, __nv_bfloat16>::value, __nv_bfloat162, __half2>::type;
  static __device__ uint32_t make(float lo, float hi) {
    T2 v = T2(T(lo), T(hi));
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ void store(void* y, long long i, float v) { reinterpret_cast<T*>(y)[i] = T(v); }
  static __device__ float load(const void* p, long long i) { return float(reinterpret_cast<const T*>(p)[i]); }
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

// Thread block clusters (sm_90+; the host never asks for them elsewhere): the cluster barrier (arrive with release,
// wait with acquire: shared memory written before it is visible to every block of the cluster after it) and a load
// from the shared memory of the cluster's block ``rank`` at the address that is ``a`` in this block.
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
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
// weights, NOTES.md session 5).
template <typename T>
__device__ __forceinline__ void settle_splits(const Params& p, long long first, long long stride, long long items,
                                              long long mult, long long add, int lane) {
  const long long splits = p.splits;
  if (splits == 1) return;
  // Arrivals are acquire-release atomics after a warp barrier (release: cumulative over the partial sums the warp's
  // lanes wrote before the barrier; acquire: the arriving lane's, passed to the whole warp by a second warp barrier,
  // as CUTLASS's semaphore does with a block barrier), instead of a full fence per lane before the arrivals and
  // another before the reads (the form before session 24): H200, probe_decode.py, two rounds, 0.2-0.3 us faster on
  // the weights whose plans settle globally (Gemma down / gate+up), the others unchanged.
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

// End of a decode-kernel work item (16 rows of one K range): each lane's two chunk columns plus its
// neighbour's give one (x row, weight row) dot product; lane t holds x row m = 2c + t / 2. With split-K these
// are partial sums, added up by ``settle_splits`` when the kernel ends.
// With the block-local split-K (``slot_s`` != 0, M <= 2) they go to shared memory instead: 16 rows x 2 x rows of
// float32 at slot_s (x row m, tile row r at + 4 (16 m + r)).
template <typename T, int CG>
__device__ __forceinline__ void finish_item(const Params& p, const float (&acc)[CG][4], long long tile,
                                            long long split, int lane, uint32_t slot_s = 0) {
  const int g = lane >> 2, t = lane & 3;
  const long long rowA = tile * 16 + g;
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    float vA = acc[c][0] + acc[c][1], vB = acc[c][2] + acc[c][3];
    vA += __shfl_xor_sync(0xffffffffu, vA, 1);
    vB += __shfl_xor_sync(0xffffffffu, vB, 1);
    if ((t & 1) == 0) {
      if (slot_s != 0) {
        const uint32_t a = slot_s + 4u * (16 * (2 * c + (t >> 1)) + g);
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(vA) : "memory");
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a + 32), "f"(vB) : "memory");
      } else {
        put<T>(p, split, 2 * c + (t >> 1), rowA, vA);
        put<T>(p, split, 2 * c + (t >> 1), rowA + 8, vB);
      }
    }
  }
}

// End of a GEMM-kernel work item for one warp's 16 rows: C fragment (row g / g + 8, column 2t / 2t + 1) of
// tile nt is y[x row 8 nt + 2t (+1), weight row].
template <typename T, int MT>
__device__ __forceinline__ void finish_gemm(const Params& p, const float (&acc)[MT][4], long long tile,
                                            long long split, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const long long rowA = tile * 16 + g;
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      put<T>(p, split, 8 * nt + 2 * t + h, rowA, acc[nt][h]);
      put<T>(p, split, 8 * nt + 2 * t + h, rowA + 8, acc[nt][2 + h]);
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
// - without nesting, 80 bytes of float absmax at byte 80 r (lane 2 r 48 bytes, lane 2 r + 1 32); H200,
//   probe_decode.py, M = 1, double quant off: faster or equal on all 15 model weights than eight 4-byte copies of
//   the lane's own words, e.g. Llama gate_up 85.8 -> 80.1 us, Qwen down 34.3 -> 29.8 (NOTES.md session 23);
// - nested, 32 bytes of 8-bit codes at byte 48 r (16 bytes per lane); faster or equal on 14 of 15 model weights than
//   three 4-byte copies of the lane's own words, e.g. Llama gate_up 75.1 -> 72.9 us (session 23). The nested absmax
//   of the lane's first / last pair come by cached loads into two registers (``na_ldg``, staged-x builds), a phase
//   ahead as well (faster or equal on 14 of 15 weights than two more 4-byte copies per lane and phase, e.g. Qwen
//   gate_up 46.6 -> 45.3 us, sessions 22-23), or by copies into words 6 / 7 (word w of lane l at byte 128 w + 4 l;
//   register-x builds).
// This takes the global-load latency of ``stage_stats`` (a stall of the warp at every phase: 13-17% of
// the kernel time on the H200, NOTES.md session 5) off the warp's path.
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
// half a line per slice; H200, probe_decode.py: M = 1 Llama gate_up / down 112.0 / 58.9 -> 108.3 / 56.2 us, the
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
  // makes the partner's visible (the memory model's requirement; H200: no time measured on it, session 23)
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
      // zero partial sums; rows past N are never written. (H200, probe_decode.py: 0.05-0.45 us faster at M = 1 on
      // all 15 model weights than the select per value, M = 2 equal; NOTES.md session 23.)
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

// ---------------------------------------------------------------------------------------------------------
// Pipelined decode kernel for M <= 2 (one column group), organised to issue few instructions per code
// and to keep many bytes in flight (ncu on the first version, session 2's kernel, Llama gate_up
// M = 1: 0.52 instructions issued per scheduler cycle, 7.3 cycles between a warp's instructions, ~8.6
// instructions per packed byte, 128 registers with spills, 16 warps per SM):
// - one PRMT + one LDS per packed byte: the table entry v of lane l sits at byte v * 256 + 4 l of a table that
//   starts at a 64 KiB-aligned shared address, so a single byte permute of (word, table | 4 l) yields the
//   full address (the upper 128 bytes of every entry are unused);
// - weights go global -> shared with cp.async into a per-warp ring of kStages slices (each lane copies and
//   later reads only its own 32 bytes, so no warp synchronisation is needed); a lane reads its bytes of the
//   next slice into registers while it computes the current one, kStages - 2 slices in flight beyond that;
//   the ring runs across work items, so a warp never drains it between items;
// - statistics are decoded once per kPhase slices into a per-warp table (row x 32-code chunk, float32), from
//   raw bytes that cp.async brought into shared memory a phase earlier (``fetch_stats``);
// - x is prefetched one slice ahead in registers (two steps per loop trip alternate the buffers); 32-bit
//   offsets inside a work item; split-K partial sums are settled when the warp has no work left.
namespace pipe {
constexpr int kPhase = 8;                      // slices per statistics phase: 32 chunks of 32 codes per row
constexpr int kTableBytes = 256 * 256;
constexpr int kHoles = 256;  // free 128-byte halves of the table's entries: block-local partial-sum slots (LOCAL_HOLES)
                             // from the bottom, staged x (Params::xs) at the top
// warps per block (one block per SM) and ring stages: kCfg 0 = 16 x 6 (112 registers), kCfg 1 = 20 x 4 (ptxas
// then keeps it at 96 registers without spills). At M = 1 on the H200 the second is 2-20% faster on weights of
// up to ~84M elements launched alone and up to 6% slower on some larger ones (NOTES.md, session 13);
// ``gemv_mma.choose`` picks.
template <int CG, int kCfg = 0> struct Cfg {
  static constexpr int kWarps = kCfg ? 20 : 16;
  static constexpr int kStages = kCfg ? 4 : 6;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRingBytes = kStages * 1024;  // [stage][row half A/B][lane] x 16 bytes
  static constexpr int kRawBytes = 16 * 80;  // raw statistics of the next phase: 16 rows' windows (see fetch_stats)
  static constexpr int kWarpBytes = kRingBytes + 16 * fastnf4_mma::kStatStride * 4 + kRawBytes;
  // the table starts at a 64 KiB-aligned shared address (see lookup_based); the warp areas fill the space below
  // it and continue above, which needs at most one warp area of slack whatever the base address is
  static constexpr int kSmem = kTableBytes + (kWarps + 1) * kWarpBytes;
};
}  // namespace pipe

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
// lanes' copies at once: H200 (probe_decode.py, NOTES.md session 20), 0.2-0.6 us faster per decode call than one
// 4-byte store per copy (the build sits between the launch and the first weight copies).
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

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
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

// Where a warp is in its sequence of (work item, slice): items warp0, warp0 + warps, ... with item = tile *
// splits + split; moving to the next item is an add with carry (no division in the loop).
struct Cursor {
  long long tile;
  int split, slice, s_end;
};

// kLocal: 1 = the block-local split-K build (Params::local > 0), 2 = the same over thread block clusters
// (Params::lcluster > 1), 3 = the global settle with split-major items and staged x (Params::gsplit); separate
// instantiations, so that each build's SASS is the one measured for it (the global settle's is the one before them;
// the cluster code cost the single-block build 8 registers and ~3% on mid weights, the split-major code the global
// staged-x build ~1.4% on Gemma gate+up when it was a runtime branch there).
// kXs: x staged once per block in the table's top Params::xs holes (hole h: the upper 128 bytes of table entry h) instead
// of loaded from global memory into registers one slice ahead: x row m fills holes h0 + m * hrow ... (h0 = kHoles - xs,
// hrow = 2 ceil(K / 128): 64 elements per hole, zero-padded to whole slices), so slice s of row m is holes 2 s and
// 2 s + 1 of it and lane t's 64 bytes of it lie at a fixed lane offset + 512 s. Per slice: one multiply-add and four
// 16-byte shared loads by the lanes that carry x (predicated: the others keep the zeros the mma needs from them)
// instead of the x cursor, the predicated global loads and a second x buffer; K % 128 == 0 (the host's condition),
// so the weight copies need no K bound (0.1-1.3 us at M = 1). H200 (probe_decode.py, M = 1, NOTES.md
// session 21): 4-14% faster on every staged weight (Llama gate_up 89.9 -> 78.6 us, q+o 17.9 -> 16.3); unpredicated
// loads (the other lanes reading a zero hole) and a block barrier after the first weight slice instead of after x
// alone were each slower than the register path.
// kPair (variants 7 / 8, M <= 4): B column n stands for (x row n / 2, chunk pair n % 2) instead of (x row n / 4,
// chunk n % 4): lane (g, t) carries x row g / 2 at its chunk t when g % 2 == t / 2. A pair of 32-code chunks (64
// codes) lies in one quantization block where the blocksize is >= 64 and K % 64 == 0 (the host's condition), so one
// absmax per C column still holds, and one column group covers four x rows: the same decode, x loads and mma per
// slice as at M <= 2. Lane (g, t) then ends with x row t's two pair columns of rows g and g + 8 (no shuffle). x in
// registers only (no staged-x build); with the block-local split-K a work item's partial sums (16 rows x 4 x rows) take
// two holes (x rows 0-1, 2-3), so a block holds half as many.
template <typename T, int CG, bool kNested, int kCfg = 0, int kLocal = 0, bool kXs = false, bool kPair = false>
__global__ void __launch_bounds__(pipe::Cfg<CG, kCfg>::kThreads, 1) gemv_mma_pipe(const __grid_constant__ Params p) {
  static_assert(!kXs || CG == 1, "staged x covers M <= 2");
  static_assert(!kPair || (CG == 1 && kLocal != 3 && !kXs), "pair columns: one column group, x in registers");
  static_assert(kLocal != 3 || kXs, "split-major global plans stage x");
  constexpr bool kBlock = kLocal == 1 || kLocal == 2;  // the block-local split-K (partial sums in shared memory)
  using C = pipe::Cfg<CG, kCfg>;
  constexpr int kStages = C::kStages, kRingBytes = C::kRingBytes, kWarpBytes = C::kWarpBytes;
  using pipe::kPhase; using pipe::kTableBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float nested_code[kNested ? 256 : 1];
  // table at the first 64 KiB-aligned shared address; warp areas below it as far as they fit, then above
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t tpad = (0u - smem_s) & 0xffffu;
  const int below = static_cast<int>(tpad) / kWarpBytes;
  uint32_t* table = reinterpret_cast<uint32_t*>(smem + tpad);
  // The pair table is built while the first weight copies are in flight (after they are issued, before the block
  // barrier ahead of the first step; H200, NOTES.md session 21), or, when its source is a constant (PDL launches),
  // before pdl_wait: it then overlaps the previous kernel's drain.
  const bool table_first = p.code_const != 0;
  static_assert(C::kThreads >= 256, "one nested code per thread");
  if (table_first && p.code_const) {
    build_pair_table<T>(table, p.code, C::kThreads);
  }
  pdl_wait();
  // (late build) the 16 code values and this thread's nested code, loaded before the weight copies are issued
  const float code_l = table_first ? 0.f : __ldg(p.code + (threadIdx.x & 15));
  const float nested_t = kNested && threadIdx.x < 256 ? __ldg(p.nested_code + threadIdx.x) : 0.f;
  if (table_first && !p.code_const) {
    build_pair_table<T>(table, p.code, C::kThreads);
  }
  auto store_nested = [&]() {  // (read after pdl_wait: the nested codes are not a constant)
    if (kNested && threadIdx.x < 256) nested_code[threadIdx.x] = nested_t;
  };
  if (table_first) store_nested();
  pdl_launch_dependents();
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  // staged x (kXs): copied into the holes here, waited for (and the block barrier) before the first step; the lane's
  // address of slice s is xs_base + s * xs_inc
  uint32_t xs_base = 0, xs_inc = 0;
  if constexpr (kXs) {
    const uint32_t holes0 = smem_s + tpad + 128u;
    const int h0 = pipe::kHoles - static_cast<int>(p.xs);
    // the staged slices: all of K, or (split-major cluster) this block's splits only
    int slice0 = 0, nsl = static_cast<int>((p.K + kSlice - 1) / kSlice);
    if (kLocal == 2 && p.lsplit) {
      const int sb = C::kWarps / static_cast<int>(p.local / p.splits);  // splits per block
      slice0 = static_cast<int>(blockIdx.x % p.lcluster) * sb * static_cast<int>(p.slices_per_split);
      nsl = sb * static_cast<int>(p.slices_per_split);
    } else if (kLocal == 3) {
      // split-major global plan: this block's warps take items of the splits s_lo .. s_hi only
      const long long tl = (p.N + 15) / 16, g0 = static_cast<long long>(blockIdx.x) * C::kWarps;
      const long long g1 = min(g0 + C::kWarps, tl * p.splits) - 1;
      const int s_lo = static_cast<int>(g0 / tl), s_hi = static_cast<int>(g1 / tl);
      slice0 = s_lo * static_cast<int>(p.slices_per_split);
      nsl = g1 < g0 ? 0 : (s_hi - s_lo + 1) * static_cast<int>(p.slices_per_split);
    }
    const int kc = nsl * (kSlice / 8);  // 16-byte pieces per staged row
    const int hrow = 2 * nsl;
    const int K8 = static_cast<int>(p.K / 8), c0 = slice0 * (kSlice / 8);
    for (int i = threadIdx.x; i < static_cast<int>(p.M) * kc; i += C::kThreads) {
      const int m = i >= kc ? 1 : 0, cc = i - m * kc;
      const bool on = c0 + cc < K8;
      cp_async16_if(holes0 + 256u * (h0 + m * hrow + (cc >> 3)) + 16u * (cc & 7),
                    on ? reinterpret_cast<const T*>(p.x) + static_cast<size_t>(m) * p.K + 8 * (c0 + cc) : p.x, on);
    }
    cp_async_commit();
    const int lg = (threadIdx.x & 31) >> 2, lt = threadIdx.x & 3, m = lg >> 2;
    const bool on = (lg & 3) == lt && m < p.M;  // (xs_inc != 0: the lane carries x)
    xs_base = on ? holes0 + 256u * (h0 + m * hrow + (lt >> 1)) + 64u * (lt & 1) - 512u * slice0 : holes0;
    xs_inc = on ? 512u : 0u;
  }
  if (table_first) __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  uint8_t* wsm = smem + (warp < below ? warp * kWarpBytes : tpad + kTableBytes + (warp - below) * kWarpBytes);
  float* stats = reinterpret_cast<float*>(wsm + kRingBytes);
  uint32_t* raw = reinterpret_cast<uint32_t*>(wsm + kWarpBytes - C::kRawBytes) + lane;  // word w at raw[32 w]
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  const uint32_t nested_s = static_cast<uint32_t>(__cvta_generic_to_shared(nested_code));
  const uint32_t lane_base = (smem_s + tpad) | (4 * lane);  // table address (a multiple of 65536) | 4 l
  // the upper 128 bytes of each 256-byte table entry are free: the block-local split-K keeps partial sums there
  const uint32_t holes_s = smem_s + tpad + 128;
  // block-local split-K: the shared address of (x row m, tile row r) in partial-sum slot ``slot`` (one hole of 16 rows
  // x 2 x rows; pair columns: two holes, x rows 0-1 and 2-3)
  auto slot_at = [&](uint32_t slot, int m, int r) -> uint32_t {
    return kPair ? holes_s + 256u * (2 * slot + (m >> 1)) + 4u * (16 * (m & 1) + r)
                 : holes_s + 256u * slot + 4u * (16 * m + r);
  };
  constexpr uint32_t kSlotHoles = kPair ? 2 : 1;
  uint32_t round = 0;  // work items this warp has finished
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(wsm)) + 16 * lane;
  const long long N = p.N, K = p.K;
  const int K32 = static_cast<int>(K);  // the host keeps K < 2^31
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const long long tiles = (N + 15) / 16;
  const int splits = static_cast<int>(p.splits);
  const int slices = static_cast<int>((K + kSlice - 1) / kSlice);
  const int per = static_cast<int>(p.slices_per_split);
  // block-local split-K (p.local = U): the block's first U warps take items b U + w (+ gridDim U per round), i.e. U / S
  // whole tiles per round; the others none (their first item is past the end)
  // (with clusters of lc blocks: the cluster's warps are numbered rank x kWarps + warp and share its U items)
  const long long U = kBlock ? p.local : C::kWarps;
  long long warp0, warps;
  if constexpr (kLocal == 2) {
    // cluster warp cw takes (local tile, split) = (cw / S, cw % S), or split-major (Params::lsplit) (cw % tpb, cw /
    // tpb): each block then holds whole splits (S / lc of them), so staged x needs only their part of K
    const int lc = static_cast<int>(p.lcluster), cw = static_cast<int>(blockIdx.x) % lc * C::kWarps + warp;
    const int tpb = static_cast<int>(U / p.splits);
    const int item = p.lsplit ? cw % tpb * static_cast<int>(p.splits) + cw / tpb : cw;
    warp0 = cw < U ? (long long)(blockIdx.x / lc) * U + item : tiles * p.splits;
    warps = (long long)(gridDim.x / lc) * U;
  } else {
    warp0 = !kBlock || warp < U ? (long long)blockIdx.x * U + warp : tiles * p.splits;
    warps = (long long)gridDim.x * U;
    // split-major global plan (Params::gsplit, at most one item per warp): warp g of the grid takes tile g % tiles of
    // split g / tiles, so that a block's warps share one or two splits and it stages only their part of x
    if constexpr (kLocal == 3) warp0 = warp0 < tiles * p.splits ? warp0 % tiles * p.splits + warp0 / tiles : warp0;
  }
  const long long wdiv = warps / splits;
  const int wmod = static_cast<int>(warps - wdiv * splits);
  const bool pair_shares_block = p.blocksize >= 64 && K % 64 == 0;
  const long long nblocks = (N * K + p.blocksize - 1) >> log2_bs;
  // statistics copied a phase ahead (16-byte cp.async of the rows' windows): the absmax array 16-byte aligned and a
  // whole number of 16-byte chunks long. (A window's copy at the array's end asks for fewer source bytes, but
  // compute-sanitizer counts such a copy as a read of all 16: benchmarks/sanitize_probe/cpasync_tail.cu.) Otherwise
  // the synchronous form; no model weight needs it (N K / blocksize is a multiple of 16 on every one).
  const bool async_stats = pair_shares_block && (reinterpret_cast<uintptr_t>(p.absmax) & 15) == 0 &&
                           (nblocks & (kNested ? 15 : 3)) == 0;

  auto begin = [&](Cursor& c, long long tile, int split) {
    c.tile = tile;
    c.split = split;
    c.slice = split * per;
    c.s_end = min(slices, c.slice + per);
    // a split past the end of K (the caller may ask for more splits than slices) still takes one all-zero
    // slice, so that its partial sums (zeros) are written and counted; never an empty item (it would not end)
    if (c.slice >= c.s_end) c.s_end = c.slice + 1;
  };
  auto advance = [&](Cursor& c) {
    if (++c.slice == c.s_end) {
      int split = c.split + wmod;
      long long tile = c.tile + wdiv;
      if (split >= splits) {
        split -= splits;
        ++tile;
      }
      begin(c, tile, split);
    }
  };

  // B operands as in gemv_mma_kernel: lane (g, t) carries x row m = 2c + g / 4 at its chunk when g % 4 == t
  // (32-bit element offsets of the lane's x values: M * K < 2^32 for M <= 2; one wide multiply-add per slice
  // gives the address. Past the last item the cursor's slice lies beyond K, so no tile check is needed.)
  uint32_t xoff[CG];
  bool xon[CG];
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    const long long m = kPair ? (g >> 1) : 2 * c + (g >> 2);
    xon[c] = (kPair ? (g & 1) == (t >> 1) : (g & 3) == t) && m < p.M;
    xoff[c] = static_cast<uint32_t>(xon[c] ? m * K : 0) + 32 * t;
  }
  auto load_x = [&](const Cursor& c, uint4 (&xb)[CG][4]) {
    const int kbase = c.slice * kSlice;
    const bool kin = kbase + 32 * t < K32;
#pragma unroll
    for (int q = 0; q < CG; ++q) {
      const T* px = reinterpret_cast<const T*>(p.x) + static_cast<size_t>(xoff[q] + static_cast<uint32_t>(kbase));
      ldg_x4(xb[q], px, xon[q] && kin);
    }
  };
  // Load cursor: weights of its slice into the ring stage at ``ring_ld`` (zero bytes outside the matrix).
  // Row pointers change only with the work item (rows outside N point at the start of the weights, which
  // is never read: source size 0).
  Cursor ld{};
  const uint8_t* ldA = p.packed;
  const uint8_t* ldB = p.packed;
  int szA = 0, szB = 0;
  auto ld_rows = [&]() {
    const long long rowA = ld.tile * 16 + g;
    szA = rowA < N ? 16 : 0;
    szB = rowA + 8 < N ? 16 : 0;
    ldA = szA ? p.packed + ((rowA * K) >> 1) + 16 * t : p.packed;
    ldB = szB ? ldA + 4 * K : p.packed;
  };
  uint32_t ring_ld = ring_s + (kStages - 1) * 1024;  // shared address of the next stage to fill
  // the weights are read once: their L2 lines are marked evict-first (H200, probe_decode.py: 2.6-4.7% faster on the
  // five large weights, two alternating rounds; as for the dequantize kernel's loads, NOTES.md session 7)
  const uint64_t wpolicy = evict_first_policy();
  auto issue = [&]() {
    if (ld.tile < tiles) {
      const int off = ld.slice * (kSlice / 2);
      // (staged x is only taken with K % 128 == 0 and no split past the end: every slice lies inside the rows)
      const bool kin = kXs || 2 * off + 32 * t < K32;
      const int o = kin ? off : 0;  // (addresses stay inside the rows even where nothing is read)
      cp_async16_weights_if(ring_ld, ldA + o, kin && szA, wpolicy);
      cp_async16_weights_if(ring_ld + 512, ldB + o, kin && szB, wpolicy);
      if (++ld.slice == ld.s_end) {
        --ld.slice;
        advance(ld);
        ld_rows();
      }
    }
    cp_async_commit();
  };
  Cursor cp;
  begin(cp, warp0 / splits, static_cast<int>(warp0 % splits));
  ld = cp;
  ld_rows();
  // nested absmax of the next phase in registers (cached loads; see fetch_stats) where x is staged: the register-x
  // builds keep the copies (with the two registers they lost 0.2-1.3 us at M = 2 on the H200, e.g. 5120 x 25600
  // 31.5 -> 32.9 us, where the cluster build spilled; equal at M = 1; NOTES.md session 23)
  constexpr bool kNaRegs = kNested && kXs;
  float2 na_store = make_float2(0.f, 0.f);
  float2* na_reg = kNaRegs ? &na_store : nullptr;
  bool fetched = false;  // the raw area holds this phase's statistics (asynchronous form) ...
  int since = 0;         // ... copied in the commit group of the step ``since`` steps ago
  // the first phase's statistics travel with the first weights (one global round trip at the start instead of
  // two: H200, probe_decode.py, M = 1: -0.3 to -1.1 us on every weight of 11-242 MB)
  if (async_stats && cp.tile < tiles) {
    fetch_stats<kNested>(p, raw_s, cp.tile, cp.slice, lane, log2_bs, nblocks, na_reg);
    cp_async_commit();
    fetched = true;
    since = kStages;  // older than the first weight stage, which is waited for before the first step
  }
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    ring_ld = ring_s + i * 1024;
    issue();
  }
  ring_ld = ring_s + (kStages - 1) * 1024;
  uint32_t ring_rd = ring_s;  // shared address of the stage read next (one slice ahead of the compute)
  const uint32_t ring_end = ring_s + kStages * 1024;
  Cursor xc = cp;  // x runs one slice ahead of the compute cursor (registers; kXs: unused)
  uint4 xb[CG][4];
  if constexpr (!kXs) {
    load_x(xc, xb);
    advance(xc);
  }
  float acc[CG][4];
#pragma unroll
  for (int c = 0; c < CG; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
  const int c0 = (2 * t) & 3;
  int rel = 0;  // slice index inside the work item
  // kXs: this lane's x registers, zeroed once (a lane without x never loads: its B operand stays zero; zeroing them
  // every slice was 8 more instructions per slice and 0.1-1.1 us slower at M = 1, H200, session 21)
  uint4 xs_keep[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) xs_keep[i] = make_uint4(0, 0, 0, 0);
  // this lane's 32 bytes of the slice at ring_rd (rows g and g + 8), read one slice ahead of their use
  auto read_ring = [&](uint4 (&w)[2]) {
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(w[0].x), "=r"(w[0].y), "=r"(w[0].z), "=r"(w[0].w)
                 : "r"(ring_rd));
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(w[1].x), "=r"(w[1].y), "=r"(w[1].z), "=r"(w[1].w)
                 : "r"(ring_rd + 512));
    ring_rd = ring_rd + 1024 == ring_end ? ring_s : ring_rd + 1024;
  };
  // one slice: mma on x ``xcur`` and weights ``wcur`` (both read a step ago); the next slice's into ``xnext`` /
  // ``wnext``
  // staged-x builds keep the lane's table and statistics addresses in registers, made opaque once per slice so that
  // ptxas does not work them out again from the thread index (it did, ~18 instructions per slice at 111 of 128
  // registers): H200, session 21, 0-0.8 us faster at M = 1 on 11 of 15 weights, none slower by more than 0.1 us. (The
  // register-x builds stay as they were: the 20-warp cluster one would spill.)
  uint32_t pin_table = lane_base, pin_stats = static_cast<uint32_t>(__cvta_generic_to_shared(stats + g * kStatStride + c0));
  auto step = [&](const uint4 (&xreg)[CG][4], uint4 (&xnext)[CG][4], const uint4 (&wcur)[2], uint4 (&wnext)[2]) {
    if constexpr (kXs) {
      asm volatile("mov.b32 %0, %0;" : "+r"(pin_table));
      asm volatile("mov.b32 %0, %0;" : "+r"(pin_stats));
    }
    const uint32_t lane_tb = kXs ? pin_table : lane_base;
    uint4 xsm[CG][4];  // kXs: this slice's x from the holes
    if constexpr (kXs) {
      const uint32_t a = xs_base + static_cast<uint32_t>(cp.slice) * xs_inc;
#pragma unroll
      for (int i = 0; i < 4; ++i) xsm[0][i] = xs_keep[i];  // (the lanes without x keep the zeros of the start)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        asm("{\n .reg .pred on;\n setp.ne.u32 on, %4, 0;\n @on ld.shared.v4.u32 {%0,%1,%2,%3}, [%5];\n}\n"
            : "+r"(xsm[0][i].x), "+r"(xsm[0][i].y), "+r"(xsm[0][i].z), "+r"(xsm[0][i].w) : "r"(xs_inc), "r"(a + 16u * i));
#pragma unroll
      for (int i = 0; i < 4; ++i) xs_keep[i] = xsm[0][i];
    }
    const uint4 (*xcur)[4] = kXs ? xsm : xreg;  // [CG][4]
    if ((rel & (kPhase - 1)) == 0) {
      if (fetched) {
        // that group is done once at most since - 1 newer ones are pending (always so after kStages - 1 steps)
        if (since < kStages - 1) cp_async_wait_upto<kStages - 1>(since - 1);
        decode_stats<kNested>(p, raw_s, nested_s, stats, offset, cp.tile, cp.slice, lane, log2_bs, na_reg);
      } else {
        stage_stats<kNested>(p, stats, nested_code, offset, cp.tile, cp.slice, lane, log2_bs, pair_shares_block);
      }
      if (async_stats) {  // copy the next phase's (same item, or the next item's first) raw statistics
        Cursor n = cp;
        if (n.slice + kPhase < n.s_end) {
          n.slice += kPhase;
        } else {
          n.slice = n.s_end - 1;
          advance(n);
        }
        fetched = n.tile < tiles;
        if (fetched) fetch_stats<kNested>(p, raw_s, n.tile, n.slice, lane, log2_bs, nblocks, na_reg);
        since = 0;
      }
    }
    ++since;
    if constexpr (!kXs) {
      load_x(xc, xnext);
      advance(xc);
    }
    issue();
    ring_ld = ring_ld + 1024 == ring_end ? ring_s : ring_ld + 1024;
    cp_async_wait<kStages - 2>();  // the next slice's group has landed (each lane waits for its own copies)
    read_ring(wnext);              // (past the last slice: stale bytes, never used)
    const uint4 wa = wcur[0], wb = wcur[1];
    const uint32_t wA[4] = {wa.x, wa.y, wa.z, wa.w};
    const uint32_t wB[4] = {wb.x, wb.y, wb.z, wb.w};
    float cf[CG][4];
#pragma unroll
    for (int c = 0; c < CG; ++c) cf[c][0] = cf[c][1] = cf[c][2] = cf[c][3] = 0.f;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint32_t a0, a1, a2, a3;
      if (s & 1) {
        a0 = lookup_based<2>(lane_tb, wA[s >> 1]);
        a1 = lookup_based<2>(lane_tb, wB[s >> 1]);
        a2 = lookup_based<3>(lane_tb, wA[s >> 1]);
        a3 = lookup_based<3>(lane_tb, wB[s >> 1]);
      } else {
        a0 = lookup_based<0>(lane_tb, wA[s >> 1]);
        a1 = lookup_based<0>(lane_tb, wB[s >> 1]);
        a2 = lookup_based<1>(lane_tb, wA[s >> 1]);
        a3 = lookup_based<1>(lane_tb, wB[s >> 1]);
      }
#pragma unroll
      for (int c = 0; c < CG; ++c) {
        const uint4 q = xcur[c][s >> 1];
        mma16816<T>(cf[c], a0, a1, a2, a3, (s & 1) ? q.z : q.x, (s & 1) ? q.w : q.y);
      }
    }
    float2 sA, sB;
    if constexpr (kXs) {
      const uint32_t a = pin_stats + 16u * static_cast<uint32_t>(rel & (kPhase - 1));
      asm("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(sA.x), "=f"(sA.y) : "r"(a));
      asm("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(sB.x), "=f"(sB.y) : "r"(a + 4u * 8 * kStatStride));
    } else if constexpr (kPair) {
      // the absmax of chunk pairs 0 / 1 (chunks 0 / 2; each pair's two chunks hold the same value)
      const int j = (rel & (kPhase - 1)) * 4;
      const float4 qa = *reinterpret_cast<const float4*>(stats + g * kStatStride + j);
      const float4 qb = *reinterpret_cast<const float4*>(stats + (g + 8) * kStatStride + j);
      sA = make_float2(qa.x, qa.z);
      sB = make_float2(qb.x, qb.z);
    } else {
      const int j = (rel & (kPhase - 1)) * 4 + c0;
      sA = *reinterpret_cast<const float2*>(stats + g * kStatStride + j);
      sB = *reinterpret_cast<const float2*>(stats + (g + 8) * kStatStride + j);
    }
#pragma unroll
    for (int c = 0; c < CG; ++c) {
      acc[c][0] = fmaf(cf[c][0], sA.x, acc[c][0]);
      acc[c][1] = fmaf(cf[c][1], sA.y, acc[c][1]);
      acc[c][2] = fmaf(cf[c][2], sB.x, acc[c][2]);
      acc[c][3] = fmaf(cf[c][3], sB.y, acc[c][3]);
    }
    ++rel;
    if (++cp.slice < cp.s_end) return;

    // the work item is complete: write its 16 rows (partial sums with split-K), then move to the next item
    // (block-local split-K: this warp's round-th item goes to table hole round x kWarps + warp)
    if constexpr (kBlock && kPair) {
      // x row t's sums of rows g / g + 8 into the item's two holes (slot_at)
      const uint32_t a = slot_at(round * C::kWarps + warp, t, g);
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(acc[0][0] + acc[0][1]) : "memory");
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a + 32), "f"(acc[0][2] + acc[0][3]) : "memory");
      ++round;
    } else if constexpr (kBlock) {
      finish_item<T, CG>(p, acc, cp.tile, cp.split, lane, holes_s + 256u * (round * C::kWarps + warp));
      ++round;
    } else if constexpr (kPair) {
      // x row t's pair columns of rows g / g + 8 (put skips x rows past M)
      const long long rowA = cp.tile * 16 + g;
      put<T>(p, cp.split, t, rowA, acc[0][0] + acc[0][1]);
      put<T>(p, cp.split, t, rowA + 8, acc[0][2] + acc[0][3]);
    } else {
      finish_item<T, CG>(p, acc, cp.tile, cp.split, lane);
    }
#pragma unroll
    for (int c = 0; c < CG; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
    --cp.slice;
    advance(cp);
    rel = 0;
  };
  // two steps per trip, alternating the x buffers (no register copies)
  uint4 xb2[CG][4], w1[2], w2[2];
  if (!table_first) {
    build_pair_table_from<T>(table, code_l, C::kThreads);
    store_nested();
  }
  if constexpr (kXs) {
    // every thread's x copies (the oldest group: younger are the first statistics' and the kStages - 1 weight
    // groups), then the block barrier; not the weights, so a warp still starts as soon as its own first slice lands
    cp_async_wait_upto<kStages + 1>(kStages - 1 + (fetched ? 1 : 0));
  }
  if (!table_first || kXs) __syncthreads();  // the table, nested codes (and staged x) written by every thread
  cp_async_wait<kStages - 2>();  // the first slice's group has landed
  read_ring(w1);
  while (cp.tile < tiles) {
    step(xb, xb2, w1, w2);
    if (cp.tile >= tiles) break;
    step(xb2, xb, w2, w1);
  }
  cp_async_wait<0>();
  if constexpr (kBlock) {
    // block-local split-K: the S partials of each of this block's (cluster's) tiles (round i, local tile lt: tile
    // (c + i clusters) U / S + lt; split s on cluster warp lt S + s, in hole i kWarps + (its warp) of its block)
    // added in split order, as sum_tile does, (+ bias) and stored; a cluster's blocks take every lc-th entry
    if constexpr (kLocal == 2) {
      cluster_barrier();
    } else {
      __syncthreads();
    }
    const int tpb = static_cast<int>(U) / splits, m_rows = static_cast<int>(p.M);
    const int per_round = tpb * 16 * m_rows;
    const int lc = kLocal == 2 ? static_cast<int>(p.lcluster) : 1;
    const int crank = kLocal == 2 ? static_cast<int>(blockIdx.x) % lc : 0;
    const long long cid = kLocal == 2 ? (long long)(blockIdx.x / lc) : (long long)blockIdx.x;
    const long long nclusters = kLocal == 2 ? (long long)(gridDim.x / lc) : (long long)gridDim.x;
    for (int e = crank * C::kThreads + threadIdx.x;; e += lc * C::kThreads) {
      const int i = e / per_round, rem = e - i * per_round;
      const long long first = (cid + (long long)i * nclusters) * tpb;
      if (static_cast<int>(kSlotHoles) * i * C::kWarps >= pipe::kHoles - (kXs ? static_cast<int>(p.xs) : 0) ||
          first >= tiles)
        break;
      const int lt = rem / (16 * m_rows), mr = rem - lt * 16 * m_rows, m = mr >> 4, r = mr & 15;
      const long long row = (first + lt) * 16 + r;
      if (row >= N) continue;
      float v = 0.f;
      if constexpr (kLocal == 2) {
        for (int z = 0; z < splits; ++z) {
          const int owner = p.lsplit ? z * tpb + lt : lt * splits + z;  // the cluster warp that took split z
          v += ld_cluster_f32(slot_at(i * C::kWarps + owner % C::kWarps, m, r), owner / C::kWarps);
        }
      } else {
        const uint32_t a = slot_at(i * C::kWarps + lt * splits, m, r);
        for (int z = 0; z < splits; ++z) {
          float q;
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(q) : "r"(a + 256u * kSlotHoles * z) : "memory");
          v += q;
        }
      }
      if (p.bias) v += Pair<T>::load(p.bias, row);
      Pair<T>::store(p.y, m * N + row, v);
    }
    if constexpr (kLocal == 2) cluster_barrier();  // every block's partials stay readable until all have read them
    return;
  }
  settle_splits<T>(p, warp0, warps, tiles * splits, 1, 0, lane);
}

// ---------------------------------------------------------------------------------------------------------
// GEMM kernel for 2 < M <= 32 (MT = 1, 2, 4 tiles of 8 x rows). A block of kWarps warps takes work items of
// kWarps adjacent 16-row tiles x one K range, all warps on the same slice at the same time: one block-wide
// cp.async ring carries, per slice, every warp's weights (1 KiB each) and the block's x slice (8 MT rows x
// 128, rows 320 bytes apart), so x is read from L2 once per block instead of once per warp. One __syncthreads
// per slice guards the ring.
// Every mma takes its 16 k values from ONE 32-code chunk (so from one quantization block): lane t supplies
// word t (codes 8t..8t+7) of the chunk, read from the ring where each lane's 16-byte chunk copy sits in an
// XOR-swizzled slot (no bank conflicts). Two mma per chunk go into a fresh fragment that is then scaled by the
// chunk's float32 absmax per row and added to the accumulators: the same arithmetic as the decode kernel
// (codes rounded to the input dtype by the table, block scale in float32) with B = plain x (column = x row).
namespace gemm {
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 4;
constexpr int kTableBytes = 256 * 256;  // as the decode kernel: entry v of lane l at byte 256 v + 4 l
constexpr int kXRow = 320;              // bytes per x row of a stage (256 used; 80 words: conflict-free reads)
constexpr int kWarpBytes = kStages * 1024 + 16 * kStatStride * 4;
template <int MT> struct Cfg {
  static constexpr int kXStage = 8 * MT * kXRow;
  static constexpr int kSmem = kTableBytes + kStages * kXStage + kWarps * kWarpBytes;
};
}  // namespace gemm

template <typename T, int MT, bool kNested>
__global__ void __launch_bounds__(gemm::kThreads, 1) gemm_mma_pipe(const __grid_constant__ Params p) {
  using namespace gemm;
  constexpr int kXStage = Cfg<MT>::kXStage;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float nested_code[kNested ? 256 : 1];
  uint32_t* table = reinterpret_cast<uint32_t*>(smem);
  // the pair table overlaps the previous kernel's drain when its source is a constant (PDL launches)
  if (!p.code_const) pdl_wait();
  build_pair_table<T>(table, p.code, kThreads);
  if (p.code_const) pdl_wait();
  pdl_launch_dependents();
  if constexpr (kNested) {
    for (int i = threadIdx.x; i < 256; i += kThreads) nested_code[i] = __ldg(p.nested_code + i);
  }
  const float offset = kNested ? __ldg(p.offset) : 0.f;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  uint8_t* xring = smem + kTableBytes;
  uint8_t* wsm = xring + kStages * kXStage + warp * kWarpBytes;
  float* stats = reinterpret_cast<float*>(wsm + kStages * 1024);
  const uint32_t table_s = static_cast<uint32_t>(__cvta_generic_to_shared(table));
  const uint32_t lane4 = 4 * lane;
  // weight ring: lane (g, c) stores its chunk c of rows g / g + 8 at slot 4 g + (c ^ (g / 2 % 4)) of the stage's
  // half A / B; lane (g, t) reads word t of every chunk c from there
  const uint32_t wring_s = static_cast<uint32_t>(__cvta_generic_to_shared(wsm));
  const uint32_t wr_dst = wring_s + 16 * (4 * g + (t ^ ((g >> 1) & 3)));
  uint32_t wr_src[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) wr_src[c] = 16 * (4 * g + (c ^ ((g >> 1) & 3))) + 4 * t;
  const uint32_t xring_s = static_cast<uint32_t>(__cvta_generic_to_shared(xring));
  const uint32_t xread_s = xring_s + g * kXRow + 16 * t;  // B fragments: x row 8 nt + g, chunk c, codes 8t..8t+7
  const long long N = p.N, K = p.K, M = p.M;
  const int K32 = static_cast<int>(K);
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const int slices = (K32 + kSlice - 1) / kSlice;
  const int splits = static_cast<int>(p.splits), per = static_cast<int>(p.slices_per_split);
  const long long items = (N + 16 * kWarps - 1) / (16 * kWarps) * splits;
  const bool pair_shares_block = p.blocksize >= 64 && K % 64 == 0;
  const uint8_t* xg = reinterpret_cast<const uint8_t*>(p.x);

  // Block cursor over (item, slice); the same for every warp of the block.
  struct BCursor {
    long long item, tile0;  // tile0: first 16-row tile of the item
    int split, slice, s_end;
  };
  auto begin = [&](BCursor& c, long long item) {
    c.item = item;
    const long long rb = item / splits;
    c.split = static_cast<int>(item - rb * splits);
    c.tile0 = rb * kWarps;
    c.slice = c.split * per;
    c.s_end = min(slices, c.slice + per);
    if (c.slice >= c.s_end) c.s_end = c.slice + 1;  // a split past K: one all-zero slice (see gemv_mma_pipe)
  };
  auto advance = [&](BCursor& c) {
    if (++c.slice == c.s_end) begin(c, c.item + gridDim.x);
  };
  // x pieces this thread copies per slice, fixed for the kernel: piece (row m, chunk c, t) = 16 bytes at
  // element 32 c + 8 t of the slice, idx % 16 = 4 c + t, stored in order at byte 320 m + 16 (4 c + t); a
  // quarter warp's 16-byte B loads (rows g, g + 1) then hit 32 distinct banks.
  constexpr int kXCopies = (8 * MT * 16 + kThreads - 1) / kThreads;
  long long xsrc[kXCopies];  // byte offset of the piece in slice 0
  uint32_t xdst[kXCopies];   // byte offset in a stage
  int xlim[kXCopies];        // the piece is inside x at slice K offset kb when kb < xlim, else zero-filled
#pragma unroll
  for (int i = 0; i < kXCopies; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int m = idx >> 4, c = (idx >> 2) & 3;
    xsrc[i] = 2LL * m * K + 16 * (idx & 15);
    xdst[i] = m * kXRow + 16 * (idx & 15);
    // (-1: no piece here; a zero fill would land outside the stage)
    xlim[i] = idx >= 8 * MT * 16 ? -1 : m < M ? max(0, K32 - 32 * c) : 0;
  }
  // This warp's weight rows for the load cursor's item (rows outside N are never read: source size 0).
  const uint8_t* ldw = p.packed;
  int szA = 0, szB = 0;
  auto ld_rows = [&](const BCursor& c) {
    const long long rowA = (c.tile0 + warp) * 16 + g;
    szA = rowA < N ? 16 : 0;
    szB = rowA + 8 < N ? 16 : 0;
    ldw = szA ? p.packed + ((rowA * K) >> 1) + 16 * t : p.packed;
  };
  // the weights are read once: evict-first, as in the decode kernel (H200, probe_decode.py at M = 16: Llama gate_up
  // 210 -> 197 us, Qwen gate_up 168 -> 145, Qwen down 76 -> 71, the others -1%)
  const uint64_t wpolicy = evict_first_policy();
  // Copies of one step into ring stage ``st`` (always one commit group, empty past the last item).
  auto issue = [&](const BCursor& c, int st) {
    if (c.item < items) {
      const int kb = c.slice * kSlice;
      const bool kin = kb + 32 * t < K32;
      const uint8_t* src = ldw + (kin ? kb / 2 : 0);  // (addresses stay inside the rows even where nothing is read)
      const uint32_t dst = wr_dst + st * 1024;
      cp_async16_weights_if(dst, src, kin && szA, wpolicy);
      cp_async16_weights_if(dst + 512, szB ? src + 4 * K : src, kin && szB, wpolicy);
#pragma unroll
      for (int i = 0; i < kXCopies; ++i) {
        if (xlim[i] < 0) continue;
        const bool on = kb < xlim[i];
        cp_async16_if(xring_s + st * kXStage + xdst[i], on ? xg + xsrc[i] + 2 * kb : xg, on);
      }
    }
    cp_async_commit();
  };
  // Item and start slice of the statistics phase after the one starting at the compute cursor.
  auto next_phase = [&](const BCursor& c, long long& tile, int& slice) {
    if (c.slice + 8 < c.s_end) {
      tile = c.tile0 + warp;
      slice = c.slice + 8;
      return c.item < items;
    }
    BCursor n;
    begin(n, c.item + gridDim.x);
    tile = n.tile0 + warp;
    slice = n.slice;
    return n.item < items;
  };

  BCursor cp, ld;
  begin(cp, blockIdx.x);
  ld = cp;
  ld_rows(ld);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    issue(ld, i);
    const long long before = ld.item;
    advance(ld);
    if (ld.item != before) ld_rows(ld);
  }
  StatRaw<kNested> sraw;
  load_stats<kNested>(p, sraw, cp.tile0 + warp, cp.slice, lane, log2_bs, pair_shares_block);
  int st = 0, st_ld = kStages - 1, rel = 0;
  float acc[MT][4];
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
  __syncthreads();  // the table and nested codes are in place
  while (cp.item < items) {
    cp_async_wait<kStages - 2>();  // this thread's copies of step ``st`` have landed
    __syncthreads();               // everyone's have; and everyone is done with the stage refilled next
    issue(ld, st_ld);
    {
      const long long before = ld.item;
      advance(ld);
      if (ld.item != before) ld_rows(ld);
    }
    st_ld = st_ld + 1 == kStages ? 0 : st_ld + 1;
    const long long tile = cp.tile0 + warp;
    if ((rel & 7) == 0) {  // decode this phase's statistics (loaded a phase ago) and load the next phase's
      if (pair_shares_block) {
        store_stats<kNested, true>(sraw, stats, nested_code, offset, lane);
      } else {
        store_stats<kNested>(sraw, stats, nested_code, offset, lane);
      }
      long long ntile;
      int nslice;
      if (next_phase(cp, ntile, nslice)) load_stats<kNested>(p, sraw, ntile, nslice, lane, log2_bs, pair_shares_block);
    }
    const uint32_t ws = wring_s + st * 1024;
    uint32_t wA[4], wB[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(wA[c]) : "r"(ws + wr_src[c]));
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(wB[c]) : "r"(ws + wr_src[c] + 512));
    }
    const float4 sA = *reinterpret_cast<const float4*>(stats + g * kStatStride + 4 * (rel & 7));
    const float4 sB = *reinterpret_cast<const float4*>(stats + (g + 8) * kStatStride + 4 * (rel & 7));
    const float scA[4] = {sA.x, sA.y, sA.z, sA.w}, scB[4] = {sB.x, sB.y, sB.z, sB.w};
    const uint32_t xs = xread_s + st * kXStage;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float cf[MT][4];
      uint4 bq[MT];  // x rows 8 nt + g at codes 8t..8t+7 of chunk c: (x, y) for h = 0, (z, w) for h = 1
#pragma unroll
      for (int nt = 0; nt < MT; ++nt) {
        cf[nt][0] = cf[nt][1] = cf[nt][2] = cf[nt][3] = 0.f;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(bq[nt].x), "=r"(bq[nt].y), "=r"(bq[nt].z),
                     "=r"(bq[nt].w) : "r"(xs + nt * 8 * kXRow + 64 * c));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a0, a1, a2, a3;
        if (h) {
          a0 = lookup_pipe<2>(table_s, lane4, wA[c]);
          a1 = lookup_pipe<2>(table_s, lane4, wB[c]);
          a2 = lookup_pipe<3>(table_s, lane4, wA[c]);
          a3 = lookup_pipe<3>(table_s, lane4, wB[c]);
        } else {
          a0 = lookup_pipe<0>(table_s, lane4, wA[c]);
          a1 = lookup_pipe<0>(table_s, lane4, wB[c]);
          a2 = lookup_pipe<1>(table_s, lane4, wA[c]);
          a3 = lookup_pipe<1>(table_s, lane4, wB[c]);
        }
#pragma unroll
        for (int nt = 0; nt < MT; ++nt) {
          mma16816<T>(cf[nt], a0, a1, a2, a3, h ? bq[nt].z : bq[nt].x, h ? bq[nt].w : bq[nt].y);
        }
      }
#pragma unroll
      for (int nt = 0; nt < MT; ++nt) {
        acc[nt][0] = fmaf(cf[nt][0], scA[c], acc[nt][0]);
        acc[nt][1] = fmaf(cf[nt][1], scA[c], acc[nt][1]);
        acc[nt][2] = fmaf(cf[nt][2], scB[c], acc[nt][2]);
        acc[nt][3] = fmaf(cf[nt][3], scB[c], acc[nt][3]);
      }
    }
    st = st + 1 == kStages ? 0 : st + 1;
    ++rel;
    if (++cp.slice < cp.s_end) continue;
    finish_gemm<T, MT>(p, acc, tile, cp.split, lane);
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    rel = 0;
    begin(cp, cp.item + gridDim.x);
  }
  cp_async_wait<0>();
  settle_splits<T>(p, blockIdx.x, gridDim.x, items, kWarps, warp, lane);
}


// ---------------------------------------------------------------------------------------------------------------
// Small-weight decode kernel (variant 4, M <= 2): one warp per weight row, CUDA cores, no shared pair table.
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

// M = 1 (and 2) small-weight kernel (variant 6): like the small-weight kernel but with more, smaller pieces per row, so
// that a launch has every SM busy with several loads in flight per lane. A block takes 8 weight
// rows at a time: its warps form 4 groups of 2 rows, and the 2 warps of a group split K (kParts): lane l of part
// t takes the 16-byte chunks (32 codes) 32 (2 j + t) + l of both rows. All of a lane's chunks of one round
// (kGroup per row) and their statistics are loaded before any is used, and x is staged in shared memory once per
// block while the first loads are in flight; lookups and float32 sums as in the small-weight kernel; a warp
// shuffle reduction and a fixed-order sum of the two parts through shared memory end the rows. H200
// (benchmarks/probe_gemv_split.py, graph timing): k/v 4.5-6.7 us (small-weight kernel 6.8-9.3), Gemma q / o 11.0
// (tensor-core decode kernel 12.5); from Qwen q (8192 x 5120) up the tensor-core kernel is faster (14.9 vs 17.0).
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


// ---------------------------------------------------------------------------------------------------------------
// Burst decode kernel (variant 9, M <= 2; NOTES.md session 28, benchmarks/probe_burst.cu's gemv_burst_r with 4 warps):
// small persistent blocks (4 warps, 3 per SM), each owning one 16-row tile over all of K at a time, tiles in turn. A
// warp's rounds are the slice pairs q = warp, warp + 4, ... of the tile (256 codes: the decode kernel's fragment layout
// over two 128-code slices); every load of a round (four 16-byte weight pieces, one aligned 4-byte word of a row's
// absmax codes and one nested absmax per row) goes into registers two rounds ahead of its decode (three buffers), no
// cp.async ring. The pair table (lane l's copy at word 64 v + l), the nested codes and x (in the table's holes) are set
// up once per block while the first rounds fly; a tile ends with the warps' row sums added in warp order in shared
// memory (bitwise repeatable). For a kernel without static shared memory the dynamic array starts at the window offset
// kBurstBase (sm_90: after the 1 KiB the system reserves), where a table lookup is one PRMT + one LDS [R + imm]; where
// it does not (checked per block), the same code with the base in a register.
// H200, M = 1 / 2 (probe_burst.py, interleaved with fastnf4.linear, results/h200-probe-burst-m1.json / -m2.json): faster
// than the decode kernels on the 11-22M-element weights of N >= 2048 (Gemma q 8.3 vs 8.9 us, o 8.3 vs 10.3, k+v 6.7
// vs 7.2 at M = 1), not elsewhere (``gemv_mma.burst_wanted``).
// Needs (the host checks): M <= 2, K % 256 == 0, blocksize >= 64 (a power of two), M K <= 16384, N K < 2^31, the
// absmax array 4-byte aligned (its code words are read whole).
// Copies of a row's aligned absmax-code word can read up to 3 bytes past the last block, never past its aligned word.
namespace burst {
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kNc = 256 / kThreads;  // nested codes per thread
constexpr int kSmem = 65536 + 1024 + kWarps * 256;  // table, nested codes, row sums [2][warps][32]
constexpr uint32_t kBase = 1024;

template <bool kImm>
__device__ __forceinline__ uint32_t lookup(uint32_t lane4, uint32_t w, int j, uint32_t tab) {
  const uint32_t off = __byte_perm(w, lane4, 0x5504u | (j << 4));
  uint32_t v;
  if constexpr (kImm) {
    asm("ld.shared.u32 %0, [%1+1024];\n" : "=r"(v) : "r"(off));
  } else {
    asm("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(tab + off));
  }
  return v;
}

// one round's loads: weights of slices 2q, 2q + 1 of rows g / g + 8, the rows' absmax-code words (or float absmax)
template <bool kNested> struct Round {
  uint4 wa[2], wb[2];
  uint32_t ca, cb;     // nested: the aligned word of absmax codes of rows A / B
  float na, nb;        // nested: the round's nested absmax of rows A / B
  float fa[2], fb[2];  // not nested: the float32 absmax of the lane's block, per slice
  int ea, eb, q;       // element offsets of the lane's rows (0 past N), the pair (>= pairs: an empty round)
};

template <typename T, bool kNested, bool kImm>
__device__ __forceinline__ void body(const Params& p, uint8_t* smem, float code_l, const float (&nested_t)[kNc],
                                     float offset) {
  constexpr int W = kWarps;
  float* nested_code = reinterpret_cast<float*>(smem + 65536);
  float (*red)[W][32] = reinterpret_cast<float (*)[W][32]>(smem + 65536 + 1024);
  const uint32_t tab = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int K = static_cast<int>(p.K), M = static_cast<int>(p.M), N = static_cast<int>(p.N);
  const int tiles = (N + 15) / 16, pairs = K >> 8;
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const int c0 = (2 * t) & 3;  // the lane's C columns are chunks c0, c0 + 1 (one quantization block)
  const uint32_t lane4 = 4u * lane;
  const bool xon = (g & 3) == t && (g >> 2) < M;
  // the lane's x of slice s: hole (m K + 128 s + 32 t) / 64 (upper 128 bytes of that entry), byte 64 (t & 1)
  const uint32_t x_off = 128u + 256u * static_cast<uint32_t>(((g >> 2) * K + 32 * t) >> 6) + 64u * (t & 1);
  const uint8_t* am8 = reinterpret_cast<const uint8_t*>(p.absmax);
  const float* am32 = reinterpret_cast<const float*>(p.absmax);

  auto advance = [&](int& tl, int& qq) {
    qq += W;
    if (qq >= pairs) {
      qq = warp;
      tl += gridDim.x;
    }
  };
  auto load = [&](Round<kNested>& b, int tl, int qq) {
    const int ra = tl * 16 + g, rb = ra + 8;
    const bool live = tl < tiles && qq < pairs;
    const bool onA = live && ra < N, onB = live && rb < N;
    b.ea = onA ? ra * K : 0;
    b.eb = onB ? rb * K : 0;
    b.q = tl < tiles ? qq : pairs;
    const int o = live ? 128 * qq : 0;  // bytes of the pair in a row
    const uint8_t* pa = p.packed + (b.ea >> 1) + 16 * t + o;
    const uint8_t* pb = p.packed + (b.eb >> 1) + 16 * t + o;
    b.wa[0] = onA ? __ldcs(reinterpret_cast<const uint4*>(pa)) : make_uint4(0, 0, 0, 0);
    b.wa[1] = onA ? __ldcs(reinterpret_cast<const uint4*>(pa + 64)) : make_uint4(0, 0, 0, 0);
    b.wb[0] = onB ? __ldcs(reinterpret_cast<const uint4*>(pb)) : make_uint4(0, 0, 0, 0);
    b.wb[1] = onB ? __ldcs(reinterpret_cast<const uint4*>(pb + 64)) : make_uint4(0, 0, 0, 0);
    const int ba = (b.ea + 2 * o) >> log2_bs, bb = (b.eb + 2 * o) >> log2_bs;  // first block of the round
    if constexpr (kNested) {
      b.ca = __ldg(reinterpret_cast<const uint32_t*>(am8 + (ba & ~3)));
      b.cb = __ldg(reinterpret_cast<const uint32_t*>(am8 + (bb & ~3)));
      b.na = __ldg(p.nested_absmax + (ba >> 8));  // (256 codes of a round: one nested block)
      b.nb = __ldg(p.nested_absmax + (bb >> 8));
    } else {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        b.fa[u] = __ldg(am32 + ((b.ea + 2 * o + 128 * u + 32 * c0) >> log2_bs));
        b.fb[u] = __ldg(am32 + ((b.eb + 2 * o + 128 * u + 32 * c0) >> log2_bs));
      }
    }
  };
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  auto decode = [&](const Round<kNested>& b) {
    if (b.q >= pairs) return;
    const int o = 128 * b.q;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      float sa, sb;
      if constexpr (kNested) {  // the lane's block as a byte of the aligned code word; as bitsandbytes: product, then sum
        const int ia = ((b.ea + 2 * o + 128 * u + 32 * c0) >> log2_bs) - (((b.ea + 2 * o) >> log2_bs) & ~3);
        const int ib = ((b.eb + 2 * o + 128 * u + 32 * c0) >> log2_bs) - (((b.eb + 2 * o) >> log2_bs) & ~3);
        sa = __fadd_rn(__fmul_rn(nested_code[(b.ca >> (8 * ia)) & 0xffu], b.na), offset);
        sb = __fadd_rn(__fmul_rn(nested_code[(b.cb >> (8 * ib)) & 0xffu], b.nb), offset);
      } else {
        sa = b.fa[u];
        sb = b.fb[u];
      }
      uint4 xv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) xv[i] = make_uint4(0, 0, 0, 0);
      if (xon) {
        const uint32_t xa = x_off + 512u * (2 * b.q + u);
#pragma unroll
        for (int i = 0; i < 4; ++i) xv[i] = *reinterpret_cast<const uint4*>(smem + xa + 16u * i);
      }
      const uint32_t xw[16] = {xv[0].x, xv[0].y, xv[0].z, xv[0].w, xv[1].x, xv[1].y, xv[1].z, xv[1].w,
                               xv[2].x, xv[2].y, xv[2].z, xv[2].w, xv[3].x, xv[3].y, xv[3].z, xv[3].w};
      const uint4 wa = b.wa[u], wb = b.wb[u];
      const uint32_t A[4] = {wa.x, wa.y, wa.z, wa.w}, B[4] = {wb.x, wb.y, wb.z, wb.w};
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // codes 4i..4i+3: byte 2i (a0 / a1) and 2i + 1 (a2 / a3) of each row's chunk
        const int j = 2 * (i & 1);
        const uint32_t a0 = lookup<kImm>(lane4, A[i >> 1], j, tab), a1 = lookup<kImm>(lane4, B[i >> 1], j, tab);
        const uint32_t a2 = lookup<kImm>(lane4, A[i >> 1], j + 1, tab);
        const uint32_t a3 = lookup<kImm>(lane4, B[i >> 1], j + 1, tab);
        mma16816<T>(c, a0, a1, a2, a3, xw[2 * i], xw[2 * i + 1]);
      }
      acc[0] = fmaf(sa, c[0], acc[0]);
      acc[1] = fmaf(sa, c[1], acc[1]);
      acc[2] = fmaf(sb, c[2], acc[2]);
      acc[3] = fmaf(sb, c[3], acc[3]);
    }
  };
  int parity = 0;
  auto finish = [&](int tl) {  // every warp of the block, once per tile
    // lane (g, t): x row t / 2, rows g (acc 0-1) and g + 8 (acc 2-3); lanes t and t ^ 1 hold chunks 0-1 and 2-3
    float va = acc[0] + acc[1], vb = acc[2] + acc[3];
    va += __shfl_xor_sync(0xffffffffu, va, 1);
    vb += __shfl_xor_sync(0xffffffffu, vb, 1);
    if ((t & 1) == 0) {
      red[parity][warp][16 * (t >> 1) + g] = va;
      red[parity][warp][16 * (t >> 1) + g + 8] = vb;
    }
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    __syncthreads();
    if (threadIdx.x < 16 * M) {
      const int m = threadIdx.x >> 4, row = tl * 16 + (threadIdx.x & 15);
      if (row < N) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) v += red[parity][w][threadIdx.x];
        Pair<T>::store(p.y, static_cast<long long>(m) * N + row, v + (p.bias ? Pair<T>::load(p.bias, row) : 0.f));
      }
    }
    parity ^= 1;  // (the next tile's barrier orders the reuse of this buffer after these reads)
  };
  Round<kNested> b0, b1, b2;
  int tile = blockIdx.x, q = warp;  // decode cursor
  int tl_ld = tile, q_ld = q;       // load cursor, two rounds ahead after the prologue
  load(b0, tl_ld, q_ld);
  advance(tl_ld, q_ld);
  load(b1, tl_ld, q_ld);
  advance(tl_ld, q_ld);
  {  // set-up while the first rounds fly: table, nested codes, x in the holes (piece i of 8 values: hole i / 8)
    build_pair_table_from<T>(reinterpret_cast<uint32_t*>(smem), code_l, kThreads);
#pragma unroll
    for (int i = 0; i < kNc; ++i)
      if (kNested) nested_code[i * kThreads + threadIdx.x] = nested_t[i];
    const int pieces = M * K / 8;
    const uint4* xg = reinterpret_cast<const uint4*>(p.x);
    for (int i = threadIdx.x; i < pieces; i += kThreads) {
      *reinterpret_cast<uint4*>(smem + 128 + 256 * (i >> 3) + 16 * (i & 7)) = __ldg(xg + i);
    }
    pdl_launch_dependents();
    __syncthreads();
  }
  auto step = [&](Round<kNested>& cur, Round<kNested>& free) -> bool {
    load(free, tl_ld, q_ld);
    advance(tl_ld, q_ld);
    decode(cur);
    const int tl = tile;
    advance(tile, q);
    if (tile != tl) finish(tl);
    return tile < tiles;
  };
  if (tile < tiles) {
    while (step(b0, b2) && step(b1, b0) && step(b2, b1)) {
    }
  }
}
}  // namespace burst

template <typename T, bool kNested>
__global__ void __launch_bounds__(burst::kThreads, 3) gemv_burst(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) uint8_t smem[];  // no static shared memory (see kBase)
  pdl_wait();
  const float code_l = __ldg(p.code + (threadIdx.x & 15));
  float nested_t[burst::kNc];
#pragma unroll
  for (int i = 0; i < burst::kNc; ++i) nested_t[i] = kNested ? __ldg(p.nested_code + i * burst::kThreads + threadIdx.x) : 0.f;
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  if (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) == burst::kBase) {
    burst::body<T, kNested, true>(p, smem, code_l, nested_t, offset);
  } else {
    burst::body<T, kNested, false>(p, smem, code_l, nested_t, offset);
  }
}

// Kernel variants: 0 = decode kernel (M <= 2); 1 / 2 / 3 = GEMM kernel with 1 / 2 / 4 tiles of 8 rows (M <= 8 /
// 16 / 32); 4 = small-weight decode kernel (M <= 2, small weights: ``gemv_mma.choose``); 5 = the decode kernel
// with 20 warps x 4 stages (``gemv_mma.choose``); 6 = the split small-weight kernel (M = 1); 7 / 8 = the decode
// kernel of 16 / 20 warps with pair columns (M <= 4, blocksize >= 64, K % 64 == 0; see kPair), which takes M = 3-4
// since session 27 (before, the GEMM kernel: on the H200 it had beaten the decode kernel with 2 column groups there,
// gate_up 166 vs 172 us, down 75 vs 88 us; NOTES.md session 4); 9 = the burst decode kernel (M <= 2, session 28:
// ``gemv_mma.burst_wanted``).
template <typename T, bool kNested>
void* pick(int variant) {
  switch (variant) {
    case 0: return (void*)gemv_mma_pipe<T, 1, kNested>;
    case 1: return (void*)gemm_mma_pipe<T, 1, kNested>;
    case 2: return (void*)gemm_mma_pipe<T, 2, kNested>;
    case 3: return (void*)gemm_mma_pipe<T, 4, kNested>;
    case 4: return (void*)gemv_small<T, kNested>;
    case 5: return (void*)gemv_mma_pipe<T, 1, kNested, 1>;
    case 6: return (void*)gemv_split<T, kNested>;
    case 7: return (void*)gemv_mma_pipe<T, 1, kNested, 0, 0, false, true>;
    case 8: return (void*)gemv_mma_pipe<T, 1, kNested, 1, 0, false, true>;
    case 9: return (void*)gemv_burst<T, kNested>;
  }
  return nullptr;
}
// the decode kernels' builds by split-K settle (local: 0 global, 1 block-local, 2 over clusters, 3 global with
// split-major items: staged x only), x path (kXs) and columns (kPair: x in registers only)
template <typename T, bool kNested, int kCfg, bool kXs, bool kPair = false>
void* pick_decode(int local) {
  if constexpr (kXs) {
    if (local == 3) return (void*)gemv_mma_pipe<T, 1, kNested, kCfg, 3, true>;
  }
  return local == 2 ? (void*)gemv_mma_pipe<T, 1, kNested, kCfg, 2, kXs, kPair>
         : local == 1 ? (void*)gemv_mma_pipe<T, 1, kNested, kCfg, 1, kXs, kPair>
         : local == 0 ? (void*)gemv_mma_pipe<T, 1, kNested, kCfg, 0, kXs, kPair>
                      : nullptr;
}
template <typename T, bool kNested>
void* pick_local(int variant, int local, bool xs) {
  switch (variant) {
    case 0: return xs ? pick_decode<T, kNested, 0, true>(local) : pick_decode<T, kNested, 0, false>(local);
    case 5: return xs ? pick_decode<T, kNested, 1, true>(local) : pick_decode<T, kNested, 1, false>(local);
    case 7: return xs ? nullptr : pick_decode<T, kNested, 0, false, true>(local);
    case 8: return xs ? nullptr : pick_decode<T, kNested, 1, false, true>(local);
  }
  return nullptr;
}

// local: 0 the global settle's build, 1 the block-local one, 2 the cluster one, 3 the split-major global one (with
// xs); xs: staged x (decode kernels only)
void* kernel_for(int dtype, int variant, int nested, int local = 0, bool xs = false) {
  if (local || xs) {
    if (dtype == 0)
      return nested ? pick_local<__nv_bfloat16, true>(variant, local, xs)
                    : pick_local<__nv_bfloat16, false>(variant, local, xs);
    return nested ? pick_local<__half, true>(variant, local, xs) : pick_local<__half, false>(variant, local, xs);
  }
  if (dtype == 0) return nested ? pick<__nv_bfloat16, true>(variant) : pick<__nv_bfloat16, false>(variant);
  return nested ? pick<__half, true>(variant) : pick<__half, false>(variant);
}

// the M = 2 build of the split small-weight kernel (variant 6 takes M = 1 or 2; its launch picks by M)
void* split_m2(int dtype, int nested) {
  if (dtype == 0)
    return nested ? (void*)gemv_split<__nv_bfloat16, true, 2> : (void*)gemv_split<__nv_bfloat16, false, 2>;
  return nested ? (void*)gemv_split<__half, true, 2> : (void*)gemv_split<__half, false, 2>;
}

int threads_for(int variant) {
  switch (variant) {
    case 0: case 7: return pipe::Cfg<1>::kThreads;
    case 4: return small::kThreads;
    case 5: case 8: return pipe::Cfg<1, 1>::kThreads;
    case 6: return split::kThreads;
    case 9: return burst::kThreads;
  }
  return gemm::kThreads;
}

int smem_for(int variant) {
  switch (variant) {
    case 0: case 7: return pipe::Cfg<1>::kSmem;
    case 1: return gemm::Cfg<1>::kSmem;
    case 2: return gemm::Cfg<2>::kSmem;
    case 3: return gemm::Cfg<4>::kSmem;
    case 4: return small::kXBytes;
    case 5: case 8: return pipe::Cfg<1, 1>::kSmem;
    case 6: return split::kXBytes;
    case 9: return burst::kSmem;
  }
  return 0;
}

// weight rows of one work item: 16 for the decode kernel (per warp), 16 x warps for the GEMM kernel (per block),
// one per warp for the small-weight kernel, 8 per block for the M = 1 small-weight kernel, 16 per block at a time for
// the burst kernel
int rows_for(int variant) {
  const bool decode = variant == 0 || variant == 5 || variant == 7 || variant == 8;
  return decode ? 16 : variant == 4 ? small::kWarps : variant == 6 ? split::kBlockRows : 16 * gemm::kWarps;
}

}  // namespace fastnf4_mma

using fastnf4_mma::Params;

extern "C" {

// Resident blocks per SM for a kernel variant (0 when it does not exist or does not fit on this GPU); for the
// decode kernels the lowest of the global-settle, block-local and cluster builds (all get their attributes set here).
int fastnf4_gemv_mma_occupancy(int dtype, int variant, int nested) {
  int least = -1;
  for (int build = 0; build < 8; ++build) {
    const int local = build % 4;
    const bool xs = build >= 4;
    if (local == 3 && !xs) continue;  // (no such build)
    void* f = fastnf4_mma::kernel_for(dtype, variant, nested, local, xs);
    if (f == nullptr) {
      if (build) break;
      return 0;
    }
    const int smem = fastnf4_mma::smem_for(variant);
    // the tensor-core kernels want all the shared memory they can get; the split small-weight kernel (x only, a
    // few KiB per block) keeps the L1 the driver would leave it
    if (variant != 6)
      cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, fastnf4_mma::threads_for(variant), smem) !=
        cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    least = least < 0 || blocks < least ? blocks : least;
  }
  return least;
}

// Clusters of `size` blocks of the decode kernels' block-local build that can be resident at once (0: none / error;
// after fastnf4_gemv_mma_occupancy set the kernel's attributes).
int fastnf4_gemv_mma_clusters(int dtype, int variant, int nested, int size) {
  int least = -1;
  for (int xs = 0; xs < (variant == 7 || variant == 8 ? 1 : 2); ++xs) {  // the least of the x paths' builds
    void* f = fastnf4_mma::kernel_for(dtype, variant, nested, 2, xs != 0);
    if (f == nullptr || size < 1 || size > 8) return 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)size);
    cfg.blockDim = dim3(fastnf4_mma::threads_for(variant));
    cfg.dynamicSmemBytes = (size_t)fastnf4_mma::smem_for(variant);
    cudaLaunchAttribute attr[1];
    fastnf4_mma::cluster_attr(attr[0], size);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, f, &cfg) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    least = least < 0 || clusters < least ? clusters : least;
  }
  return least;
}

// Warps per block and weight rows per work item of a kernel variant.
int fastnf4_gemv_mma_warps(int variant) { return fastnf4_mma::threads_for(variant) / 32; }
int fastnf4_gemv_mma_rows(int variant) { return fastnf4_mma::rows_for(variant); }

int fastnf4_gemv_mma_params_size() { return (int)sizeof(Params); }

// dtype 0 = bf16, 1 = fp16; pdl = launch with programmatic stream serialization (sm_90+); returns a cudaError_t.
int fastnf4_gemv_mma(const Params* p, int dtype, int variant, int nested, int grid, cudaStream_t stream, int pdl) {
  const int build = p->local <= 0 ? (p->gsplit ? 3 : 0) : p->lcluster > 1 ? 2 : 1;
  void* f = variant == 6 && p->M == 2 ? fastnf4_mma::split_m2(dtype, nested)
                                      : fastnf4_mma::kernel_for(dtype, variant, nested, build, p->xs > 0);
  if (variant == 6 && (p->M < 1 || p->M > 2)) return (int)cudaErrorInvalidValue;
  // the rows of x each variant covers (a forced variant never leaves rows of y unwritten)
  const long long max_m = variant == 0 || variant == 4 || variant == 5 || variant == 6 || variant == 9 ? 2
                          : variant == 7 || variant == 8 ? 4 : variant == 1 ? 8 : variant == 2 ? 16 : 32;
  if (p->M < 1 || p->M > max_m) return (int)cudaErrorInvalidValue;
  // the burst kernel: whole slice pairs, a lane's blocks in one aligned word of codes, x in the holes, 32-bit offsets,
  // one 16-row tile per block at a time (no split-K, no staged-x or settle plans)
  if (variant == 9 && (p->K % 256 != 0 || p->blocksize < 64 || p->M * p->K > 16384 || p->N * p->K >= (1LL << 31) ||
                       (reinterpret_cast<uintptr_t>(p->absmax) & 3) != 0 || p->splits != 1 || p->local > 0 ||
                       p->xs > 0 || p->gsplit || p->lsplit))
    return (int)cudaErrorInvalidValue;
  // pair columns: M <= 4 (32-bit x offsets: M K < 2^32), whole chunk pairs per block, x in registers, no split-major
  // plans
  if ((variant == 7 || variant == 8) && (p->M < 1 || p->M > 4 || p->blocksize < 64 || p->K % 64 != 0 ||
                                         p->M * p->K >= (1LL << 32) || p->xs > 0 || p->gsplit || p->lsplit))
    return (int)cudaErrorInvalidValue;
  // split-major clusters: every block holds whole splits (tpb tiles x S parts = lcluster x warps)
  const long long kw = fastnf4_mma::threads_for(variant) / 32;
  const bool lsplit = p->lsplit != 0;
  if (lsplit && (p->local <= 0 || p->lcluster <= 1 || p->splits < 1 || p->local % p->splits != 0 ||
                 kw % (p->local / p->splits) != 0 || p->local != p->lcluster * kw))
    return (int)cudaErrorInvalidValue;
  // staged x: exactly the rows' holes (all of K, or a split-major block's splits), K % 128 == 0 and no split past the
  // end of K (its copies skip the K bound)
  const long long slices = (p->K + fastnf4_mma::kSlice - 1) / fastnf4_mma::kSlice;
  // split-major global plans: the global settle, split-K, every item on its own warp of the grid
  const long long tiles = (p->N + 15) / 16;
  if (p->gsplit && (p->local > 0 || p->splits < 2 || tiles * p->splits > grid * kw || (variant != 0 && variant != 5)))
    return (int)cudaErrorInvalidValue;
  // (a block's kw warps span at most 1 + ceil((kw - 1) / tiles) splits)
  const long long gspan1 = 1 + (kw - 1 + tiles - 1) / tiles;
  const long long gspan = p->gsplit ? (gspan1 < p->splits ? gspan1 : p->splits) : 0;
  const long long staged = lsplit ? kw / (p->local / p->splits) * p->slices_per_split
                           : p->gsplit ? gspan * p->slices_per_split : slices;
  if (p->xs > 0 && (p->M > 2 || p->K % fastnf4_mma::kSlice != 0 || p->xs != p->M * staged * 2 ||
                    p->xs > fastnf4_mma::pipe::kHoles || (p->splits - 1) * p->slices_per_split >= slices))
    return (int)cudaErrorInvalidValue;
  if (f == nullptr) return (int)cudaErrorInvalidValue;
  void* args[] = {(void*)p};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(fastnf4_mma::threads_for(variant));
  // the split small-weight kernel stages only x: M * K values of 2 bytes (at most smem_for, checked by the host)
  cfg.dynamicSmemBytes = variant == 6 ? static_cast<int>(2 * p->M * p->K) : fastnf4_mma::smem_for(variant);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (p->local > 0 && p->lcluster > 1) {  // the block-local split-K over clusters of lcluster blocks
    if (grid % p->lcluster != 0 || p->lcluster > 8) return (int)cudaErrorInvalidValue;
    fastnf4_mma::cluster_attr(attr[n++], static_cast<int>(p->lcluster));
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return (int)cudaLaunchKernelExC(&cfg, f, args);
}

}  // extern "C"
