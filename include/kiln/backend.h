/* kiln backend: the device seam. A backend is a table of functions (in the
 * spirit of ggml-backend and tinygrad's Compiled device): its name and
 * capabilities, the buffer type its tensors live in (core's
 * kiln_buffer_type: alloc, free, alignment, host-mappable, set / get /
 * copy), which ops it runs and their kernels, a way to run host code where
 * its memory may be touched (its kernels, a planned graph, generated code,
 * the optimiser's multi-tensor kernels), synchronisation, and for compiled
 * graphs a renderer (the source text around kiln's shared op math) and a
 * compiler descriptor (how to build and load a module, the target in the
 * cache key).
 *
 * The backends kiln has are one list (KILN_BACKENDS): "cpu" (the host: its
 * kernels, interpreter, OpenMP C renderer and `cc`) and "cpu-isolated", a
 * strict second device that proves the seam on a machine without a GPU:
 * its buffers are never host-mappable, and in builds with
 * -DKILN_STRICT_DEVICE (the sanitizer builds) they are mprotect()ed to no
 * access outside the backend's own calls, so any stray host access faults
 * at once. It runs the CPU kernels inside its calls.
 *
 * A new device is a folder under src/backend/ with its table and one line
 * in KILN_BACKENDS (docs/DESIGN.md has the CUDA plan).
 *
 * Ownership: backends are static tables; nothing to free. Errors: a
 * kiln_status with kiln_last_error() naming the device and the op.
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include "kiln/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every backend, once: X(IDENT, "name"). The --device choices, `kiln
 * devices` and the registry come from this list; index = KILN_DEVICE_<IDENT>. */
#define KILN_BACKENDS(X) X(CPU, "cpu") X(CPU_ISOLATED, "cpu-isolated")
#define KILN_DEVICE_ENUM_(id, name) KILN_DEVICE_##id,
typedef enum { KILN_BACKENDS(KILN_DEVICE_ENUM_) KILN_N_DEVICES } kiln_device_id;
#define KILN_DEVICE_NAME_(id, name) " " name
#define KILN_DEVICE_NAMES KILN_BACKENDS(KILN_DEVICE_NAME_)

enum {
    KILN_BACKEND_HOST_MAPPABLE = 1u, /* host code may map its tensors */
    KILN_BACKEND_COMPILE = 2u,       /* has a renderer and a compiler */
    KILN_BACKEND_BF16 = 4u,          /* bf16 products (native or emulated) */
    KILN_BACKEND_MPI = 8u,           /* data parallel over MPI (through host staging if not mappable) */
};

/* One op's kernel: inputs, attributes, the output and the extra outputs of
 * a multi-output op (aux NULL for the others), all on this backend. */
typedef kiln_status (*kiln_op_kernel)(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out,
                                      kiln_tensor *const *aux);

/* A backend's kernel table is indexed by op id (KILN_OP_*), then by the
 * seam's own kernels, which are no op of the registry:
 *  KILN_KERNEL_ACCUMULATE: out += s·in[0], f32, same element count (a
 *    gradient: kiln_op_accumulate, the interpreter's gradient sinks); in[1]
 *    is NULL (s = 1) or a one-element f32 tensor holding s.
 * The MATMUL kernel reads attribute f0 as beta (out = a·b + beta·out): 0 for
 * an op call (its shape rule refuses others), 1 for kiln_matmul_into. */
enum { KILN_KERNEL_ACCUMULATE = KILN_OP_COUNT, KILN_N_KERNELS };

struct kiln_graph;
struct kiln_module;
struct kiln_build_options;
struct kiln_build_info;

/* How generated source for a planned graph is written: the loops,
 * launches and signatures around the op math every backend shares
 * (include/kiln/opmath.h and the ops' C expressions). */
typedef struct {
    const char *language; /* "C with OpenMP" */
    /* fused group kernels kiln_g<k> for groups k = part (mod n_parts) */
    char *(*groups)(const struct kiln_graph *g, int part, int n_parts, bool serial_variants, bool dynamic);
    /* the whole step as one function (reduce-overhead) */
    char *(*step)(const struct kiln_graph *g);
} kiln_renderer;

/* How rendered source becomes a loaded module; `target` goes into the
 * cache key beside the compiler's own identity and the CPU's features. */
typedef struct {
    const char *name;   /* "cc" */
    const char *target; /* "host" */
    kiln_status (*build)(const char *const *parts, int n_parts, const struct kiln_build_options *o,
                         struct kiln_module **out, struct kiln_build_info *info);
} kiln_compiler_desc;

typedef struct kiln_backend {
    const char *name;
    const char *description;
    unsigned caps; /* KILN_BACKEND_* */
    const kiln_buffer_type *buft;
    /* the op's kernel, NULL where the backend does not run it */
    const kiln_op_kernel *kernels; /* [KILN_N_KERNELS] */
    /* whether it runs this op on these inputs (dtype checks beyond the op's own) */
    bool (*supports_op)(int op, const kiln_meta *in, int n_in);
    /* Runs fn(ctx) where this backend's memory may be touched (the CPU:
     * a call; cpu-isolated: with its buffers opened for the call). */
    kiln_status (*exec)(kiln_status (*fn)(void *ctx), void *ctx);
    void (*synchronize)(void);
    /* bf16 products (KILN_BACKEND_BF16) that are fp32 products of operands
     * rounded to bf16 (emulated): compiled graphs then hand them the
     * rounded values in fp32 (round_bf16), not bf16. NULL: never. */
    bool (*bf16_emulated)(void);
    const kiln_renderer *renderer;    /* NULL: compiled graphs run in the interpreter */
    const kiln_compiler_desc *compiler;
} kiln_backend;

/* The backend of index i (KILN_DEVICE_*), or NULL. */
const kiln_backend *kiln_backend_at(int i);
/* By name; NULL with an error naming the known ones. */
const kiln_backend *kiln_backend_find(const char *name);
/* The backend whose buffer type holds the tensor's memory (host memory
 * that a tensor wraps: the CPU). */
const kiln_backend *kiln_backend_of(const kiln_tensor *t);
/* The backend new tensors of this thread are made on (kiln_buft_current). */
const kiln_backend *kiln_backend_current(void);
/* whether b's bf16 products are emulated (its bf16_emulated entry; false
 * without one or for NULL) */
bool kiln_backend_bf16_emulated(const kiln_backend *b);
/* Makes b this thread's device (new tensors on b->buft); returns the
 * previous one. */
const kiln_backend *kiln_backend_use(const kiln_backend *b);
/* Every input on one device, returned; otherwise NULL with an error naming
 * the op and both devices. Tensors without memory (a tracer's symbolic
 * values) are on no device and fit any. No input: the current device. */
const kiln_backend *kiln_backend_of_inputs(const char *op, kiln_tensor *const *in, int n_in);
/* Runs fn(ctx) through b->exec. */
kiln_status kiln_backend_exec(const kiln_backend *b, kiln_status (*fn)(void *ctx), void *ctx);
/* Runs op's kernel (an op id or a KILN_KERNEL_*) on b, inside b's exec
 * (inputs and outputs already on b). */
kiln_status kiln_backend_run_op(const kiln_backend *b, int op, kiln_tensor *const *in, const kiln_attrs *a,
                                kiln_tensor *out, kiln_tensor *const *aux);

/* The CPU backend's kernel table, renderer and compiler (src/backend/cpu/),
 * which cpu-isolated shares. */
extern const kiln_op_kernel kiln_cpu_kernels[KILN_N_KERNELS];
extern const kiln_renderer kiln_cpu_renderer;
extern const kiln_compiler_desc kiln_cpu_compiler;
bool kiln_cpu_bf16_emulated(void);

#ifdef __cplusplus
}
#endif
#endif
