//! Faults, end to end with the real binaries: an engine step that fails, a client that
//! stops reading, a daemon killed mid-stream, model files that cannot be loaded or that
//! change while served.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use futures::StreamExt;
use spark_client::protocol::*;
use spark_client::{ClientError, GenerationEvent};
use sparkd_e2e::load::conn::Conn;
use sparkd_e2e::{
    raw_request, run_sparkd_to_exit, strip_ansi, tiny_model, to_full_length, Daemon, TempDir,
};

const PATIENCE: Duration = Duration::from_secs(30);

/// Waits until nothing runs and every KV block is free (the engine publishes its load
/// once per loop, just after the last `Done` of a step went out).
async fn wait_idle(control: &spark_client::Client) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let s = control.status().await.unwrap();
        if s.running == 0 && s.queued == 0 && s.kv_blocks_used == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "still busy: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Everything one request received on a raw connection.
#[derive(Debug, Default)]
struct Seen {
    tokens: u32,
    tokens_after_error: u32,
    error: Option<ErrorEvent>,
    done: Option<DoneEvent>,
    dones: u32,
}

/// Reads frames until every id in `ids` has its `Done`.
async fn read_until_done(conn: &mut Conn, ids: &[u64]) -> HashMap<u64, Seen> {
    let mut seen: HashMap<u64, Seen> = ids.iter().map(|&id| (id, Seen::default())).collect();
    while seen.values().any(|s| s.done.is_none()) {
        let frame = conn.recv(PATIENCE).await.expect("frame");
        match frame {
            ServerMessage::Prefilled(p) => {
                let s = seen
                    .get_mut(&p.id)
                    .expect("Prefilled for a request we sent");
                assert_eq!(s.tokens, 0, "Prefilled after a token of {}", p.id);
            }
            ServerMessage::Token(t) => {
                let s = seen.get_mut(&t.id).expect("token for a request we sent");
                s.tokens += 1;
                if s.error.is_some() {
                    s.tokens_after_error += 1;
                }
            }
            ServerMessage::Error(e) => {
                let id = e.id.expect("a request's error, not the connection's");
                let s = seen.get_mut(&id).expect("error for a request we sent");
                assert!(s.error.is_none(), "second Error for {id}");
                s.error = Some(e);
            }
            ServerMessage::Done(d) => {
                let s = seen.get_mut(&d.id).expect("Done for a request we sent");
                s.dones += 1;
                s.done = Some(d);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_engine_step_ends_each_of_its_sequences_with_error_then_done() {
    let d = Daemon::start_with_env(&tiny_model(), &[], &[("SPARKD_FAULT_FAIL_STEP", "3")]);
    let mut conn = Conn::connect(&d.socket, PATIENCE).await.expect("connect");
    // A one-token request takes the first step and ends before the failure...
    conn.send(ClientMessage::Generate(raw_request(1, "first", 1)))
        .await
        .unwrap();
    let first = read_until_done(&mut conn, &[1]).await;
    assert_eq!(
        first[&1].done.as_ref().unwrap().finish_reason,
        FinishReason::Length
    );
    // ...then three more share the batch when step 3 fails.
    for id in 2..=4 {
        conn.send(ClientMessage::Generate(raw_request(
            id,
            "in the failing step",
            40,
        )))
        .await
        .unwrap();
    }
    let seen = read_until_done(&mut conn, &[2, 3, 4]).await;

    let failed: Vec<u64> = seen
        .iter()
        .filter(|(_, s)| s.error.is_some())
        .map(|(&id, _)| id)
        .collect();
    assert!(!failed.is_empty(), "no request saw the failure: {seen:?}");
    for (id, s) in &seen {
        assert_eq!(s.dones, 1, "request {id}: {s:?}");
        let done = s.done.as_ref().unwrap();
        assert_eq!(done.usage.completion_tokens, s.tokens, "request {id}");
        match &s.error {
            Some(e) => {
                assert_eq!(e.kind, ErrorKind::Engine, "{e:?}");
                assert!(e.message.contains("injected"), "{e:?}");
                assert_eq!(done.finish_reason, FinishReason::Error, "request {id}");
                assert_eq!(s.tokens_after_error, 0, "request {id}");
            }
            // Not in the failing step (it arrived after it): untouched.
            None => assert_eq!(
                (done.finish_reason, s.tokens),
                (FinishReason::Length, 40),
                "request {id}"
            ),
        }
    }
    // The daemon's own count of sequences in the failed step is the number of requests
    // that got the error: every one of them, and no other.
    let log = strip_ansi(&d.log_text());
    let line = log
        .lines()
        .find(|l| l.contains("forward step failed"))
        .unwrap_or_else(|| panic!("no failure logged:\n{log}"));
    assert!(
        line.contains(&format!("sequences={}", failed.len())),
        "{line} vs {failed:?}"
    );

    // And it goes on serving.
    conn.send(ClientMessage::Generate(raw_request(5, "still there?", 7)))
        .await
        .unwrap();
    let after = read_until_done(&mut conn, &[5]).await;
    let done = after[&5].done.as_ref().unwrap();
    assert_eq!(
        (done.finish_reason, after[&5].tokens),
        (FinishReason::Length, 7)
    );
    let control = d.client().await;
    wait_idle(&control).await;
    let jobs = control.jobs(10).await.unwrap();
    let errored = jobs
        .iter()
        .filter(|j| j.finish_reason == FinishReason::Error)
        .count();
    assert_eq!(errored, failed.len());
}

/// Four clients, five requests of 50 tokens each, every one read to its end; returns the
/// tokens per second they saw together.
async fn others_stream(d: &Daemon, first_id: u64) -> f64 {
    let started = Instant::now();
    let mut readers = Vec::new();
    for c in 0..4u64 {
        let client = d.client().await;
        readers.push(tokio::spawn(async move {
            let mut tokens = 0u32;
            for r in 0..5u64 {
                let id = first_id + c * 10 + r;
                let (text, done) = client
                    .generate(raw_request(id, "keep going", 50))
                    .await
                    .unwrap()
                    .collect_text()
                    .await
                    .unwrap();
                assert_eq!(done.usage.completion_tokens, 50, "{text:?}");
                tokens += done.usage.completion_tokens;
            }
            tokens
        }));
    }
    let mut tokens = 0;
    for r in readers {
        tokens += r.await.expect("every other client finishes");
    }
    f64::from(tokens) / started.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off_while_others_keep_streaming() {
    let d = Daemon::start(&tiny_model(), &["--stall-timeout", "1"]);
    let alone = others_stream(&d, 1000).await;
    // For comparison: the same twelve heavy generations as the sleeper's below, read.
    let heavy = |id: u64| {
        let mut req = to_full_length(raw_request(id, "stall", 480));
        req.logprobs = Some(20);
        req
    };
    let reader = d.client().await;
    let mut heavy_streams = Vec::new();
    for id in 500..512 {
        heavy_streams.push(reader.generate(heavy(id)).await.unwrap());
    }
    let heavy_reader = tokio::spawn(async move {
        for g in heavy_streams {
            g.collect_text().await.unwrap();
        }
    });
    let beside_reader = others_stream(&d, 3000).await;
    heavy_reader.await.unwrap();
    // The sleeper asks for a lot of output (20 alternatives per token make each frame
    // ~200 bytes: ~1 MB in all, several times its socket buffer) and never reads.
    let mut sleeper = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    let frame = |m: &ClientMessage| {
        let payload = postcard::to_allocvec(m).unwrap();
        let mut f = (payload.len() as u32).to_be_bytes().to_vec();
        f.extend(payload);
        f
    };
    sleeper
        .write_all(&frame(&ClientMessage::Hello(Hello {
            major: PROTOCOL_MAJOR,
            minor: PROTOCOL_MINOR,
            client: "sleeper".into(),
        })))
        .unwrap();
    let sleeper_ids: Vec<u64> = (1..=12).collect();
    for &id in &sleeper_ids {
        sleeper
            .write_all(&frame(&ClientMessage::Generate(heavy(id))))
            .unwrap();
    }
    // Meanwhile the others stream normally, each request to its end.
    let beside = others_stream(&d, 2000).await;
    // Not asserted: speed depends on the machine. The stalled client's generations are
    // real work in the same batch until it is cut off, like the reading client's.
    println!(
        "four streaming clients: {alone:.0} tokens/s alone, {beside_reader:.0} tokens/s beside a \
         client reading twelve heavy generations, {beside:.0} tokens/s beside a client that \
         stopped reading the same twelve"
    );

    // The sleeper is cut off: nothing of its work is left, and its connection is closed.
    let control = d.client().await;
    wait_idle(&control).await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let log = strip_ansi(&d.log_text());
        if let Some(line) = log.lines().find(|l| l.contains("client stopped reading")) {
            println!("daemon: {line}");
            break;
        }
        assert!(Instant::now() < deadline, "no stall logged:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let jobs = control.jobs(100).await.unwrap();
    let sleeper_jobs: Vec<&JobRecord> = jobs
        .iter()
        .filter(|j| sleeper_ids.contains(&j.request_id))
        .collect();
    assert_eq!(sleeper_jobs.len(), sleeper_ids.len());
    let cut = sleeper_jobs
        .iter()
        .filter(|j| j.finish_reason == FinishReason::Disconnected)
        .count();
    println!(
        "stalled client: {cut} of {} generations cancelled when it was cut off, the rest had ended",
        sleeper_jobs.len()
    );
    // What reached its socket can still be read, then the connection ends without all
    // the Done frames it would have had.
    sleeper
        .set_read_timeout(Some(PATIENCE))
        .expect("read timeout");
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut sleeper, &mut rest).expect("read to the close");
    let mut dones = 0;
    let mut at = 0;
    while at + 4 <= rest.len() {
        let len = u32::from_be_bytes(rest[at..at + 4].try_into().unwrap()) as usize;
        if at + 4 + len > rest.len() {
            break;
        }
        if let Ok(ServerMessage::Done(_)) = postcard::from_bytes(&rest[at + 4..at + 4 + len]) {
            dones += 1;
        }
        at += 4 + len;
    }
    assert!(
        dones < sleeper_ids.len(),
        "the stalled client got every Done"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_stream_gives_disconnected_and_a_restart_serves_again() {
    let mut d = Daemon::start(&tiny_model(), &[]);
    let client = d.client().await;
    let mut generation = client
        .generate(to_full_length(raw_request(1, "a long answer", 480)))
        .await
        .unwrap();
    assert!(matches!(
        generation.next().await,
        Some(Ok(GenerationEvent::Prefilled(_)))
    ));
    assert!(matches!(
        generation.next().await,
        Some(Ok(GenerationEvent::Token(_)))
    ));
    d.signal(libc::SIGKILL);
    let _ = d.child.wait();

    // Buffered tokens may still come; then a clear error, never a hang or a Done.
    let end = tokio::time::timeout(PATIENCE, async {
        loop {
            match generation.next().await {
                Some(Ok(GenerationEvent::Token(_))) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the stream ends promptly");
    assert!(
        matches!(end, Some(Err(ClientError::Disconnected))),
        "{end:?}"
    );
    assert!(matches!(
        client.status().await,
        Err(ClientError::Disconnected)
    ));
    // The socket file is left behind by the killed daemon; nobody answers on it.
    assert!(d.socket.exists());
    match spark_client::Client::connect(&d.socket).await {
        Err(ClientError::DaemonNotRunning { .. }) => {}
        other => panic!("expected DaemonNotRunning, got {other:?}"),
    }

    // A new daemon on the same path replaces the stale socket and serves.
    d.restart();
    let client = d.client().await;
    let (_, done) = client
        .generate(raw_request(2, "back again", 5))
        .await
        .unwrap()
        .collect_text()
        .await
        .unwrap();
    assert_eq!(done.usage.completion_tokens, 5);
}

/// Runs `sparkd serve` on `model` until it exits (at most a minute); returns its exit
/// status, its stderr and whether it left its socket file or its pid file behind.
fn serve_once(model: &std::path::Path, extra: &[&str]) -> (std::process::ExitStatus, String, bool) {
    let dir = TempDir::new("bad");
    let socket = dir.path().join("s.sock");
    let mut args: Vec<std::ffi::OsString> = vec!["serve".into(), "--model".into()];
    args.push(model.into());
    args.extend(["--socket".into(), socket.clone().into()]);
    args.extend(["--no-pull", "--threads", "1"].map(Into::into));
    args.extend(extra.iter().map(Into::into));
    let (status, stderr) = run_sparkd_to_exit(&args);
    let pid_file = dir.path().join("s.sock.pid");
    (status, stderr, socket.exists() || pid_file.exists())
}

#[test]
fn model_files_that_cannot_be_loaded_fail_at_start_with_a_clear_error() {
    let dir = TempDir::new("models");
    let good = std::fs::read(tiny_model()).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let mut corrupt = good.clone();
    // Keep the magic and version; scramble the counts and metadata behind them.
    for (i, b) in corrupt.iter_mut().enumerate().skip(8).take(4096) {
        *b = (i as u8).wrapping_mul(97).wrapping_add(13);
    }
    let mut cases = vec![
        ("missing", dir.path().join("absent.gguf")),
        ("a directory", dir.path().to_path_buf()),
        ("empty", write("empty.gguf", b"")),
        ("not GGUF", write("text.gguf", b"this is not a model\n")),
        ("truncated header", write("head.gguf", &good[..100])),
        (
            "truncated data",
            write("half.gguf", &good[..good.len() / 2]),
        ),
        ("corrupt", write("corrupt.gguf", &corrupt)),
    ];
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let p = write("locked.gguf", &good);
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
        cases.push(("unreadable", p));
    } else {
        eprintln!("skipping the unreadable-file case: root reads any file");
    }
    for (what, path) in cases {
        let (status, stderr, socket_left) = serve_once(&path, &[]);
        assert!(!status.success(), "{what}: exited 0\n{stderr}");
        // 101 is Rust's exit code for a panic.
        assert_eq!(status.code(), Some(1), "{what}: {status}\n{stderr}");
        assert!(!stderr.contains("panicked"), "{what}:\n{stderr}");
        let message = stderr
            .lines()
            .find(|l| l.starts_with("sparkd: "))
            .unwrap_or_else(|| panic!("{what}: no error line:\n{stderr}"));
        println!("{what}: {message}");
        assert!(message.len() > "sparkd: ".len() + 10, "{what}: {message}");
        assert!(
            !socket_left,
            "{what}: the socket or pid file was left behind"
        );
    }
}

#[test]
fn flags_out_of_range_are_refused_at_start_without_a_panic_or_leftovers() {
    // `--shutdown-grace inf` used to panic in `Duration::from_secs_f64`; `--ctx 0` and
    // `--max-frame-bytes 0` used to start a daemon that refused every request; a bad
    // chat template flag was found after the model had loaded, leaving the pid file.
    for flag in [
        "--ctx=0",
        "--ctx=15",
        "--max-frame-bytes=0",
        "--chat-template=/nonexistent/template.jinja",
        "--chat-template-kwargs=nope",
        "--shutdown-grace=inf",
        "--shutdown-grace=1e300",
        "--shutdown-grace=-1",
        "--shutdown-grace=NaN",
        "--stall-timeout=0",
        "--stall-timeout=inf",
        "--stall-timeout=-5",
    ] {
        let (status, stderr, left) = serve_once(&tiny_model(), &[flag]);
        assert_eq!(status.code(), Some(1), "{flag}: {status}\n{stderr}");
        assert!(!left, "{flag}: the socket or pid file was left behind");
        assert!(!stderr.contains("panicked"), "{flag}:\n{stderr}");
        let name = flag.split('=').next().unwrap_or(flag);
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with("sparkd: ") && l.contains(name)),
            "{flag}:\n{stderr}"
        );
    }
}

/// Greedy tokens for a fixed prompt, through a fresh connection.
async fn greedy_tokens(d: &Daemon) -> Vec<u32> {
    let client = spark_client::Client::connect(&d.socket).await.unwrap();
    let mut r = raw_request(client.next_request_id(), "the model file", 12);
    r.sampling = SamplingParams::default();
    let mut generation = client.generate(r).await.unwrap();
    let mut tokens = Vec::new();
    while let Some(event) = generation.next().await {
        match event.unwrap() {
            GenerationEvent::Prefilled(_)
            | GenerationEvent::ToolCall(_)
            | GenerationEvent::ToolCallDelta(_)
            | GenerationEvent::Reasoning(_)
            | GenerationEvent::TokenBytes(_) => {}
            GenerationEvent::Token(t) => tokens.push(t.token),
            GenerationEvent::Done(done) => {
                assert_eq!(done.usage.completion_tokens as usize, tokens.len());
                return tokens;
            }
        }
    }
    panic!("no Done");
}

/// Waits (the daemon looks every 2 s) until its log has `needle`.
fn wait_for_log(d: &Daemon, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = strip_ansi(&d.log_text());
        if log.contains(needle) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_file_rewritten_truncated_replaced_or_removed_while_serving_changes_nothing() {
    let dir = TempDir::new("swap");
    let path = dir.path().join("model.gguf");
    let original = std::fs::read(tiny_model()).unwrap();
    std::fs::write(&path, &original).unwrap();
    let mut d = Daemon::start(&path, &[]);
    let expected = greedy_tokens(&d).await;
    assert!(!expected.is_empty());

    // In place, same inode: garbage of the same size (a mapping would now hold garbage
    // weights), then truncated to nothing (a mapping would fault with SIGBUS).
    std::fs::write(&path, vec![0x5Au8; original.len()]).unwrap();
    wait_for_log(&d, "rewritten in place");
    assert_eq!(greedy_tokens(&d).await, expected);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert_eq!(greedy_tokens(&d).await, expected);

    // Replaced by rename, as downloads do, with a different (corrupt) file.
    let next = dir.path().join("model.gguf.new");
    std::fs::write(&next, &original[..original.len() / 3]).unwrap();
    std::fs::rename(&next, &path).unwrap();
    wait_for_log(&d, "replaced by another file");
    assert_eq!(greedy_tokens(&d).await, expected);

    std::fs::remove_file(&path).unwrap();
    let log = wait_for_log(&d, "was removed after it was loaded");
    assert_eq!(greedy_tokens(&d).await, expected);
    assert!(log.contains("keeps serving the weights it loaded"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon exited");
}
