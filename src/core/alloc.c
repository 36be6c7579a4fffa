/* Caching allocator: blocks are rounded up to size classes (powers of two
 * split in four) and kept on per-class free lists after release, so eager
 * mode reuses memory instead of paying malloc + page faults per op, much as
 * PyTorch's CPU caching allocator does. A header in front of every block
 * records its class. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/core.h"

#define ALIGN 64
#define NCLASS 256

typedef struct block {
    struct block *next;
    size_t size; /* usable bytes, the class size */
    int cls;
    int magic;
} block;
#define HDR ALIGN /* header padded to keep the payload aligned */
#define MAGIC_LIVE 0x6b696c6e
#define MAGIC_FREE 0x66726565

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static block *free_list[NCLASS];
static kiln_alloc_stats stats;

/* class c covers sizes (base, base*1.25 ...) with 4 steps per power of two */
static int size_class(size_t n, size_t *cls_size) {
    if (n < 257) n = 257; /* smallest class: (256, 320] */
    int lg = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* floor(log2(n-1)) */
    size_t base = (size_t)1 << lg;
    size_t step = base / 4;
    size_t k = (n - base + step - 1) / step; /* 1..4 */
    if (k == 0) k = 1;
    *cls_size = base + k * step;
    int c = (lg - 8) * 4 + (int)(k - 1);
    return c < NCLASS ? c : NCLASS - 1;
}

void *kiln_alloc(size_t bytes) {
    size_t csize;
    int c = size_class(bytes ? bytes : 1, &csize);
    pthread_mutex_lock(&mu);
    stats.n_alloc++;
    block *b = free_list[c];
    if (b && b->size >= bytes) {
        free_list[c] = b->next;
        stats.cached_bytes -= b->size;
        stats.n_hits++;
    } else {
        b = NULL;
    }
    if (!b) {
        pthread_mutex_unlock(&mu);
        void *p = NULL;
        if (posix_memalign(&p, ALIGN, HDR + csize) != 0 || !p) {
            /* free the cache and try once more before failing */
            kiln_alloc_trim();
            if (posix_memalign(&p, ALIGN, HDR + csize) != 0 || !p) {
                kiln_error(KILN_ERR_OOM, "out of memory allocating %zu bytes", bytes);
                return NULL;
            }
        }
        b = (block *)p;
        b->size = csize;
        b->cls = c;
        pthread_mutex_lock(&mu);
    }
    b->magic = MAGIC_LIVE;
    b->next = NULL;
    stats.live_bytes += b->size;
    size_t total = stats.live_bytes + stats.cached_bytes;
    if (total > stats.peak_bytes) stats.peak_bytes = total;
    pthread_mutex_unlock(&mu);
    return (char *)b + HDR;
}

void kiln_dealloc(void *ptr) {
    if (!ptr) return;
    block *b = (block *)((char *)ptr - HDR);
    if (b->magic != MAGIC_LIVE) {
        kiln_log(KILN_LOG_ERROR, "kiln_dealloc: pointer %p is not a live kiln block", ptr);
        abort(); /* heap corruption: continuing would corrupt training state */
    }
    b->magic = MAGIC_FREE;
    pthread_mutex_lock(&mu);
    stats.live_bytes -= b->size;
    stats.cached_bytes += b->size;
    b->next = free_list[b->cls];
    free_list[b->cls] = b;
    pthread_mutex_unlock(&mu);
}

void kiln_alloc_trim(void) {
    pthread_mutex_lock(&mu);
    for (int c = 0; c < NCLASS; c++) {
        block *b = free_list[c];
        while (b) {
            block *n = b->next;
            stats.cached_bytes -= b->size;
            free(b);
            b = n;
        }
        free_list[c] = NULL;
    }
    pthread_mutex_unlock(&mu);
}

kiln_alloc_stats kiln_alloc_get_stats(void) {
    pthread_mutex_lock(&mu);
    kiln_alloc_stats s = stats;
    pthread_mutex_unlock(&mu);
    return s;
}

void kiln_alloc_reset_peak(void) {
    pthread_mutex_lock(&mu);
    stats.peak_bytes = stats.live_bytes + stats.cached_bytes;
    pthread_mutex_unlock(&mu);
}

static size_t status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t v = 0, klen = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, klen) == 0) { /* "VmHWM:\t  1234 kB" */
            int64_t kb = 0;
            if (!kiln_parse_leading_i64(line + klen + strspn(line + klen, " \t"), 0, INT64_MAX / 1024, &kb)) v = (size_t)kb;
            break;
        }
    fclose(f);
    return v * 1024;
}
size_t kiln_peak_rss(void) { return status_kb("VmHWM:"); }

bool kiln_grow(void **p, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : first;
    while (c < need) {
        if (c > SIZE_MAX / 2) return false;
        c *= 2;
    }
    if (c > SIZE_MAX / elem) return false;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

bool kiln_array_grow(void **p, int *cap, int need, size_t elem, int first) {
    if (need <= *cap) return true;
    size_t c = (size_t)*cap, was = c;
    if (need < 0 || !kiln_grow(p, &c, (size_t)need, elem, (size_t)first) || c > INT32_MAX) return false;
    memset((char *)*p + elem * was, 0, elem * (c - was));
    *cap = (int)c;
    return true;
}
