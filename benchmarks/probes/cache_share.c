// How much of the last-level cache one core of this machine can hold: one core reads a working
// set of S bytes over and over (four AVX2 loads a step, summed), for S from 256 KiB to 64 MiB,
// and prints GB/s. The read rate falls from the shared cache's to DRAM's where S passes what
// the core really keeps, which on a cloud VM can be far less than the size sysfs reports (the
// cache is shared with other guests).
//
//     gcc -O2 -mavx2 -o /tmp/cache_share benchmarks/probes/cache_share.c
//     taskset -c 0 /tmp/cache_share
//     taskset -c 0 /tmp/cache_share & taskset -c 1 /tmp/cache_share; wait   # both cores at once
//
// Figures, and what they mean for the cost model: docs/benchmarks.md, session 33.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(void){
  size_t most = (size_t)64 << 20; float *a = aligned_alloc(64, most);
  for (size_t i = 0; i < most / 4; i++) a[i] = 1.0f;
  const size_t sizes[] = {256 << 10, 512 << 10, 1 << 20, 2 << 20, 3 << 20, 4 << 20, 6 << 20, 8 << 20,
                          12 << 20, 16 << 20, 24 << 20, 32 << 20, (size_t)64 << 20};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t n = sizes[s] / 4, reps = (size_t)(2e9 / sizes[s]) + 1;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (size_t i = 0; i < n; i += 8) acc0 = _mm256_add_ps(acc0, _mm256_load_ps(a + i));  // warm
    double t0 = now();
    for (size_t r = 0; r < reps; r++)
      for (size_t i = 0; i < n; i += 32) {
        acc0 = _mm256_add_ps(acc0, _mm256_load_ps(a + i));
        acc1 = _mm256_add_ps(acc1, _mm256_load_ps(a + i + 8));
        acc2 = _mm256_add_ps(acc2, _mm256_load_ps(a + i + 16));
        acc3 = _mm256_add_ps(acc3, _mm256_load_ps(a + i + 24));
      }
    double t = now() - t0;
    float out[8]; _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    printf("%8zu KiB  %6.1f GB/s%s\n", sizes[s] >> 10, reps * (double)sizes[s] / t / 1e9, out[0] < 0 ? " ?" : "");
  }
  return 0;
}
