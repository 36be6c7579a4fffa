/* safetensors reader: header JSON, dtypes, shapes, offsets, metadata. */
#include "fuzz.h"
#include "kiln/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    kiln_st_file *f = NULL;
    if (kiln_st_open(fuzz_file(data, size, ".safetensors"), &f) == KILN_OK) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < kiln_st_count(f); i++) {
            const kiln_st_tensor *t = kiln_st_at(f, i);
            if (t->nbytes) sink ^= ((const uint8_t *)t->bytes)[0] ^ ((const uint8_t *)t->bytes)[t->nbytes - 1];
            if (kiln_st_find(f, t->name) == NULL) abort(); /* every listed tensor can be found */
        }
        for (int i = 0; i < kiln_st_metadata_count(f); i++) {
            const char *v = NULL, *k = kiln_st_metadata_at(f, i, &v);
            if (!k || !v || kiln_st_metadata(f, k) == NULL) abort();
        }
        (void)sink;
        kiln_st_close(f);
    }
    return 0;
}
