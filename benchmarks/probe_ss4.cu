// Probe (not a package kernel): probe_ss3.cu with 128-row weight tiles (m64n128k16: 64 accumulators, so a
// 512-thread block fits: 2 wgmma warpgroups + 2 decode warpgroups, which take alternate K steps, one weight row per
// thread and step), the decode always the register table (PROBE_SS_REGLUT of probe_ss3.cu), no table in shared
// memory. x is read once per 128 weight rows (probe_ss3: 256).
// Below: the descriptions of the probes this one derives from.
// Probe (not a package kernel): probe_ss2.cu with every copy a TMA (x: one 64 x 64 box per wgmma warpgroup and step,
// 128-byte swizzle; packed weights: one 32-byte x rows box per decode warpgroup and step) completing on mbarriers,
// and PROBE_SS_DEC decode warpgroups. PROBE_SS_REGLUT: the decode uses no table in shared memory (each row's 16
// values of a step built in registers as byte planes, looked up with PRMT: ~3.5 ALU instructions per code, exact). Only 1 compiles: with 2 (512 threads, setmaxnreg 192 for the wgmma warpgroups,
// 64 for the decode ones) ptxas (nvcc 13.0) still compiles the wgmma code under the 128-register cap of a 512-thread
// block, and an m64n256 wgmma needs >= 154. The pair table is 32 KiB (128-byte entries).
// Below: the descriptions of the probes this one derives from.
// Probe (not a package kernel), warp-specialized form of probe_ss.cu (same Params, same entry points; probe_ss.py
// builds it with PROBE_SS_SRC=probe_ss2.cu). Three warpgroups: WG 0 / 1 run the wgmma of their 64 x rows and copy
// those rows themselves (cp.async, a named barrier per warpgroup), WG 2 copies the packed weights of its two rows per
// thread and decodes every K step into a ring of bf16 B tiles; full / empty mbarriers per tile. Nothing else couples
// the warpgroups, so the decode of step j + 1 .. j + 3 overlaps the wgmma of step j.
// Below: the description of the lockstep probe this one derives from.
// Probe (not a package kernel): NF4 x bf16 GEMM for M around 128 with the roles of session 8's wgmma kernel swapped.
// x is the wgmma A operand (two warpgroups x 64 rows = a 128-row x tile, from shared memory, 128-byte swizzle) and
// the weights are the B operand: every K step (64 codes) all 256 threads decode the block's 256 weight rows into a
// bf16 tile in shared memory (thread n: row n, the exact dequantized value: float32 code x float32 absmax, one
// rounding), and both warpgroups run m64n256k16 wgmma on it (SS form). So each weight is decoded once per 128 x rows
// and 256 weight rows share every x tile (session 8's kernel: 128 weight rows per x tile, weights in registers).
// The decode of step j + 1 overlaps the wgmma of step j; one block barrier per step.
// Limits (probe): bf16, blocksize 64, K % 256 == 0, N % 256 == 0; nested (8-bit absmax) or float32 absmax.
// benchmarks/probe_ss.py drives it.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace probe_ss {

struct Params {
  const uint8_t* packed;
  const void* absmax;  // uint8 codes (nested) or float32
  const float* nested_code;
  const float* nested_absmax;
  const float* offset;
  const float* code;
  const __nv_bfloat16* x;
  __nv_bfloat16* y;
  float* y32;  // [splits, M, N] partial sums when splits > 1
  long long M, N, K, splits, per;  // per: K steps (of 64) per split, a multiple of 4
};

#if defined(PROBE_SS_PAIR)  // each decode warpgroup decodes two of its steps per iteration (more independent work)
constexpr int kP = 2, kBS = 8;
#else
constexpr int kP = 1, kBS = 4;
#endif
constexpr int kDec = 2, kThreads = (2 + kDec) * 128, kRows = 128, kBM = 128, kXS = 4, kWS = 4;
constexpr int kXStage = kBM * 128;          // 128 rows x 64 bf16
constexpr int kBTile = kRows * 128;         // 128 rows x 64 bf16
constexpr int kWStage = kRows * 32;         // packed bytes of a step
constexpr int kSmem = 1024 + kXS * kXStage + kBS * kBTile + kDec * kWS * kWStage + 1024 + 256;
struct KParams {
  Params p;
  CUtensorMap xmap, wmap;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, int size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(size) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int n>
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory"); }
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ float2 lds64f(uint32_t a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts128(uint32_t a, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t d;  // lo in the low half: the element at the lower address
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ void fence_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// K-major tile, 128-byte swizzle, 8-row groups 1024 bytes apart
__device__ __forceinline__ uint64_t desc(uint32_t a) {
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (1ull << 16) | (static_cast<uint64_t>(1024 >> 4) << 32) |
         (1ull << 62);
}
// scale-d = accumulate: 0 on the first step (d = A B, so the accumulators need no zeroing, which made ptxas
// serialize the wgmma: C7515)
__device__ __forceinline__ void mma128(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(accumulate));
}

// the absmax of 4 consecutive steps of one row (K % 256 == 0 and splits of whole quads keep the word aligned)
template <bool kNested>
__device__ __forceinline__ void load_quad(const Params& p, long long blk, uint32_t& codes, float4& f, float& na) {
  if constexpr (kNested) {
    codes = __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(p.absmax) + blk));
    na = __ldg(p.nested_absmax + (blk >> 8));
  } else {
    f = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.absmax) + blk));
  }
}

template <bool kNested>
__global__ void __launch_bounds__(kThreads, 1) ss_kernel(const __grid_constant__ KParams kp) {
  const Params& p = kp.p;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t xs0 = base, bt0 = xs0 + kXS * kXStage, ws0 = bt0 + kBS * kBTile;
  const uint32_t ncs = ws0 + kDec * kWS * kWStage;
  // mbarriers: full_x[2][kXS], full_w[kDec][kWS], full_b[kBS], empty_b[kBS]
  const uint32_t full_x = ncs + 1024, full_w = full_x + 8 * 2 * kXS, full_b = full_w + 8 * kDec * kWS;
  const uint32_t empty_b = full_b + 8 * kBS;
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, tw = tid & 127;
  const long long N = p.N, K = p.K, M = p.M;
  const long long tiles = N / kRows;
  const long long tile = blockIdx.x % tiles, split = blockIdx.x / tiles;
  const long long m0 = static_cast<long long>(blockIdx.y) * kBM;
  const int s0 = static_cast<int>(split * p.per);
  const int nsteps = min(static_cast<int>(K / 64) - s0, static_cast<int>(p.per));
  if (kNested && tid < 256)
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(ncs + 4 * tid), "f"(__ldg(p.nested_code + tid)));
  if (tid == 0) {
    for (int s = 0; s < 2 * kXS; ++s) mbar_init(full_x + 8 * s, 1);
    for (int s = 0; s < kDec * kWS; ++s) mbar_init(full_w + 8 * s, 1);
    for (int s = 0; s < kBS; ++s) {
      mbar_init(full_b + 8 * s, 128);
      mbar_init(empty_b + 8 * s, 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kp.xmap)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kp.wmap)) : "memory");
  }
  __syncthreads();
  if (wg < 2) {
    // ---------------------------------------------------------------- wgmma warpgroups: x rows 64 wg .. 64 wg + 63
    const uint32_t fx = full_x + 8 * kXS * wg;
    auto load_x = [&](int j) {  // (one thread)
      const int st = j % kXS;
      mbar_expect(fx + 8 * st, 64 * 128);
      tma2d(xs0 + st * kXStage + wg * 64 * 128, &kp.xmap, (s0 + j) * 64, static_cast<int>(m0) + 64 * wg, fx + 8 * st);
    };
    if (tw == 0)
      for (int j = 0; j < kXS - 1 && j < nsteps; ++j) load_x(j);
    float acc[64];
    for (int j = 0; j < nsteps; ++j) {
      mbar_wait(fx + 8 * (j % kXS), (j / kXS) & 1);
      mbar_wait(full_b + 8 * (j % kBS), (j / kBS) & 1);
      wg_fence();
      [[maybe_unused]] const uint32_t xa = xs0 + (j % kXS) * kXStage + wg * 64 * 128;
      [[maybe_unused]] const uint32_t bb = bt0 + (j % kBS) * kBTile;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#if !defined(PROBE_SS_NO_MMA)
        mma128(acc, desc(xa + 32 * kk), desc(bb + 32 * kk), j > 0 || kk > 0);
#endif
      }
      wg_commit();
      wg_wait1();  // step j - 1's wgmma has finished: its B tile and x stage are free
      if (tw == 0) {
        if (j > 0) mbar_arrive(empty_b + 8 * ((j - 1) % kBS));
        if (j + kXS - 1 < nsteps) load_x(j + kXS - 1);  // into step j - 1's stage
      }
    }
    wg_wait0();
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i])::"memory");
    const int w4 = tw >> 5;
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
      const int r = 64 * wg + 16 * w4 + (lane >> 2) + 8 * ((i >> 1) & 1);
      const long long m = m0 + r;
      const long long col = tile * kRows + 8 * (i >> 2) + 2 * (lane & 3);
      if (m < M) {
        if (p.splits > 1) {
          *reinterpret_cast<float2*>(p.y32 + (split * M + m) * N + col) = make_float2(acc[i], acc[i + 1]);
        } else {
          *reinterpret_cast<uint32_t*>(p.y + m * N + col) = pack_bf16(acc[i], acc[i + 1]);
        }
      }
    }
    return;
  }
  // ------------------------------------------- decode warpgroups: d = wg - 2 takes steps j = d, d + 2, ..; row tw
  const int d = wg - 2;
  const uint32_t fw = full_w + 8 * kWS * d, wring = ws0 + d * kWS * kWStage;
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  float cv[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) cv[i] = __ldg(p.code + i);
  const int own = nsteps > d ? (nsteps - d + 1) / 2 : 0;  // this warpgroup's steps
  auto load_w = [&](int k) {  // own step k = step 2 k + d (one thread)
    const int st = k % kWS;
    mbar_expect(fw + 8 * st, kRows * 32);
    tma2d(wring + st * kWStage, &kp.wmap, (s0 + 2 * k + d) * 32, static_cast<int>(tile * kRows), fw + 8 * st);
  };
  const long long row = tile * kRows + tw;
  const long long blk = row * (K / 64) + s0;
  uint32_t codes_c = 0, codes_n = 0;
  float4 f_c = make_float4(0.f, 0.f, 0.f, 0.f), f_n = f_c;
  float na_c = 0.f, na_n = 0.f;
  load_quad<kNested>(p, blk, codes_c, f_c, na_c);
  if (nsteps > 4) load_quad<kNested>(p, blk + 4, codes_n, f_n, na_n);
  if (tw == 0)
    for (int k = 0; k < kWS - kP && k < own; ++k) load_w(k);
  for (int k = 0; k < own; k += kP) {
    named_barrier(3 + d, 128);  // the warpgroup finished its previous steps: their packed stages are free
    if (tw == 0)
#pragma unroll
      for (int u = 0; u < kP; ++u)
        if (k + kWS - kP + u < own) load_w(k + kWS - kP + u);
    float a[kP];
    uint32_t words[kP][8];
#pragma unroll
    for (int u = 0; u < kP; ++u) {
      const int j = 2 * (k + u) + d;
      if (k + u >= own) break;
      if ((j & 3) == d && j >= 4) {  // the first of this warpgroup's two steps in a new quad
        codes_c = codes_n; f_c = f_n; na_c = na_n;
        if (j - d + 4 < nsteps) load_quad<kNested>(p, blk + j - d + 4, codes_n, f_n, na_n);
      }
      const int i = j & 3;
      if constexpr (kNested) {
        const uint32_t code = (codes_c >> (8 * i)) & 0xffu;
        float nc;
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(nc) : "r"(ncs + 4 * code));
        a[u] = __fadd_rn(__fmul_rn(nc, na_c), offset);
      } else {
        a[u] = i == 0 ? f_c.x : i == 1 ? f_c.y : i == 2 ? f_c.z : f_c.w;
      }
      mbar_wait(fw + 8 * ((k + u) % kWS), ((k + u) / kWS) & 1);
      if (j >= kBS) mbar_wait(empty_b + 8 * (j % kBS), ((j / kBS) - 1) & 1);
      const uint32_t rs = wring + ((k + u) % kWS) * kWStage + tw * 32;
      const uint4 w0 = lds128(rs), w1 = lds128(rs + 16);
      words[u][0] = w0.x; words[u][1] = w0.y; words[u][2] = w0.z; words[u][3] = w0.w;
      words[u][4] = w1.x; words[u][5] = w1.y; words[u][6] = w1.z; words[u][7] = w1.w;
    }
#if !defined(PROBE_SS_NO_DECODE)
#pragma unroll
    for (int u = 0; u < kP; ++u) {
      if (k + u >= own) break;
      const int j = 2 * (k + u) + d, n = tw;
      const uint32_t dst = bt0 + (j % kBS) * kBTile + n * 128;
      // the row's 16 dequantized values of this step, exactly: bf16(code[i] x a); as byte planes (lo / hi bytes of
      // entries 4q .. 4q + 3 in L[q] / H[q]) for PRMT lookups, 4 codes per lookup
      uint32_t L[4], H[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t r0 = pack_bf16(cv[4 * q] * a[u], cv[4 * q + 1] * a[u]);
        const uint32_t r1 = pack_bf16(cv[4 * q + 2] * a[u], cv[4 * q + 3] * a[u]);
        L[q] = prmt(r0, r1, 0x6420u);
        H[q] = prmt(r0, r1, 0x7531u);
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        uint32_t o[4];
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          // nibbles of bytes 2g, 2g + 1: (c1, c0, c3, c2) in element order c0 .. c3 (high nibble first)
          const uint32_t grp = words[u][c] >> (16 * g);
          const uint32_t sel = grp & 0x7777u;
          const uint32_t msel = ((grp >> 3) & 0x1111u) * 12u;  // 0xC (sign mode, byte 4 = 0x80) where code >= 8
          const uint32_t mask = prmt(0u, 0x80808080u, msel);
          const uint32_t la = prmt(L[0], L[1], sel), lb = prmt(L[2], L[3], sel);
          const uint32_t ha = prmt(H[0], H[1], sel), hb = prmt(H[2], H[3], sel);
          const uint32_t lo = (lb & mask) | (la & ~mask), hi = (hb & mask) | (ha & ~mask);
          o[2 * g] = prmt(lo, hi, 0x4051u);      // (c0, c1)
          o[2 * g + 1] = prmt(lo, hi, 0x6273u);  // (c2, c3)
        }
        sts128(dst + ((c ^ (n & 7)) << 4), o[0], o[1], o[2], o[3]);
      }
    }
#endif
    fence_async();
#pragma unroll
    for (int u = 0; u < kP; ++u)
      if (k + u < own) mbar_arrive(full_b + 8 * ((2 * (k + u) + d) % kBS));
  }
}

}  // namespace probe_ss

extern "C" {
int probe_ss_params_size() { return static_cast<int>(sizeof(probe_ss::Params)); }
int probe_ss_rows() { return probe_ss::kRows; }
int probe_ss_prepare() {
  int rc = cudaFuncSetAttribute(probe_ss::ss_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, probe_ss::kSmem);
  rc |= cudaFuncSetAttribute(probe_ss::ss_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, probe_ss::kSmem);
  return rc;
}
int probe_ss_run(const probe_ss::Params* p, int nested, cudaStream_t stream) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr)
      return static_cast<int>(cudaErrorNotSupported);
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  probe_ss::KParams kp;
  kp.p = *p;
  const cuuint32_t unit[2] = {1, 1};
  {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p->K), static_cast<cuuint64_t>(p->M)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p->K) * 2};
    const cuuint32_t box[2] = {64, 64};
    if (encode(&kp.xmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(p->x), dims, strides, box,
               unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return static_cast<int>(cudaErrorInvalidValue);
  }
  {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p->K / 2), static_cast<cuuint64_t>(p->N)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p->K / 2)};
    const cuuint32_t box[2] = {32, static_cast<cuuint32_t>(probe_ss::kRows)};
    if (encode(&kp.wmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(p->packed), dims, strides, box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return static_cast<int>(cudaErrorInvalidValue);
  }
  const dim3 grid(static_cast<unsigned>(p->N / probe_ss::kRows * p->splits),
                  static_cast<unsigned>((p->M + probe_ss::kBM - 1) / probe_ss::kBM));
  if (nested) probe_ss::ss_kernel<true><<<grid, probe_ss::kThreads, probe_ss::kSmem, stream>>>(kp);
  else probe_ss::ss_kernel<false><<<grid, probe_ss::kThreads, probe_ss::kSmem, stream>>>(kp);
  return static_cast<int>(cudaGetLastError());
}
}
