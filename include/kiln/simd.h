/* kiln simd: the instruction sets of this CPU, and which form of the kernels
 * runs.
 *
 * The kernels of src/kernels/simd/ are compiled once per form: portable
 * (x86-64 baseline, SSE2), avx2 (x86-64-v3: AVX2, FMA, F16C, BMI) and avx512
 * (x86-64-v4: AVX-512 F/BW/CD/DQ/VL), each into its own symbols
 * (kiln_k_add_avx2, ...). A call to kiln_k_add goes through the active
 * form's table (kiln/kernels.h), which is chosen at start: the best form this
 * CPU and its operating system run, or the one KILN_ISA names
 * (portable|avx2|avx512; a form this CPU cannot run, or any other value, is
 * an error that stops the program naming it). On other architectures there
 * is one form, portable, built with the build's flags.
 *
 * Detection is CPUID plus XGETBV: AVX needs the OS to save YMM state, AVX-512
 * the opmask and ZMM state too. */
#ifndef KILN_SIMD_H
#define KILN_SIMD_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { KILN_FORM_PORTABLE = 0, KILN_FORM_AVX2 = 1, KILN_FORM_AVX512 = 2, KILN_FORM_COUNT = 3 } kiln_form;

/* CPU features (and OS support for their registers), as bits */
enum {
    KILN_CPU_AVX2 = 1u << 0,       /* x86-64-v3: AVX, AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE */
    KILN_CPU_AVX512 = 1u << 1,     /* x86-64-v4: AVX-512 F, BW, CD, DQ, VL */
    KILN_CPU_AVX512BF16 = 1u << 2, /* AVX512_BF16 (VCVTNE2PS2BF16, VDPBF16PS) */
    KILN_CPU_AVX512VNNI = 1u << 3,
    KILN_CPU_AMX_BF16 = 1u << 4, /* AMX tiles with bf16 (kiln_bf16_amx: kiln's bf16 GEMM) */
};
unsigned kiln_cpu_features(void);
/* "avx2 avx512 avx512bf16 ..." or "none" */
const char *kiln_cpu_features_text(void);

const char *kiln_form_name(kiln_form f);
/* portable|avx2|avx512 -> form; false for anything else */
bool kiln_form_parse(const char *s, kiln_form *f);
/* compiled into this build */
bool kiln_form_built(kiln_form f);
/* built, and this CPU and OS run it */
bool kiln_form_runs(kiln_form f);
/* the best form that runs */
kiln_form kiln_form_best(void);
/* the form calls go to now */
kiln_form kiln_form_active(void);
/* makes f the active form (between kernel calls: not while another thread
 * runs kernels); false with the reason in why when f does not run here */
bool kiln_form_set(kiln_form f, char *why, size_t n);
/* one line: "avx512 (CPU: avx2 avx512 avx512bf16 avx512vnni; forms built: portable avx2 avx512)"
 * plus ", KILN_ISA=..." when the variable chose it */
const char *kiln_form_describe(void);

#endif
