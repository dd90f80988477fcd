// Batch- and prefill-size NF4 matmul on Hopper's warpgroup tensor cores (wgmma, sm_90a):
// y[M, N] = x[M, K] @ dequant(W[N, K]).T (+ bias), straight from the bitsandbytes packed layout.
//
// Block tile: 128 weight rows (two warpgroups of 64; a second BM 128 build has 192, three warpgroups: Rows) x BM rows
// of x (BM = 8 / 16 / 32 / 64 / 128 / 256), K in steps of 64.
// The weights are the wgmma A operand, taken from registers: each warp decodes its 16 rows of a k16 step into
// exactly the m16n8k16 A fragment (lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8, k pairs 2t and
// 2t + 8), so the decoded weight never touches shared or global memory. One packed byte is one k pair: lane t
// takes byte t of every 4-byte word of its two rows' 32 bytes per step, and one PRMT + one 8-byte shared-memory
// load from a 256-entry table of float32 value pairs (16 copies: no bank conflicts) gives its two codes; two
// float32 products with the block's absmax and one rounding to the input dtype make exactly the dequantized
// weight (as ``dequantize``), so the error is that of cuBLAS on the dequantized weight. (Scaling code pairs already
// rounded to bf16 with HMUL2 was 1.6-2.4x cuBLAS's error: over the 2x budget.) The variants for M <= 32 (BM 16 / 32)
// decode with rounded codes instead (kFastMaxBM below: code pairs in the input dtype, absmax applied in float32 to
// each step's product; up to 1.7x cuBLAS's error, as gemv_mma.cu). x is the B operand, read by wgmma from a
// 128-byte-swizzled shared-memory tile (BM rows x 128 bytes per step).
//
// Pipeline: x tiles arrive by TMA (thread 0, one 2D box per step, kXStages stages, an mbarrier each) kXStages - 1
// steps ahead; the packed weights (4 KiB per step) by cp.async kWStages - 1 steps ahead into the unused halves of
// the table's 256-byte entries; the statistics (absmax, or the 8-bit double-quant codes and nested absmax) by
// cp.async once per 4 steps where they sit in aligned words ("quads"), else per step with the weights. Each step
// issues its four wgmma asynchronously, decodes the next step's fragments while they run, then waits: the decode of
// step j + 1 overlaps the tensor-core work of step j. One block barrier per step (the weight copies), or per two
// steps in the trimmed variants (kTrimMaxBM / kTrimFromBM, Cfg::kPair), whose copies then run 4-6 and x 2-3 steps ahead.
// Epilogue: bias, conversion, a padded shared-memory transpose and 16-byte row stores of y; with split-K
// float32 partial sums, one [M, W] slice per split, which a second kernel (splitk_sum, launched right after on the
// same stream) adds up in split order (results do not depend on timing), with the bias, and converts. Where every
// tile is split in S <= 8 parts that all fit on the GPU at once, the S parts of a tile can instead run as one thread
// block cluster (Params::cluster = S): each part leaves its float32 tile in its own shared memory and, after a
// cluster barrier, sums a 1/S share of the tile over the S blocks' shared memory (distributed shared memory), in
// split order as splitk_sum does (the same bits), and stores it: no partial sums in global memory, no second kernel.
//
// Tiles and splits: blockIdx.x is the x row tile; blockIdx.y < full_tiles is weight row tile blockIdx.y over all
// of K (stored to y directly); the blocks after those take the last tail_tiles weight row tiles ("the tail", W =
// N - 128 full_tiles columns of y), each split into parts of steps_per_split K steps (j = blockIdx.y - full_tiles:
// tile full_tiles + j % tail_tiles, part j / tail_tiles; a cluster launch has the same j = blockIdx.y + tail_tiles x
// blockIdx.z, on a grid of (x tiles, tail_tiles, S) whose clusters of S blocks along z are the parts of one tile, the
// part = the block's rank in its cluster). Every tile split is full_tiles = 0; none is tail_tiles = 0. The whole
// tiles are launched first and the short split blocks fill the last wave (wgmma.plan).
//
// Statistics are copied as whole aligned 4- or 16-byte words, so the host launches it only where the absmax array
// ends on such a boundary (wgmma.stats_fit: every model weight; compute-sanitizer reported the last word of the
// others as a read past the allocation: commit 9f30056).
//
// Requirements checked by the caller: sm_90, K % 64 == 0, M * K * 2 < 2^31, blocksize a power of two >= 64, x contiguous with
// 16-byte aligned rows (K % 8 == 0 holds), packed 16-byte aligned, nested statistics in blocks of 256.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "nf4_device.cuh"  // the helpers shared with gemv_mma.cu

namespace fastnf4_wg {

using fastnf4_common::cluster_barrier;
using fastnf4_common::cp_async_commit;
using fastnf4_common::Pair;
using fastnf4_common::pdl_launch_dependents;
using fastnf4_common::pdl_wait;

struct Params {
  const uint8_t* packed;
  const void* absmax;          // float32, or uint8 codes with double quantization
  const float* nested_code;    // [256]
  const float* nested_absmax;
  const float* offset;         // [1]
  const float* code;           // [16] values of the 4-bit codes
  const void* x;               // [M, K] bf16 / fp16
  const void* bias;            // [N] or null
  void* y;                     // [M, N]
  float* y32;                  // [splits, M, W] float32 partial sums of the split tail (W = N - 128 full_tiles), else null
  long long M, N, K;
  long long log2_blocksize;
  long long steps_per_split;   // K steps (of 64) per split part of a tail tile
  long long full_tiles;        // weight row tiles computed whole (the first ones)
  long long tail_tiles;        // weight row tiles after those, split over K (0: none)
  long long cluster;           // > 1: every tile split in `cluster` parts, summed in a thread block cluster (no y32)
};

// What the kernel gets: the caller's parameters and the TMA descriptor of x (built per launch, see fastnf4_wgmma)
struct KParams {
  CUtensorMap xmap;  // x [M, K]: boxes of BM rows x 64 columns, 128-byte swizzle, rows past M read as zeros
  Params p;
};

constexpr int kBN = 128;        // weight rows per block: two warpgroups x 64 (the default; see Rows)
constexpr int kStep = 64;       // K per step
constexpr int kThreads = 256;
// Table region: 256 entries of 256 bytes. Entry v's first 128 bytes hold 16 copies of the float32 code pair
// (copy c at + 8 c; lane l reads copy l & 15: an 8-byte shared load is served per half-warp, so 16 copies are
// conflict-free), and PRMT builds the address (byte << 8) + 8 (lane & 15) in one instruction. The other 128 bytes
// of each entry ("hole" v) carry the weight ring: a stage is 40 holes (32 of packed weights: row r at hole r / 4,
// + 32 (r % 4); 4 of per-row statistics words; 4 of nested absmax), so the weights and statistics can be loaded
// far ahead (kWStages) without taking shared memory from the x ring.
constexpr int kTableBytes = 256 * 256;

// Weight rows per block BN = 64 per warpgroup, two threads per row (each copies half of it): 128 rows (two
// warpgroups, 256 threads) in every variant, and a second BM 128 build of 192 rows (three warpgroups, 384 threads,
// at most 168 registers: 165-167 used, no spills), which wgmma.py takes for wide weights (ROWS_WIDE, where the
// measurements are): x leaves the L2 once per 192 weight rows instead of 128 and each scheduler has three warps
// instead of two. A stage holds BN / 4 holes of weights and BN / 32 of each statistics kind (40 holes at 128 rows:
// 6 stages; 60 at 192: 4).
constexpr int kWideBN = 192;
template <int BN> struct Rows {
  static constexpr int kThreads = 2 * BN;
  static constexpr int kWHoles = BN / 4, kSHoles = BN / 32;
  static constexpr int kHoles = kWHoles + 2 * kSHoles;
  static constexpr int kWStages = 6 * kHoles <= 256 ? 6 : 4;
  static_assert(kWStages * kHoles <= 256, "the weight ring fits in the table's holes");
  static constexpr int kQuadBytes = 16 * BN;  // a statistics quad slot (see below)
};

// "Rounded-code" decode for the variants with BM <= kFastMaxBM: the table holds the code pairs already rounded to
// the input dtype (32 copies of 4 bytes), a pair is one PRMT + one 4-byte shared load, and the absmax is applied
// in float32 to each step's product (a per-step accumulator, added to the running one with one FFMA per element
// after the step's wgmma). The products are then x times the code rounded to the input dtype, not times the
// exactly dequantized weight: the arithmetic of gemv_mma.cu's kernels (about 1.6x cuBLAS's error with bf16).
// Needs one absmax per row and step: blocksize >= 64 (a requirement of this kernel anyway).
// H200 (commit 4ab29c6): 1.10-1.18x faster than the exact decode at BM 16 / 32, 1.03-1.08x at BM 64 (127-128
// registers); the exact decode keeps BM >= 64 (M > 32).
constexpr int kFastMaxBM = 32;

// Statistics in quads: where every row's statistics for 4 steps sit in one aligned word (8-bit codes) or 16-byte
// chunk (float absmax): K % 256 == 0, 4-step aligned splits, aligned absmax. One copy per row per 4 steps
// instead of one per step (H200: the per-step statistics copies cost 10-26% of the kernel's time); a ring of
// three slots of 16 bytes per row (row r: float chunk at 16 r; nested: code word at 4 r, nested absmax at 4 BN + 4 r).

// Variants with BM <= kTrimMaxBM keep the per-step bookkeeping off the issue slots: the weight ring slot is carried
// from step to step instead of taken modulo kWStages, the statistics quads have 4 slots (a mask, not a modulo by
// 3), the x tile descriptors are one add from a base worked out once, and the weight copy source is a base pointer
// plus 32 bytes per step; the loop runs 4 steps per iteration, so a step's place in its statistics quad is a
// constant, and with blocksize 64 a row's 4 absmax of a quad are read at once. Same data, same arithmetic: only the
// instructions that find it change. H200 (commit 0e313c3, A / B against the untrimmed kernel): 1.01-1.16x at
// M = 16, 1.05-1.13x at M = 32 on the 17 model weights of >= 8 MB.
constexpr int kTrimMaxBM = 32;
// ... and so do BM >= kTrimFromBM (H200, commit 978cefa, A / B against the untrimmed build: M = 128 15 of 17 faster,
// up to 7%, two 3-4% slower; M = 256 14 of 17 faster, up to 10%). BM 64 stays untrimmed: trimmed, its non-nested
// variant needs more than the 128 registers of two blocks per SM (16 bytes of spills).
constexpr int kTrimFromBM = 128;

template <int BM, int BN = kBN> struct Cfg {
  // x ring stages (x loads run kXStages - 1 steps ahead, weights kWStages - 1, see the main loop) and resident
  // blocks per SM: BM <= 64 fits two blocks (<= 128 registers), the others one (shared memory keeps it at two)
  static constexpr int kXStages = 4;
  static constexpr int kBlocks = BM <= 64 && BN == kBN ? 2 : 1;
  static constexpr bool kTrim = BM <= kTrimMaxBM || BM >= kTrimFromBM;
  static constexpr int kQuadSlots = kTrim ? 4 : 3;
  // the trimmed variants also take the block barrier and issue their copies every other step only (H200, commit
  // 2e31c4e: 0.5-2% at M = 16, 1-3.6% at M = 32 against one barrier per step)
  static constexpr bool kPair = kTrim;
  static_assert(!kPair || kXStages == 4, "paired steps: x stage i & 3, even-step refills");
  static constexpr int kXBytes = BM * kStep * 2;  // BM rows x 128 bytes
  static constexpr int kRing = kXStages * kXBytes;
  static constexpr int kOutRow = (BN + 8) * 2;    // bytes per staged output row (padded: no bank conflicts)
  // alignment slack, table + weights, x ring, nested code, statistics quads, x stage barriers
  static constexpr int kSmem = 1024 + kTableBytes + kRing + 1024 + kQuadSlots * Rows<BN>::kQuadBytes + 8 * kXStages;
  static_assert(kBlocks * (kSmem + 1024) <= 228 * 1024, "resident blocks fit in shared memory");
  static_assert(BM * kOutRow <= kRing, "the output staging reuses the x ring");
};

template <typename T, int N> struct Wgmma;
// wrappers generated by gen_wgmma.py beside this file (operand lists of m64nBMk16 with A from registers)
template <> struct Wgmma<__nv_bfloat16, 8> {
  static __device__ __forceinline__ void run(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__half, 8> {
  static __device__ __forceinline__ void run(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
        "{%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 16> {
  static __device__ __forceinline__ void run(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, "
        "{%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__half, 16> {
  static __device__ __forceinline__ void run(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, "
        "{%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 32> {
  static __device__ __forceinline__ void run(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__half, 32> {
  static __device__ __forceinline__ void run(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 64> {
  static __device__ __forceinline__ void run(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__half, 64> {
  static __device__ __forceinline__ void run(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 128> {
  static __device__ __forceinline__ void run(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__half, 128> {
  static __device__ __forceinline__ void run(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 256> {
  static __device__ __forceinline__ void run(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
        "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
        "{%128,%129,%130,%131}, %132, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};
template <> struct Wgmma<__half, 256> {
  static __device__ __forceinline__ void run(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
        "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
        "{%128,%129,%130,%131}, %132, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(size));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// one 2D TMA load of x: box (64 columns from k, BM rows from m) into a 1024-byte aligned stage
__device__ __forceinline__ void tma_x(uint32_t dst, const CUtensorMap* map, int k, int m, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(m), "r"(bar) : "memory");
}
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
  return v;
}
template <int n>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int n>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(n) : "memory"); }
template <int n>
__device__ __forceinline__ void fence_acc(float (&d)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// a value the compiler must keep in a register (not work out again where it is used)
__device__ __forceinline__ uint32_t pin32(uint32_t v) {
  asm volatile("" : "+r"(v));
  return v;
}

__device__ __forceinline__ const void* aligned_down(const void* p, uintptr_t align) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) & ~(align - 1));
}

// wgmma shared-memory descriptor: K-major tile with the 128-byte swizzle, 8-row groups 1024 bytes apart
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) | (1ull << 16) | (static_cast<uint64_t>(1024 >> 4) << 32) |
         (1ull << 62);
}

// Shared-memory loads of data that copies fill (weights, statistics) carry a memory clobber, so the compiler keeps
// them after the cp.async wait and the block barrier (the SASS of this kernel is the same with or without).
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a)
               : "memory");
  return v;
}

// codes of byte t of w (t = this lane's byte, folded into sel): PRMT -> (byte << 8) + 8 lane, one 8-byte load;
// times the absmax in float32, rounded once: the A register (low half = the high nibble's value = lower k)
template <typename T>
__device__ __forceinline__ uint32_t decode_pair(uint32_t table_s, uint32_t lane8, uint32_t sel, uint32_t w, float a) {
  float hi, lo;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(hi), "=f"(lo) : "r"(table_s + __byte_perm(w, lane8, sel)));
  return Pair<T>::make(__fmul_rn(hi, a), __fmul_rn(lo, a));
}

// Distributed shared memory (thread block clusters, sm_90): the shared address of the same variable in the block of
// cluster rank r and loads from it (the cluster-wide barrier: nf4_device.cuh's cluster_barrier).
__device__ __forceinline__ uint32_t cluster_map(uint32_t saddr, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(saddr), "r"(rank));
  return r;
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(a) : "memory");
  return v;
}

// Split-K end of a cluster launch (Params::cluster = S parts of one weight row tile, cluster rank = part): every
// block stores its float32 tile (x row m, weight row r) at red_s + 4 (kRedRow m + r) (rows padded by 4 floats: the
// fragment's stores hit 32 banks), then block `part` sums groups [part G / S, (part + 1) G / S) of the G = 32 BM
// groups of 4 adjacent weight rows over the S blocks in rank order (the order of splitk_sum: same bits), adds the
// bias, rounds once and stores y. The second barrier keeps every block's shared memory alive until all have read it.
constexpr int kRedRow = kBN + 4;
constexpr int kClusterMaxBM = 64;  // the variants built with it (the partial tile in the table region; the host checks)
template <typename T, int BM>
__device__ __forceinline__ void cluster_sum(const Params& p, const float (&acc)[BM / 2], uint32_t red_s, int part,
                                            long long m0, long long n0, int ra, int rb, int tid, int t) {
  static_assert(BM * kRedRow * 4 <= kTableBytes, "the partial tile fits in the table region");
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 8 * j + 2 * t + (e & 1);
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(red_s + 4u * (m * kRedRow + (e < 2 ? ra : rb))),
                   "f"(acc[4 * j + e]) : "memory");
    }
  }
  cluster_barrier();
  const int parts = static_cast<int>(p.cluster);
  constexpr int kGroups = BM * kBN / 4;
  const int g0 = part * kGroups / parts, g1 = (part + 1) * kGroups / parts;
  for (int q = g0 + tid; q < g1; q += kThreads) {
    const int m = q / (kBN / 4), r = 4 * (q % (kBN / 4));
    const uint32_t a = red_s + 4u * (m * kRedRow + r);
    float4 v[8];
#pragma unroll
    for (int z = 0; z < 8; ++z)
      if (z < parts) v[z] = ld_cluster_f4(cluster_map(a, z));  // all in flight before the adds
    float4 s = v[0];
#pragma unroll
    for (int z = 1; z < 8; ++z)
      if (z < parts) s.x += v[z].x, s.y += v[z].y, s.z += v[z].z, s.w += v[z].w;
    const long long row = m0 + m, n = n0 + r;
    if (row >= p.M) continue;
    const float o[4] = {s.x, s.y, s.z, s.w};
    uint16_t h[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      h[e] = Pair<T>::bits(p.bias != nullptr && n + e < p.N ? o[e] + Pair<T>::load(p.bias, n + e) : o[e]);
    uint16_t* dst = reinterpret_cast<uint16_t*>(p.y) + row * p.N + n;
    if (n + 3 < p.N && (reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(h[0] | (uint32_t(h[1]) << 16), h[2] | (uint32_t(h[3]) << 16));
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (n + e < p.N) dst[e] = h[e];
    }
  }
  cluster_barrier();
}

// rounded-code decode: PRMT -> (byte << 8) + 4 lane, one 4-byte load of the pair already in the input dtype
__device__ __forceinline__ uint32_t decode_pair_rounded(uint32_t table_s, uint32_t lane4, uint32_t sel, uint32_t w) {
  return lds32(table_s + __byte_perm(w, lane4, sel));
}

template <typename T, int BM, bool kNested, bool kFast, int BN>
__global__ void __launch_bounds__(Rows<BN>::kThreads, Cfg<BM, BN>::kBlocks) nf4_wgmma(const __grid_constant__ KParams kp) {
  using C = Cfg<BM, BN>;
  using R = Rows<BN>;
  constexpr int kBN = BN, kThreads = R::kThreads, kHoles = R::kHoles, kWStages = R::kWStages;
  constexpr int kQuadBytes = R::kQuadBytes, kWHoles = R::kWHoles, kSHoles = R::kSHoles;
  const Params& p = kp.p;
  constexpr int kAcc = BM / 2, kXStages = C::kXStages;
  // prefetch distances in steps: x is issued kXD steps before its wgmma, the weights and statistics kWD before
  // their decode; copy group u (one per step) carries the weights of step u and the x tile of step u - kLag
  constexpr int kXD = kXStages - 1, kLag = kWStages - kXD;
  static_assert(kLag >= 0, "weights run at least as far ahead as x");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t table_s = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t ring_s = table_s + kTableBytes;
  uint8_t* ring = smem_raw + (ring_s - smem_addr(smem_raw));
  float* ncode = reinterpret_cast<float*>(ring + C::kRing);
  const uint32_t quad_s = ring_s + C::kRing + 1024;
  const uint32_t bars = quad_s + C::kQuadSlots * kQuadBytes;  // kXStages mbarriers: x stage landed (TMA bytes)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3, g = lane >> 2;
  // with a split tail, the sum kernel is launched as this grid's programmatic dependent: let it be put on the GPU
  // now (it waits for this grid's completion before touching memory, see splitk_sum)
  if (p.tail_tiles > 0 && p.cluster <= 1) pdl_launch_dependents();
  const long long m0 = static_cast<long long>(blockIdx.x) * BM;
  // (a cluster launch is a grid of (x tiles, tail_tiles, S) with clusters along z: blockIdx.z is the part)
  const long long tail_j = static_cast<long long>(blockIdx.y) + gridDim.y * blockIdx.z - p.full_tiles;
  const bool is_part = tail_j >= 0;  // a split part of a tail tile (writes float32 partial sums)
  const long long n_tile = is_part ? p.full_tiles + tail_j % p.tail_tiles : blockIdx.y;
  const long long split = is_part ? tail_j / p.tail_tiles : 0;
  const long long n0 = n_tile * kBN;
  const long long steps = p.K / kStep;
  const long long s_begin = split * p.steps_per_split;
  const int nsteps = static_cast<int>(is_part ? min(steps, s_begin + p.steps_per_split) - s_begin : steps);
  auto kstep = [&](int u) -> long long { return s_begin + u; };

  // code-pair table: entry v = (code[v >> 4], code[v & 15]) in float32, 16 copies (rounded-code decode: in the
  // input dtype, 32 copies)
  {
    if (kThreads == 256 || tid < 256) {  // (one thread per table entry)
      const float hi = p.code[tid >> 4], lo = p.code[tid & 15];
      if constexpr (kFast) {
        const uint32_t pr = Pair<T>::make(hi, lo);
#pragma unroll
        for (int i = 0; i < 8; ++i)
          asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(table_s + 256 * tid + 16 * i), "r"(pr));
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %1, %2};\n" ::"r"(table_s + 256 * tid + 16 * i), "f"(hi),
                       "f"(lo));
      }
      if constexpr (kNested) ncode[tid] = p.nested_code[tid];
    }
    if (tid == 0) {
      for (int i = 0; i < kXStages; ++i) mbar_init(bars + 8 * i, 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kp.xmap)) : "memory");
    }
    __syncthreads();  // barriers initialised before any copy
  }
  const float offset = kNested ? *p.offset : 0.f;

  // hole h of the weight ring at table_s + 256 h + 128; offsets below are relative to a stage's first hole
  auto hole = [](int h) { return static_cast<uint32_t>(256 * h + 128); };
  // the lane's two weight rows (local) and their statistics words
  const int ra = 64 * (warp >> 2) + 16 * (warp & 3) + g, rb = ra + 8;
  const uint32_t lane_off = kFast ? 4u * lane : 8u * (lane & 15);  // this lane's copy in a table entry
  const uint32_t sel = 0x5504u | (static_cast<uint32_t>(t) << 4);
  const uint32_t wa_off = hole(ra >> 2) + 32 * (ra & 3), wb_off = hole(rb >> 2) + 32 * (rb & 3);
  const uint32_t qa_off = hole(kWHoles + (ra >> 5)) + 4 * (ra & 31), qb_off = hole(kWHoles + (rb >> 5)) + 4 * (rb & 31);
  const uint32_t rka = static_cast<uint32_t>(min(n0 + ra, p.N - 1) * p.K);
  const uint32_t rkb = static_cast<uint32_t>(min(n0 + rb, p.N - 1) * p.K);
  const uint32_t lb = static_cast<uint32_t>(p.log2_blocksize);
  const bool quad = (p.K & 255) == 0 && (p.steps_per_split & 3) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.absmax) & (kNested ? 3 : 15)) == 0;
  // a statistic's place in its aligned word (8-bit codes) / 16-byte chunk (float absmax): (address / element size
  // + block) & 3; the low 32 bits of the address suffice
  const uint32_t elem_lo = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p.absmax)) >> (kNested ? 0 : 2);

  // copies of one step: thread 0 starts the TMA load of the x tile; thread tid copies half (tid & 1) of weight
  // row tid / 2 and one statistics word: the absmax (plain) or the aligned word holding the 8-bit code (nested) of
  // row tid (tid < BN), the nested absmax of row tid - BN (nested, tid >= BN). Rows past N take row N - 1 (never
  // stored); x rows past M arrive as zeros.
  const int wr = tid >> 1, wh = tid & 1;
  const bool w_ok = n0 + wr < p.N;
  const uint8_t* w_src = p.packed + (w_ok ? (n0 + wr) * (p.K / 2) + 16 * wh : 0);
  const uint32_t w_dst = hole(wr >> 2) + 32 * (wr & 3) + 16 * wh;
  const int sr = kBN == 128 ? tid & 127 : tid % kBN;  // (the mask keeps the 128-row builds' code as it was)
  const bool s_nab = kNested && tid >= kBN;  // this thread copies the nested absmax
  const bool s_on = kNested || tid < kBN;
  const long long s_rowk = min(n0 + sr, p.N - 1) * p.K;
  const uint32_t s_dst = hole((s_nab ? kWHoles + kSHoles : kWHoles) + (sr >> 5)) + 4 * (sr & 31);

  // weight ring slot (step i's slot is i % kWStages; the trimmed variants carry it instead of dividing)
  auto slot_base = [&](int slot) { return table_s + static_cast<uint32_t>(slot * kHoles * 256); };
  auto x_stage = [&](int i) { return ring_s + static_cast<uint32_t>((i % kXStages) * C::kXBytes); };
  // the statistics quad slot of step i
  auto quad_at = [&](int i) { return quad_s + static_cast<uint32_t>(((i >> 2) % C::kQuadSlots) * kQuadBytes); };
  // Trimmed variants with BM >= kTrimFromBM (kRun): the copy sources are running pointers of the loop's 4-step
  // iteration (base step i0, a multiple of 4), so a copy's source is a pointer plus a constant (rel = u - i0, known
  // where the loop is unrolled), and the destinations are kept registers plus a uniform slot offset: no 64-bit index
  // arithmetic per copy (H200, commit 9786223, with the statistics shuffle below: 2-2.5% faster at M = 128, 1.5% at
  // M = 512 over the 17 model weights; 1-2.4% slower at M = 16 / 32, so BM <= 32 keep w_base + u w_stride). Rows
  // past N copy zero bytes from the packed base (+ 32 bytes per step stays inside the allocation: u < nsteps <=
  // K / 64). Statistics quads with blocksize 64 (quad64): the row's block of step u is s_e0 + u.
  constexpr bool kRun = C::kTrim && BM >= kTrimFromBM;
  const uint8_t* w_base = w_ok ? w_src + s_begin * (kStep / 2) : p.packed;
  const int w_stride = w_ok ? kStep / 2 : 0;
  const bool run_q64 = quad && lb == 6;
  const long long s_e0 = (s_rowk >> 6) + s_begin;
  const uint8_t* w_it = w_base;  // + 32 bytes per step
  const uint8_t* s_it = static_cast<const uint8_t*>(p.absmax) + (kNested ? s_e0 : 4 * s_e0);  // + 1 / 4 bytes per step
  int i0 = 0;
  const uint32_t w_dst_abs = kRun ? pin32(table_s + w_dst) : 0u;
  const uint32_t q_dst_abs = kRun ? pin32(quad_s + (kNested ? (s_nab ? 4 * kBN : 0) + 4 * sr : 16 * sr)) : 0u;
  // the x tile of step v (thread 0, 0 <= v < nsteps)
  auto load_x = [&](int v) {
    const uint32_t bar = bars + 8 * (v % kXStages);
    mbar_expect(bar, C::kXBytes);
    tma_x(x_stage(v), &kp.xmap, static_cast<int>(kstep(v) * kStep), static_cast<int>(m0), bar);
  };
  // copy group u (weight ring slot u % kWStages, or `slot` in the trimmed variants, with rel = u - i0): the weights
  // and statistics of step u and (x_too) the x tile of step u - kLag, those that exist; checked: u < nsteps is not
  // known by the caller
  auto load_group = [&](int u, int slot, int rel, bool x_too = true, bool checked = true) {
    if (!checked || u < nsteps) {
      const long long k0 = kstep(u) * kStep;
      const uint32_t ws = slot_base(C::kTrim ? slot : u % kWStages);
      if constexpr (kRun) {
        cp_async16(w_dst_abs + static_cast<uint32_t>(slot * kHoles * 256), w_it + rel * (kStep / 2), w_ok ? 16 : 0);
      } else if constexpr (C::kTrim) {
        cp_async16(ws + w_dst, w_base + u * w_stride, w_ok ? 16 : 0);
      } else {
        cp_async16(ws + w_dst, w_ok ? w_src + k0 / 2 : p.packed, w_ok ? 16 : 0);
      }
      if (kRun && run_q64) {
        if ((rel & 3) == 0 && s_on) {  // once per 4 steps, for steps u .. u + 3
          const uint32_t dst = q_dst_abs + static_cast<uint32_t>((((i0 + rel) >> 2) & 3) * kQuadBytes);
          if constexpr (kNested) {
            cp_async4(dst, s_nab ? static_cast<const void*>(p.nested_absmax + ((s_e0 + i0 + rel) >> 8))
                                 : static_cast<const void*>(s_it + rel));
          } else {
            cp_async16(dst, s_it + 4 * rel, 16);
          }
        }
      } else if (s_on && (!quad || (u & 3) == 0)) {  // quads: once per 4 steps, for steps u .. u + 3
        const long long blk = (s_rowk + k0) >> p.log2_blocksize;
        const uint32_t dst = quad ? quad_at(u) + (kNested ? (s_nab ? 4 * kBN : 0) + 4 * sr : 16 * sr) : ws + s_dst;
        if constexpr (kNested) {
          cp_async4(dst, s_nab ? static_cast<const void*>(p.nested_absmax + (blk >> 8))
                               : aligned_down(static_cast<const uint8_t*>(p.absmax) + blk, 4));
        } else if (quad) {
          cp_async16(dst, aligned_down(static_cast<const float*>(p.absmax) + blk, 16), 16);
        } else {
          cp_async4(dst, static_cast<const float*>(p.absmax) + blk);
        }
      }
    }
    const int v = u - kLag;
    if (x_too && tid == 0 && v >= 0 && v < nsteps) load_x(v);
  };
  // x of step i landed (the stage's (i / kXStages)-th use)
  auto wait_x = [&](int i) { mbar_wait(bars + 8 * (i % kXStages), (i / kXStages) & 1); };

  // the absmax of local row r for step i, from its statistics quad or its words in the weight stage
  auto absmax = [&](uint32_t ws, uint32_t q_off, int r, uint32_t rk, int i) -> float {
    const uint32_t blk = (rk + static_cast<uint32_t>(kstep(i) * kStep)) >> lb;
    // the row's words: in its quad slot (float chunk at 16 r; code word at 4 r, nested absmax 4 BN bytes further)
    // or in the weight stage (at q_off; nested absmax BN / 32 holes further)
    const uint32_t at = quad ? quad_at(i) + (kNested ? 4 : 16) * r : ws + q_off;
    if constexpr (kNested) {
      const uint32_t q = (lds32(at) >> (8 * ((elem_lo + blk) & 3))) & 255u;
      // as bitsandbytes: two roundings
      return __fadd_rn(__fmul_rn(ncode[q], __uint_as_float(lds32(at + (quad ? 4 * kBN : 256 * kSHoles)))), offset);
    } else {
      return __uint_as_float(lds32(quad ? at + 4 * ((elem_lo + blk) & 3) : at));
    }
  };

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

  // decode of step i's A fragments (16 registers: 4 k16 sub-steps x 4) from its weight stage; sa / sb: the absmax
  // of the lane's two rows (applied here, or to the step's product with the rounded-code decode)
  // Trimmed variants with blocksize 64 and statistics quads: a row's 4 absmax of a quad are read at once, at its
  // first step, and step i's is the (i & 3)-th (the quad is aligned: K % 256 == 0, splits of whole quads, aligned
  // statistics). The loop runs 4 steps per iteration, so i & 3 is known where it is used.
  const bool quad64 = C::kTrim && quad && lb == 6;
  float qa[4], qb[4];  // the absmax of rows ra / rb for the steps of the current quad
  auto read_quad = [&](int i, int r, float (&q)[4]) {
    const uint32_t at = quad_at(i) + (kNested ? 4 : 16) * r;
    if constexpr (kNested) {
      const uint32_t codes = lds32(at), nab = lds32(at + 4 * kBN);
#pragma unroll
      for (int e = 0; e < 4; ++e)  // as bitsandbytes: two roundings
        q[e] = __fadd_rn(__fmul_rn(ncode[(codes >> (8 * e)) & 255u], __uint_as_float(nab)), offset);
    } else {
      const uint4 v = lds128(at);
      q[0] = __uint_as_float(v.x), q[1] = __uint_as_float(v.y), q[2] = __uint_as_float(v.z), q[3] = __uint_as_float(v.w);
    }
  };
  // Nested statistics quads: the 4 lanes of a lane quad share rows ra / rb, so lane t works out only
  // step t's absmax of the quad for each, and every step takes its pair from lane jq of the quad by a shuffle
  float qa_own = 0.f, qb_own = 0.f;
  auto quad_own = [&](int i, int r) -> float {
    const uint32_t at = quad_at(i) + 4 * r;
    const uint32_t codes = lds32(at), nab = lds32(at + 4 * kBN);
    return __fadd_rn(__fmul_rn(ncode[(codes >> (8 * t)) & 255u], __uint_as_float(nab)), offset);
  };
  // jq: i & 3 where the caller knows it (trimmed variants), else -1
  auto decode = [&](int i, int slot, uint32_t (&f)[16], float& sa, float& sb, int jq) {
    const uint32_t ws = slot_base(C::kTrim ? slot : i % kWStages);
    if (C::kTrim && jq >= 0 && quad64) {
      if constexpr (kNested && kRun) {
        if (jq == 0) {
          qa_own = quad_own(i, ra);
          qb_own = quad_own(i, rb);
        }
        sa = __shfl_sync(0xffffffffu, qa_own, jq & 3, 4);
        sb = __shfl_sync(0xffffffffu, qb_own, jq & 3, 4);
      } else {
        if (jq == 0) {
          read_quad(i, ra, qa);
          read_quad(i, rb, qb);
        }
        sa = qa[jq & 3];
        sb = qb[jq & 3];
      }
    } else {
      sa = absmax(ws, qa_off, ra, rka, i);
      sb = absmax(ws, qb_off, rb, rkb, i);
    }
    const uint4 a0 = lds128(ws + wa_off), a1 = lds128(ws + wa_off + 16);
    const uint4 b0 = lds128(ws + wb_off), b1 = lds128(ws + wb_off + 16);
    const uint32_t wa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const uint32_t wb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    if constexpr (kFast) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        f[4 * s + 0] = decode_pair_rounded(table_s, lane_off, sel, wa[2 * s]);
        f[4 * s + 1] = decode_pair_rounded(table_s, lane_off, sel, wb[2 * s]);
        f[4 * s + 2] = decode_pair_rounded(table_s, lane_off, sel, wa[2 * s + 1]);
        f[4 * s + 3] = decode_pair_rounded(table_s, lane_off, sel, wb[2 * s + 1]);
      }
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        f[4 * s + 0] = decode_pair<T>(table_s, lane_off, sel, wa[2 * s], sa);
        f[4 * s + 1] = decode_pair<T>(table_s, lane_off, sel, wb[2 * s], sb);
        f[4 * s + 2] = decode_pair<T>(table_s, lane_off, sel, wa[2 * s + 1], sa);
        f[4 * s + 3] = decode_pair<T>(table_s, lane_off, sel, wb[2 * s + 1], sb);
      }
    }
  };

  // prologue: copy groups 0 .. kWStages - 1 (one commit group each, empty ones past the end)
#pragma unroll
  for (int u = 0; u < kWStages; ++u) {
    load_group(u, u, u);
    cp_async_commit();
  }
  cp_async_wait<kWStages - 1>();  // group 0 (the weights of step 0) landed
  __syncthreads();                // ... for every thread's copies; table and nested codes written
  uint32_t fa[16], fb[16];
  float sa_cur, sb_cur, sa_next = 0.f, sb_next = 0.f;
  decode(0, 0, fa, sa_cur, sb_cur, C::kTrim ? 0 : -1);
  int wslot = 0;  // weight ring slot of the current step (trimmed variants)
  // the wgmma descriptor of x sub-step s (k16) of step i
  const uint64_t xdesc0 = desc_sw128(ring_s);
  // trimmed variants: x stage i % kXStages, known from j = i & 3 with 4 stages
  auto x_slot = [&](int i, int j) { return kXStages == 4 ? j : i % kXStages; };
  auto x_desc = [&](int i, int j, int s) -> uint64_t {
    if constexpr (C::kTrim) {
      return xdesc0 + static_cast<uint32_t>((x_slot(i, j) * C::kXBytes + 32 * s) >> 4);
    } else {
      return desc_sw128(x_stage(i) + 32 * s);
    }
  };
  // rounded-code decode: this step's product (its own accumulator), scaled and added after the wgmma
  float part[kFast ? kAcc : 1];

  // one K step: its wgmma on the fragments ``cur`` (absmax ca / cb), the next step's decode into ``nxt`` (na / nb);
  // more: i + 1 < nsteps. Trimmed variants: j = i & 3 (a constant there) and par = (i >> 2) & 1 (x stage parity
  // with 4 stages), worked out once per 4 steps; else -1 / unused.
  auto step = [&](int i, int j, uint32_t par, bool more, uint32_t (&cur)[16], uint32_t (&nxt)[16], float ca, float cb,
                  float& na, float& nb) {
    if constexpr (C::kTrim) {
      mbar_wait(bars + 8 * x_slot(i, j), (kXStages == 4 ? par : i / kXStages) & 1);
    } else {
      wait_x(i);
    }
    if constexpr (kFast) {
#pragma unroll
      for (int r = 0; r < kAcc; ++r) part[r] = 0.f;
      fence_acc(part);
    }
    fence_acc(acc);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if constexpr (kFast) {
        Wgmma<T, BM>::run(part, cur[4 * s], cur[4 * s + 1], cur[4 * s + 2], cur[4 * s + 3], x_desc(i, j, s));
      } else {
        Wgmma<T, BM>::run(acc, cur[4 * s], cur[4 * s + 1], cur[4 * s + 2], cur[4 * s + 3], x_desc(i, j, s));
      }
    }
    wgmma_commit();
    fence_acc(acc);
    if constexpr (kFast) fence_acc(part);
    if (more) {
      // trimmed variants: the ring slots of step i (refilled now with step i + kWStages) and of step i + 1
      const int slot = wslot, slot1 = slot + 1 == kWStages ? 0 : slot + 1;
      wslot = slot1;
      // group i + 1 (the weights of step i + 1) landed. The barrier also means every warpgroup finished step
      // i - 1's wgmma (waited for at the end of the previous step) and step i's decode, so x stage (i - 1) and
      // weight stage i can be refilled: group i + kWStages carries the weights of step i + kWStages, and x of
      // step i + kXD goes with it.
      if constexpr (C::kPair) {
        // paired variants: a barrier and copies at even steps only. Steps i + 1 and i + 2 are decoded before the
        // next barrier, so groups up to i + 2 must have landed; every warp has decoded steps i - 1 and i and
        // finished the wgmma of steps i - 2 and i - 1, so their weight slots take groups i + kWStages - 1 and
        // i + kWStages (at i = 0 only the latter: the prologue issued the former), and x of steps i + kXD - 1
        // and i + kXD goes with them into the x stages of steps i - 2 and i - 1.
        if ((j & 1) == 0) {
          cp_async_wait<kWStages - 4>();
          __syncthreads();
          const int slot0 = slot == 0 ? kWStages - 1 : slot - 1;
          if (kRun && i > 0 && i + kWStages < nsteps) {
            // the steady state: both groups and both x tiles exist (no per-group bounds checks, one x branch)
            load_group(i + kWStages - 1, slot0, j + kWStages - 1, false, false);
            cp_async_commit();
            load_group(i + kWStages, slot, j + kWStages, false, false);
            cp_async_commit();
            if (tid == 0) {
              load_x(i + kWStages - 1 - kLag);
              load_x(i + kWStages - kLag);
            }
          } else {
            if (i > 0) {
              load_group(i + kWStages - 1, slot0, j + kWStages - 1);
              cp_async_commit();
            }
            load_group(i + kWStages, slot, j + kWStages);
            cp_async_commit();
          }
        }
      } else {
        cp_async_wait<kWStages - 2>();
        __syncthreads();
        load_group(i + kWStages, slot, j + kWStages);
        cp_async_commit();
      }
      decode(i + 1, slot1, nxt, na, nb, j < 0 ? -1 : (j + 1) & 3);  // overlaps step i's wgmma
    }
    wgmma_wait<0>();
    if constexpr (kFast) {
      fence_acc(part);  // the step's product is complete only after the wait
#pragma unroll
      for (int r = 0; r < kAcc; ++r) acc[r] = fmaf((r & 2) ? cb : ca, part[r], acc[r]);
    }
    // wgmma reads its A registers asynchronously: keep this step's fragments alive (unchanged) until here, so the
    // next step's decode cannot be given the same registers
#pragma unroll
    for (int r = 0; r < 16; ++r) asm volatile("" ::"r"(cur[r]) : "memory");
  };
  if constexpr (C::kTrim) {
    // four steps per iteration: i & 3 is a constant in each (x stage, statistics quad place)
    for (int i = 0; i < nsteps; i += 4) {
      const uint32_t par = (i >> 2) & 1;
      step(i, 0, par, i + 1 < nsteps, fa, fb, sa_cur, sb_cur, sa_next, sb_next);
      if (i + 1 < nsteps) step(i + 1, 1, par, i + 2 < nsteps, fb, fa, sa_next, sb_next, sa_cur, sb_cur);
      if (i + 2 < nsteps) step(i + 2, 2, par, i + 3 < nsteps, fa, fb, sa_cur, sb_cur, sa_next, sb_next);
      if (i + 3 < nsteps) step(i + 3, 3, par, i + 4 < nsteps, fb, fa, sa_next, sb_next, sa_cur, sb_cur);
      i0 += 4;  // the copy sources' base step
      w_it += 4 * (kStep / 2);
      s_it += kNested ? 4 : 16;
    }
  } else {
    for (int i = 0; i < nsteps; ++i) {
      step(i, -1, 0, i + 1 < nsteps, fa, fb, sa_cur, sb_cur, sa_next, sb_next);
      sa_cur = sa_next;
      sb_cur = sb_next;
#pragma unroll
      for (int r = 0; r < 16; ++r) fa[r] = fb[r];
    }
  }
  fence_acc(acc);
  cp_async_wait<0>();
  __syncthreads();
  // accumulator fragment: acc[4 j + e] = (weight row ra / rb for e < 2 / >= 2, x row 8 j + 2 t + (e & 1))
  const long long na = n0 + ra, nb = n0 + rb;
  if constexpr (BM <= kClusterMaxBM) {
    if (p.cluster > 1) {  // (then full_tiles = 0: every block is a part)
      static_assert(BN == fastnf4_wg::kBN, "cluster sums: the 128-row builds");
      cluster_sum<T, BM>(p, acc, table_s, static_cast<int>(split), m0, n0, ra, rb, tid, t);
      return;
    }
  }
  if (is_part) {
    const long long col0 = p.full_tiles * kBN, w = p.N - col0;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long m = m0 + 8 * j + 2 * t + (e & 1), n = e < 2 ? na : nb;
        if (m < p.M && n < p.N) p.y32[(split * p.M + m) * w + n - col0] = acc[4 * j + e];
      }
    }
    return;
  }
  const float bias_a = (p.bias != nullptr && na < p.N) ? Pair<T>::load(p.bias, na) : 0.f;
  const float bias_b = (p.bias != nullptr && nb < p.N) ? Pair<T>::load(p.bias, nb) : 0.f;
  uint16_t* stage = reinterpret_cast<uint16_t*>(ring);
  constexpr int kRowH = C::kOutRow / 2;
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 8 * j + 2 * t + (e & 1);
      stage[m * kRowH + (e < 2 ? ra : rb)] = Pair<T>::bits(acc[4 * j + e] + (e < 2 ? bias_a : bias_b));
    }
  }
  __syncthreads();
  const bool vec = (p.N % 8) == 0;
  constexpr int kPieces = kBN / 8;  // 16-byte pieces per row of y
#pragma unroll
  for (int c0 = 0; c0 < BM * kPieces; c0 += kThreads) {
    const int c = c0 + tid, r = kBN == 128 ? c >> 4 : c / kPieces, q = kBN == 128 ? c & 15 : c % kPieces;
    const long long m = m0 + r, n = n0 + 8 * q;
    // (BM 8: 128 pieces, 256 threads)
    if ((BM * kPieces % kThreads != 0 && r >= BM) || m >= p.M || n >= p.N) continue;
    const uint16_t* src = stage + r * kRowH + 8 * q;
    uint16_t* dst = reinterpret_cast<uint16_t*>(p.y) + m * p.N + n;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && n + e < p.N; ++e) dst[e] = src[e];
    }
  }
}

// Columns col0 .. N - 1 of y (the split tail, W = N - col0 wide) = the sum of the S float32 partial slices
// [S, M, W] in split order (+ bias), rounded once to the output dtype. One launch over the whole GPU (an in-kernel
// settle by the block completing each tile is 1.5-2x slower: NOTES.md "Hopper prefill kernel"; torch's sum + copy
// takes two launches). Each thread takes 4 adjacent columns of a row (16-byte loads) where W and N are multiples of 4
// and y is 8-byte aligned, else one; rows over blockIdx.y, column groups over blockIdx.x and the threads.
template <typename T, int kVec>
__global__ void __launch_bounds__(256) splitk_sum(const float* __restrict__ y32, const void* bias, void* y, int splits,
                                                  long long rows, long long w, long long col0, long long n) {
  // launched with programmatic stream serialization: wait until the wgmma grid has finished and its partial sums
  // are visible (a no-op without the launch attribute)
  pdl_wait();
  const long long mw = rows * w, groups = w / kVec;
  for (long long m = blockIdx.y; m < rows; m += gridDim.y) {
    for (long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
         g += static_cast<long long>(gridDim.x) * blockDim.x) {
      const long long i = m * w + kVec * g, c = col0 + kVec * g;
      float v[kVec];
      if constexpr (kVec == 4) {
        float4 a = __ldcs(reinterpret_cast<const float4*>(y32 + i));
        for (int z = 1; z < splits; ++z) {
          const float4 b = __ldcs(reinterpret_cast<const float4*>(y32 + z * mw + i));
          a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
        }
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
      } else {
        v[0] = 0.f;
        for (int z = 0; z < splits; ++z) v[0] += __ldcs(y32 + z * mw + i);
      }
      uint16_t out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = Pair<T>::bits(bias != nullptr ? v[e] + Pair<T>::load(bias, c + e) : v[e]);
      uint16_t* dst = reinterpret_cast<uint16_t*>(y) + m * n + c;
      if constexpr (kVec == 4) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(out[0] | (uint32_t(out[1]) << 16), out[2] | (uint32_t(out[3]) << 16));
      } else {
        dst[0] = out[0];
      }
    }
  }
}

template <typename T>
void launch_sum(const Params* p, int splits, long long w, long long col0, cudaStream_t stream) {
  const bool vec = w % 4 == 0 && p->N % 4 == 0 && reinterpret_cast<uintptr_t>(p->y) % 8 == 0;
  const long long groups = vec ? w / 4 : w;
  // ~8 blocks of 256 threads per SM over the whole GPU (up to 1056), column groups first
  const long long bx = (groups + 255) / 256 < 1056 ? (groups + 255) / 256 : 1056;
  const long long by = 1056 / bx < p->M ? 1056 / bx : p->M;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)bx, (unsigned)(by < 65535 ? by : 65535));
  cfg.blockDim = dim3(256);
  cfg.stream = stream;
  // programmatic dependent launch: the sum grid is scheduled while the wgmma grid runs (it triggers at its start)
  // and waits in splitk_sum for its completion, instead of being launched only after it
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const float* y32 = p->y32;
  const void* bias = p->bias;
  void* y = p->y;
  const long long rows = p->M, n = p->N;
  if (vec) {
    cudaLaunchKernelEx(&cfg, splitk_sum<T, 4>, y32, bias, y, splits, rows, w, col0, n);
  } else {
    cudaLaunchKernelEx(&cfg, splitk_sum<T, 1>, y32, bias, y, splits, rows, w, col0, n);
  }
}

// a variant's kernel, its dynamic shared memory, threads and weight rows per block (kernel null: no such variant);
// the (BM, rows) list lives here only
struct Variant {
  void* f;
  int smem;
  int threads;
  int rows;
};

template <typename T, bool kNested, int BM, int BN = kBN>
Variant variant_of() {
  return {(void*)nf4_wgmma<T, BM, kNested, (BM <= kFastMaxBM), BN>, Cfg<BM, BN>::kSmem, Rows<BN>::kThreads, BN};
}

template <typename T, bool kNested>
Variant pick(int bm, int rows) {
  if (rows == kWideBN) return bm == 128 ? variant_of<T, kNested, 128, kWideBN>() : Variant{nullptr, 0, 0, 0};
  if (rows != kBN) return {nullptr, 0, 0, 0};
  switch (bm) {
    case 8: return variant_of<T, kNested, 8>();
    case 16: return variant_of<T, kNested, 16>();
    case 32: return variant_of<T, kNested, 32>();
    case 64: return variant_of<T, kNested, 64>();
    case 128: return variant_of<T, kNested, 128>();
    case 256: return variant_of<T, kNested, 256>();
  }
  return {nullptr, 0, 0, 0};
}

// The launch of variant v on `grid` in clusters of `size` blocks along z (attr: storage for its one attribute).
cudaLaunchConfig_t cluster_launch(const Variant& v, dim3 grid, int size, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3((unsigned)v.threads);
  cfg.dynamicSmemBytes = (size_t)v.smem;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = 1;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = (unsigned)size;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

Variant variant_for(int dtype, int bm, int nested, int rows) {
  if (dtype == 0) return nested ? pick<__nv_bfloat16, true>(bm, rows) : pick<__nv_bfloat16, false>(bm, rows);
  return nested ? pick<__half, true>(bm, rows) : pick<__half, false>(bm, rows);
}

}  // namespace fastnf4_wg

using fastnf4_wg::Params;

extern "C" {

// Prepares a variant (BM, rows: weight rows per block, see Rows; shared-memory size attribute; loads the module):
// its resident blocks per SM, 0 when it cannot run on this GPU or is not built.
int fastnf4_wgmma_ready(int dtype, int bm, int nested, int rows) {
  const fastnf4_wg::Variant v = fastnf4_wg::variant_for(dtype, bm, nested, rows);
  if (v.f == nullptr) return 0;
  if (cudaFuncSetAttribute(v.f, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, v.f, v.threads, v.smem) !=
      cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return blocks;
}

int fastnf4_wgmma_params_size() { return (int)sizeof(Params); }

// Clusters of `size` blocks (along z) that can be resident at once (cudaOccupancyMaxActiveClusters; 0: none / error).
int fastnf4_wgmma_clusters(int dtype, int bm, int nested, int size) {
  const fastnf4_wg::Variant v = fastnf4_wg::variant_for(dtype, bm, nested, fastnf4_wg::kBN);
  if (v.f == nullptr || size < 2 || size > 8) return 0;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = fastnf4_wg::cluster_launch(v, dim3(1, 1, (unsigned)size), size, 0, &attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, v.f, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

// dtype 0 = bf16, 1 = fp16; rows: weight rows per block (128, or 192 at BM 128); gx x row tiles; p->full_tiles
// whole weight row tiles, then p->tail_tiles of them in
// `splits` parts each (the grid's y: full_tiles + tail_tiles x splits); p->cluster = splits (full_tiles = 0, no y32)
// launches clusters of `splits` blocks that sum the parts themselves; returns a cudaError_t.
int fastnf4_wgmma(const Params* p, int dtype, int bm, int nested, int rows, int gx, int splits, cudaStream_t stream) {
  const fastnf4_wg::Variant v = fastnf4_wg::variant_for(dtype, bm, nested, rows);
  if (v.f == nullptr) return (int)cudaErrorInvalidValue;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      cudaGetLastError();
      return (int)cudaErrorNotSupported;
    }
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  fastnf4_wg::KParams kp;
  kp.p = *p;
  const cuuint64_t dims[2] = {(cuuint64_t)p->K, (cuuint64_t)p->M};
  const cuuint64_t strides[1] = {(cuuint64_t)p->K * 2};
  const cuuint32_t box[2] = {(cuuint32_t)fastnf4_wg::kStep, (cuuint32_t)bm};
  const cuuint32_t unit[2] = {1, 1};
  if (encode(&kp.xmap, dtype == 0 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
             const_cast<void*>(p->x), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return (int)cudaErrorInvalidValue;
  const long long col0 = p->full_tiles * v.rows, w = p->N - col0;
  const long long gy = p->full_tiles + p->tail_tiles * splits;
  const bool cluster = p->cluster > 1;
  if (gx < 1 || splits < 1 || p->full_tiles < 0 || p->tail_tiles < 0 || gy < 1 || gy > 65535 ||
      (p->tail_tiles > 0 && !cluster) != (p->y32 != nullptr) || (p->tail_tiles > 0 && w <= 0) ||
      (p->tail_tiles > 0 && (p->steps_per_split < 1 || (splits - 1) * p->steps_per_split >= p->K / fastnf4_wg::kStep)) ||
      (cluster && (p->cluster != splits || splits > 8 || p->full_tiles != 0 || p->tail_tiles < 1)) || p->cluster < 0)
    return (int)cudaErrorInvalidValue;
  void* args[] = {(void*)&kp};
  if (cluster) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        fastnf4_wg::cluster_launch(v, dim3(gx, (unsigned)p->tail_tiles, (unsigned)splits), splits, stream, &attr);
    return (int)cudaLaunchKernelExC(&cfg, v.f, args);
  }
  cudaError_t rc = cudaLaunchKernel(v.f, dim3(gx, (unsigned)gy, 1), dim3((unsigned)v.threads), args, v.smem, stream);
  if (rc != cudaSuccess || p->tail_tiles == 0) return (int)rc;
  // split-K: the partial slices are complete when the next kernel on the stream starts
  if (dtype == 0) {
    fastnf4_wg::launch_sum<__nv_bfloat16>(p, splits, w, col0, stream);
  } else {
    fastnf4_wg::launch_sum<__half>(p, splits, w, col0, stream);
  }
  return (int)cudaGetLastError();
}

}  // extern "C"
