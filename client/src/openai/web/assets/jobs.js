// The recent-jobs table, from GET /v1/jobs (the daemon's JobRecord list, newest first).

import { clock, duration, integer, isNumber } from './format.js';

/** Finish reasons of generations that ended normally; others are highlighted. */
const NORMAL = new Set(['Stop', 'Length']);

let shown = '';

/** Redraws the table from `jobs`, only when they changed (keeps selection and focus). */
export function renderJobs(jobs) {
  const key = JSON.stringify(jobs);
  if (key === shown) return;
  shown = key;
  const rows = jobs.map(row);
  document.querySelector('#jobs tbody').replaceChildren(...rows);
  document.getElementById('jobs-empty').hidden = jobs.length > 0;
}

function row(job) {
  // `estimated`: the counts (and the rate made from them) were guessed, not reported.
  const mark = job.estimated ? '~' : '';
  const usage = job.usage || {};
  const timings = job.timings || {};
  const tr = document.createElement('tr');
  tr.dataset.job = job.job;
  tr.append(
    cell('job', `#${job.job}`),
    time(job.finished_unix_ms),
    cell('tps', isNumber(timings.decode_tps) ? mark + timings.decode_tps.toFixed(1) : '—', true),
    cell('in', mark + integer(usage.prompt_tokens), true),
    // null: not known (a forwarded job, a daemon older than protocol 1.10).
    cell('cached', integer(job.cached_tokens), true),
    cell('out', mark + integer(usage.completion_tokens), true),
    cell('ttft', duration(timings.ttft_ms), true),
    finish(job.finish_reason),
    cell('engine', job.engine),
    cell('client', isNumber(job.client_pid) ? `pid ${job.client_pid}` : '—'),
  );
  return tr;
}

function cell(column, text, numeric = false) {
  const td = document.createElement('td');
  td.dataset.col = column;
  if (numeric) td.className = 'num';
  td.textContent = text;
  return td;
}

function time(unixMs) {
  const td = cell('finished', '');
  if (isNumber(unixMs) && unixMs > 0) {
    const t = document.createElement('time');
    t.dateTime = new Date(unixMs).toISOString();
    t.textContent = clock(unixMs);
    td.append(t);
  } else {
    td.textContent = '—';
  }
  return td;
}

function finish(reason) {
  const td = cell('finish', reason || '—');
  if (reason && !NORMAL.has(reason)) td.classList.add('unusual');
  return td;
}
