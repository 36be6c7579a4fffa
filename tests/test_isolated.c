/* The cpu-isolated device's memory (src/backend/cpu_isolated/isolated.c):
 * buffers cut from one reservation, reused and coalesced, keep their bytes
 * and never overlap across a long random run of allocations and frees; in
 * strict mode (KILN_STRICT_DEVICE=1, always on in the sanitizer builds) a
 * host read of a live buffer outside the backend's calls faults, the same
 * read inside exec does not, and a freed buffer faults even inside exec. */
#include <signal.h>
#include <sys/wait.h>
#include "kiln/backend.h"
#include "test.h"

#define LIVE 64
#define ROUNDS 3000

static const kiln_backend *be;

typedef struct {
    unsigned char *p;
    size_t n;
    unsigned char tag;
} buf;

static void fill(buf *b, uint64_t seed) {
    unsigned char *h = malloc(b->n);
    b->tag = (unsigned char)(seed * 131 + 7);
    for (size_t i = 0; i < b->n; i++) h[i] = (unsigned char)(b->tag + i * 13);
    be->buft->write(b->p, h, b->n);
    free(h);
}

static bool intact(const buf *b) {
    unsigned char *h = malloc(b->n);
    be->buft->read(h, b->p, b->n);
    bool ok = true;
    for (size_t i = 0; i < b->n && ok; i++) ok = h[i] == (unsigned char)(b->tag + i * 13);
    free(h);
    return ok;
}

static void churn(void) {
    buf live[LIVE] = {{0}};
    int bad_bytes = 0, overlaps = 0, allocs = 0;
    for (int r = 0; r < ROUNDS; r++) {
        int i = (int)(kiln_rng_u64(3, (uint64_t)r) % LIVE);
        if (live[i].p) { /* check and free */
            bad_bytes += !intact(&live[i]);
            be->buft->free(live[i].p, live[i].n);
            live[i].p = NULL;
            continue;
        }
        uint64_t u = kiln_rng_u64(4, (uint64_t)r);
        live[i].n = u % 4 == 0 ? 1 + u % 300000 : 1 + u % 9000; /* mostly small, some of many pages */
        live[i].p = be->buft->alloc(live[i].n);
        if (!live[i].p) break;
        allocs++;
        fill(&live[i], (uint64_t)r);
        for (int j = 0; j < LIVE; j++)
            if (j != i && live[j].p && live[j].p < live[i].p + live[i].n && live[i].p < live[j].p + live[j].n) overlaps++;
    }
    CHECK(allocs > ROUNDS / 3, "%d allocations made", allocs);
    CHECK(bad_bytes == 0, "every buffer kept its bytes until freed (%d changed)", bad_bytes);
    CHECK(overlaps == 0, "no two live buffers overlap (%d did)", overlaps);
    for (int i = 0; i < LIVE; i++)
        if (live[i].p) {
            bad_bytes += !intact(&live[i]);
            be->buft->free(live[i].p, live[i].n);
        }
    CHECK(bad_bytes == 0, "the last buffers intact");
    /* all freed: one big buffer fits and works */
    buf big = {.n = (size_t)64 << 20};
    big.p = be->buft->alloc(big.n);
    CHECK(big.p != NULL, "a 64 MiB buffer after the churn");
    if (big.p) {
        fill(&big, 99);
        CHECK(intact(&big), "the 64 MiB buffer round-trips");
        be->buft->free(big.p, big.n);
    }
}

static volatile unsigned char sink;
static kiln_status touch(void *p) {
    sink = *(volatile unsigned char *)p;
    return KILN_OK;
}

/* how a child that runs what(p) ends: 0 exited 0, 1 died (a signal, or
 * the sanitizer's report and non-zero exit) */
static int child(int what) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char *p = be->buft->alloc(10000);
        if (!p) _exit(3);
        unsigned char x = 42;
        be->buft->write(p + 5000, &x, 1);
        if (what == 0) touch(p + 5000);                  /* host read, outside any call */
        else if (what == 1) be->exec(touch, p + 5000);  /* the same read inside exec */
        else {                                           /* freed, then read inside exec */
            be->buft->free(p, 10000);
            be->exec(touch, p + 5000);
        }
        _exit(what == 1 && sink != 42 ? 4 : 0); /* 0 and 2 reach here only without the fault */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

int main(void) {
    setenv("KILN_STRICT_DEVICE", "1", 1);
    be = kiln_backend_at(KILN_DEVICE_CPU_ISOLATED);
    CHECK(be && be->buft && !be->buft->host_mappable, "cpu-isolated's buffers are not host-mappable");
    if (!be) TEST_END();
    churn();
    CHECK(child(1) == 0, "strict: a read inside the backend's exec works");
    CHECK(child(0) == 1, "strict: a host read outside the backend's calls faults");
    CHECK(child(2) == 1, "strict: a freed buffer faults even inside exec");
    TEST_END();
}
