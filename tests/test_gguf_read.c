/* The GGUF reader (kiln_gguf_open): files kiln's writer produces, read by
 * kiln and by llama.cpp's own reader (gguf_init_from_file in
 * node-llama-cpp's libggml-base.so), every key and tensor compared; the
 * typed getters; and a table of hostile edits of a valid file, each refused
 * with its message (truncation at every byte, magic, version, counts,
 * strings, offsets, alignment, types, sizes, duplicates). */
#include <float.h>
#include <sys/stat.h>
#include "ggml_ref.h"
#include "kiln/gguf.h"
#include "kiln/quant.h"
#include "test.h"

static char dir[256];
static ggml_ref G;
static bool have_ref;

static bool err_has(const char *s) { return strstr(kiln_last_error(), s) != NULL; }

typedef struct {
    const char *name;
    kiln_ggml_type type;
    int ndim;
    int64_t shape[4];
    uint8_t *bytes;
    size_t nbytes;
} tspec;

static const int32_t a_i32[] = {INT32_MIN, INT32_MAX, -5};
static const double a_f64[] = {DBL_MIN / 8, -1e300, 0.1};
static const bool a_bool[] = {true, false, true};
static const char *a_str[] = {"", "plain", "ünïcödé ✓", "with\nnewline"};

static void fill(tspec *t, uint64_t seed) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)((double)(kiln_rng_u64(seed, (uint64_t)i) % 20001) / 1000.0 - 10.0);
    t->nbytes = kiln_q_row_bytes((kiln_qtype)t->type, n);
    t->bytes = malloc(t->nbytes);
    CHECK_OK(kiln_q_quantize((kiln_qtype)t->type, x, t->bytes, n));
    free(x);
}

static void write_file(const char *path, uint32_t alignment, tspec *ts, int nt, bool all_kv) {
    kiln_gguf_writer *w;
    CHECK_OK(kiln_gguf_writer_new(&w));
    if (alignment) CHECK_OK(kiln_gguf_set_u32(w, "general.alignment", alignment));
    CHECK_OK(kiln_gguf_set_str(w, "general.architecture", "llama"));
    CHECK_OK(kiln_gguf_set_u32(w, "t.u32", 4000000000u));
    if (all_kv) {
        uint8_t u8 = 200;
        int8_t i8 = -100;
        uint16_t u16 = 60000;
        int16_t i16 = -30000;
        uint64_t u64 = 0xfedcba9876543210ull;
        int64_t i64 = -1234567890123ll;
        double f64 = -2.5e-310;
        CHECK_OK(kiln_gguf_set(w, "t.u8", KILN_GGUF_UINT8, &u8));
        CHECK_OK(kiln_gguf_set(w, "t.i8", KILN_GGUF_INT8, &i8));
        CHECK_OK(kiln_gguf_set(w, "t.u16", KILN_GGUF_UINT16, &u16));
        CHECK_OK(kiln_gguf_set(w, "t.i16", KILN_GGUF_INT16, &i16));
        CHECK_OK(kiln_gguf_set_i32(w, "t.i32", -2000000000));
        CHECK_OK(kiln_gguf_set_f32(w, "t.f32", 1e-5f));
        CHECK_OK(kiln_gguf_set_bool(w, "t.bool", true));
        CHECK_OK(kiln_gguf_set_str(w, "t.str_empty", ""));
        CHECK_OK(kiln_gguf_set(w, "t.u64", KILN_GGUF_UINT64, &u64));
        CHECK_OK(kiln_gguf_set(w, "t.i64", KILN_GGUF_INT64, &i64));
        CHECK_OK(kiln_gguf_set(w, "t.f64", KILN_GGUF_FLOAT64, &f64));
        CHECK_OK(kiln_gguf_set_array(w, "a.i32", KILN_GGUF_INT32, a_i32, 3));
        CHECK_OK(kiln_gguf_set_array(w, "a.f64", KILN_GGUF_FLOAT64, a_f64, 3));
        CHECK_OK(kiln_gguf_set_array(w, "a.bool", KILN_GGUF_BOOL, a_bool, 3));
        CHECK_OK(kiln_gguf_set_array(w, "a.empty", KILN_GGUF_INT32, NULL, 0));
        CHECK_OK(kiln_gguf_set_str_array(w, "a.str", a_str, NULL, 4));
    }
    for (int i = 0; i < nt; i++) CHECK_OK(kiln_gguf_add_tensor(w, ts[i].name, ts[i].type, ts[i].ndim, ts[i].shape));
    CHECK_OK(kiln_gguf_begin(w, path));
    for (int i = 0; i < nt; i++) CHECK_OK(kiln_gguf_write_data(w, ts[i].bytes, ts[i].nbytes));
    CHECK_OK(kiln_gguf_finish(w));
    kiln_gguf_writer_free(w);
}

static int esize(kiln_gguf_type t) {
    switch (t) {
    case KILN_GGUF_UINT8: case KILN_GGUF_INT8: case KILN_GGUF_BOOL: return 1;
    case KILN_GGUF_UINT16: case KILN_GGUF_INT16: return 2;
    case KILN_GGUF_UINT32: case KILN_GGUF_INT32: case KILN_GGUF_FLOAT32: return 4;
    default: return 8;
    }
}

/* Every key and tensor of kiln's reading against ggml's. */
static void compare_with_ggml(const char *path, const kiln_gguf_file *f) {
    struct gguf_context *c = ggml_ref_open(&G, path);
    CHECK(c != NULL, "ggml refused %s", path);
    if (!c) return;
    CHECK(G.get_version(c) == kiln_gguf_version(f), "version");
    CHECK(G.get_alignment(c) == kiln_gguf_file_alignment(f), "alignment %zu vs %u", G.get_alignment(c),
          kiln_gguf_file_alignment(f));
    CHECK(G.get_data_offset(c) == kiln_gguf_data_offset(f), "data offset %zu vs %llu", G.get_data_offset(c),
          (unsigned long long)kiln_gguf_data_offset(f));
    CHECK(G.get_n_kv(c) == kiln_gguf_kv_count(f), "n_kv");
    for (int64_t i = 0; i < G.get_n_kv(c) && i < kiln_gguf_kv_count(f); i++) {
        const kiln_gguf_kv *kv = kiln_gguf_kv_at(f, i);
        CHECK(!strcmp(G.get_key(c, i), kv->key), "key %lld: %s vs %s", (long long)i, G.get_key(c, i), kv->key);
        CHECK(kiln_gguf_find(f, kv->key) == kv, "find %s", kv->key);
        CHECK(G.get_kv_type(c, i) == (int)kv->type, "%s type", kv->key);
        if (kv->type == KILN_GGUF_STRING) {
            const char *s = G.get_val_str(c, i);
            CHECK(strlen(s) == kv->lens[0] && !memcmp(s, kv->strs[0], kv->lens[0]), "%s value", kv->key);
        } else if (kv->type == KILN_GGUF_ARRAY) {
            CHECK(G.get_arr_type(c, i) == (int)kv->elem_type && G.get_arr_n(c, i) == kv->n, "%s array", kv->key);
            if (kv->elem_type == KILN_GGUF_STRING)
                for (uint64_t j = 0; j < kv->n; j++) {
                    const char *s = G.get_arr_str(c, i, j);
                    CHECK(strlen(s) == kv->lens[j] && !memcmp(s, kv->strs[j], kv->lens[j]), "%s[%llu]", kv->key,
                          (unsigned long long)j);
                }
            else if (kv->n)
                CHECK(!memcmp(G.get_arr_data(c, i), kv->data, kv->n * (size_t)esize(kv->elem_type)), "%s values",
                      kv->key);
        } else {
            CHECK(!memcmp(G.get_val_data(c, i), kv->data, (size_t)esize(kv->type)), "%s value", kv->key);
        }
    }
    CHECK(G.get_n_tensors(c) == kiln_gguf_tensor_count(f), "n_tensors");
    for (int64_t i = 0; i < G.get_n_tensors(c) && i < kiln_gguf_tensor_count(f); i++) {
        const kiln_gguf_tensor *t = kiln_gguf_tensor_at(f, i);
        CHECK(!strcmp(G.get_tensor_name(c, i), t->name) && kiln_gguf_tensor_find(f, t->name) == t, "tensor %lld",
              (long long)i);
        CHECK(G.get_tensor_type(c, i) == (int)t->type, "%s type", t->name);
        CHECK(G.get_tensor_offset(c, i) == t->offset, "%s offset", t->name);
        CHECK(G.get_tensor_size(c, i) == t->nbytes, "%s size %zu vs %zu", t->name, G.get_tensor_size(c, i), t->nbytes);
        const int64_t *ne = G.get_tensor_ne(c, i);
        for (int d = 0; d < 4; d++) CHECK(ne[d] == t->ne[d], "%s ne[%d]", t->name, d);
    }
    G.free(c);
}

static tspec *make_tensors(int *nt) {
    static tspec ts[] = {
        {"token_embd.weight", KILN_GGML_F32, 2, {3, 8}, 0, 0},
        {"blk.0.attn_q.weight", KILN_GGML_F16, 2, {5, 32}, 0, 0},
        {"blk.0.attn_k.weight", KILN_GGML_BF16, 1, {7}, 0, 0},
        {"blk.0.ffn_up.weight", KILN_GGML_Q8_0, 2, {3, 64}, 0, 0},
        {"blk.0.ffn_down.weight", KILN_GGML_Q4_0, 3, {2, 2, 32}, 0, 0},
        {"blk.1.ffn_up.weight", KILN_GGML_Q4_1, 2, {3, 64}, 0, 0},
        {"blk.1.ffn_down.weight", KILN_GGML_Q5_0, 3, {2, 1, 96}, 0, 0},
        {"blk.1.ffn_gate.weight", KILN_GGML_Q5_1, 2, {5, 32}, 0, 0},
        {"blk.0.ffn_gate.weight", KILN_GGML_Q4_K, 2, {2, 256}, 0, 0},
        {"blk.0.attn_v.weight", KILN_GGML_Q5_K, 2, {3, 512}, 0, 0},
        {"output.weight", KILN_GGML_Q6_K, 4, {1, 1, 2, 256}, 0, 0},
    };
    *nt = (int)(sizeof ts / sizeof ts[0]);
    for (int i = 0; i < *nt; i++)
        if (!ts[i].bytes) fill(&ts[i], 100 + (uint64_t)i);
    return ts;
}

static void check_valid(uint32_t alignment) {
    char path[512];
    snprintf(path, sizeof path, "%s/valid_%u.gguf", dir, alignment);
    int nt;
    tspec *ts = make_tensors(&nt);
    write_file(path, alignment, ts, nt, true);
    kiln_gguf_file *f = NULL;
    CHECK_OK(kiln_gguf_open(path, &f));
    if (!f) return;
    CHECK(kiln_gguf_version(f) == 3 && kiln_gguf_file_alignment(f) == (alignment ? alignment : 32), "header");
    CHECK(kiln_gguf_kv_count(f) == 18 + (alignment != 0), "%lld keys", (long long)kiln_gguf_kv_count(f));
    CHECK(kiln_gguf_tensor_count(f) == nt, "tensors");
    for (int i = 0; i < nt; i++) {
        const kiln_gguf_tensor *t = kiln_gguf_tensor_find(f, ts[i].name);
        CHECK(t && t->type == ts[i].type && t->ndim == ts[i].ndim && t->nbytes == ts[i].nbytes &&
                  !memcmp(t->data, ts[i].bytes, t->nbytes),
              "tensor %s", ts[i].name);
        for (int d = 0; t && d < ts[i].ndim; d++) CHECK(t->shape[d] == ts[i].shape[d], "%s shape", ts[i].name);
    }
    /* typed getters */
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    uint8_t u8;
    int8_t i8;
    uint16_t u16;
    int16_t i16;
    float f32;
    double f64;
    bool b;
    const char *s;
    uint64_t len;
    CHECK(!kiln_gguf_get_u32(f, "t.u32", &u32) && u32 == 4000000000u, "u32");
    CHECK(!kiln_gguf_get_i32(f, "t.i32", &i32) && i32 == -2000000000, "i32");
    CHECK(!kiln_gguf_get_u64(f, "t.u64", &u64) && u64 == 0xfedcba9876543210ull, "u64");
    CHECK(!kiln_gguf_get_i64(f, "t.i64", &i64) && i64 == -1234567890123ll, "i64");
    CHECK(!kiln_gguf_get_u8(f, "t.u8", &u8) && u8 == 200 && !kiln_gguf_get_i8(f, "t.i8", &i8) && i8 == -100, "8");
    CHECK(!kiln_gguf_get_u16(f, "t.u16", &u16) && u16 == 60000 && !kiln_gguf_get_i16(f, "t.i16", &i16) &&
              i16 == -30000,
          "16");
    CHECK(!kiln_gguf_get_f32(f, "t.f32", &f32) && f32 == 1e-5f && !kiln_gguf_get_f64(f, "t.f64", &f64) &&
              f64 == -2.5e-310,
          "floats");
    CHECK(!kiln_gguf_get_bool(f, "t.bool", &b) && b, "bool");
    CHECK(!kiln_gguf_get_str(f, "general.architecture", &s, &len) && len == 5 && !memcmp(s, "llama", 5), "str");
    CHECK(!kiln_gguf_get_str(f, "t.str_empty", &s, &len) && len == 0, "empty str");
    const kiln_gguf_kv *kv;
    CHECK(!kiln_gguf_get_array(f, "a.str", KILN_GGUF_STRING, &kv) && kv->n == 4 && kv->lens[2] == strlen(a_str[2]) &&
              !memcmp(kv->strs[2], a_str[2], kv->lens[2]),
          "string array");
    CHECK(!kiln_gguf_get_array(f, "a.i32", KILN_GGUF_INT32, &kv) && kv->n == 3 && !memcmp(kv->data, a_i32, 12), "i32[]");
    CHECK(kiln_gguf_get_u32(f, "general.architecture", &u32) == KILN_ERR_FORMAT &&
              err_has("key general.architecture is string, not u32") && err_has(path),
          "type mismatch: %s", kiln_last_error());
    CHECK(kiln_gguf_get_str(f, "a.str", &s, &len) && err_has("key a.str is array of string, not string"), "%s",
          kiln_last_error());
    CHECK(kiln_gguf_get_array(f, "a.i32", KILN_GGUF_FLOAT32, &kv) && err_has("array of i32, not of f32"), "%s",
          kiln_last_error());
    CHECK(kiln_gguf_get_u32(f, "no.such", &u32) && err_has("key no.such missing"), "%s", kiln_last_error());
    CHECK(kiln_gguf_find(f, "no.such") == NULL && kiln_gguf_tensor_find(f, "nope") == NULL, "absent");
    if (have_ref) compare_with_ggml(path, f);
    kiln_gguf_close(f);
}

/* ---- hostile edits ------------------------------------------------------- */

static uint8_t *base;
static size_t base_n;
static char base_path[512];

static size_t find(const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= base_n; i++)
        if (!memcmp(base + i, needle, n)) return i;
    fprintf(stderr, "needle %s not found\n", needle);
    abort();
}
/* Offset of a tensor info's fields: just past its name. */
static size_t tinfo(const char *name) { return find(name) + strlen(name); }

static void put32(uint8_t *b, size_t at, uint32_t v) { memcpy(b + at, &v, 4); }
static void put64(uint8_t *b, size_t at, uint64_t v) { memcpy(b + at, &v, 8); }

static kiln_status open_bytes(const uint8_t *b, size_t n, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    FILE *fp = fopen(path, "wb");
    if (n) fwrite(b, 1, n, fp);
    fclose(fp);
    kiln_gguf_file *f = NULL;
    kiln_status st = kiln_gguf_open(path, &f);
    if (!st) {
        /* touch every byte handed out */
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < kiln_gguf_tensor_count(f); i++) {
            const kiln_gguf_tensor *t = kiln_gguf_tensor_at(f, i);
            for (size_t j = 0; j < t->nbytes; j++) sink ^= ((const uint8_t *)t->data)[j];
        }
        (void)sink;
        kiln_gguf_close(f);
    }
    return st;
}

typedef struct {
    const char *what, *expect;
    kiln_status status;
} edit_result;

static void expect(const char *what, const uint8_t *b, size_t n, kiln_status want, const char *msg) {
    kiln_status st = open_bytes(b, n, "edit");
    CHECK(st == want && err_has(msg) && err_has(dir), "%s: status %d, error \"%s\" (expected %d with \"%s\")", what,
          (int)st, kiln_last_error(), (int)want, msg);
    const char *e = kiln_last_error(), *at = strstr(e, "edit.gguf");
    printf("  %-34s -> %s\n", what, st ? (at ? at : e) : "accepted");
}

static void check_hostile(void) {
    /* a small valid file: a few keys, three tensors, one of them Q4_K */
    static tspec ts[] = {
        {"a.weight", KILN_GGML_F32, 2, {2, 8}, 0, 0},
        {"b.weight", KILN_GGML_Q4_K, 1, {256}, 0, 0},
        {"c.weight", KILN_GGML_Q8_0, 1, {32}, 0, 0},
    };
    for (int i = 0; i < 3; i++)
        if (!ts[i].bytes) fill(&ts[i], 7 + (uint64_t)i);
    snprintf(base_path, sizeof base_path, "%s/base.gguf", dir);
    write_file(base_path, 0, ts, 3, true);
    FILE *fp = fopen(base_path, "rb");
    fseek(fp, 0, SEEK_END);
    base_n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    base = malloc(base_n);
    CHECK(fread(base, 1, base_n, fp) == base_n, "read base");
    fclose(fp);
    CHECK(open_bytes(base, base_n, "same") == KILN_OK, "the unedited copy: %s", kiln_last_error());
    uint8_t *b = malloc(base_n);

    /* truncation at every byte before the last tensor's end */
    kiln_gguf_file *f;
    CHECK_OK(kiln_gguf_open(base_path, &f));
    const kiln_gguf_tensor *last = kiln_gguf_tensor_at(f, 2);
    size_t end = (size_t)(kiln_gguf_data_offset(f) + last->offset + last->nbytes);
    kiln_gguf_close(f);
    int refused = 0, total = 0;
    for (size_t n = 0; n < end; n++, total++) refused += open_bytes(base, n, "trunc") == KILN_ERR_FORMAT;
    CHECK(refused == total, "%d of %d truncations refused", refused, total);
    printf("  truncated at each of %d bytes      -> %d refused (KILN_ERR_FORMAT)\n", total, refused);
    CHECK(open_bytes(base, end, "trunc_pad") == KILN_OK, "cut after the last tensor's bytes: %s", kiln_last_error());

#define EDIT(what, want, msg, ...)                 \
    do {                                           \
        memcpy(b, base, base_n);                   \
        __VA_ARGS__;                               \
        expect(what, b, base_n, want, msg);        \
    } while (0)
    EDIT("bad magic", KILN_ERR_FORMAT, "not a GGUF file", b[0] = 'g');
    EDIT("version 1", KILN_ERR_UNSUPPORTED, "GGUF version 1 (kiln reads versions 2 and 3)", put32(b, 4, 1));
    EDIT("version 4", KILN_ERR_UNSUPPORTED, "GGUF version 4", put32(b, 4, 4));
    EDIT("big-endian version", KILN_ERR_UNSUPPORTED, "big-endian", put32(b, 4, 0x03000000));
    EDIT("huge tensor count", KILN_ERR_FORMAT, "tensors cannot fit", put64(b, 8, 1ull << 60));
    EDIT("huge key count", KILN_ERR_FORMAT, "keys cannot fit", put64(b, 16, UINT64_MAX));
    EDIT("one key too many", KILN_ERR_FORMAT, "", put64(b, 16, 20));
    EDIT("key length past the end", KILN_ERR_FORMAT, "runs past the end", put64(b, 24, base_n));
    EDIT("string value past the end", KILN_ERR_FORMAT, "key general.architecture",
         put64(b, find("general.architecture") + 20 + 4, 1ull << 62));
    EDIT("string array count", KILN_ERR_FORMAT, "key a.str: 1152921504606846976 strings cannot fit",
         put64(b, find("a.str") + 5 + 4 + 4, 1ull << 60));
    EDIT("scalar array past the end", KILN_ERR_FORMAT, "key a.i32: 1000000000 values of i32 run past the end",
         put64(b, find("a.i32") + 5 + 4 + 4, 1000000000));
    EDIT("array of arrays", KILN_ERR_FORMAT, "key a.i32 is an array of arrays", put32(b, find("a.i32") + 5 + 4, 9));
    EDIT("unknown value type", KILN_ERR_FORMAT, "key t.u32: unknown value type 13", put32(b, find("t.u32") + 5, 13));
    EDIT("unknown array element type", KILN_ERR_FORMAT, "key a.i32: unknown array element type 77",
         put32(b, find("a.i32") + 5 + 4, 77));
    EDIT("duplicate key", KILN_ERR_FORMAT, "key t.u32 appears twice", memcpy(b + find("t.u64"), "t.u32", 5));
    EDIT("duplicate tensor", KILN_ERR_FORMAT, "tensor a.weight appears twice",
         memcpy(b + find("c.weight"), "a.weight", 8));
    EDIT("tensor name length 0", KILN_ERR_FORMAT, "a name of 0 bytes", put64(b, find("b.weight") - 8, 0));
    EDIT("5 dimensions", KILN_ERR_FORMAT, "tensor a.weight has 5 dimensions", put32(b, tinfo("a.weight"), 5));
    EDIT("0 dimensions", KILN_ERR_FORMAT, "tensor a.weight has 0 dimensions", put32(b, tinfo("a.weight"), 0));
    EDIT("dimension overflow", KILN_ERR_FORMAT, "tensor a.weight: size",
         put64(b, tinfo("a.weight") + 4, 1ull << 62), put64(b, tinfo("a.weight") + 12, 1ull << 62));
    EDIT("type q2_K", KILN_ERR_UNSUPPORTED, "tensor b.weight has tensor type 10 (q2_K), which kiln does not read",
         put32(b, tinfo("b.weight") + 4 + 8, 10));
    EDIT("type 99", KILN_ERR_UNSUPPORTED, "tensor b.weight has tensor type 99 (unknown to ggml too)",
         put32(b, tinfo("b.weight") + 4 + 8, 99));
    EDIT("q4_k row not whole blocks", KILN_ERR_FORMAT, "tensor b.weight: rows of 128 values are not whole Q4_K blocks of 256",
         put64(b, tinfo("b.weight") + 4, 128));
    EDIT("size past the end (shape)", KILN_ERR_FORMAT, "tensor c.weight: 340 bytes (Q8_0, 320 values)",
         put64(b, tinfo("c.weight") + 4, 320));
    EDIT("type change: size past the end", KILN_ERR_FORMAT, "tensor c.weight: 128 bytes (F32",
         put32(b, tinfo("c.weight") + 4 + 8, 0));
    EDIT("offset past the end", KILN_ERR_FORMAT, "tensor c.weight", put64(b, tinfo("c.weight") + 4 + 8 + 4, 1ull << 40));
    EDIT("offset huge", KILN_ERR_FORMAT, "run past the end", put64(b, tinfo("c.weight") + 4 + 8 + 4, UINT64_MAX - 31));
    EDIT("misaligned offset", KILN_ERR_FORMAT, "tensor b.weight: offset 68 is not a multiple of the alignment 32",
         put64(b, tinfo("b.weight") + 4 + 8 + 4, 68));
    EDIT("overlapping tensors", KILN_ERR_FORMAT, "tensors a.weight and b.weight overlap",
         put64(b, tinfo("b.weight") + 4 + 8 + 4, 32));
#undef EDIT
    /* alignment key of the wrong type or value */
    kiln_gguf_writer *w;
    char p2[600];
    snprintf(p2, sizeof p2, "%s/align.gguf", dir);
    CHECK_OK(kiln_gguf_writer_new(&w));
    CHECK_OK(kiln_gguf_set_u32(w, "general.alignment", 64));
    CHECK_OK(kiln_gguf_begin(w, p2));
    CHECK_OK(kiln_gguf_finish(w));
    kiln_gguf_writer_free(w);
    fp = fopen(p2, "rb");
    uint8_t ab[256];
    size_t an = fread(ab, 1, sizeof ab, fp);
    fclose(fp);
    size_t at = 24 + 8 + 17;
    put32(ab, at + 4, 48);
    expect("alignment 48", ab, an, KILN_ERR_FORMAT, "key general.alignment is 48, not a power of two");
    put32(ab, at, KILN_GGUF_INT32);
    expect("alignment as i32", ab, an, KILN_ERR_FORMAT, "key general.alignment is i32, not u32");
    expect("empty file", ab, 0, KILN_ERR_FORMAT, "too short for a GGUF header");
    CHECK(kiln_gguf_open("/nonexistent/x.gguf", &f) == KILN_ERR_IO && err_has("/nonexistent/x.gguf"), "missing file");
    free(b);
}

/* The fuzz seed (tests/fuzz/corpus/gguf/small.gguf): when KILN_WRITE_SEED
 * names a path, the small valid file is copied there. */
static void maybe_write_seed(void) {
    const char *p = getenv("KILN_WRITE_SEED");
    if (!p || !base) return;
    FILE *fp = fopen(p, "wb");
    CHECK(fp && fwrite(base, 1, base_n, fp) == base_n, "seed %s", p);
    if (fp) fclose(fp);
}

int main(void) {
    CHECK(t_tmpdir(dir, sizeof dir, "gguf_read"), "tmpdir");
    char why[1500];
    have_ref = ggml_ref_load(&G, why, sizeof why);
    if (!have_ref) printf("test_gguf_read: no ggml reference (%s): kiln's reading only\n", why);
    check_valid(0);
    check_valid(64);
    check_hostile();
    maybe_write_seed();
    free(base);
    t_rmtree(dir);
    TEST_END();
}
