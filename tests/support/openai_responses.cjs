// The official OpenAI node client's Responses API (client.responses)
// against tokpipe-http: reads {"base": URL, "steps": [{name, kind, body,
// prev?, of?, result?}]} on stdin and runs each step in order: kind
// "create" (responses.create; prev: a step whose response id becomes
// previous_response_id), "stream" (responses.stream: the client's own
// accumulator builds the final response; the raw events, the text and
// arguments deltas are kept too), "retrieve" / "del" (the stored response
// of step `of`) or "loop" (a two-turn tool loop: ask with tools, answer
// each function_call with a function_call_output of step.result, ask
// again: "second" continues with previous_response_id, "resent" sends the
// whole conversation again with store: false). Prints one JSON object,
// step name -> what it got (or the API error it raised: status, body).
// Run with NODE_PATH at the "openai" package.
const OpenAI = require("openai");

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const { base, steps } = JSON.parse(input);
  const client = new OpenAI({ baseURL: base, apiKey: "none", maxRetries: 0 });
  const out = {};
  const bodyOf = (step) =>
    step.prev ? Object.assign({}, step.body, { previous_response_id: out[step.prev].id }) : step.body;
  const streamed = async (body) => {
    const events = [];
    const stream = client.responses.stream(body);
    stream.on("event", (e) => events.push(e));
    const response = await stream.finalResponse();
    let text = "", args = "", reasoning = "";
    for (const e of events) {
      if (e.type === "response.output_text.delta") text += e.delta;
      if (e.type === "response.function_call_arguments.delta") args += e.delta;
      if (e.type === "response.reasoning_text.delta") reasoning += e.delta;
    }
    return { response, events, text, args, reasoning, id: response.id };
  };
  for (const step of steps) {
    try {
      if (step.kind === "create") out[step.name] = await client.responses.create(bodyOf(step));
      else if (step.kind === "stream") out[step.name] = await streamed(bodyOf(step));
      else if (step.kind === "retrieve") out[step.name] = await client.responses.retrieve(out[step.of].id);
      else if (step.kind === "del") {
        const r = await client.responses.del(out[step.of].id);
        out[step.name] = r === undefined ? { deleted: true } : r;
      } else if (step.kind === "loop") {
        const first = await client.responses.create(step.body);
        const answers = first.output
          .filter((i) => i.type === "function_call")
          .map((c) => ({ type: "function_call_output", call_id: c.call_id, output: step.result }));
        const second = await client.responses.create(
          Object.assign({}, step.body, { previous_response_id: first.id, input: answers }));
        const items = (typeof step.body.input === "string" ? [{ role: "user", content: step.body.input }]
                                                           : step.body.input).concat(first.output, answers);
        const resent = await client.responses.create(Object.assign({}, step.body, { input: items, store: false }));
        out[step.name] = { first, second, resent };
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
