/* kiln gguf: a streaming writer of GGUF version 3 files and a checked,
 * memory-mapped reader (below the writer's declarations), the format of
 * llama.cpp (and so Ollama, LM Studio, node-llama-cpp). Part of the formats
 * layer; uses core (the tokenizer section at the end: tokenizer and
 * model_meta). What goes into a model's file (names, metadata, tokenizer)
 * is the exporter's business (kiln_export_gguf, train layer).
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
#include "kiln/model_meta.h"
#include "kiln/tokenizer.h"

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

/* The tensor types kiln reads and writes, numbered as ggml numbers them
 * (block layouts: kiln/quant.h, the kernels layer, which converts them;
 * this layer knows their sizes only). */
typedef enum {
    KILN_GGML_F32 = 0,
    KILN_GGML_F16 = 1,
    KILN_GGML_Q4_0 = 2,  /* blocks of 32 in 18 bytes */
    KILN_GGML_Q4_1 = 3,  /* blocks of 32 in 20 bytes */
    KILN_GGML_Q5_0 = 6,  /* blocks of 32 in 22 bytes */
    KILN_GGML_Q5_1 = 7,  /* blocks of 32 in 24 bytes */
    KILN_GGML_Q8_0 = 8,  /* blocks of 32: f16 scale d, then 32 int8 q; x = d * q */
    KILN_GGML_Q4_K = 12, /* blocks of 256 in 144 bytes */
    KILN_GGML_Q5_K = 13, /* blocks of 256 in 176 bytes */
    KILN_GGML_Q6_K = 14, /* blocks of 256 in 210 bytes */
    KILN_GGML_BF16 = 30,
} kiln_ggml_type;
#define KILN_Q8_0_BLOCK 32
#define KILN_Q8_0_BYTES 34

const char *kiln_ggml_type_name(kiln_ggml_type t); /* "F32", "Q4_K", ...; NULL if unknown */
/* Values per block and bytes per block of a type; 0 if unknown. */
int kiln_ggml_block(kiln_ggml_type t);
int kiln_ggml_block_bytes(kiln_ggml_type t);
/* Bytes of n values (n a multiple of the type's block); 0 for an unknown
 * type or a partial block. */
size_t kiln_ggml_nbytes(kiln_ggml_type t, int64_t n);
/* Converts n floats to F32/F16/BF16/Q8_0 (the other types: KILN_ERR_UNSUPPORTED;
 * n a multiple of 32 for Q8_0) as llama.cpp's reference
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

/* ---- reading ------------------------------------------------------------
 * kiln_gguf_open maps a GGUF file read-only and checks all of it before
 * returning: magic, version (3, or 2: the same layout), counts against the
 * bytes left, every metadata value (all types; arrays of scalars or
 * strings, nested arrays refused), tensor infos (a name under 64 bytes, 1 to
 * 4 dimensions, a type kiln reads, rows of whole blocks, an offset that is a
 * multiple of the alignment, bytes inside the file and overlapping no other
 * tensor's), general.alignment (a u32 power of two; default 32), no key or
 * tensor name twice. Each failure is KILN_ERR_FORMAT (KILN_ERR_UNSUPPORTED
 * for a version or tensor type kiln does not read) with "FILE: ..." naming
 * the key or tensor. The file stays mapped until kiln_gguf_close (NULL ok);
 * every pointer below points into it or the file's own tables. */
typedef struct kiln_gguf_file kiln_gguf_file;

typedef struct {
    const char *key;          /* NUL-terminated */
    kiln_gguf_type type;      /* value type */
    kiln_gguf_type elem_type; /* element type of an ARRAY (else = type) */
    uint64_t n;               /* elements of an ARRAY (1 for a scalar) */
    /* Scalars and arrays of scalars: the little-endian values in the
     * mapping, packed, maybe unaligned (bools one byte each); strings and
     * arrays of strings: NULL (see strs). */
    const void *data;
    /* STRING: strs[0] and lens[0]; arrays of strings: n of them. The bytes
     * are in the mapping, not NUL-terminated (use lens). NULL otherwise. */
    const char *const *strs;
    const uint64_t *lens;
} kiln_gguf_kv;

typedef struct {
    const char *name;     /* NUL-terminated */
    kiln_ggml_type type;
    int ndim;
    int64_t ne[4];        /* as in the file: innermost (row length) first, unused = 1 */
    int64_t shape[4];     /* row-major, outermost first (ne reversed) */
    int64_t numel;
    uint64_t offset;      /* from the start of the data section */
    const void *data;     /* its bytes in the mapping */
    size_t nbytes;
} kiln_gguf_tensor;

/* A tensor's bytes in the mapping (a file's, never a kiln_tensor's). */
static inline const void *kiln_gguf_bytes(const kiln_gguf_tensor *t) { return t->data; }

kiln_status kiln_gguf_open(const char *path, kiln_gguf_file **out);
void kiln_gguf_close(kiln_gguf_file *f);
const char *kiln_gguf_path(const kiln_gguf_file *f);
uint32_t kiln_gguf_version(const kiln_gguf_file *f);
uint32_t kiln_gguf_file_alignment(const kiln_gguf_file *f);
uint64_t kiln_gguf_data_offset(const kiln_gguf_file *f); /* of the data section, from the file's start */

int64_t kiln_gguf_kv_count(const kiln_gguf_file *f);
const kiln_gguf_kv *kiln_gguf_kv_at(const kiln_gguf_file *f, int64_t i); /* file order; NULL past the end */
const kiln_gguf_kv *kiln_gguf_find(const kiln_gguf_file *f, const char *key); /* NULL if absent */
const char *kiln_gguf_type_str(kiln_gguf_type t); /* "u32", "string", "array", ...; "?" if unknown */

/* Typed getters: KILN_ERR_FORMAT "FILE: key K missing" when absent, and
 * "FILE: key K is TYPE, not WANTED" when the value has another type. */
kiln_status kiln_gguf_get_u8(const kiln_gguf_file *f, const char *key, uint8_t *out);
kiln_status kiln_gguf_get_i8(const kiln_gguf_file *f, const char *key, int8_t *out);
kiln_status kiln_gguf_get_u16(const kiln_gguf_file *f, const char *key, uint16_t *out);
kiln_status kiln_gguf_get_i16(const kiln_gguf_file *f, const char *key, int16_t *out);
kiln_status kiln_gguf_get_u32(const kiln_gguf_file *f, const char *key, uint32_t *out);
kiln_status kiln_gguf_get_i32(const kiln_gguf_file *f, const char *key, int32_t *out);
kiln_status kiln_gguf_get_u64(const kiln_gguf_file *f, const char *key, uint64_t *out);
kiln_status kiln_gguf_get_i64(const kiln_gguf_file *f, const char *key, int64_t *out);
kiln_status kiln_gguf_get_f32(const kiln_gguf_file *f, const char *key, float *out);
kiln_status kiln_gguf_get_f64(const kiln_gguf_file *f, const char *key, double *out);
kiln_status kiln_gguf_get_bool(const kiln_gguf_file *f, const char *key, bool *out);
/* A string: its bytes (not NUL-terminated) and length. */
kiln_status kiln_gguf_get_str(const kiln_gguf_file *f, const char *key, const char **s, uint64_t *len);
/* An array whose elements are elem_type (STRING for arrays of strings). */
kiln_status kiln_gguf_get_array(const kiln_gguf_file *f, const char *key, kiln_gguf_type elem_type,
                                const kiln_gguf_kv **out);

int64_t kiln_gguf_tensor_count(const kiln_gguf_file *f);
const kiln_gguf_tensor *kiln_gguf_tensor_at(const kiln_gguf_file *f, int64_t i); /* file order */
const kiln_gguf_tensor *kiln_gguf_tensor_find(const kiln_gguf_file *f, const char *name); /* NULL if absent */
/* Gives the pages of a tensor's bytes back to the OS once they are copied
 * (a private read-only mapping: reading them again reloads them), so that
 * loading a model holds one copy of its weights, not two. */
void kiln_gguf_release_pages(const kiln_gguf_file *f, const kiln_gguf_tensor *t);


/* ---- tokenizer and special tokens (gguf_tok.c) ------------------------------
 * kiln_gguf_tokenizer builds the tokenizer of a file's tokenizer.ggml.* keys
 * as llama.cpp (llama-vocab.cpp) loads and runs them: kiln_tokenizer_encode
 * gives llama_tokenize's ids with parse_special (control, user-defined and
 * unknown tokens typed in the text are matched; llama.cpp also makes
 * control tokens of the texts it ends generation at and of the
 * fill-in-the-middle texts the file gives no id for), KILN_ENCODE_SPECIAL
 * adds bos/eos where llama.cpp's add_special does
 * (tokenizer.ggml.add_bos_token / add_eos_token, else its default). Read:
 *   - model "gpt2" (byte-level BPE: tokens, token_type, merges) with pre
 *     "gpt-2", "llama-bpe" or "qwen2", or another name llama.cpp treats as
 *     one of those (llama3, falcon3, deepseek-r1-qwen, ...);
 *   - model "llama" (SentencePiece BPE as llama.cpp's SPM tokenizer runs
 *     it: tokens, scores, token_type; a space prepended to each piece of
 *     text at the start or after a special token unless
 *     tokenizer.ggml.add_space_prefix is false, spaces as U+2581, the pair
 *     whose merged token scores highest merging first, the leftmost among
 *     equal scores, bytes outside the vocabulary as its <0xXX> tokens).
 * The result is a tokenizer.json (kiln_tokenizer_parse; saving writes it):
 * the same pipeline in Hugging Face's terms, the SentencePiece ranks in
 * model.kiln_merge_ranks. Refused with KILN_ERR_UNSUPPORTED naming file,
 * key and value: another model (bert, t5, ...), another or no pre
 * (llama.cpp's "default" included), a SentencePiece vocabulary without all
 * 256 byte tokens or with a token llama.cpp merges from a character that is
 * no token; with KILN_ERR_FORMAT naming file and key: a missing key,
 * token_type/scores counts other than the tokens', a text twice, text that
 * is not UTF-8, a merge that names no token, NaN scores, add_bos_token
 * without a bos token. Input that is not valid UTF-8 is not checked
 * against llama.cpp (tests/test_gguf_tok compares valid text only). */
kiln_status kiln_gguf_tokenizer(const kiln_gguf_file *f, kiln_tokenizer **out);
/* The special tokens and chat template as llama.cpp reads them: bos/pad
 * from tokenizer.ggml.bos_token_id / padding_token_id (bos: llama.cpp's
 * default when absent, 1 for llama, 11 for gpt2, none when outside the
 * vocabulary), eos_ids = eos_token_id (defaults 2, 11), then eom_token_id
 * and eot_token_id when set (the order kiln export writes Llama 3.1's list
 * in), the token strings of bos/eos/pad, tokenizer.chat_template, add_bos
 * (has_add_bos true). tok (NULL ok) must have the file's token count. Free
 * with kiln_model_meta_free. */
kiln_status kiln_gguf_model_meta(const kiln_gguf_file *f, const kiln_tokenizer *tok, kiln_model_meta *out);
/* What the commands read a tokenizer and a model's metadata from: a
 * tokenizer.json (kiln_tokenizer_load) or a GGUF file's (the two above);
 * the metadata of a model directory (kiln_model_meta_load) or a GGUF. */
kiln_status kiln_tokenizer_open_any(const char *path, kiln_tokenizer **out);
kiln_status kiln_model_meta_open_any(const char *dir_or_gguf, const kiln_tokenizer *tok, kiln_model_meta *out);

#ifdef __cplusplus
}
#endif
#endif
