//! End-to-end: `spark serve-openai --upstream` in front of real engines (a second sparkd
//! with its own shim; llama-server on the default model when it is built), with the
//! forwarded jobs in the daemon's jobs list. Every server listens on 127.0.0.1 only.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use spark_client::protocol::{FinishReason, JobRecord};
use sparkd_e2e::{bin, default_model, tiny_model, Daemon, TempDir};

/// A free port on 127.0.0.1 (closed again; a server binds it right after).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// A child process killed when dropped.
struct Server {
    child: Child,
    pub url: String,
    log: PathBuf,
    _dir: TempDir,
}

impl Server {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `path` answers 200, or panics with the log.
    async fn wait_ready(&mut self, path: &str, limit: Duration) {
        let http = http();
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited early with {status}: {}",
                    self.url,
                    self.log_text()
                );
            }
            if let Ok(r) = http.get(format!("{}{path}", self.url)).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{} not ready within {limit:?}: {}",
            self.url,
            self.log_text()
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `spark serve-openai` for the daemon on `socket`, forwarding to `upstreams`.
async fn shim(socket: &Path, upstreams: &[(&str, &str)]) -> Server {
    let dir = TempDir::new("shim");
    let log = dir.path().join("shim.log");
    let port = free_port();
    let mut cmd = Command::new(bin("spark"));
    cmd.arg("--socket")
        .arg(socket)
        .args(["serve-openai", "--listen", &format!("127.0.0.1:{port}")])
        .env_remove("SPARKD_SOCKET")
        .env_remove("SPARKD_API_KEY")
        .env("SPARKD_NO_AUTOSTART", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    for (name, url) in upstreams {
        cmd.arg("--upstream").arg(format!("{name}={url}"));
    }
    let mut server = Server {
        child: cmd.spawn().expect("spawn spark serve-openai"),
        url: format!("http://127.0.0.1:{port}"),
        log,
        _dir: dir,
    };
    server.wait_ready("/health", Duration::from_secs(30)).await;
    server
}

fn peer_bin(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".cache/sparkd-peer/bin").join(name);
    p.is_file().then_some(p)
}

/// llama-server on the default model, answering to `alias`, when both are present.
async fn llama_server(alias: &str) -> Option<Server> {
    let (exe, model) = (peer_bin("llama-server")?, default_model()?);
    let dir = TempDir::new("llama");
    let log = dir.path().join("llama.log");
    let port = free_port();
    let child = Command::new(exe)
        .arg("-m")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--alias", alias, "-t", "2", "-c", "2048", "--parallel", "8"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn llama-server");
    let mut server = Server {
        child,
        url: format!("http://127.0.0.1:{port}"),
        log,
        _dir: dir,
    };
    server.wait_ready("/health", Duration::from_secs(120)).await;
    Some(server)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client")
}

/// What a client saw of one completion request.
struct Answer {
    /// The engine's own usage, from the body: (prompt, completion).
    usage: Option<(u32, u32)>,
    body: String,
}

async fn complete(base: &str, body: Value) -> Answer {
    let response = http()
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("POST /v1/completions");
    assert_eq!(response.status(), 200, "{body}");
    let text = response.text().await.expect("body");
    let usage = if body["stream"] == true {
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        text.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter(|v| v["usage"].is_object())
            .map(|v| v["usage"].clone())
            .reduce(|_, later| later)
    } else {
        serde_json::from_str::<Value>(&text)
            .ok()
            .map(|v| v["usage"].clone())
    };
    let usage = usage.map(|u| {
        let n = |k: &str| u[k].as_u64().expect("count") as u32;
        (n("prompt_tokens"), n("completion_tokens"))
    });
    Answer { usage, body: text }
}

fn completion(model: &str, prompt: &str, max_tokens: u32, stream: Option<bool>) -> Value {
    let mut body = json!({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                          "temperature": 0});
    if let Some(include_usage) = stream {
        body["stream"] = json!(true);
        if include_usage {
            body["stream_options"] = json!({"include_usage": true});
        }
    }
    body
}

/// The daemon's jobs list, waiting until it holds `n` jobs of `engine`.
async fn jobs_of(daemon: &Daemon, engine: &str, n: usize) -> Vec<JobRecord> {
    let client = daemon.client().await;
    let start = Instant::now();
    loop {
        let jobs: Vec<JobRecord> = client
            .jobs(100)
            .await
            .expect("jobs")
            .into_iter()
            .filter(|j| j.engine == engine)
            .collect();
        if jobs.len() >= n || start.elapsed() > Duration::from_secs(10) {
            return jobs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_to_a_second_sparkd_and_lists_both_engines_jobs() {
    let home = Daemon::start(&tiny_model(), &[]);
    // The peer serves the same weights under another name: the file's stem.
    let link_dir = TempDir::new("peer");
    let peer_model = link_dir.path().join("tinypeer.gguf");
    std::os::unix::fs::symlink(tiny_model(), &peer_model).expect("symlink");
    let peer = Daemon::start(&peer_model, &[]);
    let peer_shim = shim(&peer.socket, &[]).await;
    let front = shim(&home.socket, &[("peer", &peer_shim.url)]).await;

    let own = complete(&front.url, completion("tiny", "hello there", 6, None)).await;
    let streamed = complete(&front.url, completion("tinypeer", "hello", 8, Some(true))).await;
    let json_reply = complete(&front.url, completion("tinypeer", "once upon", 5, None)).await;
    let no_usage = complete(&front.url, completion("tinypeer", "a b c", 7, Some(false))).await;
    assert!(no_usage.usage.is_none(), "{}", no_usage.body);

    // The peer's own records are the truth to compare with, oldest first.
    let mut truth = jobs_of(&peer, "sparkd", 3).await;
    truth.reverse();
    assert_eq!(truth.len(), 3);
    let mut forwarded = jobs_of(&home, "peer", 3).await;
    forwarded.reverse();
    assert_eq!(forwarded.len(), 3, "{}", front.log_text());
    for (got, answer) in forwarded.iter().zip([&streamed, &json_reply]) {
        let (prompt, completion) = answer.usage.expect("usage in the answer");
        assert_eq!(
            (got.usage.prompt_tokens, got.usage.completion_tokens),
            (prompt, completion)
        );
        assert!(!got.estimated, "{got:?}");
        assert_eq!(got.model, "tinypeer");
    }
    for (got, real) in forwarded.iter().zip(&truth) {
        assert_eq!(got.finish_reason, real.finish_reason);
    }
    assert_eq!(forwarded[0].usage, truth[0].usage);
    assert!(forwarded[0].timings.ttft_ms.is_some());
    assert!(
        forwarded[1].timings.ttft_ms.is_none(),
        "no TTFT without a stream"
    );
    // Without usage the pieces are counted (a token that ends mid-character sends no
    // text of its own, so this may fall short of the truth, never beyond it).
    let estimate = &forwarded[2];
    assert!(estimate.estimated);
    assert!(
        estimate.usage.completion_tokens >= 1
            && estimate.usage.completion_tokens <= truth[2].usage.completion_tokens,
        "{estimate:?} vs {:?}",
        truth[2]
    );
    // The home daemon's own job is there too, untouched.
    let mine = jobs_of(&home, "sparkd", 1).await;
    assert_eq!(mine[0].usage.completion_tokens, own.usage.expect("usage").1);
    assert!(!mine[0].estimated);

    // `/v1/jobs` on the front shim: the forwarded ones carry their upstream.
    let listed: Value = http()
        .get(format!("{}/v1/jobs", front.url))
        .send()
        .await
        .expect("GET /v1/jobs")
        .json()
        .await
        .expect("json");
    let data = listed["data"].as_array().expect("list");
    assert_eq!(data.len(), 4, "{listed}");
    let peers: Vec<&Value> = data.iter().filter(|j| j["engine"] == "peer").collect();
    assert_eq!(peers.len(), 3);
    assert!(peers
        .iter()
        .all(|j| j["upstream"] == peer_shim.url.as_str()));
    let models: Value = http()
        .get(format!("{}/v1/models", front.url))
        .send()
        .await
        .expect("GET /v1/models")
        .json()
        .await
        .expect("json");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["tiny", "tinypeer"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_to_llama_server_on_the_default_model() {
    let Some(llama) = llama_server("smollm2-llama").await else {
        eprintln!("skipping: needs ~/.cache/sparkd-peer/bin/llama-server and the default model");
        return;
    };
    let home = Daemon::start(&tiny_model(), &[]);
    let front = shim(&home.socket, &[("llama", &llama.url)]).await;
    let prompt = "The capital of France is";
    let streamed = complete(
        &front.url,
        completion("smollm2-llama", prompt, 8, Some(true)),
    )
    .await;
    let direct = complete(
        &llama.url,
        completion("smollm2-llama", prompt, 8, Some(true)),
    )
    .await;
    let json_reply = complete(&front.url, completion("smollm2-llama", prompt, 8, None)).await;

    let mut jobs = jobs_of(&home, "llama", 2).await;
    jobs.reverse();
    assert_eq!(jobs.len(), 2, "{}", front.log_text());
    for (job, answer) in jobs.iter().zip([&streamed, &json_reply]) {
        let (prompt_tokens, completion_tokens) = answer.usage.expect("llama-server's usage");
        assert_eq!(
            (job.usage.prompt_tokens, job.usage.completion_tokens),
            (prompt_tokens, completion_tokens)
        );
        assert!(!job.estimated);
        assert_eq!(job.model, "smollm2-llama");
        assert_ne!(job.finish_reason, FinishReason::Error);
    }
    // Greedy: through the proxy, the same generation as directly.
    assert_eq!(streamed.usage, direct.usage);
    assert!(jobs[0].timings.ttft_ms.is_some() && jobs[0].timings.decode_tps.is_some());
}

/// Client-observed tokens per second through the proxy and straight to the upstream,
/// with 1 and 8 concurrent streams. Prints figures; asserts nothing about them. The
/// upstream is llama-server when present, else (or with `SPARKD_BENCH_UPSTREAM=sparkd`)
/// a second sparkd shim on the synthetic model, whose fast tokens stress the proxy more.
/// `cargo test -p sparkd-e2e --test proxy -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run by hand"]
async fn proxy_overhead_benchmark() {
    let home = Daemon::start(&tiny_model(), &[]);
    let choice = std::env::var("SPARKD_BENCH_UPSTREAM").unwrap_or_default();
    let llama = if choice.is_empty() {
        llama_server("smollm2-llama").await
    } else {
        None
    };
    let (upstream_url, model, _keep): (String, &str, Vec<Box<dyn std::any::Any>>) = match llama {
        Some(llama) => (llama.url.clone(), "smollm2-llama", vec![Box::new(llama)]),
        None if choice == "paced" => {
            let tps: f64 = std::env::var("SPARKD_BENCH_PACE_TPS")
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or(200.0);
            eprintln!("benchmarking against a paced upstream: {tps} tok/s per stream, no compute");
            let (url, task) = paced_upstream(tps).await;
            (url, "paced", vec![Box::new(AbortOnDrop(task))])
        }
        None => {
            eprintln!("benchmarking against a second sparkd shim on the synthetic model");
            let dir = TempDir::new("bench");
            let model = dir.path().join("tinypeer.gguf");
            std::os::unix::fs::symlink(tiny_model(), &model).expect("symlink");
            let peer = Daemon::start(&model, &[]);
            let peer_shim = shim(&peer.socket, &[]).await;
            let url = peer_shim.url.clone();
            (
                url,
                "tinypeer",
                vec![Box::new(peer_shim), Box::new(peer), Box::new(dir)],
            )
        }
    };
    let front = shim(&home.socket, &[("up", &upstream_url)]).await;
    let max_tokens = 64;
    // Warm both paths (model pages, connection pools).
    complete(&front.url, completion(model, "warm", 4, Some(true))).await;
    complete(&upstream_url, completion(model, "warm", 4, Some(true))).await;
    // Alternating pairs, so that neither path always runs on a warmer (or quieter)
    // machine; the medians and the per-pair ratios are what to read.
    let pairs: usize = std::env::var("SPARKD_BENCH_PAIRS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    // Each measurement is `rounds` batches of `concurrency` streams, back to back.
    let rounds: usize = std::env::var("SPARKD_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let measure = |base: String, concurrency: usize| async move {
        let start = Instant::now();
        let mut tokens = 0u32;
        for _ in 0..rounds {
            let runs = (0..concurrency).map(|i| {
                let mut body = completion(
                    model,
                    &format!("Tell me story number {i}."),
                    max_tokens,
                    Some(true),
                );
                // llama-server would reuse the previous run's prefill.
                body["cache_prompt"] = json!(false);
                complete(&base, body)
            });
            let answers = futures::future::join_all(runs).await;
            tokens += answers
                .iter()
                .map(|a| a.usage.map_or(0, |u| u.1))
                .sum::<u32>();
        }
        f64::from(tokens) / start.elapsed().as_secs_f64()
    };
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for concurrency in [1usize, 8] {
        let (mut direct, mut proxied, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for pair in 0..pairs {
            // Which path goes first alternates too.
            let (d, p) = if pair % 2 == 0 {
                let d = measure(upstream_url.clone(), concurrency).await;
                (d, measure(front.url.clone(), concurrency).await)
            } else {
                let p = measure(front.url.clone(), concurrency).await;
                (measure(upstream_url.clone(), concurrency).await, p)
            };
            eprintln!("x{concurrency} pair {pair}: direct {d:.1} tok/s, proxy {p:.1} tok/s, proxy/direct {:.2}%", 100.0 * p / d);
            direct.push(d);
            proxied.push(p);
            ratios.push(p / d);
        }
        let (d, p, r) = (
            median(&mut direct),
            median(&mut proxied),
            median(&mut ratios),
        );
        eprintln!(
            "x{concurrency}: median direct {d:.1} tok/s, proxy {p:.1} tok/s; median proxy/direct {:.2}% (overhead {:.2}%)",
            100.0 * r,
            100.0 * (1.0 - r)
        );
    }
}

/// Aborts a background task when the benchmark ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An OpenAI-compatible upstream that streams completions at a fixed pace and computes
/// nothing: with the engine's own noise gone, what differs between direct and proxied
/// is the proxy alone. Serves `GET /v1/models` (one model, `paced`) and streaming
/// `POST /v1/completions` (`max_tokens` chunks, then usage and `[DONE]`), keep-alive.
async fn paced_upstream(tps: f64) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let period = Duration::from_secs_f64(1.0 / tps);
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_paced(stream, period));
        }
    });
    (url, task)
}

async fn serve_paced(mut stream: tokio::net::TcpStream, period: Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Value =
            serde_json::from_slice(&buf[head_end..head_end + len]).unwrap_or_default();
        buf.drain(..head_end + len);
        if head.starts_with("get /v1/models") {
            let models =
                r#"{"object":"list","data":[{"id":"paced","object":"model","owned_by":"test"}]}"#;
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{models}",
                models.len()
            );
            if stream.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        let n = body["max_tokens"].as_u64().unwrap_or(16);
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let send = |data: String| format!("{:x}\r\n{data}\r\n", data.len());
        let start = tokio::time::Instant::now();
        for i in 0..n {
            tokio::time::sleep_until(start + period * (i as u32 + 1)).await;
            let event = format!(
                "data: {{\"id\":\"p\",\"object\":\"text_completion\",\"model\":\"paced\",\"choices\":[{{\"index\":0,\"text\":\" w{i}\",\"finish_reason\":null}}]}}\n\n"
            );
            if stream.write_all(send(event).as_bytes()).await.is_err() {
                return;
            }
        }
        let usage = format!(
            "data: {{\"id\":\"p\",\"object\":\"text_completion\",\"model\":\"paced\",\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{n},\"total_tokens\":{}}}}}\n\n",
            n + 5
        );
        let tail = format!(
            "{}{}0\r\n\r\n",
            send(usage),
            send("data: [DONE]\n\n".into())
        );
        if stream.write_all(tail.as_bytes()).await.is_err() {
            return;
        }
    }
}
