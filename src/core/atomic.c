/* Streaming atomic file writes: a temp file beside the target, filled
 * through a buffer, fsynced, renamed over the target, then the directory
 * fsynced, so a failed or interrupted save leaves the old file intact. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "kiln/core.h"

#define ATOMIC_BUF (1u << 20)

struct kiln_atomic_file {
    char *path, *tmp;
    int fd;
    unsigned char *buf;
    size_t used;
    uint64_t written;
    kiln_status err; /* first failure; sticky */
};

kiln_status kiln_atomic_open(const char *path, kiln_atomic_file **out) {
    *out = NULL;
    kiln_atomic_file *f = calloc(1, sizeof *f);
    size_t len = strlen(path) + 64;
    if (!f || !(f->path = strdup(path)) || !(f->tmp = malloc(len)) || !(f->buf = malloc(ATOMIC_BUF))) {
        kiln_atomic_abort(f);
        return kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    }
    f->fd = -1;
    /* a name unique to this process, thread and moment, created with O_EXCL
     * and retried on the rare collision: no shared counter needed */
    for (int attempt = 0; attempt < 100 && f->fd < 0; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(f->tmp, len, "%s.tmp.%ld.%ld.%ld%d", path, (long)getpid(), (long)gettid(), (long)ts.tv_nsec, attempt);
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (f->fd < 0 && errno != EEXIST) break;
    }
    if (f->fd < 0) {
        kiln_status st = kiln_error(KILN_ERR_IO, "cannot save %s: creating %s: %s", path, f->tmp, strerror(errno));
        free(f->tmp);
        f->tmp = NULL; /* nothing to unlink */
        kiln_atomic_abort(f);
        return st;
    }
    *out = f;
    return KILN_OK;
}

static kiln_status flush_buf(kiln_atomic_file *f) {
    const unsigned char *p = f->buf;
    size_t n = f->used;
    while (n > 0) {
        ssize_t k = write(f->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return f->err = kiln_error(KILN_ERR_IO, "cannot save %s: writing %s after %llu bytes: %s", f->path, f->tmp,
                                       (unsigned long long)(f->written - n), k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
    }
    f->used = 0;
    return KILN_OK;
}

kiln_status kiln_atomic_write(kiln_atomic_file *f, const void *data, size_t n) {
    if (f->err) return f->err;
    const unsigned char *p = data;
    while (n > 0) {
        size_t take = ATOMIC_BUF - f->used < n ? ATOMIC_BUF - f->used : n;
        memcpy(f->buf + f->used, p, take);
        f->used += take, f->written += take, p += take, n -= take;
        if (f->used == ATOMIC_BUF && flush_buf(f)) return f->err;
    }
    return KILN_OK;
}

uint64_t kiln_atomic_tell(const kiln_atomic_file *f) { return f->written; }

void kiln_atomic_abort(kiln_atomic_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    if (f->tmp) unlink(f->tmp);
    free(f->tmp);
    free(f->path);
    free(f->buf);
    free(f);
}

static void fsync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (fd >= 0) {
        fsync(fd); /* best effort: some filesystems refuse directory fsync */
        close(fd);
    }
    free(dir);
}

kiln_status kiln_atomic_commit(kiln_atomic_file *f) {
    kiln_status st = f->err ? f->err : flush_buf(f);
    if (!st && fsync(f->fd) != 0) st = kiln_error(KILN_ERR_IO, "cannot save %s: fsync: %s", f->path, strerror(errno));
    if (!st) {
        int rc = close(f->fd);
        f->fd = -1;
        if (rc != 0) st = kiln_error(KILN_ERR_IO, "cannot save %s: close: %s", f->path, strerror(errno));
    }
    if (!st && rename(f->tmp, f->path) != 0)
        st = kiln_error(KILN_ERR_IO, "cannot save %s: renaming %s: %s", f->path, f->tmp, strerror(errno));
    if (st) {
        kiln_atomic_abort(f);
        return st;
    }
    fsync_parent(f->path);
    free(f->tmp);
    f->tmp = NULL;
    kiln_atomic_abort(f);
    return KILN_OK;
}
