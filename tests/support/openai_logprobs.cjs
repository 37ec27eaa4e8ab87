// The official OpenAI node client (npm "openai") reading logprobs from
// tokpipe-http: reads {"base": URL, "requests": [body, ...]} on stdin, runs
// each body without and with stream: true (chat bodies, those with
// messages, through client.chat.completions.create; others through
// client.completions.create) and prints one JSON object per request:
// {logprobs: [per choice, as the client parsed it], stream_logprobs: [per
// choice, the streamed chunks' logprobs merged in order], texts, stream_texts}.
// Run with NODE_PATH pointing at the node_modules holding "openai".
const OpenAI = require("openai");

function merge(into, lp, chat) {
  if (!lp) return into;
  if (chat) {
    into = into || { content: [] };
    into.content.push(...lp.content);
    return into;
  }
  into = into || { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const k of Object.keys(into)) into[k].push(...lp[k]);
  return into;
}

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const { base, requests } = JSON.parse(input);
  const client = new OpenAI({ baseURL: base, apiKey: "none", maxRetries: 0 });
  for (const body of requests) {
    const chat = !!body.messages;
    const api = chat ? client.chat.completions : client.completions;
    const out = { logprobs: [], texts: [], stream_logprobs: [], stream_texts: [] };
    try {
      const r = await api.create(body);
      for (const c of r.choices) {
        out.logprobs[c.index] = c.logprobs;
        out.texts[c.index] = chat ? c.message.content : c.text;
      }
      const stream = await api.create({ ...body, stream: true });
      for await (const chunk of stream) {
        for (const c of chunk.choices) {
          const t = chat ? (c.delta && c.delta.content) || "" : c.text;
          out.stream_texts[c.index] = (out.stream_texts[c.index] || "") + t;
          out.stream_logprobs[c.index] = merge(out.stream_logprobs[c.index], c.logprobs, chat);
        }
      }
    } catch (e) {
      out.error = { status: e.status, param: e.param, message: e.message };
    }
    process.stdout.write(JSON.stringify(out) + "\n");
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
