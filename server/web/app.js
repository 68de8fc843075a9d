// The chat page: keeps the conversation as an OpenAI `messages` array, sends it to
// /v1/chat/completions with stream=true and appends the reply as its SSE chunks arrive
// (fetch + ReadableStream; EventSource cannot POST). Stop (or Escape) aborts the request,
// which the server sees as a disconnect and cancels in the engine. No framework, nothing
// external.
"use strict";

const ui = Object.fromEntries(
  ["model", "new-chat", "settings", "system", "temperature", "max-tokens", "api-key",
   "messages", "status", "composer", "prompt", "send", "stop"]
    .map((id) => [id.replace(/-(.)/g, (_, c) => c.toUpperCase()), document.getElementById(id)]));

const history = [];  // {role, content}: the turns so far (the system prompt is added per request)
let controller = null;  // the AbortController of the reply being streamed, if any
let chatNumber = 0;  // counts "New chat"s: a reply stopped by one must not enter the new history

function setStatus(text) {
  ui.status.textContent = text;
}

function authHeaders() {
  const key = ui.apiKey.value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function askForKey() {
  ui.settings.open = true;
  ui.apiKey.focus();
  setStatus("This server needs an API key: enter it under Settings.");
}

// The message of an error response: OpenAI's {"error": {"message"}} when the body has it.
async function errorMessage(res) {
  const text = await res.text();
  try {
    const message = JSON.parse(text)?.error?.message;
    if (message) return `${res.status}: ${message}`;
  } catch { /* not JSON: fall through */ }
  return `${res.status} ${res.statusText}${text ? `: ${text.slice(0, 200)}` : ""}`;
}

async function loadModels() {
  try {
    const res = await fetch("/v1/models", { headers: authHeaders() });
    if (res.status === 401) return askForKey();
    if (res.status === 503) {  // the model is still loading
      setStatus("The server is loading the model…");
      return setTimeout(loadModels, 2000);
    }
    if (!res.ok) throw new Error(await errorMessage(res));
    const { data } = await res.json();
    ui.model.replaceChildren(...data.map((m) => new Option(m.id, m.id)));
    setStatus("");
  } catch (e) {
    setStatus(`Cannot list the models: ${e.message}`);
  }
}

// Appends a message to the transcript; returns its item and the text node to extend.
function addMessage(role, content) {
  const item = document.createElement("li");
  item.className = `message ${role}`;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role === "user" ? "You" : "Assistant";
  const body = document.createElement("div");
  body.className = "content";
  const text = document.createTextNode(content);
  body.append(text);
  item.append(label, body);
  ui.messages.append(item);
  following = true;
  followSoon();
  return { item, text };
}

// A growing reply stays in view while the reader is at the end of the page; one who has
// scrolled up to read is left there. Layout is read on scroll events and written once per
// frame, not once per chunk (a chunk can be a single token, a few hundred a second).
let following = true;
let isFollowQueued = false;
window.addEventListener("scroll", () => {
  const page = document.documentElement;
  following = page.scrollHeight - (page.scrollTop + page.clientHeight) < 80;
}, { passive: true });

function followSoon() {
  if (isFollowQueued) return;
  isFollowQueued = true;
  requestAnimationFrame(() => {
    isFollowQueued = false;
    if (following) document.documentElement.scrollTop = document.documentElement.scrollHeight;
  });
}

// Yields the data of each server-sent event in a response body (comments such as the
// server's ": ping" are skipped; multi-line data is joined with "\n", as the spec says).
async function* sseData(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      const lines = buffer.split("\n");
      buffer = lines.pop();  // an incomplete line waits for the next read
      for (let line of lines) {
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length) yield data.join("\n");
          data = [];
        } else if (line.startsWith("data:")) {
          data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
        }
      }
    }
    if (data.length) yield data.join("\n");
  } finally {
    reader.cancel().catch(() => {});
  }
}

function numberField(input) {
  const value = input.valueAsNumber;
  return Number.isFinite(value) ? value : undefined;
}

function requestBody() {
  const system = ui.system.value.trim();
  return {
    model: ui.model.value || undefined,
    messages: [...(system ? [{ role: "system", content: system }] : []), ...history],
    stream: true,
    temperature: numberField(ui.temperature),
    max_tokens: numberField(ui.maxTokens),
  };
}

function setBusy(busy) {
  ui.send.disabled = busy;
  ui.stop.disabled = !busy;
}

async function send(text) {
  const chat = chatNumber;
  history.push({ role: "user", content: text });
  const question = addMessage("user", text);
  const reply = addMessage("assistant", "");
  reply.item.setAttribute("aria-busy", "true");
  controller = new AbortController();
  const signal = controller.signal;
  setBusy(true);
  setStatus("The assistant is replying…");
  let content = "";
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(requestBody()),
      signal,
    });
    if (res.status === 401) askForKey();
    if (!res.ok) throw new Error(await errorMessage(res));
    let finish = null;
    let sawDone = false;
    for await (const data of sseData(res.body)) {
      // Events already read from the socket are not shown after Stop (the next read would
      // throw, but one read can hold many events).
      signal.throwIfAborted();
      if (data === "[DONE]") {
        sawDone = true;
        break;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message ?? "error in the stream");
      const choice = chunk.choices?.[0];
      if (!choice) continue;  // e.g. the usage chunk
      const delta = choice.delta?.content;
      if (delta) {
        content += delta;
        reply.text.appendData(delta);
        followSoon();
      }
      finish = choice.finish_reason ?? finish;
    }
    if (!sawDone) throw new Error("the connection closed before the reply was complete");
    setStatus(finish === "length" ? "Reply done (it reached Max tokens)."
              : finish === "timeout" ? "Reply stopped by the server's time limit." : "Reply done.");
  } catch (e) {
    if (e.name === "AbortError") {
      setStatus("Stopped.");
    } else {
      const error = document.createElement("p");
      error.className = "error";
      error.textContent = `Error: ${e.message}`;
      reply.item.append(error);
      setStatus(`Error: ${e.message}`);
    }
  } finally {
    reply.item.removeAttribute("aria-busy");
    controller = null;
    setBusy(false);
    if (chat !== chatNumber) {
      // "New chat" was pressed meanwhile: this exchange belongs to no history any more.
    } else if (content) {
      history.push({ role: "assistant", content });
    } else {
      // Nothing came back: take the question out of the history (roles must alternate) and
      // give it back to the text box to retry.
      history.pop();
      question.item.classList.add("unsent");
      if (!ui.prompt.value) ui.prompt.value = text;
    }
  }
}

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = ui.prompt.value.trim();
  if (!text || controller) return;
  ui.prompt.value = "";
  send(text);
});

ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.composer.requestSubmit();
  } else if (event.key === "Escape" && controller) {
    controller.abort();
  }
});

ui.stop.addEventListener("click", () => controller?.abort());

ui.newChat.addEventListener("click", () => {
  controller?.abort();
  chatNumber += 1;
  history.length = 0;
  ui.messages.replaceChildren();
  setStatus("");
  ui.prompt.focus();
});

// Settings live in this browser (the API key only for this tab's session).
for (const [input, store] of [[ui.system, localStorage], [ui.temperature, localStorage],
                              [ui.maxTokens, localStorage], [ui.apiKey, sessionStorage]]) {
  const key = `llm-chat.${input.id}`;
  const saved = store.getItem(key);
  if (saved !== null) input.value = saved;
  input.addEventListener("change", () => store.setItem(key, input.value));
}
ui.apiKey.addEventListener("change", loadModels);

loadModels();
ui.prompt.focus();
