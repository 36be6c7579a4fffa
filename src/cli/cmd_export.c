/* `kiln export DIR --gguf OUT.gguf [--type T]`: a model for llama.cpp;
 * `kiln export RUN --gguf-lora OUT.gguf`: a LoRA run's adapters for it;
 * `kiln export RUN --merge-lora -o DIR`: a LoRA run as a plain model dir.
 * Each output format is one function below; the command picks it from the
 * flags, so further formats (a merged model directory) slot in beside it. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "kiln/train.h"

static const char *export_usage =
    "usage: kiln export RUN_OR_MODEL_DIR --gguf OUT.gguf [--type T] [--tokenizer FILE]\n"
    "                   [--name NAME]\n"
    "       kiln export LORA_RUN --gguf-lora OUT.gguf [--name NAME]\n"
    "       kiln export LORA_RUN --merge-lora -o OUT_DIR\n"
    "\n"
    "Writes the model of RUN_OR_MODEL_DIR (a run directory: its newest\n"
    "checkpoint; or any directory with config.json, model.safetensors and\n"
    "tokenizer.json) as one GGUF file that llama.cpp, Ollama, LM Studio and\n"
    "node-llama-cpp load: the metadata of the llama.cpp architecture of the\n"
    "family (llama and mistral: llama; qwen2; qwen3), the tokenizer (byte-level\n"
    "BPE with pre-tokenizer gpt-2, llama-bpe or qwen2; SentencePiece-style BPE\n"
    "with byte fallback, Llama 2's or Gemma's, as llama.cpp's \"llama\" with\n"
    "scores), and the tensors under llama.cpp's names. Matrices are written\n"
    "in --type, norms and biases in f32; the quantized types mix block types\n"
    "per tensor exactly as llama.cpp's llama-quantize does for that type\n"
    "(without an imatrix). The file appears only when it is complete. A LoRA\n"
    "run's adapters are merged into the base first.\n"
    "\n"
    "--gguf-lora writes only the LoRA adapters of LORA_RUN as a llama.cpp\n"
    "adapter (F32; alpha as llama.cpp scales it, rslora included), to load\n"
    "over the base's GGUF (llama-cli --lora OUT.gguf; export the base from a\n"
    "directory without the adapters).\n"
    "\n"
    "--merge-lora writes the base of a LoRA run with its adapters merged\n"
    "(W + alpha/r B A) as a model directory (config.json, model.safetensors,\n"
    "tokenizer and generation files) that kiln and Hugging Face load. It is\n"
    "written beside OUT_DIR and swapped in whole, so OUT_DIR is always the old\n"
    "or the new export; OUT_DIR may not lie inside a run directory or a\n"
    "checkpoint, be the base model, or be a directory kiln did not write.\n"
    "\n"
    "options:\n"
    "  --gguf FILE         the GGUF file to write\n"
    "  --type T            f32 (default), f16, bf16, q8_0 (8-bit blocks of 32\n"
    "                      with one f16 scale), q4_0, q4_k_m, q4_k_s, q5_k_m,\n"
    "                      q5_k_s, q6_k (llama.cpp's file types of those names)\n"
    "  --gguf-lora FILE    the GGUF adapter file to write\n"
    "  --tokenizer FILE    tokenizer.json (default: DIR/tokenizer.json)\n"
    "  --name NAME         general.name in the file (default: the directory's name)\n"
    "  --merge-lora        merge a LoRA run's adapters and write a model directory\n"
    "  -o, --output DIR    where --merge-lora writes\n"
    "  -h, --help          this text\n";

typedef struct {
    const char *dir, *gguf, *gguf_lora, *type, *tokenizer, *name, *out;
    bool merge_lora;
} export_args;

static int export_merged(const export_args *a) {
    double t0 = kiln_time_now();
    if (kiln_lora_export_merged(a->dir, a->out)) {
        fprintf(stderr, "kiln export: %s\n", kiln_last_error());
        return 1;
    }
    printf("kiln export: %s -> %s (LoRA adapters merged; config.json, model weights) in %.2f s\n", a->dir, a->out,
           kiln_time_now() - t0);
    return 0;
}

static int export_lora(const export_args *a) {
    kiln_export_gguf_lora_stats s = {0};
    double t0 = kiln_time_now();
    if (kiln_export_gguf_lora(a->dir, a->gguf_lora, a->name, &s)) {
        fprintf(stderr, "kiln export: %s\n", kiln_last_error());
        return 1;
    }
    printf("kiln export: %s -> %s (GGUF v3 LoRA adapter, %s, rank %d, adapter.lora.alpha %g: scaling %g%s, %lld values in "
           "%d tensors, %.2f MB) in %.2f s\n",
           a->dir, a->gguf_lora, s.arch, s.rank, (double)s.alpha, s.scaling, s.rslora ? " (rslora)" : "",
           (long long)s.n_params, s.n_tensors, s.data_bytes / 1e6, kiln_time_now() - t0);
    return 0;
}

static int export_gguf(const export_args *a) {
    kiln_export_gguf_opts o = {KILN_FTYPE_F32, a->tokenizer, a->name};
    if (a->type && kiln_export_type_parse(a->type, &o.ftype)) {
        fprintf(stderr, "kiln export: --type: %s\n", kiln_last_error());
        return 2;
    }
    kiln_export_gguf_stats s = {0};
    double t0 = kiln_time_now();
    if (kiln_export_gguf(a->dir, a->gguf, &o, &s)) {
        fprintf(stderr, "kiln export: %s\n", kiln_last_error());
        return 1;
    }
    char mix[256] = "";
    size_t len = 0;
    for (int t = 0; t <= KILN_GGML_BF16; t++)
        if (s.n_of_type[t] && len < sizeof mix)
            len += (size_t)snprintf(mix + len, sizeof mix - len, "%s%d %s", len ? ", " : "", s.n_of_type[t],
                                    kiln_ggml_type_name((kiln_ggml_type)t));
    char ft[16];
    snprintf(ft, sizeof ft, "%s", kiln_export_ftype_name(o.ftype));
    for (char *c = ft; *c; c++) *c = (char)toupper((unsigned char)*c);
    char tok[160];
    if (s.pre) snprintf(tok, sizeof tok, "%lld merges, pre-tokenizer %s", (long long)s.n_merges, s.pre);
    else snprintf(tok, sizeof tok, "SentencePiece (llama) with scores from %lld merges, add_space_prefix %s", (long long)s.n_merges,
                  s.add_space_prefix ? "true" : "false");
    printf("kiln export: %s -> %s (GGUF v3, %s %s (%s), %lld parameters in %d tensors, %.2f MB of data; %lld tokens, %s) in "
           "%.2f s\n",
           a->dir, a->gguf, s.arch, ft, mix, (long long)s.n_params, s.n_tensors, s.data_bytes / 1e6, (long long)s.n_tokens, tok,
           kiln_time_now() - t0);
    return 0;
}

int kiln_cmd_export(int argc, char **argv) {
    static const char *const names[] = {"--gguf", "--type", "--tokenizer", "--name", "--output", "-o", "--gguf-lora"};
    export_args a = {0};
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--merge-lora")) {
            a.merge_lora = true;
            continue;
        }
        int k = kiln_cli_arg("export", argc, argv, &i, names, 7, &v);
        if (k == KILN_ARG_HELP) {
            fputs(export_usage, stdout);
            return 0;
        }
        if (k == KILN_ARG_ERROR) return 2;
        if (k == KILN_ARG_POS) {
            if (a.dir) {
                fprintf(stderr, "kiln export: unexpected argument '%s' (one model directory)\n", v);
                return 2;
            }
            a.dir = v;
        }
        if (k == 0) a.gguf = v;
        if (k == 1) a.type = v;
        if (k == 2) a.tokenizer = v;
        if (k == 3) a.name = v;
        if (k == 4 || k == 5) a.out = v;
        if (k == 6) a.gguf_lora = v;
    }
    if (!a.dir) {
        fputs(export_usage, stderr);
        return 2;
    }
    if (a.merge_lora) {
        if (a.gguf || a.gguf_lora || a.type || a.tokenizer || a.name || !a.out) {
            fprintf(stderr, "kiln export: --merge-lora writes a model directory: give -o DIR (and no GGUF options)\n");
            return 2;
        }
        return export_merged(&a);
    }
    if (a.out) {
        fprintf(stderr, "kiln export: -o goes with --merge-lora; a GGUF file is named by --gguf\n");
        return 2;
    }
    if (a.gguf_lora) {
        if (a.gguf || a.type || a.tokenizer) {
            fprintf(stderr, "kiln export: --gguf-lora writes the adapters alone, in f32: export the base with its own --gguf "
                            "(and --type, --tokenizer)\n");
            return 2;
        }
        return export_lora(&a);
    }
    if (!a.gguf) {
        fprintf(stderr, "kiln export: say what to write: --gguf OUT.gguf, --gguf-lora OUT.gguf or --merge-lora -o DIR (see "
                        "--help)\n");
        return 2;
    }
    return export_gguf(&a);
}
