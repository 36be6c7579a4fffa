/* Building generated C into a shared object, with an on-disk cache.
 *
 * Cache protocol: entries are published into the cache directory by rename()
 * from a build directory beside them (same filesystem), so no reader ever sees
 * a partial file. The pair <key>.so / <key>.sha256 is published, checked and
 * loaded under an exclusive flock() on <dir>/lock, so a reader never pairs
 * one run's .so with another run's hash; compiling happens outside the lock,
 * so concurrent runs may both build, and the last rename wins. Nothing is
 * fsync'd: after a crash the hash check catches a torn entry and rebuilds it.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kiln/build.h"
#include "loaded.h"

#define PATHN 1024

struct kiln_module {
    void *handle;
    kiln_loaded *file;
    char path[PATHN];
    char private_dir[PATHN]; /* removed at free; empty when loaded from the cache */
};

typedef struct {
    const char *cc;     /* as given (argv[0]) */
    const char *cflags;
    const char *target; /* the device's compiler and target, or NULL */
    char dir[PATHN];    /* cache directory */
    int jobs;
} resolved_opts;

typedef struct {
    bool ok;
    char cc[PATHN];       /* the name it was asked for */
    char exe[PATHN];      /* found on PATH, symlinks kept (ccache looks at argv[0]) */
    char real[PATHN];     /* symlinks resolved: part of the key */
    char version[2048];   /* full --version output: part of the key */
    char first[256];      /* its first line, or why the compiler is unusable */
} cc_info;

/* ---- small helpers ------------------------------------------------------ */

/* snprintf that says whether it fitted. Messages may be cut short; paths are
 * checked where a cut would matter. (A function, so gcc's truncation
 * warnings, which cannot see those checks, stay quiet.) */
static bool __attribute__((format(printf, 3, 4))) sfmt(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return r >= 0 && (size_t)r < n;
}

static bool fmt_path(char out[PATHN], const char *fmt, const char *a, const char *b) {
    return sfmt(out, PATHN, fmt, a, b);
}

static const char *env_or(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static bool mode_safe(const struct stat *st) {
    return st->st_uid == geteuid() && (st->st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

static void describe_status(int st, char *buf, size_t n) {
    if (WIFEXITED(st)) sfmt(buf, n, "exit status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) sfmt(buf, n, "killed by signal %d", WTERMSIG(st));
    else sfmt(buf, n, "wait status %d", st);
}

/* A new file only we can read and write (NULL + error). */
static FILE *create_new(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        kiln_error(KILN_ERR_IO, "cannot create %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
    }
    return f;
}

static kiln_status finish_file(FILE *f, bool ok, const char *path) {
    if (fclose(f) != 0 || !ok) return kiln_error(KILN_ERR_IO, "writing %s failed: %s", path, strerror(errno));
    return KILN_OK;
}

static kiln_status write_new_file(const char *path, const char *text) {
    FILE *f = create_new(path);
    return f ? finish_file(f, fputs(text, f) >= 0, path) : kiln_last_status();
}

/* Removes a flat directory this file created (build and private dirs). */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[PATHN];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if (fmt_path(p, "%s/%s", dir, e->d_name)) unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* The first lines of a compiler log, for an error message. */
static void log_excerpt(const char *path, char *out, size_t n) {
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t len = fread(out, 1, n - 1, f);
    fclose(f);
    out[len] = '\0';
    int lines = 0;
    for (char *p = out; *p; p++)
        if (*p == '\n' && ++lines == 12) { *p = '\0'; break; }
    len = strlen(out);
    while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == ' ')) out[--len] = '\0';
    if (len == 0) sfmt(out, n, "(the compiler printed nothing)");
}

/* ---- argv arrays: the command and the flags split on blanks, no shell --- */

typedef struct {
    char *buf; /* the flags, split in place */
    char **argv;
    int argc, cap;
} argvec;

static void argv_free(argvec *a);

static bool argv_make(argvec *a, const char *cmd0, const char *flags, int extra) {
    a->buf = strdup(flags ? flags : "");
    int words = 0;
    for (const char *p = flags ? flags : ""; *p;) {
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        words++;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n') p++;
    }
    a->cap = 1 + words + extra + 1;
    a->argv = calloc((size_t)a->cap, sizeof *a->argv);
    a->argc = 0;
    if (!a->buf || !a->argv) {
        argv_free(a);
        kiln_error(KILN_ERR_OOM, "out of memory building a compiler command line");
        return false;
    }
    a->argv[a->argc++] = (char *)cmd0;
    char *save = NULL;
    for (char *w = strtok_r(a->buf, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) a->argv[a->argc++] = w;
    return true;
}

static void argv_push(argvec *a, const char *s) {
    if (a->argc < a->cap - 1) a->argv[a->argc++] = (char *)s;
}

static void argv_free(argvec *a) {
    free(a->buf);
    free(a->argv);
    a->buf = NULL, a->argv = NULL;
}

static bool argv_has(const argvec *a, const char *s) {
    for (int i = 1; i < a->argc; i++)
        if (!strcmp(a->argv[i], s)) return true;
    return false;
}

static void argv_join(const argvec *a, char *out, size_t n) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < a->argc && used + 1 < n; i++) {
        sfmt(out + used, n - used, "%s%s", i ? " " : "", a->argv[i]);
        used += strlen(out + used);
    }
}

/* ---- processes ----------------------------------------------------------- */

/* Starts exe with argv in cwd (NULL: ours), stdout to out_fd and stderr to
 * err_fd (-1: /dev/null), stdin from /dev/null. */
static kiln_status spawn(const char *exe, char *const argv[], const char *cwd, int out_fd, int err_fd, pid_t *pid) {
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0) return kiln_error(KILN_ERR_OOM, "posix_spawn_file_actions_init failed");
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (out_fd >= 0) posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    else posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (err_fd >= 0) posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
    else posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    if (cwd) posix_spawn_file_actions_addchdir_np(&fa, cwd);
    int rc = posix_spawn(pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return kiln_error(KILN_ERR_IO, "cannot run %s: %s", exe, strerror(rc));
    return KILN_OK;
}

static int wait_pid(pid_t pid) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return st;
}

/* Waits for any of our children in pids[] (0 = free slot), without reaping
 * children that other parts of the program may own. Returns its index. */
static int wait_any(pid_t *pids, int n, int *status) {
    for (;;) {
        for (int i = 0; i < n; i++) {
            if (pids[i] <= 0) continue;
            pid_t r = waitpid(pids[i], status, WNOHANG);
            if (r == pids[i] || (r < 0 && errno == ECHILD)) {
                if (r < 0) *status = -1;
                pids[i] = 0;
                return i;
            }
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

/* ---- the compiler -------------------------------------------------------- */

static bool find_exe(const char *name, char exe[PATHN]) {
    if (strchr(name, '/')) {
        if (access(name, X_OK) != 0) return false;
        return sfmt(exe, PATHN, "%s", name);
    }
    const char *path = env_or("PATH", "/usr/local/bin:/usr/bin:/bin");
    while (*path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        char cand[PATHN];
        struct stat st;
        if (sfmt(cand, sizeof cand, "%.*s/%s", (int)len, len ? path : ".", name) &&
            access(cand, X_OK) == 0 && stat(cand, &st) == 0 && S_ISREG(st.st_mode)) {
            memcpy(exe, cand, PATHN);
            return true;
        }
        if (!end) break;
        path = end + 1;
    }
    return false;
}

static void probe_compiler(cc_info *ci, const char *cc) {
    memset(ci, 0, sizeof *ci);
    sfmt(ci->cc, sizeof ci->cc, "%s", cc);
    if (!find_exe(cc, ci->exe)) {
        sfmt(ci->first, sizeof ci->first, "%s: %s", cc,
                 strchr(cc, '/') ? "no such executable" : "not found on PATH");
        return;
    }
    char real[PATH_MAX];
    sfmt(ci->real, sizeof ci->real, "%s", realpath(ci->exe, real) ? real : ci->exe);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        sfmt(ci->first, sizeof ci->first, "pipe: %s", strerror(errno));
        return;
    }
    char *argv[] = {(char *)cc, (char *)"--version", NULL};
    pid_t pid;
    kiln_status st = spawn(ci->exe, argv, NULL, fds[1], -1, &pid);
    close(fds[1]);
    if (st != KILN_OK) {
        close(fds[0]);
        sfmt(ci->first, sizeof ci->first, "%s", kiln_last_error());
        kiln_clear_error();
        return;
    }
    size_t len = 0;
    char sink[512];
    for (;;) { /* keep draining after the buffer fills so the child never blocks */
        bool room = len < sizeof ci->version - 1;
        ssize_t r = room ? read(fds[0], ci->version + len, sizeof ci->version - 1 - len) : read(fds[0], sink, sizeof sink);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (room) len += (size_t)r;
    }
    close(fds[0]);
    ci->version[len] = '\0';
    int ws = wait_pid(pid);
    if (ws == -1 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0 || len == 0) {
        char why[64];
        describe_status(ws, why, sizeof why);
        sfmt(ci->first, sizeof ci->first, "`%s --version` failed (%s)", ci->exe, len ? why : "no output");
        return;
    }
    size_t fl = strcspn(ci->version, "\n");
    sfmt(ci->first, sizeof ci->first, "%.*s", (int)fl, ci->version);
    ci->ok = true;
}

/* The answers, per compiler name, for the life of the process. */
#define CC_SLOTS 16
static cc_info cc_cache[CC_SLOTS];
static int cc_count;
static pthread_mutex_t cc_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local cc_info cc_overflow;

static const cc_info *compiler_info(const char *cc) {
    pthread_mutex_lock(&cc_mu);
    for (int i = 0; i < cc_count; i++)
        if (!strcmp(cc_cache[i].cc, cc)) {
            pthread_mutex_unlock(&cc_mu);
            return &cc_cache[i];
        }
    cc_info *ci = cc_count < CC_SLOTS ? &cc_cache[cc_count] : &cc_overflow;
    probe_compiler(ci, cc);
    if (ci != &cc_overflow) cc_count++;
    pthread_mutex_unlock(&cc_mu);
    return ci;
}

static void resolve_options(const kiln_build_options *o, resolved_opts *r) {
    r->cc = o && o->cc ? o->cc : env_or("KILN_CC", "cc");
    r->cflags = o && o->cflags ? o->cflags : env_or("KILN_CFLAGS", KILN_DEFAULT_CFLAGS);
    r->target = o ? o->target : NULL;
    r->dir[0] = '\0';
    if (o && o->cache_dir && *o->cache_dir) sfmt(r->dir, PATHN, "%s", o->cache_dir);
    else kiln_cache_dir(r->dir, PATHN);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    r->jobs = o && o->jobs > 0 ? o->jobs : cores > 0 ? (int)cores : 1;
}

bool kiln_compiler_available(const kiln_build_options *o, const char **version) {
    resolved_opts r;
    resolve_options(o, &r);
    const cc_info *ci = compiler_info(r.cc);
    if (version) *version = ci->first;
    return ci->ok;
}

/* ---- the key ------------------------------------------------------------- */

static void hash_field(kiln_sha256_ctx *c, const char *tag, const void *p, size_t n) {
    uint64_t len = n; /* length-prefixed, so fields cannot run into each other */
    kiln_sha256_update(c, tag, strlen(tag) + 1);
    kiln_sha256_update(c, &len, sizeof len);
    kiln_sha256_update(c, p, n);
}

/* -march=native makes the code depend on the CPU: its feature flags. */
static void hash_cpu(kiln_sha256_ctx *c) {
    struct utsname u;
    if (uname(&u) == 0) hash_field(c, "machine", u.machine, strlen(u.machine));
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        if (strncmp(line, "flags", 5) && strncmp(line, "Features", 8)) continue;
        const char *colon = strchr(line, ':');
        if (colon) hash_field(c, "cpu", colon + 1, strlen(colon + 1));
        break;
    }
    free(line);
    fclose(f);
}

static void compute_key(const char *const *parts, int n, const resolved_opts *r, const cc_info *ci, char key[65]) {
    kiln_sha256_ctx c;
    uint8_t dg[32];
    kiln_sha256_init(&c);
    hash_field(&c, "kiln", KILN_VERSION, strlen(KILN_VERSION));
    hash_field(&c, "cc", ci->real, strlen(ci->real));
    hash_field(&c, "cc-version", ci->version, strlen(ci->version));
    hash_field(&c, "cflags", r->cflags, strlen(r->cflags));
    if (r->target) hash_field(&c, "target", r->target, strlen(r->target));
    hash_cpu(&c);
    for (int i = 0; i < n; i++) hash_field(&c, "part", parts[i], strlen(parts[i]));
    kiln_sha256_final(&c, dg);
    kiln_sha256_hex_digest(dg, key);
}

/* ---- the cache directory ------------------------------------------------- */

static bool mkdir_p(const char *dir, char *why, size_t n) {
    char buf[PATHN];
    sfmt(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        struct stat st;
        if (mkdir(buf, 0700) != 0 && errno != EEXIST && !(stat(buf, &st) == 0 && S_ISDIR(st.st_mode))) {
            sfmt(why, n, "cannot create %s: %s", buf, strerror(errno));
            return false;
        }
        *p = saved;
        if (!saved) return true;
    }
}

/* Creates the directory if needed and checks it may hold code we will run. */
static bool cache_dir_usable(const char *dir, char *why, size_t n) {
    if (!dir[0]) return sfmt(why, n, "no cache directory ($HOME is not set)"), false;
    if (strlen(dir) > PATHN - 100) return sfmt(why, n, "path too long"), false;
    if (!mkdir_p(dir, why, n)) return false;
    struct stat st;
    if (stat(dir, &st) != 0) return sfmt(why, n, "cannot stat it: %s", strerror(errno)), false;
    if (!S_ISDIR(st.st_mode)) return sfmt(why, n, "not a directory"), false;
    if (st.st_uid != geteuid())
        return sfmt(why, n, "owned by uid %u, not by us (uid %u)", (unsigned)st.st_uid, (unsigned)geteuid()), false;
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return sfmt(why, n, "group/world-writable (mode %03o)", (unsigned)(st.st_mode & 0777)), false;
    return true;
}

static int lock_cache(const char *dir, char *why, size_t n) {
    char p[PATHN];
    fmt_path(p, "%s/%s", dir, "lock");
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    struct stat st;
    if (fd < 0) return sfmt(why, n, "cannot open %s: %s", p, strerror(errno)), -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !mode_safe(&st)) {
        close(fd);
        return sfmt(why, n, "%s is not a regular file of ours that only we can write", p), -1;
    }
    int rc;
    while ((rc = flock(fd, LOCK_EX)) != 0 && errno == EINTR) {}
    if (rc != 0) sfmt(why, n, "cannot lock %s: %s", p, strerror(errno)), close(fd), fd = -1;
    return fd;
}

static kiln_status make_private_dir(char out[PATHN]) {
    const char *tmp = env_or("TMPDIR", "/tmp");
    for (int attempt = 0; attempt < 2; attempt++, tmp = "/tmp")
        if (fmt_path(out, "%s/%s", tmp, "kiln-XXXXXX") && mkdtemp(out)) return KILN_OK;
    return kiln_error(KILN_ERR_IO, "cannot create a private build directory under %s or /tmp: %s",
                      env_or("TMPDIR", "/tmp"), strerror(errno));
}

/* ---- cache entries ------------------------------------------------------- */

typedef enum { ENTRY_MISSING, ENTRY_OK, ENTRY_CORRUPT, ENTRY_UNSAFE } entry_state;

/* Opens a file of the cache: a regular file (no symlink), ours, not writable
 * by others. Returns the fd, or -1 with *state set. */
static int open_entry_file(const char *path, entry_state *state, char *why, size_t n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0) {
        *state = errno == ENOENT ? ENTRY_MISSING : ENTRY_UNSAFE;
        sfmt(why, n, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !mode_safe(&st)) {
        close(fd);
        *state = ENTRY_UNSAFE;
        sfmt(why, n, "%s is not a regular file owned by us and writable only by us", path);
        return -1;
    }
    return fd;
}

static bool hash_file(const char *path, char hex[65]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = kiln_sha256_fd(fd, hex);
    close(fd);
    return ok;
}

/* Checks the .so against its .sha256. On ENTRY_OK *so_fd is the open file
 * whose bytes were hashed: the module is loaded from that very file, so
 * nothing swapped in at the path after the check can be loaded instead. */
static entry_state check_entry(const char *so, const char *sha, int *so_fd, char *why, size_t n) {
    entry_state state;
    char have[65], want[80] = {0};
    *so_fd = -1;
    int fd = open_entry_file(so, &state, why, n);
    if (fd < 0) return state;
    if (!kiln_sha256_fd(fd, have)) return close(fd), sfmt(why, n, "cannot read %s", so), ENTRY_CORRUPT;
    int sfd = open_entry_file(sha, &state, why, n);
    if (sfd < 0) {
        close(fd);
        if (state == ENTRY_MISSING) sfmt(why, n, "%s is missing", sha);
        return state == ENTRY_MISSING ? ENTRY_CORRUPT : state;
    }
    ssize_t r = read(sfd, want, sizeof want - 1);
    close(sfd);
    if (r < 64 || strspn(want, "0123456789abcdef") != 64 || (r > 64 && want[64] != '\n'))
        return close(fd), sfmt(why, n, "%s does not hold a SHA-256", sha), ENTRY_CORRUPT;
    want[64] = '\0';
    if (strcmp(want, have) != 0)
        return close(fd), sfmt(why, n, "SHA-256 of %s is %.12s..., recorded %.12s...", so, have, want), ENTRY_CORRUPT;
    *so_fd = fd;
    return ENTRY_OK;
}

/* Loads the checked, open file fd (taking it over); `path` is for messages. */
static kiln_status load(int fd, const char *path, const char *private_dir, kiln_module **out) {
    kiln_module *m = calloc(1, sizeof *m);
    if (!m) {
        close(fd);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    if (!(m->file = kiln_loaded_open(fd, path))) {
        free(m);
        return kiln_last_status();
    }
    m->handle = kiln_loaded_handle(m->file);
    sfmt(m->path, sizeof m->path, "%s", path);
    if (private_dir) sfmt(m->private_dir, sizeof m->private_dir, "%s", private_dir);
    *out = m;
    return KILN_OK;
}

/* Checks the pair <base>.so / <base>.sha256 and loads the checked file. */
static kiln_status check_and_load(const char *so, const char *sha, const kiln_build_options *o, const char *private_dir,
                                  kiln_module **out) {
    char why[PATHN + 200];
    int fd;
    if (check_entry(so, sha, &fd, why, sizeof why) != ENTRY_OK)
        return kiln_error(KILN_ERR_IO, "cannot load %s: %s", so, why);
    if (o && o->checked_hook) o->checked_hook(so, o->hook_user);
    return load(fd, so, private_dir, out);
}

/* ---- compiling ----------------------------------------------------------- */

typedef struct {
    const char *const *parts;
    int n;
    const resolved_opts *r;
    const cc_info *ci;
    const char *bdir;   /* fresh build directory */
    const char *keep;   /* where a failing part is kept for the error message */
    const char *key;
} build_job;

/* Starts the compiler with its output to <bdir>/<log>. */
static kiln_status spawn_logged(const build_job *b, argvec *cmd, const char *log, char logp[PATHN], pid_t *pid) {
    fmt_path(logp, "%s/%s", b->bdir, log);
    int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return kiln_error(KILN_ERR_IO, "cannot create %s: %s", logp, strerror(errno));
    kiln_status st = spawn(b->ci->exe, cmd->argv, b->bdir, fd, fd, pid);
    close(fd);
    return st;
}

static bool failed_status(int ws) { return ws == -1 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0; }

/* Runs the compiler on each part, up to r->jobs at once. */
static kiln_status compile_parts(const build_job *b, argvec *cmds) {
    pid_t *pids = calloc((size_t)b->n, sizeof *pids);
    if (!pids) return kiln_error(KILN_ERR_OOM, "out of memory");
    kiln_status st = KILN_OK;
    int next = 0, running = 0, failed = -1, fail_ws = 0;
    char logp[PATHN], name[64];
    while (next < b->n || running > 0) {
        while (st == KILN_OK && failed < 0 && next < b->n && running < b->r->jobs) {
            sfmt(name, sizeof name, "part%d.log", next);
            if ((st = spawn_logged(b, &cmds[next], name, logp, &pids[next])) != KILN_OK) break;
            next++, running++;
        }
        if (running == 0) break;
        int ws;
        int done = wait_any(pids, b->n, &ws);
        running--;
        if (failed_status(ws) && failed < 0 && st == KILN_OK) failed = done, fail_ws = ws;
    }
    free(pids);
    if (st != KILN_OK || failed < 0) return st;

    /* Keep the failing part and its log where the error can point to them. */
    char src[PATHN], kept[PATHN], keptlog[PATHN], excerpt[640], why[64], suffix[64];
    sfmt(name, sizeof name, "part%d", failed);
    fmt_path(src, "%s/%s.c", b->bdir, name);
    fmt_path(logp, "%s/%s.log", b->bdir, name);
    sfmt(suffix, sizeof suffix, ".part%d.failed", failed);
    sfmt(kept, sizeof kept, "%s/%s%s.c", b->keep, b->key, suffix);
    sfmt(keptlog, sizeof keptlog, "%s/%s%s.log", b->keep, b->key, suffix);
    if (strcmp(b->keep, b->bdir) == 0 || rename(src, kept) != 0) sfmt(kept, sizeof kept, "%s", src);
    else if (rename(logp, keptlog) == 0) sfmt(logp, sizeof logp, "%s", keptlog);
    log_excerpt(logp, excerpt, sizeof excerpt);
    describe_status(fail_ws, why, sizeof why);
    return kiln_error(KILN_ERR_INVALID, "compiling generated part %d of %d (%s) with %s failed (%s):\n%s", failed,
                      b->n, kept, b->r->cc, why, excerpt);
}

static kiln_status link_module(const build_job *b, argvec *link) {
    char logp[PATHN], excerpt[640], why[64];
    pid_t pid;
    kiln_status st = spawn_logged(b, link, "link.log", logp, &pid);
    if (st != KILN_OK) return st;
    int ws = wait_pid(pid);
    if (failed_status(ws)) {
        log_excerpt(logp, excerpt, sizeof excerpt);
        describe_status(ws, why, sizeof why);
        return kiln_error(KILN_ERR_INVALID, "linking %s/module.so with %s failed (%s):\n%s", b->bdir, b->r->cc, why,
                          excerpt);
    }
    return KILN_OK;
}

/* The parts concatenated, headed by the commands: for reading, not compiling. */
static kiln_status write_joined_source(const build_job *b, argvec *cmds, argvec *link) {
    char path[PATHN], line[2048];
    fmt_path(path, "%s/%s", b->bdir, "module.c");
    FILE *f = create_new(path);
    if (!f) return kiln_last_status();
    fprintf(f, "/* kiln %s generated module %s: %d parts, each compiled on its own (cwd: build dir):\n", KILN_VERSION,
            b->key, b->n);
    for (int i = 0; i < b->n; i++) {
        argv_join(&cmds[i], line, sizeof line);
        fprintf(f, " *   %s\n", line);
    }
    argv_join(link, line, sizeof line);
    fprintf(f, " *   %s\n * compiler: %s (%s)\n */\n", line, b->ci->real, b->ci->first);
    bool ok = true;
    for (int i = 0; i < b->n; i++) ok &= fprintf(f, "\n/* ==== part%d.c ==== */\n%s", i, b->parts[i]) >= 0;
    return finish_file(f, ok, path);
}

/* Writes, compiles and links the parts in b->bdir: module.so, module.sha256
 * (the hash of module.so) and module.c. */
static kiln_status build_in(const build_job *b) {
    char path[PATHN];
    argvec *cmds = calloc((size_t)b->n, sizeof *cmds), link = {0};
    char(*names)[2][32] = calloc((size_t)b->n, sizeof *names);
    int made = 0;
    kiln_status st = KILN_OK;
    if (!cmds || !names) st = kiln_error(KILN_ERR_OOM, "out of memory");
    for (int i = 0; st == KILN_OK && i < b->n; i++) {
        sfmt(names[i][0], 32, "part%d.c", i);
        sfmt(names[i][1], 32, "part%d.o", i);
        if (!fmt_path(path, "%s/%s", b->bdir, names[i][0])) st = kiln_error(KILN_ERR_INVALID, "path too long");
        else st = write_new_file(path, b->parts[i]);
        if (st == KILN_OK && !argv_make(&cmds[i], b->r->cc, b->r->cflags, 5)) st = KILN_ERR_OOM;
        if (st != KILN_OK) break;
        made++;
        if (!argv_has(&cmds[i], "-fPIC")) argv_push(&cmds[i], "-fPIC");
        const char *tail[4] = {"-c", names[i][0], "-o", names[i][1]};
        for (int k = 0; k < 4; k++) argv_push(&cmds[i], tail[k]);
    }
    if (st == KILN_OK && argv_make(&link, b->r->cc, b->r->cflags, 4 + b->n)) {
        const char *head[3] = {"-shared", "-o", "module.so"};
        for (int k = 0; k < 3; k++) argv_push(&link, head[k]);
        for (int i = 0; i < b->n; i++) argv_push(&link, names[i][1]);
    } else if (st == KILN_OK) {
        st = KILN_ERR_OOM;
    }
    if (st == KILN_OK) st = compile_parts(b, cmds);
    if (st == KILN_OK) st = link_module(b, &link);
    char hex[66];
    if (st == KILN_OK) {
        fmt_path(path, "%s/%s", b->bdir, "module.so");
        /* The linker honours the umask; cached code must be writable by us only. */
        if (chmod(path, 0700) != 0 || !hash_file(path, hex))
            st = kiln_error(KILN_ERR_IO, "cannot read back %s: %s", path, strerror(errno));
    }
    if (st == KILN_OK) {
        fmt_path(path, "%s/%s", b->bdir, "module.sha256");
        hex[64] = '\n', hex[65] = '\0';
        st = write_new_file(path, hex);
    }
    if (st == KILN_OK) st = write_joined_source(b, cmds, &link);
    for (int i = 0; i < made; i++) argv_free(&cmds[i]);
    argv_free(&link);
    free(cmds);
    free(names);
    return st;
}

/* ---- the public entry points --------------------------------------------- */

static void fill_info(kiln_build_info *info, const kiln_module *m, const char *src, double t0) {
    if (!info) return;
    sfmt(info->path, sizeof info->path, "%s", m->path);
    sfmt(info->src_path, sizeof info->src_path, "%s", src);
    info->seconds = kiln_time_now() - t0;
}

/* Looks the key up under the lock; loads a good entry, deletes a corrupt one.
 * Sets *out on a hit, *unsafe when the cache must not be used. */
static void cache_lookup(const char *dir, const char *key, const kiln_build_options *o, kiln_module **out, bool *unsafe) {
    char so[PATHN], sha[PATHN], base[PATHN], why[PATHN + 200];
    fmt_path(base, "%s/%s", dir, key);
    fmt_path(so, "%s%s", base, ".so");
    fmt_path(sha, "%s%s", base, ".sha256");
    int lk = lock_cache(dir, why, sizeof why);
    if (lk < 0) {
        kiln_log(KILN_LOG_WARN, "compile cache %s is unusable (%s); building in a private temporary directory", dir, why);
        *unsafe = true;
        return;
    }
    int fd;
    entry_state s = check_entry(so, sha, &fd, why, sizeof why);
    if (s == ENTRY_OK && o && o->checked_hook) o->checked_hook(so, o->hook_user);
    if (s == ENTRY_OK && load(fd, so, NULL, out) != KILN_OK) {
        sfmt(why, sizeof why, "%s", kiln_last_error());
        kiln_clear_error();
        s = ENTRY_CORRUPT;
    }
    if (s == ENTRY_CORRUPT) {
        kiln_log(KILN_LOG_WARN, "compile cache entry %s.so is bad (%s); deleting and rebuilding it", base, why);
        unlink(so);
        unlink(sha);
    } else if (s == ENTRY_UNSAFE) {
        kiln_log(KILN_LOG_WARN, "compile cache entry %s.so is not safe to use (%s); building in a private temporary directory",
                 base, why);
        *unsafe = true;
    }
    close(lk);
}

/* Moves a finished build into the cache (dir; NULL: private) and loads it
 * from there, or else from the build dir, which the module then owns. */
static kiln_status publish_and_load(const char *dir, const char *bdir, const char *key, const kiln_build_options *o,
                                    kiln_module **out, char src[PATHN]) {
    static const char *ext[3] = {".sha256", ".so", ".c"};
    static const char *from[3] = {"module.sha256", "module.so", "module.c"};
    char why[PATHN + 200], a[PATHN], b[PATHN], base[PATHN];
    int lk = dir ? lock_cache(dir, why, sizeof why) : -1;
    fmt_path(base, "%s/%s", dir ? dir : "", key);
    bool ok = lk >= 0;
    for (int i = 0; ok && i < 3; i++) {
        fmt_path(a, "%s/%s", bdir, from[i]);
        fmt_path(b, "%s%s", base, ext[i]);
        if (rename(a, b) != 0) ok = false, sfmt(why, sizeof why, "renaming %s to %s: %s", a, b, strerror(errno));
    }
    kiln_status st;
    if (ok) {
        fmt_path(b, "%s%s", base, ".so");
        fmt_path(a, "%s%s", base, ".sha256");
        fmt_path(src, "%s%s", base, ".c");
        st = check_and_load(b, a, o, NULL, out);
        remove_dir(bdir);
    } else {
        if (dir) kiln_log(KILN_LOG_WARN, "cannot publish into compile cache %s (%s); using the build in %s", dir, why, bdir);
        fmt_path(b, "%s/%s", bdir, "module.so");
        fmt_path(a, "%s/%s", bdir, "module.sha256");
        fmt_path(src, "%s/%s", bdir, "module.c");
        if ((st = check_and_load(b, a, o, bdir, out)) != KILN_OK) remove_dir(bdir);
    }
    if (lk >= 0) close(lk);
    return st;
}

kiln_status kiln_module_build(const char *const *parts, int n_parts, const kiln_build_options *o, kiln_module **out,
                              kiln_build_info *info) {
    double t0 = kiln_time_now();
    if (!out || !parts || n_parts < 1) return kiln_error(KILN_ERR_INVALID, "kiln_module_build: no parts to build");
    *out = NULL;
    for (int i = 0; i < n_parts; i++)
        if (!parts[i]) return kiln_error(KILN_ERR_INVALID, "kiln_module_build: part %d is NULL", i);
    if (info) memset(info, 0, sizeof *info);
    resolved_opts r;
    resolve_options(o, &r);
    const cc_info *ci = compiler_info(r.cc);
    if (!ci->ok) return kiln_error(KILN_ERR_UNSUPPORTED, "no usable C compiler to build the module: %s", ci->first);
    char key[65], why[PATHN + 200], bdir[PATHN], src[PATHN];
    compute_key(parts, n_parts, &r, ci, key);
    if (info) memcpy(info->key, key, sizeof key);

    bool priv = !cache_dir_usable(r.dir, why, sizeof why);
    if (priv)
        kiln_log(KILN_LOG_WARN, "compile cache %s is unusable (%s); building in a private temporary directory",
                 r.dir[0] ? r.dir : "(none)", why);
    if (!priv) {
        cache_lookup(r.dir, key, o, out, &priv);
        if (*out) {
            if (info) info->from_cache = true;
            fmt_path(src, "%s/%s.c", r.dir, key);
            fill_info(info, *out, src, t0);
            return KILN_OK;
        }
    }
    if (!priv && !(fmt_path(bdir, "%s/%s", r.dir, "build-XXXXXX") && mkdtemp(bdir))) {
        kiln_log(KILN_LOG_WARN, "cannot create a build directory in compile cache %s (%s); building in a private "
                 "temporary directory", r.dir, strerror(errno));
        priv = true;
    }
    if (priv && make_private_dir(bdir) != KILN_OK) return kiln_last_status();
    if (info) info->private_tmp = priv;

    if (r.jobs > n_parts) r.jobs = n_parts;
    build_job b = {parts, n_parts, &r, ci, bdir, priv ? bdir : r.dir, key};
    kiln_status st = build_in(&b);
    if (st != KILN_OK) {
        if (!priv) remove_dir(bdir); /* a private dir keeps the failing part for the message */
        return st;
    }
    if ((st = publish_and_load(priv ? NULL : r.dir, bdir, key, o, out, src)) != KILN_OK) return st;
    kiln_log(KILN_LOG_DEBUG, "built module %.12s (%d parts) in %.2f s: %s", key, n_parts, kiln_time_now() - t0,
             (*out)->path);
    fill_info(info, *out, src, t0);
    return KILN_OK;
}

void *kiln_module_sym(const kiln_module *m, const char *name) {
    if (!m || !name) return kiln_error(KILN_ERR_INVALID, "kiln_module_sym: no module or name"), NULL;
    dlerror();
    void *p = dlsym(m->handle, name);
    if (!p) kiln_error(KILN_ERR_INVALID, "module %s has no symbol '%s'", m->path, name);
    return p;
}

void kiln_module_free(kiln_module *m) {
    if (!m) return;
    kiln_loaded_close(m->file);
    if (m->private_dir[0]) remove_dir(m->private_dir);
    free(m);
}
