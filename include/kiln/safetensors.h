/* kiln safetensors: reading and writing the Hugging Face safetensors format.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {"k": "v", ...},
 *    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
 * padded with spaces, then the data buffer (offsets are relative to its start).
 *
 * Reading maps the file read-only; the tensors point into the mapping (or,
 * for a tensor whose offset is not a multiple of its element size, into an
 * aligned private copy), so `bytes` may be cast to float / uint16_t / int32_t.
 * Everything returned by kiln_st_* belongs to the kiln_st_file and lives until
 * kiln_st_close(). Every bound and size in the header is checked; errors name
 * the file and the tensor and come back as a kiln_status plus
 * kiln_last_error() text:
 *   KILN_ERR_IO          the file cannot be opened, mapped or written
 *   KILN_ERR_FORMAT      truncated file, bad header length, bad JSON, bad
 *                        shape/dtype/offsets, data size that does not fit
 *   KILN_ERR_UNSUPPORTED a valid safetensors dtype kiln has no type for
 *                        (I64, F64, F8_*, ...)
 * Supported dtypes: F32, F16, BF16, I32. Shapes whose byte size (or any
 * partial product of dims) passes INT64_MAX are refused as FORMAT errors.
 *   KILN_ERR_INVALID     bad arguments to kiln_st_save
 *
 * Writing (kiln_st_save) is atomic: a temp file beside the target is written,
 * fsynced and renamed over it, then the directory is fsynced, so a failed or
 * interrupted save leaves any previous file intact. Tensors are streamed from
 * the caller's memory; no buffer of the whole file is built. The layout
 * matches the Python `safetensors` library: tensors sorted by dtype (F32,
 * then I32, then BF16, then F16, following its dtype order, largest first) and then by
 * name, packed without gaps; "__metadata__" first with keys sorted; compact
 * JSON padded with spaces to a multiple of 8 bytes. Saving over a file that
 * is open with kiln_st_open is safe (the mapping keeps the old contents).
 */
#ifndef KILN_SAFETENSORS_H
#define KILN_SAFETENSORS_H

#include "kiln/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    kiln_dtype dtype;
    int ndim;                       /* 0..KILN_MAX_DIMS; 0 is a scalar */
    int64_t shape[KILN_MAX_DIMS];
    const void *bytes;              /* may be NULL when nbytes == 0 */
    size_t nbytes;                  /* numel * dtype size */
} kiln_st_tensor;

typedef struct kiln_st_file kiln_st_file;

/* Opens and validates `path`; on success *out owns the mapping. */
kiln_status kiln_st_open(const char *path, kiln_st_file **out);
void kiln_st_close(kiln_st_file *f); /* NULL ok */

/* Tensors in file order (ascending data offset). */
int kiln_st_count(const kiln_st_file *f);
const kiln_st_tensor *kiln_st_at(const kiln_st_file *f, int i); /* NULL if out of range */
const kiln_st_tensor *kiln_st_find(const kiln_st_file *f, const char *name); /* NULL if absent */

/* "__metadata__" entries, keys sorted. */
const char *kiln_st_metadata(const kiln_st_file *f, const char *key); /* NULL if absent */
int kiln_st_metadata_count(const kiln_st_file *f);
/* Key of entry i (value through *value if non-NULL); NULL if out of range. */
const char *kiln_st_metadata_at(const kiln_st_file *f, int i, const char **value);

/* Writes `n` tensors (names unique, not "__metadata__") and optional string
 * metadata given as a NULL-terminated list "k1", "v1", "k2", "v2", ..., NULL. */
kiln_status kiln_st_save(const char *path, const kiln_st_tensor *tensors, int n,
                         const char *const *meta_kv);

#ifdef __cplusplus
}
#endif
#endif
