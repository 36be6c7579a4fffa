/* The train layer's host side of tensor memory (internal to src/train/):
 * files are read and written in host memory, parameters and optimiser
 * state live on a device, and bytes cross only through the seam
 * (kiln_tensor_set / _get, or kiln_tensor_map where the device's memory is
 * host-mappable, which makes the CPU's loads and saves copy-free as
 * before). Conversions run on host chunks in element order, so their
 * arithmetic is the element-by-element loop's. */
#ifndef KILN_TRAIN_HOSTIO_H
#define KILN_TRAIN_HOSTIO_H
#include "kiln/backend.h"
#include "kiln/train.h"

/* Elements [first, first + n) of a tensor, converted into dst (room for n
 * elements of the tensor's dtype) from the caller's source. */
typedef void (*kiln_host_fill_fn)(void *dst, int64_t first, int64_t n, const void *ctx);
/* Fills every element of t: in place when t is host-mappable, else chunk
 * by chunk through a host buffer and kiln_tensor_set. */
kiln_status kiln_host_fill(kiln_tensor *t, kiln_host_fill_fn fn, const void *ctx);
/* t's bytes from host memory (src holds kiln_tensor_nbytes(t) bytes). */
kiln_status kiln_host_set_all(kiln_tensor *t, const void *src);

/* Elements [first, first + n) of a tensor, in host memory, for the caller. */
typedef kiln_status (*kiln_host_read_fn)(const void *src, int64_t first, int64_t n, void *ctx);
/* Hands every element of t to fn: all at once when t is host-mappable, else
 * chunk by chunk through a host buffer and kiln_tensor_get. */
kiln_status kiln_host_read(const kiln_tensor *t, kiln_host_read_fn fn, void *ctx);

/* All of t's bytes in host memory: the tensor's own memory when it is
 * host-mappable (*owned = NULL), else a malloc'd copy (*owned = it, the
 * caller frees). NULL with the error set on OOM. */
const void *kiln_host_bytes(const kiln_tensor *t, void **owned);

/* AdamW's hyper-parameters and step as safetensors metadata (into meta, a
 * NULL-ended key/value list of at most 13 entries over buf), and the
 * warning for each a loaded file holds with another value. */
struct kiln_st_file;
void kiln_adamw_meta(const kiln_adamw *o, char buf[5][32], const char **meta);
void kiln_adamw_meta_check(struct kiln_st_file *f, const char *path, const kiln_adamw *o);

/* The backend a model's parameters live on (the device it was made on). */
const kiln_backend *kiln_model_backend(const kiln_llama *m);
#endif
