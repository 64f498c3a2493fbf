// The page's side of the HTTP API: GET /v1/models and a streamed
// POST /v1/chat/completions read as server-sent events. An answer that is
// not 2xx, or an error object inside the stream, becomes an ApiError with
// the server's own message (never swallowed); an aborted fetch surfaces as
// the browser's AbortError so the caller can tell a stop from a failure.
"use strict";

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || (typeof body === "string" && body) || "HTTP " + status);
    this.status = status;
    this.type = e.type || null;
    this.code = e.code || null;
    this.param = e.param || null;
  }
}

const Api = (() => {
  function headers(key) {
    const h = { "Content-Type": "application/json" };
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  async function failure(resp) {
    const text = await resp.text();
    try {
      return new ApiError(resp.status, JSON.parse(text));
    } catch (_) {
      return new ApiError(resp.status, text.trim() || resp.statusText);
    }
  }

  async function models(key) {
    const resp = await fetch("/v1/models", { headers: headers(key) });
    if (!resp.ok) throw await failure(resp);
    return (await resp.json()).data || [];
  }

  // One SSE event's data (its `data:` lines joined); comments (`: keep-alive`)
  // and other fields are skipped.
  function eventData(block) {
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
    }
    return data.length ? data.join("\n") : null;
  }

  // Streams one chat completion; calls on.delta(delta) for each choice-0
  // delta and on.usage(usage) for the usage chunk. Resolves at [DONE].
  async function streamChat(body, key, signal, on) {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(key),
      body: JSON.stringify(body),
      signal,
    });
    if (!resp.ok) throw await failure(resp);
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      const blocks = buffer.split(/\r?\n\r?\n/);
      buffer = done ? "" : blocks.pop();
      for (const block of blocks) {
        const data = eventData(block);
        if (data === null) continue;
        if (data.trim() === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(500, chunk);
        if (chunk.usage) on.usage(chunk.usage);
        const choice = (chunk.choices || [])[0];
        if (choice && choice.delta) on.delta(choice.delta, choice.finish_reason || null);
      }
      if (done) throw new ApiError(0, "the stream ended before [DONE]");
    }
  }

  return { models, streamChat };
})();
