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
#include "probe_ss_common.cuh"

namespace probe_ss {

#ifndef PROBE_SS_DEC
#define PROBE_SS_DEC 1  // 2 does not compile: ptxas keeps the 512-thread cap of 128 registers for the wgmma code after setmaxnreg.inc
#endif
constexpr int kDec = PROBE_SS_DEC, kThreads = (2 + kDec) * 128, kRows = 256, kBM = 128, kXS = 4, kWS = 4, kBS = 3;
constexpr int kRowsPerDec = kRows / kDec;
constexpr int kTableBytes = 32768;          // 256 entries x 128 bytes: 16 float32 pairs or 32 bf16 pairs
constexpr int kXStage = kBM * 128;          // 128 rows x 64 bf16
constexpr int kBTile = kRows * 128;         // 256 rows x 64 bf16
constexpr int kWStage = kRows * 32;         // packed bytes of a step
constexpr int kSmem = 1024 + kTableBytes + kXS * kXStage + kBS * kBTile + kWS * kWStage + 1024 + 256;

template <bool kNested>
__global__ void __launch_bounds__(kThreads, 1) ss_kernel(const __grid_constant__ KParams kp) {
  const Params& p = kp.p;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t table = base, xs0 = base + kTableBytes, bt0 = xs0 + kXS * kXStage, ws0 = bt0 + kBS * kBTile;
  const uint32_t ncs = ws0 + kWS * kWStage;
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
  if (tid < 256) build_tables<kNested, 7>(p, table, ncs, tid);  // the pair table and the nested codes
  if (tid == 0) {
    for (int s = 0; s < 2 * kXS; ++s) mbar_init(full_x + 8 * s, 1);
    for (int s = 0; s < kDec * kWS; ++s) mbar_init(full_w + 8 * s, 1);
    for (int s = 0; s < kBS; ++s) {
      mbar_init(full_b + 8 * s, 128 * kDec);
      mbar_init(empty_b + 8 * s, 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kp.xmap)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kp.wmap)) : "memory");
  }
  __syncthreads();
  if (wg < 2) {
    // ---------------------------------------------------------------- wgmma warpgroups: x rows 64 wg .. 64 wg + 63
#if PROBE_SS_DEC == 2
    asm volatile("setmaxnreg.inc.sync.aligned.u32 192;\n" ::: "memory");
#endif
    const uint32_t fx = full_x + 8 * kXS * wg;
    auto load_x = [&](int j) {  // (one thread)
      const int st = j % kXS;
      mbar_expect(fx + 8 * st, 64 * 128);
      tma2d(xs0 + st * kXStage + wg * 64 * 128, &kp.xmap, (s0 + j) * 64, static_cast<int>(m0) + 64 * wg, fx + 8 * st);
    };
    if (tw == 0)
      for (int j = 0; j < kXS - 1 && j < nsteps; ++j) load_x(j);
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    for (int j = 0; j < nsteps; ++j) {
      mbar_wait(fx + 8 * (j % kXS), (j / kXS) & 1);
      mbar_wait(full_b + 8 * (j % kBS), (j / kBS) & 1);
      wg_fence();
      [[maybe_unused]] const uint32_t xa = xs0 + (j % kXS) * kXStage + wg * 64 * 128;
      [[maybe_unused]] const uint32_t bb = bt0 + (j % kBS) * kBTile;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#if !defined(PROBE_SS_NO_MMA)
        mma(acc, desc(xa + 32 * kk), desc(bb + 32 * kk));
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
    for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(acc[i])::"memory");
    const int w4 = tw >> 5;
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
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
  // ------------------------------------------------------------- decode warpgroups: d = wg - 2, rows d R + tw (+128)
#if PROBE_SS_DEC == 2
  asm volatile("setmaxnreg.dec.sync.aligned.u32 64;\n" ::: "memory");
#endif
  constexpr int kH = kRowsPerDec / 128;  // rows per thread
  const int d = wg - 2;
  const uint32_t fw = full_w + 8 * kWS * d;
  const float offset = kNested ? __ldg(p.offset) : 0.f;
#if defined(PROBE_SS_FAST)
  const uint32_t lanec = lane * 8u;  // >> 1: 4 lane
#else
  const uint32_t lanec = (lane & 15) * 16u;  // >> 1: 8 (lane & 15)
#endif
  auto load_w = [&](int j) {  // (one thread)
    const int st = j % kWS;
    mbar_expect(fw + 8 * st, kRowsPerDec * 32);
    tma2d(ws0 + st * kWStage + d * kRowsPerDec * 32, &kp.wmap, (s0 + j) * 32,
          static_cast<int>(tile * kRows) + d * kRowsPerDec, fw + 8 * st);
  };
  [[maybe_unused]] float cv[16];  // (PROBE_SS_REGLUT) the 16 code values
#pragma unroll
  for (int i = 0; i < 16; ++i) cv[i] = __ldg(p.code + i);
  const long long rowb = tile * kRows + d * kRowsPerDec + tw;
  long long blk[kH];
  uint32_t codes_c[kH], codes_n[kH];
  float4 f_c[kH], f_n[kH];
  float na_c[kH], na_n[kH];
#pragma unroll
  for (int h = 0; h < kH; ++h) {
    blk[h] = (rowb + 128 * h) * (K / 64) + s0;
    codes_n[h] = 0; na_n[h] = 0.f; f_n[h] = make_float4(0.f, 0.f, 0.f, 0.f);
    load_quad<kNested>(p, blk[h], codes_c[h], f_c[h], na_c[h]);
    if (nsteps > 4) load_quad<kNested>(p, blk[h] + 4, codes_n[h], f_n[h], na_n[h]);
  }
  if (tw == 0)
    for (int j = 0; j < kWS - 1 && j < nsteps; ++j) load_w(j);
  for (int j = 0; j < nsteps; ++j) {
    named_barrier(3 + d, 128);  // the warpgroup finished step j - 1: its packed stage is free
    if (tw == 0 && j + kWS - 1 < nsteps) load_w(j + kWS - 1);
    if ((j & 3) == 0 && j > 0) {
#pragma unroll
      for (int h = 0; h < kH; ++h) {
        codes_c[h] = codes_n[h]; f_c[h] = f_n[h]; na_c[h] = na_n[h];
        if (j + 4 < nsteps) load_quad<kNested>(p, blk[h] + j + 4, codes_n[h], f_n[h], na_n[h]);
      }
    }
    mbar_wait(fw + 8 * (j % kWS), (j / kWS) & 1);
    if (j >= kBS) mbar_wait(empty_b + 8 * (j % kBS), ((j / kBS) - 1) & 1);
#if !defined(PROBE_SS_NO_DECODE)
#pragma unroll
    for (int h = 0; h < kH; ++h) {
      const int nl = tw + 128 * h, n = d * kRowsPerDec + nl, i = j & 3;
      float a;
      if constexpr (kNested) {
        const uint32_t code = (codes_c[h] >> (8 * i)) & 0xffu;
        float nc;
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(nc) : "r"(ncs + 4 * code));
        a = __fadd_rn(__fmul_rn(nc, na_c[h]), offset);
      } else {
        a = i == 0 ? f_c[h].x : i == 1 ? f_c[h].y : i == 2 ? f_c[h].z : f_c[h].w;
      }
      const uint32_t rs = ws0 + (j % kWS) * kWStage + n * 32;
      const uint4 w0 = lds128(rs), w1 = lds128(rs + 16);
      const uint32_t words[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
      const uint32_t dst = bt0 + (j % kBS) * kBTile + n * 128;
#if defined(PROBE_SS_REGLUT)
      reglut_row(words, a, cv, dst, n);
#else
#if defined(PROBE_SS_FAST)
      const uint32_t a2 = pack_bf16(a, a);
#endif
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        uint32_t o[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const uint32_t off = prmt(words[c], lanec, 0x5504u | (t << 4)) >> 1;  // (byte << 7) | lane part
#if defined(PROBE_SS_FAST)
          uint32_t v;
          asm("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(table + off));
          asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(o[t]) : "r"(v), "r"(a2));
#else
          const float2 v = lds64f(table + off);
          o[t] = pack_bf16(v.x * a, v.y * a);
#endif
        }
        sts128(dst + ((c ^ (n & 7)) << 4), o[0], o[1], o[2], o[3]);
      }
#endif
    }
#endif
    fence_async();
    mbar_arrive(full_b + 8 * (j % kBS));
  }
}

}  // namespace probe_ss

extern "C" {
int probe_ss_params_size() { return static_cast<int>(sizeof(probe_ss::Params)); }
int probe_ss_prepare() {
  int rc = cudaFuncSetAttribute(probe_ss::ss_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, probe_ss::kSmem);
  rc |= cudaFuncSetAttribute(probe_ss::ss_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, probe_ss::kSmem);
  return rc;
}
int probe_ss_run(const probe_ss::Params* p, int nested, cudaStream_t stream) {
  probe_ss::KParams kp;
  if (const int rc = probe_ss::encode_maps(kp, p, probe_ss::kRowsPerDec)) return rc;
  const dim3 grid(static_cast<unsigned>(p->N / probe_ss::kRows * p->splits),
                  static_cast<unsigned>((p->M + probe_ss::kBM - 1) / probe_ss::kBM));
  if (nested) probe_ss::ss_kernel<true><<<grid, probe_ss::kThreads, probe_ss::kSmem, stream>>>(kp);
  else probe_ss::ss_kernel<false><<<grid, probe_ss::kThreads, probe_ss::kSmem, stream>>>(kp);
  return static_cast<int>(cudaGetLastError());
}
}
