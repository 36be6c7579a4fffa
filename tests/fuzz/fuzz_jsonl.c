/* JSONL datasets through `kiln tokenize`'s path: {"text"}, {"prompt",
 * "completion"} and {"messages"} lines (rendered with a chat template, loss
 * masks found on the tokens), bad lines failing or skipped, shards written. */
#include <sys/stat.h>

#include "fuzz.h"
#include "kiln/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    static kiln_tokenizer *tok;
    static kiln_chat *chat;
    static char out[64];
    if (!tok) {
        if (kiln_tokenizer_load("tests/fuzz/corpus/tokenizer_json/kiln_bpe300.json", &tok) ||
            kiln_chat_load(NULL, "tests/chat/smollm2.jinja", &chat))
            abort(); /* run from the repository root (tests/fuzz/run.sh does) */
        snprintf(out, sizeof out, "/tmp/kiln-fuzz-shards-%d", (int)getpid());
        mkdir(out, 0700);
    }
    const char *path = fuzz_file(data, size, ".jsonl");
    uint8_t knob = size ? data[0] : 0;
    kiln_tokenize_opts o = {.val_frac = (knob & 1) ? 0.2 : 0.0, .split = KILN_DOC_PARAGRAPH, .seed = 3, .chat = chat,
                            .field = (knob & 2) ? "body" : NULL, .train_on = (kiln_train_on)((knob >> 2) % 3),
                            .skip_bad = (knob & 16) != 0};
    kiln_tokenize_stats stats;
    memset(&stats, 0, sizeof stats);
    (void)kiln_tokenize_files(tok, &path, 1, out, &o, &stats);
    return 0;
}
