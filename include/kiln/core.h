/* kiln core: tensors, the caching allocator, the counter-based RNG, errors
 * and logging. Uses libc only.
 *
 * Ownership: tensors are reference counted. A function that returns a
 * kiln_tensor* hands the caller one reference; release it with
 * kiln_tensor_release(). Storage is shared between views.
 *
 * Errors: functions that can fail return a kiln_status (0 = KILN_OK) or NULL,
 * and set a message retrievable with kiln_last_error() (thread-local). Nothing
 * below cli calls exit() or prints except through kiln_log().
 */
#ifndef KILN_CORE_H
#define KILN_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION "0.1.0"
#define KILN_MAX_DIMS 4

/* ---- errors ------------------------------------------------------------ */
typedef enum {
    KILN_OK = 0,
    KILN_ERR_INVALID = 1, /* bad argument, config or flag */
    KILN_ERR_SHAPE = 2,   /* shapes or dtypes do not fit an op */
    KILN_ERR_RANGE = 3,   /* an index or value out of range */
    KILN_ERR_IO = 4,      /* a file could not be read or written */
    KILN_ERR_FORMAT = 5,  /* a file is corrupt, truncated or malformed */
    KILN_ERR_OOM = 6,     /* out of memory */
    KILN_ERR_NUMERIC = 7, /* NaN or inf where a finite value was needed */
    KILN_ERR_UNSUPPORTED = 8,
    KILN_ERR_LIMIT = 9,   /* a configured limit was reached (e.g. compiled shape variants) */
} kiln_status;

/* Records an error (printf-style) and returns `code`, so callers can write
 * `return kiln_error(KILN_ERR_IO, "cannot open %s: %s", path, strerror(errno));` */
kiln_status kiln_error(kiln_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefixes the current error message with context ("loading x.bin: ...").
 * Use this, not kiln_error("...: %s", kiln_last_error()), to add context:
 * the prefix is formatted apart from the message it goes in front of. */
kiln_status kiln_error_context(kiln_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
const char *kiln_last_error(void);
kiln_status kiln_last_status(void);
void kiln_clear_error(void);

/* ---- text to numbers (src/core/parse.c) -------------------------------
 * The one checked parser: the whole text must be the number, in range,
 * finite, without overflow. A refusal sets "bad value 'TEXT' (expected
 * ...)"; callers prefix the flag, key or file (kiln_error_context). */
kiln_status kiln_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
kiln_status kiln_parse_int(const char *s, int lo, int hi, int *out);
/* The digits s starts with (what follows them is the caller's), in [lo, hi]. */
kiln_status kiln_parse_leading_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
kiln_status kiln_parse_u64(const char *s, uint64_t *out); /* digits only: "-1" is refused */
kiln_status kiln_parse_f64(const char *s, double lo, double hi, double *out); /* [lo, hi] */
/* Named values, ended by {NULL}; the first name of a value is its own, later
 * ones are accepted spellings ("eager" for "off"). */
typedef struct {
    const char *name;
    int value;
} kiln_choice;
kiln_status kiln_parse_choice(const char *s, const kiln_choice *choices, int *out);
const char *kiln_choice_name(const kiln_choice *choices, int value); /* "?" if none */
/* "512M", "1G", "1.5GiB", "800MB", bytes (K/M/G/T are powers of 1024). */
kiln_status kiln_parse_bytes(const char *s, int64_t *out);
/* Hugging Face's max_shard_size spelling: "5GB", "500MB" (powers of 1000),
 * "2GiB" (powers of 1024), plain bytes. */
kiln_status kiln_parse_bytes_hf(const char *s, int64_t *out);
/* bytes as the shortest exact text kiln_parse_bytes reads back ("1G"). */
const char *kiln_bytes_text(int64_t bytes, char *buf, size_t n);
/* v in [lo, hi], with the same message (text: how v was written, or NULL). */
kiln_status kiln_check_i64(int64_t v, int64_t lo, int64_t hi, const char *text);
/* Sets "bad value 'text' (expected <expected>)" and returns KILN_ERR_INVALID. */
kiln_status kiln_bad_value(const char *text, const char *expected);

/* ---- logging ----------------------------------------------------------- */
typedef enum { KILN_LOG_DEBUG, KILN_LOG_INFO, KILN_LOG_WARN, KILN_LOG_ERROR } kiln_log_level;
typedef void (*kiln_log_fn)(kiln_log_level level, const char *msg, void *user);
void kiln_log(kiln_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kiln_log_set_handler(kiln_log_fn fn, void *user); /* NULL: default (stderr) */
void kiln_log_set_level(kiln_log_level min_level);

/* ---- dtypes ------------------------------------------------------------ */
/* KILN_F16 and the block types hold weights as files ship them: safetensors
 * F16 is converted to the parameter dtype on load; a frozen base (LoRA) may
 * keep its linear weights in F16 or in one of ggml's block formats (a
 * GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: kiln/quant.h has their layouts),
 * which only a matmul's weight operand takes (it dequantizes them tile by
 * tile). A block type's tensor has rows (its last dim) of whole blocks; its
 * bytes are rows x blocks per row x bytes per block. */
typedef enum {
    KILN_F32 = 0, KILN_BF16 = 1, KILN_I32 = 2, KILN_F16 = 3,
    KILN_Q8_0 = 4, KILN_Q4_0 = 5, KILN_Q4_K = 6, KILN_Q5_K = 7, KILN_Q6_K = 8,
    KILN_Q4_1 = 9, KILN_Q5_0 = 10, KILN_Q5_1 = 11,
} kiln_dtype;
#define KILN_N_DTYPES 12
/* Bytes of one element; 0 for a block type (use kiln_shape_bytes). */
size_t kiln_dtype_size(kiln_dtype dt);
const char *kiln_dtype_name(kiln_dtype dt); /* "f32", ..., "q4_k"; "?" if unknown */
/* Values per block (1 for the plain types) and bytes per block. */
int kiln_dtype_block(kiln_dtype dt);
int kiln_dtype_block_bytes(kiln_dtype dt);
static inline bool kiln_dtype_is_block(kiln_dtype dt) { return dt >= KILN_Q8_0 && dt <= KILN_Q5_1; }
/* A weight type a matmul dequantizes (F16 and the block types). */
static inline bool kiln_dtype_is_dequant(kiln_dtype dt) { return dt == KILN_F16 || kiln_dtype_is_block(dt); }

/* bf16 <-> f32 (round to nearest even): kiln_f32_to_bf16, kiln_bf16_to_f32
 * in kiln/opmath.h, the scalar math shared with generated code. */
#include "kiln/opmath.h"

/* IEEE binary16 <-> f32 (round to nearest even; overflow gives infinity,
 * NaN stays NaN, subnormals both ways) */
static inline uint16_t kiln_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {f};
    uint32_t s = (v.u >> 16) & 0x8000u, a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN, kept quiet */
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u); /* >= 65520 rounds past 65504 */
    if (a >= 0x38800000u) { /* normal half: rebias the exponent by 127 - 15 */
        uint32_t r = a - 0x38000000u;
        return (uint16_t)(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 101) return (uint16_t)s; /* below half the smallest subnormal */
    uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - e, m = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1u))) m++;
    return (uint16_t)(s | m);
}
static inline float kiln_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (e == 0x1f) v.u = s | 0x7f800000u | (m << 13);
    else if (e) v.u = s | ((e + 112) << 23) | (m << 13);
    else {
        v.f = (float)m * 0x1p-24f; /* subnormal (or zero): exact in f32 */
        v.u |= s;
    }
    return v.f;
}

/* ---- caching allocator ------------------------------------------------- */
/* 64-byte aligned blocks, cached by size class so eager mode does not pay
 * malloc/free (and page faults) per op. Thread-safe. */
void *kiln_alloc(size_t bytes);           /* NULL + error on OOM */
void kiln_dealloc(void *ptr);
void kiln_alloc_trim(void);               /* return cached blocks to the OS */
/* Grows a malloc'd array *p of *cap elements of `elem` bytes to hold at
 * least `need` (doubling from `first`), the new elements zeroed; false on
 * overflow or OOM (then *p and *cap are unchanged). */
bool kiln_array_grow(void **p, int *cap, int need, size_t elem, int first);
/* The same for size_t capacities, without zeroing. */
bool kiln_grow(void **p, size_t *cap, size_t need, size_t elem, size_t first);
typedef struct {
    size_t live_bytes;   /* handed out now */
    size_t cached_bytes; /* held in the cache */
    size_t peak_bytes;   /* high-water mark of live + cached */
    uint64_t n_alloc, n_hits;
} kiln_alloc_stats;
kiln_alloc_stats kiln_alloc_get_stats(void);
void kiln_alloc_reset_peak(void);
/* Peak resident set size of the process in bytes (from the OS). */
size_t kiln_peak_rss(void);

/* ---- buffer types: where tensor memory lives ------------------------------
 * A buffer type says how memory of one kind is made and moved (ggml-backend's
 * buffer type, in kiln's words): allocate and free, its alignment, whether
 * the host may map it, and the only ways host code moves bytes in and out.
 * Every tensor's storage knows its buffer type; outside a backend
 * (src/backend/) and the kernels, tensor memory is touched only through
 * kiln_tensor_set / _get / _copy / _map below. Core defines the host type
 * (kiln_buft_host, the caching allocator); backends add theirs
 * (include/kiln/backend.h). */
typedef struct kiln_buffer_type kiln_buffer_type;
struct kiln_buffer_type {
    const char *name;    /* the device's name: "cpu", "cpu-isolated" */
    size_t alignment;
    bool host_mappable;  /* kiln_tensor_map gives host code a pointer */
    void *(*alloc)(size_t nbytes);  /* NULL (error set) on OOM */
    void (*free)(void *p, size_t nbytes);
    void (*write)(void *dst, const void *src, size_t n); /* host -> buffer */
    void (*read)(void *dst, const void *src, size_t n);  /* buffer -> host */
    void (*copy)(void *dst, const void *src, size_t n);  /* buffer -> buffer of this type */
    void (*zero)(void *dst, size_t n);
};
extern const kiln_buffer_type kiln_buft_host;
/* The buffer type new tensors get on this thread (kiln_tensor_new): the
 * host's unless a device scope says otherwise. _use returns the previous. */
const kiln_buffer_type *kiln_buft_current(void);
const kiln_buffer_type *kiln_buft_use(const kiln_buffer_type *b);

/* ---- tensors ----------------------------------------------------------- */
typedef struct kiln_storage kiln_storage;
/* The producer of a tensor in the eager tape. Core only knows this header
 * (a refcount and how to destroy it); the eager layer embeds it. */
typedef struct kiln_node_base {
    int refcount;
    void (*destroy)(struct kiln_node_base *self);
} kiln_node_base;
void kiln_node_release(kiln_node_base *n); /* NULL ok */

typedef struct kiln_tensor {
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    kiln_dtype dtype;
    void *data;             /* first element; contiguous row-major */
    kiln_storage *storage;  /* NULL for tensors that wrap external memory */
    int refcount;
    bool requires_grad;     /* leaves: parameters to train */
    struct kiln_tensor *grad; /* leaves: accumulated gradient (+=) */
    kiln_node_base *node;   /* producer in the eager tape, or NULL (leaf) */
    char name[96];
} kiln_tensor;

/* On the thread's current buffer type (kiln_buft_current). */
kiln_tensor *kiln_tensor_new(kiln_dtype dt, int ndim, const int64_t *shape); /* uninitialised */
kiln_tensor *kiln_tensor_zeros(kiln_dtype dt, int ndim, const int64_t *shape);
/* On a given buffer type (NULL: the host's). */
kiln_tensor *kiln_tensor_new_on(const kiln_buffer_type *b, kiln_dtype dt, int ndim, const int64_t *shape);
kiln_tensor *kiln_tensor_zeros_on(const kiln_buffer_type *b, kiln_dtype dt, int ndim, const int64_t *shape);
/* Wraps memory the caller owns and keeps alive. */
kiln_tensor *kiln_tensor_wrap(void *data, kiln_dtype dt, int ndim, const int64_t *shape);
/* A view sharing storage, with a new shape of the same numel. */
kiln_tensor *kiln_tensor_view(kiln_tensor *t, int ndim, const int64_t *shape);
kiln_tensor *kiln_tensor_retain(kiln_tensor *t);
void kiln_tensor_release(kiln_tensor *t); /* NULL ok */
/* Every tensor constructor checks its shape with this, so numel and
 * nbytes of a tensor that exists never overflow. */
int64_t kiln_tensor_numel(const kiln_tensor *t);
/* Checked element count and bytes of a shape: KILN_ERR_RANGE (naming the
 * shape) when the bytes overflow 64 bits or exceed PTRDIFF_MAX. Either out
 * may be NULL. */
kiln_status kiln_shape_bytes(kiln_dtype dt, int ndim, const int64_t *shape, int64_t *numel, size_t *nbytes);
/* Bytes of memory this process could still take: the smaller of
 * MemAvailable (/proc/meminfo; sysconf's available pages where that is
 * missing) and the room left under a cgroup v2 memory.max. 0 when unknown;
 * *source (may be NULL) names where the number came from. */
uint64_t kiln_mem_available_bytes(const char **source);
size_t kiln_tensor_nbytes(const kiln_tensor *t);
bool kiln_tensor_same_shape(const kiln_tensor *a, const kiln_tensor *b);
/* "[2, 3, 4] f32" into buf */
const char *kiln_shape_str(const kiln_tensor *t, char *buf, size_t n);
/* "[2, 3, 4]" (a shape alone) into buf */
const char *kiln_dims_str(int ndim, const int64_t *shape, char *buf, size_t n);
void kiln_tensor_set_name(kiln_tensor *t, const char *name);
/* Host access through the seam. Offsets and sizes are in bytes and checked
 * against the tensor (KILN_ERR_RANGE naming it). _copy moves bytes between
 * two tensors of any buffer types (through the host when they differ). */
kiln_status kiln_tensor_set(kiln_tensor *t, size_t off, const void *src, size_t n);
kiln_status kiln_tensor_get(const kiln_tensor *t, size_t off, void *dst, size_t n);
kiln_status kiln_tensor_copy(kiln_tensor *dst, size_t doff, const kiln_tensor *src, size_t soff, size_t n);
kiln_status kiln_tensor_zero(kiln_tensor *t);
/* Element i of an f32 / i32 tensor, read through the seam (NaN / 0 with the
 * error set when out of range). */
float kiln_tensor_item_f32(const kiln_tensor *t, int64_t i);
/* The tensor's memory for host code when its buffer type is host-mappable;
 * NULL with an error naming the tensor and the device otherwise. */
void *kiln_tensor_map(const kiln_tensor *t);
/* The device address of a tensor's first element, to hand to code that
 * runs on its device (a backend's kernels, generated modules inside
 * kiln_backend_exec): an address, never to be dereferenced by host code. */
static inline void *kiln_tensor_ptr(const kiln_tensor *t) { return t->data; }
/* The device address of element i of an f32 tensor, for kernels inside
 * kiln_backend_exec (a slice handed to them; host code never reads it). */
static inline float *kiln_tensor_ptr_f32(const kiln_tensor *t, int64_t i) { return (float *)t->data + i; }
/* A tensor of the given meta sharing base's storage from byte offset off
 * (checked to fit): the interpreter's planned buffers in its arena. */
kiln_tensor *kiln_tensor_view_bytes(kiln_tensor *base, size_t off, kiln_dtype dt, int ndim, const int64_t *shape);
/* The buffer type of a tensor's memory (tensors that wrap host memory: the
 * host's). */
const kiln_buffer_type *kiln_tensor_buft(const kiln_tensor *t);
/* Raw element pointers: for kernels and backends, which run where the
 * memory is (scripts/storage.sh keeps them out of every other file). */
static inline float *kiln_f32(const kiln_tensor *t) { return (float *)t->data; }
static inline int32_t *kiln_i32(const kiln_tensor *t) { return (int32_t *)t->data; }

/* ---- RNG --------------------------------------------------------------- */
/* Counter-based (stateless hash of seed and counter): element i of a draw
 * depends only on (seed, offset + i), so results are identical for any
 * number of threads. */
/* A 64-bit mix (MurmurHash3's finaliser) and a hash of a byte string built
 * on it: for hash tables and for choosing by content (a document's
 * train/val split); not cryptographic. */
static inline uint64_t kiln_hash_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}
uint64_t kiln_hash_bytes(const void *p, size_t n);
typedef struct { uint64_t seed; uint64_t offset; } kiln_rng;
uint64_t kiln_rng_u64(uint64_t seed, uint64_t counter);
/* Fills n values and advances rng->offset by n. */
void kiln_rng_normal(kiln_rng *rng, float *out, int64_t n, float mean, float std);
void kiln_rng_uniform(kiln_rng *rng, float *out, int64_t n, float lo, float hi);
double kiln_rng_next_double(kiln_rng *rng); /* [0,1) */
uint64_t kiln_rng_next_u64(kiln_rng *rng);

/* ---- text ---------------------------------------------------------------- */
/* A growing string for generated text (SVG, C source). Zero-initialise it;
 * append with kiln_strbuf_printf; an allocation failure sets oom and later
 * appends do nothing. Free b->s when done. */
typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} kiln_strbuf;
void kiln_strbuf_printf(kiln_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- files ------------------------------------------------------------- */
/* Writes `n` bytes atomically: temp file beside `path`, write, fsync, rename,
 * fsync of the directory. On any failure the old file at `path` is untouched
 * and the temp file removed. */
kiln_status kiln_write_file_atomic(const char *path, const void *data, size_t n);
/* Reads a whole file into a malloc'd buffer (NUL-terminated; *n excludes it). */
kiln_status kiln_read_file(const char *path, char **data, size_t *n);
/* Maps a regular file read-only (*data, *size; unmap with munmap); a file
 * shorter than min_size is KILN_ERR_FORMAT "PATH: file is N bytes, too
 * short for WHAT". */
kiln_status kiln_map_file(const char *path, size_t min_size, const char *what, const void **data, size_t *size);
/* Removes a file or a directory tree (not following links); absent is fine. */
kiln_status kiln_remove_tree(const char *path);
/* fsync of a directory (its entries' renames made durable); filesystems that
 * refuse (EINVAL) are fine. */
kiln_status kiln_fsync_dir(const char *path);
/* kiln's cache directory (compiled modules, the GEMM choices):
 * $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; false
 * (out = "") when none is set or the path does not fit in n bytes. */
bool kiln_cache_dir(char *out, size_t n);
/* Copies the file src to dst atomically (read whole, written as above). */
kiln_status kiln_copy_file_atomic(const char *src, const char *dst);
/* The same guarantees for a file written piece by piece (large exports that
 * must never be held whole in memory): _open creates a uniquely named temp
 * file beside `path` (O_EXCL); _write appends through a small buffer (the
 * first failure is kept and every later call returns it); _commit flushes,
 * fsyncs, renames over `path` and fsyncs the directory; _abort (NULL ok)
 * removes the temp file. Both _commit and _abort free the handle. */
typedef struct kiln_atomic_file kiln_atomic_file;
kiln_status kiln_atomic_open(const char *path, kiln_atomic_file **out);
kiln_status kiln_atomic_write(kiln_atomic_file *f, const void *data, size_t n);
uint64_t kiln_atomic_tell(const kiln_atomic_file *f); /* bytes written so far */
kiln_status kiln_atomic_commit(kiln_atomic_file *f);
void kiln_atomic_abort(kiln_atomic_file *f);

/* Target id meaning "no loss here" (padding), as in PyTorch/Hugging Face. */
#define KILN_IGNORE_INDEX (-100)

/* ---- threads ----------------------------------------------------------- */
int kiln_num_threads(void);
void kiln_set_num_threads(int n);
double kiln_time_now(void); /* seconds, monotonic */

#ifdef __cplusplus
}
#endif
#endif
