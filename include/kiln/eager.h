/* kiln eager: ops execute as they are called, and a tape records what
 * backward needs (like PyTorch's default mode).
 *
 * kiln_eager_enable() installs the recording dispatcher on the calling
 * thread. An op whose inputs need a gradient (a parameter with
 * requires_grad, or a tensor computed from one) gets a tape node holding the
 * tensors its backward rule reads. kiln_backward(loss) walks the tape once,
 * runs each op's backward rule (written with ops, shared with the compiler),
 * adds (+=) into every parameter's .grad, and frees the tape's saved
 * tensors. Frozen parameters (requires_grad false) get no gradient and cost
 * no backward work for their own gradient.
 *
 * Errors: kiln_status + kiln_last_error().
 */
#ifndef KILN_EAGER_H
#define KILN_EAGER_H

#include "kiln/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

void kiln_eager_enable(void);
void kiln_eager_disable(void);
/* Turns tape recording on/off on this thread (torch.no_grad); returns the
 * previous setting. */
bool kiln_grad_set_enabled(bool on);
bool kiln_grad_enabled(void);
/* loss must hold one element; the seed gradient is 1. */
kiln_status kiln_backward(kiln_tensor *loss);
/* Seeds with `grad` (same shape as `out`). */
kiln_status kiln_backward_with(kiln_tensor *out, kiln_tensor *grad);
/* kiln_backward calls the gradient-ready hook (kiln/ops.h) once a
 * parameter's gradient is complete for that backward (its last accumulation
 * on the tape), in the order backward finishes them. */
/* Per-op wall time on this thread: pass a table of KILN_OP_COUNT entries
 * (zeroed here) to start, NULL to stop. */
typedef struct {
    double seconds, flops;
    uint64_t calls;
} kiln_op_profile;
void kiln_eager_profile(kiln_op_profile *table);

#ifdef __cplusplus
}
#endif
#endif
