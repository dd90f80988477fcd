// gemm_mma_pipe, the tensor-core GEMM kernel of gemv_mma.cu for 2 < M <= 32: builds ``gemm_m8`` / ``gemm_m16`` /
// ``gemm_m32`` = MT 1 / 2 / 4 tiles of 8 x rows (M <= 8 / 16 / 32).
// Shape contract (the host checks it, gemv_mma.py): x [M, K] and y [M, N] bf16 / fp16, contiguous, 16-byte aligned
// rows; packed [N, K / 2] 16-byte aligned; K % 32 == 0, K < 2^31; blocksize a power of two >= 32; absmax float32, or
// uint8 codes with nested statistics in blocks of 256; the split-K counters zero between launches.
// Layout: a persistent grid of the resident 16-warp blocks; a work item is 16 adjacent 16-row tiles (one per warp) x
// one K range, settled globally (settle_splits, one counter per 16-row tile). Dynamic shared memory
// (gemm::Cfg<MT>::kSmem): the 64 KiB pair table (entry v of lane l at byte 256 v + 4 l), kStages stages of the block's x slice (8 MT rows
// of 128 values, rows kXRow bytes apart), and per warp its weight ring (kStages x 1 KiB, XOR-swizzled chunk slots)
// and statistics table.
#pragma once

#include "gemv_mma_common.cuh"

namespace fastnf4_mma {

// End of a GEMM-kernel work item for one warp's 16 rows: C fragment (row g / g + 8, column 2t / 2t + 1) of
// tile nt is y[x row 8 nt + 2t (+1), weight row].
template <typename T, int MT>
__device__ __forceinline__ void finish_gemm(const Params& p, const float (&acc)[MT][4], long long tile,
                                            long long split, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const long long rowA = tile * 16 + g;
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      put<T>(p, split, 8 * nt + 2 * t + h, rowA, acc[nt][h]);
      put<T>(p, split, 8 * nt + 2 * t + h, rowA + 8, acc[nt][2 + h]);
    }
  }
}

// GEMM kernel for 2 < M <= 32 (MT = 1, 2, 4 tiles of 8 x rows). A block of kWarps warps takes work items of
// kWarps adjacent 16-row tiles x one K range, all warps on the same slice at the same time: one block-wide
// cp.async ring carries, per slice, every warp's weights (1 KiB each) and the block's x slice (8 MT rows x
// 128, rows 320 bytes apart), so x is read from L2 once per block instead of once per warp. One __syncthreads
// per slice guards the ring.
// Every mma takes its 16 k values from ONE 32-code chunk (so from one quantization block): lane t supplies
// word t (codes 8t..8t+7) of the chunk, read from the ring where each lane's 16-byte chunk copy sits in an
// XOR-swizzled slot (no bank conflicts). Two mma per chunk go into a fresh fragment that is then scaled by the
// chunk's float32 absmax per row and added to the accumulators: the same arithmetic as the decode kernel
// (codes rounded to the input dtype by the table, block scale in float32) with B = plain x (column = x row).
namespace gemm {
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 4;
constexpr int kTableBytes = 256 * 256;  // as the decode kernel: entry v of lane l at byte 256 v + 4 l
constexpr int kXRow = 320;              // bytes per x row of a stage (256 used; 80 words: conflict-free reads)
constexpr int kWarpBytes = kStages * 1024 + 16 * kStatStride * 4;
template <int MT> struct Cfg {
  static constexpr int kXStage = 8 * MT * kXRow;
  static constexpr int kSmem = kTableBytes + kStages * kXStage + kWarps * kWarpBytes;
};
}  // namespace gemm

template <typename T, int MT, bool kNested>
__global__ void __launch_bounds__(gemm::kThreads, 1) gemm_mma_pipe(const __grid_constant__ Params p) {
  using namespace gemm;
  constexpr int kXStage = Cfg<MT>::kXStage;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float nested_code[kNested ? 256 : 1];
  uint32_t* table = reinterpret_cast<uint32_t*>(smem);
  // the pair table overlaps the previous kernel's drain when its source is a constant (PDL launches)
  if (!p.code_const) pdl_wait();
  build_pair_table<T>(table, p.code, kThreads);
  if (p.code_const) pdl_wait();
  pdl_launch_dependents();
  if constexpr (kNested) {
    for (int i = threadIdx.x; i < 256; i += kThreads) nested_code[i] = __ldg(p.nested_code + i);
  }
  const float offset = kNested ? __ldg(p.offset) : 0.f;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  uint8_t* xring = smem + kTableBytes;
  uint8_t* wsm = xring + kStages * kXStage + warp * kWarpBytes;
  float* stats = reinterpret_cast<float*>(wsm + kStages * 1024);
  const uint32_t table_s = static_cast<uint32_t>(__cvta_generic_to_shared(table));
  const uint32_t lane4 = 4 * lane;
  // weight ring: lane (g, c) stores its chunk c of rows g / g + 8 at slot 4 g + (c ^ (g / 2 % 4)) of the stage's
  // half A / B; lane (g, t) reads word t of every chunk c from there
  const uint32_t wring_s = static_cast<uint32_t>(__cvta_generic_to_shared(wsm));
  const uint32_t wr_dst = wring_s + 16 * (4 * g + (t ^ ((g >> 1) & 3)));
  uint32_t wr_src[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) wr_src[c] = 16 * (4 * g + (c ^ ((g >> 1) & 3))) + 4 * t;
  const uint32_t xring_s = static_cast<uint32_t>(__cvta_generic_to_shared(xring));
  const uint32_t xread_s = xring_s + g * kXRow + 16 * t;  // B fragments: x row 8 nt + g, chunk c, codes 8t..8t+7
  const long long N = p.N, K = p.K, M = p.M;
  const int K32 = static_cast<int>(K);
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const int slices = (K32 + kSlice - 1) / kSlice;
  const int splits = static_cast<int>(p.splits), per = static_cast<int>(p.slices_per_split);
  const long long items = (N + 16 * kWarps - 1) / (16 * kWarps) * splits;
  const bool pair_shares_block = p.blocksize >= 64 && K % 64 == 0;
  const uint8_t* xg = reinterpret_cast<const uint8_t*>(p.x);

  // Block cursor over (item, slice); the same for every warp of the block.
  struct BCursor {
    long long item, tile0;  // tile0: first 16-row tile of the item
    int split, slice, s_end;
  };
  auto begin = [&](BCursor& c, long long item) {
    c.item = item;
    const long long rb = item / splits;
    c.split = static_cast<int>(item - rb * splits);
    c.tile0 = rb * kWarps;
    c.slice = c.split * per;
    c.s_end = min(slices, c.slice + per);
    if (c.slice >= c.s_end) c.s_end = c.slice + 1;  // a split past K: one all-zero slice (see gemv_mma_pipe)
  };
  auto advance = [&](BCursor& c) {
    if (++c.slice == c.s_end) begin(c, c.item + gridDim.x);
  };
  // x pieces this thread copies per slice, fixed for the kernel: piece (row m, chunk c, t) = 16 bytes at
  // element 32 c + 8 t of the slice, idx % 16 = 4 c + t, stored in order at byte 320 m + 16 (4 c + t); a
  // quarter warp's 16-byte B loads (rows g, g + 1) then hit 32 distinct banks.
  constexpr int kXCopies = (8 * MT * 16 + kThreads - 1) / kThreads;
  long long xsrc[kXCopies];  // byte offset of the piece in slice 0
  uint32_t xdst[kXCopies];   // byte offset in a stage
  int xlim[kXCopies];        // the piece is inside x at slice K offset kb when kb < xlim, else zero-filled
#pragma unroll
  for (int i = 0; i < kXCopies; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int m = idx >> 4, c = (idx >> 2) & 3;
    xsrc[i] = 2LL * m * K + 16 * (idx & 15);
    xdst[i] = m * kXRow + 16 * (idx & 15);
    // (-1: no piece here; a zero fill would land outside the stage)
    xlim[i] = idx >= 8 * MT * 16 ? -1 : m < M ? max(0, K32 - 32 * c) : 0;
  }
  // This warp's weight rows for the load cursor's item (rows outside N are never read: source size 0).
  const uint8_t* ldw = p.packed;
  int szA = 0, szB = 0;
  auto ld_rows = [&](const BCursor& c) {
    const long long rowA = (c.tile0 + warp) * 16 + g;
    szA = rowA < N ? 16 : 0;
    szB = rowA + 8 < N ? 16 : 0;
    ldw = szA ? p.packed + ((rowA * K) >> 1) + 16 * t : p.packed;
  };
  // the weights are read once: evict-first, as in the decode kernel (H200 at M = 16: Llama gate_up 197 vs 210 us
  // without, Qwen gate_up 145 vs 168, Qwen down 71 vs 76, the others -1%)
  const uint64_t wpolicy = evict_first_policy();
  // Copies of one step into ring stage ``st`` (always one commit group, empty past the last item).
  auto issue = [&](const BCursor& c, int st) {
    if (c.item < items) {
      const int kb = c.slice * kSlice;
      const bool kin = kb + 32 * t < K32;
      const uint8_t* src = ldw + (kin ? kb / 2 : 0);  // (addresses stay inside the rows even where nothing is read)
      const uint32_t dst = wr_dst + st * 1024;
      cp_async16_weights_if(dst, src, kin && szA, wpolicy);
      cp_async16_weights_if(dst + 512, szB ? src + 4 * K : src, kin && szB, wpolicy);
#pragma unroll
      for (int i = 0; i < kXCopies; ++i) {
        if (xlim[i] < 0) continue;
        const bool on = kb < xlim[i];
        cp_async16_if(xring_s + st * kXStage + xdst[i], on ? xg + xsrc[i] + 2 * kb : xg, on);
      }
    }
    cp_async_commit();
  };
  // Item and start slice of the statistics phase after the one starting at the compute cursor.
  auto next_phase = [&](const BCursor& c, long long& tile, int& slice) {
    if (c.slice + 8 < c.s_end) {
      tile = c.tile0 + warp;
      slice = c.slice + 8;
      return c.item < items;
    }
    BCursor n;
    begin(n, c.item + gridDim.x);
    tile = n.tile0 + warp;
    slice = n.slice;
    return n.item < items;
  };

  BCursor cp, ld;
  begin(cp, blockIdx.x);
  ld = cp;
  ld_rows(ld);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    issue(ld, i);
    const long long before = ld.item;
    advance(ld);
    if (ld.item != before) ld_rows(ld);
  }
  StatRaw<kNested> sraw;
  load_stats<kNested>(p, sraw, cp.tile0 + warp, cp.slice, lane, log2_bs, pair_shares_block);
  int st = 0, st_ld = kStages - 1, rel = 0;
  float acc[MT][4];
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
  __syncthreads();  // the table and nested codes are in place
  while (cp.item < items) {
    cp_async_wait<kStages - 2>();  // this thread's copies of step ``st`` have landed
    __syncthreads();               // everyone's have; and everyone is done with the stage refilled next
    issue(ld, st_ld);
    {
      const long long before = ld.item;
      advance(ld);
      if (ld.item != before) ld_rows(ld);
    }
    st_ld = st_ld + 1 == kStages ? 0 : st_ld + 1;
    const long long tile = cp.tile0 + warp;
    if ((rel & 7) == 0) {  // decode this phase's statistics (loaded a phase ago) and load the next phase's
      if (pair_shares_block) {
        store_stats<kNested, true>(sraw, stats, nested_code, offset, lane);
      } else {
        store_stats<kNested>(sraw, stats, nested_code, offset, lane);
      }
      long long ntile;
      int nslice;
      if (next_phase(cp, ntile, nslice)) load_stats<kNested>(p, sraw, ntile, nslice, lane, log2_bs, pair_shares_block);
    }
    const uint32_t ws = wring_s + st * 1024;
    uint32_t wA[4], wB[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(wA[c]) : "r"(ws + wr_src[c]));
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(wB[c]) : "r"(ws + wr_src[c] + 512));
    }
    const float4 sA = *reinterpret_cast<const float4*>(stats + g * kStatStride + 4 * (rel & 7));
    const float4 sB = *reinterpret_cast<const float4*>(stats + (g + 8) * kStatStride + 4 * (rel & 7));
    const float scA[4] = {sA.x, sA.y, sA.z, sA.w}, scB[4] = {sB.x, sB.y, sB.z, sB.w};
    const uint32_t xs = xread_s + st * kXStage;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float cf[MT][4];
      uint4 bq[MT];  // x rows 8 nt + g at codes 8t..8t+7 of chunk c: (x, y) for h = 0, (z, w) for h = 1
#pragma unroll
      for (int nt = 0; nt < MT; ++nt) {
        cf[nt][0] = cf[nt][1] = cf[nt][2] = cf[nt][3] = 0.f;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(bq[nt].x), "=r"(bq[nt].y), "=r"(bq[nt].z),
                     "=r"(bq[nt].w) : "r"(xs + nt * 8 * kXRow + 64 * c));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a0, a1, a2, a3;
        if (h) {
          a0 = lookup_pipe<2>(table_s, lane4, wA[c]);
          a1 = lookup_pipe<2>(table_s, lane4, wB[c]);
          a2 = lookup_pipe<3>(table_s, lane4, wA[c]);
          a3 = lookup_pipe<3>(table_s, lane4, wB[c]);
        } else {
          a0 = lookup_pipe<0>(table_s, lane4, wA[c]);
          a1 = lookup_pipe<0>(table_s, lane4, wB[c]);
          a2 = lookup_pipe<1>(table_s, lane4, wA[c]);
          a3 = lookup_pipe<1>(table_s, lane4, wB[c]);
        }
#pragma unroll
        for (int nt = 0; nt < MT; ++nt) {
          mma16816<T>(cf[nt], a0, a1, a2, a3, h ? bq[nt].z : bq[nt].x, h ? bq[nt].w : bq[nt].y);
        }
      }
#pragma unroll
      for (int nt = 0; nt < MT; ++nt) {
        acc[nt][0] = fmaf(cf[nt][0], scA[c], acc[nt][0]);
        acc[nt][1] = fmaf(cf[nt][1], scA[c], acc[nt][1]);
        acc[nt][2] = fmaf(cf[nt][2], scB[c], acc[nt][2]);
        acc[nt][3] = fmaf(cf[nt][3], scB[c], acc[nt][3]);
      }
    }
    st = st + 1 == kStages ? 0 : st + 1;
    ++rel;
    if (++cp.slice < cp.s_end) continue;
    finish_gemm<T, MT>(p, acc, tile, cp.split, lane);
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    rel = 0;
    begin(cp, cp.item + gridDim.x);
  }
  cp_async_wait<0>();
  settle_splits<T>(p, blockIdx.x, gridDim.x, items, kWarps, warp, lane);
}

}  // namespace fastnf4_mma
