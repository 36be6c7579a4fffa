/* GGUF reader: header, metadata of every type, tensor infos, offsets;
 * then what kiln builds from a file that opens: its tokenizer
 * (tokenizer.ggml.*), its metadata, and the model (config from {arch}.*,
 * tensors checked and read, dequantized to fp32). */
#include "fuzz.h"
#include "kiln/gguf.h"
#include "kiln/train.h"

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
        kiln_tokenizer *tok = NULL;
        if (kiln_gguf_tokenizer(f, &tok) == KILN_OK) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (kiln_tokenizer_encode(tok, "Hello, world 123", 16, &ids, &n) == KILN_OK) free(ids);
        }
        kiln_model_meta meta;
        if (kiln_gguf_model_meta(f, tok, &meta) == KILN_OK) kiln_model_meta_free(&meta);
        kiln_tokenizer_free(tok);
        kiln_gguf_close(f);
        kiln_llama *m = NULL;
        if (kiln_gguf_model_load(fuzz_file(data, size, ".gguf"), false, &m) == KILN_OK) kiln_llama_free(m);
    }
    return 0;
}
