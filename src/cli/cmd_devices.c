/* `kiln devices`: every backend of KILN_BACKENDS with what it is, where its
 * tensors live (buffer type: alignment, host-mappable), what it can do
 * (compiled graphs: the renderer's language and the compiler; bf16; MPI)
 * and how many ops it has kernels for; then the CPU's instruction sets and
 * the kernels' form that runs (kiln/simd.h). */
#include <stdio.h>
#include "cli.h"
#include "kiln/backend.h"
#include "kiln/kernels.h"
#include "kiln/simd.h"

static const char *devices_usage =
    "usage: kiln devices\n"
    "\n"
    "Lists the devices kiln can run on (the names --device takes): each one's\n"
    "description, its buffer type (alignment, whether host code may map its\n"
    "memory), its capabilities (compiled graphs: the renderer's language and the\n"
    "compiler; bf16; MPI data parallel) and how many ops it has kernels for;\n"
    "then the CPU's instruction sets and which form of the CPU kernels runs\n"
    "(portable, avx2 or avx512: the best this CPU runs, or KILN_ISA's), and the\n"
    "GEMM implementations its per-shape choice measures (oneDNN, kiln's own,\n"
    "and OpenBLAS and BLIS where their OpenMP builds are installed).\n"
    "\n"
    "options:\n"
    "  -h, --help      this text\n";

int kiln_cmd_devices(int argc, char **argv) {
    int pr = kiln_cli_parse("devices", argc, argv, NULL, 0, devices_usage, NULL, 0, NULL);
    if (pr) return pr == 1 ? 0 : 2;
    for (int i = 0; i < KILN_N_DEVICES; i++) {
        const kiln_backend *b = kiln_backend_at(i);
        if (!b) continue;
        int n = 0;
        for (int op = 0; op < KILN_OP_COUNT; op++) n += b->kernels && b->kernels[op];
        printf("%s%s\n  %s\n", i ? "\n" : "", b->name, b->description);
        printf("  buffers:  %s, alignment %zu bytes, %s\n", b->buft->name, b->buft->alignment,
               b->buft->host_mappable ? "host-mappable" : "not host-mappable (moved through set/get/copy only)");
        if ((b->caps & KILN_BACKEND_COMPILE) && b->renderer && b->compiler)
            printf("  compile:  %s, built with %s (target %s)\n", b->renderer->language, b->compiler->name,
                   b->compiler->target);
        else
            printf("  compile:  no (compiled steps run in the interpreter)\n");
        printf("  bf16:     %s\n", b->caps & KILN_BACKEND_BF16 ? "yes" : "no");
        printf("  MPI:      %s\n", b->caps & KILN_BACKEND_MPI
                                       ? (b->buft->host_mappable ? "yes" : "yes (through host staging)")
                                       : "no");
        printf("  kernels:  %d of %d ops\n", n, KILN_OP_COUNT);
    }
    /* both CPU devices run the kernels of src/kernels/simd/ in one form */
    printf("\nCPU kernels: form %s; KILN_ISA=portable|avx2|avx512 chooses another\n", kiln_form_describe());
    printf("CPU GEMM: %s\n", kiln_gemm_backend());
    return 0;
}
