// Probe: an NF4 matmul for 2 < M <= 32 with x as the mma A operand and the weights as B (probe_xa.py).
//
// y[M, N] = x[M, K] @ dequant(W[N, K]).T. mma.m16n8k16: A = 16 rows of x (MT tiles cover M), B = 8 weight rows
// (an "n8 tile"), so each x fragment, held in registers, serves every weight tile of a warp (kT tiles: 8 kT rows),
// and the warps never synchronise after the start: each streams its own rows over its own K range, its next
// weights loaded while it decodes the current ones. x comes through L1 (read by every warp of the same K range).
//
// Fragments. A super-step is 128 codes of K (64 packed bytes per row). Lane (g = lane / 4, t = lane % 4) loads 16
// bytes of weight row 8 j + g of each tile j: bytes 16 t .. 16 t + 15 of the super-step, codes 32 t .. 32 t + 31.
// The k order inside an mma is free as long as A and B agree: mma s (0..7) gives lane t's logical k pair 2t, 2t+1
// byte 2 s of its chunk (true k = 32 t + 4 s + 0, 1) and the pair 2t+8, 2t+9 byte 2 s + 1 (true k + 2, 3); the A
// fragment takes x at the same true k. A byte is decoded exactly as ``dequantize``: one PRMT builds the address
// of its float32 code pair in a 256-entry table (16 copies: conflict-free 8-byte loads), two float32 products with
// the chunk's absmax, one rounding to the input dtype. So the error is that of cuBLAS on the dequantized weight.
//
// Work items: (a group of 8 kT weight rows, a K range of ``per`` super-steps); consecutive warps take consecutive
// row groups of the same K range (they share x lines in L1). With S > 1 ranges, float32 partial sums [S, M, N] and
// a second kernel (a programmatic dependent) adds them in split order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace probe_xa {

struct Params {
  const uint8_t* packed;
  const void* absmax;        // float32, or uint8 codes with double quantization
  const float* nested_code;  // [256]
  const float* nested_absmax;
  const float* offset;
  const float* code;         // [16]
  const void* x;             // [M, K]
  const void* bias;          // [N] or null
  void* y;                   // [M, N]
  float* y32;                // [S, M, N] when S > 1
  long long M, N, K;
  long long log2_blocksize;
  long long splits, per;     // S K ranges of ``per`` super-steps
};

#ifndef PROBE_XA_T
#define PROBE_XA_T 4
#endif
#ifndef PROBE_XA_U
#define PROBE_XA_U 2
#endif
#ifndef PROBE_XA_MINB
#define PROBE_XA_MINB 2
#endif
constexpr int kT = PROBE_XA_T;  // n8 weight tiles per warp
constexpr int kU = PROBE_XA_U;  // super-steps of weights in registers: the one decoded and kU - 1 in flight
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kSS = 128;        // K per super-step
constexpr int kTable = 256 * 256 + 256;  // + alignment slack

template <typename T> struct Pair {
  using T2 = typename std::conditional<std::is_same<T, __nv_bfloat16>::value, __nv_bfloat162, __half2>::type;
  static __device__ __forceinline__ uint32_t make(float lo, float hi) {
    T2 v = T2(T(lo), T(hi));
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float load(const void* p, long long i) { return float(reinterpret_cast<const T*>(p)[i]); }
};

template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// byte b of w: PRMT -> (byte << 8) + 8 (lane & 15), one 8-byte load of the float32 pair, scaled, rounded once
template <typename T>
__device__ __forceinline__ uint32_t decode(uint32_t table_s, uint32_t lane8, uint32_t w, uint32_t sel, float a) {
  float hi, lo;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(hi), "=f"(lo) : "r"(table_s + __byte_perm(w, lane8, sel)));
  return Pair<T>::make(__fmul_rn(hi, a), __fmul_rn(lo, a));
}

// a chunk's statistics: loaded a super-step ahead (raw), decoded when used, so no load latency is waited for early
template <bool kNested> struct Raw {
  uint32_t q;  // float32 absmax bits, or the nested 8-bit code
  float s2;    // nested: the code's scale
};
template <bool kNested>
__device__ __forceinline__ Raw<kNested> load_raw(const Params& p, long long e, uint32_t lb) {
  const long long blk = e >> lb;
  if constexpr (kNested) {
    return {__ldg(reinterpret_cast<const uint8_t*>(p.absmax) + blk), __ldg(p.nested_absmax + (blk >> 8))};
  } else {
    return {__float_as_uint(__ldg(reinterpret_cast<const float*>(p.absmax) + blk)), 0.f};
  }
}
template <bool kNested>
__device__ __forceinline__ float absmax_of(const Raw<kNested>& r, const float* ncode, float offset) {
  if constexpr (kNested) return __fadd_rn(__fmul_rn(ncode[r.q], r.s2), offset);  // bitsandbytes' two steps
  return __uint_as_float(r.q);
}

template <typename T, int MT, bool kNested>
__global__ void __launch_bounds__(kThreads, PROBE_XA_MINB) nf4_xa(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float ncode[kNested ? 256 : 1];
  // 256-byte aligned: each half-warp's 8-byte loads at 8 (lane & 15) then cover the 32 banks once
  const uint32_t table_s = (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + 255u) & ~255u;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  // with split-K the sum kernel is this grid's programmatic dependent: let it be scheduled now (it waits for us)
  if (p.splits > 1) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  {  // entry v: 16 copies of (code[v >> 4], code[v & 15]) in float32 (256-byte entries, second half unused)
    const float hi = __ldg(p.code + (tid >> 4)), lo = __ldg(p.code + (tid & 15));
#pragma unroll
    for (int i = 0; i < 8; ++i)
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %1, %2};\n" ::"r"(table_s + 256 * tid + 16 * i), "f"(hi), "f"(lo));
    if constexpr (kNested) ncode[tid] = __ldg(p.nested_code + tid);
  }
  const long long groups = (p.N + 8 * kT - 1) / (8 * kT);
  const long long item = static_cast<long long>(blockIdx.x) * kWarps + warp;
  const long long split = item / groups, n0 = (item % groups) * (8 * kT);
  const long long ss_total = (p.K + kSS - 1) / kSS;
  const long long ss0 = split * p.per;
  const int nss = static_cast<int>(min(ss_total, ss0 + p.per) - ss0);
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  const uint32_t lb = static_cast<uint32_t>(p.log2_blocksize);
  const uint32_t lane8 = 8u * (lane & 15);
  __syncthreads();
  if (split >= p.splits || nss <= 0) return;

  // element index of this lane's chunk in weight row 8 j + g of tile j (rows past N read row N - 1; never stored),
  // and of its x chunk in x row m (rows past M are not read: zeros)
  auto erow = [&](int j) { return min(n0 + 8 * j + g, p.N - 1) * p.K + 32 * t; };
  const T* xbase = reinterpret_cast<const T*>(p.x) + g * p.K + 32 * t;

  float acc[MT][kT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < kT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  uint4 wb[kU][kT];  // a ring of kU super-steps: slot u % kU
  Raw<kNested> rb[kU][kT];
  auto load = [&](int u, uint4 (&w)[kT], Raw<kNested> (&r)[kT]) {
    const long long k = (ss0 + u) * kSS;
    const bool on = u < nss && k + 32 * t < p.K;
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      const long long e = erow(j) + k;
      w[j] = on ? __ldcs(reinterpret_cast<const uint4*>(p.packed + (e >> 1))) : make_uint4(0, 0, 0, 0);
      r[j] = on ? load_raw<kNested>(p, e, lb) : Raw<kNested>{0u, 0.f};
    }
  };
  // x at true k = k + 32 t + 8 q .. + 8 of rows g and g + 8 of each m tile (rows past M / K: zeros)
  auto load_x = [&](int u, int q, uint4 (&xa)[MT][2]) {
    const long long k = (ss0 + u) * kSS;
    const bool kon = u < nss && k + 32 * t < p.K;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        xa[i][h] = (16 * i + 8 * h + g < p.M && kon)
                       ? __ldg(reinterpret_cast<const uint4*>(xbase + (16 * i + 8 * h) * p.K + k + 8 * q))
                       : make_uint4(0, 0, 0, 0);
  };
#pragma unroll
  for (int v = 0; v < kU; ++v) load(v, wb[v], rb[v]);
  uint4 xa[MT][2], xn[MT][2];
  load_x(0, 0, xa);
  for (int u0 = 0; u0 < nss; u0 += kU) {
#pragma unroll
    for (int v = 0; v < kU; ++v) {
      const int u = u0 + v;
      if (u >= nss) break;
      float a[kT];
#pragma unroll
      for (int j = 0; j < kT; ++j) a[j] = absmax_of<kNested>(rb[v][j], ncode, offset);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        load_x(q < 3 ? u : u + 1, (q + 1) & 3, xn);  // the next x fragment, one step ahead
#pragma unroll
        for (int j = 0; j < kT; ++j) {
          const uint4& w = wb[v][j];
          const uint32_t word = q == 0 ? w.x : q == 1 ? w.y : q == 2 ? w.z : w.w;
          const uint32_t b0 = decode<T>(table_s, lane8, word, 0x5504u, a[j]);
          const uint32_t b1 = decode<T>(table_s, lane8, word, 0x5514u, a[j]);
          const uint32_t b2 = decode<T>(table_s, lane8, word, 0x5524u, a[j]);
          const uint32_t b3 = decode<T>(table_s, lane8, word, 0x5534u, a[j]);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma<T>(acc[i][j], xa[i][0].x, xa[i][1].x, xa[i][0].y, xa[i][1].y, b0, b1);
            mma<T>(acc[i][j], xa[i][0].z, xa[i][1].z, xa[i][0].w, xa[i][1].w, b2, b3);
          }
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) xa[i][0] = xn[i][0], xa[i][1] = xn[i][1];
      }
      load(u + kU, wb[v], rb[v]);  // the slot refilled kU super-steps ahead (nothing past the end)
    }
  }
  // D fragment of (m tile i, weight tile j): y[16 i + g (+ 8)][n0 + 8 j + 2 t (+ 1)]
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long m = 16 * i + 8 * h + g;
      if (m >= p.M) continue;
#pragma unroll
      for (int j = 0; j < kT; ++j) {
        const long long n = n0 + 8 * j + 2 * t;
        const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
        if (p.splits > 1) {
          float* dst = p.y32 + (split * p.M + m) * p.N + n;
          if (n + 1 < p.N && (p.N & 1) == 0) {
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
          } else {
            if (n < p.N) dst[0] = v0;
            if (n + 1 < p.N) dst[1] = v1;
          }
        } else {
          const float b0 = p.bias && n < p.N ? Pair<T>::load(p.bias, n) : 0.f;
          const float b1 = p.bias && n + 1 < p.N ? Pair<T>::load(p.bias, n + 1) : 0.f;
          T* dst = reinterpret_cast<T*>(p.y) + m * p.N + n;
          if (n + 1 < p.N && (p.N & 1) == 0) {
            *reinterpret_cast<uint32_t*>(dst) = Pair<T>::make(v0 + b0, v1 + b1);
          } else {
            if (n < p.N) dst[0] = T(v0 + b0);
            if (n + 1 < p.N) dst[1] = T(v1 + b1);
          }
        }
      }
    }
  }
}

// y = sum of the S partial slices in split order (+ bias), rounded once; a programmatic dependent of nf4_xa
template <typename T>
__global__ void __launch_bounds__(256) xa_sum(const float* __restrict__ y32, const void* bias, void* y, int splits,
                                              long long mn, long long n) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < mn;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < splits; ++s) v += __ldcs(y32 + s * mn + i);
    if (bias != nullptr) v += Pair<T>::load(bias, i % n);
    reinterpret_cast<T*>(y)[i] = T(v);
  }
}

template <typename T, int MT, bool kNested>
int prepare() {
  return (int)cudaFuncSetAttribute(nf4_xa<T, MT, kNested>, cudaFuncAttributeMaxDynamicSharedMemorySize, kTable);
}

template <typename T, int MT, bool kNested>
int launch(const Params* p, int blocks, cudaStream_t stream) {
  nf4_xa<T, MT, kNested><<<blocks, kThreads, kTable, stream>>>(*p);
  if (p->splits > 1) {
    cudaLaunchConfig_t cfg = {};
    const long long mn = p->M * p->N;
    cfg.gridDim = dim3((unsigned)min((mn + 255) / 256, 1056LL));
    cfg.blockDim = dim3(256);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const float* y32 = p->y32;
    const void* bias = p->bias;
    void* y = p->y;
    int splits = (int)p->splits;
    long long n = p->N;
    cudaLaunchKernelEx(&cfg, xa_sum<T>, y32, bias, y, splits, mn, n);
  }
  return (int)cudaGetLastError();
}

}  // namespace probe_xa

extern "C" {
int probe_xa_prepare() {
  using namespace probe_xa;
  int rc = 0;
  rc |= prepare<__nv_bfloat16, 1, false>() | prepare<__nv_bfloat16, 1, true>() | prepare<__nv_bfloat16, 2, false>() |
        prepare<__nv_bfloat16, 2, true>() | prepare<__half, 1, false>() | prepare<__half, 1, true>() |
        prepare<__half, 2, false>() | prepare<__half, 2, true>();
  return rc;
}
int probe_xa_params_size() { return (int)sizeof(probe_xa::Params); }
int probe_xa_tiles() { return probe_xa::kT; }
int probe_xa_minb() { return PROBE_XA_MINB; }
int probe_xa_warps() { return probe_xa::kWarps; }
int probe_xa_run(const probe_xa::Params* p, int dtype, int nested, int blocks, cudaStream_t stream) {
  using namespace probe_xa;
  const int mt = p->M <= 16 ? 1 : 2;
  if (dtype == 0) {
    if (mt == 1) return nested ? launch<__nv_bfloat16, 1, true>(p, blocks, stream) : launch<__nv_bfloat16, 1, false>(p, blocks, stream);
    return nested ? launch<__nv_bfloat16, 2, true>(p, blocks, stream) : launch<__nv_bfloat16, 2, false>(p, blocks, stream);
  }
  if (mt == 1) return nested ? launch<__half, 1, true>(p, blocks, stream) : launch<__half, 1, false>(p, blocks, stream);
  return nested ? launch<__half, 2, true>(p, blocks, stream) : launch<__half, 2, false>(p, blocks, stream);
}
}
