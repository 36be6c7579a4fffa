/* kiln gguf: a streaming writer of GGUF version 3 files, the format of
 * llama.cpp (and so Ollama, LM Studio, node-llama-cpp). Part of the data
 * layer; uses core only. What goes into a model's file (names, metadata,
 * tokenizer) is the exporter's business (kiln_export_gguf, train layer).
 *
 * Layout (little endian): "GGUF", u32 version 3, u64 tensor count, u64
 * key/value count; the key/value pairs (string key, u32 value type, value);
 * one info per tensor (string name, u32 dims, u64 ne[dims] innermost first,
 * u32 ggml type, u64 offset into the data section); zero padding to the
 * alignment; the tensor data, each tensor starting at a multiple of the
 * alignment (padded after each tensor, the last included). Strings are a
 * u64 byte length and the bytes, no terminator. The alignment is the u32
 * "general.alignment" when set (a power of two, multiple of 8), else 32.
 *
 * Use: kiln_gguf_writer_new; set metadata and declare tensors (in file
 * order) while nothing is written; kiln_gguf_begin writes header, metadata
 * and tensor infos to a temp file beside the target; kiln_gguf_write_data
 * appends the bytes of the tensors in declared order, in pieces of any size;
 * kiln_gguf_finish checks every tensor got exactly its size, pads and
 * renames the file into place (atomic: a failed export leaves any previous
 * file untouched). Metadata and tensor infos are kept in memory, tensor data
 * never is. kiln_gguf_writer_free (NULL ok) frees the writer and removes the
 * temp file of an unfinished export.
 *
 * Errors: kiln_status + kiln_last_error() naming the key or tensor: a
 * duplicate key or tensor name, a name of 64 bytes or more (llama.cpp's
 * limit), more than 4 dimensions, a Q8_0 row not a multiple of 32, a bad
 * alignment, calls in the wrong phase, too many or too few data bytes.
 */
#ifndef KILN_GGUF_H
#define KILN_GGUF_H

#include "kiln/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_GGUF_VERSION 3
#define KILN_GGUF_DEFAULT_ALIGNMENT 32
#define KILN_GGUF_MAX_NAME 63 /* bytes of a tensor name (ggml's GGML_MAX_NAME - 1) */

/* Metadata value types, numbered as in the file. */
typedef enum {
    KILN_GGUF_UINT8 = 0, KILN_GGUF_INT8 = 1, KILN_GGUF_UINT16 = 2, KILN_GGUF_INT16 = 3,
    KILN_GGUF_UINT32 = 4, KILN_GGUF_INT32 = 5, KILN_GGUF_FLOAT32 = 6, KILN_GGUF_BOOL = 7,
    KILN_GGUF_STRING = 8, KILN_GGUF_ARRAY = 9, KILN_GGUF_UINT64 = 10, KILN_GGUF_INT64 = 11,
    KILN_GGUF_FLOAT64 = 12,
} kiln_gguf_type;

/* The tensor types kiln writes, numbered as ggml numbers them. */
typedef enum {
    KILN_GGML_F32 = 0,
    KILN_GGML_F16 = 1,
    KILN_GGML_Q8_0 = 8,  /* blocks of 32: f16 scale d, then 32 int8 q; x = d * q */
    KILN_GGML_BF16 = 30,
} kiln_ggml_type;
#define KILN_Q8_0_BLOCK 32
#define KILN_Q8_0_BYTES 34

const char *kiln_ggml_type_name(kiln_ggml_type t); /* "F32", ...; NULL if unknown */
/* Bytes of n values (n a multiple of 32 for Q8_0); 0 for an unknown type. */
size_t kiln_ggml_nbytes(kiln_ggml_type t, int64_t n);
/* Converts n floats (n a multiple of 32 for Q8_0) as llama.cpp's reference
 * code does (F16 and BF16 through core's kiln_f32_to_f16/_bf16: round to
 * nearest even), Q8_0 d = max|x| / 127 and q = round-half-away(x / d). out holds kiln_ggml_nbytes(t, n) bytes. */
kiln_status kiln_ggml_convert(kiln_ggml_type t, const float *x, int64_t n, void *out);

typedef struct kiln_gguf_writer kiln_gguf_writer;
kiln_status kiln_gguf_writer_new(kiln_gguf_writer **out);
void kiln_gguf_writer_free(kiln_gguf_writer *w);

/* Scalars: `value` points to one value of `type` (bool as a C bool; not
 * STRING or ARRAY). */
kiln_status kiln_gguf_set(kiln_gguf_writer *w, const char *key, kiln_gguf_type type, const void *value);
kiln_status kiln_gguf_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v);
kiln_status kiln_gguf_set_i32(kiln_gguf_writer *w, const char *key, int32_t v);
kiln_status kiln_gguf_set_f32(kiln_gguf_writer *w, const char *key, float v);
kiln_status kiln_gguf_set_bool(kiln_gguf_writer *w, const char *key, bool v);
kiln_status kiln_gguf_set_str(kiln_gguf_writer *w, const char *key, const char *s); /* NUL-terminated */
kiln_status kiln_gguf_set_strn(kiln_gguf_writer *w, const char *key, const char *s, size_t len);
/* Arrays of n scalars of elem_type (bools as C bools), or n strings (lens
 * NULL: NUL-terminated). Arrays of arrays are refused. */
kiln_status kiln_gguf_set_array(kiln_gguf_writer *w, const char *key, kiln_gguf_type elem_type, const void *values,
                                uint64_t n);
kiln_status kiln_gguf_set_str_array(kiln_gguf_writer *w, const char *key, const char *const *strs, const size_t *lens,
                                    uint64_t n);

/* Declares the next tensor: shape in row-major order, outermost first (a
 * [rows, cols] matrix becomes ne = {cols, rows} in the file). */
kiln_status kiln_gguf_add_tensor(kiln_gguf_writer *w, const char *name, kiln_ggml_type type, int ndim,
                                 const int64_t *shape);
int kiln_gguf_n_tensors(const kiln_gguf_writer *w);
uint32_t kiln_gguf_alignment(const kiln_gguf_writer *w);
/* Offset of tensor i's data from the start of the data section and its
 * size in bytes; valid once all tensors are declared. */
uint64_t kiln_gguf_tensor_offset(const kiln_gguf_writer *w, int i);
uint64_t kiln_gguf_tensor_nbytes(const kiln_gguf_writer *w, int i);

kiln_status kiln_gguf_begin(kiln_gguf_writer *w, const char *path);
kiln_status kiln_gguf_write_data(kiln_gguf_writer *w, const void *data, size_t n);
kiln_status kiln_gguf_finish(kiln_gguf_writer *w);

#ifdef __cplusplus
}
#endif
#endif
