// The chat panel: a multi-turn conversation kept in this page only, answers streamed as
// they are generated, a stop button, and the sampling settings.

import { ApiError, streamChat } from './api.js';
import { statsLine } from './format.js';

const $ = (id) => document.getElementById(id);

/**
 * The switches of the model's chat template (`chat_format.variables` of /v1/status) the
 * settings offer: thinking on or off through the first of `THINKING_SWITCHES` the
 * template reads, and OpenAI's `reasoning_effort` when it reads that.
 */
const THINKING_SWITCHES = ['enable_thinking', 'thinking'];

/** Shows the settings for the switches `chatFormat` (null: none known) lists. */
export function showSwitches(chatFormat) {
  const variables = (chatFormat && chatFormat.variables) || [];
  const thinking = THINKING_SWITCHES.find((name) => variables.includes(name)) || null;
  const effort = variables.includes('reasoning_effort');
  for (const el of document.querySelectorAll('[data-switch="thinking"]')) el.hidden = !thinking;
  for (const el of document.querySelectorAll('[data-switch="effort"]')) el.hidden = !effort;
  if (thinking) $('thinking-name').textContent = thinking;
  $('thinking').dataset.name = thinking || '';
}

/**
 * Wires the chat panel. `modelName()` names the answers; `onAuthNeeded()` runs on a 401;
 * `onFinished()` after every answer (to refresh the jobs table at once).
 */
export function setupChat({ modelName, onAuthNeeded, onFinished }) {
  const conversation = $('conversation');
  const status = $('chat-status');
  const composer = $('composer');
  const message = $('message');
  const send = $('send');
  const stop = $('stop');
  const settings = $('settings');

  /** What the model has seen so far: [{role, content}], never sent anywhere else. */
  let history = [];
  /** The AbortController of the answer being generated, if any. */
  let running = null;

  composer.addEventListener('submit', (event) => {
    event.preventDefault();
    submit();
  });
  message.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      submit();
    }
  });
  document.addEventListener('keydown', (event) => {
    if (event.key === 'Escape' && running) {
      event.preventDefault();
      running.abort();
    }
  });
  stop.addEventListener('click', () => running && running.abort());
  settings.addEventListener('submit', (event) => event.preventDefault());
  $('new-chat').addEventListener('click', () => {
    if (running) running.abort();
    history = [];
    for (const turn of conversation.querySelectorAll('.msg')) turn.remove();
    $('chat-empty').hidden = false;
    status.textContent = '';
    message.focus();
  });

  async function submit() {
    if (running) return;
    const text = message.value;
    if (!text.trim()) {
      message.focus();
      return;
    }
    const request = sampling();
    if (!request) return;
    const system = $('system-prompt').value.trim();
    request.messages = [
      ...(system ? [{ role: 'system', content: system }] : []),
      ...history,
      { role: 'user', content: text },
    ];

    const question = addTurn('user', 'You', text);
    const answer = addAnswer(modelName());
    message.value = '';
    running = new AbortController();
    setBusy(true);
    let received = '';
    try {
      // Only the answer goes back in the conversation: templates drop old reasoning.
      const { usage } = await streamChat(
        request,
        running.signal,
        (piece) => {
          received += piece;
          answer.append(piece);
        },
        (thought) => answer.think(thought),
      );
      history.push({ role: 'user', content: text }, { role: 'assistant', content: received });
      answer.done(usage ? statsLine(usage) : 'No usage was reported.');
      status.textContent = '';
    } catch (err) {
      if (err.name === 'AbortError') {
        // What was generated before the stop stays part of the conversation.
        history.push({ role: 'user', content: text }, { role: 'assistant', content: received });
        answer.done('Stopped.');
        status.textContent = 'Stopped.';
      } else {
        // The model never answered this message: leave it out, give the text back.
        question.classList.add('failed');
        answer.failed(err.message);
        status.textContent = `Not answered: ${err.message}`;
        if (!message.value) message.value = text;
        if (err instanceof ApiError && err.status === 401) onAuthNeeded();
      }
    } finally {
      const hadFocus = document.activeElement === stop;
      running = null;
      setBusy(false);
      if (hadFocus) message.focus();
      onFinished();
    }
  }

  /** The request's sampling fields, or null (and the problem shown) when one is invalid. */
  function sampling() {
    const temperature = $('temperature');
    const maxTokens = $('max-tokens');
    const schemaField = $('json-schema');
    let schema = null;
    schemaField.setCustomValidity('');
    if (schemaField.value.trim() !== '') {
      try {
        schema = JSON.parse(schemaField.value);
      } catch (err) {
        schemaField.setCustomValidity(`The schema is not JSON: ${err.message}`);
      }
    }
    if (!settings.checkValidity()) {
      settings.closest('details').open = true;
      settings.reportValidity();
      return null;
    }
    const request = {};
    if (temperature.value !== '') request.temperature = Number(temperature.value);
    if (maxTokens.value !== '') request.max_tokens = Number(maxTokens.value);
    if (schema !== null) {
      request.response_format = { type: 'json_schema', json_schema: { name: 'answer', schema } };
    } else if ($('json-output').checked) {
      request.response_format = { type: 'json_object' };
    }
    // A switch is sent only when the user set it and the template reads it.
    const thinking = $('thinking');
    if (!thinking.hidden && thinking.value && thinking.dataset.name) {
      request.chat_template_kwargs = { [thinking.dataset.name]: thinking.value === 'on' };
    }
    const effort = $('reasoning-effort');
    if (!effort.hidden && effort.value) request.reasoning_effort = effort.value;
    return request;
  }

  function setBusy(busy) {
    send.disabled = busy;
    stop.disabled = !busy;
    if (busy) status.textContent = 'Generating…';
  }

  /** Appends one message; keeps the view at the bottom if the reader was there. */
  function addTurn(role, who, text) {
    $('chat-empty').hidden = true;
    const turn = document.createElement('article');
    turn.className = `msg ${role}`;
    const heading = document.createElement('h3');
    heading.className = 'who';
    heading.textContent = who;
    const body = document.createElement('div');
    body.className = 'text';
    body.textContent = text;
    turn.append(heading, body);
    withScroll(() => conversation.append(turn));
    return turn;
  }

  function addAnswer(who) {
    const turn = addTurn('assistant', who, '');
    turn.setAttribute('aria-busy', 'true');
    const text = document.createTextNode('');
    turn.querySelector('.text').append(text);
    const stats = document.createElement('p');
    stats.className = 'stats';
    /** A thinking model's reasoning, shown above the answer while it streams. */
    let reasoning = null;
    return {
      think(piece) {
        if (!reasoning) {
          const details = document.createElement('details');
          details.className = 'reasoning';
          details.open = true;
          const summary = document.createElement('summary');
          summary.textContent = 'Reasoning';
          const body = document.createElement('div');
          body.className = 'thought';
          details.append(summary, body);
          withScroll(() => turn.querySelector('.text').before(details));
          reasoning = { details, body };
        }
        withScroll(() => reasoning.body.append(piece));
      },
      append(piece) {
        // The answer has begun: the reasoning folds away (a click shows it again).
        if (reasoning && reasoning.details.open && !text.length) reasoning.details.open = false;
        withScroll(() => text.appendData(piece));
      },
      done(line) {
        stats.textContent = line;
        finish();
      },
      failed(reason) {
        stats.textContent = reason;
        stats.classList.add('error');
        finish();
      },
    };
    function finish() {
      withScroll(() => turn.append(stats));
      turn.removeAttribute('aria-busy');
    }
  }

  function withScroll(change) {
    const atBottom =
      conversation.scrollHeight - conversation.scrollTop - conversation.clientHeight < 24;
    change();
    if (atBottom) conversation.scrollTop = conversation.scrollHeight;
  }
}
