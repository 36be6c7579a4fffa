/* A run's LoRA adapters as a GGUF adapter file that llama.cpp applies over
 * the base's GGUF (llama_adapter_lora_init in llama-adapter.cpp): metadata
 * general.type "adapter", adapter.type "lora", adapter.lora.alpha and the
 * base's general.architecture; per adapted linear W (named as the base
 * file names it) the pair W.lora_a, W.lora_b, which llama.cpp checks
 * against W (a's rows as long as W's, b as many rows as W) and adds as
 * scale * b (a x) with scale = alpha / rank (rank: b's row length). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "export_gguf_impl.h"
#include "hostio.h"

#define PATH_CAP 4096

/* llama.cpp's name of each LoRA target's weight (KILN_LORA_* order) */
static const char *const target_tensor[KILN_LORA_N] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                       "ffn_gate", "ffn_up", "ffn_down"};

typedef struct {
    char name[64];
    const kiln_tensor *t;
    int heads; /* > 0: a q/k B, rows reordered per head as the base's */
} lora_out;

/* One adapter matrix in F32, rows in the file's order. */
static kiln_status write_matrix(kiln_gguf_writer *w, const lora_out *o, float *row) {
    void *owned = NULL;
    const float *x = kiln_host_bytes(o->t, &owned);
    if (!x) return kiln_error_context(kiln_last_status(), "tensor %s", o->name);
    int64_t rows = o->t->shape[0], cols = o->t->shape[1];
    kiln_status st = KILN_OK;
    for (int64_t r = 0; r < rows && !st; r++) {
        int64_t src = kiln_gguf_qk_source_row(rows, o->heads, r);
        for (int64_t j = 0; j < cols && !st; j++) {
            row[j] = x[src * cols + j];
            if (!isfinite(row[j]))
                st = kiln_error(KILN_ERR_NUMERIC, "tensor %s (%s): element [%lld, %lld] is %g", o->t->name, o->name,
                                (long long)src, (long long)j, row[j]);
        }
        if (!st) st = kiln_gguf_write_data(w, row, (size_t)cols * sizeof *row);
    }
    free(owned);
    return st ? kiln_error_context(st, "tensor %s", o->name) : KILN_OK;
}

kiln_status kiln_export_gguf_lora(const char *run_or_model_dir, const char *out_path, const char *name,
                                  kiln_export_gguf_lora_stats *stats) {
    char dir[PATH_CAP], path[PATH_CAP + 32];
    kiln_status st = kiln_model_dir_resolve(run_or_model_dir, dir, sizeof dir);
    if (st) return st;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (access(path, F_OK) != 0)
        return kiln_error(KILN_ERR_INVALID, "%s has no LoRA adapters (%s is missing): no adapter to export", dir, path);
    /* the base's architecture, with the base export's refusals: an adapter
     * of a model llama.cpp cannot run is of no use */
    kiln_llama_config cfg;
    kiln_gguf_arch a;
    snprintf(path, sizeof path, "%s/config.json", dir);
    st = kiln_llama_config_load(path, &cfg);
    if (!st) st = kiln_gguf_plan_arch(path, &cfg, &a);
    if (st) return kiln_error_context(st, "exporting the LoRA adapters of %s to %s", run_or_model_dir, out_path);
    kiln_llama *m = NULL;
    if ((st = kiln_load_model_dir(dir, &m))) return st;
    if (!m->lora_a) {
        kiln_llama_free(m);
        return kiln_error(KILN_ERR_INVALID, "%s: the model loaded without LoRA adapters", dir);
    }
    const kiln_llama_config *c = &m->cfg;
    const kiln_lora_config *lc = &m->lora;
    /* llama.cpp scales by alpha / r: PEFT's rslora alpha / sqrt(r) is
     * alpha * sqrt(r) / r */
    float alpha = (float)(lc->rslora ? lc->alpha * sqrt((double)lc->rank) : lc->alpha);
    int64_t L = c->num_hidden_layers;
    lora_out *o = calloc((size_t)(2 * KILN_LORA_N * L), sizeof *o);
    int n = 0;
    int64_t max_cols = 1, n_values = 0;
    for (int64_t l = 0; o && l < L; l++)
        for (int t = 0; t < KILN_LORA_N; t++) {
            const kiln_tensor *A = m->lora_a[l * KILN_LORA_N + t], *B = m->lora_b[l * KILN_LORA_N + t];
            if (!A || !B) continue;
            int heads = !a.permute ? 0 : t == KILN_LORA_Q ? (int)c->num_attention_heads : t == KILN_LORA_K ? (int)c->num_key_value_heads : 0;
            snprintf(o[n].name, sizeof o[n].name, "blk.%lld.%s.weight.lora_a", (long long)l, target_tensor[t]);
            o[n++].t = A;
            snprintf(o[n].name, sizeof o[n].name, "blk.%lld.%s.weight.lora_b", (long long)l, target_tensor[t]);
            o[n].t = B, o[n++].heads = heads;
            max_cols = A->shape[1] > max_cols ? A->shape[1] : max_cols;
            max_cols = B->shape[1] > max_cols ? B->shape[1] : max_cols;
            n_values += kiln_tensor_numel(A) + kiln_tensor_numel(B);
        }
    const char *slash = strrchr(run_or_model_dir, '/');
    const char *gname = name ? name : (slash && slash[1] ? slash + 1 : run_or_model_dir);
    kiln_gguf_writer *w = NULL;
    float *row = malloc((size_t)max_cols * sizeof *row);
    if (!o || !row) st = kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st) st = kiln_gguf_writer_new(&w);
    if (!st) st = kiln_gguf_set_str(w, "general.architecture", a.arch);
    if (!st) st = kiln_gguf_set_str(w, "general.type", "adapter");
    if (!st) st = kiln_gguf_set_str(w, "general.name", gname);
    if (!st) st = kiln_gguf_set_u32(w, "general.file_type", (uint32_t)KILN_FTYPE_F32);
    if (!st) st = kiln_gguf_set_str(w, "adapter.type", "lora");
    if (!st) st = kiln_gguf_set_f32(w, "adapter.lora.alpha", alpha);
    for (int i = 0; i < n && !st; i++) st = kiln_gguf_add_tensor(w, o[i].name, KILN_GGML_F32, 2, o[i].t->shape);
    if (!st && kiln_export_clean(out_path)) kiln_log(KILN_LOG_WARN, "kiln export: %s", kiln_last_error());
    if (!st) st = kiln_gguf_begin(w, out_path);
    for (int i = 0; i < n && !st; i++) st = write_matrix(w, &o[i], row);
    if (!st) st = kiln_gguf_finish(w);
    if (!st && stats) {
        stats->n_tensors = n;
        stats->rank = lc->rank;
        stats->n_params = n_values;
        stats->data_bytes = 0;
        for (int i = 0; i < n; i++) stats->data_bytes += kiln_gguf_tensor_nbytes(w, i);
        stats->alpha = alpha;
        stats->scaling = kiln_lora_scaling(lc);
        stats->rslora = lc->rslora;
        stats->arch = a.arch;
    }
    free(row);
    free(o);
    kiln_gguf_writer_free(w);
    kiln_llama_free(m);
    return st ? kiln_error_context(st, "exporting the LoRA adapters of %s to %s", run_or_model_dir, out_path) : KILN_OK;
}
