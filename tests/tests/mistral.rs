//! A real daemon serving random weights with Mistral Nemo's own vocabulary and chat
//! template (`sparkd synth --vocab-from`): Tekken tokenization, the template's native
//! tool calls, and `[TOOL_CALLS]`, a control token, read as the calls' opening tag.
//! Skipped, saying so, when the vocabulary file is absent
//! (`scripts/fetch-test-vocabs.sh` makes it).

use std::path::PathBuf;

use futures::StreamExt;
use spark_client::protocol::*;
use spark_client::GenerationEvent;
use sparkd_e2e::{synth_model, Daemon, TempDir};

/// Where `scripts/fetch-test-vocabs.sh` leaves Mistral Nemo's vocabulary.
fn nemo_vocab() -> Option<PathBuf> {
    let dirs = [
        std::env::var_os("SPARKD_TEST_VOCABS").map(PathBuf::from),
        std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("sparkd/test-vocabs")),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sparkd/test-vocabs")),
    ];
    dirs.into_iter()
        .flatten()
        .map(|d| d.join("mistral-nemo-vocab.gguf"))
        .find(|p| p.is_file())
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_weather".into(),
            description: "The weather in a city".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6}},
                "required": ["city"],
                "additionalProperties": false
            })
            .to_string(),
            strict: true,
        },
        ToolSpec {
            name: "now".into(),
            description: String::new(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {},
                "additionalProperties": false
            })
            .to_string(),
            strict: true,
        },
    ]
}

fn chat(id: u64, messages: Vec<ToolChatMessage>, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        id,
        model: None,
        input: PromptInput::ChatWithTools {
            messages,
            tools: tools(),
            choice: ToolChoice::Auto,
            parallel: false,
        },
        sampling,
        max_tokens: Some(96),
        stop: vec![],
        logprobs: None,
    }
}

/// The answer's text, its calls and how it ended.
async fn answer(
    client: &spark_client::Client,
    req: GenerateRequest,
) -> (String, Vec<ToolCall>, FinishReason) {
    let mut gen = client.generate(req).await.expect("accepted");
    let (mut text, mut calls) = (String::new(), Vec::new());
    while let Some(event) = gen.next().await {
        match event.expect("an event") {
            GenerationEvent::Token(t) => text.push_str(&t.text),
            GenerationEvent::ToolCall(c) => calls.push(c.call),
            GenerationEvent::Done(done) => return (text, calls, done.finish_reason),
            GenerationEvent::Prefilled(_)
            | GenerationEvent::Reasoning(_)
            | GenerationEvent::TokenBytes(_)
            | GenerationEvent::ToolCallDelta(_) => {}
        }
    }
    panic!("no Done");
}

async fn token(client: &spark_client::Client, text: &str, special: bool) -> u32 {
    let pieces = client.tokenize(text, special).await.expect("tokenize");
    assert_eq!(pieces.len(), 1, "{text:?} is one token: {pieces:?}");
    pieces[0].id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mistral_nemo_vocabulary_calls_tools_in_its_own_syntax() {
    let Some(vocab) = nemo_vocab() else {
        eprintln!("skipping: mistral-nemo-vocab.gguf not found (scripts/fetch-test-vocabs.sh)");
        return;
    };
    let dir = TempDir::new("nemo");
    let model = dir.path().join("nemo-random.gguf");
    let vocab = vocab.to_str().expect("a UTF-8 path");
    synth_model(&model, &["--preset", "tiny", "--vocab-from", vocab]);
    let d = Daemon::start(&model, &[]);
    let client = d.client().await;
    let format = client.chat_format().await.expect("chat format");
    assert_eq!(
        (format.tools.as_str(), format.think_open.as_str()),
        ("mistral", "<think>")
    );
    let calls_tag = token(&client, "[TOOL_CALLS]", true).await;
    let close = [
        token(&client, "}", false).await,
        token(&client, "]", false).await,
    ];
    let quote = token(&client, "\"", false).await;
    // Random weights love whitespace, which JSON allows between any two tokens.
    let mut spaces = Vec::new();
    for run in [
        " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r", "\r\n",
    ] {
        spaces.extend(client.tokenize(run, false).await.expect("tokenize"));
    }

    // Random weights call nothing of their own accord: the tag is pushed up, and what
    // follows it is held to the call list.
    let mut completed = 0;
    for seed in 0..8 {
        let mut logit_bias = vec![(calls_tag, 30.0), (quote, 3.0)];
        logit_bias.extend(close.map(|id| (id, 4.0)));
        logit_bias.extend(spaces.iter().map(|p| (p.id, -8.0)));
        let sampling = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            logit_bias,
            ..SamplingParams::default()
        };
        let question = ToolChatMessage::new("user", "Weather in Oslo?");
        let (text, calls, finish) = answer(&client, chat(seed + 1, vec![question], sampling)).await;
        match finish {
            FinishReason::Stop if !calls.is_empty() => {
                completed += 1;
                assert_eq!(calls.len(), 1, "seed {seed}: one call, no parallel ones");
                assert_eq!(text, "", "seed {seed}: the tag and the call are not text");
                let call = &calls[0];
                assert!(
                    call.id.len() == 9 && call.id.bytes().all(|b| b.is_ascii_alphanumeric()),
                    "seed {seed}: id {:?}",
                    call.id
                );
                let arguments: serde_json::Value =
                    serde_json::from_str(&call.arguments).expect("JSON arguments");
                match call.name.as_str() {
                    "get_weather" => {
                        let city = arguments["city"].as_str().expect("a city");
                        assert!(city.chars().count() <= 6, "seed {seed}: {arguments}");
                        assert_eq!(arguments.as_object().map(|o| o.len()), Some(1));
                    }
                    "now" => assert!(arguments.is_object()),
                    other => panic!("seed {seed}: called {other}"),
                }
            }
            // Cut short: the tag and the call so far come back as text.
            FinishReason::Length => {
                assert!(calls.is_empty(), "seed {seed}");
                let list = text.strip_prefix("[TOOL_CALLS]").map(str::trim_start);
                assert!(
                    list.is_some_and(|l| l.starts_with('[')),
                    "seed {seed}: {text:?}"
                );
            }
            other => panic!("seed {seed}: finished {other:?} with {calls:?} and {text:?}"),
        }
    }
    eprintln!("{completed} of 8 calls complete within 96 tokens");
    assert!(
        completed > 0,
        "no call ever completed: the test shows nothing"
    );

    // A history whose call has an OpenAI-style id: Nemo's template refuses any id but
    // nine letters and digits, so the daemon maps it (in the call and in its result).
    let history = vec![
        ToolChatMessage::new("user", "Weather in Oslo?"),
        ToolChatMessage {
            role: "assistant".into(),
            content: None,
            tool_calls: vec![ToolCall {
                id: "call_Xk29mPq81LzT0aBcDeFgHiJk".into(),
                name: "get_weather".into(),
                arguments: r#"{"city": "Oslo"}"#.into(),
            }],
            tool_call_id: None,
        },
        ToolChatMessage {
            tool_call_id: Some("call_Xk29mPq81LzT0aBcDeFgHiJk".into()),
            ..ToolChatMessage::new("tool", "4 C, rain")
        },
    ];
    let sampling = SamplingParams {
        seed: Some(99),
        ..SamplingParams::default()
    };
    let (_, _, finish) = answer(&client, chat(100, history, sampling)).await;
    assert!(
        matches!(finish, FinishReason::Stop | FinishReason::Length),
        "{finish:?}"
    );
}
