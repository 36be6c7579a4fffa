/* cpu-isolated: a strict second device on the host, to prove the seam.
 *
 * Its buffers are anonymous mappings of their own that kiln_tensor_map
 * refuses; every move in or out goes through its write / read / copy, and
 * everything that computes on them runs inside exec (the CPU kernels, the
 * interpreter, generated code). With -DKILN_STRICT_DEVICE (the sanitizer
 * builds) or KILN_STRICT_DEVICE=1 in the environment, each buffer is
 * PROT_NONE outside those calls, so host code that touches one without the
 * seam faults at the access. Calls nest (a depth count); the protection is
 * process-wide while any call is open. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "kiln/backend.h"

/* The buffers are cut from one reserved stretch of address space (PROT_NONE,
 * MAP_NORESERVE: no memory until used), so that consecutive buffers are one
 * mprotect: each call of the kernel's is a TLB shootdown to every core
 * running the process, and with one call per buffer the strict builds spent
 * most of an eager step in them. spans: the buffers, sorted by offset;
 * holes: the freed stretches below top, sorted and coalesced, reused first
 * fit. A buffer that does not fit the reservation (or a system that
 * refuses it) gets a mapping of its own (regions).
 * A freed stretch keeps its pages, as a caching allocator keeps its
 * blocks: releasing them (MADV_DONTNEED) on every free cost a shootdown
 * and, on reuse, a page fault per page, most of an eager step of the tiny
 * test models. Once more than IDLE_MAX bytes lie freed
 * and unreleased, every hole and the stretch above top are released.
 * Protection changes only where it guards something: outside strict mode
 * the reservation is opened read-write in steps of GROW as top passes
 * them and never closed again (an mprotect per buffer and per free was a
 * third of test_device's time in the optimised build); in strict mode a
 * buffer freed outside every call is PROT_NONE already. */
#define RESERVE ((size_t)1 << 38) /* 256 GiB of address space */
#define IDLE_MAX ((size_t)64 << 20)
#define GROW ((size_t)64 << 20)

typedef struct {
    size_t off, len;
} span;

typedef struct region {
    void *p;
    size_t len;
    struct region *next;
} region;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static region *regions;
static char *arena; /* NULL: not reserved yet; MAP_FAILED: refused */
static size_t top;  /* bytes of the reservation handed out so far */
static size_t high; /* top's highest value since the pages were last released */
static size_t idle; /* freed bytes whose pages may still be resident (an upper bound) */
static size_t open_end; /* outside strict mode: [0, open_end) of the reservation is read-write */
static span *spans, *holes;
static size_t n_spans, cap_spans, n_holes, cap_holes;
static int depth;
static int strict = -1; /* -1: not decided yet */

static bool is_strict(void) {
    if (strict < 0) {
#ifdef KILN_STRICT_DEVICE
        strict = 1;
#else
        const char *e = getenv("KILN_STRICT_DEVICE");
        strict = e && !strcmp(e, "1");
#endif
    }
    return strict;
}

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* inserts x into the sorted array a (n of cap) at its place; false: no memory */
static bool span_insert(span **a, size_t *n, size_t *cap, span x) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        span *b = realloc(*a, c * sizeof *b);
        if (!b) return false;
        *a = b, *cap = c;
    }
    size_t i = *n;
    while (i > 0 && (*a)[i - 1].off > x.off) i--;
    memmove(*a + i + 1, *a + i, (*n - i) * sizeof **a);
    (*a)[i] = x;
    (*n)++;
    return true;
}

static void span_remove(span *a, size_t *n, size_t i) {
    memmove(a + i, a + i + 1, (*n - i - 1) * sizeof *a);
    (*n)--;
}

/* every buffer to prot: runs of adjacent spans in one call each */
static void protect_all(int prot) {
    for (size_t i = 0; i < n_spans;) {
        size_t j = i + 1, end = spans[i].off + spans[i].len;
        while (j < n_spans && spans[j].off == end) end += spans[j++].len;
        mprotect(arena + spans[i].off, end - spans[i].off, prot);
        i = j;
    }
    for (region *r = regions; r; r = r->next) mprotect(r->p, r->len, prot);
}

static void enter(void) {
    pthread_mutex_lock(&mu);
    if (depth++ == 0 && is_strict()) protect_all(PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&mu);
}

/* Closing is one call for the whole reservation below top (its holes are
 * PROT_NONE already), so one shootdown however scattered the buffers. */
static void leave(void) {
    pthread_mutex_lock(&mu);
    if (--depth == 0 && is_strict()) {
        if (arena && arena != MAP_FAILED && top) mprotect(arena, top, PROT_NONE);
        for (region *r = regions; r; r = r->next) mprotect(r->p, r->len, PROT_NONE);
    }
    pthread_mutex_unlock(&mu);
}

/* len bytes of the reservation (under mu), or NULL */
static void *arena_take(size_t len, int prot) {
    if (!arena) arena = mmap(NULL, RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED) return NULL;
    size_t off = SIZE_MAX;
    for (size_t i = 0; i < n_holes; i++)
        if (holes[i].len >= len) {
            off = holes[i].off;
            holes[i].off += len, holes[i].len -= len;
            if (!holes[i].len) span_remove(holes, &n_holes, i);
            break;
        }
    if (off == SIZE_MAX) {
        if (len > RESERVE - top) return NULL;
        off = top, top += len;
        if (top > high) high = top;
    }
    idle -= idle < len ? idle : len;
    if (!is_strict() && off + len > open_end) {
        size_t end = (off + len + GROW - 1) / GROW * GROW;
        if (end > RESERVE) end = RESERVE;
        if (mprotect(arena + open_end, end - open_end, PROT_READ | PROT_WRITE) != 0) {
            span_insert(&holes, &n_holes, &cap_holes, (span){off, len}); /* given back */
            return NULL;
        }
        open_end = end;
    }
    if (!span_insert(&spans, &n_spans, &cap_spans, (span){off, len})) { /* given back as a hole */
        span_insert(&holes, &n_holes, &cap_holes, (span){off, len});
        return NULL;
    }
    if (is_strict() && prot != PROT_NONE) mprotect(arena + off, len, prot);
    return arena + off;
}

static void *iso_alloc(size_t n) {
    size_t len = page_round(n ? n : 1);
    pthread_mutex_lock(&mu);
    int prot = is_strict() && depth == 0 ? PROT_NONE : PROT_READ | PROT_WRITE;
    void *p = arena_take(len, prot);
    if (p) {
        pthread_mutex_unlock(&mu);
        return p;
    }
    region *r = malloc(sizeof *r);
    if (!r) {
        pthread_mutex_unlock(&mu);
        return kiln_error(KILN_ERR_OOM, "cpu-isolated: out of memory"), NULL;
    }
    r->len = len;
    r->p = mmap(NULL, r->len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->p == MAP_FAILED) {
        pthread_mutex_unlock(&mu);
        free(r);
        kiln_error(KILN_ERR_OOM, "cpu-isolated: cannot map %zu bytes", n);
        return NULL;
    }
    r->next = regions;
    regions = r;
    pthread_mutex_unlock(&mu);
    return r->p;
}

/* the pages of every hole and of the stretch above top, released */
static void release_idle(void) {
    for (size_t h = 0; h < n_holes; h++) madvise(arena + holes[h].off, holes[h].len, MADV_DONTNEED);
    if (high > top) madvise(arena + top, high - top, MADV_DONTNEED);
    high = top, idle = 0;
}

/* a freed buffer of the reservation: its stretch a hole (merged with the
 * holes beside it; in strict mode PROT_NONE), its pages kept until IDLE_MAX
 * is passed */
static bool arena_give(void *p) {
    if (!arena || arena == MAP_FAILED || (char *)p < arena || (char *)p >= arena + top) return false;
    size_t off = (size_t)((char *)p - arena), i = 0;
    while (i < n_spans && spans[i].off != off) i++;
    if (i == n_spans) return false;
    span x = spans[i];
    span_remove(spans, &n_spans, i);
    if (is_strict() && depth > 0) mprotect(arena + x.off, x.len, PROT_NONE); /* else closed already */
    if (!span_insert(&holes, &n_holes, &cap_holes, x)) { /* the stretch is lost, nothing else */
        madvise(arena + x.off, x.len, MADV_DONTNEED);
        return true;
    }
    for (size_t h = 0; h + 1 < n_holes;) { /* coalesce */
        if (holes[h].off + holes[h].len == holes[h + 1].off) {
            holes[h].len += holes[h + 1].len;
            span_remove(holes, &n_holes, h + 1);
        } else {
            h++;
        }
    }
    if (n_holes && holes[n_holes - 1].off + holes[n_holes - 1].len == top) /* the top hole goes back */
        top = holes[--n_holes].off;
    idle += x.len;
    if (idle > IDLE_MAX) release_idle();
    return true;
}

static void iso_free(void *p, size_t n) {
    (void)n;
    pthread_mutex_lock(&mu);
    if (!arena_give(p))
        for (region **q = &regions; *q; q = &(*q)->next) {
            if ((*q)->p != p) continue;
            region *r = *q;
            *q = r->next;
            munmap(r->p, r->len);
            free(r);
            break;
        }
    pthread_mutex_unlock(&mu);
}

static void iso_move(void *dst, const void *src, size_t n) {
    enter();
    if (n) memcpy(dst, src, n);
    leave();
}

static void iso_zero(void *dst, size_t n) {
    enter();
    if (n) memset(dst, 0, n);
    leave();
}

static const kiln_buffer_type isolated_buft = {
    .name = "cpu-isolated", .alignment = 4096, .host_mappable = false, .alloc = iso_alloc, .free = iso_free,
    .write = iso_move, .read = iso_move, .copy = iso_move, .zero = iso_zero,
};

static kiln_status iso_exec(kiln_status (*fn)(void *), void *ctx) {
    enter();
    kiln_status st = fn(ctx);
    leave();
    return st;
}

static void sync_none(void) {}
static bool supports_all(int op, const kiln_meta *in, int n_in) {
    (void)in, (void)n_in;
    return op >= 0 && op < KILN_OP_COUNT && kiln_cpu_kernels[op];
}

const kiln_backend kiln_backend_cpu_isolated = {
    .name = "cpu-isolated",
    .description = "the CPU's kernels on memory the host cannot map (protected outside its calls in strict builds)",
    .caps = KILN_BACKEND_COMPILE | KILN_BACKEND_BF16 | KILN_BACKEND_MPI,
    .buft = &isolated_buft,
    .kernels = kiln_cpu_kernels,
    .supports_op = supports_all,
    .exec = iso_exec,
    .synchronize = sync_none,
    .bf16_emulated = kiln_cpu_bf16_emulated,
    .renderer = &kiln_cpu_renderer, /* the same generated C, run inside exec */
    .compiler = &kiln_cpu_compiler,
};
