//! The peer side of `spark bench`: llama-server started with `-np` equal to the
//! concurrency, driven with the same prompts through its streaming `/completion`, timed
//! the same way at the client.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

use super::stats::StreamSample;

/// Context per slot: the prompts here are short and the generations `max_tokens` long.
const CTX_PER_SLOT: u32 = 1024;
const READY_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Peer {
    pub server: PathBuf,
    pub model: PathBuf,
    pub threads: usize,
}

impl Peer {
    /// `dir` holds llama.cpp's binaries (what `../shared/tools/build-llama-cpp.sh` prints).
    pub fn new(dir: &Path, model: &Path, threads: usize) -> anyhow::Result<Peer> {
        let server = dir.join("llama-server");
        if !server.is_file() {
            bail!("no llama-server in {}", dir.display());
        }
        if !model.is_file() {
            bail!(
                "the daemon's model file {} is not readable here; pass --peer-model",
                model.display()
            );
        }
        Ok(Peer {
            server,
            model: model.to_path_buf(),
            threads,
        })
    }

    /// Starts llama-server with `slots` parallel slots and waits until it is ready.
    pub async fn start(&self, slots: usize) -> anyhow::Result<RunningPeer> {
        let port = free_port()?;
        let child = Command::new(&self.server)
            .arg("-m")
            .arg(&self.model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-np", &slots.to_string()])
            .args(["-c", &(CTX_PER_SLOT * slots as u32).to_string()])
            .args(["-t", &self.threads.to_string()])
            .args(["-tb", &self.threads.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.server.display()))?;
        let peer = RunningPeer {
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        peer.wait_ready().await?;
        Ok(peer)
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub struct RunningPeer {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl RunningPeer {
    async fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let health = self.http.get(format!("{}/health", self.base)).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("llama-server was not ready after {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    pub async fn run_level(
        &self,
        prompts: &[String],
        max_tokens: u32,
        streams: usize,
    ) -> anyhow::Result<Vec<StreamSample>> {
        let start = Instant::now();
        let tasks = (0..streams).map(|i| {
            let body = json!({
                "prompt": prompts[i % prompts.len()],
                "n_predict": max_tokens,
                "temperature": 0.0,
                "ignore_eos": true,
                "cache_prompt": false,
                "stream": true,
            });
            self.one_stream(body, start)
        });
        futures::future::join_all(tasks).await.into_iter().collect()
    }

    async fn one_stream(&self, body: Value, start: Instant) -> anyhow::Result<StreamSample> {
        let mut sample = StreamSample {
            sent_s: start.elapsed().as_secs_f64(),
            ..StreamSample::default()
        };
        let response = self
            .http
            .post(format!("{}/completion", self.base))
            .json(&body)
            .send()
            .await?
            .error_for_status()?;
        let mut events = SseLines::default();
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            let now = start.elapsed().as_secs_f64();
            for event in events.push(&chunk) {
                let event: Value = serde_json::from_str(&event)
                    .with_context(|| "llama-server sent an event that is not JSON")?;
                if event["stop"].as_bool() == Some(true) {
                    let timings = &event["timings"];
                    if let Some(n) = timings["predicted_n"].as_u64() {
                        sample.tokens = n as u32;
                    }
                    sample.server_decode_tps = timings["predicted_per_second"].as_f64();
                    sample.server_ttft_ms = timings["prompt_ms"].as_f64();
                    sample.done_s = now;
                    return Ok(sample);
                }
                // One event per generated token (its text may be empty while a UTF-8
                // character is incomplete).
                sample.token_arrived(now);
            }
        }
        bail!("llama-server's stream ended without its final event")
    }
}

/// Splits a server-sent-events body into the payloads of its `data:` lines.
#[derive(Default)]
struct SseLines {
    pending: Vec<u8>,
}

impl SseLines {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(data) = line.trim_end().strip_prefix("data:") {
                out.push(data.trim_start().to_string());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_payloads_across_chunk_boundaries() {
        let body = b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\n: comment\ndata:{\"c\":3}\n\n";
        for split in 0..body.len() {
            let mut sse = SseLines::default();
            let mut got = sse.push(&body[..split]);
            got.extend(sse.push(&body[split..]));
            assert_eq!(
                got,
                ["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"],
                "split at {split}"
            );
        }
    }
}
