// Decode-size NF4 matmul (M <= 32) on tensor cores: y[M, N] = x[M, K] @ dequant(W[N, K]).T (+ bias).
//
// Two kernels, one fragment layout. Warp tile: 16 rows of W x one 128-wide K slice per step. Lane
// (g = lane / 4, t = lane % 4) holds 16 packed bytes (32 codes, one "chunk") of rows n0 + g and n0 + g + 8 at K
// offset 32 t of the slice. The k order inside an mma is free as long as A and B agree, so mma step s (0..7)
// takes codes 4s..4s+3 of every lane's chunk: byte 2s feeds A registers a0a1 / a2a3 and byte 2s + 1 feeds
// a4a5 / a6a7, with B built from x at the same positions. Each packed byte is decoded by one PRMT (the byte,
// merged with the lane's offset, is the shared-memory address) and one load from a 256-entry table of value
// pairs replicated per lane (no bank conflicts whatever the codes).
//
// * gemv_mma_pipe (M <= 2, "decode"): the table holds code pairs rounded to the input dtype, so the lookup is
//   the A operand; the per-block absmax is applied after the mma in float32. Quantization blocks (>= 32 codes)
//   never split a chunk, but one slice can hold four blocks, so B column j stands for (x row j / 4, chunk
//   j % 4) and only lanes with g % 4 == t carry x: C column j holds one row of x times one chunk's codes, which
//   is scaled by that chunk's absmax after every slice. CG groups of 8 columns cover M <= 2 CG.
// * gemm_mma_pipe (2 < M <= 32): the same table, but every mma takes its 16 k values from one chunk (lane t
//   supplies word t of it), so each chunk's two mma go into a fresh fragment that is scaled by the chunk's
//   absmax in float32 and added up; B is plain x (column = x row) and MT = M / 8 tiles of 8 columns share
//   every decoded A fragment. A block's warps work on adjacent 16-row tiles of the same K slices, and x for
//   those slices is staged once per block in shared memory (cp.async ring shared with the weights) instead of
//   being read by every warp.
//
// Split-K: a work item is (row tile(s), K range). With S > 1 ranges the warps write float32 partial sums and
// the last of them (an atomic counter per 16-row tile, reset by that warp) adds the S partials in a fixed
// order, so results do not depend on timing. Warps/blocks are persistent: grid = resident blocks. The decode
// kernel can instead keep the S ranges of a tile inside one block, or one thread block cluster of C blocks
// (Params::local, Params::lcluster): the first U = (tiles per round) x S warps of the block / cluster take the
// items, the float32 partial sums stay in shared memory, and after one block / cluster barrier the blocks add them
// in the same split order (the same bits; a cluster's blocks read each other's over distributed shared memory): no
// fence, atomics or global partials.
//
// Requirements checked by the caller: K % 32 == 0, K < 2^31, x and y contiguous with 16-byte aligned rows,
// packed 16-byte aligned, blocksize >= 32, nested statistics in blocks of 256 (bitsandbytes' only value).
//
// Files: gemv_mma_common.cuh (what the kernels share), one header per kernel family (gemv_mma_decode.cuh,
// gemv_mma_gemm.cuh, gemv_mma_small.cuh, gemv_mma_burst.cuh; each states its shape contract and layout), and
// nf4_device.cuh (the helpers shared with wgmma.cu). This file: the kernel builds and the host API (extern "C").

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "gemv_mma_burst.cuh"
#include "gemv_mma_common.cuh"
#include "gemv_mma_decode.cuh"
#include "gemv_mma_gemm.cuh"
#include "gemv_mma_small.cuh"

namespace fastnf4_mma {

// Build numbers (named on the Python side: ``gemv_mma.BUILD_IDS``): 0 = ``decode`` (M <= 2); 1 / 2 / 3 =
// ``gemm_m8`` / ``gemm_m16`` / ``gemm_m32``, the GEMM kernel with 1 / 2 / 4 tiles of 8 rows (M <= 8 / 16 / 32);
// 4 = ``small``, one warp per weight row (M <= 2; only when forced); 5 = ``decode_wide``, the decode kernel with 20
// warps x 4 stages (``gemv_mma.choose``); 6 = ``split``, the split small-weight kernel (M = 1 or 2, by size:
// ``gemv_mma.choose``); 7 / 8 = ``decode_pair`` / ``decode_pair_wide``, the decode kernel of 16 / 20 warps with pair
// columns (M <= 4, blocksize >= 64, K % 64 == 0; see kPair), which takes M = 3-4 where it fits
// (``gemv_mma.pair_wanted``; results/h200-probe-pair-cols-local.json); 9 = ``decode_burst``, the burst decode kernel
// (M <= 2: ``gemv_mma.burst_wanted``).
template <typename T, bool kNested>
void* pick(int variant) {
  switch (variant) {
    case 0: return (void*)gemv_mma_pipe<T, 1, kNested>;
    case 1: return (void*)gemm_mma_pipe<T, 1, kNested>;
    case 2: return (void*)gemm_mma_pipe<T, 2, kNested>;
    case 3: return (void*)gemm_mma_pipe<T, 4, kNested>;
    case 4: return (void*)gemv_small<T, kNested>;
    case 5: return (void*)gemv_mma_pipe<T, 1, kNested, 1>;
    case 6: return (void*)gemv_split<T, kNested>;
    case 7: return (void*)gemv_mma_pipe<T, 1, kNested, 0, 0, false, true>;
    case 8: return (void*)gemv_mma_pipe<T, 1, kNested, 1, 0, false, true>;
    case 9: return (void*)gemv_burst<T, kNested>;
  }
  return nullptr;
}
// the decode kernels' builds by split-K settle (local: 0 global, 1 block-local, 2 over clusters, 3 global with
// split-major items: staged x only), x path (kXs) and columns (kPair: x in registers only)
template <typename T, bool kNested, int kCfg, bool kXs, bool kPair = false>
void* pick_decode(int local) {
  if constexpr (kXs) {
    if (local == 3) return (void*)gemv_mma_pipe<T, 1, kNested, kCfg, 3, true>;
  }
  return local == 2 ? (void*)gemv_mma_pipe<T, 1, kNested, kCfg, 2, kXs, kPair>
         : local == 1 ? (void*)gemv_mma_pipe<T, 1, kNested, kCfg, 1, kXs, kPair>
         : local == 0 ? (void*)gemv_mma_pipe<T, 1, kNested, kCfg, 0, kXs, kPair>
                      : nullptr;
}
template <typename T, bool kNested>
void* pick_local(int variant, int local, bool xs) {
  switch (variant) {
    case 0: return xs ? pick_decode<T, kNested, 0, true>(local) : pick_decode<T, kNested, 0, false>(local);
    case 5: return xs ? pick_decode<T, kNested, 1, true>(local) : pick_decode<T, kNested, 1, false>(local);
    case 7: return xs ? nullptr : pick_decode<T, kNested, 0, false, true>(local);
    case 8: return xs ? nullptr : pick_decode<T, kNested, 1, false, true>(local);
  }
  return nullptr;
}

// local: 0 the global settle's build, 1 the block-local one, 2 the cluster one, 3 the split-major global one (with
// xs); xs: staged x (decode kernels only)
void* kernel_for(int dtype, int variant, int nested, int local = 0, bool xs = false) {
  if (local || xs) {
    if (dtype == 0)
      return nested ? pick_local<__nv_bfloat16, true>(variant, local, xs)
                    : pick_local<__nv_bfloat16, false>(variant, local, xs);
    return nested ? pick_local<__half, true>(variant, local, xs) : pick_local<__half, false>(variant, local, xs);
  }
  if (dtype == 0) return nested ? pick<__nv_bfloat16, true>(variant) : pick<__nv_bfloat16, false>(variant);
  return nested ? pick<__half, true>(variant) : pick<__half, false>(variant);
}

// the M = 2 build of the split small-weight kernel (build 6, ``split``, takes M = 1 or 2; its launch picks by M)
void* split_m2(int dtype, int nested) {
  if (dtype == 0)
    return nested ? (void*)gemv_split<__nv_bfloat16, true, 2> : (void*)gemv_split<__nv_bfloat16, false, 2>;
  return nested ? (void*)gemv_split<__half, true, 2> : (void*)gemv_split<__half, false, 2>;
}

int threads_for(int variant) {
  switch (variant) {
    case 0: case 7: return pipe::Cfg<1>::kThreads;
    case 4: return small::kThreads;
    case 5: case 8: return pipe::Cfg<1, 1>::kThreads;
    case 6: return split::kThreads;
    case 9: return burst::kThreads;
  }
  return gemm::kThreads;
}

int smem_for(int variant) {
  switch (variant) {
    case 0: case 7: return pipe::Cfg<1>::kSmem;
    case 1: return gemm::Cfg<1>::kSmem;
    case 2: return gemm::Cfg<2>::kSmem;
    case 3: return gemm::Cfg<4>::kSmem;
    case 4: return small::kXBytes;
    case 5: case 8: return pipe::Cfg<1, 1>::kSmem;
    case 6: return split::kXBytes;
    case 9: return burst::kSmem;
  }
  return 0;
}

// weight rows of one work item: 16 for the decode kernel (per warp), 16 x warps for the GEMM kernel (per block),
// one per warp for the small-weight kernel, 8 per block for the M = 1 small-weight kernel, 16 per block at a time for
// the burst kernel
int rows_for(int variant) {
  const bool decode = variant == 0 || variant == 5 || variant == 7 || variant == 8;
  return decode ? 16 : variant == 4 ? small::kWarps : variant == 6 ? split::kBlockRows : 16 * gemm::kWarps;
}

}  // namespace fastnf4_mma

using fastnf4_mma::Params;

extern "C" {

// Resident blocks per SM for a kernel variant (0 when it does not exist or does not fit on this GPU); for the
// decode kernels the lowest of the global-settle, block-local and cluster builds (all get their attributes set here).
int fastnf4_gemv_mma_occupancy(int dtype, int variant, int nested) {
  int least = -1;
  for (int build = 0; build < 8; ++build) {
    const int local = build % 4;
    const bool xs = build >= 4;
    if (local == 3 && !xs) continue;  // (no such build)
    void* f = fastnf4_mma::kernel_for(dtype, variant, nested, local, xs);
    if (f == nullptr) {
      if (build) break;
      return 0;
    }
    const int smem = fastnf4_mma::smem_for(variant);
    // the tensor-core kernels want all the shared memory they can get; the split small-weight kernel (x only, a
    // few KiB per block) keeps the L1 the driver would leave it
    if (variant != 6)
      cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, fastnf4_mma::threads_for(variant), smem) !=
        cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    least = least < 0 || blocks < least ? blocks : least;
  }
  return least;
}

// Clusters of `size` blocks of the decode kernels' block-local build that can be resident at once (0: none / error;
// after fastnf4_gemv_mma_occupancy set the kernel's attributes).
int fastnf4_gemv_mma_clusters(int dtype, int variant, int nested, int size) {
  int least = -1;
  for (int xs = 0; xs < (variant == 7 || variant == 8 ? 1 : 2); ++xs) {  // the least of the x paths' builds
    void* f = fastnf4_mma::kernel_for(dtype, variant, nested, 2, xs != 0);
    if (f == nullptr || size < 1 || size > 8) return 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)size);
    cfg.blockDim = dim3(fastnf4_mma::threads_for(variant));
    cfg.dynamicSmemBytes = (size_t)fastnf4_mma::smem_for(variant);
    cudaLaunchAttribute attr[1];
    fastnf4_mma::cluster_attr(attr[0], size);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, f, &cfg) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    least = least < 0 || clusters < least ? clusters : least;
  }
  return least;
}

// Warps per block and weight rows per work item of a kernel variant.
int fastnf4_gemv_mma_warps(int variant) { return fastnf4_mma::threads_for(variant) / 32; }
int fastnf4_gemv_mma_rows(int variant) { return fastnf4_mma::rows_for(variant); }

int fastnf4_gemv_mma_params_size() { return (int)sizeof(Params); }

// dtype 0 = bf16, 1 = fp16; pdl = launch with programmatic stream serialization (sm_90+); returns a cudaError_t.
int fastnf4_gemv_mma(const Params* p, int dtype, int variant, int nested, int grid, cudaStream_t stream, int pdl) {
  const int build = p->local <= 0 ? (p->gsplit ? 3 : 0) : p->lcluster > 1 ? 2 : 1;
  void* f = variant == 6 && p->M == 2 ? fastnf4_mma::split_m2(dtype, nested)
                                      : fastnf4_mma::kernel_for(dtype, variant, nested, build, p->xs > 0);
  if (variant == 6 && (p->M < 1 || p->M > 2)) return (int)cudaErrorInvalidValue;
  // the rows of x each variant covers (a forced variant never leaves rows of y unwritten)
  const long long max_m = variant == 0 || variant == 4 || variant == 5 || variant == 6 || variant == 9 ? 2
                          : variant == 7 || variant == 8 ? 4 : variant == 1 ? 8 : variant == 2 ? 16 : 32;
  if (p->M < 1 || p->M > max_m) return (int)cudaErrorInvalidValue;
  // the burst kernel: whole slice pairs, a lane's blocks in one aligned word of codes, x in the holes, 32-bit offsets,
  // one 16-row tile per block at a time (no split-K, no staged-x or settle plans)
  if (variant == 9 && (p->K % 256 != 0 || p->blocksize < 64 || p->M * p->K > 16384 || p->N * p->K >= (1LL << 31) ||
                       (reinterpret_cast<uintptr_t>(p->absmax) & 3) != 0 || p->splits != 1 || p->local > 0 ||
                       p->xs > 0 || p->gsplit || p->lsplit))
    return (int)cudaErrorInvalidValue;
  // pair columns: M <= 4 (32-bit x offsets: M K < 2^32), whole chunk pairs per block, x in registers, no split-major
  // plans
  if ((variant == 7 || variant == 8) && (p->M < 1 || p->M > 4 || p->blocksize < 64 || p->K % 64 != 0 ||
                                         p->M * p->K >= (1LL << 32) || p->xs > 0 || p->gsplit || p->lsplit))
    return (int)cudaErrorInvalidValue;
  // split-major clusters: every block holds whole splits (tpb tiles x S parts = lcluster x warps)
  const long long kw = fastnf4_mma::threads_for(variant) / 32;
  const bool lsplit = p->lsplit != 0;
  if (lsplit && (p->local <= 0 || p->lcluster <= 1 || p->splits < 1 || p->local % p->splits != 0 ||
                 kw % (p->local / p->splits) != 0 || p->local != p->lcluster * kw))
    return (int)cudaErrorInvalidValue;
  // staged x: exactly the rows' holes (all of K, or a split-major block's splits), K % 128 == 0 and no split past the
  // end of K (its copies skip the K bound)
  const long long slices = (p->K + fastnf4_mma::kSlice - 1) / fastnf4_mma::kSlice;
  // split-major global plans: the global settle, split-K, every item on its own warp of the grid
  const long long tiles = (p->N + 15) / 16;
  if (p->gsplit && (p->local > 0 || p->splits < 2 || tiles * p->splits > grid * kw || (variant != 0 && variant != 5)))
    return (int)cudaErrorInvalidValue;
  // (a block's kw warps span at most 1 + ceil((kw - 1) / tiles) splits)
  const long long gspan1 = 1 + (kw - 1 + tiles - 1) / tiles;
  const long long gspan = p->gsplit ? (gspan1 < p->splits ? gspan1 : p->splits) : 0;
  const long long staged = lsplit ? kw / (p->local / p->splits) * p->slices_per_split
                           : p->gsplit ? gspan * p->slices_per_split : slices;
  if (p->xs > 0 && (p->M > 2 || p->K % fastnf4_mma::kSlice != 0 || p->xs != p->M * staged * 2 ||
                    p->xs > fastnf4_mma::pipe::kHoles || (p->splits - 1) * p->slices_per_split >= slices))
    return (int)cudaErrorInvalidValue;
  if (f == nullptr) return (int)cudaErrorInvalidValue;
  void* args[] = {(void*)p};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(fastnf4_mma::threads_for(variant));
  // the split small-weight kernel stages only x: M * K values of 2 bytes (at most smem_for, checked by the host)
  cfg.dynamicSmemBytes = variant == 6 ? static_cast<int>(2 * p->M * p->K) : fastnf4_mma::smem_for(variant);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (p->local > 0 && p->lcluster > 1) {  // the block-local split-K over clusters of lcluster blocks
    if (grid % p->lcluster != 0 || p->lcluster > 8) return (int)cudaErrorInvalidValue;
    fastnf4_mma::cluster_attr(attr[n++], static_cast<int>(p->lcluster));
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return (int)cudaLaunchKernelExC(&cfg, f, args);
}

}  // extern "C"
