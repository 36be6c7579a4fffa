/* The CPU backend: host memory (core's caching allocator), the kernels of
 * src/kernels/ through kiln_cpu_kernels, the interpreter for planned
 * graphs, the OpenMP C renderer (render_c.c) and `cc` (compile/
 * build.c). exec is a plain call: the host may touch this memory anywhere. */
#include "kiln/backend.h"
#include "kiln/build.h"
#include "kiln/kernels.h"
#include "render_c.h"

static kiln_status exec_call(kiln_status (*fn)(void *), void *ctx) { return fn(ctx); }
static void sync_none(void) {}
/* no AVX512-BF16 (or KILN_BF16=emulated): fp32 GEMMs of rounded operands */
bool kiln_cpu_bf16_emulated(void) { return !kiln_bf16_native(); }
static bool supports_all(int op, const kiln_meta *in, int n_in) {
    (void)in, (void)n_in;
    return op >= 0 && op < KILN_OP_COUNT && kiln_cpu_kernels[op];
}

static kiln_status cc_build(const char *const *parts, int n_parts, const struct kiln_build_options *o,
                            struct kiln_module **out, struct kiln_build_info *info) {
    return kiln_module_build(parts, n_parts, o, out, info);
}

const kiln_renderer kiln_cpu_renderer = {
    .language = "C with OpenMP",
    .groups = kiln_codegen_groups,
    .step = kiln_codegen_step,
};
const kiln_compiler_desc kiln_cpu_compiler = {.name = "cc", .target = "host", .build = cc_build};

const kiln_backend kiln_backend_cpu = {
    .name = "cpu",
    .description = "the host: GEMM chosen by measurement, kiln's kernels, generated OpenMP C built with cc",
    .caps = KILN_BACKEND_HOST_MAPPABLE | KILN_BACKEND_COMPILE | KILN_BACKEND_BF16 | KILN_BACKEND_MPI,
    .buft = &kiln_buft_host,
    .kernels = kiln_cpu_kernels,
    .supports_op = supports_all,
    .exec = exec_call,
    .synchronize = sync_none,
    .bf16_emulated = kiln_cpu_bf16_emulated,
    .renderer = &kiln_cpu_renderer,
    .compiler = &kiln_cpu_compiler,
};
