// The playground: a conversation streamed from /v1/chat/completions, rendered as it arrives.

import { api, errorText, Unauthorized } from "./api.js";

const $ = (id) => document.getElementById(id);

export class Chat {
  constructor(status, onUnauthorized) {
    this.status = status; // the StatusView, for the model's name
    this.onUnauthorized = onUnauthorized;
    this.history = []; // {role, content} of the turns so far
    this.controller = null;
  }

  bind() {
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    $("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.send();
      }
    });
    $("stop").addEventListener("click", () => this.controller?.abort());
    $("clear").addEventListener("click", () => this.clear());
  }

  clear() {
    this.controller?.abort();
    this.history = [];
    $("messages").replaceChildren();
  }

  body(messages) {
    const system = $("system").value.trim();
    const body = {
      messages: system ? [{ role: "system", content: system }, ...messages] : messages,
      stream: true,
      stream_options: { include_usage: true },
    };
    if (this.status.model) body.model = this.status.model;
    const temperature = parseFloat($("temperature").value);
    if (Number.isFinite(temperature)) body.temperature = temperature;
    const maxTokens = parseInt($("max-tokens").value, 10);
    if (Number.isFinite(maxTokens)) body.max_tokens = maxTokens;
    return body;
  }

  async send() {
    const text = $("prompt").value.trim();
    if (!text || this.controller) return;
    $("prompt").value = "";
    $("chat-hint")?.remove();
    const messages = [...this.history, { role: "user", content: text }];
    addMessage("user", text);
    const reply = new Reply(addMessage("assistant", ""));
    this.controller = new AbortController();
    this.busy(true);
    try {
      await this.stream(this.body(messages), reply);
    } catch (error) {
      if (error.name === "AbortError") reply.note("stopped");
      else if (error instanceof Unauthorized) {
        reply.fail(error.message);
        this.onUnauthorized();
      } else reply.fail(String(error.message || error));
    } finally {
      this.controller = null;
      this.busy(false);
      reply.finish();
      if (reply.content) this.history = [...messages, { role: "assistant", content: reply.content }];
    }
  }

  busy(on) {
    $("send").disabled = on;
    $("stop").disabled = !on;
  }

  async stream(body, reply) {
    const response = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: this.controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    const warning = response.headers.get("warning");
    if (warning) reply.note(warning);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      const events = buffer.split(/\r?\n\r?\n/);
      buffer = events.pop();
      for (const event of events) if (handleEvent(event, reply)) return;
    }
  }
}

// One SSE event: true at `[DONE]`.
function handleEvent(event, reply) {
  const data = event
    .split(/\r?\n/)
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).trimStart())
    .join("\n");
  if (!data) return false; // a heartbeat comment
  if (data === "[DONE]") return true;
  const chunk = JSON.parse(data);
  if (chunk.error) {
    reply.fail(chunk.error.message || "the server ended the stream with an error");
    return false;
  }
  const choice = chunk.choices?.[0];
  if (choice?.delta?.reasoning_content) reply.think(choice.delta.reasoning_content);
  if (choice?.delta?.reasoning) reply.think(choice.delta.reasoning);
  if (choice?.delta?.content) reply.add(choice.delta.content);
  if (choice?.finish_reason) reply.reason = choice.finish_reason;
  if (chunk.usage) reply.usage = chunk.usage;
  return false;
}

// The assistant's message as it streams in.
class Reply {
  constructor(element) {
    this.element = element;
    this.reasoning = null;
    this.text = element.appendChild(document.createElement("span"));
    this.text.className = "content";
    this.content = "";
    this.reason = null;
    this.usage = null;
    this.notes = [];
    this.started = performance.now();
    this.firstToken = null;
  }

  think(delta) {
    if (!this.reasoning) {
      this.reasoning = document.createElement("span");
      this.reasoning.className = "reasoning";
      this.element.insertBefore(this.reasoning, this.text);
    }
    this.reasoning.textContent += delta;
    scrollDown();
  }

  add(delta) {
    this.firstToken ??= performance.now();
    this.content += delta;
    this.text.textContent = this.content;
    scrollDown();
  }

  note(text) {
    this.notes.push(text);
  }

  fail(message) {
    const error = this.element.appendChild(document.createElement("span"));
    error.className = "error";
    error.textContent = (this.content ? "\n" : "") + message;
  }

  finish() {
    const parts = [...this.notes];
    if (this.usage) {
      const tokens = this.usage.completion_tokens;
      const seconds = (performance.now() - (this.firstToken ?? this.started)) / 1000;
      parts.unshift(`${tokens} tokens`, seconds > 0 && tokens > 1 ? `${((tokens - 1) / seconds).toFixed(1)} tok/s` : "");
      if (this.firstToken) parts.splice(1, 0, `first token ${Math.round(this.firstToken - this.started)} ms`);
    }
    if (this.reason) parts.push(`finish: ${this.reason}`);
    const meta = this.element.appendChild(document.createElement("span"));
    meta.className = "meta";
    meta.textContent = parts.filter(Boolean).join(" · ");
    this.element.dataset.done = "true";
  }
}

function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  const label = el.appendChild(document.createElement("span"));
  label.className = "role";
  label.textContent = role;
  if (text) el.appendChild(document.createTextNode(text));
  $("messages").append(el);
  scrollDown();
  return el;
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}
