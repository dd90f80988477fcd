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
#include "probe_ss_common.cuh"

namespace probe_ss {

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
    store_acc(p, acc, wg, tw, m0, tile * kRows, split);
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
      reglut_row(words[u], a[u], cv, dst, n);
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
  probe_ss::KParams kp;
  if (const int rc = probe_ss::encode_maps(kp, p, probe_ss::kRows)) return rc;
  const dim3 grid(static_cast<unsigned>(p->N / probe_ss::kRows * p->splits),
                  static_cast<unsigned>((p->M + probe_ss::kBM - 1) / probe_ss::kBM));
  if (nested) probe_ss::ss_kernel<true><<<grid, probe_ss::kThreads, probe_ss::kSmem, stream>>>(kp);
  else probe_ss::ss_kernel<false><<<grid, probe_ss::kThreads, probe_ss::kSmem, stream>>>(kp);
  return static_cast<int>(cudaGetLastError());
}
}
