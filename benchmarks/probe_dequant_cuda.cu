// Experiment, not used by the package (NOTES.md session 14; benchmarks/probe_dequant_cuda.py drives it).
// CUDA dequantize: packed 4-bit codes + (optionally double-quantized) absmax -> fp16 / bf16 / fp32, bit-exact with
// bitsandbytes' CUDA kernel (code[c] * absmax in float32, one round-to-nearest-even to the output type; nested
// absmax = nested_code[q] * nested_absmax[block / nested_blocksize], rounded, + offset, rounded).
//
// Why CUDA next to the Triton kernel (kernel.py): the Triton kernel runs one short-lived program per 1 KiB of
// packed bytes, and on the H200 the block launches alone of such a grid take most of the time of a 100-300 MB
// dequantize (NOTES.md, session 11: an empty kernel with that grid and the PDL trigger is 25 us of the 27 us of
// Qwen3-32B q); a persistent Triton loop measured 58-79% of copy because Triton does not keep loads in flight
// across its iterations. Here a resident grid of warps walks the weight in windows and loads the next window
// before decoding the current one.
//
// Work unit: a 32-bit word of packed bytes (8 codes, one 16-byte bf16 / fp16 output vector). A warp's window is
// kU x 32 consecutive words; in each of the kU steps lane l takes word 32 * u + l, so every load instruction reads
// 128 contiguous bytes and every store instruction writes 512 (1024 for fp32) contiguous bytes. All 8 codes of a
// word share one absmax (blocksizes are multiples of 8). The last numel % (8 * 32 * kU) elements (a part window
// and a part word) are done by one warp after the loop, with bounds checks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace fastnf4_dq {

struct Params {
  const uint8_t* packed;        // ceil(numel / 2) bytes, 4-byte aligned
  const void* absmax;           // float32 [blocks], or uint8 codes [blocks] when nested
  const float* code;            // 16 entries
  void* out;                    // numel elements, 16-byte aligned
  const float* nested_code;     // 256 entries (nested)
  const float* nested_absmax;   // float32 [ceil(blocks / nested_blocksize)] (nested)
  const float* offset;          // 1 entry (nested)
  long long numel;
  int word_shift;               // log2(blocksize / 8): word index -> block index
  int nested_shift;             // log2(nested_blocksize)
};

constexpr int kThreads = 256;

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// read-once packed bytes: streaming (evict-first) loads; write-once values: streaming stores
__device__ __forceinline__ uint32_t load_word(const uint32_t* p) { return __ldcs(p); }

template <typename T> struct Out;
template <> struct Out<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pair(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);  // .x = a (lower address)
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <> struct Out<__half> {
  static __device__ __forceinline__ uint32_t pair(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

// The 8 values of word ``w`` (element 2j = high nibble of byte j, 2j + 1 = its low nibble) stored at word index i.
template <typename T>
__device__ __forceinline__ void decode_store(const float* s_code, uint32_t w, float absmax, void* out, long long i) {
  float v[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = __fmul_rn(s_code[(w >> (8 * j + 4)) & 15], absmax);
    v[2 * j + 1] = __fmul_rn(s_code[(w >> (8 * j)) & 15], absmax);
  }
  if constexpr (std::is_same<T, float>::value) {
    float4* o = reinterpret_cast<float4*>(out) + 2 * i;
    __stcs(o, make_float4(v[0], v[1], v[2], v[3]));
    __stcs(o + 1, make_float4(v[4], v[5], v[6], v[7]));
  } else {
    uint4 r;
    r.x = Out<T>::pair(v[0], v[1]);
    r.y = Out<T>::pair(v[2], v[3]);
    r.z = Out<T>::pair(v[4], v[5]);
    r.w = Out<T>::pair(v[6], v[7]);
    __stcs(reinterpret_cast<uint4*>(out) + i, r);
  }
}

// The statistics of a block as loaded (float bits, or the uint8 code), and its nested scale.
struct Stat {
  uint32_t a;
  float s2;
};

template <bool kNested>
__device__ __forceinline__ Stat load_stat(const Params& p, long long blk) {
  Stat s;
  if constexpr (kNested) {
    s.a = __ldg(reinterpret_cast<const uint8_t*>(p.absmax) + blk);
    s.s2 = __ldg(p.nested_absmax + (blk >> p.nested_shift));
  } else {
    s.a = __float_as_uint(__ldg(reinterpret_cast<const float*>(p.absmax) + blk));
    s.s2 = 0.f;
  }
  return s;
}

template <bool kNested>
__device__ __forceinline__ float absmax_of(const Stat& s, const float* s_ncode, float offset) {
  if constexpr (kNested) return __fadd_rn(__fmul_rn(s_ncode[s.a], s.s2), offset);
  return __uint_as_float(s.a);
}

template <typename T, bool kNested, int kU>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const Params p) {
  __shared__ float s_code[16];
  __shared__ float s_ncode[kNested ? 256 : 1];
  pdl_wait();  // launched early (PDL): the previous kernel may still be writing our inputs or reading our output
  pdl_launch_dependents();
  if (threadIdx.x < 16) s_code[threadIdx.x] = p.code[threadIdx.x];
  if constexpr (kNested) s_ncode[threadIdx.x] = p.nested_code[threadIdx.x];  // kThreads == 256
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const long long warps = static_cast<long long>(gridDim.x) * (kThreads / 32);
  long long win = static_cast<long long>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  const long long n_words = p.numel >> 3;  // words whose 8 elements all exist
  const long long n_win = n_words / (32 * kU);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(p.packed);

  // this lane's words and statistics of window v (none past the last whole window)
  auto load_window = [&](long long v, uint32_t (&wv)[kU], Stat (&sv)[kU]) {
    if (v >= n_win) return;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const long long i = v * (32 * kU) + 32 * u + lane;
      wv[u] = load_word(words + i);
      sv[u] = load_stat<kNested>(p, i >> p.word_shift);
    }
  };
  uint32_t w[kU];
  Stat st[kU];
  load_window(win, w, st);
  for (; win < n_win; win += warps) {
    // the next window's loads go out before this one is decoded
    uint32_t w2[kU];
    Stat st2[kU];
    load_window(win + warps, w2, st2);
#pragma unroll
    for (int u = 0; u < kU; ++u)
      decode_store<T>(s_code, w[u], absmax_of<kNested>(st[u], s_ncode, offset), p.out, win * (32 * kU) + 32 * u + lane);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      w[u] = w2[u];
      st[u] = st2[u];
    }
  }

  // the rest: the words of a part window, then the last numel % 8 elements; one warp, bounds-checked
  const long long first = static_cast<long long>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (first != n_win % warps) return;
  for (long long i = n_win * (32 * kU) + lane; i < n_words; i += 32) {
    decode_store<T>(s_code, load_word(words + i), absmax_of<kNested>(load_stat<kNested>(p, i >> p.word_shift),
                                                                     s_ncode, offset), p.out, i);
  }
  const long long e = n_words * 8 + lane;
  if (e < p.numel) {
    const uint8_t byte = p.packed[e >> 1];
    const int c = (e & 1) ? (byte & 15) : (byte >> 4);
    const float absmax = absmax_of<kNested>(load_stat<kNested>(p, (e >> 3) >> p.word_shift), s_ncode, offset);
    const float v = __fmul_rn(s_code[c], absmax);
    if constexpr (std::is_same<T, float>::value) {
      reinterpret_cast<float*>(p.out)[e] = v;
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      reinterpret_cast<__nv_bfloat16*>(p.out)[e] = __float2bfloat16_rn(v);
    } else {
      reinterpret_cast<__half*>(p.out)[e] = __float2half_rn(v);
    }
  }
}

// Experiment: one block per SM loads its whole range of packed bytes into shared memory at once (cp.async, one
// commit group per chunk of kThreadsS x 16 bytes), then decodes chunk after chunk as the groups land. A thread
// decodes exactly the 16 bytes (32 codes, one absmax) it copied, so no barrier is needed: cp.async.wait_group makes
// a thread's own copies visible to it. Its statistics are loaded into registers up front as well.
constexpr int kThreadsS = 1024;

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <typename T>
__device__ __forceinline__ void decode_store16(const float* s_code, uint4 b, float absmax, void* out, long long piece) {
  // piece = 16 packed bytes = 32 values = 4 (bf16 / fp16) or 8 (fp32) 16-byte vectors; word j -> vector j
  const uint32_t w[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) decode_store<T>(s_code, w[j], absmax, out, piece * 4 + j);
}

template <typename T, bool kNested, int kChunks>
__global__ void __launch_bounds__(kThreadsS, 1) dequantize_smem_kernel(const Params p, long long per_block,
                                                                        int prefetch) {
  extern __shared__ __align__(16) uint8_t s_buf[];
  __shared__ float s_code[16];
  __shared__ float s_ncode[kNested ? 256 : 1];
  const long long n_pieces = p.numel >> 5;  // pieces whose 32 values all exist
  const long long begin = static_cast<long long>(blockIdx.x) * per_block;
  const long long end = min(begin + per_block, n_pieces);
  if (prefetch) {  // safe before the wait: nothing reaches registers or shared memory
    for (long long i = begin * 16 + 128 * threadIdx.x; i < end * 16; i += 128 * kThreadsS)
      asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(p.packed + i));
  }
  pdl_wait();
  pdl_launch_dependents();
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(s_buf)) + 16 * threadIdx.x;
  Stat st[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const long long piece = begin + threadIdx.x + static_cast<long long>(c) * kThreadsS;
    if (piece < end) {
      cp_async16(s0 + 16 * kThreadsS * c, p.packed + piece * 16);
      st[c] = load_stat<kNested>(p, (piece * 4) >> p.word_shift);
    }
    cp_commit();
  }
  if (threadIdx.x < 16) s_code[threadIdx.x] = p.code[threadIdx.x];
  if constexpr (kNested) { if (threadIdx.x < 256) s_ncode[threadIdx.x] = p.nested_code[threadIdx.x]; }
  const float offset = kNested ? __ldg(p.offset) : 0.f;
  __syncthreads();
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const long long piece = begin + threadIdx.x + static_cast<long long>(c) * kThreadsS;
    switch (kChunks - 1 - c) {  // wait for this chunk's group (immediate operand)
      case 0: cp_wait<0>(); break; case 1: cp_wait<1>(); break; case 2: cp_wait<2>(); break;
      case 3: cp_wait<3>(); break; case 4: cp_wait<4>(); break; case 5: cp_wait<5>(); break;
      case 6: cp_wait<6>(); break; case 7: cp_wait<7>(); break; case 8: cp_wait<8>(); break;
      case 9: cp_wait<9>(); break; case 10: cp_wait<10>(); break; default: cp_wait<11>(); break;
    }
    if (piece < end) {
      uint4 b;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "r"(s0 + 16 * kThreadsS * c));
      decode_store16<T>(s_code, b, absmax_of<kNested>(st[c], s_ncode, offset), p.out, piece);
    }
  }
  // the last numel % 32 values: block 0, one per thread
  if (blockIdx.x == 0 && threadIdx.x < 32) {
    const long long e = n_pieces * 32 + threadIdx.x;
    if (e < p.numel) {
      const uint8_t byte = p.packed[e >> 1];
      const int c = (e & 1) ? (byte & 15) : (byte >> 4);
      const float v = __fmul_rn(s_code[c], absmax_of<kNested>(load_stat<kNested>(p, (e >> 3) >> p.word_shift),
                                                                s_ncode, offset));
      if constexpr (std::is_same<T, float>::value) reinterpret_cast<float*>(p.out)[e] = v;
      else if constexpr (std::is_same<T, __nv_bfloat16>::value) reinterpret_cast<__nv_bfloat16*>(p.out)[e] = __float2bfloat16_rn(v);
      else reinterpret_cast<__half*>(p.out)[e] = __float2half_rn(v);
    }
  }
}

template <typename T, int kC>
void* smem_kernel_nested(int nested) {
  return nested ? reinterpret_cast<void*>(&dequantize_smem_kernel<T, true, kC>)
                : reinterpret_cast<void*>(&dequantize_smem_kernel<T, false, kC>);
}
template <int kC>
void* smem_kernel_for(int dtype, int nested) {
  switch (dtype) {
    case 0: return smem_kernel_nested<__nv_bfloat16, kC>(nested);
    case 1: return smem_kernel_nested<__half, kC>(nested);
    case 2: return smem_kernel_nested<float, kC>(nested);
    default: return nullptr;
  }
}
void* smem_kernel(int dtype, int nested, int chunks) {
  switch (chunks) {
    case 1: return smem_kernel_for<1>(dtype, nested);
    case 2: return smem_kernel_for<2>(dtype, nested);
    case 3: return smem_kernel_for<3>(dtype, nested);
    case 4: return smem_kernel_for<4>(dtype, nested);
    case 6: return smem_kernel_for<6>(dtype, nested);
    case 8: return smem_kernel_for<8>(dtype, nested);
    case 10: return smem_kernel_for<10>(dtype, nested);
    case 12: return smem_kernel_for<12>(dtype, nested);
    default: return nullptr;
  }
}

#ifndef FASTNF4_DQ_U
#define FASTNF4_DQ_U 4
#endif
constexpr int kU = FASTNF4_DQ_U;

template <typename T>
void* kernel_for_nested(int nested) {
  return nested ? reinterpret_cast<void*>(&dequantize_kernel<T, true, kU>)
                : reinterpret_cast<void*>(&dequantize_kernel<T, false, kU>);
}

void* kernel_for(int dtype, int nested) {
  switch (dtype) {
    case 0: return kernel_for_nested<__nv_bfloat16>(nested);
    case 1: return kernel_for_nested<__half>(nested);
    case 2: return kernel_for_nested<float>(nested);
    default: return nullptr;
  }
}

}  // namespace fastnf4_dq

using fastnf4_dq::Params;

extern "C" {

int fastnf4_dequant_params_size() { return (int)sizeof(Params); }
int fastnf4_dequant_threads() { return fastnf4_dq::kThreads; }
int fastnf4_dequant_window_words() { return 32 * fastnf4_dq::kU; }

// one launch of f, with programmatic stream serialization when pdl (sm_90+); returns a cudaError_t
static int launch(void* f, int grid, int threads, int smem, cudaStream_t stream, int pdl, void** args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return (int)cudaLaunchKernelExC(&cfg, f, args);
}

// Resident blocks per SM (0 when the kernel does not exist or does not fit); also loads the module.
int fastnf4_dequant_occupancy(int dtype, int nested) {
  void* f = fastnf4_dq::kernel_for(dtype, nested);
  if (f == nullptr) return 0;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, fastnf4_dq::kThreads, 0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return blocks;
}

// dtype 0 = bf16, 1 = fp16, 2 = fp32; pdl = launch with programmatic stream serialization (sm_90+); returns a
// cudaError_t.
int fastnf4_dequant(const Params* p, int dtype, int nested, int grid, cudaStream_t stream, int pdl) {
  void* f = fastnf4_dq::kernel_for(dtype, nested);
  if (f == nullptr || grid < 1) return (int)cudaErrorInvalidValue;
  void* args[] = {(void*)p};
  return launch(f, grid, fastnf4_dq::kThreads, 0, stream, pdl, args);
}


// Experiment: the shared-memory kernel; chunks in {1, 2, 3, 4, 6, 8, 10, 12}, grid blocks of per_block pieces.
int fastnf4_dequant_smem(const Params* p, int dtype, int nested, int chunks, int grid, long long per_block,
                         int prefetch, cudaStream_t stream, int pdl) {
  void* f = fastnf4_dq::smem_kernel(dtype, nested, chunks);
  if (f == nullptr || grid < 1) return (int)cudaErrorInvalidValue;
  const int smem = 16 * fastnf4_dq::kThreadsS * chunks;
  if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    return (int)cudaGetLastError();
  }
  void* args[] = {(void*)p, (void*)&per_block, (void*)&prefetch};
  return launch(f, grid, fastnf4_dq::kThreadsS, smem, stream, pdl, args);
}

}  // extern "C"
