// The official OpenAI node client (npm "openai") against tokpipe-http:
// reads {"base": URL, "requests": [body, ...]} on stdin, runs each body
// through client.completions.create without and with stream: true, and
// prints one JSON object per request: the non-streamed choices and usage,
// the streamed text per choice, finish reasons and the usage chunk.
// A chat request (body.messages) goes to client.chat.completions.create and
// reports the API error the client raised, if any.
// Run with NODE_PATH pointing at the node_modules holding "openai".
const OpenAI = require("openai");

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const { base, requests, apiKey } = JSON.parse(input);
  const client = new OpenAI({ baseURL: base, apiKey: apiKey || "none", maxRetries: 0 });
  for (const body of requests) {
    const out = {};
    try {
      if (body.messages) {
        const r = await client.chat.completions.create(body);
        out.chat = r;
      } else {
        const r = await client.completions.create(body);
        out.choices = r.choices.map((c) => ({ text: c.text, finish_reason: c.finish_reason, stop_reason: c.stop_reason }));
        out.usage = r.usage;
        const stream = await client.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
        const texts = [], finish = [];
        for await (const chunk of stream) {
          if (chunk.usage) out.stream_usage = chunk.usage;
          for (const c of chunk.choices) {
            texts[c.index] = (texts[c.index] || "") + c.text;
            if (c.finish_reason) finish[c.index] = c.finish_reason;
          }
        }
        out.stream_texts = texts;
        out.stream_finish = finish;
      }
    } catch (e) {
      out.error = { status: e.status, param: e.param, message: e.message, type: e.type, code: e.code };
    }
    process.stdout.write(JSON.stringify(out) + "\n");
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
