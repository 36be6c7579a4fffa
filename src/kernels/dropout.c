/* Inverted dropout with a counter-based mask: the expression of
 * kiln/opmath.h (kiln_dropout_f), which generated code runs too, so a
 * fused compiled loop drops exactly the elements eager drops. */
#include "kiln/kernels.h"

void kiln_k_dropout(const float *x, float key, float p, int64_t inst, int64_t offset, float *out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 15))
    for (int64_t j = 0; j < n; j++) out[j] = kiln_dropout_f(x[j], key, offset + j, p, inst);
}
