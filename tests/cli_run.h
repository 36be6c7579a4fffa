/* Running a program from a test the way a person runs it: the kiln binary
 * built beside the test (BUILD/kiln), or node, with stdout and stderr into
 * one file in the test's directory; the exit status comes back (128 +
 * signal when it was killed). The tests that drive the kiln command
 * include this instead of each keeping a copy. Header-only: the functions
 * are static inline, so a test uses what it needs. */
#ifndef KILN_TEST_CLI_RUN_H
#define KILN_TEST_CLI_RUN_H
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "test.h"

static char cli_kiln[1100]; /* BUILD/kiln, beside BUILD/tests/ */
static char cli_root[1100]; /* the checkout: BUILD/tests/../.. */
static const char *cli_dir; /* the test's directory: runs write out.txt there */

/* Finds BUILD/kiln from this test's own path; the runs' output will go to
 * DIR/out.txt (dir may still be a mkdtemp template: it is read at each
 * run). False, saying why, when kiln is not there. */
static inline bool cli_init(const char *dir) {
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        perror("/proc/self/exe");
        return false;
    }
    self[n] = 0;
    const char *d = dirname(self);
    snprintf(cli_kiln, sizeof cli_kiln, "%s/../kiln", d);
    snprintf(cli_root, sizeof cli_root, "%s/../..", d);
    cli_dir = dir;
    if (access(cli_kiln, X_OK) != 0) {
        fprintf(stderr, "%s not built\n", cli_kiln);
        return false;
    }
    return true;
}

/* where the runs' stdout and stderr go */
static inline const char *cli_out_path(void) {
    static char path[700];
    snprintf(path, sizeof path, "%s/out.txt", cli_dir);
    return path;
}

/* Runs argv (NULL-terminated; argv[0] looked up in PATH); with sig, sends
 * it `after` seconds after the start. */
static inline int cli_exec_signal(const char *const *argv, int sig, double after) {
    const char *out = cli_out_path();
    fflush(NULL); /* the child must not write this process's buffers again */
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        /* the spin count tests/run.sh set for the tests themselves: the
         * kiln command chooses its own (src/cli/main.c) */
        if (getenv("KILN_TEST_SPINCOUNT"))
            unsetenv("GOMP_SPINCOUNT"), unsetenv("KMP_BLOCKTIME"), unsetenv("KILN_TEST_SPINCOUNT");
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (sig) {
        usleep((useconds_t)(after * 1e6));
        kill(pid, sig);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static inline int cli_exec(const char *const *argv) { return cli_exec_signal(argv, 0, 0); }

/* kiln ARGS (NULL-terminated, up to 62 of them) */
static inline int cli_kiln_signal(const char *const *args, int sig, double after) {
    const char *argv[64] = {cli_kiln};
    int n = 1;
    for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    return cli_exec_signal(argv, sig, after);
}

static inline int cli_kiln_run(const char *const *args) { return cli_kiln_signal(args, 0, 0); }

/* the last run's whole output (caller frees); "" when there is none */
static inline char *cli_output(void) {
    char *text = NULL;
    size_t n;
    if (kiln_read_file(cli_out_path(), &text, &n)) return strdup("");
    return text;
}

/* whether the last run's output holds needle; prints the output when not */
static inline bool cli_output_has(const char *needle) {
    char *text = cli_output();
    bool found = strstr(text, needle) != NULL;
    if (!found) fprintf(stderr, "--- output lacks '%s':\n%s\n---\n", needle, text);
    free(text);
    return found;
}
#endif
