/* kiln template: chat templates (a Jinja subset) and the chat of a model
 * (its template with its special-token strings). Uses core only.
 *
 * Ownership: kiln_template and kiln_chat are made by *_parse / *_load and
 * freed by the matching *_free (NULL ok); rendered text and span arrays are
 * malloc'd and belong to the caller.
 *
 * Errors: a kiln_status, with kiln_last_error() naming the template, its
 * line and column. Nothing here prints.
 */
#ifndef KILN_TEMPLATE_H
#define KILN_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include "kiln/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- chat templates: a Jinja subset --------------------------------------
 * Parses and renders the Jinja of Hugging Face chat templates as
 * transformers does (Jinja2 with trim_blocks and lstrip_blocks, its
 * raise_exception, tojson and strftime_now, the loopcontrols extension and
 * {% generation %}): if/elif/else, for (loop.*, else, filters), set (also
 * block set and namespace attributes), macro, break/continue; Python
 * operators, literals, subscripts and slices, the filters, tests and str /
 * dict methods chat templates use. Anything outside the subset is an error
 * "NAME:LINE:COLUMN: ...", never a different rendering. Variables come from
 * a jansson object (messages, add_generation_prompt, bos_token, ...). */
typedef struct kiln_template kiln_template;
struct json_t;
kiln_status kiln_template_parse(const char *src, size_t len, const char *name, kiln_template **out);
void kiln_template_free(kiln_template *t);
/* *out is malloc'd and NUL-terminated (*len excludes the NUL; len may be
 * NULL). gen_spans (may be NULL): the byte ranges [s, e) of the output
 * written inside {% generation %} blocks, 2 * *n_gen values, malloc'd. */
kiln_status kiln_template_render(const kiln_template *t, const struct json_t *vars, char **out, size_t *len,
                                 size_t **gen_spans, size_t *n_gen);

/* A model's chat template with its special-token strings. Loaded from a
 * tokenizer_config.json (chat_template: a string, or a list of {name,
 * template} of which "default" is used; bos_token/eos_token/unk_token/
 * pad_token as strings or {"content": ...}); template_path (may be NULL)
 * overrides the config's template; config_path may be NULL when
 * template_path is given (the tokens are then empty strings). */
typedef struct kiln_chat kiln_chat;
kiln_status kiln_chat_load(const char *config_path, const char *template_path, kiln_chat **out);
void kiln_chat_free(kiln_chat *c);
/* The template's text as loaded (not NUL-terminated beyond *len). */
const char *kiln_chat_source(const kiln_chat *c, size_t *len);
/* Renders a conversation {"messages": [...], ...}: the other keys of the
 * object (tools, documents, enable_thinking, ...) are template variables
 * too, tools defaulting to None as in transformers. */
kiln_status kiln_chat_render(const kiln_chat *c, const struct json_t *conversation, bool add_generation_prompt,
                             char **out, size_t *len);
/* Renders the conversation (no generation prompt) and finds the byte ranges
 * an assistant would generate: with {% generation %} blocks, those;
 * otherwise, for each assistant message i, from the end of the rendering
 * of messages[:i] with the generation prompt to the end of messages[:i+1]
 * rendered (content and end-of-turn), each prefix checked to be a prefix of
 * the whole rendering. last_only: only the final assistant message.
 * *spans holds 2 * *n_spans offsets [start, end), malloc'd. */
kiln_status kiln_chat_assistant_spans(const kiln_chat *c, const struct json_t *conversation, bool last_only,
                                      char **text, size_t *len, size_t **spans, size_t *n_spans);

#ifdef __cplusplus
}
#endif
#endif
