// One core walking B as IREE's register tiles of a workgroup read it: for each block of 6 rows of
// A, for each 16-float column panel of the workgroup's N columns, all K rows of B (one 64-byte
// line a row, at B's row pitch), into 6x2 AVX2 accumulators. Between row blocks the workgroup's
// slab of B (K x N floats) is read again: the walk is as fast as the level that keeps the slab.
//
//     gcc -O2 -mavx2 -mfma -o /tmp/slab_walk benchmarks/probes/slab_walk.c
//     for n in 64 192 384 768; do taskset -c 0 /tmp/slab_walk 3072 768 $n; done   # K, B's row, N
//     taskset -c 0 /tmp/slab_walk 3072 768 384 huge   # buffers in 2 MiB pages (TLB reach ruled out)
//
// Figures, and what they mean for the cost model: docs/benchmarks.md, session 33.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
// With `huge`, 2 MiB aligned and madvise(MADV_HUGEPAGE): guests whose transparent huge pages
// are `madvise` only then map them in 2 MiB pages (AnonHugePages in /proc/self/smaps_rollup).
static float *buffer(long bytes, int huge) {
  if (!huge) return aligned_alloc(64, bytes);
  const long page = 2L << 20;
  bytes = (bytes + page - 1) / page * page;
  float *p = aligned_alloc(page, bytes);
  madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}
static long anon_huge_kb(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "AnonHugePages:", 14)) sscanf(line + 14, "%ld", &kb);
  if (f) fclose(f);
  return kb;
}
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: %s K B_ROW_FLOATS WORKGROUP_COLUMNS [huge]\n", argv[0]); return 2; }
  const int huge = argc > 4 && !strcmp(argv[4], "huge");
  const long M = 64, K = atol(argv[1]), NB = atol(argv[2]), N = atol(argv[3]);
  enum { R = 6 };
  float *A = buffer(M * K * 4, huge), *B = buffer(K * NB * 4, huge), *C = buffer(M * NB * 4, huge);
  for (long i = 0; i < M * K; i++) A[i] = 1e-3f;
  for (long i = 0; i < K * NB; i++) B[i] = 1e-3f;
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now();
    for (long n0 = 0; n0 < NB; n0 += N)            // the workgroups, one after another
      for (long m = 0; m + R <= M; m += R)          // row blocks: each reads the slab again
        for (long n = n0; n < n0 + N; n += 16) {    // column panels
          __m256 acc[R][2];
          for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
          for (long k = 0; k < K; k++) {
            __m256 b0 = _mm256_load_ps(B + k * NB + n), b1 = _mm256_load_ps(B + k * NB + n + 8);
            for (int r = 0; r < R; r++) {
              __m256 a = _mm256_broadcast_ss(A + (m + r) * K + k);
              acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
              acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
            }
          }
          for (int r = 0; r < R; r++) {
            _mm256_store_ps(C + (m + r) * NB + n, acc[r][0]);
            _mm256_store_ps(C + (m + r) * NB + n + 8, acc[r][1]);
          }
        }
    double t = now() - t0;
    if (t < best) best = t;
  }
  printf("K %ld, B row %ld floats, workgroup %ld columns (slab %.1f MB): %.2f ms (%.1f GFLOP/s)", K, NB, N,
         K * N * 4 / 1e6, best * 1e3, 2.0 * (M / R * R) * K * NB / best / 1e9);
  if (huge) printf(", AnonHugePages %ld kB", anon_huge_kb());
  printf("\n");
  return C[5] < 0;
}
