/* The GGUF writer, read back by llama.cpp's own reader (gguf_init_from_file
 * in node-llama-cpp's prebuilt libggml-base.so): header, every metadata
 * value type and arrays of each, alignment (default and general.alignment),
 * tensor infos and offsets, tensor bytes at their offsets; F16/BF16/Q8_0
 * conversions bit for bit against ggml's; and the writer's refusals and
 * atomicity (which need no reference). */
#include <dirent.h>
#include <float.h>
#include <stdlib.h>
#include <sys/stat.h>
#include "ggml_ref.h"
#include "kiln/gguf.h"
#include "test.h"

static char dir[256];
static ggml_ref G;
static bool have_ref;

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

/* ---- one file with everything ----------------------------------------- */

typedef struct {
    const char *name;
    kiln_ggml_type type;
    int ndim;
    int64_t shape[4];
    unsigned char *bytes;
    size_t nbytes;
} tspec;

static const uint8_t a_u8[] = {0, 1, 255};
static const int8_t a_i8[] = {-128, 0, 127};
static const uint16_t a_u16[] = {0, 65535, 1234};
static const int16_t a_i16[] = {-32768, 32767, -1};
static const uint32_t a_u32[] = {0, 4294967295u, 7};
static const int32_t a_i32[] = {INT32_MIN, INT32_MAX, -5};
static const float a_f32[] = {-0.0f, FLT_MIN / 4, 3.25f, FLT_MAX};
static const bool a_bool[] = {true, false, true};
static const uint64_t a_u64[] = {UINT64_MAX, 0, 1ull << 40};
static const int64_t a_i64[] = {INT64_MIN, INT64_MAX, -3};
static const double a_f64[] = {DBL_MIN / 8, -1e300, 0.1};
static const char *a_str[] = {"", "plain", "ünïcödé ✓", "with\nnewline"};

static void fill(tspec *t, uint64_t seed) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)((double)(kiln_rng_u64(seed, (uint64_t)i) % 20001) / 1000.0 - 10.0);
    t->nbytes = kiln_ggml_nbytes(t->type, n);
    t->bytes = malloc(t->nbytes);
    CHECK_OK(kiln_ggml_convert(t->type, x, n, t->bytes));
    free(x);
}

static void write_everything(const char *path, uint32_t alignment, tspec *ts, int nt) {
    kiln_gguf_writer *w;
    CHECK_OK(kiln_gguf_writer_new(&w));
    if (alignment) CHECK_OK(kiln_gguf_set_u32(w, "general.alignment", alignment));
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    uint64_t u64 = 0xfedcba9876543210ull;
    int64_t i64 = -1234567890123ll;
    double f64 = -2.5e-310; /* subnormal */
    CHECK_OK(kiln_gguf_set(w, "t.u8", KILN_GGUF_UINT8, &u8));
    CHECK_OK(kiln_gguf_set(w, "t.i8", KILN_GGUF_INT8, &i8));
    CHECK_OK(kiln_gguf_set(w, "t.u16", KILN_GGUF_UINT16, &u16));
    CHECK_OK(kiln_gguf_set(w, "t.i16", KILN_GGUF_INT16, &i16));
    CHECK_OK(kiln_gguf_set_u32(w, "t.u32", 4000000000u));
    CHECK_OK(kiln_gguf_set_i32(w, "t.i32", -2000000000));
    CHECK_OK(kiln_gguf_set_f32(w, "t.f32", 1e-5f));
    CHECK_OK(kiln_gguf_set_bool(w, "t.bool_t", true));
    CHECK_OK(kiln_gguf_set_bool(w, "t.bool_f", false));
    CHECK_OK(kiln_gguf_set_str(w, "t.str", "llama ✓"));
    CHECK_OK(kiln_gguf_set_str(w, "t.str_empty", ""));
    CHECK_OK(kiln_gguf_set(w, "t.u64", KILN_GGUF_UINT64, &u64));
    CHECK_OK(kiln_gguf_set(w, "t.i64", KILN_GGUF_INT64, &i64));
    CHECK_OK(kiln_gguf_set(w, "t.f64", KILN_GGUF_FLOAT64, &f64));
    CHECK_OK(kiln_gguf_set_array(w, "a.u8", KILN_GGUF_UINT8, a_u8, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.i8", KILN_GGUF_INT8, a_i8, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.u16", KILN_GGUF_UINT16, a_u16, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.i16", KILN_GGUF_INT16, a_i16, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.u32", KILN_GGUF_UINT32, a_u32, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.i32", KILN_GGUF_INT32, a_i32, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.f32", KILN_GGUF_FLOAT32, a_f32, 4));
    CHECK_OK(kiln_gguf_set_array(w, "a.bool", KILN_GGUF_BOOL, a_bool, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.u64", KILN_GGUF_UINT64, a_u64, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.i64", KILN_GGUF_INT64, a_i64, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.f64", KILN_GGUF_FLOAT64, a_f64, 3));
    CHECK_OK(kiln_gguf_set_array(w, "a.empty", KILN_GGUF_INT32, NULL, 0));
    CHECK_OK(kiln_gguf_set_str_array(w, "a.str", a_str, NULL, 4));
    const char *withnul[] = {"a\0b"};
    size_t withnul_len[] = {3};
    CHECK_OK(kiln_gguf_set_str_array(w, "a.str_len", withnul, withnul_len, 1));
    for (int i = 0; i < nt; i++) CHECK_OK(kiln_gguf_add_tensor(w, ts[i].name, ts[i].type, ts[i].ndim, ts[i].shape));
    uint32_t a = alignment ? alignment : 32;
    CHECK(kiln_gguf_alignment(w) == a, "alignment %u", kiln_gguf_alignment(w));
    for (int i = 0; i < nt; i++)
        CHECK(kiln_gguf_tensor_offset(w, i) % a == 0 && kiln_gguf_tensor_nbytes(w, i) == ts[i].nbytes,
              "tensor %d offset %llu size %llu", i, (unsigned long long)kiln_gguf_tensor_offset(w, i),
              (unsigned long long)kiln_gguf_tensor_nbytes(w, i));
    CHECK_OK(kiln_gguf_begin(w, path));
    /* data in uneven pieces that straddle tensor boundaries */
    size_t total = 0;
    for (int i = 0; i < nt; i++) total += ts[i].nbytes;
    unsigned char *all = malloc(total);
    size_t at = 0;
    for (int i = 0; i < nt; i++) memcpy(all + at, ts[i].bytes, ts[i].nbytes), at += ts[i].nbytes;
    for (size_t off = 0, k = 0; off < total; k++) {
        size_t piece = 1 + kiln_rng_u64(3, k) % 97;
        if (piece > total - off) piece = total - off;
        CHECK_OK(kiln_gguf_write_data(w, all + off, piece));
        off += piece;
    }
    free(all);
    CHECK_OK(kiln_gguf_finish(w));
    kiln_gguf_writer_free(w);
}

static int64_t key(struct gguf_context *c, const char *k, int type) {
    int64_t id = G.find_key(c, k);
    CHECK(id >= 0, "key %s missing", k);
    if (id >= 0) CHECK(G.get_kv_type(c, id) == type, "key %s has type %d, wrote %d", k, G.get_kv_type(c, id), type);
    return id;
}

#define SCALAR(k, type, ctype, want)                                                        \
    do {                                                                                    \
        int64_t id_ = key(c, k, type);                                                      \
        if (id_ >= 0) {                                                                     \
            ctype got_;                                                                     \
            memcpy(&got_, G.get_val_data(c, id_), sizeof got_);                             \
            CHECK(!memcmp(&got_, &(ctype){want}, sizeof got_), "%s differs", k);           \
        }                                                                                   \
    } while (0)

static void check_array(struct gguf_context *c, const char *k, int elem, const void *want, size_t n, size_t esz) {
    int64_t id = key(c, k, KILN_GGUF_ARRAY);
    if (id < 0) return;
    CHECK(G.get_arr_type(c, id) == elem, "%s element type %d", k, G.get_arr_type(c, id));
    CHECK(G.get_arr_n(c, id) == n, "%s has %zu elements, wrote %zu", k, G.get_arr_n(c, id), n);
    if (n && G.get_arr_n(c, id) == n) CHECK(!memcmp(G.get_arr_data(c, id), want, n * esz), "%s values differ", k);
}

static void read_back(const char *path, uint32_t alignment, const tspec *ts, int nt) {
    struct gguf_context *c = ggml_ref_open(&G, path);
    CHECK(c != NULL, "llama.cpp's gguf_init_from_file refused %s", path);
    if (!c) return;
    CHECK(G.get_version(c) == 3, "version %u", G.get_version(c));
    CHECK(G.get_n_kv(c) == 28 + (alignment != 0), "n_kv %lld", (long long)G.get_n_kv(c));
    CHECK(G.get_alignment(c) == (alignment ? alignment : 32), "alignment %zu", G.get_alignment(c));
    CHECK(G.get_data_offset(c) % G.get_alignment(c) == 0, "data offset %zu", G.get_data_offset(c));
    SCALAR("t.u8", KILN_GGUF_UINT8, uint8_t, 200);
    SCALAR("t.i8", KILN_GGUF_INT8, int8_t, -100);
    SCALAR("t.u16", KILN_GGUF_UINT16, uint16_t, 60000);
    SCALAR("t.i16", KILN_GGUF_INT16, int16_t, -30000);
    SCALAR("t.u32", KILN_GGUF_UINT32, uint32_t, 4000000000u);
    SCALAR("t.i32", KILN_GGUF_INT32, int32_t, -2000000000);
    SCALAR("t.f32", KILN_GGUF_FLOAT32, float, 1e-5f);
    SCALAR("t.bool_t", KILN_GGUF_BOOL, uint8_t, 1);
    SCALAR("t.bool_f", KILN_GGUF_BOOL, uint8_t, 0);
    SCALAR("t.u64", KILN_GGUF_UINT64, uint64_t, 0xfedcba9876543210ull);
    SCALAR("t.i64", KILN_GGUF_INT64, int64_t, -1234567890123ll);
    SCALAR("t.f64", KILN_GGUF_FLOAT64, double, -2.5e-310);
    int64_t id = key(c, "t.str", KILN_GGUF_STRING);
    if (id >= 0) CHECK(!strcmp(G.get_val_str(c, id), "llama ✓"), "t.str = '%s'", G.get_val_str(c, id));
    id = key(c, "t.str_empty", KILN_GGUF_STRING);
    if (id >= 0) CHECK(!strcmp(G.get_val_str(c, id), ""), "t.str_empty = '%s'", G.get_val_str(c, id));
    check_array(c, "a.u8", KILN_GGUF_UINT8, a_u8, 3, 1);
    check_array(c, "a.i8", KILN_GGUF_INT8, a_i8, 3, 1);
    check_array(c, "a.u16", KILN_GGUF_UINT16, a_u16, 3, 2);
    check_array(c, "a.i16", KILN_GGUF_INT16, a_i16, 3, 2);
    check_array(c, "a.u32", KILN_GGUF_UINT32, a_u32, 3, 4);
    check_array(c, "a.i32", KILN_GGUF_INT32, a_i32, 3, 4);
    check_array(c, "a.f32", KILN_GGUF_FLOAT32, a_f32, 4, 4);
    const uint8_t bools[] = {1, 0, 1};
    check_array(c, "a.bool", KILN_GGUF_BOOL, bools, 3, 1);
    check_array(c, "a.u64", KILN_GGUF_UINT64, a_u64, 3, 8);
    check_array(c, "a.i64", KILN_GGUF_INT64, a_i64, 3, 8);
    check_array(c, "a.f64", KILN_GGUF_FLOAT64, a_f64, 3, 8);
    check_array(c, "a.empty", KILN_GGUF_INT32, NULL, 0, 4);
    id = key(c, "a.str", KILN_GGUF_ARRAY);
    if (id >= 0 && G.get_arr_type(c, id) == KILN_GGUF_STRING && G.get_arr_n(c, id) == 4)
        for (size_t i = 0; i < 4; i++)
            CHECK(!strcmp(G.get_arr_str(c, id, i), a_str[i]), "a.str[%zu] = '%s'", i, G.get_arr_str(c, id, i));
    else CHECK(0, "a.str: wrong type or length");
    id = key(c, "a.str_len", KILN_GGUF_ARRAY);
    CHECK(id >= 0 && G.get_arr_n(c, id) == 1, "a.str_len");

    CHECK(G.get_n_tensors(c) == nt, "%lld tensors", (long long)G.get_n_tensors(c));
    FILE *f = fopen(path, "rb");
    size_t end = 0;
    for (int i = 0; i < nt && i < G.get_n_tensors(c); i++) {
        CHECK(!strcmp(G.get_tensor_name(c, i), ts[i].name), "tensor %d is %s", i, G.get_tensor_name(c, i));
        CHECK(G.get_tensor_type(c, i) == (int)ts[i].type, "%s type %d", ts[i].name, G.get_tensor_type(c, i));
        const int64_t *ne = G.get_tensor_ne(c, i);
        for (int d = 0; d < 4; d++) {
            int64_t want = d < ts[i].ndim ? ts[i].shape[ts[i].ndim - 1 - d] : 1;
            CHECK(ne[d] == want, "%s ne[%d] = %lld, want %lld", ts[i].name, d, (long long)ne[d], (long long)want);
        }
        size_t off = G.get_tensor_offset(c, i);
        CHECK(off % G.get_alignment(c) == 0, "%s offset %zu not aligned", ts[i].name, off);
        CHECK(G.get_tensor_size(c, i) == ts[i].nbytes, "%s size %zu, wrote %zu", ts[i].name, G.get_tensor_size(c, i),
              ts[i].nbytes);
        unsigned char *buf = malloc(ts[i].nbytes);
        fseek(f, (long)(G.get_data_offset(c) + off), SEEK_SET);
        CHECK(fread(buf, 1, ts[i].nbytes, f) == ts[i].nbytes && !memcmp(buf, ts[i].bytes, ts[i].nbytes),
              "%s: bytes at data offset %zu + %zu differ from what was written", ts[i].name, G.get_data_offset(c), off);
        free(buf);
        size_t a = G.get_alignment(c);
        end = G.get_data_offset(c) + (off + ts[i].nbytes + a - 1) / a * a;
    }
    fseek(f, 0, SEEK_END);
    CHECK((size_t)ftell(f) == end, "file is %ld bytes, padded end of the last tensor at %zu", ftell(f), end);
    fclose(f);
    G.free(c);
}

static void test_file(void) {
    tspec ts[] = {
        {"w.f32", KILN_GGML_F32, 2, {3, 5}, 0, 0},          /* 60 bytes: the next tensor needs padding */
        {"w.f16", KILN_GGML_F16, 1, {7}, 0, 0},
        {"w.bf16", KILN_GGML_BF16, 3, {2, 3, 4}, 0, 0},
        {"w.q8_0", KILN_GGML_Q8_0, 2, {3, 64}, 0, 0},
        {"w.4d", KILN_GGML_F32, 4, {2, 1, 3, 2}, 0, 0},
        {"blk.0.a_name_of_exactly_sixty_three_bytes_for_ggml_limit.weight", KILN_GGML_F32, 1, {1}, 0, 0},
    };
    int nt = (int)(sizeof ts / sizeof ts[0]);
    CHECK(strlen(ts[nt - 1].name) == KILN_GGUF_MAX_NAME, "name length %zu", strlen(ts[nt - 1].name));
    for (int i = 0; i < nt; i++) fill(&ts[i], 100 + (uint64_t)i);
    uint32_t aligns[] = {0, 8, 64, 4096};
    for (int k = 0; k < 4; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/all_%u.gguf", dir, aligns[k]);
        write_everything(path, aligns[k], ts, nt);
        if (have_ref) read_back(path, aligns[k], ts, nt);
    }
    for (int i = 0; i < nt; i++) free(ts[i].bytes);
}

/* ---- conversions against ggml ------------------------------------------ */

static void test_conversions(void) {
    if (!have_ref) return;
    int bad16 = 0, badbf = 0, badinv = 0;
    /* every half value converts back to itself, and ggml agrees on its float */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kiln_f16_to_f32((uint16_t)h), g = G.fp16_to_fp32((uint16_t)h);
        if (isnan(g) ? !isnan(f) : memcmp(&f, &g, 4) != 0) badinv++;
        if (!isnan(f) && kiln_f32_to_f16(f) != h) badinv++;
    }
    CHECK(badinv == 0, "%d half values differ from ggml or do not round-trip", badinv);
    /* random bit patterns over the whole float range, and values near the
     * half subnormal/overflow edges and exact ties */
    for (uint64_t i = 0; i < 400000; i++) {
        union { uint32_t u; float f; } v = {(uint32_t)kiln_rng_u64(11, i)};
        if (i % 4 == 1) v.f = ldexpf((float)(kiln_rng_u64(12, i) % 4096) - 2048, -(int)(kiln_rng_u64(13, i) % 40));
        if (i % 4 == 2) v.u = (v.u & 0x8fffe000u) | 0x00001000u; /* ties at the half rounding bit */
        if (isnan(v.f)) continue;
        if (kiln_f32_to_f16(v.f) != G.fp32_to_fp16(v.f)) {
            if (bad16++ < 3) fprintf(stderr, "f16(%a): kiln %04x ggml %04x\n", v.f, kiln_f32_to_f16(v.f), G.fp32_to_fp16(v.f));
        }
        if (kiln_f32_to_bf16(v.f) != G.fp32_to_bf16(v.f)) badbf++;
    }
    CHECK(bad16 == 0, "%d floats convert to a different half than ggml's", bad16);
    CHECK(badbf == 0, "%d floats convert to a different bf16 than ggml's", badbf);
    /* Q8_0: random blocks of several scales, an all-zero block, a block with
     * values that land on .5 after scaling */
    enum { N = 32 * 64 };
    float *x = malloc(N * sizeof *x);
    kiln_rng r = {21, 0};
    kiln_rng_normal(&r, x, N, 0, 1);
    for (int b = 0; b < 64; b++)
        for (int j = 0; j < 32; j++) x[b * 32 + j] *= ldexpf(1, b % 16 - 8);
    for (int j = 0; j < 32; j++) x[j] = 0, x[32 + j] = (float)(j - 16) * 0.5f, x[32 + 31] = 127.0f;
    unsigned char *mine = malloc(N / 32 * 34), *ref = malloc(N / 32 * 34);
    CHECK_OK(kiln_ggml_convert(KILN_GGML_Q8_0, x, N, mine));
    G.quantize_row_q8_0_ref(x, ref, N);
    CHECK(!memcmp(mine, ref, N / 32 * 34), "Q8_0 blocks differ from ggml's quantize_row_q8_0_ref");
    CHECK(kiln_ggml_convert(KILN_GGML_Q8_0, x, 33, mine) == KILN_ERR_SHAPE, "Q8_0 of 33 values accepted");
    free(x), free(mine), free(ref);
}

/* ---- refusals and atomicity -------------------------------------------- */

static bool err_has(const char *s) {
    bool ok = strstr(kiln_last_error(), s) != NULL;
    if (!ok) fprintf(stderr, "error '%s' lacks '%s'\n", kiln_last_error(), s);
    return ok;
}

static int temp_files(void) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static void test_refusals(void) {
    kiln_gguf_writer *w;
    CHECK_OK(kiln_gguf_writer_new(&w));
    int64_t s2[2] = {2, 33}, s1[1] = {4}, s5[5] = {1, 1, 1, 1, 1};
    CHECK_OK(kiln_gguf_set_u32(w, "k", 1));
    CHECK(kiln_gguf_set_u32(w, "k", 2) && err_has("k set twice"), "duplicate key accepted");
    CHECK(kiln_gguf_set_str(w, "", "x") != KILN_OK, "empty key accepted");
    CHECK(kiln_gguf_set(w, "s", KILN_GGUF_STRING, "x") && err_has("not a scalar"), "string as a scalar accepted");
    CHECK(kiln_gguf_set_array(w, "nest", KILN_GGUF_ARRAY, NULL, 0) && err_has("nest"), "nested array accepted");
    CHECK(kiln_gguf_set_u32(w, "general.alignment", 12) && err_has("power of two"), "alignment 12 accepted");
    CHECK(kiln_gguf_set_u32(w, "general.alignment", 0) != KILN_OK, "alignment 0 accepted");
    CHECK(kiln_gguf_set_i32(w, "general.alignment", 64) && err_has("uint32"), "i32 alignment accepted");
    CHECK(kiln_gguf_add_tensor(w, "q", KILN_GGML_Q8_0, 2, s2) && err_has("multiple of 32"), "Q8_0 with 33 columns");
    CHECK(kiln_gguf_add_tensor(w, "five", KILN_GGML_F32, 5, s5) && err_has("dimensions"), "5 dims accepted");
    char longname[80];
    memset(longname, 'x', 64), longname[64] = 0;
    CHECK(kiln_gguf_add_tensor(w, longname, KILN_GGML_F32, 1, s1) && err_has("63"), "64-byte name accepted");
    CHECK_OK(kiln_gguf_add_tensor(w, "a", KILN_GGML_F32, 1, s1));
    CHECK(kiln_gguf_add_tensor(w, "a", KILN_GGML_F16, 1, s1) && err_has("a declared twice"), "duplicate tensor");
    CHECK(kiln_gguf_set_u32(w, "general.alignment", 64) && err_has("before any tensor"), "alignment after a tensor");
    CHECK(kiln_gguf_write_data(w, "x", 1) != KILN_OK, "data before begin accepted");
    CHECK(kiln_gguf_n_tensors(w) == 1, "refused tensors were kept: %d", kiln_gguf_n_tensors(w));
    char missing[600];
    snprintf(missing, sizeof missing, "%s/no/such/dir/x.gguf", dir);
    CHECK(kiln_gguf_begin(w, missing) == KILN_ERR_IO && err_has(missing), "missing directory: %s", kiln_last_error());
    kiln_gguf_writer_free(w);

    /* an unfinished export leaves the previous file and no temp file */
    char path[512];
    path_in(path, sizeof path, "keep.gguf");
    CHECK_OK(kiln_write_file_atomic(path, "old", 3));
    float four[4] = {1, 2, 3, 4};
    for (int mode = 0; mode < 3; mode++) {
        CHECK_OK(kiln_gguf_writer_new(&w));
        CHECK_OK(kiln_gguf_add_tensor(w, "a", KILN_GGML_F32, 1, s1));
        CHECK_OK(kiln_gguf_begin(w, path));
        if (mode == 0) {
            CHECK_OK(kiln_gguf_write_data(w, four, 8));
            CHECK(kiln_gguf_finish(w) && err_has("tensor a got 8 of its 16 bytes"), "short data finished");
        } else if (mode == 1) {
            CHECK(kiln_gguf_write_data(w, four, 20) && err_has("beyond the last tensor"), "extra data accepted");
            CHECK(kiln_gguf_finish(w) != KILN_OK, "finish after a failed write");
        } else {
            CHECK_OK(kiln_gguf_write_data(w, four, 4)); /* abandoned: freed without finish */
        }
        kiln_gguf_writer_free(w);
        char *text = NULL;
        size_t n = 0;
        CHECK(!kiln_read_file(path, &text, &n) && n == 3 && !memcmp(text, "old", 3), "mode %d: previous file changed", mode);
        free(text);
        CHECK(temp_files() == 0, "mode %d: %d temp files left", mode, temp_files());
    }
    /* a complete one replaces it */
    CHECK_OK(kiln_gguf_writer_new(&w));
    CHECK_OK(kiln_gguf_add_tensor(w, "a", KILN_GGML_F32, 1, s1));
    CHECK_OK(kiln_gguf_begin(w, path));
    CHECK_OK(kiln_gguf_write_data(w, four, 16));
    CHECK_OK(kiln_gguf_finish(w));
    CHECK(kiln_gguf_finish(w) != KILN_OK, "finished twice");
    kiln_gguf_writer_free(w);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && sb.st_size == 96, "new file is %lld bytes, not 96 (24 header + 33 info, padded to 64, + 16 data padded to 32)",
          (long long)sb.st_size);
    CHECK(temp_files() == 0, "temp files left after success");
}

int main(void) {
    if (!t_tmpdir(dir, sizeof dir, "test_gguf")) return 1;
    char why[1500];
    have_ref = ggml_ref_load(&G, why, sizeof why);
    if (!have_ref) printf("test_gguf: skipping the checks against llama.cpp's reader: %s\n", why);
    test_file();
    test_conversions();
    test_refusals();
    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
