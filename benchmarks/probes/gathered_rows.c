// How fast one core reads R rows of a [N, K] f32 matrix one element of each row a step, as a
// register tile R wide reads B stored [n, k] with a reduction tile of one element (IREE loads
// and inserts each element on its own). A row's cache line serves 16 consecutive steps, so the
// R lines must stay resident between them: rows a power-of-two pitch apart fall in few sets.
// Each step's R loads are summed into R/16 vectors, as the register tile's accumulators.
//
//     gcc -O2 -mavx512f -mfma -o /tmp/gathered_rows benchmarks/probes/gathered_rows.c
//     /tmp/gathered_rows 64 4096 1024 20     # R rows, K (row length in floats), N rows in all, passes
//     for k in 4096 4112; do for r in 16 64; do /tmp/gathered_rows $r $k 1024 20; done; done
//                                           # pitch 256 lines (one L1 set) against 257 (every set)
//
// Figures, and what they mean for the cost model: docs/benchmarks.md, session 31.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  long R=atol(argv[1]), K=atol(argv[2]), N=atol(argv[3]); int reps=argc>4?atoi(argv[4]):20;
  float *B=aligned_alloc(4096,N*K*4); for(long i=0;i<N*K;i++)B[i]=1e-6f*(i%1000);
  volatile float sink=0; double best=1e9;
  for(int t=0;t<reps;t++){
    double t0=now(); __m512 acc[8]; for(int v=0;v<8;v++)acc[v]=_mm512_setzero_ps();
    for(long n0=0;n0<N;n0+=R){           // one register tile's rows
      for(long k=0;k<K;k++){             // one element of each row a step
        for(long v=0;v<R/16;v++){
          const float*p=B+(n0+v*16)*K+k;
          __m512 x=_mm512_set_ps(p[15*K],p[14*K],p[13*K],p[12*K],p[11*K],p[10*K],p[9*K],p[8*K],
                                 p[7*K],p[6*K],p[5*K],p[4*K],p[3*K],p[2*K],p[K],p[0]);
          acc[v]=_mm512_add_ps(acc[v],x);
        }
      }
    }
    double dt=now()-t0; if(dt<best)best=dt;
    for(int v=0;v<8;v++)sink+=_mm512_reduce_add_ps(acc[v]);
  }
  printf("R=%ld K=%ld (pitch %ld lines) N=%ld (%.1f MB): best %.3f ms, %.2f ns per element\n",
         R,K,K*4/64,N,N*K*4/1e6,best*1e3,best*1e9/(N*K));
  return sink==12345;
}
