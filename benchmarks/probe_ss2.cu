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

constexpr int kThreads = 384, kRows = 256, kBM = 128, kXS = 4, kWS = 4, kBS = 3;
constexpr int kTableBytes = 65536;          // 256 entries x 256 bytes: 16 copies of the float32 pair, then ring holes
constexpr int kXStage = kBM * 128;          // 128 rows x 64 bf16
constexpr int kBTile = kRows * 128;         // 256 rows x 64 bf16
constexpr int kSmem = 1024 + kTableBytes + kXS * kXStage + kBS * kBTile + 1024 + 64;

template <bool kNested>
__global__ void __launch_bounds__(kThreads, 1) ss_kernel(const __grid_constant__ Params p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t table = base, xs0 = base + kTableBytes, bt0 = xs0 + kXS * kXStage, ncs = bt0 + kBS * kBTile;
  const uint32_t full_b = ncs + 1024, empty_b = full_b + 8 * kBS;  // mbarriers
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, tw = tid & 127;
  const long long N = p.N, K = p.K, M = p.M;
  const long long tiles = N / kRows;
  const long long tile = blockIdx.x % tiles, split = blockIdx.x / tiles;
  const long long m0 = static_cast<long long>(blockIdx.y) * kBM;
  const int s0 = static_cast<int>(split * p.per);
  const int nsteps = min(static_cast<int>(K / 64) - s0, static_cast<int>(p.per));
  if (tid < 256) build_tables<kNested, 8>(p, table, ncs, tid);  // the pair table and the nested codes
  if (tid == 0) {
    for (int s = 0; s < kBS; ++s) {
      mbar_init(full_b + 8 * s, 128);
      mbar_init(empty_b + 8 * s, 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg < 2) {
    // ---------------------------------------------------------------- wgmma warpgroups: x rows 64 wg .. 64 wg + 63
    auto load_x = [&](int j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int q = tw + 128 * r, mr = 64 * wg + (q >> 3), c = q & 7;
        const long long m = m0 + mr;
        const __nv_bfloat16* src = p.x + (m < M ? m : 0) * K + static_cast<long long>(s0 + j) * 64 + c * 8;
        cp16(xs0 + (j % kXS) * kXStage + mr * 128 + ((c ^ (mr & 7)) << 4), src, m < M ? 16 : 0);
      }
    };
    for (int j = 0; j < kXS - 1; ++j) {
      if (j < nsteps) load_x(j);
      commit();
    }
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    for (int j = 0; j < nsteps; ++j) {
      wait_copies<kXS - 2>();  // this thread's x pieces of step j
      fence_async();
      named_barrier(1 + wg, 128);  // the warpgroup's
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
      if (j > 0 && tw == 0) mbar_arrive(empty_b + 8 * ((j - 1) % kBS));
      if (j + kXS - 1 < nsteps) load_x(j + kXS - 1);  // into step j - 1's stage
      commit();
    }
    wg_wait0();
#pragma unroll
    for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(acc[i])::"memory");
    store_acc(p, acc, wg, tw, m0, tile * kRows, split);
    return;
  }
  // ------------------------------------------------------------------ decode warpgroup: rows tw and tw + 128
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  const uint32_t lane8 = (lane & 15) * 8u;
  [[maybe_unused]] const uint32_t lane4 = lane * 4u;
  auto ring = [&](int st, int n) {
    return table + ((static_cast<uint32_t>(st) * 64u + (n >> 2)) << 8) + 128u + (n & 3) * 32u;
  };
  const long long row0 = tile * kRows + tw;
  const uint8_t* wsrc0 = p.packed + row0 * (K / 2) + static_cast<long long>(s0) * 32;
  const uint8_t* wsrc1 = wsrc0 + 128 * (K / 2);
  auto load_w = [&](int j) {
    const int st = j % kWS;
    cp16(ring(st, tw), wsrc0 + 32ll * j, 16);
    cp16(ring(st, tw) + 16, wsrc0 + 32ll * j + 16, 16);
    cp16(ring(st, tw + 128), wsrc1 + 32ll * j, 16);
    cp16(ring(st, tw + 128) + 16, wsrc1 + 32ll * j + 16, 16);
  };
  const long long blk0 = row0 * (K / 64) + s0, blk1 = blk0 + 128 * (K / 64);
  uint32_t codes_c[2] = {0, 0}, codes_n[2] = {0, 0};
  float4 f_c[2], f_n[2];
  float na_c[2] = {0.f, 0.f}, na_n[2] = {0.f, 0.f};
  load_quad<kNested>(p, blk0, codes_c[0], f_c[0], na_c[0]);
  load_quad<kNested>(p, blk1, codes_c[1], f_c[1], na_c[1]);
  if (nsteps > 4) {
    load_quad<kNested>(p, blk0 + 4, codes_n[0], f_n[0], na_n[0]);
    load_quad<kNested>(p, blk1 + 4, codes_n[1], f_n[1], na_n[1]);
  }
  for (int j = 0; j < kWS - 1; ++j) {
    if (j < nsteps) load_w(j);
    commit();
  }
  for (int j = 0; j < nsteps; ++j) {
    if (j + kWS - 1 < nsteps) load_w(j + kWS - 1);  // into step j - 1's ring slots (decoded by this thread)
    commit();
    wait_copies<kWS - 1>();  // this thread's weight bytes of step j
    if ((j & 3) == 0 && j > 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        codes_c[h] = codes_n[h]; f_c[h] = f_n[h]; na_c[h] = na_n[h];
        if (j + 4 < nsteps) load_quad<kNested>(p, (h ? blk1 : blk0) + j + 4, codes_n[h], f_n[h], na_n[h]);
      }
    }
    if (j >= kBS) mbar_wait(empty_b + 8 * (j % kBS), ((j / kBS) - 1) & 1);
#if !defined(PROBE_SS_NO_DECODE)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = tw + 128 * h, i = j & 3;
      float a;
      if constexpr (kNested) {
        const uint32_t code = (codes_c[h] >> (8 * i)) & 0xffu;
        float nc;
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(nc) : "r"(ncs + 4 * code));
        a = __fadd_rn(__fmul_rn(nc, na_c[h]), offset);
      } else {
        a = i == 0 ? f_c[h].x : i == 1 ? f_c[h].y : i == 2 ? f_c[h].z : f_c[h].w;
      }
      const uint32_t rs = ring(j % kWS, n);
      const uint4 w0 = lds128(rs), w1 = lds128(rs + 16);
      const uint32_t words[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
      const uint32_t dst = bt0 + (j % kBS) * kBTile + n * 128;
#if defined(PROBE_SS_FAST)
      const uint32_t a2 = pack_bf16(a, a);
#endif
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        uint32_t o[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
#if defined(PROBE_SS_FAST)
          const uint32_t off = prmt(words[c], lane4, 0x5504u | (t << 4));
          uint32_t v;
          asm("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(table + off));
          asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(o[t]) : "r"(v), "r"(a2));
#else
          const uint32_t off = prmt(words[c], lane8, 0x5504u | (t << 4));
          const float2 v = lds64f(table + off);
          o[t] = pack_bf16(v.x * a, v.y * a);
#endif
        }
        sts128(dst + ((c ^ (n & 7)) << 4), o[0], o[1], o[2], o[3]);
      }
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
  const dim3 grid(static_cast<unsigned>(p->N / probe_ss::kRows * p->splits),
                  static_cast<unsigned>((p->M + probe_ss::kBM - 1) / probe_ss::kBM));
  if (nested) probe_ss::ss_kernel<true><<<grid, probe_ss::kThreads, probe_ss::kSmem, stream>>>(*p);
  else probe_ss::ss_kernel<false><<<grid, probe_ss::kThreads, probe_ss::kSmem, stream>>>(*p);
  return static_cast<int>(cudaGetLastError());
}
}
