/* TensorBoard event files (src/train/tfevents.c): a tiny run writes
 * events.out.tfevents.<time>.<host>.<pid>.kiln beside metrics.jsonl; it is
 * killed after step 5 (its last checkpoint at 4) and resumed into a second
 * file. The framing and CRC-32C are checked here with a bitwise CRC; the
 * events are decoded by Google's protobuf in tests/reference/read_tfevents.py
 * (Debian's python3-protobuf; skipped with a line without it), TensorBoard's
 * purge applied (a SessionLog START at step s drops the earlier files'
 * events at s or later) and what is left must be metrics.jsonl: the same
 * steps, tags and values. */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "test_runs.h"

uint32_t kiln_crc32c(const void *p, size_t n); /* src/train/tfevents.h */

static char tmpdir[128];

static uint32_t crc_bitwise(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}
static uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }
static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* the run directory's event files, sorted by name (TensorBoard's order) */
static int event_files(const char *dir, char names[][600], int max) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < max;)
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) snprintf(names[n++], 600, "%s/%s", dir, e->d_name);
    if (d) closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char t[600];
            memcpy(t, names[j], 600);
            memcpy(names[j], names[j - 1], 600);
            memcpy(names[j - 1], t, 600);
        }
    return n;
}

/* TFRecord framing with both CRCs; returns the number of records, -1 if bad */
static int check_framing(const char *path) {
    char *x;
    size_t n;
    if (kiln_read_file(path, &x, &n)) return -1;
    const unsigned char *p = (const unsigned char *)x;
    size_t o = 0;
    int recs = 0;
    while (o < n) {
        if (n - o < 16) break;
        uint64_t len = le(p + o, 8);
        if (masked(crc_bitwise(p + o, 8)) != (uint32_t)le(p + o + 8, 4) || len > n - o - 16) break;
        if (masked(crc_bitwise(p + o + 12, len)) != (uint32_t)le(p + o + 12 + len, 4)) break;
        o += 16 + len;
        recs++;
    }
    free(x);
    return o == n ? recs : -1;
}

typedef struct {
    long long step;
    char tag[64];
    double v;
} scalar;

static double tol(const char *tag, double v) { return 1e-5 * fabs(v) + 1e-5 + (strcmp(tag, "tokens_per_s") ? 0 : 0.05); }

/* read_tfevents.py's output over `files`, with TensorBoard's purge */
static int read_events(char files[][600], int nf, scalar *out, int max, int *starts, long long *start_steps) {
    char cmd[4096];
    int k = snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/read_tfevents.py");
    for (int i = 0; i < nf; i++) k += snprintf(cmd + k, sizeof cmd - (size_t)k, " '%s'", files[i]);
    FILE *p = popen(cmd, "r");
    int n = 0, versions = 0;
    *starts = 0;
    char line[512];
    double now = (double)time(NULL);
    while (p && fgets(line, sizeof line, p)) {
        char tag[64], ver[64];
        long long step;
        double v, wall;
        if (sscanf(line, "version %63s %lf", ver, &wall) == 2) {
            CHECK(!strcmp(ver, "brain.Event:2") && fabs(wall - now) < 3600, "first record: %s", line);
            versions++;
        } else if (sscanf(line, "start %lld %lf", &step, &wall) == 2) {
            start_steps[(*starts)++] = step;
            int w = 0; /* TensorBoard's purge: earlier events at step or later go */
            for (int i = 0; i < n; i++)
                if (out[i].step < step) out[w++] = out[i];
            n = w;
        } else if (sscanf(line, "scalar %lld %63s %lf %lf", &step, tag, &v, &wall) == 4 && n < max) {
            out[n].step = step;
            snprintf(out[n].tag, sizeof out[n].tag, "%s", tag);
            out[n++].v = v;
        } else if (strncmp(line, "file ", 5)) {
            CHECK(0, "read_tfevents.py: %s", line);
        }
    }
    CHECK(p && pclose(p) == 0, "read_tfevents.py succeeds");
    CHECK(versions == nf, "each file starts with its file_version (%d of %d)", versions, nf);
    return n;
}

/* metrics.jsonl as the scalars the events should hold */
static int read_metrics(const char *path, scalar *out, int max) {
    char *x;
    size_t len;
    if (kiln_read_file(path, &x, &len)) return -1;
    int n = 0;
    for (char *l = x, *nl; l < x + len; l = nl + 1) {
        nl = memchr(l, '\n', (size_t)(x + len - l));
        if (!nl) break;
        json_t *j = json_loadb(l, (size_t)(nl - l), 0, NULL);
        static const char *const keys[] = {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "val_ppl"};
        for (int i = 0; j && i < 6 && n < max; i++) {
            json_t *v = json_object_get(j, keys[i]);
            if (!v) continue;
            out[n].step = json_integer_value(json_object_get(j, "step"));
            snprintf(out[n].tag, sizeof out[n].tag, "%s", keys[i]);
            out[n++].v = json_number_value(v);
        }
        json_decref(j);
    }
    free(x);
    return n;
}

int main(void) {
    kiln_log_set_level(KILN_LOG_WARN);
    kiln_eager_enable();
    CHECK(kiln_crc32c("123456789", 9) == 0xE3069283u, "CRC-32C check value: %08x", kiln_crc32c("123456789", 9));
    CHECK(kiln_crc32c("", 0) == 0 && masked(0) == 0xa282ead8u, "CRC-32C of nothing");

    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_tfevents_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    test_write_shards(tmpdir, 6000, 2000, 7);
    kiln_train_config c;
    test_tiny_run(&c, tmpdir, "run");
    c.steps = 8, c.eval_every = 3, c.save_every = 2, c.keep = 0;
    char run[300], files[4][600], first[600] = "";
    snprintf(run, sizeof run, "%s/run", tmpdir);

    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) TEST_END();
    test_watch w = {.t = t, .stop_at = 5};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    kiln_trainer_free(t);
    int nf = event_files(run, files, 4);
    CHECK(nf == 1, "one events file after the first process (%d)", nf);
    if (nf >= 1) {
        snprintf(first, sizeof first, "%s", files[0]);
        char host[256] = "";
        gethostname(host, sizeof host - 1);
        char want[400];
        snprintf(want, sizeof want, ".%s.%d.kiln", host, (int)getpid());
        size_t lf = strlen(files[0]), lw = strlen(want);
        CHECK(lf > lw && !strcmp(files[0] + lf - lw, want), "named events.out.tfevents.<time>.<host>.<pid>.kiln: %s",
              files[0]);
        /* version + start + 5 steps + evaluations at 3 (and maybe at the stop) */
        int recs = check_framing(files[0]);
        CHECK(recs >= 8, "the first file's framing and CRCs hold (%d records)", recs);
    }
    /* killed after step 5 before its checkpoint: the run resumes from step 4 */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "%s/checkpoint-00000005", run);
    CHECK(t_rmtree(cmd) == 0, "removing %s", cmd);
    CHECK_OK(kiln_trainer_open(&c, true, &t));
    if (!t) TEST_END();
    CHECK(kiln_trainer_get_state(t)->step == 4, "resumed at step 4 (%lld)", (long long)kiln_trainer_get_state(t)->step);
    w = (test_watch){.t = t, .stop_at = -1};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    kiln_trainer_free(t);
    nf = event_files(run, files, 4);
    CHECK(nf == 2, "a second events file for the resumed process (%d)", nf);
    /* the same process and maybe the same second: the new name still sorts last */
    CHECK(nf == 2 && !strcmp(files[0], first), "the resumed file's name sorts after the first: %s, %s", files[0],
          nf == 2 ? files[1] : "");
    for (int i = 0; i < nf; i++) CHECK(check_framing(files[i]) >= 3, "framing and CRCs of %s", files[i]);

    if (system("/usr/bin/python3 -c 'import google.protobuf' 2>/dev/null") != 0) {
        printf("test_tfevents: skipped the protobuf read-back: /usr/bin/python3 without google.protobuf "
               "(apt install python3-protobuf)\n");
    } else {
        static scalar ev[512], mt[512];
        int starts;
        long long start_steps[8];
        int ne = read_events(files, nf, ev, 512, &starts, start_steps);
        char mpath[400];
        snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", run);
        int nm = read_metrics(mpath, mt, 512);
        CHECK(starts == 2 && start_steps[0] == 1 && start_steps[1] == 5, "SessionLog START at steps 1 and 5 (%d: %lld %lld)",
              starts, starts > 0 ? start_steps[0] : -1, starts > 1 ? start_steps[1] : -1);
        CHECK(nm >= 8 * 4 + 2 * 2, "metrics.jsonl: %d scalars", nm);
        CHECK(ne == nm, "the events hold as many scalars as metrics.jsonl after TensorBoard's purge (%d vs %d)", ne, nm);
        int same = 0, tags[6] = {0};
        static const char *const names[] = {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "val_ppl"};
        for (int i = 0; i < nm; i++) {
            bool found = false;
            for (int k = 0; k < ne && !found; k++)
                found = ev[k].step == mt[i].step && !strcmp(ev[k].tag, mt[i].tag) &&
                        fabs(ev[k].v - mt[i].v) <= tol(mt[i].tag, mt[i].v);
            same += found;
            if (!found) fprintf(stderr, "metrics.jsonl step %lld %s = %.9g has no equal event\n", mt[i].step, mt[i].tag, mt[i].v);
            for (int k = 0; k < 6; k++) tags[k] += found && !strcmp(mt[i].tag, names[k]);
        }
        CHECK(same == nm, "every metrics.jsonl value is an event with its step and tag (%d of %d)", same, nm);
        CHECK(tags[0] == 8 && tags[1] == 8 && tags[2] == 8 && tags[3] == 8, "loss, lr, grad_norm, tokens_per_s at the 8 steps");
        CHECK(tags[4] >= 2 && tags[4] == tags[5], "val_loss and val_ppl at each evaluation (%d, %d)", tags[4], tags[5]);
    }
    if (t_rmtree(tmpdir)) fprintf(stderr, "could not remove %s\n", tmpdir);
    TEST_END();
}
