/* LoRA adapters in the files PEFT writes and reads: adapter_config.json and
 * adapter_model.safetensors, tensors named as PEFT names them on a
 * LlamaForCausalLM (base_model.model. + the module path). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "hostio.h"

#define PEFT_PREFIX "base_model.model."

static void peft_name(char *out, size_t n, const char *kiln_name) { snprintf(out, n, PEFT_PREFIX "%s", kiln_name); }

static json_t *number(double v) { return v == floor(v) && fabs(v) < 1e15 ? json_integer((json_int_t)v) : json_real(v); }

kiln_status kiln_lora_save(const char *dir, const kiln_llama *m, const char *base) {
    if (!m->lora_a) return kiln_error(KILN_ERR_INVALID, "kiln_lora_save: the model has no adapters");
    char path[4200];
    json_t *o = json_object(), *targets = json_array();
    if (!o || !targets) return kiln_error(KILN_ERR_OOM, "out of memory");
    for (int t = 0; t < KILN_LORA_N; t++)
        if (m->lora.targets & (1u << t)) json_array_append_new(targets, json_string(kiln_lora_target_name(t)));
    json_object_set_new(o, "alpha_pattern", json_object());
    json_object_set_new(o, "base_model_name_or_path", json_string(base ? base : ""));
    json_object_set_new(o, "bias", json_string("none"));
    json_object_set_new(o, "fan_in_fan_out", json_false());
    json_object_set_new(o, "inference_mode", json_true());
    json_object_set_new(o, "init_lora_weights", json_true());
    json_object_set_new(o, "layers_to_transform", json_null());
    json_object_set_new(o, "lora_alpha", number(m->lora.alpha));
    json_object_set_new(o, "lora_dropout", json_real(m->lora.dropout));
    json_object_set_new(o, "modules_to_save", json_null());
    json_object_set_new(o, "peft_type", json_string("LORA"));
    json_object_set_new(o, "r", json_integer(m->lora.rank));
    json_object_set_new(o, "rank_pattern", json_object());
    json_object_set_new(o, "target_modules", targets);
    json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(o, "use_dora", json_false());
    json_object_set_new(o, "use_rslora", json_boolean(m->lora.rslora));
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (!text) return kiln_error(KILN_ERR_OOM, "out of memory");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    kiln_status st = kiln_write_file_atomic(path, text, strlen(text));
    free(text);
    if (st) return st;

    int n = m->n_params - m->n_base;
    kiln_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    char (*names)[160] = calloc((size_t)n + 1, sizeof *names);
    void **owned = calloc((size_t)n + 1, sizeof *owned); /* host copies of device adapters */
    if (!ts || !names || !owned) {
        free(ts);
        free(names);
        free(owned);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    for (int i = 0; i < n && !st; i++) {
        const kiln_tensor *p = m->params[m->n_base + i];
        peft_name(names[i], sizeof names[i], p->name);
        ts[i] = (kiln_st_tensor){.name = names[i], .dtype = p->dtype, .ndim = p->ndim, .bytes = kiln_host_bytes(p, &owned[i]),
                                 .nbytes = kiln_tensor_nbytes(p)};
        if (!ts[i].bytes) st = kiln_error_context(kiln_last_status(), "saving the LoRA adapters in %s", dir);
        memcpy(ts[i].shape, p->shape, sizeof p->shape[0] * (size_t)p->ndim);
    }
    static const char *const meta[] = {"format", "pt", NULL};
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (!st) st = kiln_st_save(path, ts, n, meta);
    for (int i = 0; i < n; i++) free(owned[i]);
    free(owned);
    free(ts);
    free(names);
    return st;
}

/* A field that must hold `want` (or be absent): PEFT would otherwise compute
 * something kiln does not. */
static kiln_status must_be(json_t *o, const char *path, const char *key, json_t *want) {
    json_t *v = json_object_get(o, key);
    kiln_status st = KILN_OK;
    bool empty_obj = json_is_object(want) && json_is_object(v) && json_object_size(v) == 0;
    if (v && !json_is_null(v) && !empty_obj && !json_equal(v, want)) {
        char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT), *exp = json_dumps(want, JSON_ENCODE_ANY | JSON_COMPACT);
        st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: field '%s' is %s; only %s is implemented", path, key, got ? got : "?",
                        exp ? exp : "?");
        free(got);
        free(exp);
    }
    json_decref(want);
    return st;
}

static kiln_status parse_config(const char *path, kiln_lora_config *lc) {
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return kiln_error(KILN_ERR_FORMAT, "%s: line %d: %s", path, je.line, je.text);
    kiln_status st = KILN_OK;
    memset(lc, 0, sizeof *lc);
    json_t *v;
    if (!json_is_object(o)) st = kiln_error(KILN_ERR_FORMAT, "%s: not a JSON object", path);
    if (!st && (!(v = json_object_get(o, "peft_type")) || !json_is_string(v) || strcmp(json_string_value(v), "LORA")))
        st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: field 'peft_type' must be \"LORA\"", path);
    if (!st) {
        v = json_object_get(o, "r");
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536)
            st = kiln_error(KILN_ERR_FORMAT, "%s: field 'r' must be an integer in [1, 65536]", path);
        else
            lc->rank = (int)json_integer_value(v);
    }
    if (!st) {
        v = json_object_get(o, "lora_alpha");
        if (!json_is_number(v)) st = kiln_error(KILN_ERR_FORMAT, "%s: field 'lora_alpha' must be a number", path);
        else lc->alpha = json_number_value(v);
    }
    if (!st) {
        v = json_object_get(o, "lora_dropout");
        if (v && !json_is_number(v)) st = kiln_error(KILN_ERR_FORMAT, "%s: field 'lora_dropout' must be a number", path);
        else lc->dropout = v ? json_number_value(v) : 0;
    }
    if (!st) {
        v = json_object_get(o, "target_modules");
        if (json_is_string(v) && strcmp(json_string_value(v), "all-linear") == 0) {
            lc->targets = (1u << KILN_LORA_N) - 1;
        } else if (!json_is_array(v) || !json_array_size(v)) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: field 'target_modules' must be a non-empty list of module names", path);
        } else {
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e) {
                unsigned bit = 0;
                if (!json_is_string(e) || (st = kiln_lora_targets_parse(json_string_value(e), &bit))) {
                    st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: target_modules[%zu] is not one of q_proj, k_proj, v_proj, "
                                    "o_proj, gate_proj, up_proj, down_proj", path, i);
                    break;
                }
                lc->targets |= bit;
            }
        }
    }
    if (!st && (v = json_object_get(o, "use_rslora")) && !json_is_null(v)) { /* PEFT: scaling alpha / sqrt(r) */
        if (!json_is_boolean(v)) st = kiln_error(KILN_ERR_FORMAT, "%s: field 'use_rslora' must be true or false", path);
        else lc->rslora = json_is_true(v);
    }
    if (!st) st = must_be(o, path, "bias", json_string("none"));
    if (!st) st = must_be(o, path, "lora_bias", json_false()); /* PEFT: a bias on lora_B, which kiln has not */
    if (!st && (v = json_object_get(o, "exclude_modules")) && !json_is_null(v) &&
        !((json_is_array(v) && !json_array_size(v)) || (json_is_string(v) && !*json_string_value(v)))) {
        char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: field 'exclude_modules' is %.200s; kiln does not implement excluding modules "
                        "(only null or empty)", path, got ? got : "?");
        free(got);
    }
    if (!st) st = must_be(o, path, "fan_in_fan_out", json_false());
    if (!st) st = must_be(o, path, "use_dora", json_false());
    if (!st) st = must_be(o, path, "rank_pattern", json_object());
    if (!st) st = must_be(o, path, "alpha_pattern", json_object());
    if (!st) st = must_be(o, path, "layers_to_transform", json_null());
    if (!st) st = must_be(o, path, "modules_to_save", json_null());
    if (!st && (st = kiln_lora_config_validate(lc))) st = kiln_error_context(st, "%s", path);
    json_decref(o);
    return st;
}

kiln_status kiln_lora_load(const char *dir, kiln_llama *m) {
    char path[4200];
    kiln_lora_config lc;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    kiln_status st = parse_config(path, &lc);
    if (!st) st = kiln_llama_lora_add(m, &lc, 0);
    if (st) return st;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    kiln_st_file *f = NULL;
    if ((st = kiln_st_open(path, &f))) return kiln_error_context(st, "loading LoRA adapters");
    char name[160];
    for (int i = m->n_base; i < m->n_params && !st; i++) {
        const kiln_tensor *p = m->params[i];
        peft_name(name, sizeof name, p->name);
        const kiln_st_tensor *s = kiln_st_find(f, name);
        if (!s) st = kiln_error(KILN_ERR_FORMAT, "%s: missing tensor '%s' (adapter_config.json targets it)", path, name);
        else if (s->dtype != KILN_F32)
            st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; expected F32", path, name, kiln_dtype_name(s->dtype));
        else if (s->ndim != 2 || s->shape[0] != p->shape[0] || s->shape[1] != p->shape[1])
            st = kiln_error(KILN_ERR_SHAPE, "%s: tensor '%s' has the wrong shape; the model expects [%lld, %lld]", path, name,
                            (long long)p->shape[0], (long long)p->shape[1]);
    }
    if (!st && kiln_st_count(f) != m->n_params - m->n_base) {
        for (int i = 0; i < kiln_st_count(f) && !st; i++) {
            const char *n = kiln_st_at(f, i)->name;
            bool known = false;
            for (int j = m->n_base; j < m->n_params && !known; j++) {
                peft_name(name, sizeof name, m->params[j]->name);
                known = strcmp(name, n) == 0;
            }
            if (!known) st = kiln_error(KILN_ERR_FORMAT, "%s: unexpected tensor '%s' (not an adapter of this model and config)", path, n);
        }
    }
    for (int i = m->n_base; i < m->n_params && !st; i++) {
        peft_name(name, sizeof name, m->params[i]->name);
        st = kiln_host_set_all(m->params[i], kiln_st_find(f, name)->bytes); /* F32 and the shape, checked above */
    }
    kiln_st_close(f);
    return st;
}

/* kiln_lora_export_merged (the merged model directory) is in export_dir.c,
 * with the other export targets. */
