/* Token shards: the file format (write, map, validate) and `kiln tokenize`
 * (split files into documents, encode, hold out a deterministic fraction). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data_impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln shards are read in place and assume a little-endian host"
#endif

#define NO_ID 0xffffffffu

static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* The bytes after the tokens and the mask up to the pairs table (8-aligned
 * from the file's start). */
static uint64_t table_pad(uint64_t before) { return (8 - before % 8) % 8; }

static kiln_status write_shard(const char *path, const int32_t *tokens, const uint8_t *mask, size_t count,
                               const uint64_t *doc_end, const kiln_shard_info *info) {
    uint32_t width = info->vocab_size <= 65536 ? 2 : 4;
    if (info->vocab_size == 0) return kiln_error(KILN_ERR_INVALID, "%s: vocab size 0", path);
    for (size_t i = 0; mask && i < count; i++)
        if (mask[i] > 1) return kiln_error(KILN_ERR_INVALID, "%s: loss mask value %u at index %zu (must be 0 or 1)", path, mask[i], i);
    if (doc_end) {
        if (info->n_docs % 2)
            return kiln_error(KILN_ERR_INVALID, "%s: %llu documents do not make pairs (chosen, rejected)", path,
                              (unsigned long long)info->n_docs);
        for (uint64_t d = 0; d < info->n_docs; d++) {
            uint64_t s0 = d ? doc_end[d - 1] : 0;
            if (doc_end[d] < s0 + 2 || doc_end[d] > count || tokens[doc_end[d] - 1] != (int32_t)info->eos_id)
                return kiln_error(KILN_ERR_INVALID,
                                  "%s: document %llu ends at %llu: ends must grow by 2 or more (a token and its eos), "
                                  "end with the eos id and stay within %zu tokens",
                                  path, (unsigned long long)d, (unsigned long long)doc_end[d], count);
        }
        if ((info->n_docs ? doc_end[info->n_docs - 1] : 0) != count)
            return kiln_error(KILN_ERR_INVALID, "%s: the last document ends at %llu, not at the %zu tokens", path,
                              (unsigned long long)(info->n_docs ? doc_end[info->n_docs - 1] : 0), count);
    }
    size_t body = KILN_SHARD_HEADER + count * width + (mask ? count : 0);
    size_t pad = doc_end ? (size_t)table_pad(body) : 0;
    size_t bytes = body + pad + (doc_end ? (size_t)info->n_docs * 8 : 0);
    unsigned char *buf = calloc(1, bytes);
    if (!buf) return kiln_error(KILN_ERR_OOM, "%s: out of memory for %zu bytes", path, bytes);
    memcpy(buf, KILN_SHARD_MAGIC, 8);
    put32(buf + 8, doc_end ? 3 : 2);
    put32(buf + 12, width);
    put64(buf + 16, count);
    put32(buf + 24, info->vocab_size);
    put32(buf + 28, info->eos_id);
    put32(buf + 32, info->pad_id);
    put32(buf + 36, info->bos_id);
    put64(buf + 40, info->n_docs);
    put32(buf + 48, (mask ? KILN_SHARD_MASKED : 0) | (doc_end ? KILN_SHARD_PAIRS : 0));
    if (mask) memcpy(buf + KILN_SHARD_HEADER + count * width, mask, count);
    for (uint64_t d = 0; doc_end && d < info->n_docs; d++) put64(buf + body + pad + 8 * d, doc_end[d]);
    for (size_t i = 0; i < count; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= info->vocab_size) {
            free(buf);
            return kiln_error(KILN_ERR_RANGE, "%s: token %d at index %zu is outside vocab size %u", path,
                              (int)tokens[i], i, info->vocab_size);
        }
        if (width == 2) {
            uint16_t v = (uint16_t)tokens[i];
            memcpy(buf + KILN_SHARD_HEADER + 2 * i, &v, 2);
        } else {
            put32(buf + KILN_SHARD_HEADER + 4 * i, (uint32_t)tokens[i]);
        }
    }
    kiln_status st = kiln_write_file_atomic(path, buf, bytes);
    free(buf);
    return st ? kiln_error_context(st, "writing shard %s", path) : KILN_OK;
}

kiln_status kiln_shard_write(const char *path, const int32_t *tokens, size_t count,
                             const kiln_shard_info *info) {
    return write_shard(path, tokens, NULL, count, NULL, info);
}

kiln_status kiln_shard_write_masked(const char *path, const int32_t *tokens, const uint8_t *mask, size_t count,
                                    const kiln_shard_info *info) {
    return write_shard(path, tokens, mask, count, NULL, info);
}

kiln_status kiln_shard_write_pairs(const char *path, const int32_t *tokens, const uint8_t *mask, size_t count,
                                   const uint64_t *doc_end, const kiln_shard_info *info) {
    static const uint64_t none = 0;
    return write_shard(path, tokens, mask, count, doc_end ? doc_end : &none, info);
}

struct kiln_shard {
    kiln_shard_info info;
    void *map;
    size_t map_len;
    const void *tokens;
    const uint8_t *mask;
    const uint64_t *doc_end; /* pairs shards */
};

static kiln_status validate(const char *path, const unsigned char *h, size_t size, kiln_shard_info *in) {
    if (size < KILN_SHARD_HEADER)
        return kiln_error(KILN_ERR_FORMAT, "%s: truncated header: file has %zu bytes, the header needs %d", path,
                          size, KILN_SHARD_HEADER);
    if (memcmp(h, KILN_SHARD_MAGIC, 8))
        return kiln_error(KILN_ERR_FORMAT, "%s: bad magic at offset 0 (not a kiln token shard; expected \"%s\")",
                          path, KILN_SHARD_MAGIC);
    in->version = get32(h + 8);
    in->width = get32(h + 12);
    in->count = get64(h + 16);
    in->vocab_size = get32(h + 24);
    in->eos_id = get32(h + 28);
    in->pad_id = get32(h + 32);
    in->bos_id = get32(h + 36);
    in->n_docs = get64(h + 40);
    if (in->version < 1 || in->version > KILN_SHARD_VERSION)
        return kiln_error(KILN_ERR_FORMAT, "%s: version %u at offset 8, this build reads versions 1 to %d", path,
                          in->version, KILN_SHARD_VERSION);
    in->flags = in->version >= 2 ? get32(h + 48) : 0;
    uint32_t known = in->version >= 3 ? KILN_SHARD_MASKED | KILN_SHARD_PAIRS : KILN_SHARD_MASKED;
    if (in->flags & ~known)
        return kiln_error(KILN_ERR_FORMAT, "%s: unknown flags 0x%x at offset 48 (version %u knows 0x%x: %s)", path,
                          in->flags, in->version, known,
                          in->version >= 3 ? "the loss mask and preference pairs" : "the loss mask; preference pairs are version 3");
    if (in->width != 2 && in->width != 4)
        return kiln_error(KILN_ERR_FORMAT, "%s: token width %u at offset 12, must be 2 or 4", path, in->width);
    if (in->vocab_size == 0 || (in->width == 2 && in->vocab_size > 65536))
        return kiln_error(KILN_ERR_FORMAT, "%s: vocab size %u at offset 24 does not fit width %u", path,
                          in->vocab_size, in->width);
    uint64_t have = size - KILN_SHARD_HEADER, per = in->width + (in->flags & KILN_SHARD_MASKED ? 1 : 0);
    bool pairs = in->flags & KILN_SHARD_PAIRS;
    if (pairs) {
        /* the document table: n_docs u64 at the end, after zero padding */
        if (in->n_docs % 2)
            return kiln_error(KILN_ERR_FORMAT, "%s: document count %llu at offset 40 is odd: a pairs shard holds a chosen and a rejected document per pair",
                              path, (unsigned long long)in->n_docs);
        if (in->n_docs > have / 8)
            return kiln_error(KILN_ERR_FORMAT, "%s: document count %llu at offset 40 needs a %llu-byte document table, the file has %llu bytes after the header",
                              path, (unsigned long long)in->n_docs, (unsigned long long)(in->n_docs * 8), (unsigned long long)have);
        have -= in->n_docs * 8;
    }
    if (in->count > have / per)
        return kiln_error(KILN_ERR_FORMAT,
                          "%s: token count %llu at offset 16 needs %llu bytes of tokens%s%s, the file has %llu", path,
                          (unsigned long long)in->count, (unsigned long long)(in->count * per),
                          per > in->width ? " and loss mask" : "", pairs ? " before its document table" : "",
                          (unsigned long long)have);
    uint64_t pad = pairs ? table_pad(KILN_SHARD_HEADER + in->count * per) : 0;
    if (in->count * per + pad != have)
        return kiln_error(KILN_ERR_FORMAT,
                          "%s: token count %llu at offset 16 needs %llu bytes of tokens%s%s, the file has %llu", path,
                          (unsigned long long)in->count, (unsigned long long)(in->count * per + pad),
                          per > in->width ? " and loss mask" : "", pairs ? " (and padding) before its document table" : "",
                          (unsigned long long)have);
    return KILN_OK;
}

kiln_status kiln_shard_open(const char *path, kiln_shard **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_error(KILN_ERR_IO, "cannot open shard %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        int e = errno;
        close(fd);
        return kiln_error(KILN_ERR_IO, "cannot stat shard %s: %s", path, strerror(e));
    }
    size_t size = (size_t)sb.st_size;
    unsigned char head[KILN_SHARD_HEADER];
    ssize_t got = pread(fd, head, sizeof head, 0);
    kiln_shard_info info;
    kiln_status st = KILN_OK;
    if (got < 0 || (size_t)got < (size < sizeof head ? size : sizeof head))
        st = kiln_error(KILN_ERR_IO, "cannot read shard %s: %s", path, got < 0 ? strerror(errno) : "short read");
    if (!st) st = validate(path, head, size, &info);
    if (st) {
        close(fd);
        return st;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return kiln_error(KILN_ERR_IO, "cannot map shard %s: %s", path, strerror(e));
    const void *tok = (const unsigned char *)map + KILN_SHARD_HEADER;
    for (uint64_t i = 0; i < info.count; i++) {
        uint32_t v = kiln_shard_width_token(tok, info.width, i);
        if (v >= info.vocab_size) {
            munmap(map, size);
            return kiln_error(KILN_ERR_FORMAT, "%s: token %u at index %llu (byte offset %llu) is >= vocab size %u",
                              path, v, (unsigned long long)i,
                              (unsigned long long)(KILN_SHARD_HEADER + i * info.width), info.vocab_size);
        }
    }
    const uint8_t *mask = info.flags & KILN_SHARD_MASKED ? (const uint8_t *)tok + info.count * info.width : NULL;
    for (uint64_t i = 0; mask && i < info.count; i++)
        if (mask[i] > 1) {
            unsigned v = mask[i];
            munmap(map, size);
            return kiln_error(KILN_ERR_FORMAT, "%s: loss mask value %u at index %llu (byte offset %llu) is not 0 or 1", path,
                              v, (unsigned long long)i,
                              (unsigned long long)(KILN_SHARD_HEADER + info.count * info.width + i));
        }
    const uint64_t *ends = NULL;
    if (info.flags & KILN_SHARD_PAIRS) {
        uint64_t off = size - info.n_docs * 8; /* 8-aligned: the writer pads to it */
        ends = (const uint64_t *)(const void *)((const unsigned char *)map + off);
        for (uint64_t d = 0; d < info.n_docs; d++) {
            uint64_t s0 = d ? ends[d - 1] : 0;
            const char *why = ends[d] < s0 + 2 ? "less than 2 past the previous end (a document is a token and its eos)"
                              : ends[d] > info.count ? "past the last token"
                              : kiln_shard_width_token(tok, info.width, ends[d] - 1) != info.eos_id ? "not after an eos"
                              : d + 1 == info.n_docs && ends[d] != info.count ? "not the token count (the last document)"
                                                                               : NULL;
            if (why) {
                uint64_t e = ends[d];
                munmap(map, size);
                return kiln_error(KILN_ERR_FORMAT, "%s: document %llu ends at %llu (byte offset %llu): %s", path,
                                  (unsigned long long)d, (unsigned long long)e, (unsigned long long)(off + 8 * d), why);
            }
        }
        if (info.n_docs == 0 && info.count) {
            munmap(map, size);
            return kiln_error(KILN_ERR_FORMAT, "%s: %llu tokens but no documents in the pairs table", path,
                              (unsigned long long)info.count);
        }
    }
    kiln_shard *s = calloc(1, sizeof *s);
    if (!s) {
        munmap(map, size);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    s->info = info;
    s->map = map;
    s->map_len = size;
    s->tokens = tok;
    s->mask = mask;
    s->doc_end = ends;
    *out = s;
    return KILN_OK;
}

void kiln_shard_close(kiln_shard *s) {
    if (!s) return;
    munmap(s->map, s->map_len);
    free(s);
}

const kiln_shard_info *kiln_shard_get_info(const kiln_shard *s) { return &s->info; }

uint32_t kiln_shard_token(const kiln_shard *s, uint64_t i) {
    return kiln_shard_width_token(s->tokens, s->info.width, i);
}

const uint8_t *kiln_shard_mask(const kiln_shard *s) { return s->mask; }

const uint64_t *kiln_shard_doc_ends(const kiln_shard *s) { return s->doc_end; }
uint64_t kiln_shard_hash(const kiln_shard *s) { return kiln_hash_bytes(s->map, s->map_len); }

/* ---- kiln tokenize ---- */

typedef struct { size_t *start, *len; size_t n, cap; } spans;

static bool span_add(spans *d, size_t s, size_t l) {
    if (l == 0) return true;
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 1024;
        size_t *a = realloc(d->start, c * sizeof *a);
        if (a) d->start = a;
        size_t *b = realloc(d->len, c * sizeof *b);
        if (b) d->len = b;
        if (!a || !b) return false;
        d->cap = c;
    }
    d->start[d->n] = s;
    d->len[d->n++] = l;
    return true;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\f' && s[i] != '\v') return false;
    return true;
}

static bool split_docs(const char *text, size_t n, kiln_doc_split how, spans *d) {
    if (how == KILN_DOC_FILE) return span_add(d, 0, n);
    size_t i = 0, doc = 0, doc_end = 0;
    bool in_doc = false;
    while (i < n) {
        const char *nl = memchr(text + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - text) : n;
        bool blank = is_blank(text + i, e - i);
        if (how == KILN_DOC_LINE) {
            if (!blank && !span_add(d, i, e - i)) return false;
        } else if (blank) {
            if (in_doc && !span_add(d, doc, doc_end - doc)) return false;
            in_doc = false;
        } else {
            if (!in_doc) doc = i;
            in_doc = true;
            doc_end = e;
        }
        i = e + 1;
    }
    return !in_doc || span_add(d, doc, doc_end - doc);
}

typedef kd_tokvec tokvec;
typedef kd_tk_ctx tk_ctx;

/* Appends n tokens with their mask (NULL: all targets). */
static bool tv_append(tokvec *t, const int32_t *v, const uint8_t *mask, size_t n) {
    if (t->n + n > t->cap) {
        size_t c = t->cap ? t->cap : 1 << 16;
        while (c < t->n + n) c *= 2;
        int32_t *p = realloc(t->v, c * sizeof *p);
        if (!p) return false;
        t->v = p;
        uint8_t *m = realloc(t->m, c);
        if (!m) return false;
        t->m = m;
        t->cap = c;
    }
    if (n) memcpy(t->v + t->n, v, n * sizeof *v);
    if (n && mask) memcpy(t->m + t->n, mask, n);
    else if (n) memset(t->m + t->n, 1, n);
    for (size_t i = 0; mask && i < n; i++) t->masked += !mask[i];
    t->n += n;
    return true;
}

static bool goes_to_val(const char *doc, size_t n, const kiln_tokenize_opts *o) {
    if (o->val_frac <= 0) return false;
    uint64_t h = kiln_rng_u64(o->seed, kiln_hash_bytes(doc, n));
    return (double)(h >> 11) * 0x1.0p-53 < o->val_frac;
}

kiln_status kd_tokenize_add(kd_tk_ctx *c, const char *doc, size_t len, const int32_t *ids, const uint8_t *mask, size_t n,
                            bool eos_target) {
    bool val = goes_to_val(doc, len, c->opts);
    tokvec *dst = val ? &c->val : &c->train;
    if (!val) c->last_train_start = c->train.n;
    int32_t eos = kiln_tokenizer_eos(c->tok);
    uint8_t em = eos_target ? 1 : 0;
    if (!tv_append(dst, ids, mask, n) || !tv_append(dst, &eos, &em, 1))
        return kiln_error(KILN_ERR_OOM, "out of memory collecting tokens");
    dst->docs++;
    return KILN_OK;
}

static bool tv_end(tokvec *t) {
    if (t->docs >= t->ends_cap) {
        size_t c = t->ends_cap ? 2 * t->ends_cap : 1024;
        uint64_t *e = realloc(t->ends, c * sizeof *e);
        if (!e) return false;
        t->ends = e;
        t->ends_cap = c;
    }
    t->ends[t->docs++] = t->n;
    return true;
}

kiln_status kd_tokenize_add_pair(kd_tk_ctx *c, uint64_t key, const int32_t *const ids[2], const uint8_t *const mask[2],
                                 const size_t n[2], const bool eos_target[2]) {
    const kiln_tokenize_opts *o = c->opts;
    bool val = o->val_frac > 0 && (double)(kiln_rng_u64(o->seed, key) >> 11) * 0x1.0p-53 < o->val_frac;
    tokvec *dst = val ? &c->val : &c->train;
    if (!val) c->last_train_start = c->train.n;
    int32_t eos = kiln_tokenizer_eos(c->tok);
    for (int k = 0; k < 2; k++) {
        uint8_t em = eos_target[k] ? 1 : 0;
        if (!tv_append(dst, ids[k], mask[k], n[k]) || !tv_append(dst, &eos, &em, 1) || !tv_end(dst))
            return kiln_error(KILN_ERR_OOM, "out of memory collecting tokens");
    }
    return KILN_OK;
}

kiln_status kd_tokenize_kind(kd_tk_ctx *c, bool pairs, const char *path, size_t line) {
    int kind = pairs ? 1 : 2;
    char here[320];
    if (line) snprintf(here, sizeof here, "%s:%zu", path, line);
    else snprintf(here, sizeof here, "%s", path);
    if (!c->kind) {
        c->kind = kind;
        snprintf(c->kind_where, sizeof c->kind_where, "%s", here);
        return KILN_OK;
    }
    if (c->kind == kind) return KILN_OK;
    return kiln_error(KILN_ERR_INVALID,
                      "%s: %s, but %s %s: a corpus of preference pairs ({\"prompt\", \"chosen\", \"rejected\"}) holds "
                      "nothing else (pair shards are read as pairs only)",
                      here, pairs ? "a preference pair (it has \"chosen\" or \"rejected\")" : "not a preference pair",
                      c->kind_where, c->kind == 1 ? "is one" : "is other data");
}

#define BATCH_BYTES ((size_t)32 << 20)

/* Encodes documents [d0, d1) of one file and sends each to train or val. */
static kiln_status route_docs(tk_ctx *c, const char *text, const spans *d, size_t d0, size_t d1) {
    int32_t *ids;
    size_t n_ids, p = 0;
    int32_t eos = kiln_tokenizer_eos(c->tok);
    kiln_status st = kiln_tokenizer_encode_docs_ex(c->tok, text, d->start + d0, d->len + d0, d1 - d0, eos,
                                                   c->opts->no_special ? 0 : KILN_ENCODE_SPECIAL, &ids, &n_ids);
    if (st) return st;
    for (size_t k = d0; k < d1; k++) {
        size_t q = p;
        while (q + 1 < n_ids && ids[q] != eos) q++; /* text never encodes to a special id */
        q++;
        bool val = goes_to_val(text + d->start[k], d->len[k], c->opts);
        tokvec *dst = val ? &c->val : &c->train;
        if (!val) c->last_train_start = c->train.n;
        if (!tv_append(dst, ids + p, NULL, q - p)) {
            free(ids);
            return kiln_error(KILN_ERR_OOM, "out of memory collecting tokens");
        }
        dst->docs++;
        p = q;
    }
    free(ids);
    return KILN_OK;
}

static kiln_status tokenize_file(tk_ctx *c, const char *path, kiln_tokenize_stats *stats) {
    size_t pl = strlen(path);
    if (pl > 6 && !strcmp(path + pl - 6, ".jsonl")) return kd_tokenize_jsonl(c, path, stats);
    if (c->opts->field) return kiln_error(KILN_ERR_INVALID, "--field applies to JSONL files (*.jsonl), and %s is not one", path);
    kiln_status kst = kd_tokenize_kind(c, false, path, 0);
    if (kst) return kst;
    char *text;
    size_t n;
    kiln_status st = kiln_read_file(path, &text, &n);
    if (st) return kiln_error_context(st, "reading corpus %s", path);
    spans d = {0};
    double t0 = kiln_time_now();
    if (!split_docs(text, n, c->opts->split, &d)) st = kiln_error(KILN_ERR_OOM, "out of memory splitting %s", path);
    size_t d0 = 0;
    while (!st && d0 < d.n) {
        size_t d1 = d0, bytes = 0;
        while (d1 < d.n && (d1 == d0 || bytes < BATCH_BYTES)) bytes += d.len[d1++];
        st = route_docs(c, text, &d, d0, d1);
        d0 = d1;
        if (n > BATCH_BYTES)
            kiln_log(KILN_LOG_INFO, "tokenize: %s: %.0f%% (%.1f MB/s)", path,
                     100.0 * (double)(d0 < d.n ? d.start[d0] : n) / (double)n,
                     (double)(d0 < d.n ? d.start[d0] : n) / 1e6 / (kiln_time_now() - t0 + 1e-9));
    }
    if (!st)
        kiln_log(KILN_LOG_INFO, "tokenize: %s: %.2f MB, %zu documents in %.2f s", path, n / 1e6, d.n,
                 kiln_time_now() - t0);
    stats->bytes += n;
    free(d.start);
    free(d.len);
    free(text);
    return st;
}

static kiln_status write_shards(tk_ctx *c, const char *dir, kiln_tokenize_stats *stats) {
    const kiln_tokenizer *t = c->tok;
    kiln_shard_info info = {
        .vocab_size = (uint32_t)kiln_tokenizer_vocab_size(t),
        .eos_id = (uint32_t)kiln_tokenizer_eos(t),
        .pad_id = kiln_tokenizer_pad(t) >= 0 ? (uint32_t)kiln_tokenizer_pad(t) : NO_ID,
        .bos_id = kiln_tokenizer_bos(t) >= 0 ? (uint32_t)kiln_tokenizer_bos(t) : NO_ID,
    };
    size_t plen = strlen(dir) + 16;
    char *path = malloc(plen);
    if (!path) return kiln_error(KILN_ERR_OOM, "out of memory");
    bool pairs = c->kind == 1;
    info.n_docs = c->train.docs;
    snprintf(path, plen, "%s/train.bin", dir);
    /* A mask is stored only when some token is not a target. */
    bool masked = c->train.masked + c->val.masked > 0;
    kiln_status st = pairs ? kiln_shard_write_pairs(path, c->train.v, masked ? c->train.m : NULL, c->train.n, c->train.ends, &info)
                           : kiln_shard_write_masked(path, c->train.v, masked ? c->train.m : NULL, c->train.n, &info);
    if (!st) {
        info.n_docs = c->val.docs;
        snprintf(path, plen, "%s/val.bin", dir);
        st = pairs ? kiln_shard_write_pairs(path, c->val.v, masked ? c->val.m : NULL, c->val.n, c->val.ends, &info)
                   : kiln_shard_write_masked(path, c->val.v, masked ? c->val.m : NULL, c->val.n, &info);
    }
    stats->masked_tokens = c->train.masked + c->val.masked;
    free(path);
    stats->train_tokens = c->train.n;
    stats->val_tokens = c->val.n;
    stats->train_docs = c->train.docs;
    stats->val_docs = c->val.docs;
    stats->pairs = pairs;
    stats->train_pairs = pairs ? c->train.docs / 2 : 0;
    stats->val_pairs = pairs ? c->val.docs / 2 : 0;
    return st;
}

kiln_status kiln_tokenize_files(const kiln_tokenizer *tok, const char *const *paths, int n_paths,
                                const char *dir, const kiln_tokenize_opts *opts, kiln_tokenize_stats *stats) {
    kiln_tokenize_stats dummy;
    if (!stats) stats = &dummy;
    memset(stats, 0, sizeof *stats);
    if (kiln_tokenizer_eos(tok) < 0) return kiln_error(KILN_ERR_INVALID, "the tokenizer has no <|eos|> token to end documents");
    if (opts->val_frac < 0 || opts->val_frac >= 1)
        return kiln_error(KILN_ERR_INVALID, "--val-frac %g: must be in [0, 1)", opts->val_frac);
    if (mkdir(dir, 0777) < 0 && errno != EEXIST)
        return kiln_error(KILN_ERR_IO, "cannot create output directory %s: %s", dir, strerror(errno));
    if (opts->max_len < 0 || opts->max_prompt_len < 0)
        return kiln_error(KILN_ERR_INVALID, "--max-len %lld and --max-prompt-len %lld: must be positive (0 = no limit)",
                          (long long)opts->max_len, (long long)opts->max_prompt_len);
    if (!opts->no_special) { /* documents are delimited by eos: the post-processor may put it only at their end */
        int32_t *ids = NULL, eos = kiln_tokenizer_eos(tok);
        size_t n = 0;
        kiln_status pst = kiln_tokenizer_encode_ex(tok, "", 0, KILN_ENCODE_SPECIAL, &ids, &n);
        for (size_t i = 0; !pst && i + 1 < n; i++)
            if (ids[i] == eos)
                pst = kiln_error(KILN_ERR_UNSUPPORTED, "the tokenizer's post-processor puts the eos id %d at position %zu of a "
                                 "document, and kiln tokenize delimits documents by eos: pass --no-special", (int)eos, i);
        free(ids);
        if (pst) return pst;
    }
    tk_ctx c = {.tok = tok, .opts = opts};
    kiln_status st = KILN_OK;
    for (int i = 0; i < n_paths && !st; i++) st = tokenize_file(&c, paths[i], stats);
    bool pairs = c.kind == 1;
    if (!st && !pairs && (opts->max_len || opts->max_prompt_len))
        st = kiln_error(KILN_ERR_INVALID, "--max-len and --max-prompt-len apply to preference pairs (JSONL lines with \"prompt\", \"chosen\" and \"rejected\"), and the corpus holds none");
    if (!st && c.train.docs + c.val.docs == 0)
        st = kiln_error(KILN_ERR_INVALID, pairs && stats->pairs_skipped
                                              ? "the corpus holds no pairs: all %llu were skipped (their prompt leaves no room under --max-len)"
                                              : "the corpus holds no documents",
                        (unsigned long long)stats->pairs_skipped);
    uint64_t unit = pairs ? 2 : 1; /* documents per example */
    if (!st && opts->val_frac > 0 && c.val.docs == 0 && c.train.docs >= 2 * unit) {
        /* Too few documents for the hash to pick one: hold out the last (pair). */
        size_t s = c.last_train_start;
        size_t m0 = c.val.masked;
        if (!tv_append(&c.val, c.train.v + s, c.train.m + s, c.train.n - s)) st = kiln_error(KILN_ERR_OOM, "out of memory");
        for (uint64_t k = 0; pairs && !st && k < unit; k++) /* the pair's document ends, now in val */
            if (tv_end(&c.val)) c.val.ends[k] = c.train.ends[c.train.docs - unit + k] - s;
            else st = kiln_error(KILN_ERR_OOM, "out of memory");
        c.train.masked -= c.val.masked - m0;
        c.train.n = s;
        c.train.docs -= unit;
        if (!pairs) c.val.docs++;
    }
    if (!st && opts->val_frac > 0 && c.val.docs == 0)
        kiln_log(KILN_LOG_WARN, "tokenize: a single document: %s/val.bin is empty (split the text into documents, see --docs)", dir);
    if (!st) st = write_shards(&c, dir, stats);
    if (!st)
        kiln_log(KILN_LOG_INFO, "tokenize: %s: train %zu tokens (%llu docs), val %zu tokens (%llu docs)", dir,
                 c.train.n, (unsigned long long)c.train.docs, c.val.n, (unsigned long long)c.val.docs);
    free(c.train.v);
    free(c.val.v);
    free(c.train.m);
    free(c.val.m);
    free(c.train.ends);
    free(c.val.ends);
    return st;
}
