/* Hash maps used across src/tokenizer. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer_impl.h"

#define EMPTY UINT64_MAX

/* 0 when n is too large for a table (every size below is checked). */
static size_t pow2_at_least(size_t n) {
    if (n > (SIZE_MAX >> 5)) return 0;
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

bool kd_map64_init(kd_map64 *m, size_t expect) {
    m->cap = expect > SIZE_MAX / 4 ? 0 : pow2_at_least(expect * 2);
    m->n = 0;
    m->keys = m->vals = NULL;
    if (!m->cap) return false;
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->vals = malloc(m->cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        kd_map64_free(m);
        return false;
    }
    memset(m->keys, 0xff, m->cap * sizeof *m->keys);
    return true;
}

void kd_map64_free(kd_map64 *m) {
    free(m->keys);
    free(m->vals);
    m->keys = m->vals = NULL;
    m->cap = m->n = 0;
}

uint64_t *kd_map64_get(const kd_map64 *m, uint64_t key) {
    if (!m->cap) return NULL;
    size_t mask = m->cap - 1, i = kiln_hash_mix64(key) & mask;
    for (;;) {
        if (m->keys[i] == key) return &m->vals[i];
        if (m->keys[i] == EMPTY) return NULL;
        i = (i + 1) & mask;
    }
}

static bool map64_grow(kd_map64 *m) {
    kd_map64 g;
    if (!kd_map64_init(&g, m->cap)) return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == EMPTY) continue;
        size_t j = kiln_hash_mix64(m->keys[i]) & (g.cap - 1);
        while (g.keys[j] != EMPTY) j = (j + 1) & (g.cap - 1);
        g.keys[j] = m->keys[i];
        g.vals[j] = m->vals[i];
    }
    g.n = m->n;
    kd_map64_free(m);
    *m = g;
    return true;
}

uint64_t *kd_map64_put(kd_map64 *m, uint64_t key, uint64_t init, bool *inserted) {
    if ((m->n + 1) * 4 > m->cap * 3 && !map64_grow(m)) return NULL;
    size_t mask = m->cap - 1, i = kiln_hash_mix64(key) & mask;
    while (m->keys[i] != EMPTY) {
        if (m->keys[i] == key) {
            if (inserted) *inserted = false;
            return &m->vals[i];
        }
        i = (i + 1) & mask;
    }
    m->keys[i] = key;
    m->vals[i] = init;
    m->n++;
    if (inserted) *inserted = true;
    return &m->vals[i];
}

/* ---- string map ---- */

bool kd_strmap_init(kd_strmap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = expect > SIZE_MAX / 64 ? 0 : pow2_at_least(expect * 2);
    if (!m->cap) return false;
    m->ecap = expect < 16 ? 16 : expect;
    m->acap = m->ecap * 8;
    m->slots = calloc(m->cap, sizeof *m->slots);
    m->hashes = malloc(m->ecap * sizeof *m->hashes);
    m->offs = malloc(m->ecap * sizeof *m->offs);
    m->lens = malloc(m->ecap * sizeof *m->lens);
    m->vals = malloc(m->ecap * sizeof *m->vals);
    m->arena = malloc(m->acap);
    if (!m->slots || !m->hashes || !m->offs || !m->lens || !m->vals || !m->arena) {
        kd_strmap_free(m);
        return false;
    }
    return true;
}

void kd_strmap_free(kd_strmap *m) {
    free(m->slots);
    free(m->hashes);
    free(m->offs);
    free(m->lens);
    free(m->vals);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

uint64_t *kd_strmap_get(const kd_strmap *m, const char *key, size_t len, uint64_t h) {
    if (!m->cap) return NULL;
    size_t mask = m->cap - 1, i = h & mask;
    for (;;) {
        uint32_t e = m->slots[i];
        if (!e) return NULL;
        e--;
        if (m->hashes[e] == h && m->lens[e] == len && !memcmp(m->arena + m->offs[e], key, len))
            return &m->vals[e];
        i = (i + 1) & mask;
    }
}

static bool strmap_rehash(kd_strmap *m) {
    if (m->cap > SIZE_MAX / 2 / sizeof(uint64_t)) return false;
    size_t cap = m->cap * 2;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = m->hashes[e] & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = (uint32_t)(e + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

uint64_t *kd_strmap_put(kd_strmap *m, const char *key, size_t len, uint64_t h, uint64_t init,
                        bool *inserted) {
    uint64_t *v = kd_strmap_get(m, key, len, h);
    if (v) {
        if (inserted) *inserted = false;
        return v;
    }
    if (m->n >= UINT32_MAX - 1) return NULL;
    if ((m->n + 1) * 4 > m->cap * 3 && !strmap_rehash(m)) return NULL;
    if (len > UINT32_MAX || len > SIZE_MAX - m->alen - 1) return NULL;
    if (m->n + 1 > m->ecap) {
        if (m->ecap > SIZE_MAX / 2 / sizeof(uint64_t)) return NULL;
        size_t c = m->ecap * 2;
        uint64_t *hs = realloc(m->hashes, c * sizeof *hs);
        if (hs) m->hashes = hs;
        uint64_t *os = realloc(m->offs, c * sizeof *os);
        if (os) m->offs = os;
        uint32_t *ls = realloc(m->lens, c * sizeof *ls);
        if (ls) m->lens = ls;
        uint64_t *vs = realloc(m->vals, c * sizeof *vs);
        if (vs) m->vals = vs;
        if (!hs || !os || !ls || !vs) return NULL;
        m->ecap = c;
    }
    if (!kiln_grow((void **)&m->arena, &m->acap, m->alen + len + 1, 1, 16)) return NULL;
    size_t e = m->n++;
    memcpy(m->arena + m->alen, key, len);
    m->hashes[e] = h;
    m->offs[e] = m->alen;
    m->lens[e] = (uint32_t)len;
    m->vals[e] = init;
    m->alen += len;
    size_t i = h & (m->cap - 1);
    while (m->slots[i]) i = (i + 1) & (m->cap - 1);
    m->slots[i] = (uint32_t)(e + 1);
    if (inserted) *inserted = true;
    return &m->vals[e];
}
