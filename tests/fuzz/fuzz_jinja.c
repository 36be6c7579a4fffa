/* Chat templates (Jinja subset): the input is the template, rendered over a
 * fixed conversation with the variables transformers passes. */
#include <jansson.h>

#include "fuzz.h"
#include "kiln/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    static json_t *vars;
    if (!vars) {
        vars = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                          " {\"role\": \"user\", \"content\": \"Hi \\u00e9\\u4e2d\"},"
                          " {\"role\": \"assistant\", \"content\": \"Hello!\"},"
                          " {\"role\": \"user\", \"content\": \"\"}],"
                          " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
                          " \"tools\": null}", 0, NULL);
        if (!vars) abort();
    }
    kiln_template *t = NULL;
    if (kiln_template_parse((const char *)data, size, "fuzz.jinja", &t) != KILN_OK) return 0;
    char *out = NULL;
    size_t len = 0, *spans = NULL, n = 0;
    if (kiln_template_render(t, vars, &out, &len, &spans, &n) == KILN_OK) {
        for (size_t i = 0; i < 2 * n; i++)
            if (spans[i] > len) abort(); /* generation spans lie inside the output */
    }
    free(out);
    free(spans);
    kiln_template_free(t);
    return 0;
}
