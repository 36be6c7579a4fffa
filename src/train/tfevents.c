/* TensorBoard event files, written by hand: TFRecord framing (u64 length,
 * masked CRC-32C of the length, data, masked CRC-32C of the data; all
 * little-endian) around protobuf wire-format tensorflow.Event messages:
 *   Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
 *                Summary summary = 5; SessionLog session_log = 7; }
 *   Summary    { repeated Value value = 1; }
 *   Value      { string tag = 1; float simple_value = 2; }
 *   SessionLog { SessionStatus status = 1; }  (START = 1)
 * tests/test_tfevents.c reads the files back with Python's protobuf. */
#include "tfevents.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct kiln_tfevents {
    int fd;
    char path[1200];
};

/* ---- CRC-32C: reflected Castagnoli polynomial, a table per byte ---- */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[i] = c;
    }
}

uint32_t kiln_crc32c(const void *p, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const unsigned char *b = p;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ b[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* ---- protobuf wire format into a growable buffer ---- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
    bool oom;
} pb_buf;

static void pb_put(pb_buf *b, const void *s, size_t n) {
    if (b->oom || !n) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void pb_varint(pb_buf *b, uint64_t v) {
    unsigned char t[10];
    size_t k = 0;
    do {
        t[k] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v) t[k] |= 0x80;
        k++;
    } while (v);
    pb_put(b, t, k);
}

static void pb_le(pb_buf *b, uint64_t v, int bytes) {
    unsigned char t[8];
    for (int i = 0; i < bytes; i++) t[i] = (unsigned char)(v >> (8 * i));
    pb_put(b, t, (size_t)bytes);
}

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };
static void pb_key(pb_buf *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_bytes(pb_buf *b, int field, const void *s, size_t n) {
    pb_key(b, field, WT_LEN);
    pb_varint(b, n);
    pb_put(b, s, n);
}

static void pb_double(pb_buf *b, int field, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    pb_key(b, field, WT_I64);
    pb_le(b, u, 8);
}

static void pb_float(pb_buf *b, int field, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    pb_key(b, field, WT_I32);
    pb_le(b, u, 4);
}

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Event{wall_time, step} then the caller's fields */
static void event_head(pb_buf *b, int64_t step) {
    pb_double(b, 1, wall_time());
    if (step) {
        pb_key(b, 2, WT_VARINT);
        pb_varint(b, (uint64_t)step);
    }
}

/* one TFRecord in one write */
static kiln_status write_record(kiln_tfevents *w, const pb_buf *ev) {
    if (ev->oom) return kiln_error(KILN_ERR_OOM, "%s: out of memory", w->path);
    pb_buf r = {0};
    pb_le(&r, ev->n, 8);
    uint32_t lc = kiln_crc32c_mask(kiln_crc32c(r.p, 8));
    pb_le(&r, lc, 4);
    pb_put(&r, ev->p, ev->n);
    pb_le(&r, kiln_crc32c_mask(kiln_crc32c(ev->p, ev->n)), 4);
    if (r.oom) {
        free(r.p);
        return kiln_error(KILN_ERR_OOM, "%s: out of memory", w->path);
    }
    size_t o = 0;
    while (o < r.n) {
        ssize_t k = write(w->fd, r.p + o, r.n - o);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            free(r.p);
            return kiln_error(KILN_ERR_IO, "cannot write %s: %s", w->path, strerror(e));
        }
        o += (size_t)k;
    }
    free(r.p);
    return KILN_OK;
}

kiln_status kiln_tfevents_open(const char *dir, int64_t first_step, kiln_tfevents **out) {
    *out = NULL;
    kiln_tfevents *w = calloc(1, sizeof *w);
    if (!w) return kiln_error(KILN_ERR_OOM, "out of memory");
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) || !host[0]) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    /* TensorBoard reads a directory's files in name order, so the time in the
     * name is taken past the newest events file's there (a process resumed
     * within the second of the last one; the wall times inside stay true). */
    long now = (long)time(NULL);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        static const char pre[] = "events.out.tfevents.";
        if (strncmp(e->d_name, pre, sizeof pre - 1)) continue;
        char *end;
        long t = strtol(e->d_name + sizeof pre - 1, &end, 10);
        if (end != e->d_name + sizeof pre - 1 && t >= now && t < now + 1000000) now = t + 1;
    }
    if (d) closedir(d);
    w->fd = -1;
    for (int seq = 0; w->fd < 0 && seq < 1000; seq++) {
        if (seq) snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%ld.%s.%ld.%d.kiln", dir, now, host,
                          (long)getpid(), seq);
        else snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%ld.%s.%ld.kiln", dir, now, host, (long)getpid());
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (w->fd < 0 && errno != EEXIST) {
            kiln_status st = kiln_error(KILN_ERR_IO, "cannot create %s: %s", w->path, strerror(errno));
            free(w);
            return st;
        }
    }
    if (w->fd < 0) {
        kiln_status st = kiln_error(KILN_ERR_IO, "cannot create %s: the names are taken", w->path);
        free(w);
        return st;
    }
    pb_buf b = {0};
    event_head(&b, 0);
    pb_bytes(&b, 3, "brain.Event:2", 13);
    kiln_status st = write_record(w, &b);
    if (!st) {
        b.n = 0;
        pb_buf sl = {0};
        pb_key(&sl, 1, WT_VARINT);
        pb_varint(&sl, 1); /* SessionLog.START */
        event_head(&b, first_step);
        pb_bytes(&b, 7, sl.p, sl.n);
        b.oom |= sl.oom;
        free(sl.p);
        st = write_record(w, &b);
    }
    free(b.p);
    if (st) {
        kiln_tfevents_close(w);
        return st;
    }
    *out = w;
    return KILN_OK;
}

kiln_status kiln_tfevents_scalars(kiln_tfevents *w, int64_t step, const char *const *tags, const double *values, int n) {
    pb_buf sum = {0}, val = {0}, ev = {0};
    for (int i = 0; i < n; i++) {
        val.n = 0;
        pb_bytes(&val, 1, tags[i], strlen(tags[i]));
        double v = values[i]; /* beyond float's range: an infinity, not undefined behaviour */
        pb_float(&val, 2, fabs(v) > FLT_MAX && isfinite(v) ? (v > 0 ? INFINITY : -INFINITY) : (float)v);
        sum.oom |= val.oom;
        pb_bytes(&sum, 1, val.p, val.n);
    }
    event_head(&ev, step);
    ev.oom |= sum.oom;
    pb_bytes(&ev, 5, sum.p, sum.n);
    kiln_status st = write_record(w, &ev);
    free(sum.p);
    free(val.p);
    free(ev.p);
    return st;
}

const char *kiln_tfevents_path(const kiln_tfevents *w) { return w->path; }

void kiln_tfevents_close(kiln_tfevents *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    free(w);
}
