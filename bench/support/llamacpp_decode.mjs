// llama.cpp's batch-1 decode rate on a GGUF file, for bench_threads' paired
// baseline. llama.cpp as its authors ship it: the prebuilt CPU backends of
// node-llama-cpp (one per x86-64 level; ggml loads the best this CPU runs),
// driven through node-llama-cpp's API.
//
//   node llamacpp_decode.mjs MODULES FILE THREADS PROMPT TOKENS
//
// MODULES: the node_modules folder holding node-llama-cpp. Prints one JSON
// line: tok/s over TOKENS generated tokens after a PROMPT-token prompt
// (greedy; the clock starts at the first generated token, so it times
// TOKENS decode steps, each with its logits and an argmax), the threads
// llama.cpp used and the CPU backend it loaded.
import fs from "node:fs";
import path from "node:path";
import {pathToFileURL} from "node:url";

const [modules, file, threadsArg, promptArg, tokensArg] = process.argv.slice(2);
if (!modules || !file || !(+threadsArg > 0) || !(+promptArg > 0) || !(+tokensArg > 0)) {
    console.error("usage: node llamacpp_decode.mjs MODULES FILE THREADS PROMPT TOKENS");
    process.exit(2);
}
const {getLlama, LlamaLogLevel} = await import(pathToFileURL(path.join(modules, "node-llama-cpp", "dist", "index.js")));
const llama = await getLlama({gpu: false, build: "never", maxThreads: 0, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: file, gpuLayers: 0});
const ctx = await model.createContext({contextSize: 256, batchSize: 64, sequences: 1, threads: +threadsArg});
const seq = ctx.getSequence();
const vocab = model.tokens.count ?? 32000;
const prompt = Array.from({length: +promptArg}, (_, i) => 3 + (i * 7919) % (vocab - 3));
const tokens = +tokensArg;
let n = 0, t0 = 0;
for await (const tok of seq.evaluate(prompt, {temperature: 0})) {
    void tok;
    if (n === 0) t0 = performance.now();
    if (++n > tokens) break;
}
const rate = tokens / ((performance.now() - t0) / 1000);
// the CPU backend ggml chose for this CPU, from the libraries mapped
const m = /libggml-cpu-([\w-]+)\.so/.exec(fs.readFileSync("/proc/self/maps", "utf8"));
const backend = m ? m[1] : "unknown";
console.log(JSON.stringify({tok_s: rate, threads: ctx.currentThreads, backend}));
await seq.dispose?.();
await ctx.dispose();
await model.dispose();
await llama.dispose();
