// Runs GGUF files in llama.cpp through node-llama-cpp's prebuilt CPU
// binary (never downloads or builds one) and prints, as one JSON object per
// model on stdout, what llama.cpp makes of each: its tokenization of the
// prompt, its greedy continuation, and its perplexity on a token window.
//
// usage: node gguf_llama.mjs JOB.json
//   JOB: {"prompts": ["...", ...], "greedy_prompts": ["...", ...],
//         "n_predict": 32, "ppl_tokens": [ids...], "threads": 1,
//         "models": [{"path": "a.gguf", "defaults": false, "ppl_tokens": [...],
//                     "lora": "adapter.gguf"}, ...]}
//   defaults false: an F32 key/value cache and no flash attention, so an
//   F32 model computes in f32 throughout; true: llama.cpp's defaults (F16
//   cache, flash attention "auto", which on the CPU runs attention with
//   keys, values and queries rounded to F16).
//   prompts are tokenized (no bos added); each greedy prompt is continued
//   from its tokens, after bos where llama.cpp prepends one (the file's
//   add_bos_token), for n_predict tokens or until eos.
//   lora (optional): a GGUF LoRA adapter loaded onto the context at scale 1
//   (llama.cpp's llama_adapter_lora_init + llama_set_adapter_lora).
//   texts (optional, per model): more texts, tokenized with parse_special
//   (special tokens typed in the text are matched), no bos, as "text_ids".
//   ppl_tokens (a model's own, else the job's) is a window that starts with
//   bos where there is one; the perplexity is
//   exp(mean -log p(t[i] | t[<i])) over i >= 1, from llama.cpp's logits.
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const logs = [];
const llama = await getLlama({
    gpu: false, build: "never", usePrebuiltBinaries: true, progressLogs: false,
    logLevel: LlamaLogLevel.info,
    logger: (level, message) => logs.push(`${level}: ${message}`.trimEnd()),
});

// node-llama-cpp hands llama.cpp's log lines to JavaScript through the event
// loop, so a line may arrive after the call that printed it has returned (a
// clean-clone CI run once read a load log without its print_info lines).
// Wait until no new line has come for 100 ms, at most 5 s.
async function settled() {
    let n = -1;
    for (let waited = 0; waited < 5000 && n !== logs.length; waited += 100) {
        n = logs.length;
        await new Promise((r) => setTimeout(r, 100));
    }
    return logs;
}

for (const {path, defaults, ppl_tokens, lora, texts} of job.models) {
    logs.length = 0;
    const out = {model: path, defaults: !!defaults, ...(lora ? {lora} : {})};
    try {
        const model = await llama.loadModel({modelPath: path, gpuLayers: 0});
        out.load_log = (await settled()).filter((l) => /print_info|llama_model_loader: - type|file format|file type/.test(l));
        out.bos = model.tokens.bos;
        out.eos = model.tokens.eos;
        out.add_bos = model.tokens.shouldPrependBosToken;
        out.prompt_ids = job.prompts.map((p) => Array.from(model.tokenize(p)));
        if (texts) out.text_ids = texts.map((t) => Array.from(model.tokenize(t, true)));
        const context = await model.createContext({
            contextSize: 256, batchSize: 256, threads: job.threads ?? 1, flashAttention: defaults ? "auto" : false,
            ...(defaults ? {} : {experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"}),
            ...(lora ? {lora: {adapters: [{filePath: lora, scale: 1}]}} : {}),
        });
        if (lora) out.lora_log = (await settled()).filter((l) => /llama_adapter_lora/.test(l));
        const seq = context.getSequence();
        out.greedy = [];
        out.greedy_text = [];
        for (const p of job.greedy_prompts) {
            const ids = Array.from(model.tokenize(p));
            const start = out.add_bos && out.bos != null ? [out.bos, ...ids] : ids;
            const got = [];
            // temperature 0 is argmax in llama.cpp's sampler
            for await (const t of seq.evaluate(start, {temperature: 0})) {
                got.push(t);
                if (t === out.eos || got.length >= job.n_predict) break;
            }
            out.greedy.push(got);
            // a continuation may end inside a character: lone surrogates
            // become U+FFFD so that the line is JSON every reader accepts
            out.greedy_text.push(model.detokenize(got.filter((t) => t !== out.eos))
                .replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, "\uFFFD"));
            await seq.clearHistory();
        }
        // perplexity: the full next-token distribution at every position
        // (temperature 1, no truncation, so it is softmax(logits))
        const w = ppl_tokens ?? job.ppl_tokens;
        const sample = {temperature: 1, topK: 0, topP: 1, minP: 0};
        const items = w.slice(0, -1).map((t) => [t, {generateNext: {probabilities: true, options: sample}}]);
        const res = await seq.controlledEvaluate(items);
        let nll = 0, sum_err = 0;
        out.nll = [];
        for (let i = 0; i + 1 < w.length; i++) {
            const probs = res[i].next.probabilities;
            let total = 0;
            for (const p of probs.values()) total += p;
            sum_err = Math.max(sum_err, Math.abs(total - 1));
            const l = -Math.log(probs.get(w[i + 1]) ?? 0);
            out.nll.push(l);
            nll += l;
        }
        out.ppl_n = w.length - 1;
        out.ppl = Math.exp(nll / (w.length - 1));
        out.prob_sum_err = sum_err;
        await context.dispose();
        await model.dispose();
    } catch (e) {
        out.error = String(e && e.message ? e.message : e);
        out.log_tail = logs.slice(-8);
    }
    process.stdout.write(JSON.stringify(out) + "\n");
}
