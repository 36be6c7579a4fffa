#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <time.h>
typedef bool (*gf)(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t, const uint16_t *, int64_t, float, float *, int64_t);
bool kiln_k_gemm_bf16_avx512(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t, const uint16_t *, int64_t, float, float *, int64_t);
bool kiln_k_gemm_bf16_vpk(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t, const uint16_t *, int64_t, float, float *, int64_t);
bool kiln_k_gemm_bf16_vct(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t, const uint16_t *, int64_t, float, float *, int64_t);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){ int M=atoi(argv[1]),N=atoi(argv[2]),K=atoi(argv[3]); int ta=argc>4?atoi(argv[4]):1;
 gf fs[3]={kiln_k_gemm_bf16_avx512,kiln_k_gemm_bf16_vpk,kiln_k_gemm_bf16_vct};
 uint16_t*A=malloc((size_t)M*K*2),*B=malloc((size_t)K*N*2); float*C=malloc((size_t)M*N*4),*C0=malloc((size_t)M*N*4);
 for(long i=0;i<(long)M*K;i++){A[i]=0x3f80+(i*7%113)-50;} for(long i=0;i<(long)K*N;i++){B[i]=0x3f80+(i*5%101)-40;}
 int64_t lda=ta?M:K; fs[0](ta,false,M,N,K,1,A,lda,B,N,0,C0,N);
 for(int v=1;v<3;v++){ fs[v](ta,false,M,N,K,1,A,lda,B,N,0,C,N); if(memcmp(C,C0,(size_t)M*N*4)) printf("variant %d DIFFERS\n",v);}
 double t[3][60]; double f=2.0*M*N*K/1e9;
 for(int r=0;r<60;r++) for(int v=0;v<3;v++){ double t0=now(); fs[v](ta,false,M,N,K,1,A,lda,B,N,0,C,N); t[v][r]=now()-t0;}
 for(int v=0;v<3;v++) qsort(t[v],60,8,cmp);
 printf("%dx%dx%d %s: base %.1f  pk %.1f  ctl %.1f GFLOP/s\n",M,N,K,ta?"TN":"NN",f/t[0][30],f/t[1][30],f/t[2][30]);
}
