/* A checkpoint of a LoRA run whose frozen base is held in f16 or ggml's
 * block types does not copy the base (an 8B Q4_K base is 4.7 GB a
 * checkpoint, and safetensors has no block types): it writes base.json,
 * where the base comes from and a hash of its bytes, and loading re-derives
 * the base the way the run did (the GGUF read as it is, or the --init
 * model or the seed's weights quantized by kiln's deterministic quantizer)
 * and refuses it unless its bytes hash the same. */
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "kiln/train.h"
#include "hostio.h"

#define BASE_REF "base.json"

bool kiln_base_is_held(const kiln_llama *m) {
    for (int i = 0; m && i < m->n_base; i++)
        if (kiln_dtype_is_dequant(m->params[i]->dtype)) return true;
    return false;
}

kiln_status kiln_base_hash(const kiln_llama *m, uint64_t *out) {
    uint64_t h = 0x6b696c6e62617365ull; /* "kilnbase" */
    for (int i = 0; i < m->n_base; i++) {
        void *owned = NULL;
        const void *p = kiln_host_bytes(m->params[i], &owned);
        if (!p) return kiln_error_context(kiln_last_status(), "hashing %s", m->params[i]->name);
        h = kiln_hash_mix64(h ^ kiln_hash_bytes(p, kiln_tensor_nbytes(m->params[i])) ^ (uint64_t)m->params[i]->dtype << 56);
        free(owned);
    }
    *out = h;
    return KILN_OK;
}

kiln_status kiln_base_ref_save(const char *dir, const kiln_llama *m, const kiln_train_config *c) {
    char path[4200], src[PATH_MAX] = "";
    if (!c) return kiln_error(KILN_ERR_INVALID, "saving a model whose base is held as %s needs the run's settings (where the base "
                              "comes from)", kiln_dtype_name(m->params[1]->dtype));
    if (c->init[0] && !realpath(c->init, src))
        return kiln_error(KILN_ERR_IO, "--init %s: cannot resolve its path for %s/%s", c->init, dir, BASE_REF);
    uint64_t h;
    kiln_status st = kiln_base_hash(m, &h);
    if (st) return st;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    char dt[16];
    kiln_setting_format(kiln_setting_find("base_dtype"), c, dt, sizeof dt);
    json_t *o = json_pack("{s:s, s:s, s:s, s:I}", "model", c->model, "base_dtype", dt, "hash", hex, "seed", (json_int_t)c->seed);
    if (o && src[0]) json_object_set_new(o, "init", json_string(src)); /* none: the seed made the base */
    char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    if (!text) return kiln_error(KILN_ERR_OOM, "cannot serialise %s/%s", dir, BASE_REF);
    snprintf(path, sizeof path, "%s/%s", dir, BASE_REF);
    st = kiln_write_file_atomic(path, text, strlen(text));
    free(text);
    return st;
}

bool kiln_base_ref_exists(const char *dir) {
    char path[4200];
    struct stat s;
    snprintf(path, sizeof path, "%s/%s", dir, BASE_REF);
    return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

kiln_status kiln_base_ref_load(const char *dir, kiln_llama **out) {
    *out = NULL;
    char path[4200], cfg_path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, BASE_REF);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return kiln_error(KILN_ERR_FORMAT, "%s:%d: %s", path, je.line, je.text);
    const char *init = NULL, *model = NULL, *dt = NULL, *hex = NULL;
    json_int_t seed = 0;
    kiln_status st = KILN_OK;
    if (json_unpack_ex(o, &je, JSON_STRICT, "{s?s, s:s, s:s, s:s, s:I}", "init", &init, "model", &model, "base_dtype", &dt,
                       "hash", &hex, "seed", &seed))
        st = kiln_error(KILN_ERR_FORMAT, "%s: %s", path, je.text);
    kiln_train_config c;
    kiln_train_config_default(&c);
    if (!st) st = kiln_setting_parse(kiln_setting_find("base_dtype"), dt, &c);
    kiln_llama_config want;
    if (!st) st = kiln_llama_config_load(cfg_path, &want);
    kiln_llama *m = NULL;
    if (!st && init && kiln_is_gguf_path(init)) {
        st = kiln_gguf_model_load(init, c.base_dtype == KILN_BASE_DTYPE_AUTO, &m);
    } else if (!st && init) {
        char d[4200];
        st = kiln_model_dir_resolve(init, d, sizeof d);
        if (!st) st = kiln_load_model_dir(d, &m);
    } else if (!st) { /* a preset's weights: the run's seed made them */
        m = kiln_llama_new(&want, (uint64_t)seed);
        if (!m) st = kiln_last_status();
    }
    if (st) st = kiln_error_context(st, "the base of %s (%s)", dir, path);
    if (!st && !kiln_llama_config_equal(&m->cfg, &want))
        st = kiln_error(KILN_ERR_FORMAT, "%s: the base from %s has another config than %s", path, init ? init : "the seed", cfg_path);
    /* the adapters, then the base cast as the run cast it */
    if (!st) st = kiln_lora_load(dir, m);
    if (!st && c.base_dtype != KILN_BASE_DTYPE_AUTO && c.base_dtype != KILN_F32)
        st = kiln_llama_base_cast(m, (kiln_dtype)c.base_dtype);
    uint64_t h = 0;
    if (!st) st = kiln_base_hash(m, &h);
    char got[17];
    snprintf(got, sizeof got, "%016llx", (unsigned long long)h);
    if (!st && strcmp(got, hex))
        st = kiln_error(KILN_ERR_FORMAT, "%s: the base re-derived from %s hashes %s, not %s as when the run saved it: the file "
                        "changed since", path, init ? init : "the seed", got, hex);
    json_decref(o);
    if (st) {
        kiln_llama_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}
