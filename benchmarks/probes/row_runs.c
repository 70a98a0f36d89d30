// How fast one core streams a [K, N] f32 matrix column panel by column panel, as a register
// tile of a matmul with B stored [k, n] reads it: each reduction step reads `n` floats of one
// row (n = 16: one 64-byte line per row; n = 64: four lines). Same bytes, same order of
// panels; only the bytes read per row visit change. With one accumulator the FMA chain bounds
// the loop (FMA latency per step), with four it does not.
//
//     gcc -O2 -mavx512f -mfma -o /tmp/row_runs benchmarks/probes/row_runs.c
//     /tmp/row_runs 768 2304 300      # K N repetitions: GPT-2's c_attn weight, 7 MB (L3)
//     /tmp/row_runs 4096 4096 20      # 67 MB: from DRAM
//     for n in 2688 2704 2720 2736 2752 2768 2784 2800 2816; do /tmp/row_runs 768 $n 150; done
//                                      # pitches of 168-176 lines: 768 rows in 8, 64, 32, 64, 16, ... L1 sets
//
// Figures, and what they mean for the cost model: docs/benchmarks.md, sessions 29-31 (the Intel
// m167 and the Zen 4 lose by different rules).
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float *B; static long K, N;
__attribute__((noinline)) static __m512 panel16_1(void){
  __m512 a=_mm512_setzero_ps(); __m512 x=_mm512_set1_ps(1.0001f);
  for(long c=0;c<N;c+=16) for(long k=0;k<K;k++) a=_mm512_fmadd_ps(x,_mm512_loadu_ps(B+k*N+c),a);
  return a;
}
__attribute__((noinline)) static __m512 panel16_4(void){
  __m512 a0=_mm512_setzero_ps(),a1=a0,a2=a0,a3=a0; __m512 x=_mm512_set1_ps(1.0001f);
  for(long c=0;c<N;c+=16) for(long k=0;k<K;k+=4){ const float*p=B+k*N+c;
    a0=_mm512_fmadd_ps(x,_mm512_loadu_ps(p),a0); a1=_mm512_fmadd_ps(x,_mm512_loadu_ps(p+N),a1);
    a2=_mm512_fmadd_ps(x,_mm512_loadu_ps(p+2*N),a2); a3=_mm512_fmadd_ps(x,_mm512_loadu_ps(p+3*N),a3);}
  return _mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3));
}
__attribute__((noinline)) static __m512 panel64_1(void){
  __m512 a=_mm512_setzero_ps(); __m512 x=_mm512_set1_ps(1.0001f);
  for(long c=0;c<N;c+=64) for(long k=0;k<K;k++){ const float*p=B+k*N+c;
    a=_mm512_fmadd_ps(x,_mm512_loadu_ps(p),a); a=_mm512_fmadd_ps(x,_mm512_loadu_ps(p+16),a);
    a=_mm512_fmadd_ps(x,_mm512_loadu_ps(p+32),a); a=_mm512_fmadd_ps(x,_mm512_loadu_ps(p+48),a);}
  return a;
}
__attribute__((noinline)) static __m512 panel64(void){
  __m512 a0=_mm512_setzero_ps(),a1=a0,a2=a0,a3=a0; __m512 x=_mm512_set1_ps(1.0001f);
  for(long c=0;c<N;c+=64){
    for(long k=0;k<K;k++){ const float*p=B+k*N+c;
      a0=_mm512_fmadd_ps(x,_mm512_loadu_ps(p),a0); a1=_mm512_fmadd_ps(x,_mm512_loadu_ps(p+16),a1);
      a2=_mm512_fmadd_ps(x,_mm512_loadu_ps(p+32),a2); a3=_mm512_fmadd_ps(x,_mm512_loadu_ps(p+48),a3);}
  }
  return _mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3));
}
int main(int argc,char**argv){
  K=atol(argv[1]); N=atol(argv[2]); int reps=argc>3?atoi(argv[3]):200;
  B=aligned_alloc(4096,K*N*4); for(long i=0;i<K*N;i++)B[i]=1e-6f*(i%1000);
  volatile float sink=0; __m512 r;
  const char*names[]={"n16 1 acc","n16 4 accs","n64 4 accs","n64 1 acc"};
  for(int v=0;v<4;v++){
    double best=1e9;
    for(int t=0;t<reps;t++){ double t0=now();
      r= v==0?panel16_1(): v==1?panel16_4(): v==2?panel64(): panel64_1();
      double dt=now()-t0; if(dt<best)best=dt; sink+=_mm512_reduce_add_ps(r);}
    printf("K=%ld N=%ld (%.1f MB, row pitch %ld B) %-13s best %.3f ms  %.1f GB/s\n",K,N,K*N*4/1e6,N*4,names[v],best*1e3,K*N*4/best/1e9);
  }
  return sink==12345;
}
