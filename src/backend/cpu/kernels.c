/* kiln_cpu_kernels: the CPU backend's kernel of every op, by op id. */
#include "kiln/backend.h"

/* TRANSITIONAL: each op's kernel is still its registry entry's forward. */
#define KILN_OPDEF_DECL_(id, sym) extern const kiln_op_def kiln_opdef_##sym;
KILN_OP_LIST(KILN_OPDEF_DECL_)
#define CPU_KERNEL_(id, sym)                                                                              \
    static kiln_status cpu_##sym(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out,            \
                                 kiln_tensor *const *aux) {                                               \
        return kiln_opdef_##sym.n_aux ? kiln_opdef_##sym.forward_aux(in, a, out, aux)                      \
                                      : kiln_opdef_##sym.forward(in, a, out);                              \
    }
KILN_OP_LIST(CPU_KERNEL_)
#define CPU_ENTRY_(id, sym) [KILN_OP_##id] = cpu_##sym,
const kiln_op_kernel kiln_cpu_kernels[KILN_OP_COUNT] = {KILN_OP_LIST(CPU_ENTRY_)};
