// Probe (not a package kernel): NF4 x bf16 GEMM for M around 128 with the roles of session 8's wgmma kernel swapped.
// x is the wgmma A operand (two warpgroups x 64 rows = a 128-row x tile, from shared memory, 128-byte swizzle) and
// the weights are the B operand: every K step (64 codes) all 256 threads decode the block's 256 weight rows into a
// bf16 tile in shared memory (thread n: row n, the exact dequantized value: float32 code x float32 absmax, one
// rounding), and both warpgroups run m64n256k16 wgmma on it (SS form). So each weight is decoded once per 128 x rows
// and 256 weight rows share every x tile (session 8's kernel: 128 weight rows per x tile, weights in registers).
// The decode of step j + 1 overlaps the wgmma of step j; one block barrier per step.
// Diagnostics (wrong results): PROBE_SS_NO_DECODE, PROBE_SS_NO_MMA, PROBE_SS_NO_LOADS.
// Limits (probe): bf16, blocksize 64, K % 256 == 0, N % 256 == 0; nested (8-bit absmax) or float32 absmax.
// benchmarks/probe_ss.py drives it.
#include "probe_ss_common.cuh"

namespace probe_ss {

constexpr int kThreads = 256, kRows = 256, kBM = 128, kD = 3, kXS = 4, kWS = 4;
constexpr int kTableBytes = 65536;          // 256 entries x 256 bytes: 16 copies of the float32 pair, then ring holes
constexpr int kXStage = kBM * 128;          // 128 rows x 64 bf16
constexpr int kBTile = kRows * 128;         // 256 rows x 64 bf16
constexpr int kSmem = 1024 + kTableBytes + kXS * kXStage + 2 * kBTile + 1024;

template <bool kNested>
__global__ void __launch_bounds__(kThreads, 1) ss_kernel(const __grid_constant__ Params p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t table = base, xs0 = base + kTableBytes, bt0 = xs0 + kXS * kXStage, ncs = bt0 + 2 * kBTile;
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
  const long long N = p.N, K = p.K, M = p.M;
  const long long tiles = N / kRows;
  const long long tile = blockIdx.x % tiles, split = blockIdx.x / tiles;
  const long long m0 = static_cast<long long>(blockIdx.y) * kBM;
  const int nsteps_all = static_cast<int>(K / 64);
  const int s0 = static_cast<int>(split * p.per);
  const int nsteps = min(nsteps_all - s0, static_cast<int>(p.per));
  build_tables<kNested, 8>(p, table, ncs, tid);  // the pair table (256-byte entries) and the nested codes
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  // this thread's weight row and its copies: 2 x 16 bytes per step into its ring slot
  const int n = tid;
  const long long row = tile * kRows + n;
  const uint8_t* wsrc = p.packed + row * (K / 2) + static_cast<long long>(s0) * 32;
  auto ring = [&](int st) { return table + ((static_cast<uint32_t>(st) * 64u + (n >> 2)) << 8) + 128u + (n & 3) * 32u; };
  // x rows of this warpgroup: 4 of its 512 16-byte pieces per thread and step
  const int tw = tid & 127;
  auto load = [&](int j) {  // step j of this split (j < nsteps)
#if defined(PROBE_SS_NO_LOADS)  // diagnostic (wrong results): no copies at all
    if (j >= 0) return;
#endif
    const int xst = j % kXS, wst = j % kWS;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int q = tw + 128 * r, mr = 64 * wg + (q >> 3), c = q & 7;
      const long long m = m0 + mr;
      const __nv_bfloat16* src = p.x + (m < M ? m : 0) * K + static_cast<long long>(s0 + j) * 64 + c * 8;
      cp16(xs0 + xst * kXStage + mr * 128 + ((c ^ (mr & 7)) << 4), src, m < M ? 16 : 0);
    }
    cp16(ring(wst), wsrc + 32ll * j, 16);
    cp16(ring(wst) + 16, wsrc + 32ll * j + 16, 16);
  };
  // absmax: the quad of steps q (cur) and q + 1 (next)
  const long long blk0 = row * (K / 64) + s0;
  uint32_t codes_c = 0, codes_n = 0;
  float4 f_c = make_float4(0, 0, 0, 0), f_n = f_c;
  float na_c = 0.f, na_n = 0.f;
  load_quad<kNested>(p, blk0, codes_c, f_c, na_c);
  if (nsteps > 4) load_quad<kNested>(p, blk0 + 4, codes_n, f_n, na_n);
  for (int j = 0; j < kD; ++j) {
    if (j < nsteps) load(j);
    commit();
  }
  __syncthreads();  // the table (and nested codes)
  const uint32_t lane8 = (lane & 15) * 8u;
  [[maybe_unused]] const uint32_t lane4 = lane * 4u;
  auto scale = [&](int j) -> float {
    const int i = j & 3;
    if constexpr (kNested) {
      const uint32_t code = (codes_c >> (8 * i)) & 0xffu;
      float nc;
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(nc) : "r"(ncs + 4 * code));
      return __fadd_rn(__fmul_rn(nc, na_c), offset);
    } else {
      return i == 0 ? f_c.x : i == 1 ? f_c.y : i == 2 ? f_c.z : f_c.w;
    }
  };
  auto decode = [&](int j) {  // step j into B tile j % 2 (this thread's row)
#if defined(PROBE_SS_NO_DECODE)  // diagnostic (wrong results): the tile is left as it is
    if (j >= 0) return;
#endif
    if ((j & 3) == 0 && j > 0) {
      codes_c = codes_n; f_c = f_n; na_c = na_n;
      if (j + 4 < nsteps) load_quad<kNested>(p, blk0 + j + 4, codes_n, f_n, na_n);
    }
    const float a = scale(j);
    const uint32_t rs = ring(j % kWS);
    const uint4 w0 = lds128(rs), w1 = lds128(rs + 16);
    const uint32_t words[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    const uint32_t dst = bt0 + (j & 1) * kBTile + n * 128;
#if defined(PROBE_SS_FAST)
    const uint32_t a2 = pack_bf16(a, a);
#endif
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      uint32_t o[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
#if defined(PROBE_SS_FAST)  // bf16 pair x bf16 absmax (two roundings more than the exact decode)
        const uint32_t off = prmt(words[c], lane4, 0x5504u | (t << 4));  // (byte t << 8) | 4 lane
        uint32_t v;
        asm("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(table + off));
        asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(o[t]) : "r"(v), "r"(a2));
#else
        const uint32_t off = prmt(words[c], lane8, 0x5504u | (t << 4));  // (byte t << 8) | 8 (lane & 15)
        const float2 v = lds64f(table + off);
        o[t] = pack_bf16(v.x * a, v.y * a);
#endif
      }
      sts128(dst + ((c ^ (n & 7)) << 4), o[0], o[1], o[2], o[3]);
    }
  };
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  if (nsteps > 0) {
    wait_copies<kD - 1>();
    decode(0);
  }
  for (int j = 0; j < nsteps; ++j) {
    wait_copies<kD - 1>();  // this thread's copies of step j (x) are done
    fence_async();          // its decoded tile and x pieces, visible to the tensor cores
    __syncthreads();        // everyone's; and every wgmma of step j - 1 has finished (waited below)
    if (j + kD < nsteps) load(j + kD);
    commit();
    wg_fence();
    [[maybe_unused]] const uint32_t xa = xs0 + (j % kXS) * kXStage + wg * 64 * 128, bb = bt0 + (j & 1) * kBTile;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#if !defined(PROBE_SS_NO_MMA)  // diagnostic (wrong results): no tensor-core work
      mma(acc, desc(xa + 32 * kk), desc(bb + 32 * kk));
#endif
    }
    wg_commit();
    if (j + 1 < nsteps) {
      wait_copies<kD - 1>();  // this thread's weight bytes of step j + 1
      decode(j + 1);
    }
    wg_wait0();
#pragma unroll
    for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  }
  // accumulator (i): row 16 warp + lane / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (lane % 4) + i % 2
  const int w4 = (tid & 127) >> 5;
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
