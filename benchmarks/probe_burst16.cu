// A "burst" GEMM for M = 3..32 (probe; NOTES.md session 29): the burst decode kernel's structure (persistent blocks,
// every load of a warp's round into registers two rounds ahead, the pair table built per block while the first rounds
// fly) with B columns = x rows, 8 per n-tile (NT n-tiles), instead of the M <= 2 (x row, chunk) columns. The question:
// is Gemma o at M = 16 / 32 (N 5376, K 4096: 0.98 / 0.88x cuBLAS with the wgmma kernel, whose fixed cost per call is
// ~7.6 us) faster this way?
//
// Layout: warp w takes the slice pairs q = w, w + W, ... (256 codes of a row, four 64-code groups) of its block's
// tiles (16 rows; tiles b, b + G, ... round robin). Lane (g, t) holds 8 bytes of each group (bytes 8t..8t+7: codes
// 16t..16t+15 of the group) of rows g and g + 8; mma step i of group b takes bytes 2i (k 2t, 2t + 1) and 2i + 1
// (k 2t + 8, 2t + 9) of every lane, so each mma's k16 lies in one 64-code group, i.e. one quantization block where the
// blocksize is >= 64: the product of a group is scaled by the rows' absmax after its four mma (as the decode kernel).
// B: lane (g, t) carries x row 8 n + g, values 16t..16t+15 of the group (two 16-byte shared loads per group and
// n-tile) from x staged whole in shared memory (8 NT rows, zeros past M; rows 2K + 16 bytes apart). M > 8 NT: x
// staged and the tiles run again per 8 NT rows (the weights then come from L2 where they fit). A tile ends with the
// warps' sums added in warp order in shared memory (bitwise repeatable).
// Shared memory: table 64 KiB (lane copies, holes unused), nested codes 1 KiB, row sums 2 x W KiB, x 8 NT (2 K + 16)
// bytes: one block per SM. Needs: K % 256 == 0, blocksize >= 64, N K < 2^31, absmax 4-byte aligned, the x rows fit.
#include "../fastnf4/ops/matmul/gemv_mma.cu"

namespace fastnf4_b16 {
using namespace fastnf4_mma;

constexpr int kTable = 65536, kNestedBytes = 1024;

template <bool kImm>
__device__ __forceinline__ uint32_t lookup16(uint32_t lane4, uint32_t w, int j, uint32_t tab) {
  const uint32_t off = __byte_perm(w, lane4, 0x5504u | (j << 4));
  uint32_t v;
  if constexpr (kImm) {
    asm("ld.shared.u32 %0, [%1+1024];\n" : "=r"(v) : "r"(off));
  } else {
    asm("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(tab + off));
  }
  return v;
}

template <bool kNested> struct Round {
  uint2 wa[4], wb[4];  // rows g / g + 8: the lane's 8 bytes of each 64-code group of the pair
  uint32_t ca, cb;     // nested: the aligned word of absmax codes of rows g / g + 8
  float na, nb;        // nested: the pair's nested absmax of rows g / g + 8
  float fa[4], fb[4];  // not nested: the float32 absmax of each group
  int ea, eb, q;       // element offsets of the rows (0 past N), the pair (>= pairs: an empty round)
};

__host__ __device__ constexpr int row_sum_bytes(int W) { return 2 * W * 1024; }

// kAhead: rounds loaded ahead of the decode (2: three register buffers, 1: two); kAsyncX: x staged by cp.async (all
// of a thread's pieces in flight at once) instead of through registers eight at a time
template <typename T, bool kNested, int W, int NT, bool kImm, int kAhead, bool kAsyncX>
__device__ __forceinline__ void body(const Params& p, uint8_t* smem, float code_l, float nested_l, float offset) {
  constexpr int kRows = 8 * NT;  // x rows per pass
  float* nested_code = reinterpret_cast<float*>(smem + kTable);
  float* red = reinterpret_cast<float*>(smem + kTable + kNestedBytes);  // [2][W][16 rows x 16 columns]
  uint8_t* xs = smem + kTable + kNestedBytes + row_sum_bytes(W);
  const uint32_t tab = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int K = static_cast<int>(p.K), M = static_cast<int>(p.M), N = static_cast<int>(p.N);
  const int tiles = (N + 15) / 16, pairs = K >> 8;
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const int xrow = 2 * K + 16;  // bytes between staged x rows
  const uint32_t lane4 = 4u * lane;
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
    b.q = live ? qq : pairs;
    const int o = live ? 128 * qq : 0;  // bytes of the pair in a row
    const uint8_t* pa = p.packed + (b.ea >> 1) + o + 8 * t;
    const uint8_t* pb = p.packed + (b.eb >> 1) + o + 8 * t;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      b.wa[u] = onA ? __ldcs(reinterpret_cast<const uint2*>(pa + 32 * u)) : make_uint2(0, 0);
      b.wb[u] = onB ? __ldcs(reinterpret_cast<const uint2*>(pb + 32 * u)) : make_uint2(0, 0);
    }
    const int ba = (b.ea + 2 * o) >> log2_bs, bb = (b.eb + 2 * o) >> log2_bs;  // first block of the pair
    if constexpr (kNested) {
      b.ca = __ldg(reinterpret_cast<const uint32_t*>(am8 + (ba & ~3)));
      b.cb = __ldg(reinterpret_cast<const uint32_t*>(am8 + (bb & ~3)));
      b.na = __ldg(p.nested_absmax + (ba >> 8));
      b.nb = __ldg(p.nested_absmax + (bb >> 8));
    } else {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        b.fa[u] = __ldg(am32 + ((b.ea + 2 * o + 64 * u) >> log2_bs));
        b.fb[u] = __ldg(am32 + ((b.eb + 2 * o + 64 * u) >> log2_bs));
      }
    }
  };
  float acc[NT][4];
  auto zero_acc = [&]() {
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  };
  zero_acc();
  auto decode = [&](const Round<kNested>& b) {
    if (b.q >= pairs) return;
    const int o = 128 * b.q;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float sa, sb;
      if constexpr (kNested) {  // as bitsandbytes: product, then sum
        const int ia = ((b.ea + 2 * o + 64 * u) >> log2_bs) - (((b.ea + 2 * o) >> log2_bs) & ~3);
        const int ib = ((b.eb + 2 * o + 64 * u) >> log2_bs) - (((b.eb + 2 * o) >> log2_bs) & ~3);
        sa = __fadd_rn(__fmul_rn(nested_code[(b.ca >> (8 * ia)) & 0xffu], b.na), offset);
        sb = __fadd_rn(__fmul_rn(nested_code[(b.cb >> (8 * ib)) & 0xffu], b.nb), offset);
      } else {
        sa = b.fa[u];
        sb = b.fb[u];
      }
      uint4 xv[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint8_t* xp = xs + (8 * n + g) * xrow + 2 * (256 * b.q + 64 * u + 16 * t);
        xv[n][0] = *reinterpret_cast<const uint4*>(xp);
        xv[n][1] = *reinterpret_cast<const uint4*>(xp + 16);
      }
      const uint32_t A[2] = {b.wa[u].x, b.wa[u].y}, B[2] = {b.wb[u].x, b.wb[u].y};
      float c[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // bytes 2i (a0 / a1) and 2i + 1 (a2 / a3) of each row's 8
        const int j = 2 * (i & 1);
        const uint32_t a0 = lookup16<kImm>(lane4, A[i >> 1], j, tab), a1 = lookup16<kImm>(lane4, B[i >> 1], j, tab);
        const uint32_t a2 = lookup16<kImm>(lane4, A[i >> 1], j + 1, tab);
        const uint32_t a3 = lookup16<kImm>(lane4, B[i >> 1], j + 1, tab);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint32_t x0 = i < 2 ? (i == 0 ? xv[n][0].x : xv[n][0].z) : (i == 2 ? xv[n][1].x : xv[n][1].z);
          const uint32_t x1 = i < 2 ? (i == 0 ? xv[n][0].y : xv[n][0].w) : (i == 2 ? xv[n][1].y : xv[n][1].w);
          mma16816<T>(c[n], a0, a1, a2, a3, x0, x1);
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        acc[n][0] = fmaf(sa, c[n][0], acc[n][0]);
        acc[n][1] = fmaf(sa, c[n][1], acc[n][1]);
        acc[n][2] = fmaf(sb, c[n][2], acc[n][2]);
        acc[n][3] = fmaf(sb, c[n][3], acc[n][3]);
      }
    }
  };
  int parity = 0;
  int m0 = 0;  // the pass's first x row
  auto finish = [&](int tl) {  // every warp of the block, once per tile
    float* r = red + (parity * W + warp) * 256;
#pragma unroll
    for (int n = 0; n < NT; ++n) {  // (row, column) at row * 16 + column
      r[g * 16 + 8 * n + 2 * t] = acc[n][0];
      r[g * 16 + 8 * n + 2 * t + 1] = acc[n][1];
      r[(g + 8) * 16 + 8 * n + 2 * t] = acc[n][2];
      r[(g + 8) * 16 + 8 * n + 2 * t + 1] = acc[n][3];
    }
    zero_acc();
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * kRows; i += 32 * W) {
      const int rr = i & 15, n = i >> 4, row = tl * 16 + rr, m = m0 + n;
      if (row < N && m < M) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) v += red[(parity * W + w) * 256 + rr * 16 + n];
        Pair<T>::store(p.y, static_cast<long long>(m) * N + row, v + (p.bias ? Pair<T>::load(p.bias, row) : 0.f));
      }
    }
    parity ^= 1;  // (the next tile's barrier orders the reuse of this buffer after these reads)
  };
  bool first = true;
  for (; m0 < M; m0 += kRows) {
    Round<kNested> b0, b1, b2;
    int tile = blockIdx.x, q = warp;  // decode cursor
    int tl_ld = tile, q_ld = q;       // load cursor, kAhead rounds ahead after the prologue
    load(b0, tl_ld, q_ld);
    advance(tl_ld, q_ld);
    if constexpr (kAhead == 2) {
      load(b1, tl_ld, q_ld);
      advance(tl_ld, q_ld);
    }
    {  // set-up while the first rounds fly: table and nested codes (first pass), x rows m0.. (zeros past M)
      if (first) {
        build_pair_table_from<T>(reinterpret_cast<uint32_t*>(smem), code_l, 32 * W);
        if (kNested && threadIdx.x < 256) nested_code[threadIdx.x] = nested_l;
      }
      const int per_row = K / 8, total = kRows * per_row;  // 16-byte pieces; eight loads in flight per thread
      const uint4* xg = reinterpret_cast<const uint4*>(p.x);
      if constexpr (kAsyncX) {
        const uint32_t xs_s = static_cast<uint32_t>(__cvta_generic_to_shared(xs));
        for (int i = threadIdx.x; i < total; i += 32 * W) {
          const int n = i / per_row, c = i - n * per_row;
          const bool on = m0 + n < M;
          cp_async16_if(xs_s + n * xrow + 16 * c, on ? xg + static_cast<long long>(m0 + n) * per_row + c : xg, on);
        }
        cp_async_commit();
        cp_async_wait<0>();
      }
      for (int i0 = kAsyncX ? total : threadIdx.x; i0 < total; i0 += 8 * 32 * W) {
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int i = i0 + j * 32 * W, n = i / per_row, c = i - n * per_row;
          v[j] = i < total && m0 + n < M ? __ldg(xg + static_cast<long long>(m0 + n) * per_row + c)
                                         : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int i = i0 + j * 32 * W, n = i / per_row, c = i - n * per_row;
          if (i < total) *reinterpret_cast<uint4*>(xs + n * xrow + 16 * c) = v[j];
        }
      }
      __syncthreads();
    }
    first = false;
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
      if constexpr (kAhead == 2) {
        while (step(b0, b2) && step(b1, b0) && step(b2, b1)) {
        }
      } else {
        while (step(b0, b1) && step(b1, b0)) {
        }
      }
    }
    __syncthreads();  // every warp done with this pass's x before the next pass stages its own
  }
}

template <typename T, bool kNested, int W, int NT, int kAhead, bool kAsyncX>
__global__ void __launch_bounds__(32 * W, 1) gemm_burst(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) uint8_t smem[];  // no static shared memory: the table at the window offset 1024
  const float code_l = __ldg(p.code + (threadIdx.x & 15));
  const float nested_l = kNested && threadIdx.x < 256 ? __ldg(p.nested_code + threadIdx.x) : 0.f;
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  if (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) == 1024u) {
    body<T, kNested, W, NT, true, kAhead, kAsyncX>(p, smem, code_l, nested_l, offset);
  } else {
    body<T, kNested, W, NT, false, kAhead, kAsyncX>(p, smem, code_l, nested_l, offset);
  }
}

template <typename T, bool kNested, int W, int NT, int kAhead = 2, bool kAsyncX = false>
int launch(const Params* p, cudaStream_t st) {
  static_assert(32 * W >= 256 && 32 * W >= 16 * 8 * NT, "nested codes and row sums: one per thread");
  const long long smem = kTable + kNestedBytes + row_sum_bytes(W) + 8LL * NT * (2 * p->K + 16);
  auto f = gemm_burst<T, kNested, W, NT, kAhead, kAsyncX>;
  if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess)
    return -2;
  int blocks = 0, dev = 0, sms = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 32 * W, static_cast<size_t>(smem));
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const long long tiles = (p->N + 15) / 16, units = static_cast<long long>(blocks) * sms;
  const long long grid = tiles < units ? tiles : units;
  if (grid < 1) return -4;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(32 * W);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = st;
  void* args[] = {(void*)p};
  return static_cast<int>(cudaLaunchKernelExC(&cfg, (const void*)f, args));
}

// cfg: 0 = 8 warps, NT 2 (16 x rows a pass); 1 = 8 warps, NT 1 (8 rows); 2 = 12 warps, NT 2; 3 = cfg 0 with x
// staged by cp.async; 4 = 12 warps, NT 2, one round ahead, cp.async x; 5 = 16 warps, NT 2, one round ahead, cp.async x;
// 6 = cfg 1 with cp.async x
template <typename T, bool kNested>
int launch_cfg(const Params* p, int cfg, cudaStream_t st) {
  switch (cfg) {
    case 0: return launch<T, kNested, 8, 2>(p, st);
    case 1: return launch<T, kNested, 8, 1>(p, st);
    case 2: return launch<T, kNested, 12, 2>(p, st);
    case 3: return launch<T, kNested, 8, 2, 2, true>(p, st);
    case 4: return launch<T, kNested, 12, 2, 1, true>(p, st);
    case 5: return launch<T, kNested, 16, 2, 1, true>(p, st);
    case 6: return launch<T, kNested, 8, 1, 2, true>(p, st);
  }
  return -1;
}

}  // namespace fastnf4_b16

extern "C" int probe_burst16(const fastnf4_mma::Params* p, int dtype, int nested, int cfg, void* stream) {
  using namespace fastnf4_b16;
  auto st = static_cast<cudaStream_t>(stream);
  if (p->K % 256 != 0 || p->blocksize < 64 || p->M < 1 || p->N * p->K >= (1LL << 31) ||
      (reinterpret_cast<uintptr_t>(p->absmax) & 3) != 0)
    return -3;
  if (dtype == 0) return nested ? launch_cfg<__nv_bfloat16, true>(p, cfg, st) : launch_cfg<__nv_bfloat16, false>(p, cfg, st);
  return nested ? launch_cfg<__half, true>(p, cfg, st) : launch_cfg<__half, false>(p, cfg, st);
}
