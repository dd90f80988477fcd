// Does the decode work of the wgmma kernel run under its tensor-core work on Hopper? (sessions 44-45; modes 24-35 are
// described at decode16, run_loop and ss_self_loop below)
// One block of 3 warpgroups per SM, every block the same loop of `iters` iterations; what each warpgroup does per
// iteration depends on the mode (benchmarks/probe_overlap.py times each and compares with the parts alone):
//   mma   4 wgmma m64n128k16 (bf16, A from registers, B a 128 x 64 swizzled tile in shared memory), then wait
//   dec   the production decode of one K step (wgmma.cu's decode_pair: 4 LDS.128 of packed words, 16 x (PRMT, LDS.64
//         from the 256-entry pair table, 2 FMUL, F2FP)) into the 16 A registers of the next iteration
//   alu   the same arithmetic without shared memory (the pair from the byte by two ALU operations, as
//         FASTNF4_WG_NO_LUT), so lookups and tensor-core operand reads do not share the shared-memory pipe
// Modes: 0 mma, 1 dec, 2 mma + dec in every warpgroup (the production step: wgmma issued, next decode, wait),
// 3 alu, 4 mma + alu, 5 warpgroup 0 mma x 3 (12 wgmma per wait), warpgroups 1-2 dec, 6 the same with alu,
// 7 warpgroup 0 mma x 3 alone, 8 warpgroups 1-2 dec alone, 9 warpgroups 1-2 alu alone, 10 mma + dec with the
// warpgroups taking turns at the tensor cores (kTurns), 11 mma alone taking turns. All results are thrown away
// (timing only; keep16 stops ptxas from deleting them); each block ORs its registers into sink.
#include "../fastnf4/ops/matmul/wgmma.cu"

namespace probe_overlap {
using namespace fastnf4_wg;
constexpr int kTable = 256 * 256, kX = 128 * 128, kW = 4096;
constexpr int kSmem = 1024 + kTable + kX + kW;

// table (as the production kernel's: entry v = 16 copies of the float pair), x tile and packed words: arbitrary
// nonzero values
__device__ __forceinline__ void fill(uint32_t table_s, uint32_t x_s, int tid) {
  for (int e = tid; e < 256; e += 384) {
    const float hi = 0.25f * ((e >> 4) - 7.5f), lo = 0.25f * ((e & 15) - 7.5f);
    for (int i = 0; i < 8; ++i)
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %1, %2};\n" ::"r"(table_s + 256 * e + 16 * i), "f"(hi), "f"(lo));
  }
  for (int i = tid; i < (kX + kW) / 4; i += 384)
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(x_s + 4 * i), "r"(0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu)));
}

// keeps 16 decoded registers alive for ptxas: an empty asm that "uses" them emits nothing, and ptxas then drops the
// loads and arithmetic whose results nothing reads (session 45: the decode-only and alu-only loops of session 44 kept
// one of their two decodes per loop, and the ring modes without stores kept 2 of 16 pairs). A store in a branch on a
// launch argument that is 0 at run time costs one compare and branch per call.
__device__ __forceinline__ void keep16(const uint32_t (&g)[16], int never, uint32_t at) {
  if (never) {
#pragma unroll
    for (int r = 0; r < 16; ++r) asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at + 4 * r), "r"(g[r]) : "memory");
  }
}

// iteration it's 16 fragments of this lane. kKind 0 = dec, the production decode (wgmma.cu's decode_pair); 1 = alu,
// the pair from the byte by ALU operations; and for modes 24-32 (session 45): 2 = dec16 (4-byte entries: one LDS.32
// of an fp16 pair per byte from 32 lane copies, two conversions to float32: half the table's wavefronts, two more
// instructions per pair), 3 = dec with every lane's lookup at one address (zero = 0: a broadcast, one wavefront per
// LDS.64 instead of two, one more instruction; wrong values). zero is ~0 for the other kinds.
template <int kKind>
__device__ __forceinline__ void decode16(int it, uint32_t table_s, uint32_t w_s, int tid, uint32_t zero,
                                         uint32_t (&g)[16]) {
  const int lane = tid & 31, t = lane & 3;
  const uint32_t lane_off = kKind == 2 ? 4u * lane : 8u * (lane & 15), sel = 0x5504u | (static_cast<uint32_t>(t) << 4);
  const float sa = 1.0f + tid * 1e-3f, sb = 1.5f;
  const uint32_t off = static_cast<uint32_t>((it & 63) * 64) + 32 * (lane >> 4);  // < 4096 - 32
  const uint32_t wa_s = w_s + off, wb_s = w_s + (off ^ 2048u);
  const uint4 a0 = lds128(wa_s), a1 = lds128(wa_s + 16), b0 = lds128(wb_s), b1 = lds128(wb_s + 16);
  const uint32_t wa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const uint32_t wb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
  auto pair = [&](uint32_t w, float a) -> uint32_t {
    if constexpr (kKind <= 1) {
      return decode_pair<__nv_bfloat16>(table_s, lane_off, sel, w, a);
    } else {
      const uint32_t addr = table_s + (__byte_perm(w, lane_off, sel) & zero);
      float hi, lo;
      if constexpr (kKind == 2) {
        uint32_t h2;
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(h2) : "r"(addr));
        hi = __half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xffffu)));
        lo = __half2float(__ushort_as_half(static_cast<unsigned short>(h2 >> 16)));
      } else {
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(hi), "=f"(lo) : "r"(addr));
      }
      return Pair<__nv_bfloat16>::make(__fmul_rn(hi, a), __fmul_rn(lo, a));
    }
  };
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    if constexpr (kKind == 1) {  // (both bytes first: the order of session 44's SASS)
      const uint32_t ba = __byte_perm(wa[s], lane_off, sel), bb = __byte_perm(wb[s], lane_off, sel);
      g[2 * s] = Pair<__nv_bfloat16>::make(__uint_as_float(0x3c000000u | (ba << 4)) * sa,
                                           __uint_as_float(0x3c000000u | (ba << 12)) * sa);
      g[2 * s + 1] = Pair<__nv_bfloat16>::make(__uint_as_float(0x3c000000u | (bb << 4)) * sb,
                                               __uint_as_float(0x3c000000u | (bb << 12)) * sb);
    } else {
      g[2 * s] = pair(wa[s], sa);
      g[2 * s + 1] = pair(wb[s], sb);
    }
  }
}

// Modes 24-32 (session 45) pass kKind to run_loop: the decode then sits in a branch on a run-time true flag after the
// 4 wgmma are issued (in modes 2 and 4 ptxas moved it between the first and the second; the production kernel's
// copies and branches keep it after them too), to tell shared-memory traffic from instruction count. Modes 30-32:
// modes 24 / 24 / 25 with the warpgroups started out of phase (warpgroup w first decodes w x 1 / 2 / 1 times):
// whether the lockstep of modes 2 / 24 is only where they start (a fair-sharing tensor pipe keeps a phase offset).
// one warpgroup's loop: kMma (kReps groups of 4 wgmma per wait), kDec / kAlu (the next iteration's fragments)
// kTurns: the warpgroups take turns at the tensor cores (named barrier 1 + w: warpgroup w's turn; it waits for it,
// issues, waits for its wgmma and hands the turn on, then decodes), so that their wgmma are not interleaved
// kKind >= 0 (modes 24-32): the decode variant kKind in a branch on a run-time true flag after the wgmma are issued,
// warpgroup w starting after w x kStagger decodes
template <bool kMma, bool kDec, bool kAlu, int kReps, bool kTurns = false, int kKind = -1, int kStagger = 0>
__device__ __forceinline__ uint32_t run_loop(int iters, uint32_t table_s, uint32_t x_s, uint32_t w_s, int tid,
                                            int never) {
  const int wg = tid >> 7;
  const uint64_t desc0 = desc_sw128(x_s);
  // run-time values the compilers cannot see (iters > 0): go = 1 (the branch that keeps the decode after the wgmma),
  // zero = 0 for the broadcast lookups, ~0 otherwise
  uint32_t go = 1, zero = ~0u;
  if constexpr (kKind >= 0) {
    asm volatile("mov.u32 %0, %1;\n" : "=r"(go) : "r"(iters > 0 ? 1u : 0u));
    asm volatile("mov.u32 %0, %1;\n" : "=r"(zero) : "r"(kKind == 3 ? static_cast<uint32_t>(iters >> 31) : ~0u));
  }
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  uint32_t fa[16], fb[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) fa[i] = fb[i] = 0x3c003c00u + i + tid;
  auto work = [&](int it, uint32_t (&cur)[16], uint32_t (&nxt)[16]) {
    if constexpr (kTurns) {
      if (it > 0 || wg > 0) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
    }
    if constexpr (kMma) {
      fence_acc(acc);
      wgmma_fence();
#pragma unroll
      for (int r = 0; r < kReps; ++r) {
#pragma unroll
        for (int s = 0; s < 4; ++s)
          Wgmma<__nv_bfloat16, 128>::run(acc, cur[4 * s], cur[4 * s + 1], cur[4 * s + 2], cur[4 * s + 3],
                                         desc0 + static_cast<uint32_t>((32 * s) >> 4));
      }
      wgmma_commit();
    }
    if constexpr (kTurns) {
      wgmma_wait<0>();
      fence_acc(acc);
      asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (wg + 1) % 3) : "memory");
    }
    if constexpr (kKind >= 0) {
      if (go) decode16<kKind>(it, table_s, w_s, tid, zero, nxt);
    } else if constexpr (kDec || kAlu) {
      decode16<kAlu ? 1 : 0>(it, table_s, w_s, tid, ~0u, nxt);
    }
    if constexpr (kMma) {
      wgmma_wait<0>();
      fence_acc(acc);
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) asm volatile("" ::"r"(cur[r]), "r"(nxt[r]) : "memory");
    keep16(nxt, never, w_s);
  };
  if constexpr (kStagger > 0) {  // warpgroup w first decodes w x kStagger times: the warpgroups start out of phase
    const int wgu = __shfl_sync(0xffffffffu, wg, 0);
    for (int j = 0; j < wgu * kStagger; ++j) {
      decode16<kKind>(j, table_s, w_s, tid, zero, fb);
      keep16(fb, never, w_s);
    }
  }
  for (int it = 0; it < iters; it += 2) {
    work(it, fa, fb);
    work(it + 1, fb, fa);
  }
  if constexpr (kTurns) {
    if (wg == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the last hand-over
  }
  uint32_t v = 0;
#pragma unroll
  for (int i = 0; i < 64; ++i) v ^= __float_as_uint(acc[i]);
#pragma unroll
  for (int i = 0; i < 16; ++i) v ^= fa[i];
  return v;
}

// m64n128k16 with A and B from shared memory (descriptors): the SS form (modes 21-23, 33-35)
__device__ __forceinline__ void wgmma_ss128(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// Modes 33-35 (session 45): the SS form inside each warpgroup, with no hand-over between warpgroups. Each warpgroup
// issues 4 SS wgmma m64n128k16 with A its own 64 x 64 tile in one of its two 8 KiB slots, then decodes the next
// iteration's fragments (33: dec, 34: alu), stores them to the other slot (4 x 16-byte stores per thread; the layout
// is not the swizzled one, timing only), makes them visible to the tensor cores (fence.proxy.async) and, after its
// wait, meets its 127 partners at its named barrier. 35: the 4 SS wgmma alone in every warpgroup.
constexpr int kSelfSlot = 8192;
template <int kKind>  // kKind < 0: no decode, no stores
__device__ __forceinline__ uint32_t ss_self_loop(int iters, uint32_t table_s, uint32_t x_s, uint32_t w_s, uint32_t a_s,
                                                 int tid, int wg, int never) {
  const uint64_t desc0 = desc_sw128(x_s);
  const int l = tid & 127;
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  uint32_t g[16];
  for (int it = 0; it < iters; ++it) {
    const uint32_t cur = a_s + (2 * wg + (it & 1)) * kSelfSlot, nxt = a_s + (2 * wg + ((it + 1) & 1)) * kSelfSlot;
    fence_acc(acc);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)
      wgmma_ss128(acc, desc_sw128(cur) + static_cast<uint32_t>((32 * s) >> 4), desc0 + static_cast<uint32_t>((32 * s) >> 4));
    wgmma_commit();
    if constexpr (kKind >= 0) {
      decode16<kKind>(it, table_s, w_s, tid, ~0u, g);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(nxt + 16 * (l + 128 * q)), "r"(g[4 * q]),
                     "r"(g[4 * q + 1]), "r"(g[4 * q + 2]), "r"(g[4 * q + 3]) : "memory");
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    wgmma_wait<0>();
    fence_acc(acc);
    if constexpr (kKind >= 0) asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
  }
  uint32_t v = 0;
#pragma unroll
  for (int i = 0; i < 64; ++i) v ^= __float_as_uint(acc[i]);
  return v;
}

template <int kMode>
__global__ void __launch_bounds__(384, 1) overlap(int iters, uint32_t* sink, int never) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t table_s = (smem_addr(smem_raw) + 1023u) & ~1023u, x_s = table_s + kTable, w_s = x_s + kX;
  // (the warpgroup index through a shuffle: warp-uniform to the compiler, so that its branches are not divergent paths
  // for the wgmma, as CUTLASS's canonical_warp_group_idx)
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  fill(table_s, x_s, tid);
  __syncthreads();
  uint32_t v = 0;
  if constexpr (kMode >= 33) {
    v = ss_self_loop<kMode == 33 ? 0 : kMode == 34 ? 1 : -1>(iters, table_s, x_s, w_s, w_s + kW, tid, wg, never);
  } else if constexpr (kMode >= 30) {  // 30 / 31: mode 24 with the warpgroups started 1 / 2 decodes apart; 32: mode 25, 1 apart
    v = run_loop<true, false, false, 1, false, kMode == 32 ? 1 : 0, kMode == 31 ? 2 : 1>(iters, table_s, x_s, w_s,
                                                                                      tid, never);
  } else if constexpr (kMode >= 24) {  // 24 mma + dec, 25 mma + alu, 26 dec16, 27 mma + dec16, 28 mma + dec bcast, 29 dec bcast
    constexpr int kKind = kMode == 24 ? 0 : kMode == 25 ? 1 : kMode <= 27 ? 2 : 3;
    v = run_loop<kMode != 26 && kMode != 29, false, false, 1, false, kKind>(iters, table_s, x_s, w_s, tid, never);
  } else if constexpr (kMode == 10) {
    v = run_loop<true, true, false, 1, true>(iters, table_s, x_s, w_s, tid, never);
  } else if constexpr (kMode == 11) {
    v = run_loop<true, false, false, 1, true>(iters, table_s, x_s, w_s, tid, never);
  } else if constexpr (kMode <= 4) {  // every warpgroup the same
    v = run_loop<kMode == 0 || kMode == 2 || kMode == 4, kMode == 1 || kMode == 2, kMode == 3 || kMode == 4, 1>(
        iters, table_s, x_s, w_s, tid, never);
  } else if (wg == 0) {
    if constexpr (kMode <= 7) v = run_loop<true, false, false, 3>(iters, table_s, x_s, w_s, tid, never);
  } else {
    if constexpr (kMode == 5 || kMode == 8) v = run_loop<false, true, false, 1>(iters, table_s, x_s, w_s, tid, never);
    if constexpr (kMode == 6 || kMode == 9) v = run_loop<false, false, true, 1>(iters, table_s, x_s, w_s, tid, never);
  }
  atomicOr(sink + (blockIdx.x & 1023), v);
}


// Modes 12-15: the split form with the hand-over a real kernel needs. Warpgroups 1-2 decode (mode 15: alu) the next
// iteration's fragments of "their" 64 rows and store them to a ring of kDepth slots in shared memory (slot: producer
// k, register quad q, thread l at 16 (l + 128 (q + 4 k)) bytes: conflict-free 16-byte stores and loads), then
// arrive on the slot's full barrier (256 arrivals); warpgroup 0 waits for it, loads its 32 fragment registers with
// 8 LDS.128, arrives on the slot's empty barrier (128 arrivals) and issues 12 wgmma (row group 1's fragments, row
// group 2's, row group 1's again: the tensor work of "wg0 mma x3") with one wait. 12 / 13: ring of 2 / 4, decode;
// 14: ring of 4, decode, the MMA warpgroup loads the fragments one iteration ahead (double registers); 15: ring of
// 4, alu; 16 / 17: 13 / 14 with one polling lane per decode warp (the others wait at __syncwarp).
// Modes 18-23 (written in session 44, run in session 45): mode 13 with parts taken out (kParts bits: kNoSync no barriers,
// kNoStore no decoder stores, kNoLoad constant fragments in the MMA warpgroup, kSS the MMA reads A from the ring by
// descriptor (SS wgmma; the slot released after the wait), kNoDec the decode warpgroups idle): 18 loads only
// (no barriers, no stores), 19 barriers only, 20 stores only, 21 SS with the full hand-over, 22 SS with independent
// decoders (no barriers, no stores), 23 SS alone.
constexpr int kSlot = 2 * 4 * 128 * 16;  // 16 KiB
constexpr int kNoSync = 1, kNoStore = 2, kNoLoad = 4, kSS = 8, kNoDec = 16;
template <int kDepth, bool kAlu, bool kAhead, bool kLeader = false, int kParts = 0>
__device__ __forceinline__ uint32_t ring_loop(int iters, uint32_t table_s, uint32_t x_s, uint32_t w_s, uint32_t ring_s,
                                              uint32_t bars, int tid, int wg, int never) {
  const uint32_t full = bars, empty = bars + 8 * kDepth;
  const int l = tid & 127;
  if (wg == 0) {  // the MMA warpgroup
    const uint64_t desc0 = desc_sw128(x_s);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    uint32_t f[2][32];
#pragma unroll
    for (int i = 0; i < 32; ++i) f[0][i] = f[1][i] = 0x3c003c00u + i + tid;
    constexpr bool kSync = !(kParts & kNoSync), kRegs = !(kParts & kSS);
    auto load = [&](int it, uint32_t (&g)[32]) {
      const int slot = it % kDepth;
      if constexpr (kSync) mbar_wait(full + 8 * slot, (it / kDepth) & 1);
      if constexpr (kRegs && !(kParts & kNoLoad)) {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const uint4 v = lds128(ring_s + slot * kSlot + 16 * (l + 128 * q));
          g[4 * q] = v.x, g[4 * q + 1] = v.y, g[4 * q + 2] = v.z, g[4 * q + 3] = v.w;
        }
      }
      if constexpr (kSync && kRegs) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(empty + 8 * slot) : "memory");
    };
    auto mma = [&](int it, uint32_t (&g)[32]) {
      fence_acc(acc);
      wgmma_fence();
#pragma unroll
      for (int r = 0; r < 3; ++r) {
        const int b = r == 1 ? 16 : 0;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const uint64_t db = desc0 + static_cast<uint32_t>((32 * s) >> 4);
          if constexpr (kRegs) {
            Wgmma<__nv_bfloat16, 128>::run(acc, g[b + 4 * s], g[b + 4 * s + 1], g[b + 4 * s + 2], g[b + 4 * s + 3], db);
          } else {  // A: row group (r == 1) of the slot, a 64-row x 128-byte swizzled tile as x's
            const uint32_t a_s = ring_s + (it % kDepth) * kSlot + (r == 1 ? kSlot / 2 : 0);
            wgmma_ss128(acc, desc_sw128(a_s) + static_cast<uint32_t>((32 * s) >> 4), db);
          }
        }
      }
      wgmma_commit();
    };
    if constexpr (kAhead) {
      load(0, f[0]);
      for (int it = 0; it < iters; it += 2) {
        mma(it, f[0]);
        if (it + 1 < iters) load(it + 1, f[1]);
        wgmma_wait<0>();
        fence_acc(acc);
        mma(it + 1, f[1]);
        if (it + 2 < iters) load(it + 2, f[0]);
        wgmma_wait<0>();
        fence_acc(acc);
      }
    } else {
      for (int it = 0; it < iters; ++it) {
        load(it, f[0]);
        mma(it, f[0]);
        wgmma_wait<0>();
        fence_acc(acc);
        // SS: the tensor cores read the slot until the wait
        if constexpr (kSync && !kRegs) {
          asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(empty + 8 * (it % kDepth)) : "memory");
        }
      }
    }
    uint32_t v = 0;
#pragma unroll
    for (int i = 0; i < 64; ++i) v ^= __float_as_uint(acc[i]);
    return v;
  }
  // a decode warpgroup (k = wg - 1)
  if constexpr ((kParts & kNoDec) != 0) return 0;
  const int k = wg - 1, lane = tid & 31;
  uint32_t v = 0;
  for (int it = 0; it < iters; ++it) {
    const int slot = it % kDepth;
    uint32_t g[16];
    decode16<kAlu ? 1 : 0>(it, table_s, w_s, tid, ~0u, g);
    if ((kParts & kNoSync) == 0 && it >= kDepth) {
      if constexpr (kLeader) {  // one lane per warp polls the barrier, the others wait at the warp barrier
        if (lane == 0) mbar_wait(empty + 8 * slot, ((it / kDepth) - 1) & 1);
        __syncwarp();
      } else {
        mbar_wait(empty + 8 * slot, ((it / kDepth) - 1) & 1);
      }
    }
    if constexpr ((kParts & kNoStore) == 0) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(ring_s + slot * kSlot + 16 * (l + 128 * (q + 4 * k))),
                     "r"(g[4 * q]), "r"(g[4 * q + 1]), "r"(g[4 * q + 2]), "r"(g[4 * q + 3]) : "memory");
    }
    if constexpr ((kParts & kNoSync) == 0) {
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(full + 8 * slot) : "memory");
    }
    keep16(g, never, w_s);
  }
  return v;
}

template <int kDepth, bool kAlu, bool kAhead, bool kLeader, int kParts>
__global__ void __launch_bounds__(384, 1) ring_overlap(int iters, uint32_t* sink, int never) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t table_s = (smem_addr(smem_raw) + 1023u) & ~1023u, x_s = table_s + kTable, w_s = x_s + kX;
  const uint32_t ring_s = w_s + kW, bars = ring_s + kDepth * kSlot;
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  fill(table_s, x_s, tid);
  if (tid == 0) {
    for (int i = 0; i < kDepth; ++i) {
      mbar_init(bars + 8 * i, 256);
      mbar_init(bars + 8 * (kDepth + i), 128);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const uint32_t v = ring_loop<kDepth, kAlu, kAhead, kLeader, kParts>(iters, table_s, x_s, w_s, ring_s, bars, tid, wg,
                                                                            never);
  atomicOr(sink + (blockIdx.x & 1023), v);
}
}  // namespace probe_overlap

template <int kMode>
int launch(int iters, int blocks, void* sink, void* stream) {
  constexpr int smem = probe_overlap::kSmem + (kMode >= 33 ? 6 * probe_overlap::kSelfSlot : 0);
  static bool ready = false;
  if (!ready) {
    if (cudaFuncSetAttribute(probe_overlap::overlap<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
        cudaSuccess)
      return -1;
    ready = true;
  }
  probe_overlap::overlap<kMode><<<blocks, 384, smem, static_cast<cudaStream_t>(stream)>>>(
      iters, static_cast<uint32_t*>(sink), 0);
  return static_cast<int>(cudaGetLastError());
}

template <int kDepth, bool kAlu, bool kAhead, bool kLeader = false, int kParts = 0>
int launch_ring(int iters, int blocks, void* sink, void* stream) {
  constexpr int smem = probe_overlap::kSmem + kDepth * probe_overlap::kSlot + 16 * kDepth;
  static bool ready = false;
  if (!ready) {
    if (cudaFuncSetAttribute(probe_overlap::ring_overlap<kDepth, kAlu, kAhead, kLeader, kParts>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
      return -1;
    ready = true;
  }
  probe_overlap::ring_overlap<kDepth, kAlu, kAhead, kLeader, kParts><<<blocks, 384, smem, static_cast<cudaStream_t>(stream)>>>(
      iters, static_cast<uint32_t*>(sink), 0);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int probe_overlap_run(int mode, int iters, int blocks, void* sink, void* stream) {
  switch (mode) {
    case 0: return launch<0>(iters, blocks, sink, stream);
    case 1: return launch<1>(iters, blocks, sink, stream);
    case 2: return launch<2>(iters, blocks, sink, stream);
    case 3: return launch<3>(iters, blocks, sink, stream);
    case 4: return launch<4>(iters, blocks, sink, stream);
    case 5: return launch<5>(iters, blocks, sink, stream);
    case 6: return launch<6>(iters, blocks, sink, stream);
    case 7: return launch<7>(iters, blocks, sink, stream);
    case 8: return launch<8>(iters, blocks, sink, stream);
    case 9: return launch<9>(iters, blocks, sink, stream);
    case 10: return launch<10>(iters, blocks, sink, stream);
    case 11: return launch<11>(iters, blocks, sink, stream);
    case 12: return launch_ring<2, false, false>(iters, blocks, sink, stream);
    case 13: return launch_ring<4, false, false>(iters, blocks, sink, stream);
    case 14: return launch_ring<4, false, true>(iters, blocks, sink, stream);
    case 15: return launch_ring<4, true, false>(iters, blocks, sink, stream);
    case 16: return launch_ring<4, false, false, true>(iters, blocks, sink, stream);
    case 17: return launch_ring<4, false, true, true>(iters, blocks, sink, stream);
    case 18: return launch_ring<4, false, false, false, probe_overlap::kNoSync | probe_overlap::kNoStore>(iters, blocks, sink, stream);
    case 19: return launch_ring<4, false, false, false, probe_overlap::kNoStore | probe_overlap::kNoLoad>(iters, blocks, sink, stream);
    case 20: return launch_ring<4, false, false, false, probe_overlap::kNoSync | probe_overlap::kNoLoad>(iters, blocks, sink, stream);
    case 21: return launch_ring<4, false, false, false, probe_overlap::kSS>(iters, blocks, sink, stream);
    case 22: return launch_ring<4, false, false, false, probe_overlap::kSS | probe_overlap::kNoSync | probe_overlap::kNoStore>(
        iters, blocks, sink, stream);
    case 23: return launch_ring<4, false, false, false,
                                probe_overlap::kSS | probe_overlap::kNoSync | probe_overlap::kNoStore | probe_overlap::kNoDec>(
        iters, blocks, sink, stream);
    case 24: return launch<24>(iters, blocks, sink, stream);
    case 25: return launch<25>(iters, blocks, sink, stream);
    case 26: return launch<26>(iters, blocks, sink, stream);
    case 27: return launch<27>(iters, blocks, sink, stream);
    case 28: return launch<28>(iters, blocks, sink, stream);
    case 29: return launch<29>(iters, blocks, sink, stream);
    case 30: return launch<30>(iters, blocks, sink, stream);
    case 31: return launch<31>(iters, blocks, sink, stream);
    case 32: return launch<32>(iters, blocks, sink, stream);
    case 33: return launch<33>(iters, blocks, sink, stream);
    case 34: return launch<34>(iters, blocks, sink, stream);
    case 35: return launch<35>(iters, blocks, sink, stream);
  }
  return -2;
}
