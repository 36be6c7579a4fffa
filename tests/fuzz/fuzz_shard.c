/* Token shards and the loader over them (packed, padded and documents, shuffled). */
#include "fuzz.h"
#include "kiln/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    const char *path = fuzz_file(data, size, ".bin");
    kiln_shard *s = NULL;
    if (kiln_shard_open(path, &s) != KILN_OK) return 0;
    const kiln_shard_info *info = kiln_shard_get_info(s);
    for (uint64_t i = 0; i < info->count && i < 64; i++)
        if (kiln_shard_token(s, i) >= info->vocab_size) abort(); /* open promised every token < vocab */
    kiln_shard_close(s);
    uint8_t mode_byte = size ? data[size - 1] : 0;
    kiln_loader_config lc = {.path = path, .batch_size = 1 + (mode_byte & 3), .seq_len = 1 + ((mode_byte >> 2) & 15),
                             .mode = (mode_byte & 64)                    ? KILN_PACK_PADDED
                                     : (size >= 2 && (data[size - 2] & 1)) ? KILN_PACK_DOCUMENTS
                                                                           : KILN_PACK_PACKED,
                             .shuffle = (mode_byte & 128) != 0, .seed = 7};
    kiln_loader *l = NULL;
    if (kiln_loader_open(&lc, &l) != KILN_OK) return 0;
    kiln_batch *b = kiln_batch_alloc(lc.batch_size, lc.seq_len);
    for (int i = 0; b && i < 4; i++)
        if (kiln_loader_next(l, b) != KILN_OK) break;
    kiln_batch_free(b);
    kiln_loader_close(l);
    return 0;
}
