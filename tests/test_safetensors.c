/* safetensors: round trip, interop with a Python-written file, corrupt
 * headers, atomic saves that fail, and the shape of the reference fixtures. */
#include "kiln/safetensors.h"
#include "test.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
    return b;
}

static int write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = n ? fwrite(data, 1, n, fp) : 0;
    return (fclose(fp) == 0 && w == n) ? 0 : -1;
}

static char *read_all(const char *path, size_t *n) {
    char *d = NULL;
    if (kiln_read_file(path, &d, n) != KILN_OK) return NULL;
    return d;
}

/* A file with an arbitrary header (its length field may be overridden) and
 * `ndata` bytes of data 0, 1, 2, ... */
static void write_st(const char *path, const char *header, size_t ndata, int64_t len_override) {
    size_t hl = strlen(header);
    size_t n = 8 + hl + ndata;
    unsigned char *b = calloc(1, n);
    uint64_t len = len_override >= 0 ? (uint64_t)len_override : hl;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(len >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < ndata; i++) b[8 + hl + i] = (unsigned char)i;
    CHECK(write_bytes(path, b, n) == 0, "writing %s", path);
    free(b);
}

static int count_dir(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static kiln_st_tensor mk(const char *name, kiln_dtype dt, int ndim, const int64_t *shape, const void *data) {
    kiln_st_tensor t = {name, dt, ndim, {1, 1, 1, 1}, data, kiln_dtype_size(dt)};
    for (int d = 0; d < ndim; d++) {
        t.shape[d] = shape[d];
        t.nbytes *= (size_t)shape[d];
    }
    return t;
}

/* ---- round trip -------------------------------------------------------- */

static void test_round_trip(void) {
    float a[12];
    for (int i = 0; i < 12; i++) a[i] = (float)i * 0.25f - 1.0f;
    uint16_t h[5] = {0x3f80, 0x4000, 0xbf80, 0x7f80, 0x0001};
    int32_t ix[8] = {1, -2, 3, -4, 5, -6, 7, INT32_MIN};
    float s = 42.5f, f4[16];
    for (int i = 0; i < 16; i++) f4[i] = (float)(i * i);
    kiln_st_tensor ts[] = {
        mk("model.w", KILN_F32, 2, (int64_t[]){3, 4}, a),
        mk("half", KILN_BF16, 1, (int64_t[]){5}, h),
        mk("ids", KILN_I32, 3, (int64_t[]){2, 2, 2}, ix),
        mk("scalar", KILN_F32, 0, NULL, &s),
        mk("empty", KILN_F32, 2, (int64_t[]){0, 7}, NULL),
        mk("four", KILN_F32, 4, (int64_t[]){2, 2, 2, 2}, f4),
    };
    int n = (int)(sizeof ts / sizeof ts[0]);
    const char *meta[] = {"step", "12", "format", "pt", "note", "ünïcode \"quoted\"", NULL};
    const char *p = tmp_path("rt.safetensors");
    CHECK_OK(kiln_st_save(p, ts, n, meta));

    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(p, &f));
    if (!f) return;
    CHECK(kiln_st_count(f) == n, "count %d", kiln_st_count(f));
    for (int i = 0; i < n; i++) {
        const kiln_st_tensor *t = kiln_st_find(f, ts[i].name);
        CHECK(t != NULL, "missing %s", ts[i].name);
        if (!t) continue;
        CHECK(strcmp(t->name, ts[i].name) == 0 && t->dtype == ts[i].dtype && t->ndim == ts[i].ndim,
              "%s: header differs", ts[i].name);
        for (int d = 0; d < ts[i].ndim; d++) CHECK(t->shape[d] == ts[i].shape[d], "%s dim %d", t->name, d);
        CHECK(t->nbytes == ts[i].nbytes, "%s nbytes %zu", t->name, t->nbytes);
        CHECK(t->nbytes == 0 || memcmp(t->bytes, ts[i].bytes, t->nbytes) == 0, "%s data differs", t->name);
        CHECK((uintptr_t)t->bytes % kiln_dtype_size(t->dtype) == 0, "%s misaligned", t->name);
    }
    CHECK(kiln_st_find(f, "nope") == NULL, "found a missing name");
    CHECK(kiln_st_at(f, -1) == NULL && kiln_st_at(f, n) == NULL, "at() out of range");
    /* file order: F32 by name, then I32, then BF16 */
    const char *order[] = {"empty", "four", "model.w", "scalar", "ids", "half"};
    for (int i = 0; i < n; i++)
        CHECK(strcmp(kiln_st_at(f, i)->name, order[i]) == 0, "at(%d) = %s", i, kiln_st_at(f, i)->name);
    CHECK(kiln_st_metadata_count(f) == 3, "meta count %d", kiln_st_metadata_count(f));
    CHECK(kiln_st_metadata(f, "step") && strcmp(kiln_st_metadata(f, "step"), "12") == 0, "meta step");
    CHECK(kiln_st_metadata(f, "note") && strcmp(kiln_st_metadata(f, "note"), meta[5]) == 0, "meta note");
    CHECK(kiln_st_metadata(f, "missing") == NULL, "meta missing");
    const char *v = NULL;
    CHECK(kiln_st_metadata_at(f, 0, &v) && strcmp(kiln_st_metadata_at(f, 0, &v), "format") == 0 &&
              strcmp(v, "pt") == 0, "meta order");
    CHECK(kiln_st_metadata_at(f, 3, NULL) == NULL, "meta at out of range");

    /* Saving over an open file must not disturb the open mapping. */
    float z[12] = {0};
    kiln_st_tensor t2 = mk("model.w", KILN_F32, 2, (int64_t[]){3, 4}, z);
    CHECK_OK(kiln_st_save(p, &t2, 1, NULL));
    const kiln_st_tensor *w = kiln_st_find(f, "model.w");
    CHECK(w && memcmp(w->bytes, a, sizeof a) == 0, "open mapping changed by a save");
    kiln_st_close(f);

    CHECK_OK(kiln_st_open(p, &f));
    CHECK(f && kiln_st_count(f) == 1 && kiln_st_metadata_count(f) == 0, "resaved file");
    if (f) CHECK(memcmp(kiln_st_at(f, 0)->bytes, z, sizeof z) == 0, "resaved data");
    kiln_st_close(f);

    /* No tensors at all is a valid file. */
    const char *p0 = tmp_path("none.safetensors");
    CHECK_OK(kiln_st_save(p0, NULL, 0, NULL));
    CHECK_OK(kiln_st_open(p0, &f));
    CHECK(f && kiln_st_count(f) == 0, "empty file count");
    kiln_st_close(f);
    size_t sz = 0;
    char *raw = read_all(p0, &sz);
    CHECK(raw && sz == 16 && memcmp(raw + 8, "{}      ", 8) == 0, "empty file bytes");
    free(raw);
    CHECK(count_dir(tmpdir) == 2, "temp files left: %d entries", count_dir(tmpdir));
}

/* ---- interop with tests/fixtures/st_python.safetensors ------------------ */

static void test_python_interop(void) {
    const char *fx = "tests/fixtures/st_python.safetensors";
    float b[6];
    for (int i = 0; i < 6; i++) b[i] = (float)i * 0.5f - 1.0f;
    int32_t ab[4] = {-2, 0, 7, 2147483647}, lw[4] = {1, 2, 3, 4};
    uint16_t c[3] = {0x3f80, 0xc000, 0x3e20};
    float s = 3.25f;
    kiln_st_tensor ts[] = {
        mk("b.weight", KILN_F32, 2, (int64_t[]){2, 3}, b),
        mk("a.bias", KILN_I32, 1, (int64_t[]){4}, ab),
        mk("c", KILN_BF16, 1, (int64_t[]){3}, c),
        mk("empty", KILN_F32, 2, (int64_t[]){2, 0}, NULL),
        mk("s", KILN_F32, 0, NULL, &s),
        mk("layers.0.w", KILN_I32, 4, (int64_t[]){1, 2, 1, 2}, lw),
    };
    const char *meta[] = {"kiln", "interop", "format", "pt", NULL};
    const char *p = tmp_path("interop.safetensors");
    CHECK_OK(kiln_st_save(p, ts, 6, meta));
    size_t n1 = 0, n2 = 0;
    char *mine = read_all(p, &n1), *theirs = read_all(fx, &n2);
    CHECK(theirs != NULL, "cannot read %s: %s", fx, kiln_last_error());
    CHECK(mine && theirs && n1 == n2 && memcmp(mine, theirs, n1) == 0,
          "C-written file differs from the Python-written one (%zu vs %zu bytes)", n1, n2);
    free(mine);
    free(theirs);

    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(fx, &f));
    if (!f) return;
    CHECK(kiln_st_count(f) == 6, "count");
    for (int i = 0; i < 6; i++) {
        const kiln_st_tensor *t = kiln_st_find(f, ts[i].name);
        CHECK(t && t->dtype == ts[i].dtype && t->ndim == ts[i].ndim && t->nbytes == ts[i].nbytes &&
                  (t->nbytes == 0 || memcmp(t->bytes, ts[i].bytes, t->nbytes) == 0),
              "python tensor %s differs", ts[i].name);
    }
    const kiln_st_tensor *ct = kiln_st_find(f, "c");
    if (ct) CHECK(kiln_bf16_to_f32(((const uint16_t *)ct->bytes)[2]) == 0.15625f, "bf16 value");
    CHECK(kiln_st_metadata(f, "kiln") && strcmp(kiln_st_metadata(f, "kiln"), "interop") == 0, "meta");
    kiln_st_close(f);
}

/* ---- corrupt files ----------------------------------------------------- */

static void expect_fail(const char *path, kiln_status code, const char *needle) {
    kiln_st_file *f = (kiln_st_file *)1;
    kiln_status st = kiln_st_open(path, &f);
    const char *msg = kiln_last_error() ? kiln_last_error() : "";
    CHECK(st == code, "%s: status %d, want %d (%s)", needle, (int)st, (int)code, msg);
    CHECK(f == NULL, "%s: out not cleared", needle);
    CHECK(strstr(msg, path), "%s: message does not name the file: %s", needle, msg);
    CHECK(strstr(msg, needle), "message lacks \"%s\": %s", needle, msg);
    if (f && f != (kiln_st_file *)1) kiln_st_close(f);
}

#define T1_X "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
#define T1 "{" T1_X "}"

static void test_corrupt(void) {
    const char *p = tmp_path("bad.safetensors");
    write_bytes(p, "abc", 3);
    expect_fail(p, KILN_ERR_FORMAT, "too short");
    write_bytes(p, "", 0);
    expect_fail(p, KILN_ERR_FORMAT, "too short");
    write_st(p, T1, 8, 1000);
    expect_fail(p, KILN_ERR_FORMAT, "exceeds the file size");
    write_st(p, T1, 8, (int64_t)1 << 40);
    expect_fail(p, KILN_ERR_FORMAT, "absurd");
    write_st(p, T1, 8, -1);
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(p, &f)); /* the baseline is valid */
    kiln_st_close(f);
    write_st(p, T1, 5, -1); /* truncated data */
    expect_fail(p, KILN_ERR_FORMAT, "'x': data_offsets [0, 8] out of range");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "out of range");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "tensor 'x': data_offsets span 8 bytes but shape and dtype F32 need 12");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "shape[1]");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_UNSUPPORTED, "5 dims");
    write_st(p, "{\"x\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, -1);
    char want[512];
    snprintf(want, sizeof want, "unsupported dtype I64 for tensor 'x' in %s", p);
    expect_fail(p, KILN_ERR_UNSUPPORTED, want);
    write_st(p, "{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_UNSUPPORTED, "unsupported dtype F64");
    write_st(p, "{\"x\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "invalid dtype \"F33\"");
    write_st(p, "{\"x\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "'x': dtype is not a string");
    write_st(p, "{\"x\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "'x' has no dtype");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "shape missing");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "data_offsets missing");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "invalid JSON");
    write_st(p, "[1,2]   ", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "not a JSON object");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "invalid JSON");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "overlaps");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "unindexed bytes before tensor 'x'");
    write_st(p, T1, 12, -1);
    expect_fail(p, KILN_ERR_FORMAT, "belong to no tensor");
    write_st(p, "{\"__metadata__\":{\"a\":1}," T1_X "}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "__metadata__ value of 'a'");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "too large");
    /* products and spans that would wrap: elem x dims past 2^63 (each dim
     * alone fits), a partial product past it ahead of a zero dim, offsets at
     * the int64 limit, an offset beyond it, begin after end */
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3037000500,3037000500],\"data_offsets\":[0,8]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "'x': shape is too large");
    write_st(p, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}", 0, -1);
    expect_fail(p, KILN_ERR_FORMAT, "'x': shape is too large");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", 0, -1);
    expect_fail(p, KILN_ERR_FORMAT, "'x': shape is too large");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],"
                "\"data_offsets\":[9223372036854775807,9223372036854775807]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "out of range");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551615]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "invalid JSON");
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, -1);
    expect_fail(p, KILN_ERR_FORMAT, "data_offsets [8, 0] out of range");
    write_st(p, T1, 8, INT64_MAX); /* length 2^63 - 1 */
    expect_fail(p, KILN_ERR_FORMAT, "absurd");
    /* a zero-sized tensor with a large dim is still a valid, empty tensor */
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[0,4611686018427387903],\"data_offsets\":[0,0]}}", 0, -1);
    CHECK_OK(kiln_st_open(p, &f));
    CHECK(f && kiln_st_find(f, "x") && kiln_st_find(f, "x")->nbytes == 0, "empty tensor with a large dim");
    kiln_st_close(f);
    /* F16 is read as such (kiln converts it where it loads weights) */
    write_st(p, "{\"x\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8, -1);
    CHECK_OK(kiln_st_open(p, &f));
    CHECK(f && kiln_st_find(f, "x") && kiln_st_find(f, "x")->dtype == KILN_F16 && kiln_st_find(f, "x")->nbytes == 8,
          "F16 tensor");
    kiln_st_close(f);
    expect_fail(tmp_path("does-not-exist"), KILN_ERR_IO, "cannot open");
    expect_fail(tmpdir, KILN_ERR_IO, "not a regular file");

    /* A tensor at an offset that is not a multiple of its size is copied so
     * its data can still be read as float. */
    write_st(p, "{\"h\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}  ", 6, -1);
    CHECK_OK(kiln_st_open(p, &f));
    const kiln_st_tensor *x = f ? kiln_st_find(f, "x") : NULL;
    CHECK(x && (uintptr_t)x->bytes % 4 == 0 && memcmp(x->bytes, "\x02\x03\x04\x05", 4) == 0,
          "misaligned tensor not copied");
    kiln_st_close(f);
    unlink(p);
}

/* ---- many metadata keys ------------------------------------------------ */

/* A header of `n` metadata keys in descending order (the worst case for the
 * insertion sort the reader once had); returns the seconds kiln_st_open took. */
static double open_meta_header(int n, bool check) {
    size_t cap = (size_t)n * 32 + 128, k = 0;
    char *h = malloc(cap);
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{");
    for (int i = n - 1; i >= 0; i--)
        k += (size_t)snprintf(h + k, cap - k, "\"key%07d\":\"v%d\"%s", i, i, i ? "," : "");
    snprintf(h + k, cap - k, "}," T1_X "}");
    const char *p = tmp_path("meta.safetensors");
    write_st(p, h, 8, -1);
    free(h);
    kiln_st_file *f = NULL;
    double t0 = kiln_time_now();
    CHECK_OK(kiln_st_open(p, &f));
    double dt = kiln_time_now() - t0;
    if (f && check) {
        CHECK(kiln_st_metadata_count(f) == n, "meta count %d", kiln_st_metadata_count(f));
        bool sorted = true;
        for (int i = 1; i < n && sorted; i++)
            sorted = strcmp(kiln_st_metadata_at(f, i - 1, NULL), kiln_st_metadata_at(f, i, NULL)) < 0;
        CHECK(sorted, "metadata keys not sorted");
        const char *v = kiln_st_metadata(f, "key0123456");
        CHECK(v && !strcmp(v, "v123456"), "lookup of key0123456: %s", v ? v : "(none)");
        CHECK(kiln_st_metadata(f, "key9999999") == NULL, "lookup of a missing key");
        v = NULL;
        CHECK(!strcmp(kiln_st_metadata_at(f, 0, &v), "key0000000") && !strcmp(v, "v0"), "first key");
    }
    kiln_st_close(f);
    unlink(p);
    return dt;
}

static void test_many_metadata_keys(void) {
    double t50 = open_meta_header(50000, false), t200 = open_meta_header(200000, true);
    printf("  __metadata__: 50,000 keys open in %.3f s, 200,000 keys (a 3.9 MB header) in %.3f s\n", t50, t200);
    /* quadratic work would be 16x the 50k time (and minutes in absolute
     * terms); bounds are loose because the machine is shared */
    CHECK(t200 < 5.0, "200,000-key header took %.2f s", t200);
    CHECK(t200 < 12 * t50 + 0.5, "200k keys %.3f s vs 50k keys %.3f s: worse than n log n", t200, t50);
}

/* ---- failed saves ------------------------------------------------------ */

static void check_untouched(const char *p, const char *what) {
    size_t n = 0;
    char *d = read_all(p, &n);
    CHECK(d && n == 9 && memcmp(d, "original\n", 9) == 0, "%s: target changed", what);
    free(d);
}

static void test_failed_saves(void) {
    float a[4] = {1, 2, 3, 4};
    kiln_st_tensor t = mk("w", KILN_F32, 1, (int64_t[]){4}, a);
    const char *target = tmp_path("keep.safetensors");
    CHECK(write_bytes(target, "original\n", 9) == 0, "setup");
    int entries = count_dir(tmpdir);

    CHECK(kiln_st_save(tmp_path("no-such-dir/x.safetensors"), &t, 1, NULL) == KILN_ERR_IO, "missing dir");
    CHECK(strstr(kiln_last_error(), "no-such-dir/x.safetensors") != NULL, "msg: %s", kiln_last_error());
    CHECK(kiln_st_save(tmp_path("keep.safetensors/x"), &t, 1, NULL) == KILN_ERR_IO, "file as dir");
    check_untouched(target, "file as dir");

    kiln_st_tensor bad = t;
    bad.nbytes = 15;
    CHECK(kiln_st_save(target, &bad, 1, NULL) == KILN_ERR_INVALID, "size mismatch");
    CHECK(strstr(kiln_last_error(), "'w'") && strstr(kiln_last_error(), target), "msg: %s", kiln_last_error());
    kiln_st_tensor dup[2] = {t, t};
    CHECK(kiln_st_save(target, dup, 2, NULL) == KILN_ERR_INVALID, "duplicate names");
    bad = t;
    bad.name = "__metadata__";
    CHECK(kiln_st_save(target, &bad, 1, NULL) == KILN_ERR_INVALID, "reserved name");
    bad = t;
    bad.shape[0] = -4;
    CHECK(kiln_st_save(target, &bad, 1, NULL) == KILN_ERR_INVALID, "negative dim");
    bad = t;
    bad.dtype = (kiln_dtype)9;
    CHECK(kiln_st_save(target, &bad, 1, NULL) == KILN_ERR_INVALID, "bad dtype");
    const char *odd[] = {"k", NULL};
    CHECK(kiln_st_save(target, &t, 1, odd) == KILN_ERR_INVALID, "odd metadata list");
    const char *dupk[] = {"k", "1", "k", "2", NULL};
    CHECK(kiln_st_save(target, &t, 1, dupk) == KILN_ERR_INVALID, "duplicate metadata key");
    check_untouched(target, "invalid arguments");

    /* A write that fails midway (file size limit): the temp file is removed
     * and the old file stays. Root is not exempt from RLIMIT_FSIZE. */
    enum { BIG = 1 << 16 };
    float *big = calloc(BIG, sizeof(float));
    kiln_st_tensor tb = mk("big", KILN_F32, 1, (int64_t[]){BIG}, big);
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    struct rlimit lim = {4096, old.rlim_max};
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
    kiln_status st = kiln_st_save(target, &tb, 1, NULL);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    CHECK(st == KILN_ERR_IO, "short write: status %d (%s)", (int)st, kiln_last_error());
    check_untouched(target, "short write");
    free(big);

    /* rename onto a directory fails after everything was written */
    const char *dir = tmp_path("adir");
    mkdir(dir, 0755);
    CHECK(kiln_st_save(dir, &t, 1, NULL) == KILN_ERR_IO, "rename onto a directory");
    rmdir(dir);
    CHECK(count_dir(tmpdir) == entries, "temp files left behind: %d entries, want %d", count_dir(tmpdir),
          entries);

    CHECK_OK(kiln_st_save(target, &t, 1, NULL));
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(target, &f));
    CHECK(f && kiln_st_count(f) == 1, "good save after failures");
    kiln_st_close(f);
    unlink(target);
}

/* ---- the PyTorch reference fixtures ------------------------------------ */

static void check_fixture(const char *path, int tied, int H, int I, int nkv, int D) {
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(path, &f));
    if (!f) return;
    const int V = 61, L = 2, nh = 4, B = 3, T = 37;
    char name[128];
    struct { const char *fmt; int64_t r, c; } p[] = {
        {"model.layers.%d.input_layernorm.weight", H, 0},
        {"model.layers.%d.self_attn.q_proj.weight", nh * D, H},
        {"model.layers.%d.self_attn.k_proj.weight", nkv * D, H},
        {"model.layers.%d.self_attn.v_proj.weight", nkv * D, H},
        {"model.layers.%d.self_attn.o_proj.weight", H, nh * D},
        {"model.layers.%d.post_attention_layernorm.weight", H, 0},
        {"model.layers.%d.mlp.gate_proj.weight", I, H},
        {"model.layers.%d.mlp.up_proj.weight", I, H},
        {"model.layers.%d.mlp.down_proj.weight", H, I},
    };
    int nparam = 0;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 9; k++) {
            for (int g = 0; g < 2; g++) {
                int off = g ? snprintf(name, sizeof name, "grad.") : 0;
                snprintf(name + off, sizeof name - (size_t)off, p[k].fmt, l);
                const kiln_st_tensor *t = kiln_st_find(f, name);
                CHECK(t && t->dtype == KILN_F32 && t->ndim == (p[k].c ? 2 : 1) && t->shape[0] == p[k].r &&
                          (!p[k].c || t->shape[1] == p[k].c),
                      "%s: %s missing or misshapen", path, name);
            }
            nparam++;
        }
    const char *top[] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
    for (int k = 0; k < 3; k++) {
        const kiln_st_tensor *t = kiln_st_find(f, top[k]);
        snprintf(name, sizeof name, "grad.%s", top[k]);
        const kiln_st_tensor *g = kiln_st_find(f, name);
        if (k == 2 && tied) {
            CHECK(!t && !g, "%s: tied model stores lm_head", path);
            continue;
        }
        CHECK(t && g && t->nbytes == g->nbytes && t->shape[0] == (k == 1 ? H : V), "%s: %s", path, top[k]);
        nparam++;
    }
    CHECK(kiln_st_count(f) == 2 * nparam + 5, "%s: %d tensors", path, kiln_st_count(f));
    const kiln_st_tensor *ids = kiln_st_find(f, "input_ids"), *mask = kiln_st_find(f, "attention_mask"),
                         *lab = kiln_st_find(f, "labels"), *lg = kiln_st_find(f, "logits"),
                         *loss = kiln_st_find(f, "loss");
    CHECK(ids && mask && lab && ids->dtype == KILN_I32 && mask->dtype == KILN_I32 && lab->dtype == KILN_I32 &&
              ids->shape[0] == B && ids->shape[1] == T && mask->nbytes == ids->nbytes && lab->nbytes == ids->nbytes,
          "%s: batch tensors", path);
    CHECK(lg && lg->ndim == 3 && lg->shape[0] == B && lg->shape[1] == T && lg->shape[2] == V, "%s: logits", path);
    CHECK(loss && loss->ndim == 1 && loss->shape[0] == 1, "%s: loss", path);
    if (ids && mask && lab) {
        const int32_t *id = ids->bytes, *m = mask->bytes, *y = lab->bytes;
        int pads[3] = {0, 0, 0}, bad = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                int i = b * T + t, want = (t + 1 < T && m[i + 1]) ? id[i + 1] : KILN_IGNORE_INDEX;
                pads[b] += !m[i];
                bad += y[i] != want || id[i] < 0 || id[i] >= V;
            }
        CHECK(bad == 0 && pads[0] == 0 && pads[1] == 5 && pads[2] == 11, "%s: labels/mask", path);
    }
    if (loss) {
        float l = *(const float *)loss->bytes;
        CHECK(l > 3.5f && l < 4.7f, "%s: loss %g is not near ln(61)", path, (double)l);
    }
    kiln_st_close(f);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_st_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    unlink(tmp_path("rt.safetensors"));
    unlink(tmp_path("none.safetensors"));
    test_python_interop();
    unlink(tmp_path("interop.safetensors"));
    test_corrupt();
    test_many_metadata_keys();
    test_failed_saves();
    check_fixture("tests/fixtures/tiny_gqa.safetensors", 0, 48, 72, 2, 12);
    check_fixture("tests/fixtures/tiny_tied.safetensors", 1, 96, 32, 4, 24);
    CHECK(rmdir(tmpdir) == 0, "tmpdir not empty");
    TEST_END();
}
