/* Preference pairs for `kiln tokenize`: TRL's {"prompt", "chosen",
 * "rejected"} lines, plain strings or conversational (lists of messages
 * rendered with the chat template), the prompt and each answer encoded
 * apart as TRL does, truncated as TRL's DPO does (the prompt keeps its end,
 * the answers lose theirs), each pair kept as two documents. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "data_impl.h"

static const char *const FIELD[3] = {"prompt", "chosen", "rejected"};

bool kd_pair_line(const json_t *obj) {
    return json_is_object(obj) && (json_object_get(obj, "chosen") || json_object_get(obj, "rejected"));
}

void kd_pair_free(kd_pair *p) {
    for (int k = 0; k < 3; k++) {
        free(p->text[k]);
        free(p->ids[k]);
    }
    memset(p, 0, sizeof *p);
}

static const char *kind_of(const json_t *v) {
    return json_is_string(v) ? "a string" : json_is_array(v) ? "a list" : json_is_object(v) ? "an object"
           : json_is_null(v) ? "null" : json_is_boolean(v) ? "a boolean" : "a number";
}

static kiln_status set_text(kd_pair *p, int k, const char *s, size_t n) {
    p->text[k] = malloc(n + 1);
    if (!p->text[k]) return kiln_error(KILN_ERR_OOM, "out of memory");
    if (n) memcpy(p->text[k], s, n);
    p->text[k][n] = 0;
    p->len[k] = n;
    return KILN_OK;
}

/* An answer list: assistant messages, not all empty. */
static kiln_status check_answer(const json_t *a, int k) {
    if (!json_is_array(a))
        return kiln_error(KILN_ERR_INVALID, "field \"%s\": expected a list of messages (the prompt is one), got %s", FIELD[k],
                          kind_of(a));
    if (json_array_size(a) == 0) return kiln_error(KILN_ERR_INVALID, "field \"%s\": an empty answer (no messages)", FIELD[k]);
    bool said = false;
    size_t i;
    json_t *m;
    json_array_foreach(a, i, m) {
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role))
            return kiln_error(KILN_ERR_INVALID, "field \"%s\": message %zu: expected an object with a string \"role\"", FIELD[k], i);
        if (strcmp(json_string_value(role), "assistant"))
            return kiln_error(KILN_ERR_INVALID,
                              "field \"%s\": message %zu has role \"%s\": the answers of a preference pair are assistant messages",
                              FIELD[k], i, json_string_value(role));
        said |= json_object_get(m, "tool_calls") || (content && !json_is_null(content) &&
                                                    (!json_is_string(content) || json_string_length(content) > 0));
    }
    return said ? KILN_OK : kiln_error(KILN_ERR_INVALID, "field \"%s\": an empty answer (its messages have no content)", FIELD[k]);
}

/* A conversation {"messages": prompt [+ answer], the line's other keys}. */
static json_t *conversation(const json_t *obj, const json_t *prompt, const json_t *answer) {
    json_t *conv = json_copy((json_t *)obj), *msgs = json_copy((json_t *)prompt);
    if (!conv || !msgs) return json_decref(conv), json_decref(msgs), NULL;
    for (int k = 0; k < 3; k++) json_object_del(conv, FIELD[k]);
    if (answer && json_array_extend(msgs, (json_t *)answer)) return json_decref(conv), json_decref(msgs), NULL;
    json_object_set_new(conv, "messages", msgs);
    return conv;
}

static kiln_status build_chat(const kiln_tokenize_opts *o, const json_t *obj, kd_pair *p) {
    const json_t *pr = json_object_get(obj, "prompt");
    if (!o->chat)
        return kiln_error(KILN_ERR_INVALID, "field \"prompt\": a list of messages (a conversational pair) needs a chat "
                                            "template (--config tokenizer_config.json or --chat-template FILE)");
    size_t i;
    json_t *m;
    json_array_foreach(pr, i, m) if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
        return kiln_error(KILN_ERR_INVALID, "field \"prompt\": message %zu: expected an object with a string \"role\"", i);
    for (int k = 1; k < 3; k++) {
        kiln_status st = check_answer(json_object_get(obj, FIELD[k]), k);
        if (st) return st;
    }
    json_t *conv = conversation(obj, pr, NULL);
    if (!conv) return kiln_error(KILN_ERR_OOM, "out of memory");
    char *P = NULL;
    size_t pn = 0;
    kiln_status st = kiln_chat_render(o->chat, conv, true, &P, &pn);
    json_decref(conv);
    if (st) return kiln_error_context(st, "field \"prompt\" (rendered with the generation prompt)");
    p->text[0] = P;
    p->len[0] = pn;
    for (int k = 1; k < 3 && !st; k++) {
        conv = conversation(obj, pr, json_object_get(obj, FIELD[k]));
        if (!conv) return kiln_error(KILN_ERR_OOM, "out of memory");
        char *R = NULL;
        size_t rn = 0, *sp = NULL, ns = 0;
        st = kiln_chat_assistant_spans(o->chat, conv, false, &R, &rn, &sp, &ns);
        json_decref(conv);
        if (st) {
            kiln_error_context(st, "field \"%s\" (rendered after the prompt)", FIELD[k]);
        } else if (rn < pn || memcmp(R, P, pn)) {
            size_t d = 0;
            while (d < pn && d < rn && R[d] == P[d]) d++;
            st = kiln_error(KILN_ERR_INVALID,
                            "field \"%s\": the template's rendering of prompt + %s does not begin with the prompt's "
                            "rendering with the generation prompt (they differ at byte %zu), so the answer cannot be cut from it",
                            FIELD[k], FIELD[k], d);
        } else {
            /* the answer: after the prompt, to the end of its last assistant
             * turn (the template's tail after it belongs to no turn) */
            size_t end = pn;
            for (size_t s = 0; s < ns; s++)
                if (sp[2 * s + 1] > end) end = sp[2 * s + 1];
            if (end == pn)
                st = kiln_error(KILN_ERR_INVALID, "field \"%s\": an empty answer (the template renders nothing for it after the prompt)",
                                FIELD[k]);
            else
                st = set_text(p, k, R + pn, end - pn);
        }
        free(R);
        free(sp);
    }
    p->chat = true;
    return st;
}

kiln_status kd_pair_build(const kiln_tokenize_opts *o, const json_t *obj, kd_pair *p) {
    memset(p, 0, sizeof *p);
    if (!json_is_object(obj)) return kiln_error(KILN_ERR_INVALID, "expected a JSON object");
    const json_t *v[3];
    for (int k = 0; k < 3; k++) {
        v[k] = json_object_get(obj, FIELD[k]);
        if (!v[k])
            return kiln_error(KILN_ERR_INVALID, k ? "field \"%s\": missing (a preference pair has \"prompt\", \"chosen\" and \"rejected\")"
                                                  : "field \"%s\": missing (TRL's implicit-prompt form, where chosen and rejected "
                                                    "repeat the prompt, is not read: give the prompt apart)",
                              FIELD[k]);
    }
    uint64_t key = 0x9a125ULL;
    for (int k = 0; k < 3; k++) {
        char *d = json_dumps(v[k], JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        if (!d) return kiln_error(KILN_ERR_OOM, "out of memory");
        key = kiln_rng_u64(key, kiln_hash_bytes(d, strlen(d)));
        free(d);
    }
    p->key = key;
    if (json_is_array(v[0])) return build_chat(o, obj, p);
    if (!json_is_string(v[0]))
        return kiln_error(KILN_ERR_INVALID, "field \"prompt\": expected a string or a list of messages, got %s", kind_of(v[0]));
    for (int k = 1; k < 3; k++) {
        if (!json_is_string(v[k]))
            return kiln_error(KILN_ERR_INVALID, "field \"%s\": expected a string (the prompt is one), got %s", FIELD[k],
                              kind_of(v[k]));
        if (json_string_length(v[k]) == 0) return kiln_error(KILN_ERR_INVALID, "field \"%s\": an empty answer", FIELD[k]);
    }
    kiln_status st = KILN_OK;
    for (int k = 0; k < 3 && !st; k++) st = set_text(p, k, json_string_value(v[k]), json_string_length(v[k]));
    return st;
}

kiln_status kd_pair_encode(const kiln_tokenizer *tok, kd_pair *p) {
    for (int k = 0; k < 3; k++) {
        kiln_status st = kiln_tokenizer_encode(tok, p->text[k], p->len[k], &p->ids[k], &p->n[k]);
        if (st) return kiln_error_context(st, "field \"%s\"", FIELD[k]);
        if (k && p->n[k] == 0) return kiln_error(KILN_ERR_INVALID, "field \"%s\": an empty answer (no tokens)", FIELD[k]);
    }
    return KILN_OK;
}

kiln_status kd_pair_add(kd_tk_ctx *c, kd_pair *p, kiln_tokenize_stats *stats, bool *skipped) {
    const kiln_tokenize_opts *o = c->opts;
    size_t P = p->n[0], off = 0;
    if (o->max_prompt_len > 0 && P > (uint64_t)o->max_prompt_len) {
        off = P - (size_t)o->max_prompt_len; /* keep the end, as TRL */
        P = (size_t)o->max_prompt_len;
    }
    *skipped = o->max_len > 0 && P >= (uint64_t)o->max_len;
    if (*skipped) {
        stats->pairs_skipped++;
        return KILN_OK;
    }
    stats->prompts_truncated += off > 0;
    int32_t *ids[2] = {NULL, NULL};
    uint8_t *mask[2] = {NULL, NULL};
    size_t n[2];
    bool eos_target[2];
    kiln_status st = KILN_OK;
    for (int k = 0; k < 2 && !st; k++) {
        size_t A = p->n[k + 1];
        bool cut = o->max_len > 0 && P + A > (uint64_t)o->max_len;
        if (cut) A = (size_t)o->max_len - P;
        stats->answers_truncated += cut;
        /* a cut answer does not end: its eos is no target (TRL's cut drops it) */
        eos_target[k] = !p->chat && !cut;
        n[k] = P + A;
        ids[k] = malloc(n[k] * sizeof *ids[k]);
        mask[k] = malloc(n[k]);
        if (!ids[k] || !mask[k]) {
            st = kiln_error(KILN_ERR_OOM, "out of memory");
            break;
        }
        memcpy(ids[k], p->ids[0] + off, P * sizeof *ids[k]);
        memcpy(ids[k] + P, p->ids[k + 1], A * sizeof *ids[k]);
        memset(mask[k], 0, P);
        memset(mask[k] + P, 1, A);
    }
    if (!st) {
        const int32_t *const ci[2] = {ids[0], ids[1]};
        const uint8_t *const cm[2] = {mask[0], mask[1]};
        st = kd_tokenize_add_pair(c, p->key, ci, cm, n, eos_target);
    }
    for (int k = 0; k < 2; k++) {
        free(ids[k]);
        free(mask[k]);
    }
    return st;
}
