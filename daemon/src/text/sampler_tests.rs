//! Sampler behaviour: validation, greedy choice, penalties, filters, seeding, logprobs.

use super::*;
use crate::text::tokenizer::tests::bpe_spec;

fn params() -> SamplingParams {
    SamplingParams {
        seed: Some(7),
        ..SamplingParams::default()
    }
}

fn sampler(p: SamplingParams) -> Sampler {
    Sampler::new(&p, 1000).expect("valid params")
}

/// Draws `n` tokens from fresh copies of `logits` and counts them per id.
fn histogram(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
    let mut counts = vec![0; logits.len()];
    for _ in 0..n {
        let mut row = logits.to_vec();
        counts[s.sample(&mut row, &[]) as usize] += 1;
    }
    counts
}

#[test]
fn validation_names_the_field() {
    assert!(validate(&SamplingParams::default(), 10).is_ok());
    let cases: Vec<(&str, SamplingParams)> = vec![
        (
            "temperature",
            SamplingParams {
                temperature: -0.5,
                ..params()
            },
        ),
        (
            "temperature",
            SamplingParams {
                temperature: f32::NAN,
                ..params()
            },
        ),
        (
            "temperature",
            SamplingParams {
                temperature: f32::INFINITY,
                ..params()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: 0.0,
                ..params()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: 1.5,
                ..params()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: f32::NAN,
                ..params()
            },
        ),
        (
            "min_p",
            SamplingParams {
                min_p: -0.1,
                ..params()
            },
        ),
        (
            "min_p",
            SamplingParams {
                min_p: 1.1,
                ..params()
            },
        ),
        (
            "repeat_penalty",
            SamplingParams {
                repeat_penalty: 0.0,
                ..params()
            },
        ),
        (
            "presence_penalty",
            SamplingParams {
                presence_penalty: 2.5,
                ..params()
            },
        ),
        (
            "frequency_penalty",
            SamplingParams {
                frequency_penalty: -3.0,
                ..params()
            },
        ),
        (
            "frequency_penalty",
            SamplingParams {
                frequency_penalty: f32::NAN,
                ..params()
            },
        ),
        (
            "logit_bias",
            SamplingParams {
                logit_bias: vec![(10, 1.0)],
                ..params()
            },
        ),
        (
            "logit_bias",
            SamplingParams {
                logit_bias: vec![(1, f32::NAN)],
                ..params()
            },
        ),
    ];
    for (field, p) in cases {
        let err = validate(&p, 10).expect_err(field);
        assert!(
            matches!(&err, TextError::InvalidSampling { field: f, .. } if *f == field),
            "{field}: {err}"
        );
        assert!(err.to_string().contains(field), "{err}");
    }
    // Banning a token with -inf is allowed.
    assert!(validate(
        &SamplingParams {
            logit_bias: vec![(3, f32::NEG_INFINITY)],
            ..params()
        },
        10
    )
    .is_ok());
}

#[test]
fn greedy_takes_the_highest_logit_and_the_lowest_id_on_ties() {
    let mut s = sampler(params());
    assert_eq!(s.sample(&mut [0.1, 3.0, -2.0, 3.0], &[]), 1);
    assert_eq!(s.sample(&mut [f32::NAN, 0.5, 0.2], &[]), 1);
    let mut s = sampler(SamplingParams {
        logit_bias: vec![(2, 10.0), (1, f32::NEG_INFINITY)],
        ..params()
    });
    assert_eq!(s.sample(&mut [0.0, 5.0, 0.0], &[]), 2);
}

#[test]
fn penalties_follow_llama_cpp() {
    let p = SamplingParams {
        repeat_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..params()
    };
    let mut s = sampler(p);
    let mut logits = [2.0, -1.0, 0.5];
    let chosen = s.sample(&mut logits, &[0, 0, 1]);
    // 0: 2/2 - (2 * 0.5 + 0.25); 1: -1 * 2 - (0.5 + 0.25); 2: untouched.
    assert_eq!(logits, [-0.25, -2.75, 0.5]);
    assert_eq!(chosen, 2);
}

#[test]
fn penalties_only_look_at_the_last_n_tokens() {
    let p = SamplingParams {
        repeat_penalty: 4.0,
        repeat_last_n: 2,
        ..params()
    };
    let mut s = sampler(p);
    let mut logits = [2.0, 1.0, 1.0];
    // Token 0 is outside the window of the last two tokens.
    s.sample(&mut logits, &[0, 1, 2]);
    assert_eq!(logits, [2.0, 0.25, 0.25]);
    let mut s = sampler(SamplingParams {
        repeat_penalty: 4.0,
        repeat_last_n: 0,
        ..params()
    });
    let mut logits = [2.0, 1.0];
    s.sample(&mut logits, &[0, 1]);
    assert_eq!(logits, [2.0, 1.0]);
}

#[test]
fn same_seed_same_tokens_whatever_else_runs() {
    let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
    let p = SamplingParams {
        temperature: 1.0,
        ..params()
    };
    let run = |s: &mut Sampler| -> Vec<u32> {
        (0..40)
            .map(|_| s.sample(&mut logits.clone(), &[]))
            .collect()
    };
    let alone = run(&mut sampler(p.clone()));
    // Interleave with another sampler: each keeps its own stream.
    let (mut a, mut b) = (
        sampler(p.clone()),
        sampler(SamplingParams {
            seed: Some(8),
            ..p.clone()
        }),
    );
    let mut interleaved = Vec::new();
    for _ in 0..40 {
        interleaved.push(a.sample(&mut logits.clone(), &[]));
        b.sample(&mut logits.clone(), &[]);
    }
    assert_eq!(alone, interleaved);
    let other = run(&mut sampler(SamplingParams { seed: Some(8), ..p }));
    assert_ne!(alone, other, "different seeds should give different draws");
}

#[test]
fn missing_seed_is_drawn_and_reported() {
    let p = SamplingParams {
        seed: None,
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let s = Sampler::new(&p, 10).unwrap();
    let logits: Vec<f32> = (0..10).map(|i| i as f32 * 0.1).collect();
    let replay = SamplingParams {
        seed: Some(s.seed()),
        ..p
    };
    let (mut a, mut b) = (s, Sampler::new(&replay, 10).unwrap());
    for _ in 0..20 {
        assert_eq!(
            a.sample(&mut logits.clone(), &[]),
            b.sample(&mut logits.clone(), &[])
        );
    }
}

#[test]
fn draws_follow_the_softmax_distribution() {
    let logits = [0.0f32, 1.0, 2.0, -1.0];
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        ..params()
    });
    let n = 40_000;
    let counts = histogram(&mut s, &logits, n);
    let z: f32 = logits.iter().map(|l| l.exp()).sum();
    for (i, &c) in counts.iter().enumerate() {
        let want = logits[i].exp() / z;
        let got = c as f32 / n as f32;
        assert!((got - want).abs() < 0.01, "token {i}: {got} vs {want}");
    }
    // A low temperature sharpens the distribution towards the best token.
    let mut cold = sampler(SamplingParams {
        temperature: 0.25,
        ..params()
    });
    let counts = histogram(&mut cold, &logits, 2000);
    assert!(counts[2] > 1900, "{counts:?}");
}

#[test]
fn top_k_top_p_and_min_p_cut_the_tail() {
    let logits = [0.5f32.ln(), 0.3f32.ln(), 0.15f32.ln(), 0.05f32.ln()];
    let hot = |extra: SamplingParams| {
        sampler(SamplingParams {
            temperature: 1.0,
            ..extra
        })
    };

    let counts = histogram(
        &mut hot(SamplingParams {
            top_k: 2,
            ..params()
        }),
        &logits,
        4000,
    );
    assert!(
        counts[0] > 0 && counts[1] > 0 && counts[2] == 0 && counts[3] == 0,
        "{counts:?}"
    );

    // 0.5 + 0.3 reaches 0.7: the two best stay.
    let counts = histogram(
        &mut hot(SamplingParams {
            top_p: 0.7,
            ..params()
        }),
        &logits,
        4000,
    );
    assert!(
        counts[0] > 0 && counts[1] > 0 && counts[2] == 0 && counts[3] == 0,
        "{counts:?}"
    );
    let counts = histogram(
        &mut hot(SamplingParams {
            top_p: 0.81,
            ..params()
        }),
        &logits,
        4000,
    );
    assert!(counts[2] > 0 && counts[3] == 0, "{counts:?}");

    // min_p 0.25: tokens below 0.125 (a quarter of the best) go.
    let counts = histogram(
        &mut hot(SamplingParams {
            min_p: 0.25,
            ..params()
        }),
        &logits,
        4000,
    );
    assert!(counts[2] > 0 && counts[3] == 0, "{counts:?}");
}

#[test]
fn top_p_over_a_large_vocabulary() {
    // 150k tokens, a handful of likely ones: the growing sorted head must find them.
    let mut logits = vec![-10.0f32; 150_000];
    for (i, id) in [149_999usize, 3, 70_000, 500].iter().enumerate() {
        logits[*id] = 10.0 - i as f32;
    }
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_p: 0.9,
        ..params()
    });
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..300 {
        seen.insert(s.sample(&mut logits.clone(), &[]));
    }
    assert!(
        seen.contains(&149_999) && seen.iter().all(|id| [149_999, 3, 70_000, 500].contains(id)),
        "{seen:?}"
    );
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_k: 2,
        ..params()
    });
    for _ in 0..100 {
        assert!([149_999, 3].contains(&s.sample(&mut logits.clone(), &[])));
    }
}

#[test]
fn logprobs_are_on_the_unmodified_distribution() {
    let tok = Tokenizer::new(bpe_spec("gpt-2")).unwrap();
    let n = tok.vocab_size();
    let mut logits: Vec<f32> = (0..n).map(|i| (i as f32 * 0.01).cos()).collect();
    let z: f32 = logits.iter().map(|l| l.exp()).sum();
    let mut s = Sampler::new(
        &SamplingParams {
            logit_bias: vec![(5, 100.0)],
            ..params()
        },
        n,
    )
    .unwrap();
    let original = logits.clone();
    let (id, lp) = s
        .sample_with_logprobs(&mut logits, &[], 3, &tok, None)
        .unwrap();
    assert_eq!(id, 5, "the bias forces token 5");
    assert!(
        (lp.logprob - (original[5].exp() / z).ln()).abs() < 1e-4,
        "{}",
        lp.logprob
    );
    assert_eq!(lp.top.len(), 3);
    assert_eq!(lp.top[0].0, 0, "cos is largest at 0");
    assert!(lp.top.windows(2).all(|w| w[0].2 >= w[1].2));
    assert_eq!(lp.top[1].1, tok.piece(lp.top[1].0));
    let again = s.logprobs(&original, 0, 3, &tok);
    assert!((again.logprob - lp.top[0].2).abs() < 1e-6);
}

#[test]
fn bucketed_top_p_keeps_the_same_set_as_a_full_sort() {
    let mut rng = Rng(42);
    for trial in 0..200 {
        let n = 1 + (rng.next_u64() % 3000) as usize;
        let spread = 1.0 + (rng.next_f64() * 20.0) as f32;
        let logits: Vec<f32> = (0..n)
            .map(|_| (rng.next_f64() as f32 - 0.5) * spread)
            .collect();
        let top_p = 0.05 + rng.next_f64() as f32 * 0.9;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);

        let mut reference: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        reference.sort_unstable_by(by_logit_desc);
        top_p_cut(&mut reference, max, top_p, true);

        let mut bucketed: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        top_p_cut(&mut bucketed, max, top_p, false);

        let mut a: Vec<u32> = reference.iter().map(|c| c.0).collect();
        let mut b: Vec<u32> = bucketed.iter().map(|c| c.0).collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "trial {trial}: n {n}, top_p {top_p}");
    }
}

/// `argmax_bias` promises that `sample` is the argmax of the logits plus that bias, so
/// a backend may pick it where the logits live: `Some` exactly when nothing else edits
/// them first and no randomness is drawn.
#[test]
fn argmax_bias_means_the_argmax_of_the_biased_logits() {
    let history = [3u32, 3, 5];
    let mut logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 * 0.1).collect();
    logits[3] = 10.05; // just above the rest (at most 10.0)
    let argmax = 3;
    let biased = |bias: Vec<(u32, f32)>| SamplingParams {
        logit_bias: bias,
        ..params()
    };
    // (params, the pick when the bias rule holds, None when it does not)
    let cases: Vec<(SamplingParams, Option<u32>)> = vec![
        (params(), Some(argmax)),
        (
            SamplingParams {
                repeat_last_n: 0,
                repeat_penalty: 2.0,
                ..params()
            },
            Some(argmax),
        ),
        (biased(vec![(4, 50.0)]), Some(4)),
        // Banned: the next best (10.0, first at id 30) wins.
        (biased(vec![(3, f32::NEG_INFINITY), (7, 0.1)]), Some(30)),
        // A second entry for the same token adds to the first.
        (biased(vec![(9, 4.0), (9, 3.1)]), Some(9)),
        (
            SamplingParams {
                temperature: 0.5,
                ..params()
            },
            None,
        ),
        (
            SamplingParams {
                repeat_penalty: 1.5,
                ..params()
            },
            None,
        ),
        (
            SamplingParams {
                presence_penalty: 2.0,
                ..params()
            },
            None,
        ),
        (
            SamplingParams {
                frequency_penalty: 2.0,
                ..params()
            },
            None,
        ),
    ];
    for (p, want) in cases {
        let mut s = sampler(p.clone());
        let bias = s.argmax_bias().map(<[_]>::to_vec);
        assert_eq!(bias.is_some(), want.is_some(), "{p:?}");
        let Some(bias) = bias else { continue };
        assert_eq!(bias, p.logit_bias, "{p:?}");
        let mut by_hand = logits.clone();
        for &(id, b) in &bias {
            by_hand[id as usize] += b;
        }
        let picked = s.sample(&mut logits.clone(), &history);
        assert_eq!(Some(picked), want, "{p:?}");
        assert_eq!(picked, super::argmax(&by_hand), "{p:?}");
    }
}

/// Allows the ids `allowed` says, counting how often it was asked.
struct SetFilter {
    allowed: fn(u32) -> bool,
    asked: usize,
    masked: usize,
}

impl SetFilter {
    fn new(allowed: fn(u32) -> bool) -> Self {
        Self {
            allowed,
            asked: 0,
            masked: 0,
        }
    }
}

impl TokenFilter for SetFilter {
    fn allows(&mut self, token: u32) -> bool {
        self.asked += 1;
        (self.allowed)(token)
    }

    fn mask(&mut self, logits: &mut [f32]) -> usize {
        self.masked += 1;
        let mut left = 0;
        for (id, l) in logits.iter_mut().enumerate() {
            if !(self.allowed)(id as u32) {
                *l = f32::NEG_INFINITY;
            } else if *l > f32::NEG_INFINITY {
                left += 1;
            }
        }
        left
    }
}

#[test]
fn greedy_with_a_filter_takes_the_best_allowed_token_and_masks_only_when_it_must() {
    let logits: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let mut s = sampler(params());
    // The best token (99) is allowed: one question, no mask.
    let mut f = SetFilter::new(|_| true);
    let pick = s.sample_filtered(&mut logits.clone(), &[], Some(&mut f));
    assert_eq!((pick, f.asked, f.masked), (Some(99), 1, 0));
    // Odd ids banned: the best even one, found through the mask.
    let mut f = SetFilter::new(|id| id % 2 == 0);
    let pick = s.sample_filtered(&mut logits.clone(), &[], Some(&mut f));
    assert_eq!((pick, f.masked), (Some(98), 1));
}

#[test]
fn sampling_with_a_filter_never_draws_a_refused_token() {
    let logits = vec![0.0f32; 64];
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        ..params()
    });
    let mut seen = [0usize; 64];
    for _ in 0..2000 {
        let mut f = SetFilter::new(|id| id % 3 == 0);
        let id = s
            .sample_filtered(&mut logits.clone(), &[], Some(&mut f))
            .unwrap();
        seen[id as usize] += 1;
    }
    for (id, &n) in seen.iter().enumerate() {
        // 22 allowed ids, about 90 draws each.
        assert_eq!(n > 0, id % 3 == 0, "id {id} drawn {n} times");
    }
}

#[test]
fn a_filter_that_leaves_nothing_gives_no_token() {
    let mut s = sampler(params());
    let mut f = SetFilter::new(|_| false);
    assert_eq!(s.sample_filtered(&mut [1.0; 10], &[], Some(&mut f)), None);
    // What it allows but a logit bias bans does not count.
    let mut s = sampler(SamplingParams {
        logit_bias: vec![(4, f32::NEG_INFINITY)],
        temperature: 0.8,
        ..params()
    });
    let mut f = SetFilter::new(|id| id == 4);
    assert_eq!(s.sample_filtered(&mut [1.0; 10], &[], Some(&mut f)), None);
}

#[test]
fn logprobs_with_a_filter_stay_on_the_model_distribution() {
    let tok = Tokenizer::new(bpe_spec("gpt-2")).unwrap();
    let n = tok.vocab_size();
    let logits: Vec<f32> = (0..n).map(|i| (i as f32 * 0.01).cos()).collect();
    let z: f32 = logits.iter().map(|l| l.exp()).sum();
    let mut s = Sampler::new(&params(), n).unwrap();
    let mut f = SetFilter::new(|id| id == 7);
    let (id, lp) = s
        .sample_with_logprobs(&mut logits.clone(), &[], 2, &tok, Some(&mut f))
        .unwrap();
    assert_eq!(id, 7);
    assert!((lp.logprob - (logits[7].exp() / z).ln()).abs() < 1e-4);
    assert_eq!(lp.top[0].0, 0, "the top alternatives ignore the filter");
}
