// Entry point: the API key form, the chat panel, and the live node and jobs panels
// (polled from /v1/status and /v1/jobs every two seconds while the page is visible).

import { apiKey, ApiError, getJson, setApiKey } from './api.js';
import { setupChat, showSwitches } from './chat.js';
import { renderJobs } from './jobs.js';
import { renderNode, summary } from './node.js';

const POLL_MS = 2000;
const JOBS_SHOWN = 50;

const $ = (id) => document.getElementById(id);

let model = null;
let timer = null;
let inFlight = false;
/** A refresh was asked for while one was in flight. */
let again = false;
/** The key (maybe '') the server last refused: no polling with it until it changes. */
let refusedKey = null;

setupKeyForm();
setupChat({
  modelName: () => model || 'Model',
  onAuthNeeded: askForKey,
  onFinished: refreshSoon,
});
document.addEventListener('visibilitychange', () => {
  if (!document.hidden) refreshSoon();
});
refresh();

function setupKeyForm() {
  const form = $('key-form');
  const input = $('api-key');
  form.hidden = !apiKey();
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    setApiKey(input.value.trim());
    input.value = '';
    input.placeholder = apiKey() ? 'key set' : '';
    refreshSoon();
  });
  $('key-forget').addEventListener('click', () => {
    setApiKey('');
    input.placeholder = '';
    refreshSoon();
  });
  if (apiKey()) input.placeholder = 'key set';
}

function askForKey() {
  refusedKey = apiKey();
  const form = $('key-form');
  const wasHidden = form.hidden;
  form.hidden = false;
  $('summary').textContent = apiKey()
    ? 'The API key was refused; paste the right one.'
    : 'This server needs an API key.';
  if (wasHidden) $('api-key').focus();
}

/** Refreshes now (or right after the refresh in flight), then every POLL_MS. */
function refreshSoon() {
  if (inFlight) again = true;
  else refresh();
}

async function refresh() {
  clearTimeout(timer);
  inFlight = true;
  try {
    if (!document.hidden && apiKey() !== refusedKey) {
      const [status, jobs] = await Promise.allSettled([
        getJson('/v1/status'),
        getJson(`/v1/jobs?limit=${JOBS_SHOWN}`),
      ]);
      show(status, (s) => {
        model = s.model ? s.model.name : null;
        showSwitches(s.chat_format || null);
        renderNode(s);
        $('summary').textContent = summary(s);
      }, $('node-error'));
      show(jobs, (j) => renderJobs(j.data || []), $('jobs-error'));
    }
  } finally {
    inFlight = false;
  }
  if (again) {
    again = false;
    refresh();
  } else {
    timer = setTimeout(refresh, POLL_MS);
  }
}

/** Applies a settled call, or shows why it failed in `errorBox`. */
function show(settled, apply, errorBox) {
  let err = settled.reason;
  if (settled.status === 'fulfilled') {
    refusedKey = null;
    try {
      apply(settled.value);
      errorBox.hidden = true;
      return;
    } catch (thrown) {
      err = thrown; // an answer this page does not understand: say so, keep polling
    }
  }
  if (err instanceof ApiError && err.status === 401) askForKey();
  errorBox.textContent = err.message;
  errorBox.hidden = false;
}
