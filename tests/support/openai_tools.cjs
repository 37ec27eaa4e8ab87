// The official OpenAI node client's tool-call API against tokpipe-http:
// reads {"base": URL, "model": name, "tools": [...], "user": text} on stdin
// and runs the tool loop a client writes: ask with tools (not streamed and
// streamed, the streamed tool_calls deltas assembled as the client's docs
// show, and by the client's own stream helper), send the call's result back as a second turn, then tool_choice
// "none", "required" and a named function (over bounded tools, so that
// the constrained call ends), and a name not offered. Prints one JSON object with what each step got
// (or the API error it raised). Run with NODE_PATH at the "openai" package.
const OpenAI = require("openai");

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const { base, model, tools, bounded, user } = JSON.parse(input);
  const client = new OpenAI({ baseURL: base, apiKey: "none", maxRetries: 0 });
  const messages = [{ role: "user", content: user }];
  const out = {};
  const step = async (name, f) => {
    try {
      out[name] = await f();
    } catch (e) {
      out[name] = { error: { status: e.status, param: e.param, message: e.message } };
    }
  };
  await step("first", () => client.chat.completions.create({ model, messages, tools, temperature: 0 }));
  await step("streamed", async () => {
    const stream = await client.chat.completions.create({ model, messages, tools, temperature: 0, stream: true });
    let content = "", reasoning = "", finish = null, chunks = 0;
    const calls = [];
    for await (const chunk of stream) {
      chunks++;
      const c = chunk.choices[0];
      if (!c) continue;
      const d = c.delta || {};
      if (d.content) content += d.content;
      if (d.reasoning_content) reasoning += d.reasoning_content;
      for (const t of d.tool_calls || []) {
        const k = t.index;
        calls[k] = calls[k] || { id: "", type: "function", function: { name: "", arguments: "" } };
        if (t.id) calls[k].id = t.id;
        if (t.function && t.function.name) calls[k].function.name += t.function.name;
        if (t.function && t.function.arguments) calls[k].function.arguments += t.function.arguments;
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    return { content, reasoning, calls, finish, chunks };
  });
  // the client's own stream helper assembles the deltas into a message
  // (and checks their shape: index, a first chunk with id and name)
  await step("helper", async () => {
    const stream = client.beta.chat.completions.stream({ model, messages, tools, temperature: 0 });
    const calls = [];
    stream.on("tool_calls.function.arguments.delta", (e) => calls.push(e.arguments_delta));
    const done = await stream.finalChatCompletion();
    return { message: done.choices[0].message, finish: done.choices[0].finish_reason, fragments: calls.length };
  });
  const first = out.first && out.first.choices ? out.first.choices[0].message : null;
  if (first && first.tool_calls) {
    const second = messages.concat([
      { role: "assistant", content: first.content, tool_calls: first.tool_calls },
      ...first.tool_calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: "{\"temp\": 21}" })),
    ]);
    await step("second", () => client.chat.completions.create({ model, messages: second, tools, temperature: 0 }));
  }
  await step("none", () =>
    client.chat.completions.create({ model, messages, tools, tool_choice: "none", temperature: 0 }));
  await step("required", () =>
    client.chat.completions.create({ model, messages, tools: bounded, tool_choice: "required", temperature: 0,
                                     max_tokens: 200 }));
  await step("named", () =>
    client.chat.completions.create({ model, messages, tools: bounded, parallel_tool_calls: false, temperature: 0,
                                     tool_choice: { type: "function", function: { name: "get_time" } },
                                     max_tokens: 200 }));
  await step("unknown", () =>
    client.chat.completions.create({ model, messages, tools, temperature: 0,
                                     tool_choice: { type: "function", function: { name: "get_time" } } }));
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
