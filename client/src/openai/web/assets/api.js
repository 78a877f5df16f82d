// Calls to the shim's own /v1 API: the optional bearer key, JSON errors, and the SSE
// stream of a chat completion.

const KEY_STORAGE = 'sparkd.apiKey';

/** The API key pasted in this tab, or '' (sessionStorage: gone when the tab closes). */
export function apiKey() {
  try {
    return sessionStorage.getItem(KEY_STORAGE) || '';
  } catch {
    return ''; // storage disabled: the page still works without a key
  }
}

export function setApiKey(key) {
  try {
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
  } catch {
    // Nowhere to keep it; the user will be asked again.
  }
}

/** A failed call: `status` is the HTTP status (0 when the server did not answer). */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
  }
}

function headers(extra) {
  const h = new Headers(extra);
  const key = apiKey();
  if (key) h.set('Authorization', `Bearer ${key}`);
  return h;
}

async function send(path, init) {
  let response;
  try {
    response = await fetch(path, { ...init, headers: headers(init.headers), cache: 'no-store' });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(0, 'The server does not answer.');
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

/** The shim answers errors as OpenAI does: {"error": {"message": ...}}. */
async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch {
    // Not JSON: keep the status line.
  }
  return new ApiError(response.status, message);
}

export async function getJson(path) {
  const response = await send(path, { method: 'GET', headers: { Accept: 'application/json' } });
  return response.json();
}

/**
 * Streams one chat completion. `onText(piece)` gets the answer as it is generated, and
 * `onReasoning(piece)` a thinking model's reasoning (`delta.reasoning_content`), which
 * comes before it.
 * Resolves to {usage, finishReason}; rejects with ApiError, or with an AbortError when
 * `signal` fires (closing the connection is what cancels the generation in the daemon).
 */
export async function streamChat(body, signal, onText, onReasoning = () => {}) {
  const response = await send('/v1/chat/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream' },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const result = { usage: null, finishReason: null };
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    // Events end with a blank line; the last piece may be an incomplete event.
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = events.pop();
    for (const event of events) {
      if (handleEvent(event, result, onText, onReasoning)) return result;
    }
  }
  throw new ApiError(0, 'The answer ended early (the connection closed).');
}

/** Applies one SSE event; true at `[DONE]`. */
function handleEvent(event, result, onText, onReasoning) {
  const data = event
    .split(/\r?\n/)
    .filter((line) => line.startsWith('data:'))
    .map((line) => line.slice(5).replace(/^ /, ''))
    .join('\n');
  if (!data) return false;
  if (data === '[DONE]') return true;
  let chunk;
  try {
    chunk = JSON.parse(data);
  } catch {
    throw new ApiError(0, 'The server sent a malformed event.');
  }
  if (chunk.error) throw new ApiError(500, chunk.error.message || 'The generation failed.');
  if (chunk.usage) result.usage = chunk.usage;
  for (const choice of chunk.choices || []) {
    const thought = choice.delta && choice.delta.reasoning_content;
    if (thought) onReasoning(thought);
    const text = choice.delta && choice.delta.content;
    if (text) onText(text);
    if (choice.finish_reason) result.finishReason = choice.finish_reason;
  }
  return false;
}
