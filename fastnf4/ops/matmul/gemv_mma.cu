// Decode-size NF4 matmul (M <= 16) on tensor cores: y[M, N] = x[M, K] @ dequant(W[N, K]).T (+ bias).
//
// Why tensor cores at M = 1: the GEMV is bound by decoding (turning ~8 G codes/s into values), not by
// multiply-adds. Here each thread decodes one packed byte (two codes) with ONE shared-memory load from a
// 256-entry table of value pairs, and the products and float32 sums are left to mma.sync, which is idle
// otherwise. The table is replicated 32 times (entry v of lane l at word v * 32 + l), so every lane reads
// its own bank: no bank conflicts whatever the codes (32 KiB per block).
//
// Warp tile: 16 rows of W x one 128-wide K slice per step. Lane (g = lane / 4, t = lane % 4) loads 16 bytes
// (32 codes) of rows n0 + g and n0 + g + 8 at K offset 32 t of the slice. The k order inside an mma is free
// as long as A and B agree, so mma step s (0..7) takes codes 4s..4s+3 of every lane's chunk: byte 2s feeds
// A registers a0a1 / a2a3 and byte 2s + 1 feeds a4a5 / a6a7, with B built from x at the same positions.
//
// Quantization blocks (>= 32 codes) never split a 32-code chunk, but one slice can hold up to four blocks.
// So B column j stands for (x row m = j / 4, chunk c = j % 4): lane (g, t) puts x row m at its chunk in B
// only when c == t. Column j of C then holds the dot product of one row of x with one chunk's codes, which
// is scaled by that chunk's absmax in float32 after every slice. CG groups of 8 columns cover M <= 2 CG.
//
// Split-K: a work item is (16-row tile, K range). With S > 1 ranges the warps write float32 partial sums and
// the last of them (an atomic counter per tile, reset by that warp) adds the S partials in a fixed order,
// so results do not depend on timing. Warps are persistent: grid = resident blocks, items strided.
//
// Requirements checked by the caller: K % 32 == 0, x and y contiguous with 16-byte aligned rows (K % 8),
// packed 16-byte aligned, blocksize >= 32, nested statistics in blocks of 256 (bitsandbytes' only value).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace fastnf4_mma {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kSlice = 128;   // K per warp step
#ifndef FASTNF4_MMA_UNROLL
#define FASTNF4_MMA_UNROLL 2
#endif
constexpr int kUnroll = FASTNF4_MMA_UNROLL;
#ifndef FASTNF4_MMA_MIN_BLOCKS
#define FASTNF4_MMA_MIN_BLOCKS 4  // resident blocks per SM asked of ptxas for M <= 4 (caps registers at 128)
#endif  // slices per step; the next step's weights load during this one

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
};

template <typename T> struct Pair;
template <> struct Pair<__nv_bfloat16> {
  static __device__ uint32_t make(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ void store(void* y, long long i, float v) {
    reinterpret_cast<__nv_bfloat16*>(y)[i] = __float2bfloat16_rn(v);
  }
  static __device__ float load(const void* p, long long i) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
  }
};
template <> struct Pair<__half> {
  static __device__ uint32_t make(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ void store(void* y, long long i, float v) {
    reinterpret_cast<__half*>(y)[i] = __float2half_rn(v);
  }
  static __device__ float load(const void* p, long long i) {
    return __half2float(reinterpret_cast<const __half*>(p)[i]);
  }
};

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

__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Pair of values for byte j (0..3) of word w: one shared-memory load from this lane's bank. ``lane_base`` is
// the 32-bit shared address of table word ``lane``; entry v sits v * 128 bytes further.
template <int j>
__device__ __forceinline__ uint32_t lookup(uint32_t lane_base, uint32_t w) {
  const uint32_t byte = __byte_perm(w, 0u, 0x4440u + j);  // PRMT: byte j, zero-extended
  uint32_t v;
  asm("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(lane_base + (byte << 7)));  // LEA
  return v;
}

// End of a work item (16 rows of one K range), shared by both kernels: sum each lane's two chunk columns with
// its neighbour's, then write y (+ bias), or with split-K write float32 partials and let the last warp of the
// tile (atomic counter, reset by that warp) add the S partials in split order: bitwise repeatable.
template <typename T, int CG>
__device__ __forceinline__ void finish_item(const Params& p, const float (&acc)[CG][4], long long tile,
                                            long long split, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const long long M = p.M, N = p.N;
  const long long rowA = tile * 16 + g, rowB = rowA + 8;
  const bool okA = rowA < N, okB = rowB < N;
  // Lane t holds columns of x row m = 2c + t / 2; lanes t and t ^ 1 together hold all four chunks.
  float vA[CG], vB[CG];
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    vA[c] = acc[c][0] + acc[c][1];
    vB[c] = acc[c][2] + acc[c][3];
    vA[c] += __shfl_xor_sync(0xffffffffu, vA[c], 1);
    vB[c] += __shfl_xor_sync(0xffffffffu, vB[c], 1);
  }
  const bool writer = (t & 1) == 0;
  if (p.splits == 1) {
    if (writer) {
#pragma unroll
      for (int c = 0; c < CG; ++c) {
        const long long m = 2 * c + (t >> 1);
        if (m < M) {
          if (okA) Pair<T>::store(p.y, m * N + rowA, vA[c] + (p.bias ? Pair<T>::load(p.bias, rowA) : 0.f));
          if (okB) Pair<T>::store(p.y, m * N + rowB, vB[c] + (p.bias ? Pair<T>::load(p.bias, rowB) : 0.f));
        }
      }
    }
    return;
  }
  if (writer) {
#pragma unroll
    for (int c = 0; c < CG; ++c) {
      const long long m = 2 * c + (t >> 1);
      if (m < M) {
        float* part = p.partial + (split * M + m) * N;
        if (okA) __stcg(part + rowA, vA[c]);
        if (okB) __stcg(part + rowB, vB[c]);
      }
    }
  }
  __threadfence();
  __syncwarp();
  int last = 0;
  if (lane == 0) last = atomicAdd(p.counters + tile, 1) == p.splits - 1;
  last = __shfl_sync(0xffffffffu, last, 0);
  if (!last) return;
  __threadfence();
  // The last warp of this tile adds the S partials in split order; each lane takes (m, row) pairs.
  for (long long i = lane; i < 16 * M; i += 32) {
    const long long m = i / 16, row = tile * 16 + (i % 16);
    if (row >= N) continue;
    float v = 0.f;
    for (long long s = 0; s < p.splits; ++s) v += __ldcg(p.partial + (s * M + m) * N + row);
    if (p.bias) v += Pair<T>::load(p.bias, row);
    Pair<T>::store(p.y, m * N + row, v);
  }
  __syncwarp();
  if (lane == 0) atomicExch(p.counters + tile, 0);
}

template <typename T, int CG, bool kNested>
__global__ void __launch_bounds__(kThreads, CG <= 2 ? FASTNF4_MMA_MIN_BLOCKS : 2) gemv_mma_kernel(const __grid_constant__ Params p) {
  __shared__ uint32_t table[256 * 32];
  __shared__ float nested_code[kNested ? 256 : 1];
  for (int i = threadIdx.x; i < 256 * 32; i += kThreads) {
    const int v = i >> 5;
    table[i] = Pair<T>::make(__ldg(p.code + (v >> 4)), __ldg(p.code + (v & 15)));
  }
  if constexpr (kNested) {
    for (int i = threadIdx.x; i < 256; i += kThreads) nested_code[i] = __ldg(p.nested_code + i);
  }
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t lane_base = static_cast<uint32_t>(__cvta_generic_to_shared(table)) + 4 * lane;
  const long long M = p.M, N = p.N, K = p.K;
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const long long tiles = (N + 15) / 16;
  const long long items = tiles * p.splits;
  const int slices = static_cast<int>((K + kSlice - 1) / kSlice);
  const long long warp0 = (long long)blockIdx.x * kWarps + (threadIdx.x >> 5);
  const long long warps = (long long)gridDim.x * kWarps;

  // B operands: in column group c, lane (g, t) carries x row m = 2c + g / 4 at its own chunk when g % 4 == t.
  const T* xlane[CG];
  bool xon[CG];
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    const long long m = 2 * c + (g >> 2);
    xon[c] = ((g & 3) == t) && m < M;
    xlane[c] = reinterpret_cast<const T*>(p.x) + (xon[c] ? m * K : 0) + 32 * t;
  }
  // C columns of this lane: 2t and 2t + 1 of each group, i.e. chunks c0 = (2t) % 4 and c0 + 1.
  const int c0 = (2 * t) & 3;
  // c0 is even, so with K % 64 == 0 and blocks of >= 64 codes both chunks of a lane share one absmax
  const bool pair_shares_block = p.blocksize >= 64 && K % 64 == 0;

  for (long long item = warp0; item < items; item += warps) {
    const long long tile = item / p.splits, split = item - tile * p.splits;
    const long long rowA = tile * 16 + g, rowB = rowA + 8;
    const bool okA = rowA < N, okB = rowB < N;
    const long long baseA = rowA * K, baseB = rowB * K;
    const uint8_t* pA = p.packed + (baseA >> 1) + 16 * t;
    const uint8_t* pB = p.packed + (baseB >> 1) + 16 * t;
    const int s_begin = static_cast<int>(split * p.slices_per_split);
    const int s_end = min(slices, static_cast<int>(s_begin + p.slices_per_split));

    float acc[CG][4];
#pragma unroll
    for (int c = 0; c < CG; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;

    // The next step's weights and statistics are loaded while the current step is decoded (register double
    // buffer), so no load latency is exposed once the pipeline runs. Statistics per slice and lane: the
    // blocks of chunks c0 and c0 + 1 of rows A and B (raw: float32 absmax, or uint8 code + nested absmax).
    struct Step {
      uint4 wa[kUnroll], wb[kUnroll];
      uint32_t q[kUnroll][4];
      float raw[kUnroll][4];
    };
    auto load_step = [&](int s0, Step& st) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int kb = (s0 + u) * kSlice;
        const bool live = s0 + u < s_end;
        const bool ok = live && kb + 32 * t < K;
        st.wa[u] = (ok && okA) ? load_stream(pA + (s0 + u) * (kSlice / 2)) : make_uint4(0, 0, 0, 0);
        st.wb[u] = (ok && okB) ? load_stream(pB + (s0 + u) * (kSlice / 2)) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if ((i & 1) && pair_shares_block) {  // chunks c0 and c0 + 1 sit in one block: load once
            st.q[u][i] = st.q[u][i - 1];
            st.raw[u][i] = st.raw[u][i - 1];
            continue;
          }
          const int kc = kb + 32 * (c0 + (i & 1));
          const bool on = live && kc < K && ((i < 2) ? okA : okB);
          const long long b = on ? (((i < 2) ? baseA : baseB) + kc) >> log2_bs : 0;
          if constexpr (kNested) {
            st.q[u][i] = on ? __ldg(reinterpret_cast<const uint8_t*>(p.absmax) + b) : 0u;
            st.raw[u][i] = on ? __ldg(p.nested_absmax + (b >> 8)) : 0.f;
          } else {
            st.q[u][i] = 0u;
            st.raw[u][i] = on ? __ldg(reinterpret_cast<const float*>(p.absmax) + b) : 0.f;
          }
        }
      }
    };
    Step cur;
    load_step(s_begin, cur);
    for (int s0 = s_begin; s0 < s_end; s0 += kUnroll) {
      Step nxt;
      load_step(s0 + kUnroll, nxt);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        // slices past s_end (and chunks past K) get zero x, so their columns of C are zero whatever the
        // (zero-byte) weights decode to: no branch in the unrolled body
        const int slice = s0 + u;
        const bool live = slice < s_end;
        const int kbase = slice * kSlice;
        const bool kin = live && kbase + 32 * t < K;
        // x of this slice: whole 64-byte chunk up front for small CG, per mma step otherwise
        uint4 xb[CG <= 2 ? CG : 1][4];
        if constexpr (CG <= 2) {
#pragma unroll
          for (int c = 0; c < CG; ++c) {
            const uint4* px = reinterpret_cast<const uint4*>(xlane[c] + kbase);
#pragma unroll
            for (int i = 0; i < 4; ++i) xb[c][i] = (xon[c] && kin) ? __ldg(px + i) : make_uint4(0, 0, 0, 0);
          }
        }
        float cf[CG][4];
#pragma unroll
        for (int c = 0; c < CG; ++c) cf[c][0] = cf[c][1] = cf[c][2] = cf[c][3] = 0.f;
        const uint32_t wA[4] = {cur.wa[u].x, cur.wa[u].y, cur.wa[u].z, cur.wa[u].w};
        const uint32_t wB[4] = {cur.wb[u].x, cur.wb[u].y, cur.wb[u].z, cur.wb[u].w};
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          // bytes 2s and 2s + 1 of the 16-byte chunk: word s / 2, byte positions 2 (s % 2) and 2 (s % 2) + 1
          uint32_t a0, a1, a2, a3;
          if (s & 1) {
            a0 = lookup<2>(lane_base, wA[s >> 1]);
            a1 = lookup<2>(lane_base, wB[s >> 1]);
            a2 = lookup<3>(lane_base, wA[s >> 1]);
            a3 = lookup<3>(lane_base, wB[s >> 1]);
          } else {
            a0 = lookup<0>(lane_base, wA[s >> 1]);
            a1 = lookup<0>(lane_base, wB[s >> 1]);
            a2 = lookup<1>(lane_base, wA[s >> 1]);
            a3 = lookup<1>(lane_base, wB[s >> 1]);
          }
#pragma unroll
          for (int c = 0; c < CG; ++c) {
            uint32_t b0, b1;
            if constexpr (CG <= 2) {
              const uint4 q = xb[c][s >> 1];
              b0 = (s & 1) ? q.z : q.x;
              b1 = (s & 1) ? q.w : q.y;
            } else {
              uint2 q = make_uint2(0, 0);
              if (xon[c] && kin) q = __ldg(reinterpret_cast<const uint2*>(xlane[c] + kbase + 4 * s));
              b0 = q.x;
              b1 = q.y;
            }
            mma16816<T>(cf[c], a0, a1, a2, a3, b0, b1);
          }
        }
        float sc[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // same float32 arithmetic as the dequantize reference: product rounded, then the offset added
          sc[i] = kNested ? __fadd_rn(__fmul_rn(nested_code[cur.q[u][i]], cur.raw[u][i]), offset) : cur.raw[u][i];
        }
#pragma unroll
        for (int c = 0; c < CG; ++c) {
          acc[c][0] = fmaf(cf[c][0], sc[0], acc[c][0]);
          acc[c][1] = fmaf(cf[c][1], sc[1], acc[c][1]);
          acc[c][2] = fmaf(cf[c][2], sc[2], acc[c][2]);
          acc[c][3] = fmaf(cf[c][3], sc[3], acc[c][3]);
        }
      }
      cur = nxt;
    }

    finish_item<T, CG>(p, acc, tile, split, lane);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Pipelined decode kernel for M <= 4 (column groups 1 and 2): same arithmetic and fragment layout as above,
// organised to issue fewer instructions per code and to keep more bytes in flight (ncu on v3, Llama gate_up
// M = 1: 0.52 instructions issued per scheduler cycle, 7.3 cycles between a warp's instructions, ~8.6
// instructions per packed byte, 128 registers with spills, 16 warps per SM):
// - one PRMT + one LDS per packed byte: the table entry v of lane l sits at byte v * 256 + 4 l, so a single
//   byte permute of (word, 4 l) yields the address (the upper 128 bytes of every entry are unused);
// - weights go global -> shared with cp.async into a per-warp ring of kStages slices (each lane copies and
//   later reads only its own 32 bytes, so no warp synchronisation is needed), kStages - 1 slices in flight;
//   the ring runs across work items, so a warp never drains it between items;
// - statistics are decoded once per kPhase slices into a per-warp table (row x 32-code chunk, float32), with
//   coalesced loads spread over the lanes instead of 4-8 scattered loads per lane per slice;
// - x is prefetched one slice ahead in registers; 32-bit offsets inside a work item.
namespace pipe {
#ifndef FASTNF4_PIPE_WARPS1
#define FASTNF4_PIPE_WARPS1 16
#endif
#ifndef FASTNF4_PIPE_STAGES1
#define FASTNF4_PIPE_STAGES1 6
#endif
#ifndef FASTNF4_PIPE_WARPS2
#define FASTNF4_PIPE_WARPS2 16
#endif
#ifndef FASTNF4_PIPE_STAGES2
#define FASTNF4_PIPE_STAGES2 6
#endif
constexpr int kPhase = 8;                      // slices per statistics phase: 32 chunks of 32 codes per row
constexpr int kStatStride = 36;                // floats per row: 32 + 4 so that rows g and g + 1 differ by 4 banks
constexpr int kTableBytes = 256 * 256;
// warps per block (one block per SM) and ring stages, per column-group count
template <int CG> struct Cfg {
  static constexpr int kWarps = CG == 1 ? FASTNF4_PIPE_WARPS1 : FASTNF4_PIPE_WARPS2;
  static constexpr int kStages = CG == 1 ? FASTNF4_PIPE_STAGES1 : FASTNF4_PIPE_STAGES2;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRingBytes = kStages * 1024;  // [stage][row half A/B][lane] x 16 bytes
  static constexpr int kWarpBytes = kRingBytes + 16 * kStatStride * 4;
  static constexpr int kSmem = kTableBytes + kWarps * kWarpBytes;
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

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int n>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(n)); }

// Where a warp is in its sequence of (work item, slice): items warp0, warp0 + warps, ... with item = tile *
// splits + split; moving to the next item is an add with carry (no division in the loop).
struct Cursor {
  long long tile;
  int split, slice, s_end;
};

template <typename T, int CG, bool kNested>
__global__ void __launch_bounds__(pipe::Cfg<CG>::kThreads, 1) gemv_mma_pipe(const __grid_constant__ Params p) {
  using C = pipe::Cfg<CG>;
  constexpr int kStages = C::kStages, kRingBytes = C::kRingBytes, kWarpBytes = C::kWarpBytes;
  using pipe::kPhase; using pipe::kStatStride; using pipe::kTableBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float nested_code[kNested ? 256 : 1];
  uint32_t* table = reinterpret_cast<uint32_t*>(smem);
  for (int i = threadIdx.x; i < 256 * 32; i += C::kThreads) {
    const int v = i >> 5;
    table[v * 64 + (i & 31)] = Pair<T>::make(__ldg(p.code + (v >> 4)), __ldg(p.code + (v & 15)));
  }
  if constexpr (kNested) {
    for (int i = threadIdx.x; i < 256; i += C::kThreads) nested_code[i] = __ldg(p.nested_code + i);
  }
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  uint8_t* wsm = smem + kTableBytes + warp * kWarpBytes;
  float* stats = reinterpret_cast<float*>(wsm + kRingBytes);
  const uint32_t table_s = static_cast<uint32_t>(__cvta_generic_to_shared(table));
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(wsm)) + 16 * lane;
  const uint32_t lane4 = 4 * lane;
  const long long N = p.N, K = p.K;
  const int K32 = static_cast<int>(K);  // the host keeps K < 2^31
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const long long tiles = (N + 15) / 16;
  const int splits = static_cast<int>(p.splits);
  const int slices = static_cast<int>((K + kSlice - 1) / kSlice);
  const int per = static_cast<int>(p.slices_per_split);
  const long long warp0 = (long long)blockIdx.x * C::kWarps + warp;
  const long long warps = (long long)gridDim.x * C::kWarps;
  const long long wdiv = warps / splits;
  const int wmod = static_cast<int>(warps - wdiv * splits);
  const bool pair_shares_block = p.blocksize >= 64 && K % 64 == 0;

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
  const T* xlane[CG];
  bool xon[CG];
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    const long long m = 2 * c + (g >> 2);
    xon[c] = ((g & 3) == t) && m < p.M;
    xlane[c] = reinterpret_cast<const T*>(p.x) + (xon[c] ? m * K : 0) + 32 * t;
  }
  auto load_x = [&](const Cursor& c, uint4 (&xb)[CG][4]) {
    const int kbase = c.slice * kSlice;
    const bool kin = c.tile < tiles && kbase + 32 * t < K32;
#pragma unroll
    for (int q = 0; q < CG; ++q) {
      const uint4* px = reinterpret_cast<const uint4*>(xlane[q] + kbase);
#pragma unroll
      for (int i = 0; i < 4; ++i) xb[q][i] = (xon[q] && kin) ? __ldg(px + i) : make_uint4(0, 0, 0, 0);
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
  auto issue = [&]() {
    if (ld.tile < tiles) {
      const int off = ld.slice * (kSlice / 2);
      const bool kin = 2 * off + 32 * t < K32;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ring_ld), "l"(kin ? ldA + off : ldA),
                   "r"(kin ? szA : 0));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ring_ld + 512), "l"(kin ? ldB + off : ldB),
                   "r"(kin ? szB : 0));
      if (++ld.slice == ld.s_end) {
        --ld.slice;
        advance(ld);
        ld_rows();
      }
    }
    cp_async_commit();
  };
  // absmax of 32-code chunks [4 c.slice, 4 c.slice + 32) of the tile's 16 rows into ``stats``: lane l takes
  // row l / 2 and chunks 16 (l % 2) .. 16 (l % 2) + 15
  auto stage_stats = [&](const Cursor& c) {
    const long long row = c.tile * 16 + (lane >> 1);
    const int k0 = c.slice * kSlice + 512 * (lane & 1);
    const long long e0 = row * K + k0;
    const bool row_ok = row < N;
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
        v[j] = on ? __fadd_rn(__fmul_rn(nested_code[q], na), offset) : 0.f;
      } else {
        v[j] = on ? __ldg(reinterpret_cast<const float*>(p.absmax) + b) : 0.f;
      }
    }
    __syncwarp();  // every lane is done with the previous phase
    float4* dst = reinterpret_cast<float4*>(stats + (lane >> 1) * kStatStride + 16 * (lane & 1));
#pragma unroll
    for (int j = 0; j < 4; ++j) dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    __syncwarp();
  };

  Cursor cp;
  begin(cp, warp0 / splits, static_cast<int>(warp0 % splits));
  ld = cp;
  ld_rows();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    ring_ld = ring_s + i * 1024;
    issue();
  }
  ring_ld = ring_s + (kStages - 1) * 1024;
  uint32_t ring_cp = ring_s;  // shared address of the stage being computed
  const uint32_t ring_end = ring_s + kStages * 1024;
  Cursor xc = cp;  // x runs one slice ahead of the compute cursor
  uint4 xb[CG][4];
  load_x(xc, xb);
  advance(xc);
  float acc[CG][4];
#pragma unroll
  for (int c = 0; c < CG; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
  const int c0 = (2 * t) & 3;
  int rel = 0;  // slice index inside the work item
  while (cp.tile < tiles) {
    if ((rel & (kPhase - 1)) == 0) stage_stats(cp);
    uint4 xn[CG][4];
    load_x(xc, xn);
    advance(xc);
    issue();
    ring_ld = ring_ld + 1024 == ring_end ? ring_s : ring_ld + 1024;
    cp_async_wait<kStages - 1>();  // this slice's group has landed (each lane waits for its own copies)

    uint4 wa, wb;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(wa.x), "=r"(wa.y), "=r"(wa.z), "=r"(wa.w) : "r"(ring_cp));
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(wb.x), "=r"(wb.y), "=r"(wb.z), "=r"(wb.w) : "r"(ring_cp + 512));
    ring_cp = ring_cp + 1024 == ring_end ? ring_s : ring_cp + 1024;
    const uint32_t wA[4] = {wa.x, wa.y, wa.z, wa.w};
    const uint32_t wB[4] = {wb.x, wb.y, wb.z, wb.w};
    float cf[CG][4];
#pragma unroll
    for (int c = 0; c < CG; ++c) cf[c][0] = cf[c][1] = cf[c][2] = cf[c][3] = 0.f;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint32_t a0, a1, a2, a3;
      if (s & 1) {
        a0 = lookup_pipe<2>(table_s, lane4, wA[s >> 1]);
        a1 = lookup_pipe<2>(table_s, lane4, wB[s >> 1]);
        a2 = lookup_pipe<3>(table_s, lane4, wA[s >> 1]);
        a3 = lookup_pipe<3>(table_s, lane4, wB[s >> 1]);
      } else {
        a0 = lookup_pipe<0>(table_s, lane4, wA[s >> 1]);
        a1 = lookup_pipe<0>(table_s, lane4, wB[s >> 1]);
        a2 = lookup_pipe<1>(table_s, lane4, wA[s >> 1]);
        a3 = lookup_pipe<1>(table_s, lane4, wB[s >> 1]);
      }
#pragma unroll
      for (int c = 0; c < CG; ++c) {
        const uint4 q = xb[c][s >> 1];
        mma16816<T>(cf[c], a0, a1, a2, a3, (s & 1) ? q.z : q.x, (s & 1) ? q.w : q.y);
      }
    }
    const int j = (rel & (kPhase - 1)) * 4 + c0;
    const float2 sA = *reinterpret_cast<const float2*>(stats + g * kStatStride + j);
    const float2 sB = *reinterpret_cast<const float2*>(stats + (g + 8) * kStatStride + j);
#pragma unroll
    for (int c = 0; c < CG; ++c) {
      acc[c][0] = fmaf(cf[c][0], sA.x, acc[c][0]);
      acc[c][1] = fmaf(cf[c][1], sA.y, acc[c][1]);
      acc[c][2] = fmaf(cf[c][2], sB.x, acc[c][2]);
      acc[c][3] = fmaf(cf[c][3], sB.y, acc[c][3]);
#pragma unroll
      for (int i = 0; i < 4; ++i) xb[c][i] = xn[c][i];
    }
    ++rel;
    if (++cp.slice < cp.s_end) continue;

    // the work item is complete: write (or reduce) its 16 rows, then move to the next item
    finish_item<T, CG>(p, acc, cp.tile, cp.split, lane);
#pragma unroll
    for (int c = 0; c < CG; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
    --cp.slice;
    advance(cp);
    rel = 0;
  }
  cp_async_wait<0>();
}

template <typename T, bool kNested>
void* pick(int cg) {
  switch (cg) {
    case 1: return (void*)gemv_mma_pipe<T, 1, kNested>;
    case 2: return (void*)gemv_mma_pipe<T, 2, kNested>;
    case 4: return (void*)gemv_mma_kernel<T, 4, kNested>;
    case 8: return (void*)gemv_mma_kernel<T, 8, kNested>;
  }
  return nullptr;
}

void* kernel_for(int dtype, int cg, int nested) {
  if (dtype == 0) return nested ? pick<__nv_bfloat16, true>(cg) : pick<__nv_bfloat16, false>(cg);
  return nested ? pick<__half, true>(cg) : pick<__half, false>(cg);
}

}  // namespace fastnf4_mma

using fastnf4_mma::Params;
using fastnf4_mma::kThreads;
using fastnf4_mma::kernel_for;

namespace {
// column groups 1 and 2 run the pipelined kernel (16 warps, dynamic shared memory), 4 and 8 the first one
int threads_for(int cg) {
  return cg == 1 ? fastnf4_mma::pipe::Cfg<1>::kThreads : cg == 2 ? fastnf4_mma::pipe::Cfg<2>::kThreads : kThreads;
}
int smem_for(int cg) {
  return cg == 1 ? fastnf4_mma::pipe::Cfg<1>::kSmem : cg == 2 ? fastnf4_mma::pipe::Cfg<2>::kSmem : 0;
}
}  // namespace

extern "C" {

// Resident blocks per SM for a configuration (0 when it does not exist).
int fastnf4_gemv_mma_occupancy(int dtype, int cg, int nested) {
  void* f = kernel_for(dtype, cg, nested);
  if (f == nullptr) return 0;
  // the 32 KiB table per block: ask for the largest shared-memory carveout so that occupancy is set by
  // registers, not by the L1/shared split the driver would pick
  cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (smem_for(cg) > 0 &&
      cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_for(cg)) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, threads_for(cg), smem_for(cg)) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return blocks;
}

// Warps per block of the kernel that serves column groups ``cg``.
int fastnf4_gemv_mma_warps(int cg) { return threads_for(cg) / 32; }

int fastnf4_gemv_mma_params_size() { return (int)sizeof(Params); }

// dtype 0 = bf16, 1 = fp16; cg = column groups (M <= 2 cg); returns a cudaError_t.
int fastnf4_gemv_mma(const Params* p, int dtype, int cg, int nested, int grid, cudaStream_t stream) {
  void* f = kernel_for(dtype, cg, nested);
  if (f == nullptr) return (int)cudaErrorInvalidValue;
  void* args[] = {(void*)p};
  return (int)cudaLaunchKernel(f, dim3(grid), dim3(threads_for(cg)), args, smem_for(cg), stream);
}

}  // extern "C"
