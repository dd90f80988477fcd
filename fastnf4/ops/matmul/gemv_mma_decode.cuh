// gemv_mma_pipe, the tensor-core decode kernel of gemv_mma.cu: builds ``decode`` (16 warps x 6 ring stages) and
// ``decode_wide`` (20 x 4) for M <= 2, and ``decode_pair`` / ``decode_pair_wide`` (the same with pair columns, kPair)
// for M <= 4.
// Shape contract (the host checks it, gemv_mma.py): x [M, K] and y [M, N] bf16 / fp16, contiguous, 16-byte aligned
// rows; packed [N, K / 2] (two codes per byte, the high nibble first) 16-byte aligned; K % 32 == 0, K < 2^31;
// blocksize a power of two >= 32 (pair columns: >= 64 with K % 64 == 0); absmax float32, or uint8 codes with nested
// statistics in blocks of 256; staged x (kXs) only where K % 128 == 0; the split-K counters zero between launches.
// Layout: a persistent grid of the resident blocks, one per SM (pipe::Cfg: kWarps warps, kStages ring stages); a work
// item is one warp's 16 weight rows x one K range of slices_per_split 128-wide slices (S = splits ranges per 16-row
// tile, settled globally, in the block or in a thread block cluster: kLocal). Dynamic shared memory
// (pipe::Cfg::kSmem): the 64 KiB pair table at the first 64 KiB-aligned address (entry v of lane l at byte
// 256 v + 4 l; the upper 128 bytes of the 256 entries are the holes: block-local partial sums from the bottom, staged
// x at the top), and per warp its weight ring (kStages x 1 KiB), statistics table (16 rows x kStatStride floats) and
// raw statistics area, as many below the table as fit and the rest above it.
#pragma once

#include "gemv_mma_common.cuh"

namespace fastnf4_mma {

// Pipelined decode kernel for M <= 2 (one column group), organised to issue few instructions per code
// and to keep many bytes in flight (ncu on a straightforward version, Llama gate_up M = 1: 0.52 instructions
// issued per scheduler cycle, 7.3 cycles between a warp's instructions, ~8.6 instructions per packed byte, 128
// registers with spills, 16 warps per SM; 22a8dd2:NOTES.md "CUDA decode kernel"):
// - one PRMT + one LDS per packed byte: the table entry v of lane l sits at byte v * 256 + 4 l of a table that
//   starts at a 64 KiB-aligned shared address, so a single byte permute of (word, table | 4 l) yields the
//   full address (the upper 128 bytes of every entry are unused);
// - weights go global -> shared with cp.async into a per-warp ring of kStages slices (each lane copies and
//   later reads only its own 32 bytes, so no warp synchronisation is needed); a lane reads its bytes of the
//   next slice into registers while it computes the current one, kStages - 2 slices in flight beyond that;
//   the ring runs across work items, so a warp never drains it between items;
// - statistics are decoded once per kPhase slices into a per-warp table (row x 32-code chunk, float32), from
//   raw bytes that cp.async brought into shared memory a phase earlier (``fetch_stats``);
// - x is prefetched one slice ahead in registers (two steps per loop trip alternate the buffers); 32-bit
//   offsets inside a work item; split-K partial sums are settled when the warp has no work left.
namespace pipe {
constexpr int kPhase = 8;                      // slices per statistics phase: 32 chunks of 32 codes per row
constexpr int kTableBytes = 256 * 256;
constexpr int kHoles = 256;  // free 128-byte halves of the table's entries: block-local partial-sum slots (LOCAL_HOLES)
                             // from the bottom, staged x (Params::xs) at the top
// warps per block (one block per SM) and ring stages: kCfg 0 = 16 x 6 (112 registers), kCfg 1 = 20 x 4 (ptxas
// then keeps it at 96 registers without spills). At M = 1 on the H200 the second is 2-20% faster on weights of
// up to ~84M elements launched alone and up to 6% slower on some larger ones (commit 5b2d3af);
// ``gemv_mma.choose`` picks.
template <int CG, int kCfg = 0> struct Cfg {
  static constexpr int kWarps = kCfg ? 20 : 16;
  static constexpr int kStages = kCfg ? 4 : 6;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRingBytes = kStages * 1024;  // [stage][row half A/B][lane] x 16 bytes
  static constexpr int kRawBytes = 16 * 80;  // raw statistics of the next phase: 16 rows' windows (see fetch_stats)
  static constexpr int kWarpBytes = kRingBytes + 16 * fastnf4_mma::kStatStride * 4 + kRawBytes;
  // the table starts at a 64 KiB-aligned shared address (see lookup_based); the warp areas fill the space below
  // it and continue above, which needs at most one warp area of slack whatever the base address is
  static constexpr int kSmem = kTableBytes + (kWarps + 1) * kWarpBytes;
};
}  // namespace pipe

// Where a warp is in its sequence of (work item, slice): items warp0, warp0 + warps, ... with item = tile *
// splits + split; moving to the next item is an add with carry (no division in the loop).
struct Cursor {
  long long tile;
  int split, slice, s_end;
};

// End of a decode-kernel work item (16 rows of one K range): each lane's two chunk columns plus its
// neighbour's give one (x row, weight row) dot product; lane t holds x row m = 2c + t / 2. With split-K these
// are partial sums, added up by ``settle_splits`` when the kernel ends.
// With the block-local split-K (``slot_s`` != 0, M <= 2) they go to shared memory instead: 16 rows x 2 x rows of
// float32 at slot_s (x row m, tile row r at + 4 (16 m + r)).
template <typename T, int CG>
__device__ __forceinline__ void finish_item(const Params& p, const float (&acc)[CG][4], long long tile,
                                            long long split, int lane, uint32_t slot_s = 0) {
  const int g = lane >> 2, t = lane & 3;
  const long long rowA = tile * 16 + g;
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    float vA = acc[c][0] + acc[c][1], vB = acc[c][2] + acc[c][3];
    vA += __shfl_xor_sync(0xffffffffu, vA, 1);
    vB += __shfl_xor_sync(0xffffffffu, vB, 1);
    if ((t & 1) == 0) {
      if (slot_s != 0) {
        const uint32_t a = slot_s + 4u * (16 * (2 * c + (t >> 1)) + g);
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(vA) : "memory");
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a + 32), "f"(vB) : "memory");
      } else {
        put<T>(p, split, 2 * c + (t >> 1), rowA, vA);
        put<T>(p, split, 2 * c + (t >> 1), rowA + 8, vB);
      }
    }
  }
}

// kLocal: 1 = the block-local split-K build (Params::local > 0), 2 = the same over thread block clusters
// (Params::lcluster > 1), 3 = the global settle with split-major items and staged x (Params::gsplit); separate
// instantiations, so that each build's SASS is the one measured for it (the global settle's is the one before them;
// the cluster code cost the single-block build 8 registers and ~3% on mid weights, the split-major code the global
// staged-x build ~1.4% on Gemma gate+up when it was a runtime branch there).
// kXs: x staged once per block in the table's top Params::xs holes (hole h: the upper 128 bytes of table entry h) instead
// of loaded from global memory into registers one slice ahead: x row m fills holes h0 + m * hrow ... (h0 = kHoles - xs,
// hrow = 2 ceil(K / 128): 64 elements per hole, zero-padded to whole slices), so slice s of row m is holes 2 s and
// 2 s + 1 of it and lane t's 64 bytes of it lie at a fixed lane offset + 512 s. Per slice: one multiply-add and four
// 16-byte shared loads by the lanes that carry x (predicated: the others keep the zeros the mma needs from them)
// instead of the x cursor, the predicated global loads and a second x buffer; K % 128 == 0 (the host's condition),
// so the weight copies need no K bound (0.1-1.3 us at M = 1). H200 (M = 1, commit c82a480): 4-14% faster on
// every staged weight (Llama gate_up 78.6 vs 89.9 us, q+o 16.3 vs 17.9); unpredicated
// loads (the other lanes reading a zero hole) and a block barrier after the first weight slice instead of after x
// alone were each slower than the register path.
// kPair (``decode_pair`` / ``decode_pair_wide``, M <= 4): B column n stands for (x row n / 2, chunk pair n % 2)
// instead of (x row n / 4, chunk n % 4): lane (g, t) carries x row g / 2 at its chunk t when g % 2 == t / 2. A pair of 32-code chunks (64
// codes) lies in one quantization block where the blocksize is >= 64 and K % 64 == 0 (the host's condition), so one
// absmax per C column still holds, and one column group covers four x rows: the same decode, x loads and mma per
// slice as at M <= 2. Lane (g, t) then ends with x row t's two pair columns of rows g and g + 8 (no shuffle). x in
// registers only (no staged-x build); with the block-local split-K a work item's partial sums (16 rows x 4 x rows) take
// two holes (x rows 0-1, 2-3), so a block holds half as many.
template <typename T, int CG, bool kNested, int kCfg = 0, int kLocal = 0, bool kXs = false, bool kPair = false>
__global__ void __launch_bounds__(pipe::Cfg<CG, kCfg>::kThreads, 1) gemv_mma_pipe(const __grid_constant__ Params p) {
  static_assert(!kXs || CG == 1, "staged x covers M <= 2");
  static_assert(!kPair || (CG == 1 && kLocal != 3 && !kXs), "pair columns: one column group, x in registers");
  static_assert(kLocal != 3 || kXs, "split-major global plans stage x");
  constexpr bool kBlock = kLocal == 1 || kLocal == 2;  // the block-local split-K (partial sums in shared memory)
  using C = pipe::Cfg<CG, kCfg>;
  constexpr int kStages = C::kStages, kRingBytes = C::kRingBytes, kWarpBytes = C::kWarpBytes;
  using pipe::kPhase; using pipe::kTableBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float nested_code[kNested ? 256 : 1];
  // table at the first 64 KiB-aligned shared address; warp areas below it as far as they fit, then above
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t tpad = (0u - smem_s) & 0xffffu;
  const int below = static_cast<int>(tpad) / kWarpBytes;
  uint32_t* table = reinterpret_cast<uint32_t*>(smem + tpad);
  // The pair table is built while the first weight copies are in flight (after they are issued, before the block
  // barrier ahead of the first step; H200, 22a8dd2:NOTES.md "x staged once"), or, when its source is a constant
  // (PDL launches), before pdl_wait: it then overlaps the previous kernel's drain.
  const bool table_first = p.code_const != 0;
  static_assert(C::kThreads >= 256, "one nested code per thread");
  if (table_first && p.code_const) {
    build_pair_table<T>(table, p.code, C::kThreads);
  }
  pdl_wait();
  // (late build) the 16 code values and this thread's nested code, loaded before the weight copies are issued
  const float code_l = table_first ? 0.f : __ldg(p.code + (threadIdx.x & 15));
  const float nested_t = kNested && threadIdx.x < 256 ? __ldg(p.nested_code + threadIdx.x) : 0.f;
  if (table_first && !p.code_const) {
    build_pair_table<T>(table, p.code, C::kThreads);
  }
  auto store_nested = [&]() {  // (read after pdl_wait: the nested codes are not a constant)
    if (kNested && threadIdx.x < 256) nested_code[threadIdx.x] = nested_t;
  };
  if (table_first) store_nested();
  pdl_launch_dependents();
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  // staged x (kXs): copied into the holes here, waited for (and the block barrier) before the first step; the lane's
  // address of slice s is xs_base + s * xs_inc
  uint32_t xs_base = 0, xs_inc = 0;
  if constexpr (kXs) {
    const uint32_t holes0 = smem_s + tpad + 128u;
    const int h0 = pipe::kHoles - static_cast<int>(p.xs);
    // the staged slices: all of K, or (split-major cluster) this block's splits only
    int slice0 = 0, nsl = static_cast<int>((p.K + kSlice - 1) / kSlice);
    if (kLocal == 2 && p.lsplit) {
      const int sb = C::kWarps / static_cast<int>(p.local / p.splits);  // splits per block
      slice0 = static_cast<int>(blockIdx.x % p.lcluster) * sb * static_cast<int>(p.slices_per_split);
      nsl = sb * static_cast<int>(p.slices_per_split);
    } else if (kLocal == 3) {
      // split-major global plan: this block's warps take items of the splits s_lo .. s_hi only
      const long long tl = (p.N + 15) / 16, g0 = static_cast<long long>(blockIdx.x) * C::kWarps;
      const long long g1 = min(g0 + C::kWarps, tl * p.splits) - 1;
      const int s_lo = static_cast<int>(g0 / tl), s_hi = static_cast<int>(g1 / tl);
      slice0 = s_lo * static_cast<int>(p.slices_per_split);
      nsl = g1 < g0 ? 0 : (s_hi - s_lo + 1) * static_cast<int>(p.slices_per_split);
    }
    const int kc = nsl * (kSlice / 8);  // 16-byte pieces per staged row
    const int hrow = 2 * nsl;
    const int K8 = static_cast<int>(p.K / 8), c0 = slice0 * (kSlice / 8);
    for (int i = threadIdx.x; i < static_cast<int>(p.M) * kc; i += C::kThreads) {
      const int m = i >= kc ? 1 : 0, cc = i - m * kc;
      const bool on = c0 + cc < K8;
      cp_async16_if(holes0 + 256u * (h0 + m * hrow + (cc >> 3)) + 16u * (cc & 7),
                    on ? reinterpret_cast<const T*>(p.x) + static_cast<size_t>(m) * p.K + 8 * (c0 + cc) : p.x, on);
    }
    cp_async_commit();
    const int lg = (threadIdx.x & 31) >> 2, lt = threadIdx.x & 3, m = lg >> 2;
    const bool on = (lg & 3) == lt && m < p.M;  // (xs_inc != 0: the lane carries x)
    xs_base = on ? holes0 + 256u * (h0 + m * hrow + (lt >> 1)) + 64u * (lt & 1) - 512u * slice0 : holes0;
    xs_inc = on ? 512u : 0u;
  }
  if (table_first) __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  uint8_t* wsm = smem + (warp < below ? warp * kWarpBytes : tpad + kTableBytes + (warp - below) * kWarpBytes);
  float* stats = reinterpret_cast<float*>(wsm + kRingBytes);
  uint32_t* raw = reinterpret_cast<uint32_t*>(wsm + kWarpBytes - C::kRawBytes) + lane;  // word w at raw[32 w]
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  const uint32_t nested_s = static_cast<uint32_t>(__cvta_generic_to_shared(nested_code));
  const uint32_t lane_base = (smem_s + tpad) | (4 * lane);  // table address (a multiple of 65536) | 4 l
  // the upper 128 bytes of each 256-byte table entry are free: the block-local split-K keeps partial sums there
  const uint32_t holes_s = smem_s + tpad + 128;
  // block-local split-K: the shared address of (x row m, tile row r) in partial-sum slot ``slot`` (one hole of 16 rows
  // x 2 x rows; pair columns: two holes, x rows 0-1 and 2-3)
  auto slot_at = [&](uint32_t slot, int m, int r) -> uint32_t {
    return kPair ? holes_s + 256u * (2 * slot + (m >> 1)) + 4u * (16 * (m & 1) + r)
                 : holes_s + 256u * slot + 4u * (16 * m + r);
  };
  constexpr uint32_t kSlotHoles = kPair ? 2 : 1;
  uint32_t round = 0;  // work items this warp has finished
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(wsm)) + 16 * lane;
  const long long N = p.N, K = p.K;
  const int K32 = static_cast<int>(K);  // the host keeps K < 2^31
  const int log2_bs = __ffsll(p.blocksize) - 1;
  const long long tiles = (N + 15) / 16;
  const int splits = static_cast<int>(p.splits);
  const int slices = static_cast<int>((K + kSlice - 1) / kSlice);
  const int per = static_cast<int>(p.slices_per_split);
  // block-local split-K (p.local = U): the block's first U warps take items b U + w (+ gridDim U per round), i.e. U / S
  // whole tiles per round; the others none (their first item is past the end)
  // (with clusters of lc blocks: the cluster's warps are numbered rank x kWarps + warp and share its U items)
  const long long U = kBlock ? p.local : C::kWarps;
  long long warp0, warps;
  if constexpr (kLocal == 2) {
    // cluster warp cw takes (local tile, split) = (cw / S, cw % S), or split-major (Params::lsplit) (cw % tpb, cw /
    // tpb): each block then holds whole splits (S / lc of them), so staged x needs only their part of K
    const int lc = static_cast<int>(p.lcluster), cw = static_cast<int>(blockIdx.x) % lc * C::kWarps + warp;
    const int tpb = static_cast<int>(U / p.splits);
    const int item = p.lsplit ? cw % tpb * static_cast<int>(p.splits) + cw / tpb : cw;
    warp0 = cw < U ? (long long)(blockIdx.x / lc) * U + item : tiles * p.splits;
    warps = (long long)(gridDim.x / lc) * U;
  } else {
    warp0 = !kBlock || warp < U ? (long long)blockIdx.x * U + warp : tiles * p.splits;
    warps = (long long)gridDim.x * U;
    // split-major global plan (Params::gsplit, at most one item per warp): warp g of the grid takes tile g % tiles of
    // split g / tiles, so that a block's warps share one or two splits and it stages only their part of x
    if constexpr (kLocal == 3) warp0 = warp0 < tiles * p.splits ? warp0 % tiles * p.splits + warp0 / tiles : warp0;
  }
  const long long wdiv = warps / splits;
  const int wmod = static_cast<int>(warps - wdiv * splits);
  const bool pair_shares_block = p.blocksize >= 64 && K % 64 == 0;
  const long long nblocks = (N * K + p.blocksize - 1) >> log2_bs;
  // statistics copied a phase ahead (16-byte cp.async of the rows' windows): the absmax array 16-byte aligned and a
  // whole number of 16-byte chunks long. (A window's copy at the array's end asks for fewer source bytes, but
  // compute-sanitizer counts such a copy as a read of all 16: 911b375^:benchmarks/sanitize_probe/cpasync_tail.cu.)
  // Otherwise the synchronous form; no model weight needs it (N K / blocksize is a multiple of 16 on every one).
  const bool async_stats = pair_shares_block && (reinterpret_cast<uintptr_t>(p.absmax) & 15) == 0 &&
                           (nblocks & (kNested ? 15 : 3)) == 0;

  auto begin = [&](Cursor& c, long long tile, int split) {
    c.tile = tile;
    c.split = split;
    c.slice = split * per;
    c.s_end = min(slices, c.slice + per);
    // a split past the end of K (the caller may ask for more splits than slices) still takes one all-zero
    // slice, so that its partial sums (zeros) are written and counted; never an empty item (it would not end)
    if (c.slice >= c.s_end) c.s_end = c.slice + 1;
  };
  auto advance = [&](Cursor& c) {
    if (++c.slice == c.s_end) {
      int split = c.split + wmod;
      long long tile = c.tile + wdiv;
      if (split >= splits) {
        split -= splits;
        ++tile;
      }
      begin(c, tile, split);
    }
  };

  // B operands as in gemv_mma_kernel: lane (g, t) carries x row m = 2c + g / 4 at its chunk when g % 4 == t
  // (32-bit element offsets of the lane's x values: M * K < 2^32 for M <= 2; one wide multiply-add per slice
  // gives the address. Past the last item the cursor's slice lies beyond K, so no tile check is needed.)
  uint32_t xoff[CG];
  bool xon[CG];
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    const long long m = kPair ? (g >> 1) : 2 * c + (g >> 2);
    xon[c] = (kPair ? (g & 1) == (t >> 1) : (g & 3) == t) && m < p.M;
    xoff[c] = static_cast<uint32_t>(xon[c] ? m * K : 0) + 32 * t;
  }
  auto load_x = [&](const Cursor& c, uint4 (&xb)[CG][4]) {
    const int kbase = c.slice * kSlice;
    const bool kin = kbase + 32 * t < K32;
#pragma unroll
    for (int q = 0; q < CG; ++q) {
      const T* px = reinterpret_cast<const T*>(p.x) + static_cast<size_t>(xoff[q] + static_cast<uint32_t>(kbase));
      ldg_x4(xb[q], px, xon[q] && kin);
    }
  };
  // Load cursor: weights of its slice into the ring stage at ``ring_ld`` (zero bytes outside the matrix).
  // Row pointers change only with the work item (rows outside N point at the start of the weights, which
  // is never read: source size 0).
  Cursor ld{};
  const uint8_t* ldA = p.packed;
  const uint8_t* ldB = p.packed;
  int szA = 0, szB = 0;
  auto ld_rows = [&]() {
    const long long rowA = ld.tile * 16 + g;
    szA = rowA < N ? 16 : 0;
    szB = rowA + 8 < N ? 16 : 0;
    ldA = szA ? p.packed + ((rowA * K) >> 1) + 16 * t : p.packed;
    ldB = szB ? ldA + 4 * K : p.packed;
  };
  uint32_t ring_ld = ring_s + (kStages - 1) * 1024;  // shared address of the next stage to fill
  // the weights are read once: their L2 lines are marked evict-first (H200: 2.6-4.7% faster on the five large
  // weights, two alternating rounds; as for the dequantize kernel's loads; 22a8dd2:NOTES.md "small-weight decode")
  const uint64_t wpolicy = evict_first_policy();
  auto issue = [&]() {
    if (ld.tile < tiles) {
      const int off = ld.slice * (kSlice / 2);
      // (staged x is only taken with K % 128 == 0 and no split past the end: every slice lies inside the rows)
      const bool kin = kXs || 2 * off + 32 * t < K32;
      const int o = kin ? off : 0;  // (addresses stay inside the rows even where nothing is read)
      cp_async16_weights_if(ring_ld, ldA + o, kin && szA, wpolicy);
      cp_async16_weights_if(ring_ld + 512, ldB + o, kin && szB, wpolicy);
      if (++ld.slice == ld.s_end) {
        --ld.slice;
        advance(ld);
        ld_rows();
      }
    }
    cp_async_commit();
  };
  Cursor cp;
  begin(cp, warp0 / splits, static_cast<int>(warp0 % splits));
  ld = cp;
  ld_rows();
  // nested absmax of the next phase in registers (cached loads; see fetch_stats) where x is staged: the register-x
  // builds keep the copies (with the two registers they lose 0.2-1.3 us at M = 2 on the H200, e.g. 5120 x 25600
  // 32.9 vs 31.5 us, where the cluster build spills; equal at M = 1; 22a8dd2:NOTES.md "statistics copies")
  constexpr bool kNaRegs = kNested && kXs;
  float2 na_store = make_float2(0.f, 0.f);
  float2* na_reg = kNaRegs ? &na_store : nullptr;
  bool fetched = false;  // the raw area holds this phase's statistics (asynchronous form) ...
  int since = 0;         // ... copied in the commit group of the step ``since`` steps ago
  // the first phase's statistics travel with the first weights (one global round trip at the start instead of
  // two: H200, M = 1: -0.3 to -1.1 us on every weight of 11-242 MB)
  if (async_stats && cp.tile < tiles) {
    fetch_stats<kNested>(p, raw_s, cp.tile, cp.slice, lane, log2_bs, nblocks, na_reg);
    cp_async_commit();
    fetched = true;
    since = kStages;  // older than the first weight stage, which is waited for before the first step
  }
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    ring_ld = ring_s + i * 1024;
    issue();
  }
  ring_ld = ring_s + (kStages - 1) * 1024;
  uint32_t ring_rd = ring_s;  // shared address of the stage read next (one slice ahead of the compute)
  const uint32_t ring_end = ring_s + kStages * 1024;
  Cursor xc = cp;  // x runs one slice ahead of the compute cursor (registers; kXs: unused)
  uint4 xb[CG][4];
  if constexpr (!kXs) {
    load_x(xc, xb);
    advance(xc);
  }
  float acc[CG][4];
#pragma unroll
  for (int c = 0; c < CG; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
  const int c0 = (2 * t) & 3;
  int rel = 0;  // slice index inside the work item
  // kXs: this lane's x registers, zeroed once (a lane without x never loads: its B operand stays zero; zeroing them
  // every slice is 8 more instructions per slice and 0.1-1.1 us slower at M = 1, H200; 22a8dd2:NOTES.md "x staged
  // once")
  uint4 xs_keep[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) xs_keep[i] = make_uint4(0, 0, 0, 0);
  // this lane's 32 bytes of the slice at ring_rd (rows g and g + 8), read one slice ahead of their use
  auto read_ring = [&](uint4 (&w)[2]) {
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(w[0].x), "=r"(w[0].y), "=r"(w[0].z), "=r"(w[0].w)
                 : "r"(ring_rd));
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(w[1].x), "=r"(w[1].y), "=r"(w[1].z), "=r"(w[1].w)
                 : "r"(ring_rd + 512));
    ring_rd = ring_rd + 1024 == ring_end ? ring_s : ring_rd + 1024;
  };
  // one slice: mma on x ``xcur`` and weights ``wcur`` (both read a step ago); the next slice's into ``xnext`` /
  // ``wnext``
  // staged-x builds keep the lane's table and statistics addresses in registers, made opaque once per slice so that
  // ptxas does not work them out again from the thread index (~18 instructions per slice at 111 of 128 registers
  // otherwise): H200, 0-0.8 us faster at M = 1 on 11 of 15 weights, none slower by more than 0.1 us (22a8dd2:NOTES.md
  // "x staged once"). The register-x builds do without: the 20-warp cluster one would spill.
  uint32_t pin_table = lane_base, pin_stats = static_cast<uint32_t>(__cvta_generic_to_shared(stats + g * kStatStride + c0));
  auto step = [&](const uint4 (&xreg)[CG][4], uint4 (&xnext)[CG][4], const uint4 (&wcur)[2], uint4 (&wnext)[2]) {
    if constexpr (kXs) {
      asm volatile("mov.b32 %0, %0;" : "+r"(pin_table));
      asm volatile("mov.b32 %0, %0;" : "+r"(pin_stats));
    }
    const uint32_t lane_tb = kXs ? pin_table : lane_base;
    uint4 xsm[CG][4];  // kXs: this slice's x from the holes
    if constexpr (kXs) {
      const uint32_t a = xs_base + static_cast<uint32_t>(cp.slice) * xs_inc;
#pragma unroll
      for (int i = 0; i < 4; ++i) xsm[0][i] = xs_keep[i];  // (the lanes without x keep the zeros of the start)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        asm("{\n .reg .pred on;\n setp.ne.u32 on, %4, 0;\n @on ld.shared.v4.u32 {%0,%1,%2,%3}, [%5];\n}\n"
            : "+r"(xsm[0][i].x), "+r"(xsm[0][i].y), "+r"(xsm[0][i].z), "+r"(xsm[0][i].w) : "r"(xs_inc), "r"(a + 16u * i));
#pragma unroll
      for (int i = 0; i < 4; ++i) xs_keep[i] = xsm[0][i];
    }
    const uint4 (*xcur)[4] = kXs ? xsm : xreg;  // [CG][4]
    if ((rel & (kPhase - 1)) == 0) {
      if (fetched) {
        // that group is done once at most since - 1 newer ones are pending (always so after kStages - 1 steps)
        if (since < kStages - 1) cp_async_wait_upto<kStages - 1>(since - 1);
        decode_stats<kNested>(p, raw_s, nested_s, stats, offset, cp.tile, cp.slice, lane, log2_bs, na_reg);
      } else {
        stage_stats<kNested>(p, stats, nested_code, offset, cp.tile, cp.slice, lane, log2_bs, pair_shares_block);
      }
      if (async_stats) {  // copy the next phase's (same item, or the next item's first) raw statistics
        Cursor n = cp;
        if (n.slice + kPhase < n.s_end) {
          n.slice += kPhase;
        } else {
          n.slice = n.s_end - 1;
          advance(n);
        }
        fetched = n.tile < tiles;
        if (fetched) fetch_stats<kNested>(p, raw_s, n.tile, n.slice, lane, log2_bs, nblocks, na_reg);
        since = 0;
      }
    }
    ++since;
    if constexpr (!kXs) {
      load_x(xc, xnext);
      advance(xc);
    }
    issue();
    ring_ld = ring_ld + 1024 == ring_end ? ring_s : ring_ld + 1024;
    cp_async_wait<kStages - 2>();  // the next slice's group has landed (each lane waits for its own copies)
    read_ring(wnext);              // (past the last slice: stale bytes, never used)
    const uint4 wa = wcur[0], wb = wcur[1];
    const uint32_t wA[4] = {wa.x, wa.y, wa.z, wa.w};
    const uint32_t wB[4] = {wb.x, wb.y, wb.z, wb.w};
    float cf[CG][4];
#pragma unroll
    for (int c = 0; c < CG; ++c) cf[c][0] = cf[c][1] = cf[c][2] = cf[c][3] = 0.f;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint32_t a0, a1, a2, a3;
      if (s & 1) {
        a0 = lookup_based<2>(lane_tb, wA[s >> 1]);
        a1 = lookup_based<2>(lane_tb, wB[s >> 1]);
        a2 = lookup_based<3>(lane_tb, wA[s >> 1]);
        a3 = lookup_based<3>(lane_tb, wB[s >> 1]);
      } else {
        a0 = lookup_based<0>(lane_tb, wA[s >> 1]);
        a1 = lookup_based<0>(lane_tb, wB[s >> 1]);
        a2 = lookup_based<1>(lane_tb, wA[s >> 1]);
        a3 = lookup_based<1>(lane_tb, wB[s >> 1]);
      }
#pragma unroll
      for (int c = 0; c < CG; ++c) {
        const uint4 q = xcur[c][s >> 1];
        mma16816<T>(cf[c], a0, a1, a2, a3, (s & 1) ? q.z : q.x, (s & 1) ? q.w : q.y);
      }
    }
    float2 sA, sB;
    if constexpr (kXs) {
      const uint32_t a = pin_stats + 16u * static_cast<uint32_t>(rel & (kPhase - 1));
      asm("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(sA.x), "=f"(sA.y) : "r"(a));
      asm("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(sB.x), "=f"(sB.y) : "r"(a + 4u * 8 * kStatStride));
    } else if constexpr (kPair) {
      // the absmax of chunk pairs 0 / 1 (chunks 0 / 2; each pair's two chunks hold the same value)
      const int j = (rel & (kPhase - 1)) * 4;
      const float4 qa = *reinterpret_cast<const float4*>(stats + g * kStatStride + j);
      const float4 qb = *reinterpret_cast<const float4*>(stats + (g + 8) * kStatStride + j);
      sA = make_float2(qa.x, qa.z);
      sB = make_float2(qb.x, qb.z);
    } else {
      const int j = (rel & (kPhase - 1)) * 4 + c0;
      sA = *reinterpret_cast<const float2*>(stats + g * kStatStride + j);
      sB = *reinterpret_cast<const float2*>(stats + (g + 8) * kStatStride + j);
    }
#pragma unroll
    for (int c = 0; c < CG; ++c) {
      acc[c][0] = fmaf(cf[c][0], sA.x, acc[c][0]);
      acc[c][1] = fmaf(cf[c][1], sA.y, acc[c][1]);
      acc[c][2] = fmaf(cf[c][2], sB.x, acc[c][2]);
      acc[c][3] = fmaf(cf[c][3], sB.y, acc[c][3]);
    }
    ++rel;
    if (++cp.slice < cp.s_end) return;

    // the work item is complete: write its 16 rows (partial sums with split-K), then move to the next item
    // (block-local split-K: this warp's round-th item goes to table hole round x kWarps + warp)
    if constexpr (kBlock && kPair) {
      // x row t's sums of rows g / g + 8 into the item's two holes (slot_at)
      const uint32_t a = slot_at(round * C::kWarps + warp, t, g);
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(acc[0][0] + acc[0][1]) : "memory");
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a + 32), "f"(acc[0][2] + acc[0][3]) : "memory");
      ++round;
    } else if constexpr (kBlock) {
      finish_item<T, CG>(p, acc, cp.tile, cp.split, lane, holes_s + 256u * (round * C::kWarps + warp));
      ++round;
    } else if constexpr (kPair) {
      // x row t's pair columns of rows g / g + 8 (put skips x rows past M)
      const long long rowA = cp.tile * 16 + g;
      put<T>(p, cp.split, t, rowA, acc[0][0] + acc[0][1]);
      put<T>(p, cp.split, t, rowA + 8, acc[0][2] + acc[0][3]);
    } else {
      finish_item<T, CG>(p, acc, cp.tile, cp.split, lane);
    }
#pragma unroll
    for (int c = 0; c < CG; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
    --cp.slice;
    advance(cp);
    rel = 0;
  };
  // two steps per trip, alternating the x buffers (no register copies)
  uint4 xb2[CG][4], w1[2], w2[2];
  if (!table_first) {
    build_pair_table_from<T>(table, code_l, C::kThreads);
    store_nested();
  }
  if constexpr (kXs) {
    // every thread's x copies (the oldest group: younger are the first statistics' and the kStages - 1 weight
    // groups), then the block barrier; not the weights, so a warp still starts as soon as its own first slice lands
    cp_async_wait_upto<kStages + 1>(kStages - 1 + (fetched ? 1 : 0));
  }
  if (!table_first || kXs) __syncthreads();  // the table, nested codes (and staged x) written by every thread
  cp_async_wait<kStages - 2>();  // the first slice's group has landed
  read_ring(w1);
  while (cp.tile < tiles) {
    step(xb, xb2, w1, w2);
    if (cp.tile >= tiles) break;
    step(xb2, xb, w2, w1);
  }
  cp_async_wait<0>();
  if constexpr (kBlock) {
    // block-local split-K: the S partials of each of this block's (cluster's) tiles (round i, local tile lt: tile
    // (c + i clusters) U / S + lt; split s on cluster warp lt S + s, in hole i kWarps + (its warp) of its block)
    // added in split order, as sum_tile does, (+ bias) and stored; a cluster's blocks take every lc-th entry
    if constexpr (kLocal == 2) {
      cluster_barrier();
    } else {
      __syncthreads();
    }
    const int tpb = static_cast<int>(U) / splits, m_rows = static_cast<int>(p.M);
    const int per_round = tpb * 16 * m_rows;
    const int lc = kLocal == 2 ? static_cast<int>(p.lcluster) : 1;
    const int crank = kLocal == 2 ? static_cast<int>(blockIdx.x) % lc : 0;
    const long long cid = kLocal == 2 ? (long long)(blockIdx.x / lc) : (long long)blockIdx.x;
    const long long nclusters = kLocal == 2 ? (long long)(gridDim.x / lc) : (long long)gridDim.x;
    for (int e = crank * C::kThreads + threadIdx.x;; e += lc * C::kThreads) {
      const int i = e / per_round, rem = e - i * per_round;
      const long long first = (cid + (long long)i * nclusters) * tpb;
      if (static_cast<int>(kSlotHoles) * i * C::kWarps >= pipe::kHoles - (kXs ? static_cast<int>(p.xs) : 0) ||
          first >= tiles)
        break;
      const int lt = rem / (16 * m_rows), mr = rem - lt * 16 * m_rows, m = mr >> 4, r = mr & 15;
      const long long row = (first + lt) * 16 + r;
      if (row >= N) continue;
      float v = 0.f;
      if constexpr (kLocal == 2) {
        for (int z = 0; z < splits; ++z) {
          const int owner = p.lsplit ? z * tpb + lt : lt * splits + z;  // the cluster warp that took split z
          v += ld_cluster_f32(slot_at(i * C::kWarps + owner % C::kWarps, m, r), owner / C::kWarps);
        }
      } else {
        const uint32_t a = slot_at(i * C::kWarps + lt * splits, m, r);
        for (int z = 0; z < splits; ++z) {
          float q;
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(q) : "r"(a + 256u * kSlotHoles * z) : "memory");
          v += q;
        }
      }
      if (p.bias) v += Pair<T>::load(p.bias, row);
      Pair<T>::store(p.y, m * N + row, v);
    }
    if constexpr (kLocal == 2) cluster_barrier();  // every block's partials stay readable until all have read them
    return;
  }
  settle_splits<T>(p, warp0, warps, tiles * splits, 1, 0, lane);
}

}  // namespace fastnf4_mma
