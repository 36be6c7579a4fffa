/* Post-processors for a single sequence (add_special_tokens=True):
 * TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel (ids
 * unchanged: it only trims offsets) and Sequence. A template is kept as a
 * list of items: -1 is the sequence, anything else a token id. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer_impl.h"

enum { PP_TEMPLATE, PP_BYTELEVEL, PP_SEQ };

struct kd_post {
    int kind;
    int32_t *items;
    size_t n_items;
    kd_post **kids;
    size_t n_kids;
};

void kd_post_free(kd_post *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_kids; i++) kd_post_free(p->kids[i]);
    free(p->kids);
    free(p->items);
    free(p);
}

static bool add_item(kd_post *p, int32_t v) {
    if (p->n_items >= (1u << 20)) return false;
    int32_t *q = realloc(p->items, (p->n_items + 1) * sizeof *q);
    if (!q) return false;
    p->items = q;
    p->items[p->n_items++] = v;
    return true;
}

static kiln_status check_id(json_t *v, int vocab_size, const char *path, const char *where, int32_t *id) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab_size)
        return kiln_error(KILN_ERR_FORMAT, "%s: %s: token id is not an integer in [0, %d)", path, where, vocab_size);
    *id = (int32_t)json_integer_value(v);
    return KILN_OK;
}

/* One template piece: {"Sequence": {"id": "A"}} / {"SpecialToken": {"id": "<s>"}}
 * or the string forms "$A", "$0", "<s>" (each with an optional ":type_id"). */
static kiln_status template_piece(kd_post *p, json_t *piece, json_t *specials, int vocab_size, const char *path,
                                  const char *where) {
    const char *seq = NULL, *name = NULL;
    char buf[512];
    if (json_is_object(piece) && json_object_get(piece, "Sequence")) {
        seq = json_string_value(json_object_get(json_object_get(piece, "Sequence"), "id"));
        if (!seq) return kiln_error(KILN_ERR_FORMAT, "%s: %s.Sequence has no string id", path, where);
    } else if (json_is_object(piece) && json_object_get(piece, "SpecialToken")) {
        name = json_string_value(json_object_get(json_object_get(piece, "SpecialToken"), "id"));
        if (!name) return kiln_error(KILN_ERR_FORMAT, "%s: %s.SpecialToken has no string id", path, where);
    } else if (json_is_string(piece)) {
        snprintf(buf, sizeof buf, "%s", json_string_value(piece));
        char *colon = strrchr(buf, ':');
        if (colon && colon != buf) *colon = 0;
        if (buf[0] == '$') seq = buf[1] ? buf + 1 : "A";
        else name = buf;
    } else {
        return kiln_error(KILN_ERR_FORMAT, "%s: %s is not a template piece", path, where);
    }
    if (seq) {
        if (!strcmp(seq, "A") || !strcmp(seq, "a") || !strcmp(seq, "0"))
            return add_item(p, -1) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
        return kiln_error(KILN_ERR_FORMAT, "%s: %s: sequence \"%s\" in the single template (only A)", path, where, seq);
    }
    json_t *sp = json_object_get(specials, name);
    json_t *ids = json_object_get(sp, "ids");
    if (!json_is_array(ids))
        return kiln_error(KILN_ERR_FORMAT, "%s: %s: special token \"%s\" is not in special_tokens (or has no ids)", path,
                          where, name);
    for (size_t i = 0; i < json_array_size(ids); i++) {
        int32_t id = 0;
        kiln_status st = check_id(json_array_get(ids, i), vocab_size, path, where, &id);
        if (st) return st;
        if (!add_item(p, id)) return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    return KILN_OK;
}

/* BertProcessing / RobertaProcessing: cls A sep, each given as ["text", id]. */
static kiln_status cls_sep(kd_post *p, json_t *j, int vocab_size, const char *path, const char *where) {
    json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
    if (!json_is_array(cls) || !json_is_array(sep) || json_array_size(cls) != 2 || json_array_size(sep) != 2)
        return kiln_error(KILN_ERR_FORMAT, "%s: %s: cls and sep must be [\"token\", id]", path, where);
    int32_t c = 0, s = 0;
    kiln_status st = check_id(json_array_get(cls, 1), vocab_size, path, where, &c);
    if (!st) st = check_id(json_array_get(sep, 1), vocab_size, path, where, &s);
    if (st) return st;
    return add_item(p, c) && add_item(p, -1) && add_item(p, s) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
}

kiln_status kd_post_parse(json_t *j, const char *path, const char *where, int vocab_size, kd_post **out) {
    *out = NULL;
    if (!j || json_is_null(j)) return KILN_OK;
    if (!json_is_object(j)) return kiln_error(KILN_ERR_FORMAT, "%s: %s is not an object", path, where);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return kiln_error(KILN_ERR_FORMAT, "%s: %s has no string \"type\"", path, where);
    kd_post *p = calloc(1, sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    kiln_status st;
    char sub[256];
    if (!strcmp(type, "TemplateProcessing")) {
        static const char *const keys[] = {"type", "single", "pair", "special_tokens", NULL};
        json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
        p->kind = PP_TEMPLATE;
        st = kd_json_keys(j, path, where, keys);
        if (!st && !json_is_array(single))
            st = kiln_error(KILN_ERR_FORMAT, "%s: %s.single is not an array", path, where);
        for (size_t i = 0; !st && i < json_array_size(single); i++) {
            snprintf(sub, sizeof sub, "%s.single[%zu]", where, i);
            st = template_piece(p, json_array_get(single, i), specials, vocab_size, path, sub);
        }
    } else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        static const char *const keys[] = {"type", "cls", "sep", "trim_offsets", "add_prefix_space", NULL};
        p->kind = PP_TEMPLATE;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = cls_sep(p, j, vocab_size, path, where);
    } else if (!strcmp(type, "ByteLevel")) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        p->kind = PP_BYTELEVEL;
        st = kd_json_keys(j, path, where, keys);
    } else if (!strcmp(type, "Sequence")) {
        static const char *const keys[] = {"type", "processors", NULL};
        json_t *arr = json_object_get(j, "processors");
        p->kind = PP_SEQ;
        st = kd_json_keys(j, path, where, keys);
        if (!st && !json_is_array(arr)) st = kiln_error(KILN_ERR_FORMAT, "%s: %s.processors is not an array", path, where);
        if (!st && json_array_size(arr) && !(p->kids = calloc(json_array_size(arr), sizeof *p->kids)))
            st = kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
        for (size_t i = 0; !st && i < json_array_size(arr); i++) {
            snprintf(sub, sizeof sub, "%s.processors[%zu]", where, i);
            st = kd_post_parse(json_array_get(arr, i), path, sub, vocab_size, &p->kids[i]);
            if (!st && !p->kids[i]) st = kiln_error(KILN_ERR_FORMAT, "%s: %s is null", path, sub);
            if (!st) p->n_kids++;
        }
    } else {
        st = kd_unsupported(path, where, "post-processor", type);
    }
    if (st) {
        kd_post_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

kiln_status kd_post_apply(const kd_post *p, const int32_t *ids, size_t n, int32_t **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (p->kind == PP_SEQ) {
        int32_t *cur = NULL;
        size_t nc = n;
        if (n && !(cur = malloc(n * sizeof *cur))) return kiln_error(KILN_ERR_OOM, "out of memory");
        if (n) memcpy(cur, ids, n * sizeof *cur);
        for (size_t i = 0; i < p->n_kids; i++) {
            int32_t *next;
            size_t nn;
            kiln_status st = kd_post_apply(p->kids[i], cur, nc, &next, &nn);
            free(cur);
            if (st) return st;
            cur = next;
            nc = nn;
        }
        *out = cur;
        *n_out = nc;
        return KILN_OK;
    }
    size_t seqs = 0, total = 0;
    for (size_t i = 0; p->kind == PP_TEMPLATE && i < p->n_items; i++) seqs += p->items[i] < 0;
    if (p->kind == PP_BYTELEVEL) seqs = 1;
    if (seqs && n > (SIZE_MAX / sizeof(int32_t) - p->n_items) / seqs)
        return kiln_error(KILN_ERR_OOM, "post-processor: %zu ids overflow", n);
    total = seqs * n + (p->kind == PP_TEMPLATE ? p->n_items - seqs : 0);
    int32_t *o = total ? malloc(total * sizeof *o) : NULL;
    if (total && !o) return kiln_error(KILN_ERR_OOM, "out of memory");
    size_t k = 0;
    if (p->kind == PP_BYTELEVEL) {
        if (n) memcpy(o, ids, n * sizeof *o);
        k = n;
    }
    for (size_t i = 0; p->kind == PP_TEMPLATE && i < p->n_items; i++) {
        if (p->items[i] >= 0) {
            o[k++] = p->items[i];
        } else if (n) {
            memcpy(o + k, ids, n * sizeof *o);
            k += n;
        }
    }
    *out = o;
    *n_out = k;
    return KILN_OK;
}
