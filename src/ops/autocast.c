/* The autocast switch (mixed precision): a per-thread setting read by
 * kiln_matmul when it builds a MATMUL's attributes, so model code stays
 * unchanged and tracing records the choice in the graph. */
#include "internal.h"

static _Thread_local kiln_dtype g_autocast = KILN_F32;

kiln_dtype kiln_autocast_set(kiln_dtype dt) {
    kiln_dtype old = g_autocast;
    g_autocast = dt == KILN_BF16 ? KILN_BF16 : KILN_F32;
    return old;
}

kiln_dtype kiln_autocast_get(void) { return g_autocast; }

kiln_status kiln_precision_parse(const char *s, kiln_dtype *out) {
    if (s && (!strcmp(s, "fp32") || !strcmp(s, "f32") || !strcmp(s, "float32"))) *out = KILN_F32;
    else if (s && (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))) *out = KILN_BF16;
    else return kiln_error(KILN_ERR_INVALID, "precision must be fp32 or bf16, got '%s'", s ? s : "(null)");
    return KILN_OK;
}
