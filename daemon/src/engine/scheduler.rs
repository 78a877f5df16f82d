//! Which tokens of which sequences go into the next forward step.
//!
//! Decoding sequences come first and take one token each, so running streams keep
//! flowing; what is left of the step's token budget goes to prompts, in arrival order,
//! in chunks. A long prompt is thus absorbed over several steps while decodes continue.
//!
//! A decoding stream gets its next token only when the whole step ends, so a step that
//! carries a big prompt chunk stalls every stream in it for as long as the chunk takes.
//! [`StepPacer`] sizes the chunks of steps that carry decodes to a target duration,
//! from what recent steps cost per token; steps with nothing decoding take the full
//! budget.

use std::time::Duration;

use crate::model::BLOCK_TOKENS;

/// What the planner needs to know about a running sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// Tokens not yet in the KV cache.
    pub tokens: usize,
}

/// Returns, for each sequence (by index into `pending`), how many of its pending
/// tokens to feed this step; 0 means it sits this step out.
pub fn plan_step(pending: &[Pending], budget: usize) -> Vec<usize> {
    let mut take = vec![0; pending.len()];
    let mut left = budget.max(1);
    for (i, p) in pending.iter().enumerate() {
        if p.tokens == 1 {
            take[i] = 1;
            left = left.saturating_sub(1);
        }
    }
    for (i, p) in pending.iter().enumerate() {
        if p.tokens > 1 && left > 0 {
            take[i] = p.tokens.min(left);
            left -= take[i];
        }
    }
    take
}

/// Sizes the token budget of steps that carry decodes so that they take about `target`.
#[derive(Debug, Clone)]
pub struct StepPacer {
    target: Option<Duration>,
    /// Recent duration of a step per token it carried, in seconds (a moving average
    /// over steps with prompt chunks). It includes each step's fixed cost, so the
    /// chunks it sizes settle where a step takes `target`.
    per_token: Option<f64>,
}

impl StepPacer {
    /// `None`: every step takes the full budget.
    pub fn new(target: Option<Duration>) -> Self {
        StepPacer {
            target: target.filter(|t| !t.is_zero()),
            per_token: None,
        }
    }

    /// The token budget of the next step, at most `cap`: all of it when no sequence is
    /// decoding (or nothing has been measured yet), else what fits in the target, but
    /// never less than the decodes plus one block of prompt, so prompts still advance.
    pub fn budget(&self, cap: usize, decoding: usize) -> usize {
        let (Some(target), Some(per_token)) = (self.target, self.per_token) else {
            return cap;
        };
        if decoding == 0 {
            return cap;
        }
        let fits = (target.as_secs_f64() / per_token) as usize;
        fits.max(decoding + BLOCK_TOKENS).min(cap)
    }

    /// Books a step of `tokens` tokens, `prompt_tokens` of them from prompts, that took
    /// `elapsed`. Steps with less than a block of prompt say little about what a chunk
    /// costs (a decode-only step is bound by reading the weights) and are left out.
    pub fn record(&mut self, tokens: usize, prompt_tokens: usize, elapsed: Duration) {
        if prompt_tokens < BLOCK_TOKENS || tokens == 0 {
            return;
        }
        let per_token = elapsed.as_secs_f64() / tokens as f64;
        self.per_token = Some(match self.per_token {
            Some(avg) => 0.7 * avg + 0.3 * per_token,
            None => per_token,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_fits_chunks_to_the_target_only_while_streams_decode() {
        let ms = Duration::from_millis;
        let mut pacer = StepPacer::new(Some(ms(100)));
        assert_eq!(pacer.budget(512, 3), 512, "nothing measured yet");
        // 500 tokens in 1 s: 2 ms a token, so 50 fit in 100 ms.
        pacer.record(500, 500, ms(1000));
        assert_eq!(pacer.budget(512, 3), 50);
        assert_eq!(pacer.budget(512, 0), 512, "nobody waits on this step");
        assert_eq!(pacer.budget(40, 3), 40, "never past the cap");
        // However slow the steps, prompts still advance by a block.
        pacer.record(64, 64, ms(10_000));
        assert_eq!(pacer.budget(512, 10), 10 + BLOCK_TOKENS);
    }

    #[test]
    fn the_pacer_learns_from_prompt_steps_only_and_follows_them() {
        let ms = Duration::from_millis;
        let mut pacer = StepPacer::new(Some(ms(100)));
        pacer.record(8, 0, ms(50));
        assert_eq!(
            pacer.budget(512, 8),
            512,
            "decode-only steps are not samples"
        );
        pacer.record(100, 96, ms(100));
        assert_eq!(pacer.budget(512, 4), 100);
        // Steps got faster: the budget grows towards what now fits.
        for _ in 0..20 {
            pacer.record(100, 96, ms(50));
        }
        assert!((195..=200).contains(&pacer.budget(512, 4)));
        // Off: always the cap.
        let mut off = StepPacer::new(Some(Duration::ZERO));
        off.record(512, 512, ms(1000));
        assert_eq!(off.budget(512, 3), 512);
    }

    fn p(v: &[usize]) -> Vec<Pending> {
        v.iter().map(|&tokens| Pending { tokens }).collect()
    }

    #[test]
    fn decodes_always_run_and_prompts_share_the_rest_in_order() {
        assert_eq!(plan_step(&p(&[1, 300, 1, 400]), 256), vec![1, 254, 1, 0]);
        assert_eq!(plan_step(&p(&[1, 30, 1, 400]), 256), vec![1, 30, 1, 224]);
    }

    #[test]
    fn decodes_are_never_starved_by_a_small_budget() {
        assert_eq!(plan_step(&p(&[1, 1, 1, 50]), 2), vec![1, 1, 1, 0]);
    }

    #[test]
    fn finished_prompts_take_nothing() {
        assert_eq!(plan_step(&p(&[0, 5]), 16), vec![0, 5]);
        assert_eq!(plan_step(&p(&[]), 16), Vec::<usize>::new());
    }
}
