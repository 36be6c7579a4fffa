/* The module builder and its cache: real compilation of tiny sources, cache
 * hits, corrupt/missing/unsafe entries, unusable cache dirs, compile errors,
 * a missing compiler, concurrent builds; SHA-256 against FIPS test vectors. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/build.h"
#include "test.h"

static int n_warn;
static char last_warn[2048];
static void on_log(kiln_log_level level, const char *msg, void *user) {
    (void)user;
    if (level >= KILN_LOG_WARN) {
        n_warn++;
        snprintf(last_warn, sizeof last_warn, "%s", msg);
    }
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    chmod(p, 0700);
    return remove(p);
}
static void rm_rf(const char *p) { nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_sha256(void) {
    char hex[65];
    kiln_sha256_hex("", 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "%s", hex);
    kiln_sha256_hex("abc", 3, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "%s", hex);
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    kiln_sha256_hex(m2, strlen(m2), hex);
    CHECK(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"), "%s", hex);
    /* a million 'a's, fed in uneven pieces to exercise the buffering */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    kiln_sha256_ctx c;
    uint8_t dg[32];
    kiln_sha256_init(&c);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 7 % 131 + 1)
        kiln_sha256_update(&c, a + off, off + step > 1000000 ? 1000000 - off : step);
    kiln_sha256_final(&c, dg);
    kiln_sha256_hex_digest(dg, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "%s", hex);
    free(a);
    /* lengths around the padding boundary: piecewise equals one shot */
    char buf[200], h1[65];
    for (int i = 0; i < 200; i++) buf[i] = (char)(i * 37 + 11);
    for (size_t n = 50; n < 140; n++) {
        kiln_sha256_hex(buf, n, h1);
        kiln_sha256_init(&c);
        kiln_sha256_update(&c, buf, n / 3);
        kiln_sha256_update(&c, buf + n / 3, n - n / 3);
        kiln_sha256_final(&c, dg);
        kiln_sha256_hex_digest(dg, hex);
        CHECK(!strcmp(hex, h1), "length %zu", n);
    }
}

static int triple(int x) { return 3 * x; }

static const char *part0 = "int f1(int x) { return 2 * x + 1; }\n";
static const char *part1 =
    "int f1(int);\n"
    "int f2(int x, int (*cb)(int)) { return cb(f1(x)) + 3; }\n"
    "int sum_omp(int n) {\n"
    "    long s = 0;\n"
    "#pragma omp parallel for reduction(+ : s)\n"
    "    for (int i = 0; i < n; i++) s += i;\n"
    "    return (int)s;\n"
    "}\n";

/* Builds {part0, part1} and checks the symbols compute the right thing. */
static kiln_status build_and_call(const kiln_build_options *o, kiln_build_info *info) {
    const char *parts[2] = {part0, part1};
    kiln_module *m = NULL;
    kiln_status st = kiln_module_build(parts, 2, o, &m, info);
    if (st != KILN_OK) return st;
    int (*f1)(int) = (int (*)(int))kiln_module_sym(m, "f1");
    int (*f2)(int, int (*)(int)) = (int (*)(int, int (*)(int)))kiln_module_sym(m, "f2");
    int (*so)(int) = (int (*)(int))kiln_module_sym(m, "sum_omp");
    CHECK(f1 && f2 && so, "symbols missing: %s", kiln_last_error());
    if (f1 && f2 && so) {
        CHECK(f1(20) == 41, "f1(20) = %d", f1(20));
        CHECK(f2(5, triple) == 36, "f2(5, triple) = %d", f2(5, triple));
        CHECK(so(1000) == 499500, "sum_omp = %d", so(1000));
    }
    CHECK(kiln_module_sym(m, "no_such_fn") == NULL, "missing symbol found");
    CHECK(strstr(kiln_last_error(), "no_such_fn") != NULL, "%s", kiln_last_error());
    kiln_module_free(m);
    return KILN_OK;
}

static void entry_paths(const kiln_build_info *info, char *so, char *sha) {
    snprintf(so, 1100, "%s", info->path);
    snprintf(sha, 1100, "%.*s.sha256", (int)(strlen(info->path) - 3), info->path);
}

static void test_cache(const char *root) {
    char cache[512], so[1100], sha[1100];
    snprintf(cache, sizeof cache, "%s/a/cache", root);
    kiln_build_options o = {.cache_dir = cache};
    kiln_build_info cold, warm, info;

    CHECK_OK(build_and_call(&o, &cold));
    CHECK(!cold.from_cache && !cold.private_tmp, "cold: from_cache %d private %d", cold.from_cache, cold.private_tmp);
    CHECK(strncmp(cold.path, cache, strlen(cache)) == 0, "%s not in %s", cold.path, cache);
    CHECK(strlen(cold.key) == 64, "key %s", cold.key);
    entry_paths(&cold, so, sha);
    CHECK(exists(so) && exists(sha) && exists(cold.src_path), "entry files %s %s", sha, cold.src_path);
    struct stat st;
    CHECK(stat(cache, &st) == 0 && (st.st_mode & 0777) == 0700, "cache dir mode %o", (unsigned)st.st_mode & 0777);
    CHECK(stat(so, &st) == 0 && (st.st_mode & 022) == 0, "entry mode %o", (unsigned)st.st_mode & 0777);
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(cold.src_path, &text, &n));
    CHECK(text && strstr(text, "int f2(int x") && strstr(text, "-shared"), "joined source lacks parts/commands");
    free(text);

    CHECK_OK(build_and_call(&o, &warm));
    CHECK(warm.from_cache && !warm.private_tmp, "warm: from_cache %d", warm.from_cache);
    CHECK(!strcmp(warm.key, cold.key) && !strcmp(warm.path, cold.path), "key/path changed");
    /* that the warm call compiled nothing is what from_cache says; the two
     * times are figures to read, not assertions (a loaded machine) */
    CHECK(!cold.from_cache, "the cold build compiled");
    printf("test module: cold build %.3f s, warm load %.4f s\n", cold.seconds, warm.seconds);

    /* flip one byte of the cached .so */
    FILE *f = fopen(so, "r+b");
    CHECK(f != NULL, "open %s", so);
    if (f) {
        fseek(f, 0, SEEK_END);
        long mid = ftell(f) / 2;
        fseek(f, mid, SEEK_SET);
        int c = fgetc(f);
        fseek(f, mid, SEEK_SET);
        fputc(c ^ 0x5a, f);
        fclose(f);
    }
    n_warn = 0;
    CHECK_OK(build_and_call(&o, &info));
    CHECK(!info.from_cache && !info.private_tmp, "corrupt entry was loaded");
    CHECK(n_warn == 1 && strstr(last_warn, "SHA-256"), "warning: %s", last_warn);
    CHECK_OK(build_and_call(&o, &info));
    CHECK(info.from_cache, "rebuilt entry not cached");

    /* truncate it */
    CHECK(truncate(so, 100) == 0, "truncate");
    n_warn = 0;
    CHECK_OK(build_and_call(&o, &info));
    CHECK(!info.from_cache && n_warn == 1, "truncated entry: from_cache %d, %d warnings", info.from_cache, n_warn);

    /* lose the .sha256 */
    CHECK(unlink(sha) == 0, "unlink %s", sha);
    n_warn = 0;
    CHECK_OK(build_and_call(&o, &info));
    CHECK(!info.from_cache && n_warn == 1 && strstr(last_warn, "missing"), "missing hash: %s", last_warn);
    CHECK(exists(sha), "hash not rewritten");
    CHECK_OK(build_and_call(&o, &info));
    CHECK(info.from_cache, "not cached after rebuild");

    /* a group/world-writable cache dir is not trusted */
    chmod(cache, 0777);
    n_warn = 0;
    CHECK_OK(build_and_call(&o, &info));
    CHECK(info.private_tmp && !info.from_cache && n_warn == 1 && strstr(last_warn, "writable"),
          "0777 cache: private %d, warning '%s'", info.private_tmp, last_warn);
    CHECK(strncmp(info.path, cache, strlen(cache)) != 0, "used %s", info.path);
    char pdir[1100];
    snprintf(pdir, sizeof pdir, "%s", info.path);
    CHECK(!exists(dirname(pdir)), "private dir %s left behind", pdir);
    chmod(cache, 0700);

    /* so is a writable entry */
    chmod(so, 0666);
    n_warn = 0;
    CHECK_OK(build_and_call(&o, &info));
    CHECK(info.private_tmp && n_warn == 1, "writable entry: private %d, warning '%s'", info.private_tmp, last_warn);
    chmod(so, 0700);
    CHECK_OK(build_and_call(&o, &info));
    CHECK(info.from_cache && !info.private_tmp, "entry not trusted again after chmod");

    /* more parts than jobs; other flags give another key */
    const char *three[3] = {part0, part1, "int f3(void) { return 7; }\n"};
    kiln_build_options o1 = {.cache_dir = cache, .jobs = 1, .cflags = "-O1 -fPIC"};
    kiln_module *m = NULL;
    CHECK_OK(kiln_module_build(three, 3, &o1, &m, &info));
    CHECK(strcmp(info.key, cold.key) != 0, "flags not in the key");
    int (*f3)(void) = (int (*)(void))kiln_module_sym(m, "f3");
    CHECK(f3 && f3() == 7, "f3");
    kiln_module_free(m);

    /* $KILN_CACHE_DIR when no cache_dir is given */
    setenv("KILN_CACHE_DIR", cache, 1);
    CHECK_OK(build_and_call(NULL, &info));
    CHECK(info.from_cache, "KILN_CACHE_DIR not used: %s", info.path);
    unsetenv("KILN_CACHE_DIR");
}

static void test_unusable_dirs(const char *root) {
    char file[512], under[600];
    snprintf(file, sizeof file, "%s/regular", root);
    FILE *f = fopen(file, "w");
    fclose(f);
    snprintf(under, sizeof under, "%s/sub/cache", file);
    kiln_build_options o = {.cache_dir = under};
    kiln_build_info info;
    n_warn = 0;
    CHECK_OK(build_and_call(&o, &info));
    CHECK(info.private_tmp && n_warn == 1 && strstr(last_warn, file), "cache under a file: %d '%s'", info.private_tmp,
          last_warn);
}

static void test_errors(const char *root) {
    char cache[512];
    snprintf(cache, sizeof cache, "%s/a/cache", root);
    kiln_build_options o = {.cache_dir = cache};
    const char *bad[2] = {part0, "int g(int x) {\n    return x +;\n}\n"};
    kiln_module *m = (kiln_module *)1;
    kiln_status st = kiln_module_build(bad, 2, &o, &m, NULL);
    const char *e = kiln_last_error();
    CHECK(st != KILN_OK && m == NULL, "syntax error built");
    CHECK(strstr(e, "part 1 of 2") && strstr(e, "error") && strstr(e, "expected") && strstr(e, ".failed.c"),
          "message: %s", e);
    const char *kept = strstr(e, cache);
    if (kept) {
        char p[1100];
        snprintf(p, sizeof p, "%.*s", (int)strcspn(kept, ") "), kept);
        CHECK(exists(p), "kept source %s", p);
    }

    const char *ver = NULL;
    kiln_build_options nocc = {.cc = "/nonexistent/cc", .cache_dir = cache};
    CHECK(!kiln_compiler_available(&nocc, &ver), "nonexistent compiler available");
    CHECK(ver && strstr(ver, "/nonexistent/cc"), "reason: %s", ver ? ver : "(null)");
    const char *good[1] = {part0};
    st = kiln_module_build(good, 1, &nocc, &m, NULL);
    CHECK(st != KILN_OK && strstr(kiln_last_error(), "/nonexistent/cc") && strstr(kiln_last_error(), "compiler"),
          "%s", kiln_last_error());
    kiln_build_options falsecc = {.cc = "false", .cache_dir = cache};
    CHECK(!kiln_compiler_available(&falsecc, &ver), "`false` is a compiler");
    kiln_build_options def = {0};
    CHECK(kiln_compiler_available(&def, &ver) && ver && *ver, "default compiler unusable");
    printf("compiler: %s\n", ver);
}

typedef struct {
    const char *cache;
    kiln_status st;
    int result;
} race_arg;

static void *race(void *p) {
    race_arg *a = p;
    const char *parts[1] = {"int race(void) { return 12345; }\n"};
    kiln_build_options o = {.cache_dir = a->cache};
    kiln_module *m = NULL;
    a->st = kiln_module_build(parts, 1, &o, &m, NULL);
    if (a->st == KILN_OK) {
        int (*fn)(void) = (int (*)(void))kiln_module_sym(m, "race");
        a->result = fn ? fn() : -1;
        kiln_module_free(m);
    }
    return NULL;
}

static void test_concurrent(const char *root) {
    char cache[512];
    snprintf(cache, sizeof cache, "%s/shared", root);
    race_arg args[3] = {{cache, 0, 0}, {cache, 0, 0}, {cache, 0, 0}};
    pthread_t th[3];
    n_warn = 0;
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, race, &args[i]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) CHECK(args[i].st == KILN_OK && args[i].result == 12345, "racer %d", i);
    CHECK(n_warn == 0, "warning during a race: %s", last_warn);
    race(&args[0]);
    CHECK(args[0].st == KILN_OK && args[0].result == 12345, "after race");
}

/* A module whose kiln_which() returns `which`, from the cache in `cache`. */
static kiln_module *which_module(const kiln_build_options *o, int which, kiln_build_info *info) {
    char src[96];
    snprintf(src, sizeof src, "int kiln_which(void) { return %d; }\n", which);
    const char *parts[1] = {src};
    kiln_module *m = NULL;
    CHECK_OK(kiln_module_build(parts, 1, o, &m, info));
    return m;
}
static int call_which(const kiln_module *m) {
    int (*f)(void) = m ? (int (*)(void))kiln_module_sym(m, "kiln_which") : NULL;
    return f ? f() : -1;
}

/* Swaps another module's .so in at the checked entry's path. */
static char swap_from[1100];
static void swap_in(const char *so, void *user) {
    (void)user;
    CHECK(rename(swap_from, so) == 0, "rename %s -> %s: %s", swap_from, so, strerror(errno));
}

/* Issue 10: the entry is loaded from the very file that was hashed, so a
 * .so swapped in at the path between the check and dlopen() is not run (and
 * is found corrupt next time). Descriptors of loaded modules are not reused
 * while their object is loaded: the loader knows it by /proc/self/fd/N. */
static void test_load_what_was_hashed(const char *root) {
    char cache[512];
    snprintf(cache, sizeof cache, "%s/swap/cache", root);
    kiln_build_options o = {.cache_dir = cache};
    kiln_build_info i1, i2, i3;
    kiln_module *a = which_module(&o, 1, &i1), *b = which_module(&o, 2, &i2);
    CHECK(call_which(a) == 1 && call_which(b) == 2, "two modules: %d %d", call_which(a), call_which(b));
    kiln_module_free(a);
    kiln_module_free(b);
    snprintf(swap_from, sizeof swap_from, "%s", i2.path);
    kiln_build_options hooked = {.cache_dir = cache, .checked_hook = swap_in};
    a = which_module(&hooked, 1, &i3);
    CHECK(i3.from_cache && call_which(a) == 1, "swapped after the check: loaded module says %d (from cache %d)", call_which(a),
          i3.from_cache);
    kiln_module_free(a);
    n_warn = 0;
    a = which_module(&o, 1, &i3);
    CHECK(!i3.from_cache && n_warn == 1 && strstr(last_warn, "is bad"), "the swapped entry is rebuilt: %s", last_warn);
    CHECK(call_which(a) == 1, "rebuilt module says %d", call_which(a));
    /* the same file loaded twice, the first released, then another file */
    kiln_module *a2 = which_module(&o, 1, NULL);
    kiln_module_free(a);
    b = which_module(&o, 2, NULL);
    CHECK(call_which(a2) == 1 && call_which(b) == 2, "after sharing: %d %d", call_which(a2), call_which(b));
    kiln_module_free(a2);
    kiln_module_free(b);
    for (int k = 0; k < 3; k++) { /* free and load in turn: each load gets its own code */
        a = which_module(&o, 1 + k % 2, NULL);
        CHECK(call_which(a) == 1 + k % 2, "load %d says %d", k, call_which(a));
        kiln_module_free(a);
    }
}

int main(void) {
    kiln_log_set_handler(on_log, NULL);
    test_sha256();
    char root[] = "/tmp/kiln-test-build-XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_cache(root);
    test_unusable_dirs(root);
    test_errors(root);
    test_concurrent(root);
    test_load_what_was_hashed(root);
    rm_rf(root);
    TEST_END();
}
