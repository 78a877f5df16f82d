//! The per-layer kernels (RMSNorm, RoPE and the KV write, SwiGLU, decode and prefill
//! attention, argmax), run on the CPU emulator (kernels/emu) and checked against plain
//! f64 references of what daemon/src/model computes. Skips without a C++ compiler.

mod common;

use common::*;
use half::f16;
use sparkd_kernels::consts::{
    ATTN_DECODE_THREADS, ATTN_PARTITION, ATTN_PREFILL_QUERIES, ATTN_PREFILL_TC_QUERIES,
    ATTN_PREFILL_TC_THREADS, ATTN_PREFILL_THREADS, KV_BLOCK_TOKENS,
};
use sparkd_kernels::emu::{Arg, Emulator};
use sparkd_kernels::names::{self, KvType};

#[test]
fn rmsnorm_matches_the_reference_in_place_and_to_f16() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(11);
    let (rows, n, eps) = (3, 576, 1e-5f32);
    let x = rng.vec(rows * n, 3.0);
    let w = rng.vec(n, 1.5);
    let reference = |x: &[f32]| {
        let mut want = vec![0.0f64; rows * n];
        let mut mag = vec![0.0f64; rows * n];
        for r in 0..rows {
            let row = &x[r * n..(r + 1) * n];
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let scale = 1.0 / (ms + eps as f64).sqrt();
            for i in 0..n {
                want[r * n + i] = row[i] as f64 * scale * w[i] as f64;
                mag[r * n + i] = want[r * n + i].abs().max(1e-3);
            }
        }
        (want, mag)
    };

    // Plain, in place (out == x), as Qwen3's per-head norm uses it.
    let mut xb = f32_bytes(&x);
    let mut wb = f32_bytes(&w);
    let mut inplace = xb.clone();
    emu.launch(
        names::RMSNORM,
        [rows as u32, 1, 1],
        [128, 1, 1],
        &mut [
            Arg::Buf(&mut xb),
            Arg::Buf(&mut wb),
            Arg::Buf(&mut inplace),
            Arg::I32(n as i32),
            Arg::F32(eps),
        ],
    )
    .unwrap();
    let (want, mag) = reference(&x);
    assert_close("rmsnorm", &bytes_f32(&inplace), &want, &mag, 1e-5);

    // To f16 (the tensor-core operand): the f32 result rounded to nearest even.
    let mut xb = f32_bytes(&x);
    let mut out16 = vec![0u8; rows * n * 2];
    emu.launch(
        names::RMSNORM_F16,
        [rows as u32, 1, 1],
        [128, 1, 1], // as the f32 run: the same order of the sum, the same scale
        &mut [
            Arg::Buf(&mut xb),
            Arg::Buf(&mut wb),
            Arg::Buf(&mut out16),
            Arg::I32(n as i32),
            Arg::F32(eps),
        ],
    )
    .unwrap();
    assert_eq!(bytes_f32(&xb), x, "x is left as it was");
    assert_eq!(
        f16s(&out16),
        f16_rounded(&bytes_f32(&inplace)),
        "rmsnorm_f16"
    );
}

#[test]
fn rope_kv_write_rotates_q_in_place_and_k_into_the_cache_beside_v() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(12);
    let (n_tok, nq, nkv, hd) = (3, 4, 2, 64);
    let kv_dim = nkv * hd;
    let n_pairs = 24; // partial rotary: dims 48..64 pass through
    let pos = [0i32, 7, 100_000];
    // Token 1 is padding: its keys and values go nowhere.
    let slots = [5i32, -1, 17];
    let n_slots = 2 * KV_BLOCK_TOKENS;
    let inv: Vec<f32> = (0..n_pairs)
        .map(|i| 10_000f32.powf(-2.0 * i as f32 / (2 * n_pairs) as f32))
        .collect();
    // (neox, linear scale, magnitude, temperature scale, temperature floor): plain,
    // linear scaling on NEOX, and YaRN's magnitude with Ministral 3's temperature, whose
    // floor of 5 positions leaves token 0 alone and grows tokens 1 and 2; then all of
    // them at once on NEOX.
    for (neox, scale, magnitude, temp_scale, temp_floor) in [
        (0, 1.0f32, 1.0f32, 0.0f32, 1i32),
        (1, 4.0, 1.0, 0.0, 1),
        (0, 1.0, 1.277, 0.1, 5),
        (1, 2.0, 0.9, 0.2, 3),
    ] {
        let temperature = |tpos: i32| -> f64 {
            if temp_scale == 0.0 {
                1.0
            } else {
                ((tpos / temp_floor) as f64 + 1.0).ln() * temp_scale as f64 + 1.0
            }
        };
        let q = rng.vec(n_tok * nq * hd, 1.0);
        let k = rng.vec(n_tok * kv_dim, 1.0);
        let v = rng.vec(n_tok * kv_dim, 1.0);
        let (mut qb, mut kb, mut vb) = (f32_bytes(&q), f32_bytes(&k), f32_bytes(&v));
        let mut k_cache = f32_bytes(&vec![f32::NAN; n_slots * kv_dim]);
        let mut v_cache = k_cache.clone();
        emu.launch(
            &names::rope_kv_write(KvType::F32),
            [2, 1, 1],
            [64, 1, 1],
            &mut [
                Arg::Buf(&mut qb),
                Arg::Buf(&mut kb),
                Arg::Buf(&mut vb),
                Arg::Buf(&mut k_cache),
                Arg::Buf(&mut v_cache),
                Arg::Buf(&mut i32_bytes(&pos)),
                Arg::Buf(&mut i32_bytes(&slots)),
                Arg::Buf(&mut f32_bytes(&inv)),
                Arg::I32(n_tok as i32),
                Arg::I32(nq as i32),
                Arg::I32(nkv as i32),
                Arg::I32(hd as i32),
                Arg::I32(n_pairs as i32),
                Arg::F32(scale),
                Arg::I32(neox),
                Arg::F32(magnitude),
                Arg::F32(temp_scale),
                Arg::I32(temp_floor),
            ],
        )
        .unwrap();
        assert_eq!(bytes_f32(&kb), k, "k is read, not rotated in memory");
        assert_eq!(bytes_f32(&vb), v);
        let rotated = |orig: &[f32], tpos: i32| -> Vec<f64> {
            let mut want: Vec<f64> = orig.iter().map(|&v| v as f64).collect();
            for (i, &f) in inv.iter().enumerate() {
                // The angle is formed in f32, as the CPU does.
                let angle = (tpos as f32 / scale * f) as f64;
                let (a, b) = if neox == 1 {
                    (i, i + n_pairs)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (orig[a] as f64, orig[b] as f64);
                let m = magnitude as f64;
                want[a] = (x0 * angle.cos() - x1 * angle.sin()) * m;
                want[b] = (x0 * angle.sin() + x1 * angle.cos()) * m;
            }
            want
        };
        let (got_q, got_k, got_v) = (bytes_f32(&qb), bytes_f32(&k_cache), bytes_f32(&v_cache));
        for (t, &tpos) in pos.iter().enumerate() {
            for h in 0..nq {
                let o = (t * nq + h) * hd;
                let what = format!("q neox={neox} magnitude={magnitude} token {t} head {h}");
                let temp = temperature(tpos);
                let want: Vec<f64> = rotated(&q[o..o + hd], tpos)
                    .into_iter()
                    .map(|x| x * temp)
                    .collect();
                assert_close(&what, &got_q[o..o + hd], &want, &[1.0; 64], 1e-5);
                if temp == 1.0 {
                    assert_eq!(&got_q[o + 2 * n_pairs..o + hd], &q[o + 2 * n_pairs..o + hd]);
                }
            }
            let Ok(slot) = usize::try_from(slots[t]) else {
                continue;
            };
            for h in 0..nkv {
                let (o, c) = (t * kv_dim + h * hd, slot * kv_dim + h * hd);
                let what = format!("cached k neox={neox} magnitude={magnitude} token {t} head {h}");
                let want = rotated(&k[o..o + hd], tpos);
                assert_close(&what, &got_k[c..c + hd], &want, &[1.0; 64], 1e-5);
                assert_eq!(&got_k[c + 2 * n_pairs..c + hd], &k[o + 2 * n_pairs..o + hd]);
                assert_eq!(&got_v[c..c + hd], &v[o..o + hd], "cached v token {t}");
            }
        }
        // Only the two real tokens' slots were written.
        for s in (0..n_slots).filter(|s| ![5, 17].contains(s)) {
            let row = s * kv_dim..(s + 1) * kv_dim;
            assert!(got_k[row.clone()].iter().all(|x| x.is_nan()), "k slot {s}");
            assert!(got_v[row].iter().all(|x| x.is_nan()), "v slot {s}");
        }
    }
}

#[test]
fn swiglu_computes_the_cpu_expression_to_f32_and_to_f16() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(13);
    let (rows, n) = (3, 100);
    let gate = rng.vec(rows * n, 6.0);
    let up = rng.vec(rows * n, 2.0);
    let mut g = f32_bytes(&gate);
    let mut u = f32_bytes(&up);
    let mut out = g.clone(); // out aliasing gate is allowed; a copy keeps inputs readable
    emu.launch(
        names::SWIGLU,
        [1, 1, 1],
        [64, 1, 1],
        &mut [
            Arg::Buf(&mut g),
            Arg::Buf(&mut u),
            Arg::Buf(&mut out),
            Arg::I64((rows * n) as i64),
        ],
    )
    .unwrap();
    let want: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| g as f64 / (1.0 + (-g as f64).exp()) * u as f64)
        .collect();
    let mag: Vec<f64> = want.iter().map(|w| w.abs().max(1e-3)).collect();
    assert_close("swiglu", &bytes_f32(&out), &want, &mag, 1e-5);

    let mut out16 = vec![0u8; rows * n * 2];
    emu.launch(
        names::SWIGLU_F16,
        [1, 1, 1],
        [64, 1, 1],
        &mut [
            Arg::Buf(&mut g),
            Arg::Buf(&mut u),
            Arg::Buf(&mut out16),
            Arg::I64((rows * n) as i64),
        ],
    )
    .unwrap();
    assert_eq!(f16s(&out16), f16_rounded(&bytes_f32(&out)), "swiglu_f16");
}

/// f16 bits (little-endian pairs of bytes).
fn f16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// f32s rounded to f16 (nearest even, as the kernels' conversion), as bits.
fn f16_rounded(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
}

#[test]
fn argmax_takes_the_lowest_index_of_the_maximum_and_ignores_nan() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(14);
    let n = 1000;
    let inf = f32::INFINITY;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let mut want = Vec::new();
    let mut ties = rng.vec(n, 1.0);
    ties[700] = 5.0;
    ties[300] = 5.0;
    rows.push(ties);
    want.push(300);
    let mut nan_first = rng.vec(n, 1.0);
    nan_first[0] = f32::NAN;
    nan_first[999] = 9.0;
    rows.push(nan_first);
    want.push(999);
    rows.push(vec![-inf; n]);
    want.push(0);
    rows.push(vec![f32::NAN; n]);
    want.push(0);
    let mut mixed = vec![-inf; n];
    mixed[0] = f32::NAN;
    mixed[513] = -1e30;
    rows.push(mixed);
    want.push(513);
    let mut plus_inf = rng.vec(n, 1.0);
    plus_inf[42] = inf;
    plus_inf[43] = inf;
    rows.push(plus_inf);
    want.push(42);
    let flat: Vec<f32> = rows.concat();
    let mut out = vec![0u8; rows.len() * 4];
    emu.launch(
        names::ARGMAX,
        [rows.len() as u32, 1, 1],
        [256, 1, 1],
        &mut [
            Arg::Buf(&mut f32_bytes(&flat)),
            Arg::I32(n as i32),
            Arg::Buf(&mut out),
        ],
    )
    .unwrap();
    assert_eq!(bytes_u32(&out), want);
}

/// A paged KV cache built through the rope_kv_write kernel, with its f64 view for
/// references.
struct Paged {
    kv: KvType,
    kv_dim: usize,
    n_blocks: usize,
    k_cache: Vec<u8>,
    v_cache: Vec<u8>,
    /// Per sequence: its block ids (shuffled) and its (rounded) keys and values.
    tables: Vec<Vec<i32>>,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl Paged {
    fn new(emu: &Emulator, kv: KvType, kv_dim: usize, lens: &[usize], rng: &mut Rng) -> Self {
        let per_seq: Vec<usize> = lens.iter().map(|l| l.div_ceil(KV_BLOCK_TOKENS)).collect();
        let n_blocks = per_seq.iter().sum::<usize>() + 3;
        let mut ids: Vec<i32> = (0..n_blocks as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        // Every slot no sequence writes holds NaN, standing for a reused block's stale
        // entries: a kernel that reads one (even to multiply it by a zero weight) fails.
        let nan: &[u8] = match kv {
            KvType::F32 => &[0x00, 0x00, 0xc0, 0x7f],
            KvType::F16 => &[0x00, 0x7e],
        };
        let cache_len = n_blocks * KV_BLOCK_TOKENS * kv_dim;
        let mut p = Paged {
            kv,
            kv_dim,
            n_blocks,
            k_cache: nan.repeat(cache_len),
            v_cache: nan.repeat(cache_len),
            tables: Vec::new(),
            keys: Vec::new(),
            values: Vec::new(),
        };
        let mut next = 0;
        for (&len, &nb) in lens.iter().zip(&per_seq) {
            let table = ids[next..next + nb].to_vec();
            next += nb;
            let k = rng.vec(len * kv_dim, 1.0);
            let v = rng.vec(len * kv_dim, 1.0);
            let slots: Vec<i32> = (0..len)
                .map(|pos| {
                    table[pos / KV_BLOCK_TOKENS] * KV_BLOCK_TOKENS as i32
                        + (pos % KV_BLOCK_TOKENS) as i32
                })
                .collect();
            // No q heads and no rotated pairs: the keys and values stored as they are
            // (one "head" of kv_dim; the positions and frequencies are never read).
            emu.launch(
                &names::rope_kv_write(kv),
                [3, 1, 1],
                [256, 1, 1],
                &mut [
                    Arg::Null,
                    Arg::Buf(&mut f32_bytes(&k)),
                    Arg::Buf(&mut f32_bytes(&v)),
                    Arg::Buf(&mut p.k_cache),
                    Arg::Buf(&mut p.v_cache),
                    Arg::Null,
                    Arg::Buf(&mut i32_bytes(&slots)),
                    Arg::Null,
                    Arg::I32(len as i32),
                    Arg::I32(0),
                    Arg::I32(1),
                    Arg::I32(kv_dim as i32),
                    Arg::I32(0),
                    Arg::F32(1.0),
                    Arg::I32(0),
                    Arg::F32(1.0),
                    Arg::F32(0.0),
                    Arg::I32(1),
                ],
            )
            .unwrap();
            let round = |x: Vec<f32>| -> Vec<f32> {
                match kv {
                    KvType::F32 => x,
                    KvType::F16 => x.into_iter().map(|v| f16::from_f32(v).to_f32()).collect(),
                }
            };
            p.tables.push(table);
            p.keys.push(round(k));
            p.values.push(round(v));
        }
        p.check_layout();
        p
    }

    /// The cache holds each position at block * 16 + slot, as kv.rs lays it out.
    fn check_layout(&self) {
        let read = |cache: &[u8], i: usize| match self.kv {
            KvType::F32 => f32::from_le_bytes(cache[4 * i..4 * i + 4].try_into().unwrap()),
            KvType::F16 => f16::from_le_bytes([cache[2 * i], cache[2 * i + 1]]).to_f32(),
        };
        for (s, table) in self.tables.iter().enumerate() {
            for pos in 0..self.keys[s].len() / self.kv_dim {
                let row =
                    table[pos / KV_BLOCK_TOKENS] as usize * KV_BLOCK_TOKENS + pos % KV_BLOCK_TOKENS;
                for d in [0, self.kv_dim - 1] {
                    assert_eq!(
                        read(&self.k_cache, row * self.kv_dim + d),
                        self.keys[s][pos * self.kv_dim + d]
                    );
                    assert_eq!(
                        read(&self.v_cache, row * self.kv_dim + d),
                        self.values[s][pos * self.kv_dim + d]
                    );
                }
            }
        }
        assert!(self.n_blocks > self.tables.iter().map(Vec::len).sum::<usize>());
    }

    fn block_tables(&self) -> (Vec<i32>, usize) {
        let max_blocks = self.tables.iter().map(Vec::len).max().unwrap_or(0) + 1;
        let mut flat = vec![-1; self.tables.len() * max_blocks];
        for (s, t) in self.tables.iter().enumerate() {
            flat[s * max_blocks..s * max_blocks + t.len()].copy_from_slice(t);
        }
        (flat, max_blocks)
    }

    /// Attention of `q` (one head) over positions 0..=pos of sequence s, kv head g.
    fn reference(
        &self,
        s: usize,
        g: usize,
        hd: usize,
        q: &[f32],
        pos: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let scale = 1.0 / (hd as f64).sqrt();
        let key =
            |p: usize| &self.keys[s][p * self.kv_dim + g * hd..p * self.kv_dim + (g + 1) * hd];
        let val =
            |p: usize| &self.values[s][p * self.kv_dim + g * hd..p * self.kv_dim + (g + 1) * hd];
        let scores: Vec<f64> = (0..=pos)
            .map(|p| {
                q.iter()
                    .zip(key(p))
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let l: f64 = e.iter().sum();
        let mut out = vec![0.0; hd];
        let mut mag = vec![0.0; hd];
        for (p, &ep) in e.iter().enumerate() {
            for d in 0..hd {
                out[d] += ep / l * val(p)[d] as f64;
                mag[d] += ep / l * (val(p)[d] as f64).abs();
            }
        }
        (out, mag)
    }
}

fn decode_case(emu: &Emulator, kv: KvType, hd: usize, lens: &[usize], rng: &mut Rng) {
    let (n_heads, n_kv) = (6, 2);
    let group = n_heads / n_kv;
    let paged = Paged::new(emu, kv, n_kv * hd, lens, rng);
    let (tables, max_blocks) = paged.block_tables();
    let n_seqs = lens.len();
    // Queries in reverse row order, to check q_rows.
    let rows: Vec<i32> = (0..n_seqs as i32).rev().collect();
    let q = rng.vec(n_seqs * n_heads * hd, 1.0);
    let n_splits = lens.iter().max().unwrap().div_ceil(ATTN_PARTITION);
    let mut out = vec![0u8; n_seqs * n_heads * hd * 4];
    let mut part_o = vec![0u8; n_seqs * n_heads * n_splits * hd * 4];
    let mut part_ml = vec![0u8; n_seqs * n_heads * n_splits * 2 * 4];
    let mut seq_lens = i32_bytes(&lens.iter().map(|&l| l as i32).collect::<Vec<_>>());
    let mut rows_b = i32_bytes(&rows);
    let mut k_cache = paged.k_cache.clone();
    let mut v_cache = paged.v_cache.clone();
    emu.launch(
        &names::attn_decode(kv),
        [n_kv as u32, n_seqs as u32, n_splits as u32],
        [ATTN_DECODE_THREADS, 1, 1],
        &mut [
            Arg::Buf(&mut f32_bytes(&q)),
            Arg::Buf(&mut k_cache),
            Arg::Buf(&mut v_cache),
            Arg::Buf(&mut i32_bytes(&tables)),
            Arg::I32(max_blocks as i32),
            Arg::Buf(&mut seq_lens),
            Arg::Buf(&mut rows_b),
            Arg::Buf(&mut out),
            Arg::Buf(&mut part_o),
            Arg::Buf(&mut part_ml),
            Arg::I32(n_heads as i32),
            Arg::I32(n_kv as i32),
            Arg::I32(hd as i32),
            Arg::F32(1.0 / (hd as f32).sqrt()),
        ],
    )
    .unwrap();
    if n_splits > 1 {
        emu.launch(
            names::ATTN_DECODE_REDUCE,
            [n_heads as u32, n_seqs as u32, 1],
            [ATTN_DECODE_THREADS, 1, 1],
            &mut [
                Arg::Buf(&mut part_o),
                Arg::Buf(&mut part_ml),
                Arg::Buf(&mut seq_lens),
                Arg::Buf(&mut rows_b),
                Arg::Buf(&mut out),
                Arg::I32(n_heads as i32),
                Arg::I32(hd as i32),
                Arg::I32(n_splits as i32),
            ],
        )
        .unwrap();
    }
    let got = bytes_f32(&out);
    for s in 0..n_seqs {
        let row = rows[s] as usize;
        for h in 0..n_heads {
            let o = (row * n_heads + h) * hd;
            let (want, mag) = paged.reference(s, h / group, hd, &q[o..o + hd], lens[s] - 1);
            let what = format!(
                "{} hd={hd} seq {s} (len {}) head {h}",
                names::attn_decode(kv),
                lens[s]
            );
            assert_close(&what, &got[o..o + hd], &want, &mag, 1e-5);
        }
    }
}

#[test]
fn decode_attention_matches_the_reference_with_and_without_splits() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(15);
    // One split (direct output), then several (partials + reduction). Head sizes cover
    // the split-position (64), idle-thread (80) and two-dims-per-thread (256) paths.
    decode_case(emu, KvType::F32, 64, &[1, 17, 256], &mut rng);
    decode_case(emu, KvType::F16, 80, &[200, 3], &mut rng);
    decode_case(emu, KvType::F32, 128, &[600, 1, 257], &mut rng);
    decode_case(emu, KvType::F16, 256, &[300, 40], &mut rng);
}

/// Which prefill attention a case runs.
#[derive(Clone, Copy, PartialEq)]
enum Prefill {
    /// `attn_prefill_{f32,f16}`: f32 arithmetic, any head size.
    Simt,
    /// `attn_prefill_f16_tc_hd*`: q and p rounded to f16 for the tensor cores.
    TensorCores,
}

fn prefill_case(
    emu: &Emulator,
    kv: KvType,
    hd: usize,
    chunks: &[(usize, usize)],
    variant: Prefill,
    rng: &mut Rng,
) {
    let (n_heads, n_kv) = (6, 2);
    let group = n_heads / n_kv;
    // The cache holds each sequence's prefix and its chunk: start + q_len positions.
    let lens: Vec<usize> = chunks.iter().map(|&(start, ql)| start + ql).collect();
    let paged = Paged::new(emu, kv, n_kv * hd, &lens, rng);
    let (tables, max_blocks) = paged.block_tables();
    let q_start: Vec<i32> = chunks
        .iter()
        .scan(0, |acc, &(_, ql)| {
            let s = *acc;
            *acc += ql as i32;
            Some(s)
        })
        .collect();
    let n_tokens: usize = chunks.iter().map(|c| c.1).sum();
    let max_q = chunks.iter().map(|c| c.1).max().unwrap();
    let q = rng.vec(n_tokens * n_heads * hd, 1.0);
    // Rows no query owns stay NaN unless a kernel writes them.
    let mut out = f32_bytes(&vec![f32::NAN; n_tokens * n_heads * hd]);
    // Rounding q and p to f16 moves each output by about 2^-11 of its magnitude.
    let (kernel, queries, threads, tol) = match variant {
        Prefill::Simt => (
            names::attn_prefill(kv),
            ATTN_PREFILL_QUERIES,
            ATTN_PREFILL_THREADS,
            1e-5,
        ),
        Prefill::TensorCores => (
            names::attn_prefill_tc(kv, hd).expect("a tensor-core variant"),
            ATTN_PREFILL_TC_QUERIES,
            ATTN_PREFILL_TC_THREADS,
            2e-3,
        ),
    };
    let (mut k_cache, mut v_cache) = (paged.k_cache.clone(), paged.v_cache.clone());
    let (mut q_bytes, mut tables, mut q_start_b) =
        (f32_bytes(&q), i32_bytes(&tables), i32_bytes(&q_start));
    let mut q_len = i32_bytes(&chunks.iter().map(|c| c.1 as i32).collect::<Vec<_>>());
    let mut start_pos = i32_bytes(&chunks.iter().map(|c| c.0 as i32).collect::<Vec<_>>());
    let mut args = vec![
        Arg::Buf(&mut q_bytes),
        Arg::Buf(&mut k_cache),
        Arg::Buf(&mut v_cache),
        Arg::Buf(&mut tables),
        Arg::I32(max_blocks as i32),
        Arg::Buf(&mut q_start_b),
        Arg::Buf(&mut q_len),
        Arg::Buf(&mut start_pos),
        Arg::Buf(&mut out),
        Arg::I32(n_heads as i32),
        Arg::I32(n_kv as i32),
    ];
    if variant == Prefill::Simt {
        args.push(Arg::I32(hd as i32));
    }
    args.push(Arg::F32(1.0 / (hd as f32).sqrt()));
    let grid = [
        max_q.div_ceil(queries) as u32,
        n_heads as u32,
        chunks.len() as u32,
    ];
    emu.launch(&kernel, grid, [threads, 1, 1], &mut args)
        .unwrap();
    drop(args);
    let got = bytes_f32(&out);
    for (s, &(start, ql)) in chunks.iter().enumerate() {
        for i in 0..ql {
            let row = q_start[s] as usize + i;
            for h in 0..n_heads {
                let o = (row * n_heads + h) * hd;
                let (want, mag) = paged.reference(s, h / group, hd, &q[o..o + hd], start + i);
                let what = format!("{kernel} hd={hd} seq {s} query {i} head {h}");
                assert_close(&what, &got[o..o + hd], &want, &mag, tol);
            }
        }
    }
}

#[test]
fn prefill_attention_is_causal_over_the_cached_prefix_and_the_chunk() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(16);
    // (start position, chunk length): a fresh prompt over two query blocks, a short
    // chunk after a prefix that ends mid-block, and a full block after a small prefix.
    let chunks = [(0, 20), (37, 5), (3, 16)];
    prefill_case(emu, KvType::F32, 64, &chunks, Prefill::Simt, &mut rng);
    prefill_case(emu, KvType::F16, 128, &chunks, Prefill::Simt, &mut rng);
}

#[test]
fn tensor_core_prefill_attention_matches_the_reference() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(17);
    // A prompt over two query tiles whose second has one active warp and a part-filled
    // one; a short chunk after a prefix of three key tiles ending mid-block (later
    // warps idle, the last key tile partly past the chunk); a full tile after a prefix
    // that ends mid-tile.
    let chunks = [(0, 81), (150, 5), (40, 64)];
    prefill_case(
        emu,
        KvType::F16,
        128,
        &chunks,
        Prefill::TensorCores,
        &mut rng,
    );
    prefill_case(
        emu,
        KvType::F16,
        32,
        &chunks[1..],
        Prefill::TensorCores,
        &mut rng,
    );
    for hd in [64, 96] {
        prefill_case(
            emu,
            KvType::F16,
            hd,
            &chunks[..1],
            Prefill::TensorCores,
            &mut rng,
        );
    }
}

#[test]
fn views_alias_one_buffer_in_place_and_at_an_offset() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(5);
    let n = 40;
    // One allocation holding [pad | gate | up]: swiglu reads gate and up through
    // pointers into it and writes its output over gate (out == gate), as the CUDA
    // forward does with its FFN scratch.
    let gate = rng.vec(n, 3.0);
    let up = rng.vec(n, 1.0);
    let pad = 8;
    let mut all = vec![0.0f32; pad];
    all.extend(&gate);
    all.extend(&up);
    let mut bytes = f32_bytes(&all);
    emu.launch(
        names::SWIGLU,
        [1, 1, 1],
        [256, 1, 1],
        &mut [
            Arg::BufAt(&mut bytes, pad * 4),
            Arg::View {
                arg: 0,
                offset: (pad + n) * 4,
            },
            Arg::View {
                arg: 0,
                offset: pad * 4,
            },
            Arg::I64(n as i64),
        ],
    )
    .unwrap();
    let out = bytes_f32(&bytes);
    assert!(
        out[..pad].iter().all(|&v| v == 0.0),
        "the padding is untouched"
    );
    for i in 0..n {
        let g = gate[i] as f64;
        let want = g / (1.0 + (-g).exp()) * up[i] as f64;
        assert!(
            (out[pad + i] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{i}"
        );
        assert_eq!(out[pad + n + i], up[i], "up is untouched");
    }
}
