/* kiln build: turns generated C source into a loaded shared object, cached on
 * disk, plus the SHA-256 the cache is keyed and checked with.
 *
 * The cache (a directory owned by the user, mode 0700) holds per key:
 *   <key>.so      the module
 *   <key>.sha256  SHA-256 of the .so's bytes; an entry is never dlopened
 *                 unless its bytes match (corrupt entries are deleted, rebuilt),
 *                 and what is dlopened is the open file that was hashed
 *   <key>.c       the parts, concatenated with the commands that built them
 *                 (for reading and --explain; the parts compile separately)
 * The key is the SHA-256 of the parts, the compiler's resolved path and its
 * `--version` output, the flags, the device's compiler and target when given
 * (kiln_build_options.target), the CPU's feature flags and KILN_VERSION.
 * A cache directory that cannot be created or written, or that is not owned
 * by the user or is group/world-writable, is not used: kiln warns and builds
 * in a private temporary directory instead (removed by kiln_module_free).
 *
 * Compilers run as argv arrays (flags split on blanks), never via a shell.
 * Modules must not resolve kiln symbols (kiln is linked statically): pass
 * function pointers to them at run time.
 *
 * Ownership: kiln_module_build hands the caller a module; free it with
 * kiln_module_free. Errors: a kiln_status plus kiln_last_error() text naming
 * the file or command and the reason (for a compile error, the first lines of
 * the compiler's message).
 */
#ifndef KILN_BUILD_H
#define KILN_BUILD_H

#include "kiln/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_build_options {
    const char *cc;        /* NULL: $KILN_CC, else "cc" */
    const char *cflags;    /* NULL: $KILN_CFLAGS, else KILN_DEFAULT_CFLAGS */
    const char *cache_dir; /* NULL: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln */
    int jobs;              /* parallel compiler processes (0: number of cores) */
    /* Called after an entry's SHA-256 matched and before it is loaded, with
     * the .so's path (tests swap the file there: what is loaded is the file
     * that was hashed, opened once, dlopen()ed as /proc/self/fd/N). */
    void (*checked_hook)(const char *so_path, void *user);
    void *hook_user;
    /* The device's compiler and target ("cc/host": kiln_compiler_desc's name
     * and target, set by kiln_compile from the parameters' backend), hashed
     * into the key when not NULL; passes no flag to the compiler. */
    const char *target;
} kiln_build_options;

/* -ffp-contract=off: no a*b+c fused on the compiler's own initiative, as in
 * kiln itself (-std=c11), so generated code rounds as the kernels do. */
#define KILN_DEFAULT_CFLAGS "-O3 -march=native -fopenmp -fPIC -ffp-contract=off"

typedef struct kiln_module kiln_module;

typedef struct kiln_build_info {
    bool from_cache;    /* loaded without compiling */
    double seconds;     /* whole call: key, compile (if any), load */
    char key[65];       /* hex SHA-256 cache key */
    char path[1024];    /* the .so that was loaded */
    char src_path[1024]; /* the concatenated source (<key>.c) */
    bool private_tmp;   /* the cache was unusable: built in a private temp dir */
} kiln_build_info;

/* Builds the parts (each one translation unit) into one shared object, or
 * loads it from the cache, and dlopens it. `o` and `info` may be NULL. */
kiln_status kiln_module_build(const char *const *parts, int n_parts, const kiln_build_options *o,
                              kiln_module **out, kiln_build_info *info);
/* The address of a symbol of the module; NULL + error if missing. */
void *kiln_module_sym(const kiln_module *m, const char *name);
/* dlclose, and removes the private temp dir if one was used. NULL ok. */
void kiln_module_free(kiln_module *m);
/* Is the C compiler usable? Runs `cc --version` once per compiler and caches
 * the answer; *version (may be NULL) gets its first line (valid for the life
 * of the process) or, when unusable, the reason. */
bool kiln_compiler_available(const kiln_build_options *o, const char **version);

/* ---- SHA-256 (FIPS 180-4) --------------------------------------------- */
typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t nbuf;
} kiln_sha256_ctx;
void kiln_sha256_init(kiln_sha256_ctx *c);
void kiln_sha256_update(kiln_sha256_ctx *c, const void *data, size_t n);
void kiln_sha256_final(kiln_sha256_ctx *c, uint8_t out[32]);
void kiln_sha256_hex_digest(const uint8_t digest[32], char hex[65]);
void kiln_sha256_hex(const void *data, size_t n, char hex[65]); /* one shot, lowercase hex */
bool kiln_sha256_fd(int fd, char hex[65]); /* the rest of an open file; false on a read error */

#ifdef __cplusplus
}
#endif
#endif
