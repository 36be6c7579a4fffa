/* Training on every device gives the same bits: tiny runs of 8 steps,
 * eager and compiled (default mode), fp32 and bf16, with and without LoRA,
 * on --device cpu and cpu-isolated. The written model.safetensors (and
 * adapter file), the optimiser state and every loss are identical between
 * devices, and a run interrupted on one device and resumed on the other
 * equals the uninterrupted run. Also: the run's tensors really live on the
 * device asked for, generation and evaluation of a saved model agree on
 * both devices, a 2-rank MPI run (gradients staged through the host) gives
 * the same weights on both devices, and a bad --device names the known
 * ones. */
#include <sys/stat.h>
#include <sys/wait.h>
#include "kiln/backend.h"
#include "kiln/eager.h"
#include "test_runs.h"

#define STEPS 8
#define HALF 4

static char tmpdir[256];

typedef struct {
    const char *name;
    int compile, precision, lora_rank, base_dtype;
    double dropout;
} run_kind;

static const run_kind kinds[] = {
    {"eager_fp32", KILN_RUN_EAGER, KILN_F32, 0, KILN_F32, 0},
    {"eager_bf16", KILN_RUN_EAGER, KILN_BF16, 0, KILN_F32, 0},
    {"eager_lora_fp32", KILN_RUN_EAGER, KILN_F32, 4, KILN_F32, 0},
    {"eager_lora_bf16", KILN_RUN_EAGER, KILN_BF16, 4, KILN_F32, 0},
    {"eager_lora_bf16base_dropout", KILN_RUN_EAGER, KILN_BF16, 4, KILN_BF16, 0.1},
    {"compiled_fp32", KILN_RUN_COMPILE_DEFAULT, KILN_F32, 0, KILN_F32, 0},
    {"compiled_bf16", KILN_RUN_COMPILE_DEFAULT, KILN_BF16, 0, KILN_F32, 0},
    {"compiled_lora_fp32", KILN_RUN_COMPILE_DEFAULT, KILN_F32, 4, KILN_F32, 0},
    {"compiled_lora_bf16", KILN_RUN_COMPILE_DEFAULT, KILN_BF16, 4, KILN_F32, 0},
    /* a held base (the dequantizing product; f16 takes the tiny model's rows of 48) */
    {"eager_lora_f16base", KILN_RUN_EAGER, KILN_F32, 4, KILN_F16, 0},
    {"compiled_lora_f16base_bf16", KILN_RUN_COMPILE_DEFAULT, KILN_BF16, 4, KILN_F16, 0},
};
#define N_KINDS ((int)(sizeof kinds / sizeof kinds[0]))

static const char *dev_name(int d) { return kiln_backend_at(d)->name; }

static void config(kiln_train_config *c, const run_kind *k, int device, const char *run) {
    test_tiny_run(c, tmpdir, run);
    c->accum = 2, c->steps = STEPS, c->eval_every = HALF;
    c->lr = 3e-3, c->min_lr = 3e-4;
    c->compile = k->compile;
    c->precision = k->precision;
    c->device = device;
    if (k->lora_rank) {
        c->lora_rank = k->lora_rank, c->lora_alpha = 16, c->lr = 1e-2, c->min_lr = 1e-3;
        c->lora_dropout = k->dropout;
        c->base_dtype = k->base_dtype;
        snprintf(c->lora_targets, sizeof c->lora_targets, "q_proj,v_proj");
    }
}

/* the losses of every step (by step number) and the evaluations, in full */
typedef struct {
    kiln_trainer *t;
    int64_t stop_at;
    double loss[STEPS + 1], val[STEPS + 1];
    int steps, evals;
} recorder;

static void record(const kiln_event *e, void *user) {
    recorder *r = user;
    int64_t s = e->state->step;
    if (e->kind == KILN_EVENT_STEP && s >= 1 && s <= STEPS) {
        r->loss[s] = e->step->loss;
        r->steps++;
        if (s == r->stop_at) kiln_trainer_request_stop(r->t);
    }
    if (e->kind == KILN_EVENT_EVAL && s >= 0 && s <= STEPS) r->val[s] = e->val_loss, r->evals++;
}

/* Runs (resume: continues) `run` on `device` until stop_at (-1: the end). */
static bool train(const run_kind *k, int device, const char *run, bool resume, int64_t stop_at, recorder *r) {
    kiln_train_config c;
    config(&c, k, device, run);
    kiln_trainer *t = NULL;
    kiln_status st = kiln_trainer_open(&c, resume, &t);
    CHECK(st == KILN_OK, "%s on %s: open%s: %s", k->name, dev_name(device), resume ? " (resume)" : "", kiln_last_error());
    if (st) return false;
    const kiln_llama *m = kiln_trainer_model(t);
    /* every parameter is on the run's device (cpu-isolated: not mappable) */
    bool on = true;
    for (int i = 0; i < m->n_params; i++) on &= kiln_backend_of(m->params[i]) == kiln_backend_at(device);
    CHECK(on, "%s: every parameter on %s", k->name, dev_name(device));
    if (device == KILN_DEVICE_CPU_ISOLATED) {
        CHECK(!kiln_tensor_map(m->embed_tokens), "%s: a cpu-isolated parameter cannot be mapped", k->name);
        kiln_clear_error();
    }
    CHECK(kiln_backend_current() == kiln_backend_at(KILN_DEVICE_CPU), "%s: open restores the thread's device", k->name);
    r->t = t, r->stop_at = stop_at;
    st = kiln_trainer_run(t, record, r);
    CHECK(st == KILN_OK, "%s on %s: run: %s", k->name, dev_name(device), kiln_last_error());
    CHECK(kiln_backend_current() == kiln_backend_at(KILN_DEVICE_CPU), "%s: run restores the thread's device", k->name);
    kiln_trainer_free(t);
    return st == KILN_OK;
}

static bool same(const char *run_a, const char *run_b, const char *file) {
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/%s/%s", tmpdir, run_a, file);
    snprintf(b, sizeof b, "%s/%s/%s", tmpdir, run_b, file);
    return test_same_file(a, b);
}

static bool same_doubles(const double *a, const double *b, int from, int to) {
    for (int i = from; i <= to; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i])) return false;
    return true;
}

static void compare_runs(const run_kind *k, const char *a, const char *b, const char *what) {
    char ck[64];
    snprintf(ck, sizeof ck, "checkpoint-%08d/optimizer.safetensors", STEPS);
    /* a held base is referenced (base.json: its source and the hash of its bytes), not copied */
    const char *base = k->base_dtype == KILN_F16 ? "base.json" : "model.safetensors";
    CHECK(same(a, b, base), "%s: %s: %s byte-identical", k->name, what, base);
    CHECK(same(a, b, ck), "%s: %s: optimizer.safetensors byte-identical", k->name, what);
    if (k->lora_rank)
        CHECK(same(a, b, "adapter_model.safetensors"), "%s: %s: adapter_model.safetensors byte-identical", k->name, what);
}

static void one_kind(const run_kind *k) {
    char run[4][96];
    snprintf(run[0], sizeof run[0], "%s_cpu", k->name);
    snprintf(run[1], sizeof run[1], "%s_iso", k->name);
    snprintf(run[2], sizeof run[2], "%s_cpu_then_iso", k->name);
    snprintf(run[3], sizeof run[3], "%s_iso_then_cpu", k->name);
    recorder r[4];
    memset(r, 0, sizeof r);
    if (!train(k, KILN_DEVICE_CPU, run[0], false, -1, &r[0])) return;
    if (!train(k, KILN_DEVICE_CPU_ISOLATED, run[1], false, -1, &r[1])) return;
    CHECK(r[0].steps == STEPS && r[1].steps == STEPS && r[0].evals == 2 && r[1].evals == 2,
          "%s: %d and %d steps, %d and %d evaluations", k->name, r[0].steps, r[1].steps, r[0].evals, r[1].evals);
    CHECK(same_doubles(r[0].loss, r[1].loss, 1, STEPS), "%s: the same loss at every step on both devices", k->name);
    CHECK(same_doubles(r[0].val, r[1].val, 0, STEPS), "%s: the same evaluation losses on both devices", k->name);
    bool finite = true, moved = false;
    for (int i = 1; i <= STEPS; i++) finite &= isfinite(r[0].loss[i]), moved |= r[0].loss[i] != r[0].loss[1];
    CHECK(finite && moved, "%s: finite losses that change (%g -> %g)", k->name, r[0].loss[1], r[0].loss[STEPS]);
    compare_runs(k, run[0], run[1], "cpu vs cpu-isolated");
    /* interrupted at step HALF on one device, resumed on the other */
    for (int dir = 0; dir < 2; dir++) {
        int first = dir ? KILN_DEVICE_CPU_ISOLATED : KILN_DEVICE_CPU, second = dir ? KILN_DEVICE_CPU : KILN_DEVICE_CPU_ISOLATED;
        recorder *x = &r[2 + dir];
        if (!train(k, first, run[2 + dir], false, HALF, x)) return;
        CHECK(x->steps == HALF, "%s: stopped after step %d (%d)", k->name, HALF, x->steps);
        x->steps = 0;
        if (!train(k, second, run[2 + dir], true, -1, x)) return;
        CHECK(x->steps == STEPS - HALF, "%s: resumed on %s for %d steps (%d)", k->name, dev_name(second), STEPS - HALF,
              x->steps);
        CHECK(same_doubles(r[0].loss, x->loss, 1, STEPS), "%s: %s then %s: the losses of the uninterrupted run", k->name,
              dev_name(first), dev_name(second));
        compare_runs(k, run[0], run[2 + dir], dir ? "cpu-isolated then cpu" : "cpu then cpu-isolated");
    }
}

/* A saved model loaded onto each device: the same greedy ids and the same
 * evaluation loss. */
static void load_generate_eval(void) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s_cpu", tmpdir, kinds[2].name); /* a LoRA run: the base and its adapters */
    char ck[800];
    if (kiln_model_dir_resolve(dir, ck, sizeof ck)) {
        CHECK(0, "resolve %s: %s", dir, kiln_last_error());
        return;
    }
    int32_t out[2][12];
    int n_out[2] = {0, 0};
    double loss[2] = {0, 0};
    kiln_batch *b = kiln_batch_alloc(2, 32);
    kiln_loader *ld = NULL;
    char path[800];
    snprintf(path, sizeof path, "%s/val.bin", tmpdir);
    kiln_loader_config lc = {.path = path, .batch_size = 2, .seq_len = 32, .mode = KILN_PACK_PACKED, .seed = 1};
    CHECK_OK(kiln_loader_open(&lc, &ld));
    if (ld) CHECK_OK(kiln_loader_get(ld, 0, 0, b));
    for (int d = 0; d < 2; d++) {
        kiln_llama *m = NULL;
        CHECK_OK(kiln_load_model_dir_on(ck, d, &m));
        if (!m) continue;
        CHECK(kiln_backend_of(m->embed_tokens) == kiln_backend_at(d) && m->lora_a &&
                  kiln_backend_of(m->params[m->n_params - 1]) == kiln_backend_at(d),
              "the model and its adapters loaded onto %s", dev_name(d));
        CHECK(kiln_backend_current() == kiln_backend_at(KILN_DEVICE_CPU), "loading restores the thread's device");
        int32_t prompt[3] = {5, 9, 17};
        kiln_sample_config sc = {.max_tokens = 12, .temperature = 0, .top_p = 1, .stop_id = -1};
        CHECK_OK(kiln_generate(m, prompt, 3, &sc, out[d], &n_out[d], NULL, NULL));
        kiln_batch *bs[1] = {b};
        if (ld) CHECK_OK(kiln_evaluate(m, bs, 1, &loss[d], NULL));
        kiln_llama_free(m);
    }
    CHECK(n_out[0] == 12 && n_out[1] == 12 && !memcmp(out[0], out[1], sizeof out[0]), "greedy generation agrees on both devices");
    CHECK(isfinite(loss[0]) && !memcmp(&loss[0], &loss[1], sizeof loss[0]), "evaluation agrees on both devices (%.17g, %.17g)",
          loss[0], loss[1]);
    CHECK(kiln_load_model_dir_on(ck, KILN_N_DEVICES, &(kiln_llama *){NULL}) == KILN_ERR_INVALID &&
              strstr(kiln_last_error(), "cpu-isolated"),
          "an unknown device index is refused naming the devices: %s", kiln_last_error());
    kiln_batch_free(b);
    kiln_loader_close(ld);
}

static void bad_device(void) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK(c.device == KILN_DEVICE_CPU, "the default device is cpu");
    const kiln_setting *s = kiln_setting_find("device");
    CHECK(s && s->kind == KILN_SETTING_ENUM, "device is a setting");
    if (!s) return;
    CHECK_OK(kiln_setting_parse(s, "cpu-isolated", &c));
    CHECK(c.device == KILN_DEVICE_CPU_ISOLATED, "--device cpu-isolated");
    CHECK(kiln_setting_parse(s, "gpu", &c) != KILN_OK && strstr(kiln_last_error(), "cpu") &&
              strstr(kiln_last_error(), "cpu-isolated"),
          "an unknown device names the known ones: %s", kiln_last_error());
    char *js = kiln_train_config_to_json(&c);
    CHECK(js && strstr(js, "\"device\": \"cpu-isolated\""), "the device is saved in train_config.json");
    kiln_train_config d;
    kiln_train_config_default(&d);
    CHECK(js && !kiln_train_config_parse(js, "train_config.json", &d) && d.device == KILN_DEVICE_CPU_ISOLATED,
          "and read back");
    free(js);
    CHECK(!kiln_train_config_parse("{\"seed\": \"7\"}", "old.json", &d), "a train_config.json without a device loads");
}

/* ---- 2 ranks over MPI (this binary under mpirun: --mpi-child DIR) ---------- */
static int mpi_child(void) {
    CHECK_OK(kiln_dist_init(NULL, NULL));
    kiln_eager_enable();
    CHECK(kiln_dist_size() == 2, "2 ranks (%d)", kiln_dist_size());
    kiln_dist_set_bucket_bytes(256 << 10); /* several buckets on the tiny model */
    const run_kind *k[2] = {&kinds[0], &kinds[2]}; /* eager fp32, with and without LoRA */
    for (int i = 0; i < 2; i++)
        for (int d = 0; d < KILN_N_DEVICES; d++)
            for (int overlap = 1; overlap >= 0; overlap--) {
                if (!overlap && d == KILN_DEVICE_CPU) continue;
                char run[96];
                snprintf(run, sizeof run, "mpi_%s_%s%s", k[i]->name, dev_name(d), overlap ? "" : "_blocking");
                kiln_dist_set_overlap(overlap);
                recorder r;
                memset(&r, 0, sizeof r);
                train(k[i], d, run, false, -1, &r);
                CHECK(r.steps == STEPS, "%s: %d steps", run, r.steps);
            }
    kiln_dist_finalize();
    return t_fail ? 1 : 0;
}

static void mpi_runs(const char *argv0) {
    if (!kiln_dist_built() || system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("SKIP: %s; the 2-rank device checks did not run\n", kiln_dist_built() ? "no mpirun" : "built without MPI");
        return;
    }
    char self[1024], cmd[1600];
    if (!realpath(argv0, self)) snprintf(self, sizeof self, "%s", argv0);
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 timeout -k 5 300 mpirun --allow-run-as-root --oversubscribe -np 2 %s --mpi-child %s 2>&1",
             self, tmpdir);
    FILE *f = popen(cmd, "r");
    static char log[1 << 16];
    size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
    log[n] = 0;
    int rc = f ? pclose(f) : -1;
    CHECK(rc == 0, "2-rank runs on both devices (exit %d): %s", rc, log);
    for (int i = 0; i < 2; i++) {
        const run_kind *k = &kinds[i ? 2 : 0];
        char a[96], b[96], c[96];
        snprintf(a, sizeof a, "mpi_%s_cpu", k->name);
        snprintf(b, sizeof b, "mpi_%s_cpu-isolated", k->name);
        snprintf(c, sizeof c, "mpi_%s_cpu-isolated_blocking", k->name);
        compare_runs(k, a, b, "2 ranks, cpu vs cpu-isolated");
        compare_runs(k, a, c, "2 ranks, cpu vs cpu-isolated without overlap");
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--mpi-child")) {
        snprintf(tmpdir, sizeof tmpdir, "%s", argv[2]);
        return mpi_child();
    }
    kiln_eager_enable();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_device_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    test_write_shards(tmpdir, 6000, 1500, 11);
    bad_device();
    /* argv[1]: "mpi" (the 2-rank runs only), or the kinds whose name holds it; none: all */
    bool mpi = argc >= 2 && !strcmp(argv[1], "mpi");
    for (int i = 0; i < N_KINDS && !mpi; i++)
        if (argc < 2 || strstr(kinds[i].name, argv[1])) one_kind(&kinds[i]);
    if (argc < 2 || (!mpi && strstr(kinds[2].name, argv[1]))) load_generate_eval();
    if (argc < 2 || mpi) mpi_runs(argv[0]);
    CHECK(t_rmtree(tmpdir) == 0, "cleanup");
    TEST_END();
}
