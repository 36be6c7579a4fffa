/* Measures the fp32 FMA peak of this machine (for MFU), with a loop of
 * independent vector FMAs on every OpenMP thread. */
#include <immintrin.h>
#include <omp.h>
#include "kiln/kernels.h"

#if defined(__AVX512F__)
typedef __m512 vec;
#define VW 16
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define SET1(x) _mm512_set1_ps(x)
#define ADD(a, b) _mm512_add_ps(a, b)
static float hsum(vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
#define VW 8
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define SET1(x) _mm256_set1_ps(x)
#define ADD(a, b) _mm256_add_ps(a, b)
static float hsum(vec v) {
    float t[8];
    _mm256_storeu_ps(t, v);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

double kiln_fma_peak_gflops(double seconds) {
#ifdef VW
    double flops = 0, t0 = kiln_time_now(), t1 = t0;
    float sink = 0;
    while (t1 - t0 < seconds) {
        const long iters = 2000000;
#pragma omp parallel reduction(+ : sink)
        {
            vec a[12];
            vec x = SET1(0.999999f), y = SET1(1e-7f);
            for (int j = 0; j < 12; j++) a[j] = SET1((float)j);
            for (long i = 0; i < iters; i++)
                for (int j = 0; j < 12; j++) a[j] = FMA(a[j], x, y);
            vec s = a[0];
            for (int j = 1; j < 12; j++) s = ADD(s, a[j]);
            sink += hsum(s);
        }
        flops += 2.0 * VW * 12 * (double)iters * omp_get_max_threads();
        t1 = kiln_time_now();
    }
    return sink == 12345.0f ? 0 : flops / (t1 - t0) / 1e9;
#else
    (void)seconds;
    return 0;
#endif
}
