//! The requests of a load run, drawn up front from a seeded RNG so that a run can be
//! repeated exactly: prompts of random length, random sampling settings, and for some
//! requests a point at which the client cancels or hangs up.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use spark_client::protocol::{ChatMessage, GenerateRequest, PromptInput, SamplingParams};

/// What the client does with a request once it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Reads to the end.
    Complete,
    /// Sends `Cancel` after this many tokens (0: right after the request), then reads
    /// on to the `Done`.
    Cancel { after: u32 },
    /// Drops the connection after this many tokens (0: right after the request).
    Disconnect { after: u32 },
}

#[derive(Debug, Clone)]
pub struct Planned {
    pub request: GenerateRequest,
    pub action: Action,
}

/// The shape of the random requests.
#[derive(Debug, Clone)]
pub struct PlanShape {
    /// Requests that are cancelled or disconnected, half each.
    pub cancel_fraction: f64,
    /// `max_tokens` is drawn from `1..=max_tokens`.
    pub max_tokens: u32,
    /// Prompts have `1..=max_prompt_words` words.
    pub max_prompt_words: usize,
}

impl Default for PlanShape {
    fn default() -> Self {
        Self {
            cancel_fraction: 0.2,
            max_tokens: 64,
            max_prompt_words: 40,
        }
    }
}

/// Words mixed into prompts; some are multi-byte so that UTF-8 is exercised too.
const WORDS: &[&str] = &[
    "the",
    "daemon",
    "serves",
    "tokens",
    "over",
    "a",
    "socket",
    "while",
    "many",
    "clients",
    "stream",
    "and",
    "cancel",
    "their",
    "requests",
    "café",
    "naïve",
    "日本語",
    "emoji",
    "🚀",
    "quick",
    "brown",
    "fox",
    "jumps",
    "lazy",
    "dog",
    "batch",
    "cache",
    "block",
];

/// `count` requests with ids `first_id..first_id + count`.
pub fn plan(seed: u64, first_id: u64, count: usize, shape: &PlanShape) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count as u64)
        .map(|i| planned(&mut rng, first_id + i, shape))
        .collect()
}

fn planned(rng: &mut StdRng, id: u64, shape: &PlanShape) -> Planned {
    let max_tokens = rng.gen_range(1..=shape.max_tokens.max(1));
    let action = if rng.gen_bool(shape.cancel_fraction.clamp(0.0, 1.0)) {
        // Somewhere inside the answer, sometimes before the first token.
        let after = rng.gen_range(0..max_tokens.max(1));
        if rng.gen_bool(0.5) {
            Action::Cancel { after }
        } else {
            Action::Disconnect { after }
        }
    } else {
        Action::Complete
    };
    let request = GenerateRequest {
        id,
        model: None,
        input: prompt(rng, shape.max_prompt_words),
        sampling: sampling(rng),
        max_tokens: Some(max_tokens),
        stop: if rng.gen_bool(0.1) {
            vec!["th".into(), "\n\n".into()]
        } else {
            Vec::new()
        },
        logprobs: rng.gen_bool(0.2).then(|| rng.gen_range(0..=5)),
    };
    Planned { request, action }
}

fn words(rng: &mut StdRng, max: usize) -> String {
    let n = rng.gen_range(1..=max.max(1));
    (0..n)
        .map(|_| *WORDS.choose(rng).unwrap_or(&"word"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn prompt(rng: &mut StdRng, max_words: usize) -> PromptInput {
    if rng.gen_bool(0.3) {
        let mut messages = Vec::new();
        if rng.gen_bool(0.5) {
            messages.push(ChatMessage::new("system", "Answer briefly."));
        }
        messages.push(ChatMessage::new("user", words(rng, max_words)));
        PromptInput::Chat { messages }
    } else {
        PromptInput::Raw {
            text: words(rng, max_words),
            special: false,
        }
    }
}

fn sampling(rng: &mut StdRng) -> SamplingParams {
    let greedy = rng.gen_bool(0.4);
    SamplingParams {
        temperature: if greedy { 0.0 } else { rng.gen_range(0.1..1.5) },
        top_k: *[0, 1, 5, 40].choose(rng).unwrap_or(&0),
        top_p: *[1.0, 0.95, 0.5].choose(rng).unwrap_or(&1.0),
        min_p: *[0.0, 0.05].choose(rng).unwrap_or(&0.0),
        repeat_penalty: *[1.0, 1.1].choose(rng).unwrap_or(&1.0),
        repeat_last_n: 64,
        presence_penalty: if rng.gen_bool(0.1) { 0.5 } else { 0.0 },
        frequency_penalty: if rng.gen_bool(0.1) { -0.5 } else { 0.0 },
        seed: Some(rng.gen()),
        // Byte tokens exist in every byte-level vocabulary.
        logit_bias: if rng.gen_bool(0.1) {
            vec![(rng.gen_range(32..128), 5.0)]
        } else {
            Vec::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_plan_and_the_mix_follows_the_fraction() {
        let shape = PlanShape::default();
        let a = plan(7, 1, 2000, &shape);
        let b = plan(7, 1, 2000, &shape);
        assert_eq!(
            a.iter().map(|p| (&p.request, p.action)).collect::<Vec<_>>(),
            b.iter().map(|p| (&p.request, p.action)).collect::<Vec<_>>()
        );
        let stopped = a.iter().filter(|p| p.action != Action::Complete).count();
        assert!((300..500).contains(&stopped), "{stopped} of 2000");
        let ids: Vec<u64> = a.iter().map(|p| p.request.id).collect();
        assert_eq!(ids, (1..=2000).collect::<Vec<_>>());
        for p in &a {
            let max = p.request.max_tokens.unwrap();
            assert!((1..=shape.max_tokens).contains(&max));
            if let Action::Cancel { after } | Action::Disconnect { after } = p.action {
                assert!(after < max);
            }
        }
        assert_ne!(
            plan(8, 1, 10, &shape)[0].request,
            a[0].request,
            "another seed, another plan"
        );
    }
}
