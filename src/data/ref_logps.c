/* The reference's log-probabilities of a pairs shard (kiln/data.h): what a
 * DPO run without adapters reads instead of a second model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data_impl.h"

#define REF_MAGIC "KILNREF1"
#define REF_HEADER 64

void kiln_ref_logps_path(const char *shard_path, char *out, size_t n) {
    size_t len = strlen(shard_path);
    if (len > 4 && !strcmp(shard_path + len - 4, ".bin")) len -= 4;
    snprintf(out, n, "%.*s.dpo-ref.bin", (int)len, shard_path);
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

kiln_status kiln_ref_logps_write(const char *path, const kiln_ref_logps_meta *m, const float *logps) {
    if (m->n_docs > (SIZE_MAX - REF_HEADER - 8) / 4)
        return kiln_error(KILN_ERR_RANGE, "%s: %llu documents", path, (unsigned long long)m->n_docs);
    size_t n = REF_HEADER + (size_t)m->n_docs * 4 + 8;
    unsigned char *b = calloc(1, n);
    if (!b) return kiln_error(KILN_ERR_OOM, "out of memory for %s (%zu bytes)", path, n);
    memcpy(b, REF_MAGIC, 8);
    put_u32(b + 8, 1);
    put_u32(b + 12, REF_HEADER);
    put_u64(b + 16, m->n_docs);
    put_u64(b + 24, m->shard_hash);
    put_u64(b + 32, m->model_hash);
    put_u32(b + 40, (uint32_t)m->seq_len);
    put_u32(b + 44, (uint32_t)m->batch);
    memcpy(b + 48, m->precision, strnlen(m->precision, 8));
    for (uint64_t i = 0; i < m->n_docs; i++) {
        uint32_t u;
        memcpy(&u, &logps[i], 4);
        put_u32(b + REF_HEADER + 4 * i, u);
    }
    put_u64(b + n - 8, kiln_hash_bytes(b, n - 8));
    kiln_status st = kiln_write_file_atomic(path, b, n);
    free(b);
    return st;
}

kiln_status kiln_ref_logps_read(const char *path, kiln_ref_logps_meta *m, float **logps) {
    *logps = NULL;
    char *text = NULL;
    size_t n = 0;
    kiln_status st = kiln_read_file(path, &text, &n);
    if (st) return st;
    const unsigned char *b = (const unsigned char *)text;
    if (n < REF_HEADER + 8 || memcmp(b, REF_MAGIC, 8)) {
        st = kiln_error(KILN_ERR_FORMAT, "%s: not a kiln reference log-probability file (%s)", path,
                        n < REF_HEADER + 8 ? "truncated header" : "bad magic at offset 0");
    } else if (get_u32(b + 8) != 1 || get_u32(b + 12) != REF_HEADER) {
        st = kiln_error(KILN_ERR_FORMAT, "%s: version %u (header %u bytes); this kiln reads version 1 (64)", path,
                        get_u32(b + 8), get_u32(b + 12));
    } else {
        *m = (kiln_ref_logps_meta){.n_docs = get_u64(b + 16), .shard_hash = get_u64(b + 24), .model_hash = get_u64(b + 32),
                                   .seq_len = (int32_t)get_u32(b + 40), .batch = (int32_t)get_u32(b + 44)};
        memcpy(m->precision, b + 48, 7);
        if (m->n_docs > (n - REF_HEADER - 8) / 4 || n != REF_HEADER + m->n_docs * 4 + 8)
            st = kiln_error(KILN_ERR_FORMAT, "%s: %zu bytes, but the header's %llu documents need %llu", path, n,
                            (unsigned long long)m->n_docs, (unsigned long long)(REF_HEADER + 8 + m->n_docs * 4));
        else if (get_u64(b + n - 8) != kiln_hash_bytes(b, n - 8))
            st = kiln_error(KILN_ERR_FORMAT, "%s: checksum mismatch at offset %zu (the file is damaged)", path, n - 8);
    }
    float *v = st ? NULL : malloc((size_t)m->n_docs * 4 + 1);
    if (!st && !v) st = kiln_error(KILN_ERR_OOM, "out of memory for %s", path);
    for (uint64_t i = 0; !st && i < m->n_docs; i++) {
        uint32_t u = get_u32(b + REF_HEADER + 4 * i);
        memcpy(&v[i], &u, 4);
        if (!isfinite(v[i]) || v[i] > 1e-3f) /* a sum of log-probabilities: <= 0 up to rounding */
            st = kiln_error(KILN_ERR_FORMAT, "%s: document %llu (offset %llu): log-probability %g is not finite and <= 0", path,
                            (unsigned long long)i, (unsigned long long)(REF_HEADER + 4 * i), (double)v[i]);
    }
    free(text);
    if (st) free(v);
    else *logps = v;
    return st;
}
