/* Competing load for `kiln bench --compete N`: N child processes that only
 * spin (what a busy neighbour on a laptop or a shared server looks like to
 * the scheduler), started before a measurement and killed after it. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli.h"

int kiln_cli_compete_start(int n, int *pids) {
    int started = 0;
    for (; started < n; started++) {
        pid_t parent = getpid(), pid = fork();
        if (pid < 0) {
            fprintf(stderr, "kiln bench: cannot start a competing process: %s\n", strerror(errno));
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
            if (getppid() != parent) _exit(0);
            volatile uint64_t x = 0;
            for (;;) x = x * 6364136223846793005ull + 1;
        }
        pids[started] = (int)pid;
    }
    usleep(100000); /* let the scheduler see them */
    return started;
}

void kiln_cli_compete_stop(int n, const int *pids) {
    for (int i = 0; i < n; i++) kill((pid_t)pids[i], SIGKILL);
    for (int i = 0; i < n; i++) waitpid((pid_t)pids[i], NULL, 0);
}
