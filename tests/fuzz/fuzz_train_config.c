/* train_config.json / --config: overlay onto the defaults, validate, write back. */
#include "fuzz.h"
#include "kiln/train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    kiln_train_config c;
    kiln_train_config_default(&c);
    if (kiln_train_config_parse(text, "fuzz/train_config.json", &c) == KILN_OK && kiln_train_config_validate(&c) == KILN_OK) {
        char *js = kiln_train_config_to_json(&c);
        kiln_train_config c2;
        kiln_train_config_default(&c2);
        if (js && kiln_train_config_parse(js, "fuzz/roundtrip.json", &c2) != KILN_OK) abort();
        free(js);
    }
    free(text);
    return 0;
}
