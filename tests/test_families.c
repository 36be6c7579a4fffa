/* The model families of config.json against PyTorch fixtures written with
 * Hugging Face's semantics for each (tests/reference/make_family_fixtures.py):
 * Llama with llama3 rope scaling, biases and a decoupled head_dim, Llama
 * with linear rope scaling, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k
 * norms, decoupled head_dim). Logits, loss and every gradient to 1e-4,
 * eager and compiled; the checkpoint kiln writes is read back by the
 * reference (python3 with torch, skipped with a line without it); every
 * refusal names the file, the field and the value. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/model.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"

#define FIX "tests/fixtures/"

static const char *const families[] = {"llama3", "linear", "mistral", "qwen2", "qwen3", "mistral_swa", "qwen2_swa", "gemma2", "gemma3"};
static const char *const model_types[] = {"llama", "llama", "mistral", "qwen2", "qwen3", "mistral", "qwen2", "gemma2", "gemma3"};
#define N_FAMILIES (int)(sizeof families / sizeof families[0])
static char tmpdir[64];
static bool have_torch;
/* the checkpoints the PyTorch reference reads back at the end */
static struct {
    const char *name;
    kiln_family family;
    char dir[160];
} saved[N_FAMILIES];
static int n_saved;

static kiln_tensor *wrap_st(const kiln_st_tensor *t) {
    return kiln_tensor_wrap((void *)t->bytes, t->dtype, t->ndim, t->shape);
}

/* max |a-b| / max |b| */
/* worst gradient error over the parameters, against grad.<name> */
static double grads_err(const char *name, const char *how, kiln_llama *m, kiln_st_file *f) {
    double worst = 0;
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *p = m->params[i];
        char gname[160];
        snprintf(gname, sizeof gname, "grad.%s", p->name);
        const kiln_st_tensor *g = kiln_st_find(f, gname);
        CHECK(g && p->grad, "%s %s: gradient of %s missing", name, how, p->name);
        if (!g || !p->grad) continue;
        double e = rel_err(kiln_f32(p->grad), g->bytes, kiln_tensor_numel(p));
        CHECK(e < 1e-4, "%s %s: gradient of %s differs from PyTorch by %.3g", name, how, p->name, e);
        worst = fmax(worst, e);
    }
    return worst;
}

/* One plain gradient step (w -= 0.5 g) so the saved weights are kiln's own,
 * not the fixture's; then saves the model as a checkpoint directory
 * (config.json + model.safetensors) with kiln's logits on the fixture batch
 * beside it, reads it back with kiln, and has the reference read it as
 * Hugging Face would and reproduce those logits. */
static void save_and_read_back(const char *name, kiln_llama *m, kiln_tensor *ids, kiln_tensor *mask) {
    char dir[160], path[200];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    mkdir(dir, 0755);
    for (int i = 0; i < m->n_params; i++)
        for (int64_t j = 0; m->params[i]->grad && j < kiln_tensor_numel(m->params[i]); j++)
            kiln_f32(m->params[i])[j] -= 0.5f * kiln_f32(m->params[i]->grad)[j];
    kiln_tensor *logits = kiln_llama_forward(m, ids, mask, NULL);
    CHECK(logits != NULL, "%s: forward after the step: %s", name, kiln_last_error());
    if (!logits) return;
    kiln_st_tensor lt = {.name = "logits", .dtype = KILN_F32, .ndim = logits->ndim, .bytes = logits->data,
                         .nbytes = kiln_tensor_nbytes(logits)};
    memcpy(lt.shape, logits->shape, sizeof lt.shape);
    snprintf(path, sizeof path, "%s/kiln_logits.safetensors", dir);
    CHECK_OK(kiln_st_save(path, &lt, 1, NULL));
    kiln_tensor_release(logits);
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK_OK(kiln_llama_config_save(path, &m->cfg));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(kiln_save_weights(path, m));
    kiln_llama *back = NULL;
    CHECK_OK(kiln_load_model_dir(dir, &back));
    if (back) {
        CHECK(kiln_llama_config_equal(&back->cfg, &m->cfg), "%s: config.json round trip keeps every field", name);
        bool same = back->n_params == m->n_params;
        for (int i = 0; same && i < m->n_params; i++)
            same = !strcmp(back->params[i]->name, m->params[i]->name) &&
                   !memcmp(back->params[i]->data, m->params[i]->data, kiln_tensor_nbytes(m->params[i]));
        CHECK(same, "%s: weights read back identical", name);
    }
    kiln_llama_free(back);
    if (!have_torch || n_saved >= N_FAMILIES) return;
    saved[n_saved].name = name, saved[n_saved].family = m->cfg.family;
    snprintf(saved[n_saved++].dir, sizeof saved[0].dir, "%s", dir);
}

/* The reference reads every checkpoint save_and_read_back wrote, in one
 * python3 (importing torch takes seconds): a "check NAME: passed" line each. */
static void torch_read_back(void) {
    if (!have_torch || !n_saved) return;
    char cmd[2048], out[128];
    snprintf(out, sizeof out, "%s/torch_check.txt", tmpdir);
    int k = snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/make_family_fixtures.py --check");
    for (int i = 0; i < n_saved; i++) k += snprintf(cmd + k, sizeof cmd - (size_t)k, " %s %s", saved[i].dir, saved[i].name);
    snprintf(cmd + k, sizeof cmd - (size_t)k, " >%s 2>&1", out);
    int rc = system(cmd);
    char *text = NULL;
    size_t n = 0;
    if (kiln_read_file(out, &text, &n)) text = strdup("");
    printf("%s", text);
    CHECK(rc == 0, "the PyTorch reference read every checkpoint (exit %d): %s", rc, cmd);
    for (int i = 0; i < n_saved; i++) {
        char want[64];
        snprintf(want, sizeof want, "check %s: passed\n", saved[i].name);
        CHECK(strstr(text, want), "%s: the PyTorch reference reads kiln's checkpoint as %s and reproduces the logits (%s)",
              saved[i].name, kiln_family_architecture(saved[i].family), cmd);
    }
    free(text);
}

static void check_family(int fi) {
    const char *name = families[fi];
    char path[256];
    kiln_llama_config cfg;
    snprintf(path, sizeof path, FIX "family_%s.config.json", name);
    CHECK_OK(kiln_llama_config_load(path, &cfg));
    CHECK(!strcmp(kiln_family_name(cfg.family), model_types[fi]), "%s: model_type %s", name, kiln_family_name(cfg.family));
    snprintf(path, sizeof path, FIX "family_%s.safetensors", name);
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(path, &f));
    kiln_llama *m = f ? kiln_llama_new(&cfg, 1) : NULL;
    CHECK(m != NULL, "%s model: %s", name, kiln_last_error());
    if (!m) {
        kiln_st_close(f);
        return;
    }
    /* exactly the fixture's parameters: each present with its size, and no
     * fixture parameter left over */
    int fixture_params = 0;
    for (int i = 0; i < kiln_st_count(f); i++) {
        const char *n = kiln_st_at(f, i)->name;
        fixture_params += !strncmp(n, "model.", 6) || !strcmp(n, "lm_head.weight");
    }
    CHECK(fixture_params == m->n_params, "%s: %d parameters, fixture has %d", name, m->n_params, fixture_params);
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *p = m->params[i];
        const kiln_st_tensor *t = kiln_st_find(f, p->name);
        CHECK(t && t->nbytes == kiln_tensor_nbytes(p), "%s: parameter %s missing or wrong size", name, p->name);
        if (t && t->nbytes == kiln_tensor_nbytes(p)) memcpy(p->data, t->bytes, t->nbytes);
    }
    kiln_tensor *ids = wrap_st(kiln_st_find(f, "input_ids"));
    kiln_tensor *mask = wrap_st(kiln_st_find(f, "attention_mask"));
    kiln_tensor *labels = wrap_st(kiln_st_find(f, "labels"));
    const float *ref_logits = kiln_st_find(f, "logits")->bytes, ref_loss = *(const float *)kiln_st_find(f, "loss")->bytes;
    int64_t count = 0;
    for (int64_t i = 0; i < kiln_tensor_numel(labels); i++) count += kiln_i32(labels)[i] != KILN_IGNORE_INDEX;

    /* eager */
    kiln_eager_enable();
    kiln_tensor *logits = kiln_llama_forward(m, ids, mask, NULL);
    CHECK(logits != NULL, "%s forward: %s", name, kiln_last_error());
    double el = logits ? rel_err(kiln_f32(logits), ref_logits, kiln_tensor_numel(logits)) : 1;
    CHECK(el < 1e-5, "%s: logits differ from PyTorch by %.3g", name, el);
    kiln_tensor_release(logits);
    kiln_tensor *sum = kiln_ce_loss(m, ids, labels, mask, NULL);
    kiln_tensor *loss = sum ? kiln_scale(sum, 1.0 / (double)count) : NULL;
    double e_loss = loss ? t_rel(kiln_f32(loss)[0], ref_loss) : 1;
    CHECK(e_loss < 1e-4, "%s eager: loss %.7f vs PyTorch %.7f", name, loss ? kiln_f32(loss)[0] : 0.0f, ref_loss);
    if (loss) CHECK_OK(kiln_backward(loss));
    double eg = grads_err(name, "eager", m, f);
    kiln_tensor_release(loss);
    kiln_tensor_release(sum);
    printf("%-8s eager:    logits %.2e, loss %.2e, worst gradient %.2e over %d tensors\n", name, el, e_loss, eg, m->n_params);

    /* compiled: the training step traced, generated as C and built */
    kiln_llama_zero_grad(m);
    kiln_eager_disable();
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    kiln_compiled *cs = kiln_train_compile(m, &co, true);
    CHECK(cs != NULL, "%s: compile: %s", name, kiln_last_error());
    if (cs) {
        int64_t one = 1;
        kiln_tensor *in[4] = {ids, labels, mask, kiln_tensor_new(KILN_F32, 1, &one)};
        kiln_f32(in[3])[0] = 1.0f / (float)count;
        float rep[1] = {0};
        CHECK_OK(kiln_compiled_run(cs, in, rep));
        double ec = t_rel(rep[0] / (double)count, ref_loss);
        CHECK(ec < 1e-4, "%s compiled: loss %.7f vs PyTorch %.7f", name, rep[0] / (double)count, ref_loss);
        double gc = grads_err(name, "compiled", m, f);
        kiln_compile_stats st = kiln_compiled_stats(cs);
        printf("%-8s compiled: loss %.2e, worst gradient %.2e (%s)\n", name, ec, gc,
               st.interpreted ? "interpreted" : "generated C");
        kiln_tensor_release(in[3]);
        kiln_compiled_free(cs);
    }
    kiln_eager_enable();
    save_and_read_back(name, m, ids, mask);

    kiln_tensor_release(ids);
    kiln_tensor_release(mask);
    kiln_tensor_release(labels);
    kiln_llama_free(m);
    kiln_st_close(f);
}

/* Generation's key/value cache with every family's switches: a prompt of
 * 7 positions at once (longer than every fixture's window), then one token
 * at a time (RoPE scaling at position pos0, q/k norms, biases, sliding
 * layers whose store keeps only the last window - 1 positions) gives the
 * logits of the full forward. */
static void cache_matches(int fi) {
    char path[256];
    kiln_llama_config cfg;
    snprintf(path, sizeof path, FIX "family_%s.config.json", families[fi]);
    if (kiln_llama_config_load(path, &cfg)) return;
    kiln_llama *m = kiln_llama_new(&cfg, 5);
    for (int i = 0; m && i < m->n_params; i++) /* non-zero biases: the zero init would hide them */
        if (strstr(m->params[i]->name, ".bias"))
            for (int64_t j = 0; j < kiln_tensor_numel(m->params[i]); j++) kiln_f32(m->params[i])[j] = 0.01f * (float)(j % 7) - 0.03f;
    const int T = 20, P = 7;
    int64_t s[2] = {1, T};
    kiln_tensor *ids = kiln_tensor_new(KILN_I32, 2, s);
    for (int t = 0; t < T; t++) kiln_i32(ids)[t] = 3 + (t * 7) % 50;
    kiln_eager_disable(); /* inference: no tape */
    kiln_tensor *full = m ? kiln_llama_forward(m, ids, NULL, NULL) : NULL;
    kiln_llama_cache *kc = m ? kiln_llama_cache_new(m, 1, T) : NULL;
    double worst = full && kc ? 0 : 1;
    for (int t = 0; t < T && kc && full;) {
        int n = t ? 1 : P;
        int64_t sn[2] = {1, n};
        kiln_tensor *chunk = kiln_tensor_new(KILN_I32, 2, sn);
        for (int j = 0; j < n; j++) kiln_i32(chunk)[j] = kiln_i32(ids)[t + j];
        kiln_tensor *lg = kiln_llama_forward(m, chunk, NULL, kc);
        kiln_tensor_release(chunk);
        if (!lg) {
            worst = 1;
            break;
        }
        worst = fmax(worst, rel_err(kiln_f32(lg), kiln_f32(full) + (int64_t)t * cfg.vocab_size, n * cfg.vocab_size));
        kiln_tensor_release(lg);
        t += n;
    }
    kiln_eager_enable();
    CHECK(worst < 1e-5, "%s: cached generation gives the full forward's logits (worst %.3g): %s", families[fi], worst,
          kiln_last_error());
    /* what the cache holds: max_len positions a full layer, window - 1 a sliding one */
    uint64_t want = 0;
    for (int64_t l = 0; l < cfg.num_hidden_layers; l++) {
        int64_t w = kiln_llama_layer_window(&cfg, l), held = w && w - 1 < T ? w - 1 : T;
        want += 2 * (uint64_t)(held * cfg.num_key_value_heads * cfg.head_dim) * sizeof(float);
    }
    CHECK(kc && kiln_llama_cache_bytes(kc) == want, "%s: the cache holds %llu bytes, want %llu", families[fi],
          kc ? (unsigned long long)kiln_llama_cache_bytes(kc) : 0ull, (unsigned long long)want);
    if (kc && kiln_llama_config_window(&cfg))
        printf("%-8s cache: %llu bytes for %d positions (sliding layers keep window - 1 = %lld)\n", families[fi],
               (unsigned long long)kiln_llama_cache_bytes(kc), T, (long long)kiln_llama_config_window(&cfg) - 1);
    kiln_llama_cache_free(kc);
    kiln_tensor_release(full);
    kiln_tensor_release(ids);
    kiln_llama_free(m);
}

/* A Gemma3ForConditionalGeneration checkpoint directory as transformers
 * >= 4.52 writes it (config.json with text_config and vision_config; the
 * language model under model.language_model.*, a vision tower and a
 * projector beside it), and as older ones do (language_model.model.*):
 * kiln_load_model_dir (what --init runs) builds the language model from
 * it, and its logits on the fixture batch are PyTorch's. */
static void gemma3_multimodal_dir(void) {
    char path[300], d[200];
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(FIX "family_gemma3.safetensors", &f));
    char *cfg_text = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(FIX "family_gemma3.config.json", &cfg_text, &n));
    if (!f || !cfg_text) return;
    for (int layout = 0; layout < 2; layout++) {
        snprintf(d, sizeof d, "%s/gemma3_mm%d", tmpdir, layout);
        mkdir(d, 0755);
        json_t *text = json_loads(cfg_text, 0, NULL), *top = json_object();
        json_object_del(text, "architectures");
        json_object_set_new(top, "architectures", json_pack("[s]", "Gemma3ForConditionalGeneration"));
        json_object_set_new(top, "model_type", json_string("gemma3"));
        json_object_set_new(top, "text_config", text);
        json_object_set_new(top, "vision_config", json_pack("{s:i, s:s}", "hidden_size", 8, "model_type", "siglip_vision_model"));
        json_object_set_new(top, "mm_tokens_per_image", json_integer(256));
        json_object_set_new(top, "image_token_index", json_integer(60));
        snprintf(path, sizeof path, "%s/config.json", d);
        CHECK(json_dump_file(top, path, JSON_INDENT(2)) == 0, "write %s", path);
        json_decref(top);
        /* the parameters renamed, plus vision tensors */
        kiln_st_tensor ts[128];
        char names[128][160];
        int nt = 0;
        for (int i = 0; i < kiln_st_count(f) && nt < 126; i++) {
            const kiln_st_tensor *t = kiln_st_at(f, i);
            if (strncmp(t->name, "model.", 6) && strcmp(t->name, "lm_head.weight")) continue;
            if (layout == 0) snprintf(names[nt], sizeof names[nt], "model.language_model.%s", t->name + 6);
            else snprintf(names[nt], sizeof names[nt], "language_model.%s", t->name);
            ts[nt] = *t;
            ts[nt].name = names[nt];
            nt++;
        }
        static const uint16_t vis[16] = {0};
        const char *vn[2] = {layout == 0 ? "model.vision_tower.vision_model.post_layernorm.weight" : "vision_tower.vision_model.post_layernorm.weight",
                             layout == 0 ? "model.multi_modal_projector.mm_soft_emb_norm.weight" : "multi_modal_projector.mm_soft_emb_norm.weight"};
        for (int v = 0; v < 2; v++)
            ts[nt++] = (kiln_st_tensor){.name = vn[v], .dtype = KILN_BF16, .ndim = 1, .shape = {16}, .bytes = vis, .nbytes = sizeof vis};
        snprintf(path, sizeof path, "%s/model.safetensors", d);
        CHECK_OK(kiln_st_save(path, ts, nt, NULL));
        kiln_llama *m = NULL;
        CHECK_OK(kiln_load_model_dir(d, &m));
        if (!m) continue;
        CHECK(m->cfg.family == KILN_FAMILY_GEMMA3 && m->cfg.num_hidden_layers == 3, "layout %d: a gemma3 language model", layout);
        kiln_tensor *ids = wrap_st(kiln_st_find(f, "input_ids")), *mask = wrap_st(kiln_st_find(f, "attention_mask"));
        kiln_eager_disable();
        kiln_tensor *lg = kiln_llama_forward(m, ids, mask, NULL);
        kiln_eager_enable();
        double e = lg ? rel_err(kiln_f32(lg), kiln_st_find(f, "logits")->bytes, kiln_tensor_numel(lg)) : 1;
        CHECK(e < 1e-5, "layout %d: the multimodal checkpoint's language model gives PyTorch's logits (%.3g)", layout, e);
        printf("gemma3 multimodal layout %d: %d tensors read, 2 vision tensors left out, logits vs PyTorch %.2e\n",
               layout, m->n_params, e);
        kiln_tensor_release(lg);
        kiln_tensor_release(ids);
        kiln_tensor_release(mask);
        kiln_llama_free(m);
    }
    free(cfg_text);
    kiln_st_close(f);
}

/* ---- refusals --------------------------------------------------------------- */
/* A config.json of family `mt` with extra fields (",\"k\": v", later keys
 * win in jansson) must be refused naming the file and every needle. */
#define SIZES "\"vocab_size\": 61, \"hidden_size\": 48, \"intermediate_size\": 40, \"num_hidden_layers\": 2," \
              " \"num_attention_heads\": 4, \"num_key_value_heads\": 2"
/* the config.json text: the sizes at the top level, or for gemma3 (a
 * Gemma3ForConditionalGeneration) in its text_config */
static void config_text(char *json, size_t n, const char *mt, const char *extra) {
    if (!strcmp(mt, "gemma3")) snprintf(json, n, "{\"model_type\": \"gemma3\", \"text_config\": {" SIZES "}%s}", extra);
    else snprintf(json, n, "{\"model_type\": \"%s\", " SIZES "%s}", mt, extra);
}

static void refused(const char *mt, const char *extra, const char *n1, const char *n2) {
    char json[1200];
    config_text(json, sizeof json, mt, extra);
    kiln_llama_config c;
    kiln_status st = kiln_llama_config_parse(json, "models/x/config.json", &c);
    const char *e = kiln_last_error();
    CHECK(st != KILN_OK && strstr(e, "models/x/config.json") && strstr(e, n1) && (!n2 || strstr(e, n2)),
          "%s %s: refused naming the file, '%s' and '%s'; got %d: %s", mt, extra, n1, n2 ? n2 : "", st, e);
}

static void accepted(const char *mt, const char *extra, kiln_llama_config *c) {
    char json[1200];
    config_text(json, sizeof json, mt, extra);
    kiln_status st = kiln_llama_config_parse(json, "ok.json", c);
    CHECK(st == KILN_OK, "%s %s accepted: %s", mt, extra, st ? kiln_last_error() : "");
}

static void refusals(void) {
    refused("gemma", "", "model_type", "\"gemma\"");
    refused("llama", ", \"hidden_act\": \"gelu\"", "hidden_act", "\"gelu\"");
    refused("qwen2", ", \"hidden_act\": \"gelu_pytorch_tanh\"", "hidden_act", "gelu_pytorch_tanh");
    refused("llama", ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_scaling", "\"yarn\"");
    refused("qwen2", ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}", "rope_scaling", "\"dynamic\"");
    refused("llama", ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0, \"beta_fast\": 32}", "rope_scaling.beta_fast",
            "32");
    refused("llama", ", \"rope_scaling\": {\"rope_type\": \"linear\"}", "rope_scaling.factor", NULL);
    refused("llama", ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 1e300}", "rope_scaling.factor", "1e+300");
    refused("llama",
            ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0,"
            " \"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 32}",
            "high_freq_factor", "1");
    refused("llama", ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}",
            "original_max_position_embeddings", NULL);
    refused("llama", ", \"rope_scaling\": {\"rope_type\": \"linear\", \"type\": \"llama3\", \"factor\": 2.0}", "rope_scaling",
            "\"llama3\"");
    refused("llama", ", \"rope_scaling\": 3", "rope_scaling", "3");
    refused("llama", ", \"quantization_config\": {\"bits\": 4}", "quantization_config", NULL);
    refused("mistral", ", \"attention_bias\": true", "attention_bias", "true"); /* not a Mistral field: HF would ignore it */
    refused("qwen2", ", \"mlp_bias\": true", "mlp_bias", "true");
    refused("llama", ", \"sliding_window\": 16", "sliding_window", "16");
    refused("llama", ", \"attention_dropout\": 0.1", "attention_dropout", "0.1");
    refused("llama", ", \"rope_interleaved\": true", "rope_interleaved", "true");
    refused("llama", ", \"architectures\": [\"LlamaForSequenceClassification\"]", "architectures",
            "LlamaForSequenceClassification");
    refused("qwen3", ", \"architectures\": [\"Qwen2ForCausalLM\"]", "architectures", "Qwen2ForCausalLM");
    refused("llama", ", \"attention_bias\": \"yes\"", "attention_bias", "\"yes\"");
    refused("llama", ", \"eos_token_id\": [1, 2.5]", "eos_token_id", "2.5");
    refused("llama", ", \"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]", "eos_token_id", "17");
    refused("llama", ", \"eos_token_id\": [1, 99]", "eos_token_id", "99");
    refused("llama", ", \"eos_token_id\": [-1, 5]", "eos_token_id", "-1");
    refused("mistral", ", \"sliding_window\": -4", "sliding_window", "-4");
    refused("qwen2", ", \"use_sliding_window\": true, \"sliding_window\": 16, \"max_window_layers\": 1,"
            " \"layer_types\": [\"full_attention\", \"full_attention\"]",
            "layer_types[1]", "\"full_attention\"");
    refused("qwen3", ", \"head_dim\": 15", "head_dim", "15");
    /* issue 22: an empty eos list (item 9a); activations other than SiLU's
     * names (item 11); fixed fields at a value that would change the
     * network (item 12) */
    refused("llama", ", \"eos_token_id\": []", "eos_token_id", "empty list");
    refused("qwen3", ", \"hidden_act\": \"relu\"", "hidden_act", "\"relu\"");
    refused("mistral", ", \"hidden_act\": \"gelu\"", "hidden_act", "\"gelu\"");
    refused("qwen2", ", \"attention_bias\": false", "attention_bias", "false");
    refused("qwen3", ", \"mlp_bias\": true", "mlp_bias", "true");
    refused("mistral", ", \"mlp_bias\": true", "mlp_bias", "true");
    refused("mistral", ", \"pretraining_tp\": 2", "pretraining_tp", "2");
    refused("qwen2", ", \"attention_dropout\": 0.5", "attention_dropout", "0.5");
    refused("llama", ", \"use_sliding_window\": true", "use_sliding_window", "true");
    refused("qwen3", ", \"rope_interleaved\": true", "rope_interleaved", "true");
    /* issue 26: Gemma's own fields with values that would break the network */
    refused("gemma2", ", \"attn_logit_softcapping\": -50.0", "attn_logit_softcapping", "-50");
    refused("gemma2", ", \"final_logit_softcapping\": 0", "final_logit_softcapping", "0");
    refused("gemma2", ", \"query_pre_attn_scalar\": -1", "query_pre_attn_scalar", "-1");
    refused("gemma2", ", \"hidden_activation\": \"gelu\"", "hidden_activation", "\"gelu\"");
    refused("gemma2", ", \"hidden_act\": \"silu\"", "hidden_act", "\"silu\"");
    refused("gemma2", ", \"rope_local_base_freq\": 10000", "rope_local_base_freq", "gemma2");
    refused("gemma2", ", \"mlp_bias\": false", "mlp_bias", "gemma2");
    refused("gemma3_text", ", \"sliding_window\": 0", "sliding_window", "0");
    refused("gemma3_text", ", \"sliding_window\": null", "sliding_window", "null");
    refused("gemma3_text", ", \"sliding_window_pattern\": 0", "sliding_window_pattern", "0");
    refused("gemma3_text", ", \"rope_local_base_freq\": 0", "rope_local_base_freq", "0");
    refused("gemma3_text", ", \"layer_types\": [\"sliding_attention\"]", "layer_types", "2 layers");
    refused("gemma3_text", ", \"layer_types\": [\"full_attention\", \"sliding_attention\"]", "layer_types[1]", "\"sliding_attention\"");
    refused("gemma3_text", ", \"layer_types\": [\"sliding_attention\", \"global\"]", "layer_types[1]", "\"global\"");
    refused("gemma3_text", ", \"sliding_window_pattern\": 3, \"layer_types\": [\"sliding_attention\", \"full_attention\"]",
            "layer_types", "sliding_window_pattern is 3");
    refused("gemma3_text", ", \"use_bidirectional_attention\": true", "use_bidirectional_attention", "true");
    refused("gemma3", ", \"text_config\": {}, \"audio_config\": {}", "audio_config", NULL);
    refused("gemma3", ", \"text_config\": 7", "text_config", "7");
    refused("gemma3", ", \"text_config\": {\"model_type\": \"gemma2\"}", "text_config.model_type", "gemma2");

    /* accepted: the fields of the real files, with their meaning */
    kiln_llama_config c;
    accepted("llama", ", \"eos_token_id\": [128001, 128008, 128009], \"vocab_size\": 128256", &c);
    CHECK(c.eos_token_id == 128001 && c.n_eos_more == 2 && kiln_llama_config_is_eos(&c, 128009) && !kiln_llama_config_is_eos(&c, 5),
          "eos_token_id list kept");
    accepted("llama", ", \"rope_scaling\": null, \"pretraining_tp\": 1, \"torch_dtype\": \"bfloat16\", \"use_cache\": true,"
             " \"transformers_version\": \"4.45.0\", \"_name_or_path\": \"x\", \"rope_interleaved\": false,"
             " \"is_llama_config\": true, \"transformers.js_config\": {}", &c);
    /* SiLU by either of transformers' names (ACT2FN: "silu" and "swish") */
    accepted("llama", ", \"hidden_act\": \"swish\"", &c);
    accepted("qwen2", ", \"hidden_act\": \"swish\"", &c);
    accepted("qwen3", ", \"hidden_act\": \"silu\"", &c);
    /* fixed fields at the family's own value change nothing: accepted, and
     * never read into the config (qwen2's attention_bias true is its q/k/v
     * biases, not llama's o_proj bias too) */
    accepted("qwen2", ", \"mlp_bias\": false, \"attention_bias\": true, \"pretraining_tp\": 1, \"attention_dropout\": 0.0", &c);
    CHECK(!c.mlp_bias && !c.attention_bias, "qwen2 fixed fields leave the config as the family has it");
    kiln_llama *q2 = kiln_llama_new(&c, 1);
    CHECK(q2 && q2->layers[0].q_bias && q2->layers[0].v_bias && !q2->layers[0].o_bias && !q2->layers[0].gate_bias,
          "qwen2 with attention_bias true / mlp_bias false: q/k/v biases only");
    kiln_llama_free(q2);
    accepted("mistral", ", \"attention_bias\": false, \"mlp_bias\": false, \"rope_interleaved\": false, \"pretraining_tp\": 1", &c);
    CHECK(!c.attention_bias && !c.mlp_bias, "mistral fixed fields");
    accepted("qwen3", ", \"mlp_bias\": false, \"attention_bias\": false, \"attention_dropout\": 0", &c);
    accepted("llama", ", \"sliding_window\": null, \"use_sliding_window\": false, \"mlp_bias\": null", &c);
    CHECK(kiln_llama_config_window(&c) == 0, "llama with sliding_window null: no window");
    accepted("qwen3", "", &c);
    CHECK(c.head_dim == 128, "qwen3 head_dim defaults to 128 as Qwen3Config does (got %lld)", (long long)c.head_dim);
    accepted("mistral", ", \"sliding_window\": null", &c);
    CHECK(kiln_llama_config_window(&c) == 0, "mistral sliding_window null: no window");
    accepted("mistral", "", &c);
    CHECK(kiln_llama_config_window(&c) == 4096, "mistral sliding_window defaults to 4096 as MistralConfig does");
    accepted("qwen2", ", \"use_sliding_window\": false, \"sliding_window\": 32768, \"max_window_layers\": 28", &c);
    CHECK(kiln_llama_config_window(&c) == 0, "qwen2 with use_sliding_window false: no window");
    accepted("qwen2", ", \"use_sliding_window\": true, \"sliding_window\": 16, \"max_window_layers\": 1,"
             " \"layer_types\": [\"full_attention\", \"sliding_attention\"]", &c);
    CHECK(kiln_llama_config_window(&c) == 16, "qwen2 with use_sliding_window: window 16");
    /* Gemma: the pattern from layer_types, or sliding_window_pattern, or the class's default */
    accepted("gemma3_text", ", \"sliding_window\": 16, \"layer_types\": [\"sliding_attention\", \"sliding_attention\"]", &c);
    CHECK(kiln_llama_layer_window(&c, 0) == 16 && kiln_llama_layer_window(&c, 1) == 16, "gemma3 layer_types all sliding");
    accepted("gemma3_text", ", \"sliding_window\": 16, \"sliding_window_pattern\": 1", &c);
    CHECK(kiln_llama_config_window(&c) == 0 && !kiln_llama_layer_window(&c, 0), "gemma3 pattern 1: every layer full");
    accepted("gemma2", ", \"sliding_window\": 16", &c);
    CHECK(kiln_llama_layer_window(&c, 0) == 16 && !kiln_llama_layer_window(&c, 1) && c.final_logit_softcapping == 30 &&
              c.attn_logit_softcapping == 50 && c.query_pre_attn_scalar == 256 && c.tie_word_embeddings,
          "gemma2 defaults: layer 0 slides, layer 1 full, soft-caps 30/50, tied");
    const kiln_rope_scaling *rs = NULL;
    accepted("gemma3", ", \"eos_token_id\": [1, 60], \"vision_config\": {\"hidden_size\": 1152}, \"mm_tokens_per_image\": 256", &c);
    CHECK(c.family == KILN_FAMILY_GEMMA3 && c.eos_token_id == 1 && c.n_eos_more == 1 && c.eos_more[0] == 60 && c.vocab_size == 61,
          "Gemma3ForConditionalGeneration: its text_config, with the top level's eos list");
    accepted("gemma3_text", ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}", &c);
    CHECK(kiln_llama_layer_rope(&c, 0, &rs) == 10000.0 && rs->type == KILN_ROPE_DEFAULT &&
              kiln_llama_layer_rope(&c, 5, &rs) == 1000000.0 && rs->type == KILN_ROPE_LINEAR,
          "gemma3: sliding layers rotate with rope_local_base_freq unscaled, full ones with rope_theta and the scaling");

    /* a run longer than the window: positions within the window equal the
     * window-less model's, the one beyond it differs (it no longer sees key 0) */
    kiln_llama_config full;
    accepted("mistral", ", \"sliding_window\": null", &full);
    accepted("mistral", ", \"sliding_window\": 8", &c);
    kiln_llama *m = kiln_llama_new(&c, 1), *mf = kiln_llama_new(&full, 1);
    int64_t s[2] = {1, 9};
    kiln_tensor *ids = kiln_tensor_zeros(KILN_I32, 2, s);
    for (int t = 0; t < 9; t++) kiln_i32(ids)[t] = 3 + 5 * t;
    kiln_tensor *out = m ? kiln_llama_forward(m, ids, NULL, NULL) : NULL, *ref = mf ? kiln_llama_forward(mf, ids, NULL, NULL) : NULL;
    CHECK(out && ref, "9 positions with sliding_window 8: %s", kiln_last_error());
    if (out && ref) {
        int64_t V = c.vocab_size;
        double d_in = 0, d_out = 0;
        for (int64_t j = 0; j < 8 * V; j++) d_in = fmax(d_in, fabs(kiln_f32(out)[j] - kiln_f32(ref)[j]));
        for (int64_t j = 8 * V; j < 9 * V; j++) d_out = fmax(d_out, fabs(kiln_f32(out)[j] - kiln_f32(ref)[j]));
        CHECK(d_in == 0 && d_out > 1e-6, "sliding_window 8: positions 0-7 as without a window (%.3g), position 8 not (%.3g)", d_in,
              d_out);
    }
    kiln_tensor_release(out);
    kiln_tensor_release(ref);
    kiln_tensor_release(ids);
    kiln_llama_free(m);
    kiln_llama_free(mf);
}

/* The config.json files of public models as their hubs ship them (every
 * field), parsed and sized without allocating: the parameter counts are the
 * published ones (the safetensors totals of each model), not kiln's. */
static void real_configs(void) {
    static const struct {
        const char *name, *json;
        int64_t params;
        kiln_family family;
    } models[] = {
        {"Llama-3.2-1B",
         "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,\"bos_token_id\":128000,"
         "\"eos_token_id\":128001,\"head_dim\":64,\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,"
         "\"intermediate_size\":8192,\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
         "\"num_attention_heads\":32,\"num_hidden_layers\":16,\"num_key_value_heads\":8,\"pretraining_tp\":1,"
         "\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
         "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,"
         "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.45.0.dev0\","
         "\"use_cache\":true,\"vocab_size\":128256}",
         1235814400, KILN_FAMILY_LLAMA},
        {"Qwen2.5-0.5B",
         "{\"architectures\":[\"Qwen2ForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":151643,\"eos_token_id\":151643,"
         "\"hidden_act\":\"silu\",\"hidden_size\":896,\"initializer_range\":0.02,\"intermediate_size\":4864,"
         "\"max_position_embeddings\":32768,\"max_window_layers\":24,\"model_type\":\"qwen2\",\"num_attention_heads\":14,"
         "\"num_hidden_layers\":24,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,"
         "\"sliding_window\":32768,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.40.1\","
         "\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}",
         494032768, KILN_FAMILY_QWEN2},
        {"Qwen3-0.6B",
         "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,\"bos_token_id\":151643,"
         "\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":1024,\"initializer_range\":0.02,"
         "\"intermediate_size\":3072,\"max_position_embeddings\":40960,\"max_window_layers\":28,\"model_type\":\"qwen3\","
         "\"num_attention_heads\":16,\"num_hidden_layers\":28,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-06,"
         "\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,\"tie_word_embeddings\":true,"
         "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.51.0\",\"use_cache\":true,\"use_sliding_window\":false,"
         "\"vocab_size\":151936}",
         596049920, KILN_FAMILY_QWEN3},
        {"SmolLM2-135M",
         "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,\"bos_token_id\":0,"
         "\"eos_token_id\":0,\"hidden_act\":\"silu\",\"hidden_size\":576,\"initializer_range\":0.041666666666666664,"
         "\"intermediate_size\":1536,\"is_llama_config\":true,\"max_position_embeddings\":8192,\"mlp_bias\":false,"
         "\"model_type\":\"llama\",\"num_attention_heads\":9,\"num_hidden_layers\":30,\"num_key_value_heads\":3,"
         "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_interleaved\":false,\"rope_scaling\":null,\"rope_theta\":100000,"
         "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"transformers.js_config\":{\"kv_cache_dtype\":"
         "{\"q4f16\":\"float16\",\"fp16\":\"float16\"}},\"transformers_version\":\"4.42.3\",\"use_cache\":true,"
         "\"vocab_size\":49152}",
         134515008, KILN_FAMILY_LLAMA},
        {"TinyLlama-1.1B",
         "{\"_name_or_path\":\"meta-llama/Llama-2-7b-hf\",\"architectures\":[\"LlamaForCausalLM\"],\"bos_token_id\":1,"
         "\"eos_token_id\":2,\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,"
         "\"intermediate_size\":5632,\"max_position_embeddings\":2048,\"model_type\":\"llama\",\"num_attention_heads\":32,"
         "\"num_hidden_layers\":22,\"num_key_value_heads\":4,\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,"
         "\"rope_scaling\":null,\"rope_theta\":10000.0,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
         "\"transformers_version\":\"4.35.0\",\"use_cache\":true,\"vocab_size\":32000}",
         1100048384, KILN_FAMILY_LLAMA},
        {"Mistral-7B-v0.1",
         "{\"architectures\":[\"MistralForCausalLM\"],\"bos_token_id\":1,\"eos_token_id\":2,\"hidden_act\":\"silu\","
         "\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":14336,\"max_position_embeddings\":32768,"
         "\"model_type\":\"mistral\",\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
         "\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"sliding_window\":4096,\"tie_word_embeddings\":false,"
         "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.34.0.dev0\",\"use_cache\":true,\"vocab_size\":32000}",
         7241732096, KILN_FAMILY_MISTRAL},
        {"Gemma-2-2B",
         "{\"architectures\":[\"Gemma2ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,\"attn_logit_sof"
         "tcapping\":50.0,\"bos_token_id\":2,\"cache_implementation\":\"hybrid\",\"eos_token_id\":1,\"final_logit_softca"
         "pping\":30.0,\"head_dim\":256,\"hidden_act\":\"gelu_pytorch_tanh\",\"hidden_activation\":\"gelu_pytorch_tanh\""
         ",\"hidden_size\":2304,\"initializer_range\":0.02,\"intermediate_size\":9216,\"max_position_embeddings\":8192,"
         "\"model_type\":\"gemma2\",\"num_attention_heads\":8,\"num_hidden_layers\":26,\"num_key_value_heads\":4,\"pad_t"
         "oken_id\":0,\"query_pre_attn_scalar\":256,\"rms_norm_eps\":1e-06,\"rope_theta\":10000.0,\"sliding_window\":409"
         "6,\"torch_dtype\":\"float32\",\"transformers_version\":\"4.42.4\",\"use_cache\":true,\"vocab_size\":256000}",
         2614341888, KILN_FAMILY_GEMMA2},
        {"Gemma-3-1B-it",
         "{\"architectures\":[\"Gemma3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,\"attn_logit_sof"
         "tcapping\":null,\"bos_token_id\":2,\"cache_implementation\":\"hybrid\",\"eos_token_id\":[1,106],\"final_logit_"
         "softcapping\":null,\"head_dim\":256,\"hidden_activation\":\"gelu_pytorch_tanh\",\"hidden_size\":1152,\"initial"
         "izer_range\":0.02,\"intermediate_size\":6912,\"max_position_embeddings\":32768,\"model_type\":\"gemma3_text\","
         "\"num_attention_heads\":4,\"num_hidden_layers\":26,\"num_key_value_heads\":1,\"pad_token_id\":0,\"query_pre_at"
         "tn_scalar\":256,\"rms_norm_eps\":1e-06,\"rope_local_base_freq\":10000,\"rope_scaling\":null,\"rope_theta\":100"
         "0000,\"sliding_window\":512,\"sliding_window_pattern\":6,\"torch_dtype\":\"bfloat16\",\"transformers_version\""
         ":\"4.50.0.dev0\",\"use_cache\":true,\"vocab_size\":262144}",
         999885952, KILN_FAMILY_GEMMA3},
        {"Gemma-3-270M",
         "{\"_sliding_window_pattern\":6,\"architectures\":[\"Gemma3ForCausalLM\"],\"attention_bias\":false,\"attention_"
         "dropout\":0.0,\"attn_logit_softcapping\":null,\"bos_token_id\":2,\"eos_token_id\":1,\"final_logit_softcapping"
         "\":null,\"head_dim\":256,\"hidden_activation\":\"gelu_pytorch_tanh\",\"hidden_size\":640,\"initializer_range\""
         ":0.02,\"intermediate_size\":2048,\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"sliding_attent"
         "ion\",\"sliding_attention\",\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"sliding_attention"
         "\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\",\"sliding_attention\","
         "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\"],\""
         "max_position_embeddings\":32768,\"model_type\":\"gemma3_text\",\"num_attention_heads\":4,\"num_hidden_layers\""
         ":18,\"num_key_value_heads\":1,\"pad_token_id\":0,\"query_pre_attn_scalar\":256,\"rms_norm_eps\":1e-06,\"rope_l"
         "ocal_base_freq\":10000.0,\"rope_scaling\":null,\"rope_theta\":1000000.0,\"sliding_window\":512,\"torch_dtype\""
         ":\"bfloat16\",\"transformers_version\":\"4.55.0.dev0\",\"use_bidirectional_attention\":false,\"use_cache\":tru"
         "e,\"vocab_size\":262144}",
         268098176, KILN_FAMILY_GEMMA3},
        {"Gemma-3-4B-it (language model)",
         "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"boi_token_index\":255999,\"eoi_token_index\":256000,"
         "\"eos_token_id\":[1,106],\"image_token_index\":262144,\"initializer_range\":0.02,\"mm_tokens_per_image\":256,"
         "\"model_type\":\"gemma3\",\"text_config\":{\"hidden_size\":2560,\"intermediate_size\":10240,\"model_type\":\"g"
         "emma3_text\",\"num_hidden_layers\":34,\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"linear\"},\"sliding_win"
         "dow\":1024},\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.50.0.dev0\",\"vision_config\":{\"hidden_"
         "size\":1152,\"image_size\":896,\"intermediate_size\":4304,\"model_type\":\"siglip_vision_model\",\"num_attenti"
         "on_heads\":16,\"num_hidden_layers\":27,\"patch_size\":14,\"vision_use_head\":false}}",
         3880263168, KILN_FAMILY_GEMMA3},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        kiln_llama_config c;
        kiln_status st = kiln_llama_config_parse(models[i].json, models[i].name, &c);
        CHECK(st == KILN_OK, "%s config.json accepted: %s", models[i].name, st ? kiln_last_error() : "");
        if (st) continue;
        uint64_t bytes = 0;
        CHECK_OK(kiln_llama_param_bytes(&c, &bytes));
        CHECK(c.family == models[i].family && bytes == 4 * (uint64_t)models[i].params,
              "%s: %llu parameters (published %lld)", models[i].name, (unsigned long long)(bytes / 4), (long long)models[i].params);
        /* and written back as the same family, with the same meaning */
        char *js = kiln_llama_config_to_json(&c);
        kiln_llama_config c2;
        CHECK(js && kiln_llama_config_parse(js, "saved", &c2) == KILN_OK && kiln_llama_config_equal(&c, &c2),
              "%s: the saved config.json reads back the same: %s", models[i].name, kiln_last_error());
        free(js);
    }
}

int main(void) {
    if (!t_tmpdir(tmpdir, sizeof tmpdir, "families")) return 1;
    /* found, not imported: the read-back imports it once, at the end */
    have_torch = system("/usr/bin/python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"torch\") is None)' "
                        ">/dev/null 2>&1") == 0;
    if (!have_torch) printf("skipping the PyTorch read-back of kiln's checkpoints: /usr/bin/python3 with torch not found\n");
    kiln_eager_enable();
    for (int i = 0; i < N_FAMILIES; i++) {
        check_family(i);
        cache_matches(i);
    }
    torch_read_back();
    gemma3_multimodal_dir();
    refusals();
    real_configs();
    if (t_rmtree(tmpdir)) fprintf(stderr, "could not remove %s\n", tmpdir);
    TEST_END();
}
