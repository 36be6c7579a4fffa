/* `kiln export --gguf --type q8_0|q4_0|q4_k_m|q4_k_s|q5_k_m|q5_k_s|q6_k`
 * against llama.cpp's own quantizer: llama_model_quantize from
 * node-llama-cpp's prebuilt libllama (dlopen, as ggml_ref.h loads
 * libggml-base), no importance matrix, run on kiln's F16 export of the same
 * model. The models' matrices are exactly f16-representable (llref_round),
 * so both quantize the same floats, and every tensor must come out with
 * llama.cpp's type and llama.cpp's bytes (both files read with
 * kiln_gguf_open), general.file_type alike. Models:
 *   llama8  8 layers (llama.cpp's use_more_bits picks layers 0, 3, 6, 7;
 *           q4_k_s's first eighth and attn_v of layers 0-3), untied, GQA,
 *           every row a multiple of 256
 *   qwen2   q/k/v biases, tied embeddings (token_embd is the output: Q6_K)
 *   qwen3   tied; head_dim 40 x 4 heads (attn_output rows of 160: not whole
 *           blocks of 256, so Q6_K falls back to Q8_0) and intermediate 328
 *           (ffn_down rows not whole blocks of 32: F16); with the q4_k/q5_k
 *           types attn_output falls back to Q5_0/Q5_1, as llama.cpp's does
 * A table per model prints tensors equal / total for each type. Skips with
 * one line when the library is missing. */
#include <dlfcn.h>
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"
#include "llamacpp_ref.h"

static char dir[256];
static ggml_ref G;
static bool have_ggml;

/* llama.cpp's quantizer: llref_quant_load / llref_quantize (llamacpp_ref.h) */

typedef struct {
    const char *tag, *config;
} model_case;

static const model_case models[] = {
    {"llama8",
     "{\"model_type\": \"llama\", \"vocab_size\": 512, \"hidden_size\": 256, \"intermediate_size\": 512,"
     " \"num_hidden_layers\": 8, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 256,"
     " \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1}"},
    {"qwen2",
     "{\"model_type\": \"qwen2\", \"vocab_size\": 512, \"hidden_size\": 256, \"intermediate_size\": 768,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 256,"
     " \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true, \"use_sliding_window\": false,"
     " \"bos_token_id\": 0, \"eos_token_id\": 1}"},
    {"qwen3",
     "{\"model_type\": \"qwen3\", \"vocab_size\": 512, \"hidden_size\": 256, \"intermediate_size\": 328,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 40,"
     " \"max_position_embeddings\": 256, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true,"
     " \"attention_bias\": false, \"use_sliding_window\": false, \"bos_token_id\": 0, \"eos_token_id\": 1}"},
};
#define N_MODELS (int)(sizeof models / sizeof models[0])

static const struct {
    const char *name;
    enum llref_ftype ftype;
} types[] = {
    {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},     {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
    {"q4_k_s", LLAMA_FTYPE_MOSTLY_Q4_K_S}, {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q5_k_s", LLAMA_FTYPE_MOSTLY_Q5_K_S},
    {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},
};
#define N_TYPES (int)(sizeof types / sizeof types[0])

static void write_text(const char *path, const char *s) { CHECK_OK(kiln_write_file_atomic(path, s, strlen(s))); }

/* config, random weights with every matrix f16-exact, the tokenizer */
static void make_model(const model_case *mc, const char *mdir, const char *tok) {
    char p[700];
    mkdir(mdir, 0755);
    snprintf(p, sizeof p, "%s/config.json", mdir);
    write_text(p, mc->config);
    kiln_llama_config c;
    CHECK_OK(kiln_llama_config_load(p, &c));
    kiln_llama *m = kiln_llama_new(&c, 13);
    CHECK(m != NULL, "%s: model", mc->tag);
    if (!m) return;
    kiln_rng r = {41, 0};
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *t = m->params[i];
        if (strstr(t->name, "norm")) kiln_rng_uniform(&r, kiln_f32(t), kiln_tensor_numel(t), 0.5f, 1.5f);
        else kiln_rng_normal(&r, kiln_f32(t), kiln_tensor_numel(t), 0, t->ndim == 2 ? 0.05f : 0.02f);
    }
    llref_round(m, 1);
    snprintf(p, sizeof p, "%s/model.safetensors", mdir);
    CHECK_OK(kiln_save_weights(p, m));
    kiln_llama_free(m);
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(tok, &text, &n));
    snprintf(p, sizeof p, "%s/tokenizer.json", mdir);
    if (text) CHECK_OK(kiln_write_file_atomic(p, text, n));
    free(text);
}

static uint32_t file_type(const kiln_gguf_file *f) {
    uint32_t v = 0xffffffffu;
    if (kiln_gguf_get_u32(f, "general.file_type", &v)) v = 0xffffffffu;
    return v;
}

/* llama.cpp's file against kiln's: per tensor the type and the bytes; mix
 * gets llama.cpp's types ("7 Q4_K, 2 Q6_K, ..."); returns tensors equal */
static int compare_files(const char *tag, const char *type, const char *lp, const char *kp, int *total, char *mix, size_t n_mix) {
    kiln_gguf_file *fl = NULL, *fk = NULL;
    CHECK_OK(kiln_gguf_open(lp, &fl));
    CHECK_OK(kiln_gguf_open(kp, &fk));
    int equal = 0, count[64] = {0};
    *total = 0;
    if (fl && fk) {
        *total = (int)kiln_gguf_tensor_count(fl);
        CHECK(kiln_gguf_tensor_count(fk) == kiln_gguf_tensor_count(fl), "%s %s: kiln wrote %lld tensors, llama.cpp %lld", tag,
              type, (long long)kiln_gguf_tensor_count(fk), (long long)kiln_gguf_tensor_count(fl));
        CHECK(file_type(fk) == file_type(fl), "%s %s: general.file_type %u, llama.cpp's %u", tag, type, file_type(fk), file_type(fl));
        for (int64_t i = 0; i < kiln_gguf_tensor_count(fl); i++) {
            const kiln_gguf_tensor *a = kiln_gguf_tensor_at(fl, i), *b = kiln_gguf_tensor_find(fk, a->name);
            if ((int)a->type < 64) count[a->type]++;
            bool same_type = b && b->type == a->type;
            bool same = same_type && b->nbytes == a->nbytes && !memcmp(a->data, b->data, a->nbytes);
            equal += same;
            if (same) continue;
            if (!same_type)
                CHECK(0, "%s %s: %s is %s in kiln's file, %s in llama.cpp's", tag, type, a->name,
                      b ? kiln_ggml_type_name(b->type) : "missing", kiln_ggml_type_name(a->type));
            else {
                size_t d = 0;
                while (d < a->nbytes && ((const unsigned char *)a->data)[d] == ((const unsigned char *)b->data)[d]) d++;
                CHECK(0, "%s %s: %s (%s): bytes differ from llama.cpp's, first at byte %zu of %zu", tag, type, a->name,
                      kiln_ggml_type_name(a->type), d, a->nbytes);
            }
        }
    }
    size_t len = 0;
    mix[0] = 0;
    for (int t = 0; t < 64; t++)
        if (count[t] && len < n_mix)
            len += (size_t)snprintf(mix + len, n_mix - len, "%s%d %s", len ? ", " : "", count[t], kiln_ggml_type_name((kiln_ggml_type)t));
    kiln_gguf_close(fl);
    kiln_gguf_close(fk);
    return equal;
}

/* kiln refused the type: the message names a tensor and Q5_0/Q5_1, and
 * llama.cpp's file holds that tensor in that type (read with ggml's own
 * gguf reader: kiln's does not read those block types) */
static void check_refusal(const char *tag, const char *type, const char *msg, const char *lp) {
    struct gguf_context *g = have_ggml ? ggml_ref_open(&G, lp) : NULL;
    CHECK(!have_ggml || g, "ggml's gguf reader refused %s", lp);
    const char *t = strstr(msg, "tensor "), *q = strstr(msg, "Q5_");
    char name[64] = "";
    if (t) sscanf(t + 7, "%63[^:]", name);
    int want = q && q[3] == '0' ? GGML_TYPE_Q5_0 : GGML_TYPE_Q5_1;
    int64_t id = g ? G.find_tensor(g, name) : -1;
    CHECK(q && (!g || (id >= 0 && G.get_tensor_type(g, id) == want)),
          "%s %s: kiln's refusal '%s' names no tensor that llama.cpp writes as Q5_0/Q5_1", tag, type, msg);
    if (g) G.free(g);
}

static void check_model(const model_case *mc, const char *tok, const char *kiln_only) {
    char mdir[600], f16[700], lp[700], kp[700];
    snprintf(mdir, sizeof mdir, "%s/%s", dir, mc->tag);
    snprintf(f16, sizeof f16, "%s/%s-f16.gguf", dir, mc->tag);
    make_model(mc, mdir, tok);
    int rc = cli_exec((const char *[]){cli_kiln, "export", mdir, "--gguf", f16, "--type", "f16", NULL});
    char *o = cli_output();
    CHECK(rc == 0, "kiln export %s --type f16: rc %d\n%s", mdir, rc, o);
    free(o);
    printf("%s: %-7s %-16s %s\n", mc->tag, "type", "tensors equal", "llama.cpp's types (kiln's the same where equal)");
    for (int ti = 0; ti < N_TYPES; ti++) {
        const char *type = types[ti].name;
        snprintf(kp, sizeof kp, "%s/%s-%s-kiln.gguf", dir, mc->tag, type);
        snprintf(lp, sizeof lp, "%s/%s-%s-llama.gguf", dir, mc->tag, type);
        rc = cli_exec((const char *[]){cli_kiln, "export", mdir, "--gguf", kp, "--type", type, NULL});
        o = cli_output();
        if (kiln_only) {
            CHECK(rc == 0, "kiln export %s --type %s: rc %d\n%s", mdir, type, rc, o);
            if (rc == 0) printf("%s: %-7s written by kiln (%s)\n", mc->tag, type, kiln_only);
            free(o);
            continue;
        }
        llama_model_quantize_params qp = llref_q.default_params();
        qp.ftype = types[ti].ftype;
        qp.nthread = 2;
        llref_q.log[0] = 0;
        uint32_t qrc = llref_q.quantize(f16, lp, &qp);
        CHECK(qrc == 0, "llama_model_quantize %s -> %s: %u\n%s", f16, type, qrc, llref_quant_log());
        if (qrc) {
            free(o);
            continue;
        }
        bool refused = strstr(o, "Q5_0") || strstr(o, "Q5_1");
        if (rc == 1 && refused) {
            check_refusal(mc->tag, type, o, lp);
            CHECK(access(kp, F_OK) != 0, "a refused export left %s", kp);
            printf("%s: %-7s refused by kiln: %s", mc->tag, type, strstr(o, "tensor ") ? strstr(o, "tensor ") : o);
            free(o);
            continue;
        }
        CHECK(rc == 0, "kiln export %s --type %s: rc %d\n%s", mdir, type, rc, o);
        free(o);
        if (rc) continue;
        int total = 0;
        char mix[256];
        int equal = compare_files(mc->tag, type, lp, kp, &total, mix, sizeof mix);
        printf("%s: %-7s %3d / %-10d %s\n", mc->tag, type, equal, total, mix);
        CHECK(total > 0 && equal == total, "%s %s: %d of %d tensors as llama.cpp writes them", mc->tag, type, equal, total);
    }
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_gguf_quant_XXXXXX");
    if (!cli_init(dir) || !mkdtemp(dir)) return 1;
    char why[1500], tok[600];
    bool have = llref_quant_load(why, sizeof why);
    if (!have) printf("test_gguf_quant: llama.cpp's quantizer not there, kiln's files are only written: %s\n", why);
    if (have) have_ggml = ggml_ref_load(&G, why, sizeof why);
    /* kiln's own byte-level BPE tokenizer, trained on made-up words */
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    llref_words_tokenizer(tok);
    if (have) {
        /* the struct as the library lays it out: its defaults where known */
        llama_model_quantize_params d = llref_q.default_params();
        CHECK(d.ftype == LLAMA_FTYPE_MOSTLY_Q8_0 && d.output_tensor_type == GGML_TYPE_COUNT &&
                  d.token_embedding_type == GGML_TYPE_COUNT && !d.allow_requantize && d.quantize_output_tensor && !d.only_copy &&
                  !d.pure && !d.keep_split && !d.dry_run && !d.imatrix && !d.kv_overrides && !d.tt_overrides && !d.prune_layers &&
                  d.max_buf_size == 8ull * 1024 * 1024 * 1024,
              "llama_model_quantize_default_params() does not have llama.h's layout (ftype %d, output type %d, max_buf %zu)",
              (int)d.ftype, (int)d.output_tensor_type, d.max_buf_size);
    }
    for (int i = 0; i < N_MODELS; i++) check_model(&models[i], tok, have ? NULL : why);
    char mdir[600], out[700];
    snprintf(mdir, sizeof mdir, "%s/qwen3", dir);
    snprintf(out, sizeof out, "%s/refused.gguf", dir);
    int rc;
    char *o;
    rc = cli_exec((const char *[]){cli_kiln, "export", mdir, "--gguf", out, "--type", "q3_k_m", NULL});
    o = cli_output();
    CHECK(rc == 2 && strstr(o, "q3_k_m") && strstr(o, "q4_k_m"), "unknown --type q3_k_m: rc %d: %s", rc, o);
    free(o);
    if (getenv("KILN_TEST_KEEP")) printf("kept %s\n", dir);
    else CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
