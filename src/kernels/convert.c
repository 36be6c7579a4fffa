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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static int g_force_emulation = 0;

/* KILN_BF16=emulated takes the emulated path on a CPU that has AVX512-BF16
 * (an AVX2 machine's bf16 numerics and speed, for benchmarks and
 * comparisons); auto (the default) uses what the CPU has; any other value
 * stops the program naming it. */
__attribute__((constructor)) static void read_kiln_bf16(void) {
    const char *v = getenv("KILN_BF16");
    if (!v || !*v || !strcmp(v, "auto")) return;
    if (!strcmp(v, "emulated")) {
        g_force_emulation = 1;
        return;
    }
    fprintf(stderr, "kiln: KILN_BF16=%s: not a bf16 path (auto or emulated)\n", v);
    exit(2);
}

bool kiln_cpu_has_avx512bf16(void) { return kiln_cpu_features() & KILN_CPU_AVX512BF16; }

void kiln_bf16_force_emulation(bool on) { __atomic_store_n(&g_force_emulation, on ? 1 : 0, __ATOMIC_RELAXED); }

bool kiln_bf16_native(void) {
    return !__atomic_load_n(&g_force_emulation, __ATOMIC_RELAXED) && kiln_cpu_has_avx512bf16();
}

/* AMX: the CPU reports AMX-BF16 and the OS saves tile state (kiln_cpu_features
 * checks XCR0), and Linux lets this process use the tile data: permission is
 * asked for once (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; without it
 * the first tile load is SIGILL). 0: not asked yet, 1: granted, 2: refused. */
static int g_amx_perm = 0, g_amx_off = 0;

static bool amx_permitted(void) {
    int p = __atomic_load_n(&g_amx_perm, __ATOMIC_ACQUIRE);
    if (p) return p == 1;
#if defined(__linux__) && defined(__x86_64__)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    p = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : 2;
#else
    p = 2;
#endif
    __atomic_store_n(&g_amx_perm, p, __ATOMIC_RELEASE);
    return p == 1;
}

void kiln_bf16_amx_off(bool off) { __atomic_store_n(&g_amx_off, off ? 1 : 0, __ATOMIC_RELAXED); }

/* only the avx512 form has the AMX paths: with another form active
 * (KILN_ISA) no kiln kernel uses the tiles */
bool kiln_bf16_amx(void) {
    return kiln_bf16_native() && !__atomic_load_n(&g_amx_off, __ATOMIC_RELAXED) &&
           (kiln_cpu_features() & KILN_CPU_AMX_BF16) && kiln_form_active() == KILN_FORM_AVX512 && amx_permitted();
}

const char *kiln_bf16_path(void) {
    return kiln_bf16_amx()      ? "native AMX-BF16 (oneDNN's bf16 matmul or kiln's TDPBF16PS GEMM, by measurement; fp32 accumulate)"
           : kiln_bf16_native() ? "native AVX512-BF16 (oneDNN's bf16 matmul or kiln's VDPBF16PS GEMM, by measurement; fp32 accumulate)"
                              : "emulated (operands rounded to bf16, fp32 GEMM: bf16 numerics, no speed-up)";
}

