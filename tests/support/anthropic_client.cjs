// The official Anthropic node client (@anthropic-ai/sdk) against
// tokpipe-http: reads {"base": URL, "key": KEY?, "steps": [{name, kind, body}]}
// on stdin and runs each step: kind "create" (messages.create), "stream"
// (messages.stream: the client's own accumulator builds the final message;
// the raw events are kept too), "count" (messages.countTokens) or "loop"
// (a two-turn tool loop: ask with tools, answer each tool_use block with a
// tool_result of step.result, ask again). Prints one JSON object, step name
// -> what it got (or the API error it raised: status, the error body).
// Run with NODE_PATH at the "@anthropic-ai/sdk" package.
const Anthropic = require("@anthropic-ai/sdk");

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const { base, key, steps } = JSON.parse(input);
  const client = new Anthropic({ baseURL: base, apiKey: key || "none", maxRetries: 0 });
  const out = {};
  const streamed = async (body) => {
    const events = [];
    const stream = client.messages.stream(body);
    stream.on("streamEvent", (e) => events.push(e));
    const message = await stream.finalMessage();
    let text = "", thinking = "", json = "";
    for (const e of events)
      if (e.type === "content_block_delta") {
        if (e.delta.type === "text_delta") text += e.delta.text;
        if (e.delta.type === "thinking_delta") thinking += e.delta.thinking;
        if (e.delta.type === "input_json_delta") json += e.delta.partial_json;
      }
    return { message, events, text, thinking, json };
  };
  for (const step of steps) {
    try {
      if (step.kind === "create") out[step.name] = await client.messages.create(step.body);
      else if (step.kind === "stream") out[step.name] = await streamed(step.body);
      else if (step.kind === "count") out[step.name] = await client.messages.countTokens(step.body);
      else if (step.kind === "loop") {
        const first = await client.messages.create(step.body);
        const uses = first.content.filter((b) => b.type === "tool_use");
        const messages = step.body.messages.concat([
          { role: "assistant", content: first.content },
          { role: "user", content: uses.map((b) => ({ type: "tool_result", tool_use_id: b.id, content: step.result })) },
        ]);
        const body = Object.assign({}, step.body, { messages });
        const second = await client.messages.create(body);
        out[step.name] = { first, second, messages };
      }
    } catch (e) {
      out[step.name] = { error: { status: e.status, body: e.error } };
    }
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
