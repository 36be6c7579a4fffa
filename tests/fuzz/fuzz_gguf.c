/* GGUF reader: header, metadata of every type, tensor infos, offsets. */
#include "fuzz.h"
#include "kiln/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    kiln_gguf_file *f = NULL;
    if (kiln_gguf_open(fuzz_file(data, size, ".gguf"), &f) == KILN_OK) {
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < kiln_gguf_tensor_count(f); i++) {
            const kiln_gguf_tensor *t = kiln_gguf_tensor_at(f, i);
            if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
            if (kiln_gguf_tensor_find(f, t->name) == NULL) abort(); /* every listed tensor can be found */
        }
        for (int64_t i = 0; i < kiln_gguf_kv_count(f); i++) {
            const kiln_gguf_kv *kv = kiln_gguf_kv_at(f, i);
            if (!kv->key || kiln_gguf_find(f, kv->key) == NULL) abort();
            if (kv->strs)
                for (uint64_t j = 0; j < kv->n; j++)
                    if (kv->lens[j]) sink ^= (uint8_t)kv->strs[j][kv->lens[j] - 1];
            if (kv->data && kv->n) sink ^= ((const uint8_t *)kv->data)[0];
        }
        (void)sink;
        kiln_gguf_close(f);
    }
    return 0;
}
