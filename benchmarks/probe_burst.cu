// "Burst" decode kernels for M <= 2 (probes; NOTES.md session 28): small blocks, several per SM, every load of a warp's
// round issued into registers before any is used, no cp.async ring. benchmarks/probe_read.py: a pure read of the
// weight's bytes in this shape costs ~3 us per call more than the bytes at the copy rate (Gemma o 5.6 us, floor 2.7),
// well under fastnf4.linear (10.3). The question was whether the production decode kernel's structure is what costs
// the rest. H200 (probe_burst.py), forms measured:
//   gemv_burst (here): one block per 16-row tile over all of K (with diagnostic builds: weights only, no statistics);
//   gemv_burst_r: persistent, trimmed per-slice work, loads two rounds ahead; kC > 1: over thread block clusters.
// All correct; the best is ahead of fastnf4.linear on the 11 MB Gemma q / o only (8.2-8.4 vs 8.9 / 10.3 us), level
// on the mid weights and behind on Llama (K = 8192). gemv_burst_r with 4 warps x 3 blocks per SM went into the package
// (gemv_mma.cu variant 9, gemv_burst, session 29); probe_burst.py times that one. gemv_burst_r's other builds (8 / 16
// warps, clusters) and two intermediate forms (gemv_burst_p: persistent, two buffers of U slices; gemv_burst_q:
// gemv_burst_r with one round ahead) are in the git history (9f74bbb and 375c90b), their results in
// results/h200-probe-burst-{r,c,persistent,q}.json.
//
// Fragment layout as gemv_mma.cu's decode kernel: warp w of the block takes the 128-code slices s = w, w + W, ... of
// its tile; lane (g, t) holds 16 bytes (chunk t of the slice) of rows g and g + 8; mma step i takes codes 4i..4i+3 of
// every lane's chunk; B column j = (x row j / 4, chunk j % 4), carried by the lanes with g % 4 == t. The pair table
// (256 entries of code pairs in the input dtype, lane l's copy at word 64 v + l) is built per block while the first
// loads are in flight; x is staged in its holes (the upper 128 bytes of each entry: M K <= 16384). After the slices
// the warps' row sums meet in shared memory and are added in warp order (bitwise repeatable).
// Needs: K % 128 == 0, blocksize >= 64 (a lane's two columns share one absmax), M K <= 16384.
#include "../fastnf4/ops/matmul/gemv_mma.cu"

namespace fastnf4_burst {
using namespace fastnf4_mma;

// The kernel has no static shared memory, so its dynamic shared memory (the table first) starts at the shared-window
// offset kBase (sm_90: after the 1 KiB the system reserves per block; checked at the start, a trap otherwise): a table
// lookup is gemv_mma.cu's burst::lookup with the immediate offset (one PRMT, one LDS [R + kBase]).
constexpr uint32_t kBase = 1024;

// One slice of a lane: x of its chunk from the holes (lanes that carry x; zeros elsewhere), 8 mma of the looked-up
// code pairs (step i: codes 4i..4i+3, byte 2i -> a0 / a1 and 2i + 1 -> a2 / a3 of rows g / g + 8), the product
// scaled by the rows' absmax into acc (C columns 2t, 2t + 1 of rows g and g + 8).
template <typename T>
__device__ __forceinline__ void decode_slice(float (&acc)[4], uint32_t lane4, const uint8_t* smem, bool xon,
                                             uint32_t x_at, uint4 wa, uint4 wb, float sa, float sb) {
  uint4 xv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) xv[i] = make_uint4(0, 0, 0, 0);
  if (xon) {  // (C++ loads off the array: ptxas keeps its base in a uniform register, LDS [R + UR])
#pragma unroll
    for (int i = 0; i < 4; ++i) xv[i] = *reinterpret_cast<const uint4*>(smem + x_at + 16u * i);
  }
  const uint32_t xw[16] = {xv[0].x, xv[0].y, xv[0].z, xv[0].w, xv[1].x, xv[1].y, xv[1].z, xv[1].w,
                           xv[2].x, xv[2].y, xv[2].z, xv[2].w, xv[3].x, xv[3].y, xv[3].z, xv[3].w};
  const uint32_t A[4] = {wa.x, wa.y, wa.z, wa.w}, B[4] = {wb.x, wb.y, wb.z, wb.w};
  float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int j = 2 * (i & 1);
    const uint32_t a0 = burst::lookup<true>(lane4, A[i >> 1], j, 0), a1 = burst::lookup<true>(lane4, B[i >> 1], j, 0);
    const uint32_t a2 = burst::lookup<true>(lane4, A[i >> 1], j + 1, 0);
    const uint32_t a3 = burst::lookup<true>(lane4, B[i >> 1], j + 1, 0);
    mma16816<T>(c, a0, a1, a2, a3, xw[2 * i], xw[2 * i + 1]);
  }
  acc[0] = fmaf(sa, c[0], acc[0]);
  acc[1] = fmaf(sa, c[1], acc[1]);
  acc[2] = fmaf(sb, c[2], acc[2]);
  acc[3] = fmaf(sb, c[3], acc[3]);
}

// After pdl_wait: code[thread % 16], this thread's nested codes (nested_t[i] = code i W 32 + thread) and the offset.
template <bool kNested, int W, int kNc>
__device__ __forceinline__ void load_codes(const Params& p, float& code_l, float (&nested_t)[kNc], float& offset) {
  code_l = __ldg(p.code + (threadIdx.x & 15));
#pragma unroll
  for (int i = 0; i < kNc; ++i) {
    const int c = i * W * 32 + threadIdx.x;
    nested_t[i] = kNested && c < 256 ? __ldg(p.nested_code + c) : 0.f;
  }
  offset = kNested ? __ldg(p.offset) : 0.f;
}

// A block's set-up, while its first loads fly: the pair table from code_l (= code[thread % 16]), the nested codes
// (nested_t[i]: code i W 32 + thread) and x [M, K] staged in the table's holes (16 bytes = 8 values: piece i -> hole
// i / 8, byte 16 (i % 8)); then one block barrier.
template <typename T, bool kNested, int W, int kNc>
__device__ __forceinline__ void set_up_block(uint8_t* smem, float* nested_code, const float (&nested_t)[kNc],
                                             float code_l, const Params& p, int M, int K) {
  build_pair_table_from<T>(reinterpret_cast<uint32_t*>(smem), code_l, W * 32);
#pragma unroll
  for (int i = 0; i < kNc; ++i) {
    const int c = i * W * 32 + threadIdx.x;
    if (kNested && c < 256) nested_code[c] = nested_t[i];
  }
  const int pieces = M * K / 8;
  const uint4* xg = reinterpret_cast<const uint4*>(p.x);
  for (int i = threadIdx.x; i < pieces; i += W * 32) {
    *reinterpret_cast<uint4*>(smem + 128 + 256 * (i >> 3) + 16 * (i & 7)) = __ldg(xg + i);
  }
  pdl_launch_dependents();
  __syncthreads();
}

template <typename T, bool kNested, int W, int U, int kDiag, int kMinB>
__global__ void __launch_bounds__(W * 32, kMinB) gemv_burst(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) uint8_t smem[];  // table (64 KiB), nested codes (1 KiB), row sums [W][32]
  float* nested_code = reinterpret_cast<float*>(smem + 65536);
  float (*red)[32] = reinterpret_cast<float (*)[32]>(smem + 65536 + 1024);  // [warp][x row * 16 + tile row]
  if (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) != kBase) __trap();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int K = static_cast<int>(p.K), M = static_cast<int>(p.M);
  const long long N = p.N;
  const long long rowA = static_cast<long long>(blockIdx.x) * 16 + g, rowB = rowA + 8;
  const bool onA = rowA < N, onB = rowB < N;
  const uint8_t* pa = p.packed + (onA ? rowA : 0) * (K >> 1) + 16 * t;
  const uint8_t* pb = p.packed + (onB ? rowB : 0) * (K >> 1) + 16 * t;
  const int slices = K >> 7;
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const int c0 = (2 * t) & 3;  // the lane's C columns are chunks c0, c0 + 1 (one quantization block)
  const long long eA = (onA ? rowA : 0) * K + 32 * c0, eB = (onB ? rowB : 0) * K + 32 * c0;
  const uint32_t lane4 = 4u * lane;
  const bool xon = (g & 3) == t && (g >> 2) < M;
  // lane's x of slice s: hole (m K + 128 s + 32 t) / 64 (the upper 128 bytes of that entry), byte 64 (t & 1)
  const uint32_t x_off = 128u + 256u * static_cast<uint32_t>(((g >> 2) * K + 32 * t) >> 6) + 64u * (t & 1);

  pdl_wait();
  constexpr int kNc = (256 + W * 32 - 1) / (W * 32);
  float code_l, nested_t[kNc], offset;
  load_codes<kNested, W>(p, code_l, nested_t, offset);
  const uint8_t* am8 = reinterpret_cast<const uint8_t*>(p.absmax);
  const float* am32 = reinterpret_cast<const float*>(p.absmax);

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  uint32_t dx = 0;  // (kDiag) the loads' xor
  uint4 wa[U], wb[U];
  uint32_t qa[U], qb[U];
  float na[U], nb[U];
  // one round: U slices' weights and statistics, every load issued before any is used
  auto load_round = [&](int r0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = r0 + W * u;
      const bool on = s < slices;
      wa[u] = on && onA ? __ldcs(reinterpret_cast<const uint4*>(pa + 64LL * s)) : make_uint4(0, 0, 0, 0);
      wb[u] = on && onB ? __ldcs(reinterpret_cast<const uint4*>(pb + 64LL * s)) : make_uint4(0, 0, 0, 0);
      const long long ba = (eA + 128LL * (on ? s : 0)) >> log2_bs, bb = (eB + 128LL * (on ? s : 0)) >> log2_bs;
      if constexpr (kDiag >= 2) {  // (diagnostic: no statistics loads)
        qa[u] = qb[u] = static_cast<uint32_t>(ba ^ bb);
        na[u] = nb[u] = 0.f;
      } else if constexpr (kNested) {
        qa[u] = __ldg(am8 + ba);
        qb[u] = __ldg(am8 + bb);
        na[u] = __ldg(p.nested_absmax + (ba >> 8));
        nb[u] = __ldg(p.nested_absmax + (bb >> 8));
      } else {
        qa[u] = __float_as_uint(__ldg(am32 + ba));
        qb[u] = __float_as_uint(__ldg(am32 + bb));
        na[u] = nb[u] = 0.f;
      }
    }
  };
  load_round(warp);
  if (kDiag != 3) set_up_block<T, kNested, W>(smem, nested_code, nested_t, code_l, p, M, K);  // (diagnostic 3: none)
  for (int r0 = warp; r0 < slices;) {  // rounds
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = r0 + W * u;
      if (s >= slices) break;
      if constexpr (kDiag >= 1) {
        dx ^= wa[u].x ^ wa[u].y ^ wa[u].z ^ wa[u].w ^ wb[u].x ^ wb[u].y ^ wb[u].z ^ wb[u].w ^ qa[u] ^ qb[u];
        continue;
      }
      float sa, sb;
      if constexpr (kNested) {  // as bitsandbytes: the product rounded, then the sum (no FMA)
        sa = __fadd_rn(__fmul_rn(nested_code[qa[u]], na[u]), offset);
        sb = __fadd_rn(__fmul_rn(nested_code[qb[u]], nb[u]), offset);
      } else {
        sa = __uint_as_float(qa[u]);
        sb = __uint_as_float(qb[u]);
      }
      decode_slice<T>(acc, lane4, smem, xon, x_off + 512u * s, wa[u], wb[u], sa, sb);
    }
    r0 += W * U;
    if (r0 < slices) load_round(r0);
  }
  // lane (g, t): x row t / 2, rows g (acc 0-1) and g + 8 (acc 2-3); lanes t and t ^ 1 hold chunks 0-1 and 2-3
  float va = acc[0] + acc[1], vb = acc[2] + acc[3];
  if constexpr (kDiag >= 1) va = __uint_as_float(dx);
  va += __shfl_xor_sync(0xffffffffu, va, 1);
  vb += __shfl_xor_sync(0xffffffffu, vb, 1);
  if ((t & 1) == 0) {
    red[warp][16 * (t >> 1) + g] = va;
    red[warp][16 * (t >> 1) + g + 8] = vb;
  }
  __syncthreads();
  if (threadIdx.x < 16 * M) {
    const int m = threadIdx.x >> 4;
    const long long row = static_cast<long long>(blockIdx.x) * 16 + (threadIdx.x & 15);
    if (row < N) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w) v += red[w][threadIdx.x];
      Pair<T>::store(p.y, m * N + row, v + (p.bias ? Pair<T>::load(p.bias, row) : 0.f));
    }
  }
}


template <typename T, bool kNested, int W, int U, int kDiag, int kMinB>
int launch_t(const Params* p, cudaStream_t st) {
  auto f = gemv_burst<T, kNested, W, U, kDiag, kMinB>;
  const int kSmem = 65536 + 1024 + W * 128;
  cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess) return -2;
  f<<<static_cast<unsigned>((p->N + 15) / 16), W * 32, kSmem, st>>>(*p);
  return static_cast<int>(cudaGetLastError());
}

template <typename T, bool kNested>
int launch_cfg(const Params* p, int cfg, cudaStream_t st) {
  switch (cfg) {
    case 0: return launch_t<T, kNested, 8, 2, 0, 3>(p, st);
    case 1: return launch_t<T, kNested, 8, 4, 0, 2>(p, st);
    case 2: return launch_t<T, kNested, 16, 2, 0, 1>(p, st);
    case 3: return launch_t<T, kNested, 4, 4, 0, 3>(p, st);
    case 4: return launch_t<T, kNested, 4, 8, 0, 3>(p, st);
    case 5: return launch_t<T, kNested, 8, 4, 1, 2>(p, st);
    case 6: return launch_t<T, kNested, 8, 4, 2, 2>(p, st);
    case 7: return launch_t<T, kNested, 8, 4, 3, 2>(p, st);
    case 8: return launch_t<T, kNested, 8, 2, 1, 3>(p, st);
  }
  return -1;
}

}  // namespace fastnf4_burst

extern "C" int probe_burst(const fastnf4_mma::Params* p, int dtype, int nested, int cfg, void* stream) {
  using namespace fastnf4_burst;
  auto st = static_cast<cudaStream_t>(stream);
  if (p->K % 128 != 0 || p->blocksize < 64 || p->M < 1 || p->M > 2 || p->M * p->K > 16384) return -3;
  if (dtype == 0) return nested ? launch_cfg<__nv_bfloat16, true>(p, cfg, st) : launch_cfg<__nv_bfloat16, false>(p, cfg, st);
  return nested ? launch_cfg<__half, true>(p, cfg, st) : launch_cfg<__half, false>(p, cfg, st);
}
