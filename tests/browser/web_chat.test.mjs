// Drives the page at `/` of a running `spark serve-openai` in headless Chromium.
// Started by run.sh, which provides:
//   BASE_URL          the shim, e.g. http://127.0.0.1:41234 (started with --api-key API_KEY)
//   API_KEY           the key the page must ask for
//   CHROMIUM          the browser executable
//   OUT_DIR           where screenshots go
//   NODE_MODULES_DIR  where playwright-core is installed
//   USER_DATA_DIR     a fresh, empty browser profile directory
//   END_TOKENS        the model's end-of-generation token ids, a JSON array
// Prints one line per check and finally `N passed, M failed`; exits 1 on any failure.

import { createRequire } from 'node:module';
import path from 'node:path';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (run tests/browser/run.sh)`);
  return value;
};
const BASE = env('BASE_URL');
const KEY = env('API_KEY');
const OUT = env('OUT_DIR');
const END_TOKENS = JSON.parse(env('END_TOKENS'));
const require = createRequire(path.join(env('NODE_MODULES_DIR'), 'noop.js'));
const { chromium } = require('playwright-core');

/**
 * `33.5 tok/s · 60 tokens · 1.8 s to first token` (`—` when a figure is unknown); a
 * first token under a second has two significant digits (`0.26 s`, `0.030 s`); then
 * `· 96 of 116 prompt tokens cached` when the daemon reused part of the prompt.
 */
const STATS = /^(\d+\.\d|—) tok\/s · (\d+) tokens? · (\d+\.\d{1,4}|—) s to first token( · (\d+) of (\d+) prompt tokens cached)?$/;
/** How the daemon records a generation whose HTTP client went away or was cancelled. */
const CANCELLED = ['Cancelled', 'Disconnected'];

let passed = 0;
let failed = 0;
/** Screenshotted when a check fails, to see why. */
let failurePage = null;

/** Runs one check; a failure is reported and the later checks still run. */
async function check(name, fn) {
  try {
    await fn();
    passed += 1;
    console.log(`ok    ${name}`);
  } catch (err) {
    failed += 1;
    if (failurePage) {
      await failurePage.screenshot({ path: path.join(OUT, `web-fail-${failed}.png`), fullPage: true }).catch(() => {});
    }
    console.log(`FAIL  ${name}\n      ${String(err && err.stack ? err.stack : err).split('\n').slice(0, 4).join('\n      ')}`);
  }
}

function assert(condition, message) {
  if (!condition) throw new Error(message);
}

/** The shim's JSON, with the key, from Node (not through the page). */
async function api(pathname) {
  const response = await fetch(BASE + pathname, { headers: { Authorization: `Bearer ${KEY}` } });
  assert(response.ok, `${pathname}: HTTP ${response.status}`);
  return response.json();
}

/** The answer text and the usage in a chat completion's SSE body. */
function parseStream(body) {
  let text = '';
  let usage = null;
  for (const event of body.split('\n\n')) {
    const data = event.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
    if (!data || data === '[DONE]') continue;
    const chunk = JSON.parse(data);
    for (const choice of chunk.choices) text += choice.delta.content || '';
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, usage };
}

const context = await chromium.launchPersistentContext(env('USER_DATA_DIR'), {
  executablePath: env('CHROMIUM'),
  headless: true,
  // Playwright passes --user-data-dir itself, from the first argument.
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
  viewport: { width: 1280, height: 960 },
  colorScheme: 'light',
});

try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(15_000);
  failurePage = page;

  const problems = []; // script errors, CSP refusals, requests that leave the server
  page.on('pageerror', (err) => problems.push(`script error: ${err.message}`));
  page.on('console', (msg) => {
    if (msg.type() === 'error' && /Content Security Policy|Refused to/i.test(msg.text())) {
      problems.push(`console: ${msg.text()}`);
    }
  });
  const chatBodies = [];
  page.on('request', (request) => {
    if (!request.url().startsWith(`${BASE}/`)) problems.push(`request elsewhere: ${request.url()}`);
    if (request.url() === `${BASE}/v1/chat/completions`) chatBodies.push(request.postDataJSON());
  });
  page.on('response', (response) => {
    if (response.url().includes('/assets/') && response.status() !== 200) {
      problems.push(`asset ${response.url()}: HTTP ${response.status()}`);
    }
  });

  const status = await api('/v1/status');
  const answers = page.locator('.msg.assistant');
  const answerText = (i) => answers.nth(i).locator('.text').evaluate((e) => e.textContent);

  await check('the page loads under its CSP and asks for the API key', async () => {
    const response = await page.goto(`${BASE}/`);
    assert(response.status() === 200, `GET /: HTTP ${response.status()}`);
    const csp = response.headers()['content-security-policy'] || '';
    assert(csp.includes("default-src 'self'"), `CSP: ${csp}`);
    await page.locator('#key-form').waitFor({ state: 'visible' });
    await page.getByLabel('API key').fill(KEY);
    await page.getByRole('button', { name: 'Use key' }).click();
    await page.locator('#summary', { hasText: status.model.name }).waitFor();
  });

  await check('the node panel shows the model, backend, memory, load and KV use', async () => {
    const node = page.locator('#node');
    await node.locator('dt', { hasText: 'KV cache' }).waitFor();
    const text = await node.innerText();
    for (const expected of [status.model.name, status.backend, 'MiB resident', 'running', 'queued', 'blocks']) {
      assert(text.includes(expected), `node panel lacks "${expected}": ${text}`);
    }
    assert((await node.locator('meter').count()) === 1, 'no KV meter');
    // The prefix cache, from the same status request.
    const cache = await node.locator('[data-fact="Prefix cache"]').innerText();
    assert(/^[\d,]+ tokens cached · [\d,]+ idle blocks$/.test(cache), `prefix cache fact "${cache}"`);
    assert(text.includes('prompt tokens reused'), `node panel lacks the reuse figure: ${text}`);
    // How the daemon reads the synthetic model's ChatML template.
    const chat = await node.locator('[data-fact="Chat"]').innerText();
    assert(chat === 'tools described · thinks in <think>…</think>', `chat fact "${chat}"`);
  });

  let firstCount = null;
  await check('a chat message streams an answer with its stats line', async () => {
    await page.locator('summary', { hasText: 'Sampling settings' }).click();
    await page.getByLabel('Max tokens').fill('24');
    await page.getByLabel('Temperature').fill('0.8');
    await page.getByLabel('Message').fill('Hello! Who are you?');
    const response = page.waitForResponse(`${BASE}/v1/chat/completions`);
    await page.getByLabel('Message').press('Enter'); // keyboard: Enter sends
    const stats = answers.nth(0).locator('.stats');
    await stats.waitFor();
    const line = await stats.innerText();
    const match = STATS.exec(line);
    assert(match, `stats line "${line}" does not match ${STATS}`);
    firstCount = Number(match[2]);
    assert(firstCount >= 1 && firstCount <= 24, `token count ${firstCount} outside 1..=24`);

    // The page shows exactly what was streamed, and the stats line the stream's usage.
    const { text: streamed, usage } = parseStream((await (await response).body()).toString('utf8'));
    assert(await answerText(0) === streamed, `shown "${await answerText(0)}", streamed "${streamed}"`);
    assert(usage && usage.completion_tokens === firstCount, `usage ${JSON.stringify(usage)}`);
    // The daemon says how much of the prompt it reused; the line tells it when any was.
    const cached = usage.prompt_tokens_details?.cached_tokens;
    assert(Number.isInteger(cached), `usage without prompt_tokens_details: ${JSON.stringify(usage)}`);
    const shown = match[5] === undefined ? 0 : Number(match[5]);
    assert(shown === cached && (cached === 0 || Number(match[6]) === usage.prompt_tokens),
      `stats line "${line}" for usage ${JSON.stringify(usage)}`);
    const sent = chatBodies[0];
    assert(sent && sent.stream === true && sent.stream_options.include_usage === true,
      `request did not ask for a stream with usage: ${JSON.stringify(sent)}`);
    assert(sent.max_tokens === 24 && sent.temperature === 0.8, `settings not sent: ${JSON.stringify(sent)}`);
  });

  await check('the jobs table gains a row whose token count matches the stats line', async () => {
    assert(firstCount !== null, 'no stats line to compare with');
    const newest = page.locator('#jobs tbody tr').first();
    await newest.locator('td[data-col="out"]', { hasText: new RegExp(`^~?${firstCount}$`) })
      .waitFor({ timeout: 8000 });
    const finish = await newest.locator('td[data-col="finish"]').innerText();
    assert(['Stop', 'Length'].includes(finish), `finish reason ${finish}`);
    const jobs = await api('/v1/jobs?limit=1');
    assert(jobs.data[0].usage.completion_tokens === firstCount,
      `/v1/jobs says ${jobs.data[0].usage.completion_tokens} tokens, the page ${firstCount}`);
    assert(await newest.locator('td[data-col="client"]').innerText() === `pid ${jobs.data[0].client_pid}`,
      'client column');
    // The daemon ran this job itself: how much of its prompt the cache gave is known.
    const cached = jobs.data[0].cached_tokens;
    assert(Number.isInteger(cached), `/v1/jobs cached_tokens ${cached}`);
    const cachedCell = await newest.locator('td[data-col="cached"]').innerText();
    assert(cachedCell === String(cached), `cached column ${cachedCell}, /v1/jobs ${cached}`);
  });

  await check('a second message carries the first exchange and the system prompt', async () => {
    const firstAnswer = await answerText(0);
    await page.getByLabel('System prompt').fill('You are terse.');
    await page.getByLabel('Message').fill('Say more.');
    await page.getByRole('button', { name: 'Send' }).click();
    await answers.nth(1).locator('.stats').waitFor();
    assert(STATS.test(await answers.nth(1).locator('.stats').innerText()), 'second stats line');
    const roles = chatBodies[1].messages.map((m) => m.role).join(',');
    assert(roles === 'system,user,assistant,user', `roles sent: ${roles}`);
    assert(chatBodies[1].messages[2].content === firstAnswer, 'the first answer was not sent back as it was shown');
    await page.screenshot({ path: path.join(OUT, 'web-chat.png'), fullPage: true });
  });

  await check('"Answer in JSON" asks for a JSON object and gets the start of one', async () => {
    await page.getByRole('button', { name: 'New chat' }).click();
    await page.getByLabel('System prompt').fill('');
    await page.getByLabel('Max tokens').fill('48');
    await page.getByLabel('Answer in JSON').check();
    await page.getByLabel('Message').fill('Describe a cat as JSON with name, age and color.');
    await page.getByRole('button', { name: 'Send' }).click();
    await answers.nth(0).locator('.stats').waitFor();
    const sent = chatBodies[chatBodies.length - 1];
    assert(sent.response_format?.type === 'json_object', `request: ${JSON.stringify(sent)}`);
    const text = (await answerText(0)).trim();
    // A random model may not close the object within 48 tokens; it always opens one.
    assert(text.startsWith('{'), `answer "${text}" is not a JSON object`);
    await page.getByLabel('Answer in JSON').uncheck();
  });

  await check('a JSON Schema in the settings goes as response_format json_schema', async () => {
    await page.getByRole('button', { name: 'New chat' }).click();
    await page.getByLabel('Max tokens').fill('48');
    // Not JSON: nothing is sent, and the field says why.
    const before = chatBodies.length;
    await page.getByLabel('JSON Schema').fill('{"type": ');
    await page.getByLabel('Message').fill('Is a cat a pet?');
    await page.getByRole('button', { name: 'Send' }).click();
    const invalid = await page.getByLabel('JSON Schema').evaluate((el) => el.validationMessage);
    assert(invalid.includes('not JSON'), `validation message: "${invalid}"`);
    assert(chatBodies.length === before, 'a request went out with a broken schema');
    const schema = { type: 'object', properties: { pet: { type: 'boolean' } }, required: ['pet'], additionalProperties: false };
    await page.getByLabel('JSON Schema').fill(JSON.stringify(schema));
    await page.getByRole('button', { name: 'Send' }).click();
    await answers.nth(0).locator('.stats').waitFor();
    const sent = chatBodies[chatBodies.length - 1];
    assert(sent.response_format?.type === 'json_schema', `request: ${JSON.stringify(sent)}`);
    assert(JSON.stringify(sent.response_format.json_schema.schema) === JSON.stringify(schema), 'schema sent as given');
    const text = (await answerText(0)).trim();
    assert(text.startsWith('{'), `answer "${text}" is not a JSON object`);
    if (text.endsWith('}')) {
      const value = JSON.parse(text);
      assert(typeof value.pet === 'boolean' && Object.keys(value).length === 1, `answer "${text}" breaks the schema`);
    }
    await page.getByLabel('JSON Schema').fill('');
  });

  await check('stop cancels a long answer, and the job shows as cancelled', async () => {
    await page.getByRole('button', { name: 'New chat' }).click();
    assert((await page.locator('.msg').count()) === 0, 'New chat left messages');
    await page.getByLabel('System prompt').fill('');
    // 2000, or as much as the model's context leaves for a short prompt.
    const long = Math.min(2000, status.model.context_length - 64);
    await page.getByLabel('Max tokens').fill(String(long));
    const jobsBefore = (await api('/v1/jobs?limit=1')).data[0].job;
    // The random model may end an answer within a few tokens, before anyone could press
    // stop: this answer may not end on its own (the page sends what the user set, plus
    // a ban on the end-of-generation tokens).
    const ban = Object.fromEntries(END_TOKENS.map((id) => [String(id), -100]));
    await page.route(`${BASE}/v1/chat/completions`, (route) => {
      const body = route.request().postDataJSON();
      route.continue({ postData: JSON.stringify({ ...body, logit_bias: ban }) });
    });
    await page.getByLabel('Message').fill('Tell me a very long story.');
    await page.getByRole('button', { name: 'Send' }).click();
    const answer = answers.nth(0);
    // Stop once the answer is visibly streaming.
    await page.waitForFunction(() => {
      const a = document.querySelector('.msg.assistant[aria-busy="true"] .text');
      return a && a.textContent.length > 0;
    });
    await page.getByRole('button', { name: 'Stop' }).click({ timeout: 2000 });
    await page.unroute(`${BASE}/v1/chat/completions`);
    await answer.locator('.stats', { hasText: 'Stopped.' }).waitFor();
    assert(await page.getByRole('button', { name: 'Stop' }).isDisabled(), 'Stop still enabled');
    assert(await page.getByRole('button', { name: 'Send' }).isEnabled(), 'Send still disabled');

    // The daemon records the job once it has noticed the disconnect.
    let job = null;
    for (let i = 0; i < 50 && !job; i += 1) {
      const newest = (await api('/v1/jobs?limit=1')).data[0];
      if (newest && newest.job > jobsBefore) job = newest;
      else await new Promise((r) => setTimeout(r, 100));
    }
    assert(job, 'no job was recorded for the stopped answer');
    assert(CANCELLED.includes(job.finish_reason), `finish reason ${job.finish_reason}, not cancelled`);
    assert(job.usage.completion_tokens < long, `ran to ${job.usage.completion_tokens} of ${long} tokens`);
    const row = page.locator(`#jobs tbody tr[data-job="${job.job}"]`);
    await row.locator('td[data-col="finish"]', { hasText: job.finish_reason }).waitFor({ timeout: 8000 });
    await page.screenshot({ path: path.join(OUT, 'web-stop.png'), fullPage: true });
  });

  await check("a thinking model's reasoning shows apart, folded once the answer starts", async () => {
    await page.getByRole('button', { name: 'New chat' }).click();
    // A canned stream as the shim sends a thinking model's answer: reasoning chunks,
    // then content, then usage (the synthetic model does not think).
    const chunk = (delta, extra = {}) =>
      `data: ${JSON.stringify({ id: 'chatcmpl-x', object: 'chat.completion.chunk', created: 0,
        model: 'm', choices: [{ index: 0, delta, finish_reason: null }], usage: null, ...extra })}\n\n`;
    const usage = {
      prompt_tokens: 9, completion_tokens: 5, total_tokens: 14, ttft_ms: 20, generation_ms: 40,
      decode_tps: 100, queue_ms: 0, prefill_ms: 10, decode_ms: 40, prefill_tps: 900,
      completion_tokens_details: { reasoning_tokens: 3 },
    };
    const body = chunk({ role: 'assistant', content: '' })
      + chunk({ reasoning_content: 'The user says hi.' })
      + chunk({ reasoning_content: '\nGreet back.' })
      + chunk({ content: 'Hello' }) + chunk({ content: ' there!' })
      + `data: ${JSON.stringify({ id: 'chatcmpl-x', object: 'chat.completion.chunk', created: 0,
        model: 'm', choices: [], usage })}\n\ndata: [DONE]\n\n`;
    await page.route(`${BASE}/v1/chat/completions`, (route) =>
      route.fulfill({ status: 200, contentType: 'text/event-stream; charset=utf-8', body }));
    await page.getByLabel('Message').fill('hi');
    await page.getByRole('button', { name: 'Send' }).click();
    await answers.nth(0).locator('.stats').waitFor();
    await page.unroute(`${BASE}/v1/chat/completions`);
    assert(await answerText(0) === 'Hello there!', `answer "${await answerText(0)}"`);
    const reasoning = answers.nth(0).locator('details.reasoning');
    // Folded, it is not rendered: its text, not its innerText.
    const thought = await reasoning.locator('.thought').evaluate((e) => e.textContent);
    assert(thought === 'The user says hi.\nGreet back.', `reasoning "${thought}"`);
    assert(!(await reasoning.evaluate((d) => d.open)), 'the reasoning is still open after the answer');
    await reasoning.locator('summary').click();
    assert(await reasoning.evaluate((d) => d.open), 'a click does not show the reasoning again');
    await page.screenshot({ path: path.join(OUT, 'web-reasoning.png') });
    // The next turn sends back the answer only.
    await page.getByLabel('Message').fill('And then?');
    await page.getByRole('button', { name: 'Send' }).click();
    await answers.nth(1).locator('.stats').waitFor();
    const sent = chatBodies[chatBodies.length - 1].messages;
    assert(sent[sent.length - 2].content === 'Hello there!', `history sent: ${JSON.stringify(sent)}`);
  });

  await check("a template's thinking switches show in the settings and go with the request", async () => {
    await page.getByRole('button', { name: 'New chat' }).click();
    await page.getByLabel('Max tokens').fill('4');
    // The synthetic model's template reads no switch: none is offered.
    assert(await page.locator('#thinking').isHidden(), 'a thinking switch for a template without one');
    assert(await page.locator('#reasoning-effort').isHidden(), 'a reasoning effort for a template without one');
    // A status as a Qwen 3 or GPT-OSS daemon reports it (the page polls every 2 s).
    await page.route(`${BASE}/v1/status`, async (route) => {
      const real = await (await route.fetch()).json();
      real.chat_format = { ...real.chat_format, variables: ['enable_thinking', 'reasoning_effort'] };
      await route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(real) });
    });
    await page.locator('#thinking').waitFor({ state: 'visible', timeout: 6000 });
    assert(await page.locator('#thinking-name').innerText() === 'enable_thinking', 'the switch is not named');
    // Left at the model's default, nothing is sent.
    await page.getByLabel('Message').fill('Hi');
    await page.getByRole('button', { name: 'Send' }).click();
    await answers.nth(0).locator('.stats').waitFor();
    let sent = chatBodies[chatBodies.length - 1];
    assert(!('chat_template_kwargs' in sent) && !('reasoning_effort' in sent), `request: ${JSON.stringify(sent)}`);
    await page.getByLabel('Thinking').selectOption('off');
    await page.getByLabel('Reasoning effort').selectOption('low');
    await page.getByLabel('Message').fill('Again');
    await page.getByRole('button', { name: 'Send' }).click();
    await answers.nth(1).locator('.stats').waitFor();
    sent = chatBodies[chatBodies.length - 1];
    assert(JSON.stringify(sent.chat_template_kwargs) === '{"enable_thinking":false}', `request: ${JSON.stringify(sent)}`);
    assert(sent.reasoning_effort === 'low', `request: ${JSON.stringify(sent)}`);
    await page.screenshot({ path: path.join(OUT, 'web-switches.png'), fullPage: true });
    // Back to the real status: the switches go away, and with them what they send.
    await page.unroute(`${BASE}/v1/status`);
    await page.locator('#thinking').waitFor({ state: 'hidden', timeout: 6000 });
    await page.getByLabel('Message').fill('Once more');
    await page.getByRole('button', { name: 'Send' }).click();
    await answers.nth(2).locator('.stats').waitFor();
    sent = chatBodies[chatBodies.length - 1];
    assert(!('chat_template_kwargs' in sent), `request: ${JSON.stringify(sent)}`);
    await page.getByLabel('Max tokens').fill('');
  });

  await check('a narrow screen gets one column without sideways scrolling', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    const overflow = await page.evaluate(
      () => document.documentElement.scrollWidth - document.documentElement.clientWidth,
    );
    assert(overflow <= 0, `the page is ${overflow}px wider than the screen`);
    const [chat, node] = await Promise.all(['.panel.chat', '.panel.node'].map((s) => page.locator(s).boundingBox()));
    assert(node.y >= chat.y + chat.height, 'the node panel is not below the chat');
    await page.screenshot({ path: path.join(OUT, 'web-narrow.png'), fullPage: true });
  });

  await check('no script errors, CSP refusals, failed assets or outside requests', async () => {
    assert(problems.length === 0, problems.join('\n'));
  });
} finally {
  await context.close();
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
