/* Which form of the kernels runs (kiln/simd.h): CPU detection, the forms'
 * tables, KILN_ISA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kernels.h"
#include "kiln/simd.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KILN_X86_FORMS 1
#include <cpuid.h>
#endif

/* ---- the tables ---------------------------------------------------------- */
/* each form's symbols (kernels/simd/ compiled with -DKILN_FORM=...), with the
 * public declarations' types (one paste, kiln_k_##s##_##f, so that no name
 * in between expands); positional initialisers in KILN_SIMD_KERNELS order,
 * the struct's order */
#define DECLARE_(s, f) extern __typeof__(kiln_k_##s) kiln_k_##s##_##f;
#define DECLARE_PORTABLE(s) DECLARE_(s, portable)
#define ENTRY_PORTABLE(s) kiln_k_##s##_portable,
KILN_SIMD_KERNELS(DECLARE_PORTABLE)
static const kiln_simd_table table_portable = {KILN_SIMD_KERNELS(ENTRY_PORTABLE)};
#ifdef KILN_X86_FORMS
#define DECLARE_AVX2(s) DECLARE_(s, avx2)
#define DECLARE_AVX512(s) DECLARE_(s, avx512)
#define ENTRY_AVX2(s) kiln_k_##s##_avx2,
#define ENTRY_AVX512(s) kiln_k_##s##_avx512,
KILN_SIMD_KERNELS(DECLARE_AVX2)
KILN_SIMD_KERNELS(DECLARE_AVX512)
static const kiln_simd_table table_avx2 = {KILN_SIMD_KERNELS(ENTRY_AVX2)};
static const kiln_simd_table table_avx512 = {KILN_SIMD_KERNELS(ENTRY_AVX512)};
#endif

/* portable until the constructor below picks (a kernel called before it
 * still runs correctly) */
const kiln_simd_table *kiln_simd = &table_portable;
static kiln_form g_active = KILN_FORM_PORTABLE;
static char g_env[64];

/* ---- detection ------------------------------------------------------------ */
static unsigned detect(void) {
    unsigned f = 0;
#ifdef KILN_X86_FORMS
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    unsigned c1 = c;
    bool osxsave = c1 & (1u << 27);
    unsigned long long xcr0 = 0;
    if (osxsave) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    bool ymm = osxsave && (xcr0 & 0x6) == 0x6;      /* SSE and AVX state */
    bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;        /* opmask, ZMM_Hi256, Hi16_ZMM */
    bool tile = osxsave && (xcr0 & 0x60000) == 0x60000; /* XTILECFG, XTILEDATA */
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    if ((unsigned)__get_cpuid_max(0, NULL) >= 7u) {
        __cpuid_count(7, 0, a, b, c, d);
        b7 = b, c7 = c, d7 = d;
        __cpuid_count(7, 1, a, b, c, d);
        a71 = a;
    }
    unsigned c81 = 0;
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000001u) {
        __cpuid(0x80000001u, a, b, c, d);
        c81 = c;
    }
    bool fma = c1 & (1u << 12), movbe = c1 & (1u << 22), avx = c1 & (1u << 28), f16c = c1 & (1u << 29);
    bool avx2 = b7 & (1u << 5), bmi1 = b7 & (1u << 3), bmi2 = b7 & (1u << 8), lzcnt = c81 & (1u << 5);
    if (ymm && avx && avx2 && fma && f16c && bmi1 && bmi2 && lzcnt && movbe) f |= KILN_CPU_AVX2;
    bool v4 = (b7 & (1u << 16)) && (b7 & (1u << 17)) && (b7 & (1u << 28)) && (b7 & (1u << 30)) && (b7 & (1u << 31));
    if ((f & KILN_CPU_AVX2) && zmm && v4) {
        f |= KILN_CPU_AVX512;
        if (a71 & (1u << 5)) f |= KILN_CPU_AVX512BF16;
        if (c7 & (1u << 11)) f |= KILN_CPU_AVX512VNNI;
    }
    if (tile && (d7 & (1u << 22)) && (d7 & (1u << 24))) f |= KILN_CPU_AMX_BF16;
#endif
    return f;
}

static unsigned g_features;
static bool g_detected;

unsigned kiln_cpu_features(void) {
    if (!__atomic_load_n(&g_detected, __ATOMIC_ACQUIRE)) { /* the same answer from any thread */
        g_features = detect();
        __atomic_store_n(&g_detected, true, __ATOMIC_RELEASE);
    }
    return g_features;
}

const char *kiln_cpu_features_text(void) {
    static char buf[96];
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {{KILN_CPU_AVX2, "avx2"},
                 {KILN_CPU_AVX512, "avx512"},
                 {KILN_CPU_AVX512BF16, "avx512bf16"},
                 {KILN_CPU_AVX512VNNI, "avx512vnni"},
                 {KILN_CPU_AMX_BF16, "amx-bf16"}};
    unsigned f = kiln_cpu_features();
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (f & names[i].bit) len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", len ? " " : "", names[i].name);
    return len ? buf : "none";
}

/* ---- forms ---------------------------------------------------------------- */
static const char *const form_names[KILN_FORM_COUNT] = {"portable", "avx2", "avx512"};

const char *kiln_form_name(kiln_form f) { return f >= 0 && f < KILN_FORM_COUNT ? form_names[f] : "?"; }

bool kiln_form_parse(const char *s, kiln_form *f) {
    for (int i = 0; i < KILN_FORM_COUNT; i++)
        if (s && !strcmp(s, form_names[i])) {
            *f = (kiln_form)i;
            return true;
        }
    return false;
}

bool kiln_form_built(kiln_form f) {
#ifdef KILN_X86_FORMS
    return f >= 0 && f < KILN_FORM_COUNT;
#else
    return f == KILN_FORM_PORTABLE;
#endif
}

bool kiln_form_runs(kiln_form f) {
    if (!kiln_form_built(f)) return false;
    unsigned c = kiln_cpu_features();
    switch (f) {
    case KILN_FORM_PORTABLE: return true;
    case KILN_FORM_AVX2: return c & KILN_CPU_AVX2;
    case KILN_FORM_AVX512: return c & KILN_CPU_AVX512;
    default: return false;
    }
}

kiln_form kiln_form_best(void) {
    for (int i = KILN_FORM_COUNT - 1; i > 0; i--)
        if (kiln_form_runs((kiln_form)i)) return (kiln_form)i;
    return KILN_FORM_PORTABLE;
}

const kiln_simd_table *kiln_simd_table_of(kiln_form f) {
    if (!kiln_form_runs(f)) return NULL;
#ifdef KILN_X86_FORMS
    if (f == KILN_FORM_AVX2) return &table_avx2;
    if (f == KILN_FORM_AVX512) return &table_avx512;
#endif
    return &table_portable;
}

kiln_form kiln_form_active(void) { return g_active; }

bool kiln_form_set(kiln_form f, char *why, size_t n) {
    const kiln_simd_table *t = kiln_simd_table_of(f);
    if (!t) {
        if (why)
            snprintf(why, n, "%s kernels %s (CPU features: %s)", kiln_form_name(f),
                     kiln_form_built(f) ? "need instructions this CPU or its OS does not have"
                                        : "are not built for this architecture",
                     kiln_cpu_features_text());
        return false;
    }
    kiln_simd = t;
    g_active = f;
    return true;
}

const char *kiln_form_describe(void) {
    static char buf[256];
    char built[64] = "";
    size_t len = 0;
    for (int i = 0; i < KILN_FORM_COUNT; i++)
        if (kiln_form_built((kiln_form)i))
            len += (size_t)snprintf(built + len, sizeof built - len, "%s%s", len ? " " : "", form_names[i]);
    snprintf(buf, sizeof buf, "%s (CPU: %s; forms built: %s%s%s)", kiln_form_name(g_active), kiln_cpu_features_text(),
             built, g_env[0] ? "; KILN_ISA=" : "", g_env);
    return buf;
}

/* Chosen before main: KILN_ISA, else the best form. A wrong KILN_ISA stops
 * the program here, before it reads or writes anything. */
__attribute__((constructor)) static void choose_form(void) {
    const char *env = getenv("KILN_ISA");
    kiln_form f = kiln_form_best();
    if (env && *env) {
        snprintf(g_env, sizeof g_env, "%s", env);
        if (!kiln_form_parse(env, &f)) {
            fprintf(stderr, "kiln: KILN_ISA=%s: not a form of the kernels (portable, avx2 or avx512)\n", env);
            exit(2);
        }
    }
    char why[200];
    if (!kiln_form_set(f, why, sizeof why)) {
        fprintf(stderr, "kiln: KILN_ISA=%s: %s\n", env ? env : "", why);
        exit(2);
    }
}
