/* The files of a model directory beside config.json and the weights:
 * model.safetensors.index.json (sharded weights), generation_config.json,
 * tokenizer_config.json and a LoRA run's adapter_config.json. The input is
 * split at NUL bytes into those four files, in that order (a missing part
 * removes its file); the directory holds a fixed tiny model saved in a few
 * shards, so a well-formed index reaches the real shard checks. */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "kiln/data.h"
#include "kiln/model_meta.h"
#include "kiln/model.h"
#include "kiln/train.h"

static char dir[64];

static void rm_dir(void) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[400];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", dir, e->d_name), unlink(p);
    if (d) closedir(d);
    rmdir(dir);
}

static void write_part(const char *name, const uint8_t *data, size_t size, bool present) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (!present) {
        unlink(p);
        return;
    }
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) abort();
}

static const char config[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 16,"
    " \"intermediate_size\": 24, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"num_hidden_layers\": 2, \"vocab_size\": 40, \"max_position_embeddings\": 32,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false}";

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln-fuzz-dir-%d", (int)getpid());
    if (mkdir(dir, 0700) && errno != EEXIST) abort();
    atexit(rm_dir);
    write_part("config.json", (const uint8_t *)config, sizeof config - 1, true);
    kiln_llama_config c;
    if (kiln_llama_config_parse(config, "fuzz/config.json", &c) || kiln_llama_config_validate(&c)) abort();
    kiln_llama *m = kiln_llama_new(&c, 1);
    if (!m) abort();
    /* ~21 KB of parameters in 8 KB shards: a few files and an index */
    kiln_weights_options o = {KILN_F32, 8192};
    if (kiln_save_model_weights(dir, m, &o)) abort();
    kiln_llama_free(m);
    char p[128];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (access(p, F_OK)) abort(); /* sharded, as this harness means */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    if (!dir[0]) setup();
    static const char *const parts[] = {"model.safetensors.index.json", "generation_config.json",
                                        "tokenizer_config.json", "adapter_config.json"};
    size_t at = 0; /* part i runs from `at` to the next NUL; an empty or absent part removes the file */
    for (int i = 0; i < 4; i++) {
        size_t end = at;
        while (end < size && data[end]) end++;
        write_part(parts[i], data + at, end > at ? end - at : 0, end > at);
        at = end < size ? end + 1 : size;
    }
    kiln_llama *m = NULL;
    if (kiln_load_model_dir(dir, &m) == KILN_OK) kiln_llama_free(m);
    kiln_model_meta meta;
    if (kiln_model_meta_load(dir, NULL, &meta) == KILN_OK) {
        for (int i = 0; i < meta.n_eos; i++)
            if (meta.eos_ids[i] < 0) abort(); /* load promised real ids */
        kiln_model_meta_free(&meta);
    }
    return 0;
}
