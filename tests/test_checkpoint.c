/* Checkpoints: weights/optimiser/trainer-state round trips, refusal of bad
 * files, and the directory protocol under SIGKILL, a full disk and rotation. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"

#define CKPT_PREFIX_T "checkpoint-"

static char root[256];

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) {
    (void)s, (void)f, (void)w;
    return remove(p);
}
static void rmtree(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static const char *at(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

static kiln_llama_config tiny_cfg(bool tied) {
    kiln_llama_config c;
    kiln_llama_config_default(&c);
    c.vocab_size = 61, c.hidden_size = 48, c.intermediate_size = 80, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 12, c.max_position_embeddings = 64;
    c.tie_word_embeddings = tied;
    return c;
}

static bool same_params(const kiln_llama *a, const kiln_llama *b) {
    if (a->n_params != b->n_params) return false;
    for (int i = 0; i < a->n_params; i++) {
        if (strcmp(a->params[i]->name, b->params[i]->name) || !kiln_tensor_same_shape(a->params[i], b->params[i]) ||
            memcmp(a->params[i]->data, b->params[i]->data, kiln_tensor_nbytes(a->params[i])))
            return false;
    }
    return true;
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static kiln_tensor *forward(kiln_llama *m) {
    int64_t shape[2] = {2, 7};
    kiln_tensor *ids = kiln_tensor_new(KILN_I32, 2, shape);
    for (int i = 0; i < 14; i++) kiln_i32(ids)[i] = (i * 17 + 3) % (int)m->cfg.vocab_size;
    kiln_tensor *y = kiln_llama_forward(m, ids, NULL, NULL);
    kiln_tensor_release(ids);
    return y;
}

static void test_weights_round_trip(bool tied) {
    kiln_llama_config c = tiny_cfg(tied);
    kiln_llama *a = kiln_llama_new(&c, 11), *b = kiln_llama_new(&c, 12);
    CHECK(!same_params(a, b), "different seeds should give different weights");
    CHECK_OK(kiln_save_weights(at("w.safetensors"), a));
    CHECK_OK(kiln_load_weights(at("w.safetensors"), b));
    CHECK(same_params(a, b), "parameters differ after save/load (tied=%d)", tied);
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(at("w.safetensors"), &f));
    if (f) {
        const char *fmt = kiln_st_metadata(f, "format");
        CHECK(fmt && !strcmp(fmt, "pt"), "metadata format should be pt");
        CHECK(kiln_st_count(f) == a->n_params, "%d tensors, expected %d", kiln_st_count(f), a->n_params);
        CHECK((kiln_st_find(f, "lm_head.weight") != NULL) == !tied, "lm_head.weight present iff untied");
        CHECK(kiln_st_find(f, "model.embed_tokens.weight") != NULL, "embed_tokens missing");
    }
    kiln_st_close(f);
    kiln_tensor *ya = forward(a), *yb = forward(b);
    CHECK(ya && yb && !memcmp(ya->data, yb->data, kiln_tensor_nbytes(ya)), "logits differ after reload");
    kiln_tensor_release(ya);
    kiln_tensor_release(yb);

    /* through a model directory */
    mkdir(at("mdir"), 0777);
    CHECK_OK(kiln_llama_config_save(at("mdir/config.json"), &c));
    CHECK_OK(kiln_save_weights(at("mdir/model.safetensors"), a));
    kiln_llama *d = NULL;
    CHECK_OK(kiln_load_model_dir(at("mdir"), &d));
    CHECK(d && same_params(a, d), "kiln_load_model_dir gives different weights");
    kiln_llama_free(d);
    kiln_llama_free(a);
    kiln_llama_free(b);
}

/* BF16 files load (rounded); a tied model ignores an extra lm_head.weight. */
static void test_bf16_and_tied_head(void) {
    kiln_llama_config c = tiny_cfg(true);
    kiln_llama *a = kiln_llama_new(&c, 5), *b = kiln_llama_new(&c, 6);
    int n = a->n_params;
    kiln_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    uint16_t **bufs = calloc((size_t)n, sizeof *bufs);
    for (int i = 0; i < n; i++) {
        kiln_tensor *p = a->params[i];
        int64_t k = kiln_tensor_numel(p);
        bufs[i] = malloc((size_t)k * 2);
        for (int64_t j = 0; j < k; j++) bufs[i][j] = kiln_f32_to_bf16(kiln_f32(p)[j]);
        ts[i] = (kiln_st_tensor){.name = p->name, .dtype = KILN_BF16, .ndim = p->ndim, .bytes = bufs[i],
                                 .nbytes = (size_t)k * 2};
        memcpy(ts[i].shape, p->shape, sizeof ts[i].shape);
    }
    ts[n] = (kiln_st_tensor){.name = "lm_head.weight", .dtype = KILN_BF16, .ndim = 2,
                             .shape = {c.vocab_size, c.hidden_size}, .bytes = bufs[0], .nbytes = ts[0].nbytes};
    CHECK_OK(kiln_st_save(at("bf16.safetensors"), ts, n + 1, NULL));
    CHECK_OK(kiln_load_weights(at("bf16.safetensors"), b));
    bool ok = true;
    for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < kiln_tensor_numel(b->params[i]); j++)
            ok &= kiln_f32(b->params[i])[j] == kiln_bf16_to_f32(bufs[i][j]);
    CHECK(ok, "BF16 weights not converted exactly");
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(ts);
    kiln_llama_free(a);
    kiln_llama_free(b);
}

/* Saves the model's tensors with one of them altered (or dropped / added). */
typedef enum { ALT_SHAPE, ALT_DTYPE, ALT_DROP, ALT_EXTRA } alteration;
static void save_altered(const char *path, const kiln_llama *m, const char *victim, alteration alt) {
    int n = m->n_params;
    kiln_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    int k = 0;
    for (int i = 0; i < n; i++) {
        kiln_tensor *p = m->params[i];
        kiln_st_tensor t = {.name = p->name, .dtype = p->dtype, .ndim = p->ndim, .bytes = p->data,
                            .nbytes = kiln_tensor_nbytes(p)};
        memcpy(t.shape, p->shape, sizeof t.shape);
        if (!strcmp(p->name, victim)) {
            if (alt == ALT_DROP) continue;
            if (alt == ALT_SHAPE) t.shape[0] -= 1, t.nbytes = (size_t)(t.shape[0] * t.shape[1]) * 4;
            if (alt == ALT_DTYPE) t.dtype = KILN_I32;
        }
        ts[k++] = t;
    }
    if (alt == ALT_EXTRA) ts[k++] = (kiln_st_tensor){.name = victim, .dtype = KILN_F32, .ndim = 1, .shape = {4},
                                                     .bytes = m->params[0]->data, .nbytes = 16};
    CHECK_OK(kiln_st_save(path, ts, k, NULL));
    free(ts);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static void expect_refused(kiln_llama *m, const char *path, const char *what, const char *tensor) {
    kiln_llama_config c = m->cfg;
    kiln_llama *before = kiln_llama_new(&c, 0);
    for (int i = 0; i < m->n_params; i++) memcpy(before->params[i]->data, m->params[i]->data, kiln_tensor_nbytes(m->params[i]));
    kiln_status st = kiln_load_weights(path, m);
    const char *msg = kiln_last_error();
    CHECK(st != KILN_OK, "%s: loading should fail", what);
    CHECK(contains(msg, path), "%s: message should name the file: %s", what, msg);
    CHECK(!tensor || contains(msg, tensor), "%s: message should name tensor %s: %s", what, tensor, msg);
    CHECK(same_params(m, before), "%s: a refused load must leave the model unchanged", what);
    printf("  refused (%s): %s\n", what, msg);
    kiln_llama_free(before);
}

static void test_bad_files(void) {
    kiln_llama_config c = tiny_cfg(false);
    kiln_llama *m = kiln_llama_new(&c, 3);
    const char *q = "model.layers.1.self_attn.q_proj.weight";
    const char *p = at("bad.safetensors");
    save_altered(p, m, q, ALT_SHAPE);
    expect_refused(m, p, "shape mismatch", q);
    CHECK(contains(kiln_last_error(), "[47, 48]") && contains(kiln_last_error(), "[48, 48]"), "both shapes: %s",
          kiln_last_error());
    save_altered(p, m, q, ALT_DTYPE);
    expect_refused(m, p, "wrong dtype", q);
    save_altered(p, m, "model.norm.weight", ALT_DROP);
    expect_refused(m, p, "missing tensor", "model.norm.weight");
    save_altered(p, m, "model.layers.9.mlp.up_proj.weight", ALT_EXTRA);
    expect_refused(m, p, "extra tensor", "model.layers.9.mlp.up_proj.weight");

    /* a valid file with its header length or offsets corrupted */
    CHECK_OK(kiln_save_weights(p, m));
    char *data = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(p, &data, &n));
    unsigned char bad_len[8] = {0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0};
    memcpy(data, bad_len, 8);
    write_bytes(p, data, n);
    expect_refused(m, p, "bad header length", NULL);
    write_bytes(p, data, 5);
    expect_refused(m, p, "truncated to 5 bytes", NULL);
    free(data);

    const char *hdr = "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[48],\"data_offsets\":[0,192000]}}";
    size_t hl = strlen(hdr);
    unsigned char *buf = calloc(1, 8 + hl + 192);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    write_bytes(p, buf, 8 + hl + 192);
    expect_refused(m, p, "offsets out of range", "model.norm.weight");
    free(buf);

    /* truncated data: the header claims more than the file holds */
    CHECK_OK(kiln_save_weights(p, m));
    CHECK_OK(kiln_read_file(p, &data, &n));
    write_bytes(p, data, n - 100);
    expect_refused(m, p, "truncated data", NULL);
    free(data);
    kiln_llama_free(m);
}

static void test_optimizer_and_state(void) {
    kiln_llama_config c = tiny_cfg(true);
    kiln_train_config tc;
    kiln_train_config_default(&tc);
    kiln_llama *m = kiln_llama_new(&c, 1);
    kiln_llama_set_trainable(m, "model.layers.0.*", false); /* frozen: no state */
    kiln_adamw *a = kiln_adamw_new(m, &tc), *b = kiln_adamw_new(m, &tc);
    CHECK(a && b && a->n == m->n_params - 9, "optimiser over trainable params: %d", a ? a->n : -1);
    if (!a || !b) return;
    kiln_rng rng = {42, 0};
    for (int i = 0; i < a->n; i++) {
        kiln_rng_normal(&rng, kiln_f32(a->m[i]), kiln_tensor_numel(a->m[i]), 0, 1);
        kiln_rng_uniform(&rng, kiln_f32(a->v[i]), kiln_tensor_numel(a->v[i]), 0, 1);
    }
    a->t = 123456789012345;
    CHECK_OK(kiln_adamw_save(at("opt.safetensors"), a));
    CHECK_OK(kiln_adamw_load(at("opt.safetensors"), b));
    CHECK(b->t == a->t, "t %lld != %lld", (long long)b->t, (long long)a->t);
    bool same = true;
    for (int i = 0; i < a->n; i++)
        same &= !memcmp(a->m[i]->data, b->m[i]->data, kiln_tensor_nbytes(a->m[i])) &&
                !memcmp(a->v[i]->data, b->v[i]->data, kiln_tensor_nbytes(a->v[i]));
    CHECK(same, "optimiser moments differ after reload");
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(at("opt.safetensors"), &f));
    if (f) {
        CHECK(kiln_st_find(f, "exp_avg.model.norm.weight") && kiln_st_find(f, "exp_avg_sq.model.embed_tokens.weight"),
              "HF-style state names");
        const char *s = kiln_st_metadata(f, "step");
        CHECK(s && !strcmp(s, "123456789012345"), "step metadata: %s", s ? s : "(none)");
    }
    kiln_st_close(f);

    /* a model with a different set of trainable parameters is refused */
    kiln_llama_set_trainable(m, "*", true);
    kiln_adamw *all = kiln_adamw_new(m, &tc);
    CHECK(kiln_adamw_load(at("opt.safetensors"), all) != KILN_OK &&
              contains(kiln_last_error(), "exp_avg.model.layers.0"),
          "missing moments should be named: %s", kiln_last_error());
    kiln_adamw_free(all);
    kiln_llama_set_trainable(m, "model.layers.*", false);
    kiln_adamw *fewer = kiln_adamw_new(m, &tc);
    CHECK(kiln_adamw_load(at("opt.safetensors"), fewer) != KILN_OK && contains(kiln_last_error(), "unexpected"),
          "extra moments should be refused: %s", kiln_last_error());
    kiln_adamw_free(fewer);
    kiln_adamw_free(a);
    kiln_adamw_free(b);
    kiln_llama_free(m);

    kiln_trainer_state s = {.step = 77, .total_steps = 1000, .steps_per_epoch = 333, .micro_per_epoch = 1332,
                            .epoch = 2, .tokens_seen = 9007199254740993LL, .elapsed_s = 0.1 + 0.2,
                            .last_loss = 3.14159265358979311, .last_val_loss = 1e-300, .seed = UINT64_MAX - 2};
    kiln_trainer_state r;
    memset(&r, 0xab, sizeof r);
    CHECK_OK(kiln_trainer_state_save(at("ts.json"), &s));
    CHECK_OK(kiln_trainer_state_load(at("ts.json"), &r));
    CHECK(!memcmp(&s, &r, sizeof s), "trainer state differs after round trip");
    s.last_val_loss = NAN;
    s.last_loss = -INFINITY;
    CHECK_OK(kiln_trainer_state_save(at("ts.json"), &s));
    CHECK_OK(kiln_trainer_state_load(at("ts.json"), &r));
    CHECK(isnan(r.last_val_loss) && isinf(r.last_loss) && r.last_loss < 0, "non-finite values round trip");
    write_bytes(at("ts.json"), "{\"step\": 1}", 11);
    CHECK(kiln_trainer_state_load(at("ts.json"), &r) != KILN_OK && contains(kiln_last_error(), "ts.json"),
          "incomplete state refused: %s", kiln_last_error());
}

static kiln_trainer_state state_at(int64_t step) {
    return (kiln_trainer_state){.step = step, .total_steps = 100, .seed = 7, .last_loss = 1.0 / (double)(step + 1)};
}

static bool dir_exists(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

/* Loads the model at run_dir/<link> through the symlink and config. */
static bool latest_equals(const char *run, const kiln_llama *want, int64_t want_step) {
    char dir[512];
    if (kiln_checkpoint_latest(run, dir, sizeof dir)) return false;
    kiln_llama *m = NULL;
    kiln_trainer_state s;
    char ts[600];
    snprintf(ts, sizeof ts, "%s/trainer_state.json", dir);
    bool ok = !kiln_load_model_dir(dir, &m) && same_params(m, want) && !kiln_trainer_state_load(ts, &s) &&
              s.step == want_step;
    kiln_llama_free(m);
    return ok;
}

static void test_rotation(void) {
    const char *run = at("rot/run"); /* created by the save, parents included */
    kiln_llama_config c = tiny_cfg(false);
    kiln_llama *m = kiln_llama_new(&c, 1);
    kiln_train_config tc;
    kiln_train_config_default(&tc);
    write_bytes(at("tok.json"), "{\"model\": {}}", 13);
    snprintf(tc.tokenizer, sizeof tc.tokenizer, "%s", at("tok.json"));
    kiln_adamw *o = kiln_adamw_new(m, &tc);
    for (int64_t step = 1; step <= 5; step++) {
        kiln_f32(m->norm)[0] = (float)step;
        kiln_trainer_state s = state_at(step);
        o->t = step;
        CHECK_OK(kiln_checkpoint_save(run, m, o, &s, &tc, 2));
    }
    char latest[512], want[512], link[512];
    CHECK_OK(kiln_checkpoint_latest(run, latest, sizeof latest));
    snprintf(want, sizeof want, "%s/checkpoint-00000005", run);
    CHECK(!strcmp(latest, want), "latest %s", latest);
    for (int step = 1; step <= 5; step++) {
        snprintf(want, sizeof want, "%s/checkpoint-%08d", run, step);
        CHECK(dir_exists(want) == (step >= 4), "after keep=2, %s exists=%d", want, dir_exists(want));
    }
    static const char *links[] = {"model.safetensors", "config.json", "tokenizer.json", "trainer_state.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(link, sizeof link, "%s/%s", run, links[i]);
        char target[512] = {0};
        ssize_t k = readlink(link, target, sizeof target - 1);
        snprintf(want, sizeof want, "checkpoint-00000005/%s", links[i]);
        CHECK(k > 0 && !strcmp(target, want), "%s -> %s", link, k > 0 ? target : "(none)");
    }
    /* the files inside, and the run dir used as a model dir through its links */
    kiln_llama *back = NULL;
    CHECK_OK(kiln_load_model_dir(run, &back));
    CHECK(back && same_params(back, m), "run_dir links load the newest model");
    kiln_llama_free(back);
    snprintf(want, sizeof want, "%s/checkpoint-00000005/train_config.json", run);
    CHECK(access(want, F_OK) == 0, "train_config.json written");
    kiln_adamw *o2 = kiln_adamw_new(m, &tc);
    snprintf(want, sizeof want, "%s/checkpoint-00000005/optimizer.safetensors", run);
    CHECK_OK(kiln_adamw_load(want, o2));
    CHECK(o2 && o2->t == 5, "optimizer step restored");
    kiln_adamw_free(o2);

    /* the same step saved again replaces its directory; leftovers are ignored */
    kiln_f32(m->norm)[0] = 55.0f;
    kiln_trainer_state s = state_at(5);
    CHECK_OK(kiln_checkpoint_save(run, m, o, &s, &tc, 2));
    CHECK(latest_equals(run, m, 5), "re-saved step 5 holds the new weights");
    snprintf(want, sizeof want, "%s/checkpoint-00000009.tmp", run);
    mkdir(want, 0777);
    snprintf(want, sizeof want, "%s/checkpoint-00000008", run); /* incomplete: no trainer_state.json */
    mkdir(want, 0777);
    CHECK_OK(kiln_checkpoint_latest(run, latest, sizeof latest));
    CHECK(contains(latest, "checkpoint-00000005"), "latest ignores .tmp and incomplete dirs: %s", latest);
    CHECK(kiln_checkpoint_latest(at("rot"), latest, sizeof latest) != KILN_OK && contains(kiln_last_error(), "rot"),
          "no checkpoint: error names the dir: %s", kiln_last_error());
    kiln_adamw_free(o);
    kiln_llama_free(m);
}

static int count_entries(const char *dir, const char *skip_prefix, char *first, size_t n) {
    DIR *d = opendir(dir);
    int k = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (skip_prefix && !strncmp(e->d_name, skip_prefix, strlen(skip_prefix))) continue;
        if (!k && first) snprintf(first, n, "%s", e->d_name);
        k++;
    }
    closedir(d);
    return k;
}

/* pid of a process that has exited (for names of temporaries left by it) */
static long dead_pid(void) {
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return (long)p;
}

/* Checkpoints that lost files (a rotation by an older kiln killed halfway,
 * a truncated file) are not complete: they are neither listed as the
 * newest nor resolved for eval, and the next rotation removes them. */
static void test_partial_checkpoints(void) {
    const char *run = at("partial");
    kiln_llama_config c = tiny_cfg(false);
    kiln_llama *m = kiln_llama_new(&c, 1);
    kiln_train_config tc;
    kiln_train_config_default(&tc);
    kiln_adamw *o = kiln_adamw_new(m, &tc);
    kiln_llama *models[4];
    for (int64_t step = 1; step <= 3; step++) {
        models[step] = kiln_llama_new(&c, (uint64_t)(100 + step));
        kiln_trainer_state s = state_at(step);
        CHECK_OK(kiln_checkpoint_save(run, models[step], o, &s, &tc, 0));
    }
    char dir[512], p[600];
    CHECK(latest_equals(run, models[3], 3), "step 3 is the newest");
    /* step 1 half deleted by an older rotation: marker left, weights gone */
    snprintf(p, sizeof p, "%s/checkpoint-00000001/model.safetensors", run);
    unlink(p);
    snprintf(p, sizeof p, "%s/checkpoint-00000001/optimizer.safetensors", run);
    unlink(p);
    /* step 3: its optimiser file lost its tail */
    snprintf(p, sizeof p, "%s/checkpoint-00000003/optimizer.safetensors", run);
    CHECK(truncate(p, 100) == 0, "truncate %s", p);
    CHECK(latest_equals(run, models[2], 2), "a truncated newest checkpoint is passed over for step 2");
    CHECK_OK(kiln_model_dir_resolve(run, dir, sizeof dir));
    CHECK(contains(dir, "checkpoint-00000002"), "resolve gives step 2: %s", dir);
    /* step 2 loses its model file too: nothing complete is left */
    snprintf(p, sizeof p, "%s/checkpoint-00000002/model.safetensors", run);
    char *keep = NULL;
    size_t keep_n = 0;
    CHECK_OK(kiln_read_file(p, &keep, &keep_n));
    unlink(p);
    CHECK(kiln_checkpoint_latest(run, dir, sizeof dir) != KILN_OK && contains(kiln_last_error(), "no complete"),
          "no complete checkpoint: %s", kiln_last_error());
    CHECK(kiln_model_dir_resolve(run, dir, sizeof dir) != KILN_OK, "a run dir without a complete checkpoint is no model dir");
    CHECK_OK(kiln_write_file_atomic(p, keep, keep_n));
    free(keep);
    /* a marker written before the file list (older kiln) still needs the model */
    kiln_trainer_state s1 = state_at(1);
    snprintf(p, sizeof p, "%s/checkpoint-00000001/trainer_state.json", run);
    CHECK_OK(kiln_trainer_state_save(p, &s1));
    CHECK(latest_equals(run, models[2], 2), "legacy marker without model.safetensors is incomplete");
    /* a save with --keep 1 removes the partial ones older than itself */
    kiln_trainer_state s4 = state_at(4);
    CHECK_OK(kiln_checkpoint_save(run, m, o, &s4, &tc, 1));
    for (int step = 1; step <= 4; step++) {
        snprintf(p, sizeof p, "%s/checkpoint-%08d", run, step);
        CHECK(dir_exists(p) == (step == 4), "after keep=1: %s exists=%d", p, dir_exists(p));
    }
    CHECK(latest_equals(run, m, 4), "step 4 loads");
    /* the model directory case: a directory of weights, no checkpoints */
    CHECK_OK(kiln_model_dir_resolve(at("mdir"), dir, sizeof dir));
    CHECK(!strcmp(dir, at("mdir")), "a model dir resolves to itself: %s", dir);
    kiln_adamw_free(o);
    for (int i = 1; i <= 3; i++) kiln_llama_free(models[i]);
    kiln_llama_free(m);
}

/* Temporaries a killed save leaves (link temporaries, moved-aside and
 * half-written directories, file temporaries) go at the next save, except
 * those of a process still running. eval resolves the newest complete
 * checkpoint even when the run dir's links lag behind. */
static void test_strays_and_resolve(void) {
    const char *run = at("strays");
    kiln_llama_config c = tiny_cfg(false);
    kiln_llama *m1 = kiln_llama_new(&c, 1), *m2 = kiln_llama_new(&c, 2);
    kiln_trainer_state s1 = state_at(1), s2 = state_at(2);
    CHECK_OK(kiln_checkpoint_save(run, m1, NULL, &s1, NULL, 0));
    long dead = dead_pid(), live = (long)getppid();
    char p[600];
    const char *strays[] = {".config.json.link.%ld", ".model.safetensors.link.%ld", ".trainer_state.json.link.%ld"};
    for (int i = 0; i < 3; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, strays[i], dead);
        snprintf(p, sizeof p, "%s/%s", run, nm);
        CHECK(symlink("checkpoint-00000001/config.json", p) == 0, "symlink %s", p);
    }
    snprintf(p, sizeof p, "%s/.config.json.link.%ld", run, live);
    CHECK(symlink("checkpoint-00000001/config.json", p) == 0, "symlink %s", p);
    snprintf(p, sizeof p, "%s/checkpoint-00000007.tmp", run);
    mkdir(p, 0777);
    snprintf(p, sizeof p, "%s/checkpoint-00000007.tmp/model.safetensors", run);
    write_bytes(p, "partial", 7);
    snprintf(p, sizeof p, "%s/checkpoint-00000001.old.%ld", run, dead);
    mkdir(p, 0777);
    snprintf(p, sizeof p, "%s/.checkpoint-00000000.del.%ld", run, dead);
    mkdir(p, 0777);
    snprintf(p, sizeof p, "%s/train_config.json.tmp.%ld", run, dead);
    write_bytes(p, "{", 1);
    CHECK_OK(kiln_checkpoint_save(run, m2, NULL, &s2, NULL, 0));
    char first[256] = "";
    int left = count_entries(run, CKPT_PREFIX_T, first, sizeof first);
    /* the 5 links of a save without tokenizer (model, config, trainer state,
     * generation and tokenizer config), plus the live process's temporary */
    CHECK(left == 6, "%d entries besides checkpoints left in %s (first: %s)", left, run, first);
    snprintf(p, sizeof p, "%s/.config.json.link.%ld", run, live);
    struct stat sb;
    CHECK(lstat(p, &sb) == 0, "the temporary of a running process was removed");
    unlink(p);
    snprintf(p, sizeof p, "%s/checkpoint-00000007.tmp", run);
    CHECK(!dir_exists(p), "half-written %s left", p);

    /* links that lag (a kill after the rename, before the links moved) */
    snprintf(p, sizeof p, "%s/model.safetensors", run);
    unlink(p);
    CHECK(symlink("checkpoint-00000001/model.safetensors", p) == 0, "re-point %s", p);
    char dir[512];
    CHECK_OK(kiln_model_dir_resolve(run, dir, sizeof dir));
    CHECK(contains(dir, "checkpoint-00000002"), "eval resolves the newest complete checkpoint, not the links: %s", dir);
    kiln_llama *back = NULL;
    CHECK_OK(kiln_load_model_dir(dir, &back));
    CHECK(back && same_params(back, m2), "resolved checkpoint holds step 2's weights");
    kiln_llama_free(back);
    kiln_llama_free(m1);
    kiln_llama_free(m2);
}

/* A child saving step 2 of a big model is killed at various moments; the
 * newest complete checkpoint is always step 1 or a whole step 2. */
static void test_sigkill(void) {
    const char *run = at("kill");
    kiln_llama_config c1 = tiny_cfg(false), c2;
    kiln_llama *small = kiln_llama_new(&c1, 1), *old2 = kiln_llama_new(&c1, 3);
    kiln_trainer_state s1 = state_at(1), s2 = state_at(2);
    CHECK_OK(kiln_checkpoint_save(run, small, NULL, &s1, NULL, 0));
    CHECK_OK(kiln_llama_config_preset("tiny", &c2)); /* ~2.6M params, 10 MB of weights */
    c2.vocab_size = 16384;
    kiln_llama *big = kiln_llama_new(&c2, 2);
    int saw_step2 = 0, saw_step1 = 0, saw_new = 0, bad = 0;
    const int delays_us[] = {500, 2000, 5000, 10000, 20000, 40000, 80000, 3000, 15000, 60000};
    for (int i = 0; i < (int)(sizeof delays_us / sizeof delays_us[0]); i++) {
        /* half the runs write step 2 afresh, half overwrite an existing step 2
         * of another model (a mix of the two would not load) */
        char d2[512];
        snprintf(d2, sizeof d2, "%s/checkpoint-00000002", run);
        rmtree(d2);
        CHECK_OK(kiln_checkpoint_save(run, i % 2 ? old2 : small, NULL, i % 2 ? &s2 : &s1, NULL, 0));
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            for (int k = 0; k < 50; k++) kiln_checkpoint_save(run, big, NULL, &s2, NULL, 0);
            _exit(0);
        }
        usleep((useconds_t)delays_us[i]);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        char dir[512];
        CHECK_OK(kiln_checkpoint_latest(run, dir, sizeof dir));
        bool is2 = contains(dir, "checkpoint-00000002");
        bool ok = is2 ? latest_equals(run, big, 2) || (i % 2 && latest_equals(run, old2, 2)) : latest_equals(run, small, 1);
        CHECK(ok, "after SIGKILL at %d us, %s does not load as a complete checkpoint: %s", delays_us[i], dir,
              kiln_last_error());
        bad += !ok;
        saw_step2 += is2;
        saw_new += is2 && latest_equals(run, big, 2);
        saw_step1 += !is2;
        /* whatever the links point to must be a whole file */
        kiln_st_file *f = NULL;
        char link[512];
        snprintf(link, sizeof link, "%s/model.safetensors", run);
        CHECK(kiln_st_open(link, &f) == KILN_OK, "run_dir/model.safetensors unreadable: %s", kiln_last_error());
        kiln_st_close(f);
    }
    printf("  SIGKILL: latest was step 1 %d times, step 2 %d times (%d the new one), %d bad\n", saw_step1, saw_step2,
           saw_new, bad);

    /* killed while rotating (--keep 1, each save deletes the one before):
     * whatever is listed as the newest checkpoint loads whole */
    const char *rrun = at("killrot");
    int64_t base = 0;
    bad = 0;
    for (int i = 0; i < (int)(sizeof delays_us / sizeof delays_us[0]); i += 2) {
        kiln_trainer_state s0 = state_at(base + 1);
        CHECK_OK(kiln_checkpoint_save(rrun, big, NULL, &s0, NULL, 1));
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            for (int k = 2; k < 200; k++) {
                kiln_trainer_state sk = state_at(base + k);
                kiln_checkpoint_save(rrun, big, NULL, &sk, NULL, 1);
            }
            _exit(0);
        }
        usleep((useconds_t)delays_us[i] * 4);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        char dir[512], ts[600];
        kiln_llama *back = NULL;
        kiln_trainer_state got;
        bool ok = !kiln_checkpoint_latest(rrun, dir, sizeof dir) && !kiln_load_model_dir(dir, &back) &&
                  same_params(back, big) && snprintf(ts, sizeof ts, "%s/trainer_state.json", dir) > 0 &&
                  !kiln_trainer_state_load(ts, &got);
        CHECK(ok, "killed rotation at %d us: newest %s does not load: %s", delays_us[i] * 4, dir, kiln_last_error());
        bad += !ok;
        kiln_llama_free(back);
        base += 1000;
    }
    /* one more save cleans whatever the kills left: only checkpoint
     * directories and the run's links remain */
    kiln_trainer_state sz = state_at(base + 1);
    CHECK_OK(kiln_checkpoint_save(rrun, big, NULL, &sz, NULL, 1));
    char first[256] = "";
    int left = count_entries(rrun, CKPT_PREFIX_T, first, sizeof first);
    int ck = count_entries(rrun, NULL, NULL, 0) - left;
    CHECK(left == 5 && ck == 1, "after killed rotations and one save: %d checkpoints, %d other entries (%s)", ck, left,
          first);
    printf("  SIGKILL during rotation: %d bad\n", bad);
    kiln_llama_free(big);
    kiln_llama_free(small);
    kiln_llama_free(old2);
}

/* A save that hits the file size limit fails cleanly, naming the file, and
 * leaves the previous checkpoint and links as they were. */
static void test_disk_full(void) {
    const char *run = at("full");
    kiln_llama_config c = tiny_cfg(false);
    kiln_llama *m = kiln_llama_new(&c, 1), *m2 = kiln_llama_new(&c, 2);
    kiln_train_config tc;
    kiln_train_config_default(&tc);
    kiln_adamw *o = kiln_adamw_new(m2, &tc);
    kiln_trainer_state s1 = state_at(1), s2 = state_at(2);
    CHECK_OK(kiln_checkpoint_save(run, m, NULL, &s1, NULL, 0));
    size_t model_bytes = (size_t)kiln_llama_num_params(m) * 4;
    /* limit below the model file, then between the model and the optimiser file */
    const rlim_t limits[2] = {model_bytes / 2, model_bytes + model_bytes / 2};
    const char *culprit[2] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {limits[i], limits[i]};
            setrlimit(RLIMIT_FSIZE, &rl);
            kiln_status st = kiln_checkpoint_save(run, m2, o, &s2, NULL, 1);
            if (st == KILN_OK) _exit(2);
            fprintf(stderr, "  disk full (%s): %s\n", culprit[i], kiln_last_error());
            _exit(strstr(kiln_last_error(), culprit[i]) ? 0 : 3);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d (2: save succeeded, 3: message)",
              status);
        CHECK(latest_equals(run, m, 1), "previous checkpoint no longer loads bit-identically");
        char p[512];
        snprintf(p, sizeof p, "%s/checkpoint-00000002.tmp", run);
        CHECK(!dir_exists(p), "failed save left %s", p);
        snprintf(p, sizeof p, "%s/checkpoint-00000002", run);
        CHECK(!dir_exists(p), "failed save produced %s", p);
        kiln_llama *via_link = NULL;
        CHECK_OK(kiln_load_model_dir(run, &via_link));
        CHECK(via_link && same_params(via_link, m), "links still point at step 1");
        kiln_llama_free(via_link);
    }
    kiln_adamw_free(o);
    kiln_llama_free(m);
    kiln_llama_free(m2);
}

int main(void) {
    kiln_log_set_level(KILN_LOG_ERROR);
    snprintf(root, sizeof root, "/tmp/kiln_test_checkpoint_%d", (int)getpid());
    rmtree(root);
    mkdir(root, 0777);
    double t0 = kiln_time_now();
    test_weights_round_trip(false);
    test_weights_round_trip(true);
    test_bf16_and_tied_head();
    test_bad_files();
    test_optimizer_and_state();
    test_rotation();
    test_partial_checkpoints();
    test_strays_and_resolve();
    test_disk_full();
    test_sigkill();
    printf("  %.2f s\n", kiln_time_now() - t0);
    rmtree(root);
    TEST_END();
}
