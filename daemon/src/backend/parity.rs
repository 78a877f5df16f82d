//! Parity of two backends on the same model: both run the same steps (prefill chunks of
//! several sequences, then batched decode with paged KV), fed the reference backend's
//! greedy tokens so that one flipped choice does not cascade, and every logit row is
//! compared. `sparkd gpu-parity` (GPU against CPU) and the emulator tests use it.

use crate::model::{BlockTable, KvFull, SeqInput};

use super::{Backend, BackendError};

/// What to run.
#[derive(Debug, Clone)]
pub struct ParityPlan {
    /// One prompt per sequence; all sequences run together in every step.
    pub prompts: Vec<Vec<u32>>,
    /// Most prompt tokens a sequence brings to one step (prefill chunking).
    pub chunk: usize,
    /// Steps that produce logits to run (the first ones may be prefill).
    pub steps: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ParityReport {
    /// Steps that produced logits.
    pub steps: usize,
    /// Max over compared rows of max|other - reference| / max|reference|.
    pub max_rel_err: f64,
    /// Steps in which every row's argmax agreed.
    pub greedy_matched: usize,
    /// Steps with a differing argmax where each difference was a near tie: the
    /// reference scores the other pick within [`NEAR_TIE`] (relative to its largest
    /// logit) of its own, i.e. inside the error bar the two backends may differ by.
    pub near_tie_steps: usize,
    /// Logit rows compared.
    pub rows: usize,
    /// Rows whose step ran more than one token per sequence somewhere (prefill path).
    pub prefill_rows: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("{0}")]
    Kv(#[from] KvFull),
    #[error("the plan has no prompts, or an empty one")]
    EmptyPlan,
}

/// Relative logit gap under which two different greedy picks count as a near tie.
pub const NEAR_TIE: f64 = 1e-2;

/// The CPU sampler's greedy rule: the lowest index of the largest value, NaNs ignored.
pub fn greedy(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// max|b - a| / max|a| (0 for two empty rows).
pub fn rel_err(reference: &[f32], other: &[f32]) -> f64 {
    let scale = reference
        .iter()
        .fold(0.0f64, |m, &v| m.max((v as f64).abs()));
    let mut diff = 0.0f64;
    for (&a, &b) in reference.iter().zip(other) {
        let d = (a as f64 - b as f64).abs();
        if d.is_nan() {
            // f64::max would drop it: a NaN where the reference has a number is the
            // worst mismatch there is.
            return f64::INFINITY;
        }
        diff = diff.max(d);
    }
    if diff == 0.0 {
        0.0
    } else if scale == 0.0 {
        f64::INFINITY
    } else {
        diff / scale
    }
}

struct Seq {
    tokens: Vec<u32>,
    n_cached: usize,
    table_ref: BlockTable,
    table_other: BlockTable,
}

/// Runs `plan` on both backends; `on_row(step, seq, rel_err, ref_argmax, other_argmax)`
/// sees every compared row. Tables are released at the end.
pub fn compare(
    reference: &mut dyn Backend,
    other: &mut dyn Backend,
    plan: &ParityPlan,
    mut on_row: impl FnMut(usize, usize, f64, u32, u32),
) -> Result<ParityReport, ParityError> {
    if plan.prompts.is_empty() || plan.prompts.iter().any(Vec::is_empty) {
        return Err(ParityError::EmptyPlan);
    }
    let mut seqs: Vec<Seq> = plan
        .prompts
        .iter()
        .map(|p| Seq {
            tokens: p.clone(),
            n_cached: 0,
            table_ref: BlockTable::default(),
            table_other: BlockTable::default(),
        })
        .collect();
    let mut report = ParityReport {
        steps: 0,
        max_rel_err: 0.0,
        greedy_matched: 0,
        near_tie_steps: 0,
        rows: 0,
        prefill_rows: 0,
    };
    let result = (|| {
        while report.steps < plan.steps {
            let take: Vec<usize> = seqs
                .iter()
                .map(|s| (s.tokens.len() - s.n_cached).min(plan.chunk.max(1)))
                .collect();
            for (s, &t) in seqs.iter_mut().zip(&take) {
                reference.reserve(&mut s.table_ref, s.n_cached + t)?;
                other.reserve(&mut s.table_other, s.n_cached + t)?;
            }
            let batch = |other_side: bool| -> Vec<SeqInput<'_>> {
                seqs.iter()
                    .zip(&take)
                    .map(|(s, &t)| SeqInput {
                        table: if other_side {
                            &s.table_other
                        } else {
                            &s.table_ref
                        },
                        tokens: &s.tokens[s.n_cached..s.n_cached + t],
                        start_pos: s.n_cached,
                        want_logits: s.n_cached + t == s.tokens.len(),
                        greedy: None,
                    })
                    .collect()
            };
            reference.forward(&batch(false))?;
            other.forward(&batch(true))?;
            let prefill = take.iter().any(|&t| t > 1);
            let mut row = 0;
            let mut all_match = true;
            let mut all_near = true;
            let mut any = false;
            for (i, (s, &t)) in seqs.iter_mut().zip(&take).enumerate() {
                s.n_cached += t;
                if s.n_cached < s.tokens.len() {
                    continue;
                }
                let a = reference.logits_mut(row).to_vec();
                let b = other.logits_mut(row);
                let err = rel_err(&a, b);
                let (ga, gb) = (greedy(&a), greedy(b));
                on_row(report.steps, i, err, ga, gb);
                report.max_rel_err = report.max_rel_err.max(err);
                report.rows += 1;
                report.prefill_rows += prefill as usize;
                all_match &= ga == gb;
                if ga != gb {
                    let scale = a.iter().fold(0.0f64, |m, &v| m.max((v as f64).abs()));
                    let gap = (a[ga as usize] as f64 - a[gb as usize] as f64).abs();
                    all_near &= scale > 0.0 && gap <= NEAR_TIE * scale;
                }
                any = true;
                s.tokens.push(ga);
                row += 1;
            }
            if any {
                report.steps += 1;
                report.greedy_matched += all_match as usize;
                report.near_tie_steps += (!all_match && all_near) as usize;
            }
        }
        Ok(())
    })();
    for s in &mut seqs {
        reference.release(&mut s.table_ref);
        other.release(&mut s.table_other);
    }
    result.map(|()| report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum_and_skips_nans() {
        assert_eq!(greedy(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(greedy(&[f32::NAN, -1.0, f32::NAN]), 1);
        assert_eq!(greedy(&[f32::NAN]), 0);
        assert_eq!(greedy(&[]), 0);
    }

    #[test]
    fn relative_error_is_scaled_by_the_reference_peak() {
        assert_eq!(rel_err(&[1.0, -4.0], &[1.0, -4.0]), 0.0);
        assert!((rel_err(&[1.0, -4.0], &[1.2, -4.0]) - 0.05).abs() < 1e-6);
        assert_eq!(rel_err(&[0.0], &[1.0]), f64::INFINITY);
        assert_eq!(rel_err(&[1.0], &[f32::NAN]), f64::INFINITY);
    }
}
