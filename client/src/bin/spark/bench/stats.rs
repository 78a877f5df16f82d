//! What one benchmark stream saw and what a level of concurrent streams adds up to.
//! The same definitions serve sparkd and the peer, so the columns compare like with like.

use serde::Serialize;

/// One stream, with times in seconds from the moment the level's requests went out.
#[derive(Debug, Clone, Default)]
pub struct StreamSample {
    /// When this stream's request was sent.
    pub sent_s: f64,
    /// Arrival of the first and of the last generated token at the client.
    pub first_token_s: Option<f64>,
    pub last_token_s: Option<f64>,
    /// Arrival of the final frame (or the end of the response).
    pub done_s: f64,
    /// Generated tokens the client received.
    pub tokens: u32,
    /// The server's own decode rate for this stream (sparkd: `decode_tps` of the final
    /// frame; llama-server: `timings.predicted_per_second`).
    pub server_decode_tps: Option<f64>,
    /// The server's own time to first token in ms, where it reports one.
    pub server_ttft_ms: Option<f64>,
}

impl StreamSample {
    /// Books one generated token arriving at `now_s`.
    pub fn token_arrived(&mut self, now_s: f64) {
        self.tokens += 1;
        self.first_token_s.get_or_insert(now_s);
        self.last_token_s = Some(now_s);
    }

    /// Decode rate at the client: tokens after the first over the time between the
    /// first and the last arrival, the same definition as the engine's `decode_tps`.
    pub fn client_decode_tps(&self) -> Option<f64> {
        let (first, last) = (self.first_token_s?, self.last_token_s?);
        let span = last - first;
        (self.tokens >= 2 && span > 0.0).then(|| f64::from(self.tokens - 1) / span)
    }

    pub fn client_ttft_ms(&self) -> Option<f64> {
        Some((self.first_token_s? - self.sent_s) * 1e3)
    }
}

/// One level: `streams` requests sent together.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LevelSummary {
    pub streams: usize,
    pub tokens: u64,
    /// All generated tokens over the wall time from the first request sent to the last
    /// stream's end: what the machine delivered.
    pub aggregate_tps: f64,
    /// Mean and slowest client-side decode rate of one stream.
    pub per_stream_tps: Option<f64>,
    pub slowest_stream_tps: Option<f64>,
    /// Mean and worst client-side time to first token.
    pub ttft_ms: Option<f64>,
    pub worst_ttft_ms: Option<f64>,
    /// Mean of the server's own per-stream decode rates.
    pub server_decode_tps: Option<f64>,
    /// Mean over streams of client decode rate / server decode rate: 1.0 means the
    /// path from the engine to the client costs nothing.
    pub client_over_server: Option<f64>,
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

pub fn summarize(samples: &[StreamSample]) -> LevelSummary {
    let tokens: u64 = samples.iter().map(|s| u64::from(s.tokens)).sum();
    let start = samples
        .iter()
        .map(|s| s.sent_s)
        .fold(f64::INFINITY, f64::min);
    let end = samples.iter().map(|s| s.done_s).fold(0.0, f64::max);
    let wall = end - start;
    let client_tps = || samples.iter().filter_map(StreamSample::client_decode_tps);
    let ttfts = || samples.iter().filter_map(StreamSample::client_ttft_ms);
    LevelSummary {
        streams: samples.len(),
        tokens,
        aggregate_tps: if wall > 0.0 {
            tokens as f64 / wall
        } else {
            0.0
        },
        per_stream_tps: mean(client_tps()),
        slowest_stream_tps: client_tps().reduce(f64::min),
        ttft_ms: mean(ttfts()),
        worst_ttft_ms: ttfts().reduce(f64::max),
        server_decode_tps: mean(samples.iter().filter_map(|s| s.server_decode_tps)),
        client_over_server: mean(
            samples
                .iter()
                .filter_map(|s| Some(s.client_decode_tps()? / s.server_decode_tps?)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sent: f64, first: f64, last: f64, tokens: u32, server: f64) -> StreamSample {
        StreamSample {
            sent_s: sent,
            first_token_s: Some(first),
            last_token_s: Some(last),
            done_s: last + 0.001,
            tokens,
            server_decode_tps: Some(server),
            server_ttft_ms: None,
        }
    }

    #[test]
    fn client_rate_excludes_the_first_token() {
        let s = sample(0.0, 0.5, 1.5, 101, 100.0);
        assert_eq!(s.client_decode_tps(), Some(100.0));
        assert_eq!(s.client_ttft_ms(), Some(500.0));
    }

    #[test]
    fn one_token_has_no_rate() {
        let mut s = sample(0.0, 0.5, 0.5, 1, 100.0);
        assert_eq!(s.client_decode_tps(), None);
        s.first_token_s = None;
        assert_eq!(s.client_ttft_ms(), None);
    }

    #[test]
    fn level_adds_up() {
        let samples = [
            sample(0.0, 0.1, 1.1, 101, 100.0),
            sample(0.0, 0.3, 2.3, 101, 60.0),
        ];
        let l = summarize(&samples);
        assert_eq!(l.tokens, 202);
        assert!((l.aggregate_tps - 202.0 / 2.301).abs() < 1e-9);
        assert!((l.per_stream_tps.unwrap() - 75.0).abs() < 1e-9);
        assert!((l.slowest_stream_tps.unwrap() - 50.0).abs() < 1e-9);
        assert!((l.ttft_ms.unwrap() - 200.0).abs() < 1e-9);
        assert!((l.worst_ttft_ms.unwrap() - 300.0).abs() < 1e-9);
        assert_eq!(l.server_decode_tps, Some(80.0));
        // 100/100 and 50/60.
        assert!((l.client_over_server.unwrap() - (1.0 + 50.0 / 60.0) / 2.0).abs() < 1e-12);
    }

    #[test]
    fn empty_level_is_zero_not_nan() {
        let l = summarize(&[]);
        assert_eq!(l.aggregate_tps, 0.0);
        assert_eq!(l.per_stream_tps, None);
    }
}
