/* A tiny test harness: each CHECK counts; main ends with TEST_END() which
 * prints "N passed, N failed" and returns non-zero on any failure. */
#ifndef KILN_TEST_H
#define KILN_TEST_H
#include <ftw.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kiln/core.h"

/* SANITIZED: an ASan build (gcc's macro or clang's feature), where a test
 * may run a smaller size of what the optimised build runs in full */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif

static int t_pass, t_fail;
#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            t_pass++;                                                      \
        } else {                                                           \
            t_fail++;                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)
#define CHECK_OK(expr)                                                     \
    do {                                                                   \
        kiln_status st_ = (expr);                                          \
        CHECK(st_ == KILN_OK, "%s -> %d (%s)", #expr, (int)st_, kiln_last_error()); \
    } while (0)
/* relative closeness with an absolute floor */
static inline double t_rel(double a, double b) {
    double d = fabs(a - b), s = fmax(fabs(a), fabs(b));
    return s < 1e-12 ? d : d / s;
}
/* max |a - b| / max |b| (the absolute difference when b is all zero) */
static inline double rel_err(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? d / s : d;
}
/* A new directory /tmp/kiln_NAME_XXXXXX in buf (n bytes); false (printed)
 * when it cannot be made. */
static inline bool t_tmpdir(char *buf, size_t n, const char *name) {
    if ((size_t)snprintf(buf, n, "/tmp/kiln_%s_XXXXXX", name) >= n || !mkdtemp(buf)) {
        perror("mkdtemp");
        return false;
    }
    return true;
}
static inline int t_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}
/* Removes a directory tree (no shell); 0 when it is gone. */
static inline int t_rmtree(const char *dir) {
    return nftw(dir, t_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
#define TEST_END()                                                         \
    do {                                                                   \
        printf("%s: %d passed, %d failed\n", __FILE__, t_pass, t_fail);    \
        return t_fail ? 1 : 0;                                             \
    } while (0)
#endif
