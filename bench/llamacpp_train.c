/* llama.cpp's own trainer as a peer of `kiln bench`: full fine-tuning of a
 * GGUF model (kiln export --type f32) with llama_opt_init / llama_opt_epoch
 * (ggml-opt's AdamW), on the same tokens as kiln bench, timed per step.
 *
 *   build/bench/llamacpp_train MODEL.gguf TOKENS [--ctx T] [--batch B] [--steps N]
 *       [--warmup W] [--threads N] [--lr X] [--optim kiln|llama] [--peak GFLOPS]
 *       [--pad-lora ADAPTER.gguf [--pad-lora-n N]] [--libs DIR] [--verbose]
 *
 * TOKENS: the word `bench` (the inputs and targets `kiln bench` draws: its
 * generator, seed 99, B rows of T, the same batch every step), or a kiln
 * token shard (`kiln tokenize`'s train.bin: consecutive windows of T + 1
 * tokens, input w[0..T), targets w[1..T]).
 *
 * llama.cpp trains one sequence per micro-batch (n_ctx = n_batch = n_ubatch
 * = T here, so ggml-opt's opt_period is 1): a step of B sequences is B
 * forward + backward passes, each followed by its own AdamW update. The
 * libraries are node-llama-cpp's prebuilt CPU binaries (scripts/deps.sh
 * --test puts them in tests/node/node_modules), opened with dlopen; the
 * structs below are llama.h's and ggml-opt.h's of the llama.cpp those
 * binaries were built from (node-llama-cpp 3.21.1, llama.cpp "v0.4.0",
 * the source in node-llama-cpp/llama/gitRelease.bundle, commit 80fb11ac),
 * and the program checks them against the library's own defaults before
 * it trusts them. Exit 77 (skip) when the libraries are not there.
 *
 * Two workarounds for that llama.cpp (see main): one decoded token first,
 * so that the CPU backend takes --threads (its training path never sets
 * it), and --pad-lora, adapters loaded but never applied, which enlarge the
 * scheduler's graph budget that a model past ~2 layers overflows in training.
 *
 * Prints one line per step (ms, tokens/s, loss: the mean cross-entropy of
 * the step's B sequences), whether the loss fell, and one line
 *   RESULT mode=llamacpp precision=fp32 threads=N tokens_s=... mfu=... peak_mb=... ms=... optim_ms=nan ...
 * as kiln bench --results prints (bench/compare.sh reads it); tokens/s is
 * the median over the timed steps, after --warmup untimed ones. */
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "kiln/core.h"
#include "kiln/data.h"

/* ---- llama.cpp's types, as its headers at that commit declare them ---- */

struct ggml_tensor;
struct llama_model;
struct llama_context;
struct llama_vocab;
struct llama_adapter_lora;
typedef struct ggml_opt_dataset *ggml_opt_dataset_t;
typedef struct ggml_opt_context *ggml_opt_context_t;
typedef struct ggml_opt_result *ggml_opt_result_t;

enum { LL_GGML_TYPE_F32 = 0, LL_GGML_TYPE_F16 = 1, LL_GGML_TYPE_I32 = 26 };                  /* enum ggml_type */
enum { LL_LOG_WARN = 3, LL_LOG_ERROR = 4, LL_LOG_CONT = 5 };                                /* enum ggml_log_level */
enum { LL_LOAD_MODE_AUTO = -1, LL_LOAD_MODE_NONE = 0 };                                     /* enum llama_load_mode */
enum { LL_FLASH_ATTN_AUTO = -1, LL_FLASH_ATTN_DISABLED = 0 };                               /* enum llama_flash_attn_type */
enum { LL_OPTIMIZER_ADAMW = 0 };                                                            /* enum ggml_opt_optimizer_type */

typedef void (*ll_log_callback)(int level, const char *text, void *user);
typedef bool (*ll_progress_callback)(float progress, void *user);

/* llama.h: struct llama_model_params (enums are int-sized) */
struct ll_model_params {
    void **devices;
    const void *tensor_buft_overrides;
    int32_t n_gpu_layers;
    int split_mode;
    int load_mode;
    int lazy_mode;
    int32_t main_gpu;
    const float *tensor_split;
    ll_progress_callback progress_callback;
    void *progress_callback_user_data;
    const void *kv_overrides;
    bool vocab_only, check_tensors, use_extra_bufts, no_host, no_alloc, load_mtp;
};

/* llama.h: struct llama_context_params */
struct ll_context_params {
    uint32_t n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_outputs_max, n_outputs_max_per_seq;
    int32_t n_threads, n_threads_batch;
    int ctx_type, rope_scaling_type, pooling_type, attention_type, flash_attn_type;
    float rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    uint32_t yarn_orig_ctx;
    float defrag_thold;
    void *cb_eval, *cb_eval_user_data;
    int type_k, type_v;
    void *abort_callback, *abort_callback_data;
    bool embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified;
    void *samplers;
    size_t n_samplers;
    struct llama_context *ctx_other;
};

/* ggml-opt.h: struct ggml_opt_optimizer_params */
struct ll_optimizer_params {
    struct {
        float alpha, beta1, beta2, eps, wd;
    } adamw;
    struct {
        float alpha, wd;
    } sgd;
};
typedef struct ll_optimizer_params (*ll_get_optimizer_params)(void *user);
typedef bool (*ll_param_filter)(const struct ggml_tensor *t, void *user);

/* llama.h: struct llama_opt_params */
struct ll_opt_params {
    uint32_t n_ctx_train;
    ll_param_filter param_filter;
    void *param_filter_ud;
    ll_get_optimizer_params get_opt_pars;
    void *get_opt_pars_ud;
    int optimizer_type;
};

/* llama.h: struct llama_batch */
struct ll_batch {
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
};

typedef void (*ll_epoch_callback)(bool train, ggml_opt_context_t opt, ggml_opt_dataset_t data, ggml_opt_result_t result,
                                  int64_t ibatch, int64_t ibatch_max, int64_t t_start_us);

/* the x86-64 System V sizes of the structs above, as the headers lay them out */
_Static_assert(sizeof(struct ll_model_params) == 80, "llama_model_params is 80 bytes");
_Static_assert(sizeof(struct ll_context_params) == 160, "llama_context_params is 160 bytes");
_Static_assert(sizeof(struct ll_optimizer_params) == 28, "ggml_opt_optimizer_params is 28 bytes");
_Static_assert(sizeof(struct ll_opt_params) == 48, "llama_opt_params is 48 bytes");
_Static_assert(sizeof(struct ll_batch) == 56, "llama_batch is 56 bytes");

static struct {
    void *lib;
    void (*ggml_backend_load_all_from_path)(const char *dir);
    void (*llama_log_set)(ll_log_callback cb, void *user);
    void (*llama_backend_init)(void);
    void (*llama_backend_free)(void);
    const char *(*llama_print_system_info)(void);
    struct ll_model_params (*llama_model_default_params)(void);
    struct ll_context_params (*llama_context_default_params)(void);
    struct llama_model *(*llama_model_load_from_file)(const char *path, struct ll_model_params p);
    void (*llama_model_free)(struct llama_model *m);
    struct llama_context *(*llama_init_from_model)(struct llama_model *m, struct ll_context_params p);
    void (*llama_free)(struct llama_context *c);
    uint32_t (*llama_n_ctx)(const struct llama_context *c);
    struct llama_adapter_lora *(*llama_adapter_lora_init)(struct llama_model *m, const char *path);
    void (*llama_adapter_lora_free)(struct llama_adapter_lora *a);
    struct ll_batch (*llama_batch_get_one)(int32_t *tokens, int32_t n);
    int32_t (*llama_decode)(struct llama_context *c, struct ll_batch b);
    void (*llama_memory_clear)(void *mem, bool data);
    void *(*llama_get_memory)(const struct llama_context *c);
    const struct llama_vocab *(*llama_model_get_vocab)(const struct llama_model *m);
    int32_t (*llama_vocab_n_tokens)(const struct llama_vocab *v);
    uint64_t (*llama_model_n_params)(const struct llama_model *m);
    int32_t (*llama_model_n_embd)(const struct llama_model *m);
    int32_t (*llama_model_n_layer)(const struct llama_model *m);
    int32_t (*llama_model_n_head)(const struct llama_model *m);
    int32_t (*llama_model_n_head_kv)(const struct llama_model *m);
    int32_t (*llama_model_meta_val_str)(const struct llama_model *m, const char *key, char *buf, size_t n);
    bool (*llama_opt_param_filter_all)(const struct ggml_tensor *t, void *user);
    void (*llama_opt_init)(struct llama_context *c, struct llama_model *m, struct ll_opt_params p);
    void (*llama_opt_epoch)(struct llama_context *c, ggml_opt_dataset_t data, ggml_opt_result_t train,
                            ggml_opt_result_t eval, int64_t idata_split, ll_epoch_callback cb_train,
                            ll_epoch_callback cb_eval);
    ggml_opt_dataset_t (*ggml_opt_dataset_init)(int type_data, int type_label, int64_t ne_datapoint, int64_t ne_label,
                                                int64_t ndata, int64_t ndata_shard);
    void (*ggml_opt_dataset_free)(ggml_opt_dataset_t d);
    struct ggml_tensor *(*ggml_opt_dataset_data)(ggml_opt_dataset_t d);
    struct ggml_tensor *(*ggml_opt_dataset_labels)(ggml_opt_dataset_t d);
    void *(*ggml_get_data)(const struct ggml_tensor *t);
    ggml_opt_result_t (*ggml_opt_result_init)(void);
    void (*ggml_opt_result_free)(ggml_opt_result_t r);
    void (*ggml_opt_result_reset)(ggml_opt_result_t r);
    void (*ggml_opt_result_loss)(ggml_opt_result_t r, double *loss, double *unc);
    struct ll_optimizer_params (*ggml_opt_get_default_optimizer_params)(void *user);
} L;

static bool verbose;

static void log_cb(int level, const char *text, void *user) {
    (void)user;
    static int last = 0;
    if (level != LL_LOG_CONT) last = level;
    if (verbose || last == LL_LOG_WARN || last == LL_LOG_ERROR) fputs(text, stderr);
}

/* The directory of node-llama-cpp's CPU binaries: --libs, else from this
 * program's place (BUILD/bench/x -> the repository root). */
static void default_lib_dir(char *out, size_t n) {
    char self[1024];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    self[k > 0 ? k : 0] = 0;
    snprintf(out, n, "%s/../../tests/node/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64", dirname(self));
}

/* 0 loaded; 77 the libraries are not there; 1 there but unusable */
static int load_llama(const char *dir) {
    char path[1400];
    snprintf(path, sizeof path, "%s/libllama.v0.4.0.so", dir);
    const char *need[] = {"libllama.v0.4.0.so", "libggml.v0.4.0.so", "libggml-base.so"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", dir, need[i]);
        if (access(p, R_OK) != 0) {
            fprintf(stderr, "llamacpp_train: skip: %s not found (node-llama-cpp 3.21.1's prebuilt linux-x64 CPU binaries; "
                            "scripts/deps.sh --test installs them, or pass --libs DIR)\n", p);
            return 77;
        }
    }
    L.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!L.lib) {
        fprintf(stderr, "llamacpp_train: skip: dlopen %s: %s\n", path, dlerror());
        return 77;
    }
    /* dlsym on libllama's handle also searches the libraries it needs
     * (libggml, libggml-base), where the ggml functions live */
#define SYM(name)                                                                                       \
    do {                                                                                                \
        *(void **)&L.name = dlsym(L.lib, #name);                                                        \
        if (!L.name) {                                                                                  \
            fprintf(stderr, "llamacpp_train: %s (or the ggml it loads) lacks %s: not the llama.cpp this " \
                            "program was written for\n", path, #name);                                  \
            return 1;                                                                                   \
        }                                                                                               \
    } while (0)
    SYM(ggml_backend_load_all_from_path);
    SYM(llama_log_set);
    SYM(llama_backend_init);
    SYM(llama_backend_free);
    SYM(llama_print_system_info);
    SYM(llama_model_default_params);
    SYM(llama_context_default_params);
    SYM(llama_model_load_from_file);
    SYM(llama_model_free);
    SYM(llama_init_from_model);
    SYM(llama_free);
    SYM(llama_n_ctx);
    SYM(llama_adapter_lora_init);
    SYM(llama_adapter_lora_free);
    SYM(llama_batch_get_one);
    SYM(llama_decode);
    SYM(llama_memory_clear);
    SYM(llama_get_memory);
    SYM(llama_model_get_vocab);
    SYM(llama_vocab_n_tokens);
    SYM(llama_model_n_params);
    SYM(llama_model_n_embd);
    SYM(llama_model_n_layer);
    SYM(llama_model_n_head);
    SYM(llama_model_n_head_kv);
    SYM(llama_model_meta_val_str);
    SYM(llama_opt_param_filter_all);
    SYM(llama_opt_init);
    SYM(llama_opt_epoch);
    SYM(ggml_opt_dataset_init);
    SYM(ggml_opt_dataset_free);
    SYM(ggml_opt_dataset_data);
    SYM(ggml_opt_dataset_labels);
    SYM(ggml_get_data);
    SYM(ggml_opt_result_init);
    SYM(ggml_opt_result_free);
    SYM(ggml_opt_result_reset);
    SYM(ggml_opt_result_loss);
    SYM(ggml_opt_get_default_optimizer_params);
#undef SYM
    return 0;
}

/* The struct layouts above, checked field by field against what the
 * library's default-params functions set (llama-model.cpp's and
 * llama-context.cpp's defaults at that commit): a shifted field would show
 * up as a wrong value here before any of them is passed back. */
static bool check_layouts(void) {
    struct ll_model_params m = L.llama_model_default_params();
    struct ll_context_params c = L.llama_context_default_params();
    struct ll_optimizer_params o = L.ggml_opt_get_default_optimizer_params(NULL);
    struct {
        const char *what;
        bool ok;
    } k[] = {
        {"model.devices == NULL", m.devices == NULL},
        {"model.tensor_buft_overrides == NULL", m.tensor_buft_overrides == NULL},
        {"model.n_gpu_layers == -1", m.n_gpu_layers == -1},
        {"model.split_mode == LAYER (1)", m.split_mode == 1},
        {"model.load_mode == AUTO (-1)", m.load_mode == LL_LOAD_MODE_AUTO},
        {"model.lazy_mode == AUTO (1)", m.lazy_mode == 1},
        {"model.main_gpu == 0", m.main_gpu == 0},
        {"model.tensor_split == NULL", m.tensor_split == NULL},
        {"model.progress_callback == NULL", m.progress_callback == NULL},
        {"model.kv_overrides == NULL", m.kv_overrides == NULL},
        {"model bools: vocab_only 0, check_tensors 0, use_extra_bufts 1, no_host 0, no_alloc 0, load_mtp 0",
         !m.vocab_only && !m.check_tensors && m.use_extra_bufts && !m.no_host && !m.no_alloc && !m.load_mtp},
        {"context.n_ctx/n_batch/n_ubatch == 512/2048/512", c.n_ctx == 512 && c.n_batch == 2048 && c.n_ubatch == 512},
        {"context.n_seq_max/n_rs_seq/n_outputs_max/n_outputs_max_per_seq == 1/0/0/1",
         c.n_seq_max == 1 && c.n_rs_seq == 0 && c.n_outputs_max == 0 && c.n_outputs_max_per_seq == 1},
        {"context.n_threads == n_threads_batch == 4 (GGML_DEFAULT_N_THREADS)", c.n_threads == 4 && c.n_threads_batch == 4},
        {"context.flash_attn_type == AUTO (-1)", c.flash_attn_type == LL_FLASH_ATTN_AUTO},
        {"context.rope_freq_base/scale == 0", c.rope_freq_base == 0 && c.rope_freq_scale == 0},
        {"context.yarn_* == -1 (ext, attn, beta_fast, beta_slow)",
         c.yarn_ext_factor == -1 && c.yarn_attn_factor == -1 && c.yarn_beta_fast == -1 && c.yarn_beta_slow == -1},
        {"context.yarn_orig_ctx == 0, defrag_thold == -1", c.yarn_orig_ctx == 0 && c.defrag_thold == -1},
        {"context.cb_eval/abort_callback == NULL", !c.cb_eval && !c.cb_eval_user_data && !c.abort_callback && !c.abort_callback_data},
        {"context.type_k == type_v == F16", c.type_k == LL_GGML_TYPE_F16 && c.type_v == LL_GGML_TYPE_F16},
        {"context bools: embeddings 0, offload_kqv 1, no_perf 1, op_offload 1, swa_full 1, kv_unified 0",
         !c.embeddings && c.offload_kqv && c.no_perf && c.op_offload && c.swa_full && !c.kv_unified},
        {"context.samplers/n_samplers/ctx_other == NULL/0/NULL", !c.samplers && c.n_samplers == 0 && !c.ctx_other},
        {"AdamW defaults 1e-3, 0.9, 0.999, 1e-8, wd 0; SGD 1e-3, wd 0",
         o.adamw.alpha == 1e-3f && o.adamw.beta1 == 0.9f && o.adamw.beta2 == 0.999f && o.adamw.eps == 1e-8f &&
             o.adamw.wd == 0 && o.sgd.alpha == 1e-3f && o.sgd.wd == 0},
    };
    bool ok = true;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!k[i].ok) {
            fprintf(stderr, "llamacpp_train: struct layout check failed: %s\n", k[i].what);
            ok = false;
        }
    if (!ok) fprintf(stderr, "llamacpp_train: the library is not the llama.cpp whose llama.h this program declares\n");
    return ok;
}

/* ---- the optimiser's settings and the per-batch timing ---- */

static struct ll_optimizer_params opt_pars;
static struct ll_optimizer_params get_opt_pars(void *user) {
    (void)user;
    return opt_pars;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double *done_at; /* done_at[i]: when datapoint i's update finished */
static double *loss_at; /* its cross-entropy (mean over its T tokens) */
static int64_t n_done, n_total;

/* called after each micro-batch (here: one sequence, one AdamW update) */
static void on_batch(bool train, ggml_opt_context_t opt, ggml_opt_dataset_t data, ggml_opt_result_t result, int64_t ibatch,
                     int64_t ibatch_max, int64_t t_start_us) {
    (void)opt, (void)data, (void)ibatch, (void)ibatch_max, (void)t_start_us;
    if (!train || n_done >= n_total) return;
    double loss = NAN;
    L.ggml_opt_result_loss(result, &loss, NULL);
    L.ggml_opt_result_reset(result); /* the next reading is of the next sequence alone */
    loss_at[n_done] = loss;
    done_at[n_done++] = now_s();
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: llamacpp_train MODEL.gguf TOKENS [options]\n"
            "Full fine-tuning (AdamW) of MODEL.gguf (kiln export --type f32) with llama.cpp's own trainer\n"
            "(llama_opt_init / llama_opt_epoch of node-llama-cpp's prebuilt libllama), timed per step.\n"
            "TOKENS: `bench` (kiln bench's random inputs and targets: seed 99, the same batch every step)\n"
            "        or a kiln token shard (kiln tokenize's train.bin: windows of T + 1 tokens)\n"
            "  --ctx T          tokens per sequence (default 256; llama.cpp's n_ctx = n_batch = n_ubatch)\n"
            "  --batch B        sequences per step (default 8; llama.cpp updates after each one)\n"
            "  --steps N        timed steps (default 5; the median is reported)\n"
            "  --warmup N       untimed steps first (default 1)\n"
            "  --threads N      llama.cpp's n_threads and n_threads_batch (default: all cores)\n"
            "  --lr X           learning rate (default 1e-3)\n"
            "  --optim O        kiln (default: kiln train's AdamW: betas 0.9, 0.95, eps 1e-8, weight decay 0.1)\n"
            "                   or llama (ggml-opt's defaults: betas 0.9, 0.999, eps 1e-8, no weight decay)\n"
            "  --peak GFLOPS    fp32 peak for the MFU column (kiln bench's; default: no MFU)\n"
            "  --pad-lora FILE  a LoRA adapter GGUF of the model (kiln export --gguf-lora), loaded --pad-lora-n\n"
            "                   times and never applied: llama.cpp sizes its scheduler's graph for inference\n"
            "                   (max(1024, 8 x tensors) nodes, + 6 per adapted matrix of each loaded adapter), and\n"
            "                   the training graph of a model of more than ~2 layers aborts without the room\n"
            "  --pad-lora-n N   how many times (default 4)\n"
            "  --libs DIR       node-llama-cpp's bins/linux-x64 (default: tests/node/node_modules/...)\n"
            "  --verbose        llama.cpp's log on stderr (default: warnings and errors only)\n"
            "exit status: 0 done, 1 error, 2 usage, 77 node-llama-cpp's libraries not found (skip)\n");
}

static bool parse_num(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *tokens = NULL, *libs = NULL, *optim = "kiln", *pad_lora = NULL;
    double T = 256, B = 8, steps = 5, warmup = 1, threads = 0, lr = 1e-3, peak = 0, pad_n = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        struct {
            const char *name;
            double *v, lo, hi;
        } nums[] = {{"--ctx", &T, 2, 1 << 20},      {"--batch", &B, 1, 1 << 16}, {"--steps", &steps, 1, 1 << 20},
                    {"--warmup", &warmup, 0, 1000}, {"--threads", &threads, 1, 1024}, {"--lr", &lr, 1e-12, 10},
                    {"--peak", &peak, 0, 1e9}, {"--pad-lora-n", &pad_n, 1, 64}};
        bool done = false;
        for (size_t k = 0; k < sizeof nums / sizeof nums[0] && !done; k++)
            if (!strcmp(a, nums[k].name)) {
                if (i + 1 >= argc || !parse_num(argv[i + 1], nums[k].lo, nums[k].hi, nums[k].v) ||
                    (nums[k].v != &lr && nums[k].v != &peak && *nums[k].v != floor(*nums[k].v))) {
                    fprintf(stderr, "llamacpp_train: %s takes a number in [%g, %g]%s\n", a, nums[k].lo, nums[k].hi,
                            nums[k].v != &lr && nums[k].v != &peak ? " (an integer)" : "");
                    return 2;
                }
                i++, done = true;
            }
        if (done) continue;
        if (!strcmp(a, "--libs") && i + 1 < argc) libs = argv[++i];
        else if (!strcmp(a, "--optim") && i + 1 < argc) optim = argv[++i];
        else if (!strcmp(a, "--pad-lora") && i + 1 < argc) pad_lora = argv[++i];
        else if (!strcmp(a, "--verbose")) verbose = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "llamacpp_train: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!model_path) model_path = a;
        else if (!tokens) tokens = a;
        else {
            fprintf(stderr, "llamacpp_train: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!model_path || !tokens) {
        usage(stderr);
        return 2;
    }
    if (strcmp(optim, "kiln") && strcmp(optim, "llama")) {
        fprintf(stderr, "llamacpp_train: --optim is kiln or llama, not '%s'\n", optim);
        return 2;
    }
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (double)n : 1;
    }
    const int64_t nT = (int64_t)T, nB = (int64_t)B, nsteps = (int64_t)steps, nwarm = (int64_t)warmup;

    char dir[1200];
    if (libs) snprintf(dir, sizeof dir, "%s", libs);
    else default_lib_dir(dir, sizeof dir);
    int rc = load_llama(dir);
    if (rc) return rc;
    if (!check_layouts()) return 1;

    L.llama_log_set(log_cb, NULL);
    L.ggml_backend_load_all_from_path(dir); /* the CPU backend: the best libggml-cpu-*.so for this CPU */
    L.llama_backend_init();

    struct ll_model_params mp = L.llama_model_default_params();
    mp.load_mode = LL_LOAD_MODE_NONE; /* as llama.cpp's finetune: weights in writable buffers, not mmap */
    mp.n_gpu_layers = 0;
    struct llama_model *model = L.llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "llamacpp_train: llama.cpp could not load %s (run with --verbose for its log)\n", model_path);
        return 1;
    }
    /* adapters loaded before the context count in its graph budget
     * (llama_context::graph_max_nodes); none is ever set on the context */
    struct llama_adapter_lora *pads[64];
    int n_pads = 0;
    for (int k = 0; pad_lora && k < (int)pad_n; k++) {
        if (!(pads[n_pads] = L.llama_adapter_lora_init(model, pad_lora))) {
            fprintf(stderr, "llamacpp_train: llama.cpp could not load the adapter %s\n", pad_lora);
            return 1;
        }
        n_pads++;
    }
    struct ll_context_params cp = L.llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = (uint32_t)nT; /* one sequence per micro-batch, one update each */
    cp.n_threads = cp.n_threads_batch = (int32_t)threads;
    cp.flash_attn_type = LL_FLASH_ATTN_DISABLED; /* no backward pass for FLASH_ATTN_EXT (opt_init turns it off too) */
    cp.type_k = cp.type_v = LL_GGML_TYPE_F32;    /* as finetune forces: OUT_PROD has no f16 */
    struct llama_context *ctx = L.llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llamacpp_train: llama_init_from_model failed (n_ctx %lld)\n", (long long)nT);
        L.llama_model_free(model);
        return 1;
    }
    /* llama.cpp pads n_ctx to a multiple of 256: a context then holds
     * per = n_ctx / T sequences, trained one after the other as micro-batches
     * of T (one update each) that sit in the same KV cache, each later one
     * attending to those before it (opt_epoch clears the cache per context) */
    const uint32_t nctx = L.llama_n_ctx(ctx);
    if (nctx % (uint32_t)nT) {
        fprintf(stderr, "llamacpp_train: llama.cpp made n_ctx %u of --ctx %lld, not a multiple of it: pick a --ctx that "
                        "divides 256 or is a multiple of 256\n", nctx, (long long)nT);
        return 1;
    }
    const int64_t per = (int64_t)nctx / nT;
    const int32_t V = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model));
    const int64_t C = L.llama_model_n_embd(model), NL = L.llama_model_n_layer(model), H = L.llama_model_n_head(model),
                  KV = L.llama_model_n_head_kv(model);
    char arch[64] = "llama", key[160], val[64];
    L.llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    int64_t I = 0, hd = H ? C / H : 0;
    snprintf(key, sizeof key, "%s.feed_forward_length", arch);
    if (L.llama_model_meta_val_str(model, key, val, sizeof val) > 0) I = atoll(val);
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    if (L.llama_model_meta_val_str(model, key, val, sizeof val) > 0) hd = atoll(val);
    /* kiln_llama_flops_per_token's count: 6 x the matrix products' weights
     * (the head once) + 6 x layers x T x query width (causal attention) */
    const double qd = (double)(H * hd), kd = (double)(KV * hd);
    const double flops_tok = 6.0 * ((double)NL * (2 * C * qd + 2 * C * kd + 3.0 * C * I) + (double)V * C) + 6.0 * NL * T * qd;

    /* the dataset: B * (warmup + steps) sequences of T tokens (rounded up to
     * whole contexts of per sequences; the extra ones train untimed), labels
     * beside; datapoint d is sequences d * per ... d * per + per - 1 */
    const int64_t ntimed = nB * (nwarm + nsteps), ndp = (ntimed + per - 1) / per, ndata = ndp * per;
    ggml_opt_dataset_t ds = L.ggml_opt_dataset_init(LL_GGML_TYPE_I32, LL_GGML_TYPE_I32, (int64_t)nctx, (int64_t)nctx, ndp, 1);
    int32_t *data = L.ggml_get_data(L.ggml_opt_dataset_data(ds)), *labels = L.ggml_get_data(L.ggml_opt_dataset_labels(ds));
    const char *source;
    char src_buf[1400];
    if (!strcmp(tokens, "bench")) {
        /* kiln bench's inputs: host[i] and host[B*T + i] drawn in turn */
        kiln_rng rng = {99, 0};
        int32_t *in = malloc((size_t)(2 * nB * nT) * sizeof *in);
        if (!in) return 1;
        for (int64_t i = 0; i < nB * nT; i++) {
            in[i] = (int32_t)(kiln_rng_next_u64(&rng) % (uint64_t)V);
            in[nB * nT + i] = (int32_t)(kiln_rng_next_u64(&rng) % (uint64_t)V);
        }
        for (int64_t d = 0; d < ndata; d++) {
            memcpy(data + d * nT, in + (d % nB) * nT, (size_t)nT * sizeof *in);
            memcpy(labels + d * nT, in + nB * nT + (d % nB) * nT, (size_t)nT * sizeof *in);
        }
        free(in);
        source = "kiln bench's random inputs and targets (seed 99), the same batch every step";
    } else {
        kiln_shard *sh;
        if (kiln_shard_open(tokens, &sh)) {
            fprintf(stderr, "llamacpp_train: %s\n", kiln_last_error());
            return 1;
        }
        uint64_t count = kiln_shard_get_info(sh)->count, nwin = count > (uint64_t)nT ? (count - 1) / (uint64_t)nT : 0;
        if (!nwin) {
            fprintf(stderr, "llamacpp_train: %s holds %llu tokens, fewer than one window of %lld + 1\n", tokens,
                    (unsigned long long)count, (long long)nT);
            return 1;
        }
        for (int64_t d = 0; d < ndata; d++) {
            uint64_t s = ((uint64_t)d % nwin) * (uint64_t)nT;
            for (int64_t t = 0; t < nT; t++) {
                uint32_t a = kiln_shard_token(sh, s + (uint64_t)t), b = kiln_shard_token(sh, s + (uint64_t)t + 1);
                if (a >= (uint32_t)V || b >= (uint32_t)V) {
                    fprintf(stderr, "llamacpp_train: %s: token %u is not below the model's vocabulary of %d\n", tokens,
                            a >= (uint32_t)V ? a : b, V);
                    return 1;
                }
                data[d * nT + t] = (int32_t)a, labels[d * nT + t] = (int32_t)b;
            }
        }
        kiln_shard_close(sh);
        snprintf(src_buf, sizeof src_buf, "%s: %llu windows of %lld + 1 tokens, in order%s", tokens, (unsigned long long)nwin,
                 (long long)nT, (uint64_t)ndata > nwin ? ", repeated" : "");
        source = src_buf;
    }

    if (!strcmp(optim, "kiln")) {
        opt_pars = L.ggml_opt_get_default_optimizer_params(NULL);
        opt_pars.adamw.beta2 = 0.95f, opt_pars.adamw.wd = 0.1f;
    } else {
        opt_pars = L.ggml_opt_get_default_optimizer_params(NULL);
    }
    opt_pars.adamw.alpha = opt_pars.sgd.alpha = (float)lr;
    struct ll_opt_params op = {.n_ctx_train = 0,
                               .param_filter = L.llama_opt_param_filter_all,
                               .param_filter_ud = NULL,
                               .get_opt_pars = get_opt_pars,
                               .get_opt_pars_ud = NULL,
                               .optimizer_type = LL_OPTIMIZER_ADAMW};
    /* llama.cpp's training path (opt_epoch -> ggml_opt_eval) never gives the
     * CPU backend the context's thread count: only llama_decode does
     * (graph_compute), and the backend keeps it. Without this one-token
     * decode, training runs on ggml's default of 4 threads whatever
     * n_threads says (on a 2-core machine: spinning at barriers). */
    {
        int32_t tok0 = data[0];
        if (L.llama_decode(ctx, L.llama_batch_get_one(&tok0, 1)) != 0) {
            fprintf(stderr, "llamacpp_train: llama_decode of one token failed\n");
            return 1;
        }
        L.llama_memory_clear(L.llama_get_memory(ctx), true);
    }
    L.llama_opt_init(ctx, model, op);

    printf("llama.cpp trainer (node-llama-cpp 3.21.1's libllama, llama.cpp v0.4.0 / 80fb11ac) from %s\n", dir);
    printf("system: %s\n", L.llama_print_system_info());
    printf("model %s: %.2fM parameters (llama.cpp's count), vocab %d, %lld layers, hidden %lld, ffn %lld; "
           "batch %lld x %lld, %d threads\n", model_path, (double)L.llama_model_n_params(model) / 1e6, V, (long long)NL,
           (long long)C, (long long)I, (long long)nB, (long long)nT, (int)threads);
    printf("tokens: %s\n", source);
    if (n_pads)
        printf("graph room: %s loaded %d times, never applied (it only enlarges llama.cpp's scheduler graph budget)\n",
               pad_lora, n_pads);
    printf("optimizer: AdamW (ggml-opt) lr %g betas %g, %g eps %g weight decay %g (--optim %s), after each sequence; "
           "model FLOPs %.1f MFLOP/token\n", (double)opt_pars.adamw.alpha, (double)opt_pars.adamw.beta1,
           (double)opt_pars.adamw.beta2, (double)opt_pars.adamw.eps, (double)opt_pars.adamw.wd, optim, flops_tok / 1e6);
    fflush(stdout);

    if (per > 1)
        printf("note: llama.cpp pads n_ctx to %u: %lld sequences of %lld per context, one after the other in its KV cache "
               "(each attends to those before it: more attention work than kiln's independent rows)\n", nctx,
               (long long)per, (long long)nT);
    fflush(stdout);
    done_at = calloc((size_t)ntimed, sizeof *done_at);
    loss_at = calloc((size_t)ntimed, sizeof *loss_at);
    if (!done_at || !loss_at) return 1;
    n_total = ntimed;
    ggml_opt_result_t res = L.ggml_opt_result_init();
    double t0 = now_s();
    L.llama_opt_epoch(ctx, ds, res, NULL, ndp, on_batch, NULL);
    if (n_done != ntimed) {
        fprintf(stderr, "llamacpp_train: llama_opt_epoch trained %lld of %lld sequences (see its log)\n", (long long)n_done,
                (long long)ntimed);
        return 1;
    }

    int64_t nstep_all = nwarm + nsteps;
    double *ms = calloc((size_t)nstep_all, sizeof *ms), *sorted = calloc((size_t)nsteps, sizeof *sorted);
    double *sloss = calloc((size_t)nstep_all, sizeof *sloss);
    if (!ms || !sorted || !sloss) return 1;
    bool finite = true;
    for (int64_t s = 0; s < nstep_all; s++) {
        double start = s ? done_at[s * nB - 1] : t0, end = done_at[(s + 1) * nB - 1], l = 0;
        for (int64_t j = s * nB; j < (s + 1) * nB; j++) l += loss_at[j];
        ms[s] = 1e3 * (end - start), sloss[s] = l / (double)nB;
        finite = finite && isfinite(sloss[s]);
        printf("step %lld%s: %9.1f ms %9.0f tokens/s  loss %.4f\n", (long long)s + 1, s < nwarm ? " (warm-up)" : "", ms[s],
               (double)(nB * nT) / (ms[s] / 1e3), sloss[s]);
        if (s >= nwarm) sorted[s - nwarm] = ms[s];
    }
    qsort(sorted, (size_t)nsteps, sizeof *sorted, cmp_d);
    double med = nsteps % 2 ? sorted[nsteps / 2] : 0.5 * (sorted[nsteps / 2 - 1] + sorted[nsteps / 2]);
    double tok_s = (double)(nB * nT) / (med / 1e3), gflops = flops_tok * tok_s / 1e9;
    double first = loss_at[0], last = sloss[nstep_all - 1];
    if (!finite) printf("loss: NOT finite in some step (see above)\n");
    else if (nstep_all < 2 && nB < 2) printf("loss: %.4f (one sequence: nothing to compare)\n", first);
    else
        printf("loss: first sequence %.4f, last step %.4f: %s\n", first, last,
               last < first ? "decreasing" : "NOT decreasing (reported, not an error)");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double peak_mb = (double)ru.ru_maxrss / 1024.0;
    printf("median of %lld steps: %.1f ms/step, %.0f tokens/s, %.1f GFLOP/s", (long long)nsteps, med, tok_s, gflops);
    if (peak > 0) printf(", MFU %.1f%% of %.0f GFLOP/s", 100 * gflops / peak, peak);
    printf(", peak RSS %.0f MB\n", peak_mb);
    printf("RESULT mode=llamacpp precision=fp32 threads=%d tokens_s=%.1f mfu=%.4f peak_mb=%.0f ms=%.1f optim_ms=nan "
           "loss_first=%.4f loss_last=%.4f loss_finite=%d\n", (int)threads, tok_s, peak > 0 ? gflops / peak : 0.0, peak_mb,
           med, first, last, finite);

    free(ms), free(sorted), free(sloss), free(done_at), free(loss_at);
    L.ggml_opt_result_free(res);
    L.ggml_opt_dataset_free(ds);
    L.llama_free(ctx);
    for (int k = 0; k < n_pads; k++) L.llama_adapter_lora_free(pads[k]);
    L.llama_model_free(model);
    L.llama_backend_free();
    return 0;
}
