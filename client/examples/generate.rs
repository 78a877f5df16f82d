//! Streams one chat completion from a running sparkd.
//!
//! ```text
//! cargo run -p spark-client --example generate -- "Why is the sky blue?"
//! ```
//!
//! The socket is `$SPARKD_SOCKET` or the per-user default, as for `spark`.

use std::io::Write;

use futures::StreamExt;
use spark_client::{
    protocol::{ChatMessage, GenerateRequest, PromptInput, SamplingParams},
    resolve_socket_path, Client, GenerationEvent,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let prompt = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let prompt = if prompt.is_empty() {
        "Say hello in five words.".to_owned()
    } else {
        prompt
    };

    let client = Client::connect(resolve_socket_path(None)).await?;
    let request = GenerateRequest {
        id: client.next_request_id(),
        model: None,
        input: PromptInput::Chat {
            messages: vec![ChatMessage::new("user", prompt)],
        },
        sampling: SamplingParams {
            temperature: 0.7,
            seed: Some(1),
            ..SamplingParams::default()
        },
        max_tokens: Some(128),
        stop: Vec::new(),
        logprobs: None,
    };

    let mut generation = client.generate(request).await?;
    let mut stdout = std::io::stdout();
    while let Some(event) = generation.next().await {
        match event? {
            GenerationEvent::Prefilled(prefill) => {
                eprintln!(
                    "prompt: {} tokens, {} from the daemon's cache",
                    prefill.prompt_tokens, prefill.cached_tokens
                );
            }
            GenerationEvent::Token(token) => {
                stdout.write_all(token.text.as_bytes())?;
                stdout.flush()?;
            }
            // Only requests that offer tools (`PromptInput::ChatWithTools`) get calls.
            GenerationEvent::ToolCall(_) | GenerationEvent::ToolCallDelta(_) => {}
            // A thinking model's reasoning, apart from the answer.
            GenerationEvent::Reasoning(r) => eprint!("{}", r.text),
            // Only requests with logprobs get each token's raw bytes.
            GenerationEvent::TokenBytes(_) => {}
            GenerationEvent::Done(done) => {
                println!();
                eprintln!(
                    "{} tokens, finish: {}, ttft: {:?} ms, decode: {:?} tok/s",
                    done.usage.completion_tokens,
                    done.finish_reason.as_str(),
                    done.timings.ttft_ms,
                    done.timings.decode_tps,
                );
            }
        }
    }
    Ok(())
}
