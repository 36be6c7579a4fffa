/* config.json (model): parse, validate, write back, parse again. */
#include "fuzz.h"
#include "kiln/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    kiln_llama_config c;
    if (kiln_llama_config_parse(text, "fuzz/config.json", &c) == KILN_OK &&
        kiln_llama_config_validate(&c) == KILN_OK) {
        char *js = kiln_llama_config_to_json(&c);
        kiln_llama_config c2;
        if (js && kiln_llama_config_parse(js, "fuzz/roundtrip.json", &c2) != KILN_OK) abort(); /* what kiln writes, kiln reads */
        free(js);
    }
    free(text);
    return 0;
}
