//! Which tokens of which sequences go into the next forward step.
//!
//! Decoding sequences come first and take one token each, so running streams keep
//! flowing; what is left of the step's token budget goes to prompts, in arrival order,
//! in chunks. A long prompt is thus absorbed over several steps while decodes continue.

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

#[cfg(test)]
mod tests {
    use super::*;

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
