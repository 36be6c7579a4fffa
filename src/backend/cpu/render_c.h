/* Private to the CPU backend: its renderer, C with OpenMP for a planned graph. */
#ifndef KILN_RENDER_C_H
#define KILN_RENDER_C_H
#include "kiln/graph.h"
/* Fused group kernels kiln_g<k> for groups k ≡ part (mod n_parts);
 * serial_variants adds kiln_g<k>_serial / _parallel (autotuning); dynamic
 * takes each kernel's element count as a runtime argument after its
 * pointers instead of a constant. malloc'd. */
char *kiln_codegen_groups(const kiln_graph *g, int part, int n_parts, bool serial_variants, bool dynamic);
/* kiln_step: the whole step in one function (reduce-overhead). malloc'd. */
char *kiln_codegen_step(const kiln_graph *g);
#endif
