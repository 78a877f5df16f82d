//! The sparkd side of `spark bench`: concurrent streams, each on its own connection to
//! the running daemon, timed at the client as each frame arrives.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use futures::StreamExt;
use spark_client::protocol::{FinishReason, GenerateRequest, PromptInput, SamplingParams};
use spark_client::{Client, GenerationEvent};

use super::stats::StreamSample;

/// End-of-generation tokens a benchmark bans so every stream runs to `max_tokens`
/// (llama-server's `ignore_eos`; the protocol has no such flag, logit bias does it).
const END_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "</s>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
];

/// The ids of the model's end tokens among [`END_TOKENS`]: those that tokenize, with
/// special parsing, to exactly one token.
pub async fn end_token_ids(client: &Client) -> anyhow::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for text in END_TOKENS {
        let pieces = client.tokenize(text, true).await?;
        if let [one] = pieces.as_slice() {
            if one.piece == *text && !ids.contains(&one.id) {
                ids.push(one.id);
            }
        }
    }
    Ok(ids)
}

pub struct Load<'a> {
    pub socket: &'a Path,
    pub max_tokens: u32,
    pub banned: &'a [u32],
}

/// Runs `streams` generations at once and returns what each saw.
pub async fn run_level(
    load: &Load<'_>,
    prompts: &[String],
    streams: usize,
) -> anyhow::Result<Vec<StreamSample>> {
    // Connect first so that connection set-up is not part of anyone's time to first
    // token.
    let mut clients = Vec::with_capacity(streams);
    for _ in 0..streams {
        clients.push(
            Client::connect(load.socket)
                .await
                .with_context(|| format!("connecting to {}", load.socket.display()))?,
        );
    }
    let start = Instant::now();
    let tasks = clients.into_iter().enumerate().map(|(i, client)| {
        let request = GenerateRequest {
            id: client.next_request_id(),
            model: None,
            input: PromptInput::Raw {
                text: prompts[i % prompts.len()].clone(),
                special: false,
            },
            sampling: SamplingParams {
                logit_bias: load
                    .banned
                    .iter()
                    .map(|&id| (id, f32::NEG_INFINITY))
                    .collect(),
                ..SamplingParams::default()
            },
            max_tokens: Some(load.max_tokens),
            stop: Vec::new(),
            logprobs: None,
        };
        one_stream(client, request, start)
    });
    futures::future::join_all(tasks).await.into_iter().collect()
}

async fn one_stream(
    client: Client,
    request: GenerateRequest,
    start: Instant,
) -> anyhow::Result<StreamSample> {
    let mut sample = StreamSample {
        sent_s: start.elapsed().as_secs_f64(),
        ..StreamSample::default()
    };
    let mut generation = client.generate(request).await?;
    while let Some(event) = generation.next().await {
        let now = start.elapsed().as_secs_f64();
        match event? {
            // The bench offers no tools and asks for no logprobs.
            GenerationEvent::Prefilled(_)
            | GenerationEvent::ToolCall(_)
            | GenerationEvent::ToolCallDelta(_)
            | GenerationEvent::TokenBytes(_) => {}
            // Each token's Reasoning event is followed by its Token event.
            GenerationEvent::Reasoning(_) => {}
            GenerationEvent::Token(_) => sample.token_arrived(now),
            GenerationEvent::Done(done) => {
                sample.done_s = now;
                if !matches!(
                    done.finish_reason,
                    FinishReason::Length | FinishReason::Stop
                ) {
                    bail!("a stream ended with {:?}", done.finish_reason);
                }
                if done.usage.completion_tokens != sample.tokens {
                    bail!(
                        "the daemon counted {} tokens, the client received {}",
                        done.usage.completion_tokens,
                        sample.tokens
                    );
                }
                sample.server_decode_tps = done.timings.decode_tps;
                sample.server_ttft_ms = done.timings.ttft_ms;
                return Ok(sample);
            }
        }
    }
    bail!("the stream ended without its final frame")
}
