/* llama.cpp's own GGUF reader and number conversions, loaded at run time
 * from the prebuilt libggml-base.so that npm's node-llama-cpp ships
 * (tests/node/node_modules), so tests check kiln's files and conversions
 * against code kiln did not write. Prototypes as in ggml's gguf.h/ggml.h. */
#ifndef KILN_TEST_GGML_REF_H
#define KILN_TEST_GGML_REF_H
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct gguf_context;
/* ggml.h's struct ggml_type_traits, field for field (ggml_ref_traits checks
 * the layout against known types before a test trusts it). */
struct ggml_type_traits_ref {
    const char *type_name;
    int64_t blck_size;
    int64_t blck_size_interleave;
    size_t type_size;
    bool is_quantized;
    void (*to_float)(const void *x, float *y, int64_t k);
    void (*from_float_ref)(const float *x, void *y, int64_t k);
};
struct gguf_init_params {
    bool no_alloc;
    void **ctx;
};

typedef struct {
    void *lib;
    struct gguf_context *(*init_from_file)(const char *, struct gguf_init_params);
    void (*free)(struct gguf_context *);
    uint32_t (*get_version)(const struct gguf_context *);
    size_t (*get_alignment)(const struct gguf_context *);
    size_t (*get_data_offset)(const struct gguf_context *);
    int64_t (*get_n_kv)(const struct gguf_context *);
    int64_t (*find_key)(const struct gguf_context *, const char *);
    const char *(*get_key)(const struct gguf_context *, int64_t);
    int (*get_kv_type)(const struct gguf_context *, int64_t);
    int (*get_arr_type)(const struct gguf_context *, int64_t);
    size_t (*get_arr_n)(const struct gguf_context *, int64_t);
    const void *(*get_arr_data)(const struct gguf_context *, int64_t);
    const char *(*get_arr_str)(const struct gguf_context *, int64_t, size_t);
    const void *(*get_val_data)(const struct gguf_context *, int64_t);
    const char *(*get_val_str)(const struct gguf_context *, int64_t);
    int64_t (*get_n_tensors)(const struct gguf_context *);
    int64_t (*find_tensor)(const struct gguf_context *, const char *);
    const char *(*get_tensor_name)(const struct gguf_context *, int64_t);
    int (*get_tensor_type)(const struct gguf_context *, int64_t);
    size_t (*get_tensor_offset)(const struct gguf_context *, int64_t);
    size_t (*get_tensor_size)(const struct gguf_context *, int64_t);
    const int64_t *(*get_tensor_ne)(const struct gguf_context *, int64_t);
    uint16_t (*fp32_to_fp16)(float);
    float (*fp16_to_fp32)(uint16_t);
    uint16_t (*fp32_to_bf16)(float); /* ggml_bf16_t is a struct of one uint16: returned alike */
    void (*quantize_row_q8_0_ref)(const float *, void *, int64_t);
    const struct ggml_type_traits_ref *(*get_type_traits)(int type);
    size_t (*quantize_chunk)(int type, const float *src, void *dst, int64_t start, int64_t nrows, int64_t n_per_row,
                             const float *imatrix);
} ggml_ref;

/* Directory of node-llama-cpp's prebuilt CPU binaries, from this test
 * binary's location (BUILD/tests/x -> repository root). */
static inline void ggml_ref_bin_dir(char *out, size_t n) {
    char self[1024];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    self[k > 0 ? k : 0] = 0;
    snprintf(out, n, "%s/../../tests/node/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64", dirname(self));
}

/* Returns false (with the reason in why) when the library is absent. */
static inline bool ggml_ref_load(ggml_ref *g, char *why, size_t n) {
    char dir[1200], path[1300];
    ggml_ref_bin_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/libggml-base.so", dir);
    memset(g, 0, sizeof *g);
    if (access(path, R_OK) != 0) {
        snprintf(why, n, "%s not found (scripts/deps.sh --test installs node-llama-cpp)", path);
        return false;
    }
    g->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g->lib) {
        snprintf(why, n, "dlopen %s: %s", path, dlerror());
        return false;
    }
#define SYM(field, name)                                                  \
    do {                                                                  \
        *(void **)&g->field = dlsym(g->lib, name);                        \
        if (!g->field) {                                                  \
            snprintf(why, n, "%s lacks %s", path, name);                  \
            return false;                                                 \
        }                                                                 \
    } while (0)
    SYM(init_from_file, "gguf_init_from_file");
    SYM(free, "gguf_free");
    SYM(get_version, "gguf_get_version");
    SYM(get_alignment, "gguf_get_alignment");
    SYM(get_data_offset, "gguf_get_data_offset");
    SYM(get_n_kv, "gguf_get_n_kv");
    SYM(find_key, "gguf_find_key");
    SYM(get_key, "gguf_get_key");
    SYM(get_kv_type, "gguf_get_kv_type");
    SYM(get_arr_type, "gguf_get_arr_type");
    SYM(get_arr_n, "gguf_get_arr_n");
    SYM(get_arr_data, "gguf_get_arr_data");
    SYM(get_arr_str, "gguf_get_arr_str");
    SYM(get_val_data, "gguf_get_val_data");
    SYM(get_val_str, "gguf_get_val_str");
    SYM(get_n_tensors, "gguf_get_n_tensors");
    SYM(find_tensor, "gguf_find_tensor");
    SYM(get_tensor_name, "gguf_get_tensor_name");
    SYM(get_tensor_type, "gguf_get_tensor_type");
    SYM(get_tensor_offset, "gguf_get_tensor_offset");
    SYM(get_tensor_size, "gguf_get_tensor_size");
    SYM(get_tensor_ne, "gguf_get_tensor_ne");
    SYM(fp32_to_fp16, "ggml_fp32_to_fp16");
    SYM(fp16_to_fp32, "ggml_fp16_to_fp32");
    SYM(fp32_to_bf16, "ggml_fp32_to_bf16");
    SYM(quantize_row_q8_0_ref, "quantize_row_q8_0_ref");
    SYM(get_type_traits, "ggml_get_type_traits");
    SYM(quantize_chunk, "ggml_quantize_chunk");
#undef SYM
    return true;
}

/* The traits of ggml type `type`, once the struct's layout is checked
 * against types whose name, block and size are known (f32, f16, q8_0,
 * q4_K, q6_K, bf16); NULL (why says which disagreed) otherwise. */
static inline const struct ggml_type_traits_ref *ggml_ref_traits(const ggml_ref *g, int type, char *why, size_t n) {
    static const struct { int type; const char *name; int64_t blck; size_t size; bool quantized; } known[] = {
        {0, "f32", 1, 4, false}, {1, "f16", 1, 2, false}, {8, "q8_0", 32, 34, true},
        {12, "q4_K", 256, 144, true}, {14, "q6_K", 256, 210, true}, {30, "bf16", 1, 2, false},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const struct ggml_type_traits_ref *t = g->get_type_traits(known[i].type);
        if (!t || !t->type_name || strcmp(t->type_name, known[i].name) || t->blck_size != known[i].blck ||
            t->type_size != known[i].size || t->is_quantized != known[i].quantized) {
            snprintf(why, n, "ggml_get_type_traits(%d) does not have the layout of ggml.h's struct ggml_type_traits",
                     known[i].type);
            return NULL;
        }
    }
    return g->get_type_traits(type);
}

static inline struct gguf_context *ggml_ref_open(const ggml_ref *g, const char *path) {
    struct gguf_init_params p = {true, NULL};
    return g->init_from_file(path, p);
}
#endif
