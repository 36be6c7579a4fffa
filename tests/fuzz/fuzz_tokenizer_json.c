/* tokenizer.json loader, then encode/decode with whatever loaded. */
#include "fuzz.h"
#include "kiln/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_load(fuzz_file(data, size, ".json"), &tok) != KILN_OK) return 0;
    static const char text[] = "Hello, world! 123 <|endoftext|> \xc3\xa9\xe4\xb8\xad \xf0\x9f\x98\x80\n\tend";
    int32_t *ids = NULL;
    size_t n = 0;
    if (kiln_tokenizer_encode(tok, text, sizeof text - 1, &ids, &n) == KILN_OK) {
        char *out = NULL;
        size_t len = 0;
        if (kiln_tokenizer_decode(tok, ids, n, &out, &len) == KILN_OK) free(out);
    }
    free(ids);
    for (int id = -1; id <= kiln_tokenizer_vocab_size(tok); id++) {
        size_t len = 0;
        (void)kiln_tokenizer_token(tok, id, &len);
    }
    kiln_tokenizer_free(tok);
    return 0;
}
