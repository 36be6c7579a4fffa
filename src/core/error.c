/* Errors (thread-local message + code) and logging. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kiln/core.h"

/* A sanitizer build whose UBSan reports are recoverable (clang's, see the
 * Makefile) still stops at the first one, as -fno-sanitize-recover=all
 * would: these are the defaults UBSAN_OPTIONS adds to. Every kiln binary
 * links this file (everything reports errors). */
#ifdef KILN_UBSAN_HALT
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) { return "halt_on_error=1:print_stacktrace=1"; }
#endif

static _Thread_local char err_msg[1024];
static _Thread_local kiln_status err_code;

/* The message is formatted into a local buffer first: an argument may be
 * kiln_last_error() itself (the message so far), and vsnprintf into the
 * buffer it reads from is undefined. kiln_error_context is the intended way
 * to add context; this keeps a stray aliasing call defined too. */
kiln_status kiln_error(kiln_status code, const char *fmt, ...) {
    char msg[sizeof err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(err_msg, msg, sizeof msg);
    err_code = code;
    return code;
}

kiln_status kiln_error_context(kiln_status code, const char *fmt, ...) {
    char prefix[512], old[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, sizeof old);
    size_t lp = strlen(prefix), lo = strnlen(old, sizeof old - 1);
    if (lp > sizeof err_msg - 3) lp = sizeof err_msg - 3;
    memcpy(err_msg, prefix, lp);
    memcpy(err_msg + lp, ": ", 2);
    size_t room = sizeof err_msg - lp - 3;
    if (lo > room) lo = room;
    memcpy(err_msg + lp + 2, old, lo);
    err_msg[lp + 2 + lo] = 0;
    err_code = code;
    return code;
}

const char *kiln_last_error(void) { return err_msg[0] ? err_msg : "no error"; }
kiln_status kiln_last_status(void) { return err_code; }
void kiln_clear_error(void) {
    err_msg[0] = 0;
    err_code = KILN_OK;
}

/* Logging is one of the two allowed globals (with the op registry). */
static kiln_log_fn log_fn;
static void *log_user;
static kiln_log_level log_min = KILN_LOG_INFO;

void kiln_log_set_handler(kiln_log_fn fn, void *user) {
    log_fn = fn;
    log_user = user;
}
void kiln_log_set_level(kiln_log_level min_level) { log_min = min_level; }

void kiln_log(kiln_log_level level, const char *fmt, ...) {
    if (level < log_min) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_fn) {
        log_fn(level, msg, log_user);
        return;
    }
    static const char *tag[] = {"debug", "info", "warning", "error"};
    if (level == KILN_LOG_INFO)
        fprintf(stderr, "%s\n", msg);
    else
        fprintf(stderr, "kiln: %s: %s\n", tag[level], msg);
}

void kiln_strbuf_printf(kiln_strbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 8192;
        while (cap <= b->n + (size_t)k) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
}
