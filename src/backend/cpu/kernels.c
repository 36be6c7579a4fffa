/* kiln_cpu_kernels: the CPU backend's kernel of every op, by op id (each
 * defined in src/backend/cpu/ops_*.c; an op added to KILN_OP_LIST without
 * one does not link), then the seam's own kernels (KILN_KERNEL_*). */
#include "cpu_ops.h"

#define CPU_ENTRY_(id, sym) [KILN_OP_##id] = kiln_cpu_op_##sym,
const kiln_op_kernel kiln_cpu_kernels[KILN_N_KERNELS] = {
    KILN_OP_LIST(CPU_ENTRY_)[KILN_KERNEL_ACCUMULATE] = kiln_cpu_accumulate,
};
