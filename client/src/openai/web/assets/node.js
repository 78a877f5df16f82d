// The node panel, from GET /v1/status (the daemon's StatusReport, its prefix cache and
// what it made of the model's chat template).

import { bytes, count, duration, integer } from './format.js';

let shown = '';

/** Redraws the facts list from `status`, only when something changed. */
export function renderNode(status) {
  const model = status.model || {};
  const kvUsed = status.kv_blocks_used;
  const kvTotal = status.kv_blocks_total;
  const blockTokens = status.kv_block_tokens;
  const facts = [
    ['Model', model.name, `${model.architecture} · ${model.quantization} · ${count(model.parameters)} parameters · context ${integer(model.context_length)}`],
    ...chatFormat(status),
    ['Backend', `${status.backend} · ${status.device}`],
    ['Memory', `${bytes(status.resident_bytes)} resident`],
    ['Requests', `${status.running} running · ${status.queued} queued`],
    ['KV cache', `${integer(kvUsed)} / ${integer(kvTotal)} blocks · ${integer(kvUsed * blockTokens)} / ${integer(kvTotal * blockTokens)} tokens`, null, [kvUsed, kvTotal]],
    ...prefixCache(status),
    ['Served', `${integer(status.requests_served)} requests · ${integer(status.tokens_generated)} tokens generated · ${integer(status.prompt_tokens_processed)} prompt tokens`],
    ['Uptime', duration(status.uptime_s * 1000)],
    ['Daemon', `sparkd ${status.daemon_version}`],
  ];
  const uptime = facts.find(([label]) => label === 'Uptime')[1];
  const key = JSON.stringify(facts.filter(([label]) => label !== 'Uptime').map(([, v, d, m]) => [v, d, m]));
  const list = document.getElementById('node');
  list.removeAttribute('aria-busy');
  if (key === shown) {
    // Only the uptime moved: update it without rebuilding the list.
    const shownUptime = list.querySelector('[data-fact="Uptime"]');
    if (shownUptime) shownUptime.textContent = uptime;
    return;
  }
  shown = key;
  list.replaceChildren(...facts.flatMap(fact));
}

/** The chat-format fact, or none from a daemon that does not report one (before 1.8). */
function chatFormat(status) {
  const chat = status.chat_format;
  if (!chat) return [];
  if (!chat.template) return [['Chat', 'no chat template: raw prompts only']];
  const switches = chat.variables.length ? `switches ${chat.variables.join(', ')}` : null;
  return [['Chat', `tools ${chat.tools} · thinks in ${chat.think_open}…${chat.think_close}`, switches]];
}

/** The prefix-cache fact, or none from a daemon that does not report one (before 1.2). */
function prefixCache(status) {
  const cache = status.prefix_cache;
  if (!cache) return [];
  if (!cache.enabled) return [['Prefix cache', 'off']];
  const prompt = status.prompt_tokens_processed;
  const share = prompt > 0 ? ` (${Math.round((cache.prompt_tokens_reused / prompt) * 100)}%)` : '';
  return [[
    'Prefix cache',
    `${integer(cache.cached_blocks * status.kv_block_tokens)} tokens cached · ${integer(cache.idle_blocks)} idle blocks`,
    `${integer(cache.prompt_tokens_reused)} of ${integer(prompt)} prompt tokens reused${share} · ${integer(cache.evicted_blocks)} blocks evicted`,
  ]];
}

function fact([label, value, detail, meter]) {
  const dt = document.createElement('dt');
  dt.textContent = label;
  const dd = document.createElement('dd');
  const main = document.createElement('span');
  main.dataset.fact = label;
  main.textContent = value;
  dd.append(main);
  if (detail) {
    const small = document.createElement('span');
    small.className = 'detail';
    small.textContent = detail;
    dd.append(small);
  }
  if (meter && meter[1] > 0) {
    const m = document.createElement('meter');
    m.min = 0;
    m.max = meter[1];
    m.value = meter[0];
    m.high = meter[1] * 0.9;
    m.setAttribute('aria-label', `${label} use`);
    dd.append(m);
  }
  return [dt, dd];
}

/** One line for the page header: `tiny on cpu`. */
export function summary(status) {
  return `${status.model ? status.model.name : 'no model'} on ${status.backend}`;
}
