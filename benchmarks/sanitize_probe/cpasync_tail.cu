// Does compute-sanitizer's memcheck count a cp.async with a source size below its copy size (the rest zero-filled)
// as a read of the whole copy size? usage: cpasync_tail SIZE [cg]: one 16-byte cp.async at byte 192 of a 204-byte
// allocation, reading SIZE bytes (12: the last bytes of the allocation; 16: 4 bytes past it).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

__global__ void copy_tail(const char* p, int size, int cg, int* out) {
  __shared__ __align__(16) char s[16];
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(s));
  if (cg) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(p + 192), "r"(size));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(p + 192), "r"(size));
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  int sum = 0;
  for (int i = 0; i < 16; ++i) sum += s[i];
  out[0] = sum;
}

int main(int argc, char** argv) {
  const int size = argc > 1 ? atoi(argv[1]) : 12;
  const int cg = argc > 2 && strcmp(argv[2], "cg") == 0;
  char* p;
  int* out;
  cudaMalloc(&p, 204);
  cudaMalloc(&out, 4);
  cudaMemset(p, 1, 204);
  copy_tail<<<1, 1>>>(p, size, cg, out);
  int h = -1;
  cudaMemcpy(&h, out, 4, cudaMemcpyDeviceToHost);
  printf("size %d %s: sum %d (%s)\n", size, cg ? "cg" : "ca", h, cudaGetErrorString(cudaGetLastError()));
  return 0;
}
