/* A tiny test harness: each CHECK counts; main ends with TEST_END() which
 * prints "N passed, N failed" and returns non-zero on any failure. */
#ifndef KILN_TEST_H
#define KILN_TEST_H
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "kiln/core.h"

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
#define TEST_END()                                                         \
    do {                                                                   \
        printf("%s: %d passed, %d failed\n", __FILE__, t_pass, t_fail);    \
        return t_fail ? 1 : 0;                                             \
    } while (0)
#endif
