/* Whether bf16 runs natively, and the tests' switch to the emulated path.
 * The conversion kernels are simd/convert.c (one form per instruction set).
 *
 * f32 -> bf16 conversion of whole arrays, for the bf16 matrix products of
 * mixed precision (autocast). Round to nearest even, as kiln_f32_to_bf16.
 *
 * With AVX512-BF16 the conversion is one VCVTNE2PS2BF16 per 32 values. That
 * instruction always treats denormal inputs as zero (it ignores MXCSR), so
 * a denormal f32 becomes a signed bf16 zero there, where the scalar
 * kiln_f32_to_bf16 would round it to a bf16 denormal; every other input
 * (normal, zero, inf, NaN) converts bit-identically. Without the
 * instructions the scalar loop runs (the compiler vectorises it). */
#include "kiln/kernels.h"
#include "kiln/simd.h"

static int g_force_emulation = 0;

bool kiln_cpu_has_avx512bf16(void) { return kiln_cpu_features() & KILN_CPU_AVX512BF16; }

void kiln_bf16_force_emulation(bool on) { __atomic_store_n(&g_force_emulation, on ? 1 : 0, __ATOMIC_RELAXED); }

bool kiln_bf16_native(void) {
    return !__atomic_load_n(&g_force_emulation, __ATOMIC_RELAXED) && kiln_cpu_has_avx512bf16();
}

const char *kiln_bf16_path(void) {
    return kiln_bf16_native() ? "native AVX512-BF16 (oneDNN bf16 GEMM, fp32 accumulate)"
                              : "emulated (operands rounded to bf16, fp32 GEMM: bf16 numerics, no speed-up)";
}

