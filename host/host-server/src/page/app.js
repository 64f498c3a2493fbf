// The chat page: one conversation kept in memory, settings in localStorage,
// each answer streamed into its own message with its figures underneath.
// The page only speaks the public API (stream.js); markdown.js renders.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const ui = {
    conversation: $("conversation"),
    empty: $("empty"),
    input: $("input"),
    send: $("send"),
    stop: $("stop"),
    newChat: $("new-chat"),
    model: $("model-name"),
    settings: $("settings"),
    settingsToggle: $("settings-toggle"),
    system: $("system"),
    temperature: $("temperature"),
    maxTokens: $("max-tokens"),
    apiKey: $("api-key"),
  };
  const STORE = "mlx-engine.page.settings";
  const chat = { history: [], controller: null, model: null };

  // Settings: restored at load, saved on every change.
  const fields = { system: ui.system, temperature: ui.temperature, maxTokens: ui.maxTokens, apiKey: ui.apiKey };
  try {
    const saved = JSON.parse(localStorage.getItem(STORE) || "{}");
    for (const [k, el] of Object.entries(fields)) if (typeof saved[k] === "string") el.value = saved[k];
  } catch (_) { /* unreadable settings are ignored */ }
  const save = () => {
    const v = {};
    for (const [k, el] of Object.entries(fields)) v[k] = el.value;
    localStorage.setItem(STORE, JSON.stringify(v));
  };
  for (const el of Object.values(fields)) el.addEventListener("input", save);
  ui.apiKey.addEventListener("change", loadModel);
  const showSettings = (open) => {
    ui.settings.hidden = !open;
    ui.settingsToggle.setAttribute("aria-expanded", String(open));
  };
  ui.settingsToggle.addEventListener("click", () => showSettings(ui.settings.hidden));

  function element(tag, cls, text) {
    const el = document.createElement(tag);
    if (cls) el.className = cls;
    if (text !== undefined) el.textContent = text;
    return el;
  }

  function add(el) {
    const stick = ui.conversation.scrollHeight - ui.conversation.scrollTop - ui.conversation.clientHeight < 40;
    ui.empty.hidden = true;
    ui.conversation.appendChild(el);
    if (stick) ui.conversation.scrollTop = ui.conversation.scrollHeight;
    return el;
  }

  function showError(err, where) {
    const box = where || add(element("div", "msg error"));
    box.classList.add("error");
    box.dataset.state = "error";
    box.replaceChildren();
    box.appendChild(element("div", "role", "error" + (err.status ? " " + err.status : "")));
    box.appendChild(element("div", "content error-message", err.message));
    const detail = [err.type, err.code, err.param && "param: " + err.param].filter(Boolean).join(" · ");
    if (detail) box.appendChild(element("div", "stats", detail));
    return box;
  }

  async function loadModel() {
    ui.model.textContent = "…";
    try {
      const models = await Api.models(ui.apiKey.value.trim());
      const m = models[0];
      chat.model = m ? m.id : null;
      ui.model.textContent = m ? m.id : "no model";
      ui.model.title = m && m.context_length ? "context: " + m.context_length + " tokens" : "";
      ui.model.dataset.state = "ready";
    } catch (err) {
      ui.model.textContent = "unavailable";
      ui.model.dataset.state = "error";
      if (err.status === 401) {
        err.message += " (enter the server's key under Settings)";
        showSettings(true);
      }
      showError(err);
    }
  }

  function numberField(el, parse) {
    const v = el.value.trim();
    if (!v) return undefined;
    const n = parse(v);
    return Number.isFinite(n) ? n : undefined;
  }

  // One assistant message: thinking (hidden unless the server sends
  // reasoning), the answer, and its figures.
  function assistantMessage() {
    const box = element("div", "msg assistant");
    box.dataset.state = "streaming";
    box.appendChild(element("div", "role", "assistant"));
    const thinking = element("details", "thinking");
    thinking.hidden = true;
    thinking.appendChild(element("summary", null, "Thinking"));
    const thought = thinking.appendChild(element("div", "thinking-body"));
    box.appendChild(thinking);
    const content = box.appendChild(element("div", "content markdown"));
    const stats = box.appendChild(element("div", "stats"));
    return { box, thinking, thought, content, stats };
  }

  function showStats(view, usage, times) {
    const n = usage.completion_tokens || 0;
    const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    // Decode speed: tokens after the first over the time from the first
    // streamed piece to the last (when they came apart), else all tokens
    // over the whole request.
    const span = (times.last - times.first) / 1000;
    const tps = n > 1 && span > 0 ? (n - 1) / span : n / Math.max((times.last - times.sent) / 1000, 1e-3);
    const ttft = ((times.first || times.last) - times.sent) / 1000;
    Object.assign(view.stats.dataset, {
      completionTokens: n,
      promptTokens: usage.prompt_tokens || 0,
      cachedTokens: cached,
      tokensPerSecond: tps.toFixed(1),
    });
    view.stats.textContent =
      n + " tokens · " + tps.toFixed(1) + " tokens/s · " + cached + " cached of " + (usage.prompt_tokens || 0) +
      " prompt tokens · first token " + ttft.toFixed(2) + " s";
  }

  function busy(on) {
    ui.send.disabled = on;
    ui.stop.disabled = !on;
    ui.newChat.disabled = on;
    document.body.classList.toggle("busy", on);
  }

  async function send() {
    const text = ui.input.value;
    if (!text.trim() || chat.controller) return;
    ui.input.value = "";
    const user = add(element("div", "msg user"));
    user.appendChild(element("div", "role", "you"));
    user.appendChild(element("div", "content", text));
    chat.history.push({ role: "user", content: text });

    const view = assistantMessage();
    add(view.box);
    const messages = [];
    if (ui.system.value.trim()) messages.push({ role: "system", content: ui.system.value });
    messages.push(...chat.history);
    const body = { model: chat.model || "default", messages, stream: true, stream_options: { include_usage: true } };
    const temperature = numberField(ui.temperature, parseFloat);
    const maxTokens = numberField(ui.maxTokens, (v) => parseInt(v, 10));
    if (temperature !== undefined) body.temperature = temperature;
    if (maxTokens !== undefined) body.max_tokens = maxTokens;

    const controller = new AbortController();
    chat.controller = controller;
    busy(true);
    let answer = "";
    let reasoning = "";
    let usage = null;
    let pending = false;
    const times = { sent: performance.now(), first: 0, last: 0 };
    const paint = () => {
      pending = false;
      view.content.innerHTML = Markdown.render(answer);
      view.thought.innerHTML = Markdown.render(reasoning);
      view.box.dataset.raw = answer;
      ui.conversation.scrollTop = ui.conversation.scrollHeight;
    };
    try {
      await Api.streamChat(body, ui.apiKey.value.trim(), controller.signal, {
        delta(d) {
          const piece = (d.content || "") + (d.reasoning_content || "");
          if (!piece) return;
          const now = performance.now();
          if (!times.first) times.first = now;
          times.last = now;
          answer += d.content || "";
          if (d.reasoning_content) {
            reasoning += d.reasoning_content;
            view.thinking.hidden = false;
          }
          if (!pending) {
            pending = true;
            requestAnimationFrame(paint);
          }
        },
        usage(u) { usage = u; },
      });
      paint();
      if (!times.last) times.last = performance.now();
      if (usage) showStats(view, usage, times);
      view.box.dataset.state = "done";
      chat.history.push({ role: "assistant", content: answer });
    } catch (err) {
      paint();
      if (err.name === "AbortError") {
        view.box.dataset.state = "stopped";
        view.stats.textContent = "stopped";
        if (answer) chat.history.push({ role: "assistant", content: answer });
        else chat.history.pop();
      } else {
        // The request failed: the question leaves the history so the next
        // one is not sent after it, and the error takes the answer's place.
        chat.history.pop();
        if (answer) {
          view.box.dataset.state = "error";
          view.box.appendChild(showError(err, element("div", "msg error")));
        } else {
          showError(err, view.box);
        }
      }
    } finally {
      chat.controller = null;
      busy(false);
      ui.input.focus();
    }
  }

  function newChat() {
    if (chat.controller) chat.controller.abort();
    chat.history = [];
    ui.conversation.replaceChildren(ui.empty);
    ui.empty.hidden = false;
    ui.input.focus();
  }

  ui.send.addEventListener("click", send);
  ui.stop.addEventListener("click", () => chat.controller && chat.controller.abort());
  ui.newChat.addEventListener("click", newChat);
  ui.input.addEventListener("keydown", (e) => {
    // Enter sends; Shift+Enter (and Enter while an IME composes) types a newline.
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !e.altKey && !e.ctrlKey && !e.metaKey) {
      e.preventDefault();
      send();
    }
  });
  loadModel();
})();
