//! Sampling: turns one row of logits into the next token id.
//!
//! The chain follows llama.cpp's order: logit bias, penalties, top-k, top-p, min-p,
//! temperature, then a draw from the remaining distribution. Temperature 0 is greedy.
//! Every sampler owns its random generator, seeded from the request, so a seed gives the
//! same tokens for the same logits whatever else the engine is running.

use spark_client::protocol::{SamplingParams, TokenLogprobs};

use super::{TextError, Tokenizer};

/// Checks every field, naming the one that is out of range.
pub fn validate(params: &SamplingParams, vocab_size: usize) -> Result<(), TextError> {
    let p = params;
    if !(p.temperature.is_finite() && p.temperature >= 0.0) {
        return Err(TextError::sampling(
            "temperature",
            format!("must be finite and >= 0, got {}", p.temperature),
        ));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return Err(TextError::sampling(
            "top_p",
            format!("must be in (0, 1], got {}", p.top_p),
        ));
    }
    if !(0.0..=1.0).contains(&p.min_p) {
        return Err(TextError::sampling(
            "min_p",
            format!("must be in [0, 1], got {}", p.min_p),
        ));
    }
    if !(p.repeat_penalty.is_finite() && p.repeat_penalty > 0.0) {
        return Err(TextError::sampling(
            "repeat_penalty",
            format!("must be finite and > 0, got {}", p.repeat_penalty),
        ));
    }
    for (field, v) in [
        ("presence_penalty", p.presence_penalty),
        ("frequency_penalty", p.frequency_penalty),
    ] {
        if !(-2.0..=2.0).contains(&v) {
            return Err(TextError::sampling(
                field,
                format!("must be in [-2, 2], got {v}"),
            ));
        }
    }
    for &(id, bias) in &p.logit_bias {
        if id as usize >= vocab_size {
            return Err(TextError::sampling(
                "logit_bias",
                format!("token id {id} is outside the vocabulary (size {vocab_size})"),
            ));
        }
        // -inf bans a token; +inf or NaN would poison the distribution.
        if bias.is_nan() || bias == f32::INFINITY {
            return Err(TextError::sampling(
                "logit_bias",
                format!("bias for token {id} must be finite or -inf, got {bias}"),
            ));
        }
    }
    Ok(())
}

/// What a request's output format lets come next (see [`super::constraint`]).
pub trait TokenFilter {
    /// Whether `token` may come next.
    fn allows(&mut self, token: u32) -> bool;
    /// Sets the logit of every token that may not come next to -inf; returns how many
    /// logits are left above -inf.
    fn mask(&mut self, logits: &mut [f32]) -> usize;
}

/// SplitMix64: tiny, fast and stable across library versions, so a seed reproduces the
/// same tokens after an upgrade.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// One request's sampler.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Rng,
    /// Reused buffers: candidates `(id, logit)` and the penalty window.
    candidates: Vec<(u32, f32)>,
    weights: Vec<f64>,
    window: Vec<u32>,
}

/// Candidate order: higher logit first, then lower id (so ties are deterministic).
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// NaN from a broken forward pass must not win or poison sums.
fn clean(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l
    }
}

impl Sampler {
    /// Validates `params`; a missing seed is drawn at random (see [`Sampler::seed`]).
    pub fn new(params: &SamplingParams, vocab_size: usize) -> Result<Self, TextError> {
        validate(params, vocab_size)?;
        let seed = params.seed.unwrap_or_else(rand::random);
        Ok(Self {
            params: params.clone(),
            seed,
            rng: Rng(seed),
            candidates: Vec::new(),
            weights: Vec::new(),
            window: Vec::new(),
        })
    }

    /// The seed in use, so that a run without one can be reproduced.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// When [`Sampler::sample`] is the argmax of the logits plus a bias (greedy, no
    /// penalty to apply and nothing drawn), that bias: `(token, value)` pairs, added in
    /// order, every id inside the vocabulary (validated). A backend may then add it and
    /// pick where the logits live.
    pub fn argmax_bias(&self) -> Option<&[(u32, f32)]> {
        let p = &self.params;
        let no_penalty = p.repeat_last_n == 0
            || (p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0);
        (p.temperature == 0.0 && no_penalty).then_some(&p.logit_bias[..])
    }

    /// Chooses the next token. `history` is the prompt plus the tokens generated so far
    /// (for penalties). Bias and penalties are applied to `logits` in place.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.sample_filtered(logits, history, None)
            .unwrap_or_else(|| argmax(logits))
    }

    /// [`Sampler::sample`] among the tokens `filter` allows (as if the others had been
    /// banned by a logit bias of -inf); `None` when it allows none that is not banned.
    pub fn sample_filtered(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        filter: Option<&mut dyn TokenFilter>,
    ) -> Option<u32> {
        self.apply_bias(logits);
        self.apply_penalties(logits, history);
        let greedy = self.params.temperature == 0.0;
        if let Some(filter) = filter {
            // Greedy: the model's own pick is usually allowed, and then it is the answer
            // without asking about the rest of the vocabulary.
            let best_allowed = greedy && {
                let best = argmax(logits);
                logits
                    .get(best as usize)
                    .is_some_and(|&l| l > f32::NEG_INFINITY)
                    && filter.allows(best)
            };
            if !best_allowed && filter.mask(logits) == 0 {
                return None;
            }
        }
        Some(if greedy {
            argmax(logits)
        } else {
            self.sample_stochastic(logits)
        })
    }

    /// [`Sampler::sample`] plus log-probabilities of the chosen token and the `top_n` most
    /// likely ones, computed on the logits as the model produced them.
    pub fn sample_with_logprobs(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        top_n: usize,
        tokenizer: &Tokenizer,
        filter: Option<&mut dyn TokenFilter>,
    ) -> Option<(u32, TokenLogprobs)> {
        let (lse, top) = log_softmax_top(logits, top_n);
        // Bias and penalties only touch these ids; keep their original logits so that the
        // chosen token's logprob is on the model's distribution.
        let window = &history[history
            .len()
            .saturating_sub(self.params.repeat_last_n as usize)..];
        let touched: Vec<(u32, f32)> = (self.params.logit_bias.iter().map(|b| b.0))
            .chain(window.iter().copied())
            .filter_map(|id| logits.get(id as usize).map(|&l| (id, l)))
            .collect();
        let id = self.sample_filtered(logits, history, filter)?;
        let original = touched
            .iter()
            .find(|t| t.0 == id)
            .map(|t| t.1)
            .or_else(|| logits.get(id as usize).copied());
        let logprob = original.map_or(f32::NEG_INFINITY, |l| clean(l) - lse);
        let top = top
            .into_iter()
            .map(|(t, lp)| (t, tokenizer.piece(t), lp))
            .collect();
        Some((id, TokenLogprobs { logprob, top }))
    }

    /// Log-probabilities of `chosen` and the `top_n` most likely tokens under `logits`
    /// (which should be the unmodified row).
    pub fn logprobs(
        &self,
        logits: &[f32],
        chosen: u32,
        top_n: usize,
        tokenizer: &Tokenizer,
    ) -> TokenLogprobs {
        let (lse, top) = log_softmax_top(logits, top_n);
        let logprob = logits
            .get(chosen as usize)
            .copied()
            .map_or(f32::NEG_INFINITY, |l| clean(l) - lse);
        let top = top
            .into_iter()
            .map(|(t, lp)| (t, tokenizer.piece(t), lp))
            .collect();
        TokenLogprobs { logprob, top }
    }

    fn apply_bias(&self, logits: &mut [f32]) {
        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
    }

    /// llama.cpp's penalties over the last `repeat_last_n` tokens of `history`: the
    /// repetition penalty divides positive logits and multiplies negative ones; presence
    /// and frequency subtract `present + count * frequency` (OpenAI's definitions).
    fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        let n = p.repeat_last_n as usize;
        if n == 0
            || (p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0)
        {
            return;
        }
        self.window.clear();
        self.window
            .extend_from_slice(&history[history.len().saturating_sub(n)..]);
        self.window.sort_unstable();
        for run in self.window.chunk_by(|a, b| a == b) {
            let Some(l) = logits.get_mut(run[0] as usize) else {
                continue;
            };
            if *l <= 0.0 {
                *l *= p.repeat_penalty;
            } else {
                *l /= p.repeat_penalty;
            }
            *l -= run.len() as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    fn sample_stochastic(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, clean(l))),
        );
        if cands.is_empty() {
            return 0;
        }

        // top-k: a partial selection, not a sort of the whole vocabulary.
        let k = p.top_k as usize;
        let mut sorted = false;
        if k > 0 && k < cands.len() {
            cands.select_nth_unstable_by(k - 1, by_logit_desc);
            cands.truncate(k);
            cands.sort_unstable_by(by_logit_desc);
            sorted = true;
        }

        let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            // Everything banned: fall back to the lowest id still in the set.
            return cands.iter().map(|c| c.0).min().unwrap_or(0);
        }

        // top-p on the distribution at temperature 1: the smallest set of most likely
        // tokens whose mass reaches `top_p`.
        if p.top_p < 1.0 {
            top_p_cut(cands, max, p.top_p, sorted);
        }

        // min-p: keep tokens at least `min_p` times as likely as the best one.
        if p.min_p > 0.0 {
            let floor = max + p.min_p.ln();
            cands.retain(|c| c.1 >= floor);
        }

        // Temperature, then a draw. Candidates are in a deterministic order here.
        let t = p.temperature;
        let weights = &mut self.weights;
        weights.clear();
        weights.extend(cands.iter().map(|c| f64::from((c.1 - max) / t).exp()));
        let total: f64 = weights.iter().sum();
        let mut r = self.rng.next_f64() * total;
        for (c, &w) in cands.iter().zip(weights.iter()) {
            r -= w;
            if r < 0.0 {
                return c.0;
            }
        }
        // Rounding left a sliver: the last candidate with any weight takes it.
        let last = cands
            .iter()
            .zip(weights.iter())
            .rev()
            .find(|(_, &w)| w > 0.0);
        last.map_or(cands[0].0, |(c, _)| c.0)
    }
}

/// Keeps the most likely candidates up to `top_p` of the mass (at least one). Unsorted
/// candidates are bucketed by logit so that only the bucket where the mass crosses the
/// threshold is sorted, instead of the whole vocabulary.
fn top_p_cut(cands: &mut Vec<(u32, f32)>, max: f32, top_p: f32, sorted: bool) {
    const BUCKETS: usize = 1024;
    let weight = |l: f32| f64::from(l - max).exp();
    let min = cands
        .iter()
        .map(|c| c.1)
        .filter(|l| l.is_finite())
        .fold(max, f32::min);
    let span = max - min;

    let mut cum = 0.0;
    if !sorted && span > 0.0 {
        // Bucket 0 holds the highest logits; a lower bucket means a strictly higher logit.
        let bucket_of =
            |l: f32| (((max - l) / span * (BUCKETS - 1) as f32) as usize).min(BUCKETS - 1);
        // One exp per candidate (the cost of this cut) gives both the buckets' mass and
        // the total, summed in candidate order.
        let mut mass = vec![0f64; BUCKETS];
        let mut total = 0.0;
        for c in cands.iter() {
            let w = weight(c.1);
            mass[bucket_of(c.1)] += w;
            total += w;
        }
        let target = f64::from(top_p) * total;
        let mut edge = BUCKETS - 1;
        for (b, &m) in mass.iter().enumerate() {
            if cum + m >= target {
                edge = b;
                break;
            }
            cum += m;
        }
        cands.retain(|c| bucket_of(c.1) <= edge);
        // The edge bucket goes last, in order; everything before it is kept whole.
        let mut first_edge = 0;
        for j in 0..cands.len() {
            if bucket_of(cands[j].1) < edge {
                cands.swap(first_edge, j);
                first_edge += 1;
            }
        }
        cands[first_edge..].sort_unstable_by(by_logit_desc);
        let cut = cands[first_edge..].iter().position(|c| {
            cum += weight(c.1);
            cum >= target
        });
        if let Some(i) = cut {
            cands.truncate(first_edge + i + 1);
        }
        return;
    }
    // Sorted already (top-k ran), or all logits equal and so in id order.
    let total: f64 = cands.iter().map(|c| weight(c.1)).sum();
    let target = f64::from(top_p) * total;
    let cut = cands.iter().position(|c| {
        cum += weight(c.1);
        cum >= target
    });
    if let Some(i) = cut {
        cands.truncate(i + 1);
    }
}

/// Greedy choice in one pass: the highest logit, the lowest id among equals.
fn argmax(logits: &[f32]) -> u32 {
    // Two simple passes vectorise; tracking the index in one pass does not.
    let best = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    logits.iter().position(|&l| l == best).unwrap_or(0) as u32
}

/// Log-sum-exp of the row and its `top_n` entries as `(id, logprob)`, most likely first.
fn log_softmax_top(logits: &[f32], top_n: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits
        .iter()
        .copied()
        .map(clean)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return (f32::NEG_INFINITY, Vec::new());
    }
    let sum: f64 = logits
        .iter()
        .map(|&l| f64::from(clean(l) - max).exp())
        .sum();
    let lse = max + sum.ln() as f32;
    let mut top: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, clean(l)))
        .collect();
    let n = top_n.min(top.len());
    if n == 0 {
        return (lse, Vec::new());
    }
    if n < top.len() {
        top.select_nth_unstable_by(n - 1, by_logit_desc);
        top.truncate(n);
    }
    top.sort_unstable_by(by_logit_desc);
    (lse, top.into_iter().map(|(i, l)| (i, l - lse)).collect())
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
