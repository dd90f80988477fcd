// Shared by the SS-form probes benchmarks/probe_ss{,2,3,4}.cu (not a package kernel): their Params, PTX wrappers,
// the SS-form wgmma m64n256k16 / m64n128k16, the absmax loads of 4 K steps and the register-table decode of a row.
// (_cuda.compile_source hashes the local headers a source includes with it, so the probes rebuild when this changes.)
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace probe_ss {

struct Params {
  const uint8_t* packed;
  const void* absmax;  // uint8 codes (nested) or float32
  const float* nested_code;
  const float* nested_absmax;
  const float* offset;
  const float* code;
  const __nv_bfloat16* x;
  __nv_bfloat16* y;
  float* y32;  // [splits, M, N] partial sums when splits > 1
  long long M, N, K, splits, per;  // per: K steps (of 64) per split, a multiple of 4
};

// with the TMA tensor maps of x and of the packed weights (probe_ss3.cu, probe_ss4.cu)
struct KParams {
  Params p;
  CUtensorMap xmap, wmap;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, int size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(size) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int n>
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory"); }
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ float2 lds64f(uint32_t a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts128(uint32_t a, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t d;  // lo in the low half: the element at the lower address
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ void fence_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// K-major tile, 128-byte swizzle, 8-row groups 1024 bytes apart
__device__ __forceinline__ uint64_t desc(uint32_t a) {
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (1ull << 16) | (static_cast<uint64_t>(1024 >> 4) << 32) |
         (1ull << 62);
}
__device__ __forceinline__ void mma(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
        "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "        "%128, %129, p, 1, 1, 0, 0;\n}\n"
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
        : "l"(da), "l"(db));
}

// scale-d = accumulate: 0 on the first step (d = A B, so the accumulators need no zeroing, which made ptxas
// serialize the wgmma: C7515)
__device__ __forceinline__ void mma128(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(accumulate));
}

// the absmax of 4 consecutive steps of one row (K % 256 == 0 and splits of whole quads keep the word aligned)
template <bool kNested>
__device__ __forceinline__ void load_quad(const Params& p, long long blk, uint32_t& codes, float4& f, float& na) {
  if constexpr (kNested) {
    codes = __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(p.absmax) + blk));
    na = __ldg(p.nested_absmax + (blk >> 8));
  } else {
    f = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.absmax) + blk));
  }
}

// Thread v (< 256) writes entry v of the pair table at table + (v << kShift), its first 128 bytes: (code[v >> 4],
// code[v & 15]) as 16 float32 copies (lanes l and l + 16 read copy l & 15), or with PROBE_SS_FAST 32 bf16 copies (the
// codes rounded to bf16); and nested code v.
template <bool kNested, int kShift>
__device__ __forceinline__ void build_tables(const Params& p, uint32_t table, uint32_t ncs, int v) {
  const float lo = __ldg(p.code + (v >> 4)), hi = __ldg(p.code + (v & 15));
  const uint32_t e = table + (static_cast<uint32_t>(v) << kShift);
#if defined(PROBE_SS_FAST)
  const uint32_t pr = pack_bf16(lo, hi);
#pragma unroll
  for (int c = 0; c < 32; c += 4) sts128(e + 4 * c, pr, pr, pr, pr);
#else
#pragma unroll
  for (int c = 0; c < 16; c += 2)
    sts128(e + 8 * c, __float_as_uint(lo), __float_as_uint(hi), __float_as_uint(lo), __float_as_uint(hi));
#endif
  if (kNested) asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(ncs + 4 * v), "f"(__ldg(p.nested_code + v)));
}

// The register-table decode of one weight row and K step (PROBE_SS_REGLUT of probe_ss3.cu, probe_ss4.cu): the row's
// 16 dequantized values of the step, exactly bf16(code[i] x a), as byte planes (lo / hi bytes of entries 4q .. 4q + 3
// in L[q] / H[q]) for PRMT lookups of 4 codes each; the step's 64 codes (the 8 packed words) go to the row's 128-byte
// swizzled line of the B tile at dst (row n).
__device__ __forceinline__ void reglut_row(const uint32_t (&words)[8], float a, const float (&cv)[16], uint32_t dst,
                                           int n) {
  uint32_t L[4], H[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t r0 = pack_bf16(cv[4 * q] * a, cv[4 * q + 1] * a), r1 = pack_bf16(cv[4 * q + 2] * a, cv[4 * q + 3] * a);
    L[q] = prmt(r0, r1, 0x6420u);
    H[q] = prmt(r0, r1, 0x7531u);
  }
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    uint32_t o[4];
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      // nibbles of bytes 2g, 2g + 1: (c1, c0, c3, c2) in element order c0 .. c3 (high nibble first)
      const uint32_t grp = words[c] >> (16 * g);
      const uint32_t sel = grp & 0x7777u;
      const uint32_t msel = ((grp >> 3) & 0x1111u) * 12u;  // 0xC (sign mode, byte 4 = 0x80) where code >= 8
      const uint32_t mask = prmt(0u, 0x80808080u, msel);
      const uint32_t la = prmt(L[0], L[1], sel), lb = prmt(L[2], L[3], sel);
      const uint32_t ha = prmt(H[0], H[1], sel), hb = prmt(H[2], H[3], sel);
      const uint32_t lo = (lb & mask) | (la & ~mask), hi = (hb & mask) | (ha & ~mask);
      o[2 * g] = prmt(lo, hi, 0x4051u);      // (c0, c1)
      o[2 * g + 1] = prmt(lo, hi, 0x6273u);  // (c2, c3)
    }
    sts128(dst + ((c ^ (n & 7)) << 4), o[0], o[1], o[2], o[3]);
  }
}

// The accumulators of one warpgroup (x rows 64 wg .. 64 wg + 63 of the tile at m0; weight rows col0 ..): accumulator i
// is row 16 warp + lane / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (lane % 4) + i % 2; bf16 y, or this split's
// float32 partial sums when the plan splits K.
template <int kAcc>
__device__ __forceinline__ void store_acc(const Params& p, const float (&acc)[kAcc], int wg, int tw, long long m0,
                                          long long col0, long long split) {
  const int w4 = tw >> 5, lane = tw & 31;
  const long long N = p.N, M = p.M;
#pragma unroll
  for (int i = 0; i < kAcc; i += 2) {
    const int r = 64 * wg + 16 * w4 + (lane >> 2) + 8 * ((i >> 1) & 1);
    const long long m = m0 + r;
    const long long col = col0 + 8 * (i >> 2) + 2 * (lane & 3);
    if (m < M) {
      if (p.splits > 1) {
        *reinterpret_cast<float2*>(p.y32 + (split * M + m) * N + col) = make_float2(acc[i], acc[i + 1]);
      } else {
        *reinterpret_cast<uint32_t*>(p.y + m * N + col) = pack_bf16(acc[i], acc[i + 1]);
      }
    }
  }
}

// (host) the TMA tensor maps of probe_ss3 / probe_ss4: x as 64 x 64 boxes with the 128-byte swizzle, the packed
// weights as 32-byte x wrows boxes; a cudaError_t
inline int encode_maps(KParams& kp, const Params* p, int wrows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr)
      return static_cast<int>(cudaErrorNotSupported);
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  kp.p = *p;
  const cuuint32_t unit[2] = {1, 1};
  {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p->K), static_cast<cuuint64_t>(p->M)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p->K) * 2};
    const cuuint32_t box[2] = {64, 64};
    if (encode(&kp.xmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(p->x), dims, strides, box,
               unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return static_cast<int>(cudaErrorInvalidValue);
  }
  {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p->K / 2), static_cast<cuuint64_t>(p->N)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p->K / 2)};
    const cuuint32_t box[2] = {32, static_cast<cuuint32_t>(wrows)};
    if (encode(&kp.wmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(p->packed), dims, strides, box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return 0;
}

}  // namespace probe_ss
