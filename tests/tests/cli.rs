//! End-to-end: the real `spark` binary against a real `sparkd` on a synthetic model.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use sparkd_e2e::{bin, default_model, tiny_model, Daemon, TempDir};

fn spark(socket: &std::path::Path, args: &[&str]) -> Output {
    Command::new(bin("spark"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("SPARKD_SOCKET")
        .env("SPARKD_NO_AUTOSTART", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run spark")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `33.5 tok/s · 60 tokens · 1.8 s to first token`, parsed.
fn parse_stats(line: &str) -> (Option<f64>, u32, f64) {
    let parts: Vec<&str> = line.split(" · ").collect();
    assert!(parts.len() >= 3, "stats line: {line:?}");
    let tps = parts[0].strip_suffix(" tok/s").expect("tok/s").parse().ok();
    let tokens = parts[1]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .expect("token count");
    let ttft = parts[2]
        .strip_suffix(" s to first token")
        .expect("ttft")
        .parse()
        .expect("ttft secs");
    (tps, tokens, ttft)
}

#[test]
fn run_streams_text_and_prints_one_stats_line() {
    let d = Daemon::start(&tiny_model(), &[]);
    let out = spark(&d.socket, &["run", "--max-tokens", "12", "--raw", "hello"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one stats line: {stderr:?}");
    let (tps, tokens, ttft) = parse_stats(lines[0]);
    assert_eq!(tokens, 12);
    assert!(tps.unwrap() > 0.0 && ttft >= 0.0);

    // A prompt with spaces in place of a command is `run`.
    let out = spark(&d.socket, &["hello there", "--max-tokens", "3", "--raw"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(parse_stats(text(&out.stderr).trim()).1, 3);
}

#[test]
fn json_events_parse_and_match_the_final_frame() {
    let d = Daemon::start(&tiny_model(), &[]);
    let out = spark(
        &d.socket,
        &[
            "run",
            "--json",
            "--max-tokens",
            "9",
            "--seed",
            "3",
            "--temperature",
            "0.8",
            "hi",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let (tokens, done) = events.split_at(events.len() - 1);
    assert_eq!(done[0]["type"], "done");
    assert!(tokens
        .iter()
        .all(|e| e["type"] == "token" && e["token"].is_u64()));
    assert_eq!(
        done[0]["usage"]["completion_tokens"].as_u64().unwrap() as usize,
        tokens.len()
    );
    assert_eq!(tokens.len(), 9);
    assert!(done[0]["timings"]["ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(
        text(&out.stderr).trim().is_empty(),
        "no stats line with --json"
    );
}

#[test]
fn a_repeated_prompt_says_how_much_came_from_the_prefix_cache() {
    let d = Daemon::start(&tiny_model(), &[]);
    let prompt = "Tell me about the weather in a long and winding way, please. ".repeat(6);
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--raw", "--max-tokens", "3"];
        args.extend_from_slice(extra);
        args.push(&prompt);
        let out = spark(&d.socket, &args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        out
    };
    // The first time nothing is cached: the plain stats line.
    let first = text(&run(&[]).stderr);
    assert!(!first.contains("cached"), "{first:?}");
    assert_eq!(parse_stats(first.trim()).1, 3);

    // Asked again, every whole block of the prompt but its last token comes back.
    let again = run(&["--json"]);
    let done: serde_json::Value = text(&again.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .find(|e: &serde_json::Value| e["type"] == "done")
        .expect("a done line");
    let prompt_tokens = done["usage"]["prompt_tokens"].as_u64().unwrap();
    let reused = (prompt_tokens - 1) / 16 * 16;
    assert!(reused >= 48, "{prompt_tokens} prompt tokens");
    assert_eq!(done["cached_tokens"].as_u64(), Some(reused), "{done}");

    let third = text(&run(&[]).stderr);
    let cached = format!(" · {reused} of {prompt_tokens} prompt tokens cached");
    assert!(third.trim().ends_with(&cached), "{third:?}");
    assert_eq!(parse_stats(third.trim()).1, 3);

    // `spark jobs` keeps each job's figure, newest first: none cached the first time.
    let jobs = spark(&d.socket, &["jobs", "--json"]);
    assert!(jobs.status.success(), "{}", text(&jobs.stderr));
    let cached_per_job: Vec<Option<u64>> = text(&jobs.stdout)
        .lines()
        .map(|l| {
            let job: serde_json::Value = serde_json::from_str(l).expect("job JSON");
            job["cached_tokens"].as_u64()
        })
        .collect();
    assert_eq!(cached_per_job, [Some(reused), Some(reused), Some(0)]);
    let table = text(&spark(&d.socket, &["jobs"]).stdout);
    assert!(
        table.lines().next().unwrap().contains(" IN  CACHED  OUT"),
        "{table}"
    );
    // Figures are right-aligned: the newest job's prompt size, then its cached tokens.
    let in_then_cached = format!("{prompt_tokens} {reused:>7} ");
    assert!(
        table.lines().nth(1).unwrap().contains(&in_then_cached),
        "{table}"
    );

    // `spark status` adds up what the cache saved: twice `reused` of three prompts.
    let out = spark(&d.socket, &["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let cache = &status["prefix_cache"];
    assert_eq!(cache["enabled"], true, "{status}");
    assert_eq!(cache["prompt_tokens_reused"].as_u64(), Some(2 * reused));
    assert_eq!(
        status["prompt_tokens_processed"].as_u64(),
        Some(3 * prompt_tokens)
    );
    // And how it reads the model's chats: the synthetic model's ChatML template.
    let chat = &status["chat_format"];
    assert_eq!(chat["template"], true, "{status}");
    assert_eq!(chat["tools"], "described", "{status}");
    assert_eq!(chat["think_open"], "<think>", "{status}");
    let out = spark(&d.socket, &["status"]);
    let report = text(&out.stdout);
    let line = format!(
        "{} of {} prompt tokens reused",
        2 * reused,
        3 * prompt_tokens
    );
    assert!(report.contains(&line), "{report}");
    assert!(
        report.contains("tools described · thinks in <think>…</think>"),
        "{report}"
    );
}

#[test]
fn jobs_lists_the_runs_with_their_numbers() {
    let d = Daemon::start(&tiny_model(), &[]);
    for n in ["5", "7"] {
        assert!(spark(&d.socket, &["run", "--max-tokens", n, "--raw", "x"])
            .status
            .success());
    }
    let out = spark(&d.socket, &["jobs", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // One JSON object per job, newest first.
    let jobs: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("job JSON"))
        .collect();
    let outs: Vec<u64> = jobs
        .iter()
        .map(|j| j["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(outs, vec![7, 5], "newest first");
    let table = text(&spark(&d.socket, &["jobs"]).stdout);
    assert!(table.lines().next().unwrap().contains("TOK/S"), "{table}");
    assert_eq!(table.lines().count(), 3, "{table}");
}

/// `spark models` lists the models folder with the daemon's model marked loaded, and
/// works without a daemon (nothing loaded then).
#[test]
fn models_lists_the_folder_and_marks_the_loaded_model() {
    let dir = TempDir::new("models");
    let model = dir.path().join("tiny-chat.gguf");
    std::fs::copy(tiny_model(), &model).expect("copy the model");
    std::fs::write(dir.path().join("other.gguf"), b"not really a model").unwrap();
    let d = Daemon::start(&model, &[]);
    let models = |socket: &std::path::Path| {
        let out = Command::new(bin("spark"))
            .arg("--socket")
            .arg(socket)
            .args(["models", "--json"])
            .env("SPARKD_MODELS", dir.path())
            .env("SPARKD_NO_AUTOSTART", "1")
            .output()
            .expect("run spark");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("model JSON"))
            .map(|m| {
                (
                    m["name"].as_str().unwrap().to_owned(),
                    m["loaded"].as_bool().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let default = spark_client::models::DEFAULT_MODEL.to_owned();
    assert_eq!(
        models(&d.socket),
        [
            ("other".to_owned(), false),
            ("tiny-chat".to_owned(), true),
            (default.clone(), false)
        ]
    );
    drop(d);
    let gone = dir.path().join("gone.sock");
    assert!(models(&gone).iter().all(|(_, loaded)| !loaded));
}

/// Runs `spark chat` with `lines` on its stdin, one question each.
fn chat(socket: &std::path::Path, args: &[&str], lines: &[&str]) -> Output {
    use std::io::Write;
    let mut child = Command::new(bin("spark"))
        .arg("--socket")
        .arg(socket)
        .arg("chat")
        .args(args)
        .env_remove("SPARKD_SOCKET")
        .env("SPARKD_NO_AUTOSTART", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run spark chat");
    let mut stdin = child.stdin.take().expect("stdin");
    for line in lines {
        writeln!(stdin, "{line}").expect("write a question");
    }
    drop(stdin);
    child.wait_with_output().expect("spark chat ends")
}

/// The prompt sizes of the daemon's jobs, oldest first.
fn prompt_sizes(socket: &std::path::Path) -> Vec<u64> {
    let out = spark(socket, &["jobs", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut sizes: Vec<u64> = text(&out.stdout)
        .lines()
        .map(|l| {
            let job: serde_json::Value = serde_json::from_str(l).expect("job JSON");
            job["usage"]["prompt_tokens"].as_u64().unwrap()
        })
        .collect();
    sizes.reverse();
    sizes
}

#[test]
fn chat_sends_the_history_and_leaves_out_its_oldest_exchange_when_it_outgrows_the_context() {
    let questions = [
        "What is the capital of France?",
        "And of Spain?",
        "And of Italy?",
        "And of Greece?",
        "And of Norway?",
    ];
    // Room for three of these exchanges, not four.
    let d = Daemon::start(&tiny_model(), &["--ctx", "150"]);
    let out = chat(&d.socket, &["--max-tokens", "8"], &questions);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let stats = stderr.lines().filter(|l| l.contains(" tok/s · ")).count();
    assert_eq!(stats, questions.len(), "every question answered: {stderr}");
    let dropped = stderr
        .lines()
        .filter(|l| l.contains("outgrew the context"))
        .count();
    assert_eq!(dropped, 2, "{stderr}");
    assert!(!stderr.contains("spark:"), "no error: {stderr}");

    let sizes = prompt_sizes(&d.socket);
    assert_eq!(sizes.len(), questions.len(), "{sizes:?}");
    assert!(
        sizes[0] < sizes[1] && sizes[1] < sizes[2],
        "history resent: {sizes:?}"
    );
    assert!(
        sizes[3] < sizes[2] + 20,
        "oldest exchange left out: {sizes:?}"
    );
    assert!(sizes.iter().all(|&n| n + 8 <= 150), "{sizes:?}");

    // One question too long for the context on its own: said, and the chat goes on; a
    // script learns from the exit status that a question went unanswered.
    let long = "word ".repeat(200);
    let out = chat(&d.socket, &["--max-tokens", "8"], &[long.trim(), "hi"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("hint: a shorter question"), "{stderr}");
    assert_eq!(
        stderr.lines().filter(|l| l.contains(" tok/s · ")).count(),
        1
    );

    // Room kept for the answer that the context cannot hold: the hint names the flag.
    let out = chat(&d.socket, &["--max-tokens", "150"], &["hi"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("a lower --max-tokens (150 tokens"),
        "{stderr}"
    );
}

#[test]
fn run_starts_a_daemon_when_none_answers_and_stop_ends_it() {
    let dir = TempDir::new("auto");
    let socket = dir.path().join("s.sock");
    let model = tiny_model();
    let out = Command::new(bin("spark"))
        .arg("--socket")
        .arg(&socket)
        .arg("--model")
        .arg(&model)
        .args(["run", "--max-tokens", "4", "--raw", "wake up"])
        .env_remove("SPARKD_NO_AUTOSTART")
        .stdin(Stdio::null())
        .output()
        .expect("run spark");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(socket.exists(), "the daemon stays resident");
    // The next call finds it.
    assert!(spark(&socket, &["status"]).status.success());
    let stop = spark(&socket, &["stop"]);
    assert!(stop.status.success(), "{}", text(&stop.stderr));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        spark(&socket, &["status"]).status.code(),
        Some(3),
        "gone after stop"
    );
}

/// `spark serve-openai` as `spark run`: a daemon started when none answers, with
/// `--model`; and `--model` naming another model than the running daemon's refused.
#[test]
fn serve_openai_starts_a_daemon_with_its_model_and_refuses_another() {
    let dir = TempDir::new("auto-shim");
    let socket = dir.path().join("s.sock");
    let model = tiny_model();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let shim = |model: &std::path::Path| {
        let mut cmd = Command::new(bin("spark"));
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--model")
            .arg(model)
            .args(["serve-openai", "--listen", &format!("127.0.0.1:{port}")])
            .env_remove("SPARKD_NO_AUTOSTART")
            .env_remove("SPARKD_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    };
    let mut child = shim(&model).spawn().expect("spawn the shim");
    let stem = model.file_stem().unwrap().to_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let served = loop {
        if let Some(models) = http_get_json(port, "/v1/models") {
            break models;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the shim never answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(served["data"][0]["id"], stem.as_str(), "{served}");
    assert!(socket.exists(), "the daemon it started stays resident");

    // Another model than the running daemon's: refused at start, naming both.
    let other = dir.path().join("other.gguf");
    std::fs::copy(&model, &other).unwrap();
    let out = shim(&other).output().expect("run the shim");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("the daemon serves"), "{stderr}");

    let stop = spark(&socket, &["stop"]);
    assert!(stop.status.success(), "{}", text(&stop.stderr));
}

/// The JSON body of `GET path` on localhost:`port` when it answers 200.
fn http_get_json(port: u16, path: &str) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then(|| serde_json::from_str(body).ok())
        .flatten()
}

#[test]
fn daemon_absent_and_bad_arguments_have_distinct_exit_codes() {
    let dir = TempDir::new("none");
    let out = spark(&dir.path().join("nobody.sock"), &["run", "hello"]);
    assert_eq!(out.status.code(), Some(3));
    let msg = text(&out.stderr);
    assert!(
        msg.contains("nobody.sock"),
        "names the socket it tried: {msg}"
    );
    let out = spark(
        &dir.path().join("nobody.sock"),
        &["run", "--temperature", "hot", "x"],
    );
    assert_eq!(out.status.code(), Some(2));
    let d = Daemon::start(&tiny_model(), &[]);
    for negative in [&["--temperature=-1"][..], &["--temperature", "-1"]] {
        // A negative value is the daemon's to refuse, by name, not taken for a flag.
        let out = spark(&d.socket, &[&["run"], negative, &["x"]].concat());
        assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains("temperature"));
    }
}

#[test]
fn generations_answer_only_for_the_loaded_model() {
    let d = Daemon::start(&tiny_model(), &[]);
    let model = tiny_model();
    // The model's file by a path relative to another folder than the daemon's.
    let out = Command::new(bin("spark"))
        .current_dir(model.parent().unwrap())
        .arg("--socket")
        .arg(&d.socket)
        .arg("--model")
        .arg(model.file_name().unwrap())
        .args(["run", "--max-tokens", "2", "--raw", "hi"])
        .env("SPARKD_NO_AUTOSTART", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Another model is refused, never answered by the loaded one.
    let out = spark(&d.socket, &["--model", "llama-70b", "run", "--raw", "hi"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let msg = text(&out.stderr);
    assert!(
        msg.contains("unknown_model") && msg.contains("llama-70b"),
        "{msg}"
    );
    assert!(msg.contains("hint:"), "says how to switch: {msg}");

    // Chat gives up at once instead of refusing every turn.
    let mut chat = Command::new(bin("spark"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["--model", "llama-70b", "chat"])
        .env("SPARKD_NO_AUTOSTART", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    chat.stdin
        .take()
        .unwrap()
        .write_all(b"hi\nhello again\n")
        .unwrap();
    let out = chat.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr).matches("unknown_model").count(), 1);

    // Tokenize too: the loaded model by its path answers, another model is refused.
    let out = spark(
        &d.socket,
        &["--model", model.to_str().unwrap(), "tokenize", "hi"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!out.stdout.is_empty());
    let out = spark(&d.socket, &["--model", "llama-70b", "tokenize", "hi"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("llama-70b"));
}

#[test]
fn bench_reports_every_level_through_the_socket() {
    let d = Daemon::start(&tiny_model(), &[]);
    let out = spark(
        &d.socket,
        &["bench", "--streams", "1,3", "--max-tokens", "8", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    assert!(report["peer"].is_null());
    let levels = report["sparkd"].as_array().expect("levels");
    assert_eq!(levels.len(), 2);
    for (level, streams) in levels.iter().zip([1u64, 3]) {
        assert_eq!(level["streams"].as_u64(), Some(streams));
        let tokens = level["tokens"].as_u64().unwrap();
        // End tokens are banned where the vocabulary has them; the tiny model may still
        // stop early, but never runs past max_tokens.
        assert!(tokens > 0 && tokens <= streams * 8, "{level}");
        assert!(level["aggregate_tps"].as_f64().unwrap() > 0.0, "{level}");
        assert!(level["ttft_ms"].as_f64().unwrap() >= 0.0, "{level}");
    }
    // A warm-up stream, then 1 and 3: each a job of its own, counted by the daemon as
    // the bench counted it.
    let jobs = spark(&d.socket, &["jobs", "--json"]);
    assert!(jobs.status.success());
    let jobs: Vec<serde_json::Value> = text(&jobs.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("job JSON"))
        .collect();
    assert_eq!(jobs.len(), 5);
    let counted: u64 = jobs[..4]
        .iter()
        .map(|j| j["usage"]["completion_tokens"].as_u64().unwrap())
        .sum();
    let reported: u64 = levels.iter().map(|l| l["tokens"].as_u64().unwrap()).sum();
    assert_eq!(counted, reported);
}

#[test]
fn bench_refuses_a_missing_peer_clearly() {
    let d = Daemon::start(&tiny_model(), &[]);
    let out = spark(
        &d.socket,
        &[
            "bench",
            "--streams",
            "1",
            "--max-tokens",
            "4",
            "--peer",
            "/nonexistent/llama",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no llama-server in /nonexistent/llama"),
        "{}",
        text(&out.stderr)
    );
}

/// `spark run --json --format json ...`: the answer's text and its finish reason.
fn run_json_output(socket: &std::path::Path, args: &[&str]) -> (String, String) {
    let mut all = vec!["run", "--json"];
    if !args.contains(&"--schema") {
        all.extend(["--format", "json"]);
    }
    all.extend_from_slice(args);
    let out = spark(socket, &all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let answer: String = events
        .iter()
        .filter(|e| e["type"] == "token")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    let done = events.last().expect("a done line");
    (answer, done["finish_reason"].as_str().unwrap().to_string())
}

#[test]
fn format_json_holds_the_answer_to_one_json_object() {
    let d = Daemon::start(&tiny_model(), &[]);
    // Random weights, sampled: whatever comes is the beginning of an object, and a
    // whole one when the generation stopped by itself.
    let mut closed = 0;
    for seed in ["1", "2", "3", "4", "5", "6"] {
        let (answer, finish) = run_json_output(
            &d.socket,
            &[
                "--raw",
                "--max-tokens",
                "48",
                "--temperature",
                "1.2",
                "--seed",
                seed,
                "data:",
            ],
        );
        assert!(answer.trim_start().starts_with('{'), "{answer:?}");
        if finish == "stop" {
            closed += 1;
            let value: serde_json::Value =
                serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"));
            assert!(value.is_object(), "{answer:?}");
        } else {
            assert_eq!(finish, "length");
        }
    }
    eprintln!("{closed} of 6 objects closed within 48 tokens");

    let out = spark(&d.socket, &["run", "--format", "yaml", "hi"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("json"), "{}", text(&out.stderr));
}

#[test]
fn format_json_on_the_default_model_answers_a_whole_object() {
    let Some(model) = default_model() else {
        eprintln!("skipping: the default model is not on this machine");
        return;
    };
    let d = Daemon::start(&model, &[]);
    let (answer, finish) = run_json_output(
        &d.socket,
        &[
            "--max-tokens",
            "200",
            "Describe a cat as JSON with name, age and color.",
        ],
    );
    assert_eq!(finish, "stop", "{answer:?}");
    let value: serde_json::Value =
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"));
    assert!(value.is_object(), "{answer:?}");
}

/// A schema like what pydantic writes: `$defs`/`$ref`, bounds, an enum, an optional
/// field as `anyOf` with null.
const CAT_SCHEMA: &str = r##"{
  "$defs": {"Owner": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}},
                      "required": ["name"], "additionalProperties": false}},
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 30},
    "age": {"type": "integer", "minimum": 0, "maximum": 40},
    "color": {"enum": ["black", "white", "orange", "grey", "tabby"]},
    "toys": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "owner": {"$ref": "#/$defs/Owner"}
  },
  "required": ["name", "age", "color", "toys", "nickname", "owner"],
  "additionalProperties": false
}"##;

fn check_against_cat_schema(answer: &str) {
    let schema: serde_json::Value = serde_json::from_str(CAT_SCHEMA).unwrap();
    let value: serde_json::Value =
        serde_json::from_str(answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"));
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{answer:?}: {errors:?}");
}

/// Small enough that a random model, which spends most of its tokens on whitespace
/// between JSON's tokens, still closes the object within its budget.
const FLAG_SCHEMA: &str = r#"{"type": "object",
  "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1, "maximum": 3}},
  "required": ["ok", "n"], "additionalProperties": false}"#;

#[test]
fn schema_holds_the_answer_to_a_json_schema() {
    let dir = TempDir::new("cli-schema");
    let schema = dir.path().join("flag.json");
    std::fs::write(&schema, FLAG_SCHEMA).unwrap();
    let schema = schema.to_str().unwrap();
    let d = Daemon::start(&tiny_model(), &[]);
    // Random weights, sampled: every answer that stopped by itself is valid under the
    // schema.
    let mut closed = 0;
    for seed in ["1", "2", "3", "4"] {
        let (answer, finish) = run_json_output(
            &d.socket,
            &[
                "--schema",
                schema,
                "--raw",
                "--max-tokens",
                "400",
                "--temperature",
                "1",
                "--seed",
                seed,
                "cat:",
            ],
        );
        assert!(answer.starts_with('{'), "{answer:?}");
        if finish == "stop" {
            closed += 1;
            let value: serde_json::Value =
                serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"));
            let validator =
                jsonschema::validator_for(&serde_json::from_str(FLAG_SCHEMA).unwrap()).unwrap();
            assert!(validator.is_valid(&value), "{answer:?}");
        } else {
            assert_eq!(finish, "length");
        }
    }
    assert!(
        closed >= 2,
        "{closed} of 4 objects closed: the test shows little"
    );

    // What the daemon cannot enforce is refused, saying what and where.
    let negated = dir.path().join("not.json");
    std::fs::write(
        &negated,
        r#"{"type":"object","properties":{"zip":{"type":"string","not":{"const":"0"}}}}"#,
    )
    .unwrap();
    let out = spark(
        &d.socket,
        &["run", "--schema", negated.to_str().unwrap(), "hi"],
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("`not`") && err.contains("#/properties/zip"),
        "{err}"
    );
    // A file that is not JSON, or none, never reaches the daemon: bad arguments.
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"type\":").unwrap();
    let missing = dir.path().join("missing.json");
    let out = spark(
        &d.socket,
        &["run", "--schema", missing.to_str().unwrap(), "hi"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = spark(
        &d.socket,
        &["run", "--schema", broken.to_str().unwrap(), "hi"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("is not JSON"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn schema_on_the_default_model_answers_a_valid_object() {
    let Some(model) = default_model() else {
        eprintln!("skipping: the default model is not on this machine");
        return;
    };
    let dir = TempDir::new("cli-schema-default");
    let schema = dir.path().join("cat.json");
    std::fs::write(&schema, CAT_SCHEMA).unwrap();
    let d = Daemon::start(&model, &[]);
    let (answer, finish) = run_json_output(
        &d.socket,
        &[
            "--schema",
            schema.to_str().unwrap(),
            "--max-tokens",
            "200",
            "Describe a cat and its owner as JSON.",
        ],
    );
    assert_eq!(finish, "stop", "{answer:?}");
    check_against_cat_schema(&answer);
}

/// OpenAI's own example tool.
const WEATHER_TOOLS: &str = r#"[{"type": "function", "function": {
  "name": "get_weather", "description": "Get the current weather in a city.",
  "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"], "additionalProperties": false}}}]"#;

fn tools_file(dir: &TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn tools_files_and_choices_are_checked_before_connecting() {
    let dir = TempDir::new("cli-tools-usage");
    // No daemon: a usage error (2) must come before the attempt to connect (3).
    let socket = dir.path().join("nobody.sock");
    let good = tools_file(&dir, "good.json", WEATHER_TOOLS);
    let bad_name = tools_file(
        &dir,
        "bad.json",
        r#"[{"type": "function", "function": {"name": "get weather"}}]"#,
    );
    let not_json = tools_file(&dir, "broken.json", "[{\"type\":");
    let cases: [(&[&str], &str); 7] = [
        (
            &["run", "--tools", &bad_name, "hi"],
            "tools[0].function.name",
        ),
        (&["run", "--tools", &not_json, "hi"], "not JSON"),
        (
            &["run", "--tools", "/nonexistent/tools.json", "hi"],
            "tools",
        ),
        (
            &["run", "--tools", &good, "--tool-choice", "get_time", "hi"],
            "get_time",
        ),
        (&["run", "--tool-choice", "required", "hi"], "--tools"),
        (&["run", "--tools", &good, "--raw", "hi"], "--raw"),
        (
            &["chat", "--tools", &good, "--format", "json"],
            "--format json",
        ),
    ];
    for (args, says) in cases {
        let out = spark(&socket, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `spark run --json ...`: the event lines.
fn json_events(socket: &std::path::Path, args: &[&str]) -> Vec<serde_json::Value> {
    let out = spark(socket, &[&["run", "--json"], args].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

#[test]
fn tools_with_the_choice_none_answer_in_text_in_run_and_chat() {
    // The tiny model's context (512) cannot hold the tools' description: with `none`
    // they are not shown, and the request still goes as a chat with tools.
    let dir = TempDir::new("cli-tools-none");
    let tools = tools_file(&dir, "weather.json", WEATHER_TOOLS);
    let d = Daemon::start(&tiny_model(), &[]);
    let events = json_events(
        &d.socket,
        &[
            "--tools",
            &tools,
            "--tool-choice",
            "none",
            "--max-tokens",
            "8",
            "hi",
        ],
    );
    assert!(
        events.iter().all(|e| e["type"] != "tool_call"),
        "{events:?}"
    );
    let done = events.last().expect("a done line");
    assert_eq!(done["type"], "done");
    assert!(done["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    let out = chat(
        &d.socket,
        &[
            "--tools",
            &tools,
            "--tool-choice",
            "none",
            "--max-tokens",
            "8",
        ],
        &["hi", "and again"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr.lines().filter(|l| l.contains(" tok/s · ")).count(),
        2,
        "{stderr}"
    );
}

/// The weather call in `args` of a `get_weather(...)` line or event: its arguments.
fn weather_arguments(arguments: &str) -> serde_json::Value {
    let value: serde_json::Value = serde_json::from_str(arguments)
        .unwrap_or_else(|e| panic!("{arguments:?} is not JSON: {e}"));
    assert!(value["city"].is_string(), "{value}");
    if let Some(unit) = value.get("unit") {
        assert!(unit == "celsius" || unit == "fahrenheit", "{value}");
    }
    value
}

#[test]
fn tool_calls_on_the_default_model_print_as_lines_and_json_events() {
    let Some(model) = default_model() else {
        eprintln!("skipping: the default model is not on this machine");
        return;
    };
    let dir = TempDir::new("cli-tools-default");
    let tools = tools_file(&dir, "weather.json", WEATHER_TOOLS);
    let d = Daemon::start(&model, &[]);
    let question = "What is the weather like in Paris today?";
    let events = json_events(
        &d.socket,
        &[
            "--tools",
            &tools,
            "--tool-choice",
            "get_weather",
            "--max-tokens",
            "200",
            question,
        ],
    );
    let done = events.last().expect("a done line");
    assert_eq!(done["finish_reason"], "stop", "{events:?}");
    let calls: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["type"] == "tool_call").collect();
    assert_eq!(calls.len(), 1, "one call of the named function: {events:?}");
    let call = calls[0];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["index"], 0);
    assert_eq!(
        call["id"], done["id"],
        "the generation's id, as in other events"
    );
    assert!(
        call["call_id"].as_str().unwrap().starts_with("call_"),
        "{call}"
    );
    weather_arguments(call["arguments"].as_str().unwrap());

    // Without --json: the call on a line of its own, `name(arguments)`.
    let out = spark(
        &d.socket,
        &[
            "run",
            "--tools",
            &tools,
            "--tool-choice",
            "required",
            "--max-tokens",
            "200",
            question,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("get_weather("))
        .unwrap_or_else(|| panic!("no call line: {stdout:?}"));
    weather_arguments(
        line.strip_prefix("get_weather(")
            .unwrap()
            .strip_suffix(')')
            .unwrap(),
    );
}

#[test]
fn a_call_cut_short_shows_what_was_written_of_it_and_says_so() {
    let Some(model) = default_model() else {
        eprintln!("skipping: the default model is not on this machine");
        return;
    };
    let dir = TempDir::new("cli-tools-cut");
    let tools = tools_file(&dir, "weather.json", WEATHER_TOOLS);
    let d = Daemon::start(&model, &[]);
    // Room for the call's name and the start of its arguments, not for all of them.
    let out = spark(
        &d.socket,
        &[
            "run",
            "--tools",
            &tools,
            "--tool-choice",
            "required",
            "--max-tokens",
            "14",
            "What is the weather like in Paris today?",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("get_weather("))
        .unwrap_or_else(|| panic!("no call line: {stdout:?}"));
    let written = line.strip_prefix("get_weather(").unwrap();
    assert!(
        written.starts_with('{') && !written.ends_with(')'),
        "{line:?}"
    );
    assert!(
        serde_json::from_str::<serde_json::Value>(written).is_err(),
        "the arguments are unfinished: {written:?}"
    );
    assert!(!stdout.contains("<tool_call>"), "no call text: {stdout:?}");
    assert!(
        text(&out.stderr).contains("(the call was cut short)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn chat_on_the_default_model_keeps_a_turn_that_made_calls_in_its_history() {
    let Some(model) = default_model() else {
        eprintln!("skipping: the default model is not on this machine");
        return;
    };
    let dir = TempDir::new("cli-tools-chat");
    let tools = tools_file(&dir, "weather.json", WEATHER_TOOLS);
    let d = Daemon::start(&model, &[]);
    let out = chat(
        &d.socket,
        &[
            "--tools",
            &tools,
            "--tool-choice",
            "required",
            "--max-tokens",
            "100",
        ],
        &["What is the weather in Paris?", "And in Oslo?"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let calls = stdout
        .lines()
        .filter(|l| l.starts_with("get_weather("))
        .count();
    assert_eq!(calls, 2, "one call per turn: {stdout:?}");
    // The second prompt holds the first question and the call that answered it.
    let sizes = prompt_sizes(&d.socket);
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    assert!(sizes[1] > sizes[0] + 10, "history resent: {sizes:?}");
}

/// A chat template whose generation prompt opens the model's thinking (as
/// DeepSeek-R1's does): everything the random model writes is reasoning.
const THINKING_TEMPLATE: &str =
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: <think>\n";

#[test]
fn reasoning_goes_to_stderr_and_json_reasoning_lines() {
    let dir = TempDir::new("thinking");
    let template = dir.path().join("thinking.jinja");
    std::fs::write(&template, THINKING_TEMPLATE).unwrap();
    let d = Daemon::start(
        &tiny_model(),
        &["--chat-template", template.to_str().unwrap()],
    );
    let args = [
        "--max-tokens",
        "8",
        "--seed",
        "5",
        "--temperature",
        "1",
        "hi",
    ];

    let json = spark(&d.socket, &[&["run", "--json"][..], &args[..]].concat());
    assert!(json.status.success(), "{}", text(&json.stderr));
    let events: Vec<serde_json::Value> = text(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    // Each token: its reasoning (when it has text), then the token, with no answer text.
    assert_eq!(
        kinds.iter().filter(|k| **k == "token").count(),
        8,
        "{kinds:?}"
    );
    assert!(kinds.contains(&"reasoning"), "{kinds:?}");
    assert!(events
        .iter()
        .filter(|e| e["type"] == "token")
        .all(|e| e["text"] == ""));
    let reasoning: String = events
        .iter()
        .filter(|e| e["type"] == "reasoning")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert!(!reasoning.is_empty());

    // Text mode: stdout has only the answer (none here); the reasoning and the stats
    // line are on stderr.
    let plain = spark(&d.socket, &[&["run"][..], &args[..]].concat());
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    assert_eq!(text(&plain.stdout), "");
    let stderr = text(&plain.stderr);
    assert!(
        stderr.starts_with(&reasoning),
        "{stderr:?} vs {reasoning:?}"
    );
    assert!(stderr.contains(" tok/s · 8 tokens"), "{stderr:?}");
}

/// Qwen 3's switch: the prompt opens the thinking unless `enable_thinking` is false.
const SWITCHED_THINKING_TEMPLATE: &str = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: {% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}";

/// `spark run --json`'s event kinds and whether it succeeded, with its stderr.
fn event_kinds(socket: &Path, extra: &[&str]) -> Result<Vec<String>, String> {
    let base = [
        "run",
        "--json",
        "--max-tokens",
        "6",
        "--seed",
        "5",
        "--temperature",
        "1",
    ];
    let out = spark(socket, &[&base[..], extra, &["hi"][..]].concat());
    if !out.status.success() {
        return Err(text(&out.stderr));
    }
    Ok(text(&out.stdout)
        .lines()
        .map(|l| {
            let e: serde_json::Value = serde_json::from_str(l).expect("each line is JSON");
            e["type"].as_str().unwrap().to_owned()
        })
        .collect())
}

#[test]
fn chat_template_kwargs_switch_thinking_from_the_cli_and_the_daemon() {
    let dir = TempDir::new("kwargs");
    let template = dir.path().join("switched.jinja");
    std::fs::write(&template, SWITCHED_THINKING_TEMPLATE).unwrap();
    let thinks = |kinds: &[String]| kinds.iter().any(|k| k == "reasoning");
    let off = r#"{"enable_thinking": false}"#;
    let on = r#"{"enable_thinking": true}"#;

    let d = Daemon::start(
        &tiny_model(),
        &["--chat-template", template.to_str().unwrap()],
    );
    assert!(thinks(&event_kinds(&d.socket, &[]).unwrap()));
    let kinds = event_kinds(&d.socket, &["--chat-template-kwargs", off]).unwrap();
    assert!(
        !thinks(&kinds) && kinds.iter().any(|k| k == "token"),
        "{kinds:?}"
    );
    // Refused before anything is sent, and by the daemon, each with what is wrong.
    let err = event_kinds(&d.socket, &["--chat-template-kwargs", "[1]"]).unwrap_err();
    assert!(err.contains("takes a JSON object"), "{err}");
    let err =
        event_kinds(&d.socket, &["--chat-template-kwargs", r#"{"messages": 1}"#]).unwrap_err();
    assert!(err.contains("`messages` is set by sparkd itself"), "{err}");
    drop(d);

    // The daemon's default, which a request overrides.
    let d = Daemon::start(
        &tiny_model(),
        &[
            "--chat-template",
            template.to_str().unwrap(),
            "--chat-template-kwargs",
            off,
        ],
    );
    assert!(!thinks(&event_kinds(&d.socket, &[]).unwrap()));
    assert!(thinks(
        &event_kinds(&d.socket, &["--chat-template-kwargs", on]).unwrap()
    ));
}
