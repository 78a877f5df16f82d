// How figures are written on the page. The stats line matches `spark run`'s.

const DASH = '—';

/**
 * `33.5 tok/s · 60 tokens · 1.8 s to first token` from a chat completion's usage, plus
 * `· 96 of 116 prompt tokens cached` when the daemon reused part of the prompt.
 */
export function statsLine(usage) {
  const tps = isNumber(usage.decode_tps) ? usage.decode_tps.toFixed(1) : DASH;
  const tokens = usage.completion_tokens;
  const noun = tokens === 1 ? 'token' : 'tokens';
  const ttft = isNumber(usage.ttft_ms) ? seconds(usage.ttft_ms) : DASH;
  let line = `${tps} tok/s · ${tokens} ${noun} · ${ttft} s to first token`;
  const cached = usage.prompt_tokens_details?.cached_tokens;
  if (isNumber(cached) && cached > 0) {
    line += ` · ${cached} of ${usage.prompt_tokens} prompt tokens cached`;
  }
  return line;
}

/** Milliseconds as seconds, as `spark run` writes them: `1.8`, `0.26`, `0.095`. */
function seconds(ms) {
  const s = ms / 1000;
  // From 0.995 s, two significant digits round to 1.0.
  if (!(s > 0 && s < 0.995)) return s.toFixed(1);
  const decimals = Math.min(4, Math.max(1, 1 - Math.floor(Math.log10(s))));
  return s.toFixed(decimals);
}

export function isNumber(x) {
  return typeof x === 'number' && Number.isFinite(x);
}

/** Milliseconds as `850 ms`, `1.8 s`, `2 min 5 s`. */
export function duration(ms) {
  if (!isNumber(ms)) return DASH;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  const m = Math.floor(s / 60);
  if (m < 1440) return `${Math.floor(m / 60)} h ${m % 60} min`;
  return `${Math.floor(m / 1440)} d ${Math.floor(m / 60) % 24} h`;
}

/** Bytes in binary units: `9.1 MiB`. */
export function bytes(n) {
  if (!isNumber(n)) return DASH;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

/** Large counts shortened: `94.5 K`, `135 M`, `8.0 B`. */
export function count(n) {
  if (!isNumber(n)) return DASH;
  for (const [size, suffix] of [[1e9, 'B'], [1e6, 'M'], [1e3, 'K']]) {
    if (n >= size) {
      const v = n / size;
      return `${v >= 100 ? Math.round(v) : v.toFixed(1)} ${suffix}`;
    }
  }
  return String(n);
}

/** Integers with thousands separators in the reader's locale. */
export function integer(n) {
  return isNumber(n) ? Math.round(n).toLocaleString() : DASH;
}

/** Local wall-clock time of a Unix-epoch millisecond stamp (`13:07:42`). */
export function clock(unixMs) {
  if (!isNumber(unixMs) || unixMs <= 0) return DASH;
  return new Date(unixMs).toLocaleTimeString([], { hour12: false });
}
