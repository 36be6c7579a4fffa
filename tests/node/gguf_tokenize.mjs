// llama.cpp's tokenization of texts with the vocabularies of GGUF files,
// through node-llama-cpp's prebuilt CPU binary (never downloads or builds
// one), for tests/test_gguf_tok.c. Each model is loaded vocabulary only (no
// weights are read), and prints one JSON object on stdout.
//
// usage: node gguf_tokenize.mjs JOB.json
//   JOB: {"texts": ["...", ...], "models": ["a.gguf", ...]}
//   out: {"model": "a.gguf", "bos": 1, "eos": 2, "add_bos": true,
//         "ids": [[...], ...]}   (or "error": "...")
//   ids: model.tokenize(text, true): llama_tokenize with parse_special
//   (special tokens typed in the text are matched) and no bos/eos added;
//   "" gives [] without asking llama.cpp (node-llama-cpp does that).
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const logs = [];
const llama = await getLlama({
    gpu: false, build: "never", usePrebuiltBinaries: true, progressLogs: false,
    logLevel: LlamaLogLevel.warn,
    logger: (level, message) => logs.push(`${level}: ${message}`.trimEnd()),
});

for (const path of job.models) {
    logs.length = 0;
    const out = {model: path};
    try {
        const model = await llama.loadModel({modelPath: path, gpuLayers: 0, vocabOnly: true});
        out.bos = model.tokens.bos;
        out.eos = model.tokens.eos;
        out.eot = model.tokens.eot;
        out.add_bos = model.tokens.shouldPrependBosToken;
        out.ids = job.texts.map((t) => Array.from(model.tokenize(t, true)));
        await model.dispose();
    } catch (e) {
        out.error = String(e && e.message ? e.message : e);
        out.log_tail = logs.slice(-8);
    }
    process.stdout.write(JSON.stringify(out) + "\n");
}
