//! systemd integration, end to end: sd_notify readiness/status/watchdog/stopping, socket
//! activation with the real `systemd-socket-activate`, and peer-credential refusal.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spark_client::protocol::*;
use sparkd_e2e::{bin, tiny_model, Daemon, TempDir};

fn frame(msg: &ClientMessage) -> Vec<u8> {
    let payload = postcard::to_allocvec(msg).unwrap();
    let mut v = (payload.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(&payload);
    v
}

fn read_frame(s: &mut UnixStream) -> std::io::Result<ServerMessage> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut buf)?;
    Ok(postcard::from_bytes(&buf).expect("server frame decodes"))
}

fn hello() -> ClientMessage {
    ClientMessage::Hello(Hello {
        major: PROTOCOL_MAJOR,
        minor: PROTOCOL_MINOR,
        client: "systemd-test".into(),
    })
}

/// Collects notify datagrams until `until` matches one or the time runs out.
fn collect(sock: &UnixDatagram, seen: &mut Vec<String>, until: &str, limit: Duration) -> bool {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            let hit = msg.lines().any(|l| l == until);
            seen.push(msg);
            if hit {
                return true;
            }
        }
    }
    false
}

#[test]
fn notifies_ready_after_load_then_status_watchdog_and_stopping() {
    let dir = TempDir::new("notify");
    let notify_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let notify = notify_path.to_str().unwrap();
    let mut d = Daemon::start_with_env(
        &tiny_model(),
        &[],
        &[("NOTIFY_SOCKET", notify), ("WATCHDOG_USEC", "1000000")],
    );
    let mut seen = Vec::new();
    assert!(
        collect(&sock, &mut seen, "READY=1", Duration::from_secs(20)),
        "no READY=1: {seen:?}"
    );
    let ready_at = seen
        .iter()
        .position(|m| m.lines().any(|l| l == "READY=1"))
        .unwrap();
    let loading = seen.iter().position(|m| m.contains("STATUS=loading model"));
    assert!(
        loading.is_some_and(|l| l < ready_at),
        "loading status before READY: {seen:?}"
    );
    assert!(seen[ready_at].contains("STATUS=serving"), "{seen:?}");
    // READY means the model is resident and the socket answers at once.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&frame(&hello())).unwrap();
    assert!(matches!(
        read_frame(&mut s).unwrap(),
        ServerMessage::Welcome(_)
    ));
    assert!(
        collect(&sock, &mut seen, "WATCHDOG=1", Duration::from_secs(5)),
        "no WATCHDOG=1: {seen:?}"
    );
    d.signal(libc::SIGTERM);
    assert!(
        collect(&sock, &mut seen, "STOPPING=1", Duration::from_secs(5)),
        "no STOPPING=1: {seen:?}"
    );
    drop(s);
    assert!(d.child.wait().unwrap().success());
}

#[test]
fn socket_activation_serves_a_client_that_connected_before_the_daemon_started() {
    if Command::new("systemd-socket-activate")
        .arg("--help")
        .output()
        .is_err()
    {
        eprintln!("skipping: systemd-socket-activate not installed");
        return;
    }
    let dir = TempDir::new("act");
    let socket = dir.path().join("act.sock");
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&socket)
        .arg(bin("sparkd"))
        .args(["serve", "--threads", "1", "--kv-tokens", "1024", "--model"])
        .arg(tiny_model())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start systemd-socket-activate");
    let start = Instant::now();
    while !socket.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The daemon is started by this very connection; the handshake waits for it.
    let mut s = UnixStream::connect(&socket).expect("connect to the activated socket");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&frame(&hello())).unwrap();
    let welcome = read_frame(&mut s);
    let req = GenerateRequest {
        id: 1,
        model: None,
        input: PromptInput::Raw {
            text: "activated".into(),
            special: false,
        },
        sampling: SamplingParams::default(),
        max_tokens: Some(3),
        stop: vec![],
        logprobs: None,
    };
    s.write_all(&frame(&ClientMessage::Generate(req))).unwrap();
    let mut tokens = 0;
    let done = loop {
        match read_frame(&mut s).expect("frame") {
            ServerMessage::Prefilled(_) => {}
            ServerMessage::Token(_) => tokens += 1,
            ServerMessage::Done(d) => break d,
            other => panic!("{other:?}"),
        }
    };
    let _ = activator.kill();
    let _ = activator.wait();
    assert!(
        matches!(welcome, Ok(ServerMessage::Welcome(_))),
        "{welcome:?}"
    );
    assert_eq!((tokens, done.usage.completion_tokens), (3, 3));
}

#[test]
fn a_user_outside_the_allow_list_is_refused_with_uid_only_in_the_log() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("skipping: needs root and setpriv to connect as another user");
        return;
    }
    let d = Daemon::start(&tiny_model(), &[]);
    // Open the socket and its folder to everyone, so only the peer-credential check stands
    // between the stranger and the daemon.
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(bin("spark"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("status")
        .env("SPARKD_NO_AUTOSTART", "1")
        .output()
        .expect("run spark as nobody");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a stranger must be refused: {stderr}"
    );
    assert!(
        stderr.contains("not allowed") || stderr.contains("65534"),
        "{stderr}"
    );
    // Root still gets in.
    let ok = Command::new(bin("spark"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("status")
        .output()
        .unwrap();
    assert!(ok.status.success());
    let log = d.log_text();
    assert!(log.contains("65534"), "refusal logged with the uid: {log}");
}

#[test]
fn sighup_reloads_the_allow_list_and_limits_without_dropping_connections() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("skipping: needs root and setpriv to connect as another user");
        return;
    }
    let dir = TempDir::new("hup");
    let config = dir.path().join("sparkd.toml");
    std::fs::write(&config, "max_per_uid = 1\n").unwrap();
    let d = Daemon::start(&tiny_model(), &["--config", config.to_str().unwrap()]);
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let as_nobody = || {
        Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(bin("spark"))
            .arg("--socket")
            .arg(&d.socket)
            .arg("status")
            .env("SPARKD_NO_AUTOSTART", "1")
            .output()
            .expect("run spark as nobody")
    };
    assert!(!as_nobody().status.success(), "refused before the reload");

    // A connection open across the reload, with a generation running.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&frame(&hello())).unwrap();
    assert!(matches!(
        read_frame(&mut s).unwrap(),
        ServerMessage::Welcome(_)
    ));
    let gen = |id: u64, max: u32| {
        ClientMessage::Generate(GenerateRequest {
            id,
            model: None,
            input: PromptInput::Raw {
                text: "hold on".into(),
                special: false,
            },
            sampling: SamplingParams::default(),
            max_tokens: Some(max),
            stop: vec![],
            logprobs: None,
        })
    };
    s.write_all(&frame(&gen(1, 400))).unwrap();
    // max_per_uid = 1: a second concurrent request of the same user is refused.
    s.write_all(&frame(&gen(2, 5))).unwrap();
    let mut busy = false;
    let mut first_done = None;
    while first_done.is_none() {
        match read_frame(&mut s).unwrap() {
            ServerMessage::Error(e) if e.id == Some(2) => {
                assert_eq!(e.kind, ErrorKind::Busy, "{e:?}");
                busy = true;
                // Now reload with the stranger allowed, while request 1 streams.
                std::fs::write(&config, "max_per_uid = 4\nallowed_uids = [65534]\n").unwrap();
                d.signal(libc::SIGHUP);
            }
            ServerMessage::Prefilled(_) | ServerMessage::Token(_) => {}
            ServerMessage::Done(done) => first_done = Some(done),
            other => panic!("{other:?}"),
        }
    }
    assert!(busy, "the per-user limit refused the second request");
    assert_eq!(
        first_done.unwrap().finish_reason,
        FinishReason::Length,
        "the stream survived the reload"
    );
    let start = Instant::now();
    while !as_nobody().status.success() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "reload did not admit uid 65534: {}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(d.log_text().contains("configuration reloaded"));
}
