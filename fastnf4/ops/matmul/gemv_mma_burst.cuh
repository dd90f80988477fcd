// gemv_burst, the burst decode kernel of gemv_mma.cu: build ``decode_burst``, M <= 2 (its contract and layout: the
// comment below).
// Shape contract (the host checks it, gemv_mma.py): x [M, K] and y [M, N] bf16 / fp16, contiguous, 16-byte aligned
// rows; packed [N, K / 2] 16-byte aligned; K % 256 == 0, M K <= 16384, N K < 2^31; blocksize a power of two >= 64;
// absmax float32, or uint8 codes with nested statistics in blocks of 256, the array starting and ending on 4-byte
// boundaries (gemv_mma.words_fit); no split-K.
// Layout: persistent blocks of 4 warps (3 per SM), each owning one 16-row tile over all of K at a time; dynamic shared
// memory burst::kSmem: the pair table (lane l's copy of entry v at word 64 v + l; x in its holes), the nested codes
// and the warps' row sums.
#pragma once

#include "gemv_mma_common.cuh"

namespace fastnf4_mma {

// Burst decode kernel (``decode_burst``, M <= 2; commit 457ed9c):
// small persistent blocks (4 warps, 3 per SM), each owning one 16-row tile over all of K at a time, tiles in turn. A
// warp's rounds are the slice pairs q = warp, warp + 4, ... of the tile (256 codes: the decode kernel's fragment layout
// over two 128-code slices); every load of a round (four 16-byte weight pieces, one aligned 4-byte word of a row's
// absmax codes and one nested absmax per row) goes into registers two rounds ahead of its decode (three buffers), no
// cp.async ring. The pair table (lane l's copy at word 64 v + l), the nested codes and x (in the table's holes) are set
// up once per block while the first rounds fly; a tile ends with the warps' row sums added in warp order in shared
// memory (bitwise repeatable). For a kernel without static shared memory the dynamic array starts at the window
// offset burst::kBase (sm_90: after the 1 KiB the system reserves), where a table lookup is one PRMT + one LDS
// [R + imm]; where it does not (checked per block), the same code with the base in a register.
// H200, M = 1 / 2 (interleaved with fastnf4.linear, results/h200-probe-burst-m1.json / -m2.json): faster
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

}  // namespace fastnf4_mma
