/* Whole-file reads and atomic writes (temp file, fsync, rename, dir fsync). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <omp.h>
#include "kiln/core.h"

kiln_status kiln_read_file(const char *path, char **data, size_t *n) {
    *data = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_error(KILN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return kiln_error(KILN_ERR_IO, "%s is not a regular file", path);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(f);
        return kiln_error(KILN_ERR_OOM, "out of memory reading %s (%lld bytes)", path, (long long)st.st_size);
    }
    size_t got = fread(buf, 1, (size_t)st.st_size, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != (size_t)st.st_size) {
        free(buf);
        return kiln_error(KILN_ERR_IO, "short read of %s: %zu of %lld bytes", path, got, (long long)st.st_size);
    }
    buf[got] = 0;
    *data = buf;
    *n = got;
    return KILN_OK;
}

static kiln_status fsync_dir_of(const char *path) {
    char *copy = strdup(path);
    if (!copy) return kiln_error(KILN_ERR_OOM, "out of memory");
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    free(copy);
    if (fd < 0) return KILN_OK; /* best effort: some filesystems refuse */
    fsync(fd);
    close(fd);
    return KILN_OK;
}

kiln_status kiln_write_file_atomic(const char *path, const void *data, size_t n) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return kiln_error(KILN_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            close(fd);
            unlink(tmp);
            return kiln_error(KILN_ERR_IO, "writing %s failed after %zu of %zu bytes: %s", path, n - left, n,
                              strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return kiln_error(KILN_ERR_IO, "flushing %s failed: %s", path, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return kiln_error(KILN_ERR_IO, "renaming %s to %s failed: %s", tmp, path, strerror(e));
    }
    return fsync_dir_of(path);
}

int kiln_num_threads(void) { return omp_get_max_threads(); }
void kiln_set_num_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
}
double kiln_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

kiln_status kiln_copy_file_atomic(const char *src, const char *dst) {
    char *data = NULL;
    size_t n = 0;
    kiln_status st = kiln_read_file(src, &data, &n);
    if (!st) st = kiln_write_file_atomic(dst, data, n);
    free(data);
    return st;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

kiln_status kiln_remove_tree(const char *path) {
    struct stat s;
    if (lstat(path, &s) != 0) return KILN_OK;
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return kiln_error(KILN_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return KILN_OK;
}

bool kiln_cache_dir(char *out, size_t n) {
    const char *d = getenv("KILN_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int w = d && *d ? snprintf(out, n, "%s", d)
            : x && *x ? snprintf(out, n, "%s/kiln", x)
            : h && *h ? snprintf(out, n, "%s/.cache/kiln", h)
                      : -1;
    if (w < 0 || (size_t)w >= n) {
        if (n) out[0] = '\0';
        return false;
    }
    return true;
}

kiln_status kiln_fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return kiln_error(KILN_ERR_IO, "cannot open directory %s: %s", path, strerror(errno));
    int rc = fsync(fd), e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) return kiln_error(KILN_ERR_IO, "cannot sync directory %s: %s", path, strerror(e));
    return KILN_OK;
}

kiln_status kiln_map_file(const char *path, size_t min_size, const char *what, const void **data, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_error(KILN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return kiln_error(KILN_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kiln_error(KILN_ERR_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)sb.st_size < min_size) {
        close(fd);
        return kiln_error(KILN_ERR_FORMAT, "%s: file is %lld bytes, too short for %s", path, (long long)sb.st_size, what);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return kiln_error(KILN_ERR_IO, "cannot map %s: %s", path, strerror(e));
    *data = m;
    *size = (size_t)sb.st_size;
    return KILN_OK;
}
