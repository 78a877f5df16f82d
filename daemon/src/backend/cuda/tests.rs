//! The whole CUDA forward run through the kernel emulator (the real `.cu` sources on the
//! CPU) on tiny synthetic models, compared with the CPU forward: every weight format
//! the synthetic models come in, Qwen2's biases, Qwen3's q/k norm, prefill chunks of
//! several sequences (through dequantize + GEMM and through the mat-vec), mixed
//! prefill/decode steps and batched decode (through the tensor-core mat-mul, and the
//! mat-vec) over paged KV with a shuffled block pool.
//! Skipped, with a message, only when no C++ compiler is present.

use std::path::Path;
use std::sync::Arc;

use sparkd_kernels::emu::EmuError;
use sparkd_kernels::names::{self, KvType};

use super::{CudaBackend, CudaOptions, EmuGpu, GpuError};
use crate::backend::parity::{compare, greedy, ParityPlan};
use crate::backend::{Backend, CpuBackend};
use crate::gguf::GgufFile;
use crate::model::synth::{synth_gguf, SynthSpec};
use crate::model::{Arch, BlockTable, Model, SeqInput};
use crate::quant::GgmlType;

fn emulator() -> Option<EmuGpu> {
    match EmuGpu::new() {
        Ok(g) => Some(g),
        Err(GpuError::Emulator(EmuError::NoCompiler(msg))) => {
            eprintln!("SKIPPED: the CUDA forward emulation needs a C++ compiler: {msg}");
            None
        }
        Err(e) => panic!("kernel emulator: {e}"),
    }
}

/// The model twice: laid out for the CPU kernels (packed where they pack) and in the
/// file's layout for the device.
fn model(spec: &SynthSpec) -> (Arc<Model>, Model) {
    let bytes = synth_gguf(spec).expect("synth").to_bytes();
    let cpu = GgufFile::from_bytes(bytes.clone()).expect("parse synth");
    let dev = GgufFile::from_bytes(bytes).expect("parse synth");
    let path = Path::new("synth.gguf");
    (
        Arc::new(Model::from_file(cpu, path).expect("load synth")),
        Model::from_file_unpacked(dev, path).expect("load synth"),
    )
}

/// A llama-shaped spec; K-quants need rows of 256, so those models are 256 wide.
fn spec(arch: Arch, ty: GgmlType) -> SynthSpec {
    let mut s = SynthSpec::tiny();
    s.arch = arch;
    s.weight_type = ty;
    s.seed = 1000 + ty.id() as u64;
    if ty.block_elems() == 256 {
        s.d_model = 256;
        s.ffn_dim = 256;
        s.n_heads = 4;
        s.n_kv_heads = 2;
        s.tied_embeddings = false;
    }
    s
}

fn prompt(n: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 11 + 5) % vocab as u32)
        .collect()
}

/// Three sequences: 21 and 40 prompt tokens in chunks of 16 beside a 7-token one, so
/// steps mix first chunks, last chunks and decodes, then batched decode to `steps`.
fn plan(vocab: usize, steps: usize) -> ParityPlan {
    ParityPlan {
        prompts: vec![
            prompt(21, 1, vocab),
            prompt(7, 2, vocab),
            prompt(40, 3, vocab),
        ],
        chunk: 16,
        steps,
    }
}

/// Largest relative logit error a parity test passes with `opts`, against the CPU's
/// reference mode (f32 activations, exact sums): about 10x what the emulator shows.
/// On the f32 mat-vec only the KV cache rounds (to f16 unless the case says f32): 4e-5
/// seen. The tensor-core paths round every product's inputs to f16 as well: 4e-4 seen.
fn error_bar(opts: &CudaOptions) -> f64 {
    if opts.gemm_min_tokens == usize::MAX && opts.mmq_min_tokens == usize::MAX {
        3e-4
    } else {
        3e-3
    }
}

/// Runs `plan` on the CPU (reference mode) and on the emulated CUDA forward; asserts
/// the logits within [`error_bar`] and every pick equal or a near tie.
/// Returns the emulated device (launch profile), or `None` when the test was skipped.
fn check(name: &str, spec: &SynthSpec, plan: &ParityPlan, opts: CudaOptions) -> Option<EmuGpu> {
    let emu = emulator()?;
    let (graphs, bar) = (opts.graphs, error_bar(&opts));
    let (m, dev_model) = model(spec);
    let mut cpu = CpuBackend::reference(m.clone(), 1024, 1);
    let mut gpu = CudaBackend::new(&dev_model, emu, opts).expect("upload to the emulated device");
    // Blocks come out of the device pool in a scrambled order, so the block tables the
    // kernels follow are not the identity (the CPU pool stays in order).
    gpu.pool.shuffle_free_list(7);
    let started = std::time::Instant::now();
    let report = compare(&mut cpu, &mut gpu, plan, |step, seq, err, a, b| {
        eprintln!("{name}: step {step} seq {seq}: rel err {err:.2e}, argmax cpu {a} gpu {b}");
    })
    .expect("parity run");
    eprintln!(
        "{name}: {report:?}, {} launches, {} GEMM steps, {:.1} s",
        gpu.gpu().launches(),
        gpu.gemm_steps(),
        started.elapsed().as_secs_f64()
    );
    for k in gpu.gpu().profile().iter().take(8) {
        let secs = k.time.as_secs_f64();
        eprintln!(
            "{name}:   {}: {} launches, {secs:.2} s",
            k.kernel, k.launches
        );
    }
    assert_eq!(report.steps, plan.steps);
    assert!(report.max_rel_err < bar, "{name}: {report:?}");
    // Random weights make near ties common: a different pick counts only when the CPU
    // scores it within the error bar of its own (parity::NEAR_TIE).
    assert_eq!(
        report.greedy_matched + report.near_tie_steps,
        report.steps,
        "{name}: {report:?}"
    );
    assert!(report.prefill_rows > 0);
    // Every plan ends in batched decode, which replays captured graphs.
    let (captured, replayed) = gpu.graph_counts();
    if graphs {
        assert!(
            captured >= 1 && replayed >= 1,
            "{name}: graphs {captured}/{replayed}"
        );
    }
    // The device argmax of the last step agrees with the host's pick of the same rows.
    let on_device = gpu.device_argmax().expect("device argmax");
    assert_eq!(on_device.len(), plan.prompts.len());
    for (i, &t) in on_device.iter().enumerate() {
        assert_eq!(
            t,
            greedy(gpu.logits_mut(i)),
            "{name}: device argmax row {i}"
        );
    }
    assert_eq!(gpu.kv_used_blocks(), 0, "tables released");
    Some(gpu.into_gpu())
}

/// Steps of `gemm_min_tokens` rows or more take the GEMM; decode batches from
/// `mmq_min_tokens` (4, the default: three sequences make a graph of four) the
/// tensor-core mat-mul.
fn opts(gemm_min_tokens: usize) -> CudaOptions {
    CudaOptions {
        kv_tokens: 1024,
        gemm_min_tokens,
        ..CudaOptions::default()
    }
}

/// The emulator runs a launch's blocks one after another on OS threads, so each test
/// keeps to what its case needs: one layer unless the case is about layers, and steps
/// of at least 8 tokens through the GEMM (cheap to emulate) rather than the 16-row
/// mat-vec (the costliest kernel to emulate: hundreds of warp shuffles per block).
fn one_layer(mut s: SynthSpec) -> SynthSpec {
    s.n_layers = 1;
    s
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_q4_0_two_layers() {
    // Two layers: the per-layer offsets into the KV cache and the residual stream
    // carried across layers; five steps, the last two pure batched decode. The KV cache
    // in f32 here (f16, the default, everywhere else).
    let s = spec(Arch::Llama, GgmlType::Q4_0);
    let f32_kv = CudaOptions {
        kv_type: KvType::F32,
        ..opts(8)
    };
    let emu = check("llama Q4_0 f32 KV", &s, &plan(s.vocab_size, 5), f32_kv);
    if let Some(emu) = emu {
        // The tensor-core attention is for an f16 cache only.
        assert!(emu.launches_of("attn_prefill_f32") > 0);
        assert_eq!(emu.launches_of("attn_prefill_f16"), 0);
    }
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_q4_1_matvec_only() {
    // No tensor cores: the prefill chunks go through the mat-vec, 16 rows a launch.
    let s = one_layer(spec(Arch::Llama, GgmlType::Q4_1));
    let p = ParityPlan {
        prompts: vec![prompt(18, 4, s.vocab_size), prompt(3, 5, s.vocab_size)],
        chunk: 16,
        steps: 3,
    };
    let matvec_only = CudaOptions {
        mmq_min_tokens: usize::MAX,
        ..opts(usize::MAX)
    };
    let emu = check("llama Q4_1", &s, &p, matvec_only);
    if let Some(emu) = emu {
        assert!(emu.launches_of("mmv_q4_1_b16") > 0);
        assert_eq!(emu.launches_of("mmq_"), 0);
        // The decode steps (two sequences) fuse gate, up and SwiGLU, and q, k, v
        // (one format here) share one launch.
        assert!(emu.launches_of("mmv_glu_q4_1_b4") > 0);
        assert!(emu.launches_of("mmv3_q4_1_b4") > 0);
        // Every RMSNorm on the mat-vec is folded into its products; what remains is
        // the final norm of the rows that steps with prefill pick for logits, one
        // launch a row: the 3-token prompt's last in step 1, then in step 2 the long
        // prompt's last beside the short one's first decode.
        assert_eq!(emu.launches_of("rmsnorm"), 3);
    }
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_q8_0() {
    let s = one_layer(spec(Arch::Llama, GgmlType::Q8_0));
    check("llama Q8_0", &s, &plan(s.vocab_size, 4), opts(8));
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_f16() {
    let s = one_layer(spec(Arch::Llama, GgmlType::F16));
    check("llama F16", &s, &plan(s.vocab_size, 4), opts(8));
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_q4_k() {
    let s = one_layer(spec(Arch::Llama, GgmlType::Q4_K));
    let emu = check("llama Q4_K", &s, &plan(s.vocab_size, 4), opts(8));
    if let Some(emu) = emu {
        // Prefill chunks on the GEMM and their attention (64-wide heads, f16 cache) on
        // tensor cores, the batched decode (layers and head) on the tensor-core
        // mat-mul, the single rows of the head's prefill on the mat-vec.
        assert!(emu.launches_of("gemm_f16") > 0);
        assert!(emu.launches_of("attn_prefill_f16_tc_hd64") > 0);
        let f16_prefill = emu.launches_of("attn_prefill_f16");
        assert_eq!(f16_prefill, emu.launches_of("attn_prefill_f16_tc"));
        assert!(emu.launches_of("mmq_q4_k_n8") > 0);
        assert!(emu.launches_of("mmv_") > 0);
        // On the tensor-core paths each input is made in f16 once for all its
        // products: the norms and SwiGLU write it themselves (on the mat-mul, SwiGLU is
        // fused with gate and up), and the only conversion left is the attention
        // output's, once per layer and step like SwiGLU's.
        assert!(emu.launches_of("rmsnorm_f16") > 0);
        let swiglus = emu.launches_of("swiglu_f16") + emu.launches_of("mmq_glu_q4_k");
        assert!(emu.launches_of("mmq_glu_q4_k_n8") > 0);
        assert_eq!(emu.launches_of("convert_f32_f16"), swiglus);
    }
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_q6_k() {
    let s = one_layer(spec(Arch::Llama, GgmlType::Q6_K));
    check("llama Q6_K", &s, &plan(s.vocab_size, 4), opts(8));
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_q2_k() {
    let s = one_layer(spec(Arch::Llama, GgmlType::Q2_K));
    let emu = check("llama Q2_K", &s, &plan(s.vocab_size, 4), opts(8));
    if let Some(emu) = emu {
        // Prefill on the dequantized GEMM operand, batched decode on the tensor-core
        // mat-mul, the head's single prefill rows on the mat-vec: each reads Q2_K.
        assert!(emu.launches_of("dequant_q2_k_f16") > 0);
        assert!(emu.launches_of("mmq_q2_k_n8") > 0);
        assert!(emu.launches_of("mmq_glu_q2_k_n8") > 0);
        assert!(emu.launches_of("mmv_q2_k_b1") > 0);
    }
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_q3_k() {
    // Decode on the mat-vec rather than the tensor cores, so the fused mat-vecs (gate,
    // up and SwiGLU; q, k and v in one launch) read Q3_K too, which the tensor-core
    // cases never launch.
    let s = one_layer(spec(Arch::Llama, GgmlType::Q3_K));
    let matvec_decode = CudaOptions {
        mmq_min_tokens: usize::MAX,
        ..opts(8)
    };
    let emu = check("llama Q3_K", &s, &plan(s.vocab_size, 4), matvec_decode);
    if let Some(emu) = emu {
        assert!(emu.launches_of("dequant_q3_k_f16") > 0);
        assert!(emu.launches_of("mmv_glu_q3_k_b4") > 0);
        assert!(emu.launches_of("mmv3_q3_k_b4") > 0);
        assert_eq!(emu.launches_of("mmq_"), 0);
    }
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_iq4_nl() {
    // Blocks of 32: the tiny 64-wide shapes, with a head of its own (tied, it would be
    // the Q8_0 embedding). Prefill on the dequantized GEMM operand, batched decode on
    // the tensor-core mat-mul (gate and up with SwiGLU fused), the head's single
    // prefill rows on the mat-vec: each reads IQ4_NL.
    let mut s = one_layer(spec(Arch::Llama, GgmlType::IQ4_NL));
    s.tied_embeddings = false;
    let emu = check("llama IQ4_NL", &s, &plan(s.vocab_size, 4), opts(8));
    if let Some(emu) = emu {
        assert!(emu.launches_of("dequant_iq4_nl_f16") > 0);
        assert!(emu.launches_of("mmq_iq4_nl_n8") > 0);
        assert!(emu.launches_of("mmq_glu_iq4_nl_n8") > 0);
        assert!(emu.launches_of("mmv_iq4_nl_b1") > 0);
    }
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_llama_iq4_xs() {
    // Super-blocks of 256: 256-wide shapes, the head in IQ4_XS too (untied). Decode on
    // the mat-vec, so the fused mat-vecs (gate, up and SwiGLU; q, k and v in one
    // launch) read IQ4_XS as well.
    let s = one_layer(spec(Arch::Llama, GgmlType::IQ4_XS));
    let matvec_decode = CudaOptions {
        mmq_min_tokens: usize::MAX,
        ..opts(8)
    };
    let emu = check("llama IQ4_XS", &s, &plan(s.vocab_size, 4), matvec_decode);
    if let Some(emu) = emu {
        assert!(emu.launches_of("dequant_iq4_xs_f16") > 0);
        assert!(emu.launches_of("mmv_glu_iq4_xs_b4") > 0);
        assert!(emu.launches_of("mmv3_iq4_xs_b4") > 0);
        assert!(emu.launches_of("mmv_iq4_xs_b") > 0);
        assert_eq!(emu.launches_of("mmq_"), 0);
    }
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_qwen2_with_biases() {
    let s = one_layer(spec(Arch::Qwen2, GgmlType::Q8_0));
    check("qwen2 Q8_0", &s, &plan(s.vocab_size, 4), opts(8));
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_qwen3_with_qk_norm() {
    let s = one_layer(spec(Arch::Qwen3, GgmlType::Q4_1));
    check("qwen3 Q4_1", &s, &plan(s.vocab_size, 4), opts(8));
}

#[test]
fn emulated_cuda_forward_matches_the_cpu_mistral3_yarn_and_temperature() {
    // The synthetic original context is 16 positions: the 21- and 40-token prompts
    // cross it, so the queries' temperature and YaRN's magnitude are both in play.
    let s = one_layer(spec(Arch::Mistral3, GgmlType::Q4_0));
    check("mistral3 Q4_0", &s, &plan(s.vocab_size, 4), opts(8));
}

/// Graph replay against launch by launch: the same device, the same kernels, so the
/// logits must agree exactly; only how the launches reach the device differs. Three
/// sequences pad to a graph of four; steps of one shape replay one capture. A second
/// run with a longer prompt grows the step scratch, which must drop the graphs
/// recorded against the old buffers (the emulator refuses a replay into a freed
/// buffer, as a GPU would fault or read garbage) and capture again.
#[test]
fn emulated_cuda_graphs_replay_decode_exactly_as_launch_by_launch() {
    let (Some(emu_a), Some(emu_b)) = (emulator(), emulator()) else {
        return;
    };
    let s = one_layer(spec(Arch::Llama, GgmlType::Q4_0));
    let (_, dev_model) = model(&s);
    // The tensor-core mat-mul from two rows, so that three sequences (eager) and their
    // graph of four take the same kernels: its columns are independent, so padding
    // changes nothing. (With the default of four, eager would take the mat-vec.)
    let both = CudaOptions {
        mmq_min_tokens: 2,
        ..opts(8)
    };
    let mut eager = CudaBackend::new(
        &dev_model,
        emu_a,
        CudaOptions {
            graphs: false,
            ..both.clone()
        },
    )
    .expect("upload");
    let mut graphed = CudaBackend::new(&dev_model, emu_b, both).expect("upload");
    graphed.pool.shuffle_free_list(3);

    let first = plan(s.vocab_size, 7);
    let report = compare(&mut eager, &mut graphed, &first, |_, _, _, _, _| {}).expect("run");
    assert_eq!(report.max_rel_err, 0.0, "{report:?}");
    assert_eq!(report.greedy_matched, report.steps);
    assert_eq!(eager.graph_counts(), (0, 0), "graphs off means none");
    let (captured, replayed) = graphed.graph_counts();
    // Steps 4 to 7 decode all three sequences at lengths 41..44: one shape.
    assert_eq!((captured, replayed), (1, 4));

    let second = ParityPlan {
        prompts: vec![prompt(90, 6, s.vocab_size), prompt(2, 7, s.vocab_size)],
        chunk: 90,
        steps: 4,
    };
    let report = compare(&mut eager, &mut graphed, &second, |_, _, _, _, _| {}).expect("run");
    assert_eq!(report.max_rel_err, 0.0, "{report:?}");
    let (captured2, replayed2) = graphed.graph_counts();
    assert!(captured2 > captured, "grown scratch means a new capture");
    assert_eq!(replayed2 - replayed, 3, "every decode step replays a graph");
    assert_eq!(graphed.kv_used_blocks(), 0);
}

/// A batch that goes back and forth between shapes on different scratch buffers (two
/// sequences on the mat-vec; three, padded to a graph of four, on the tensor-core
/// mat-mul with its f16 scratch) keeps both shapes' graphs: coming back to a shape
/// replays its capture instead of recording it again.
#[test]
fn emulated_graphs_of_shapes_on_different_buffers_outlive_each_other() {
    let Some(emu) = emulator() else {
        return;
    };
    let s = one_layer(spec(Arch::Llama, GgmlType::Q4_0));
    let (m, dev_model) = model(&s);
    let mut gpu = CudaBackend::new(&dev_model, emu, opts(8)).expect("upload");
    let mut cpu = CpuBackend::reference(m, 1024, 1);
    let vocab = s.vocab_size;
    let three = || ParityPlan {
        prompts: vec![
            prompt(9, 1, vocab),
            prompt(8, 2, vocab),
            prompt(10, 3, vocab),
        ],
        chunk: 16,
        steps: 3,
    };
    let two = ParityPlan {
        prompts: vec![prompt(9, 4, vocab), prompt(8, 5, vocab)],
        chunk: 16,
        steps: 3,
    };
    let run = |gpu: &mut CudaBackend<EmuGpu>, cpu: &mut CpuBackend, plan: &ParityPlan| {
        let report = compare(cpu, gpu, plan, |_, _, _, _, _| {}).expect("run");
        assert!(report.max_rel_err < error_bar(&opts(8)), "{report:?}");
        gpu.graph_counts()
    };
    let (captured_three, _) = run(&mut gpu, &mut cpu, &three());
    let (captured_two, _) = run(&mut gpu, &mut cpu, &two);
    assert!(
        captured_two > captured_three,
        "two sequences: a shape of its own"
    );
    let (captured, replayed) = run(&mut gpu, &mut cpu, &three());
    assert_eq!(captured, captured_two, "the three-sequence graph was kept");
    assert!(replayed > 0);
}

/// How a test step asks for a logit row.
#[derive(Clone, Copy, PartialEq)]
enum Row {
    /// The whole row, to the host.
    Whole,
    /// The device's greedy pick.
    Greedy,
    /// The device's greedy pick after a logit bias that bans the unbiased pick.
    Biased,
}

/// Rows a step marks greedy come back as device picks (after their logit bias), their
/// logits left on the device; the other rows' logits arrive whole. Against a twin
/// backend that downloads every row, through a prefill (picked rows) and graph-replayed
/// decode steps, with the greedy rows first, last and in the middle.
#[test]
fn greedy_rows_come_back_as_device_picks_and_the_rest_as_logits() {
    let (Some(emu_a), Some(emu_b)) = (emulator(), emulator()) else {
        return;
    };
    let s = one_layer(spec(Arch::Llama, GgmlType::Q4_0));
    let (_, dev_model) = model(&s);
    let mut full = CudaBackend::new(&dev_model, emu_a, opts(8)).expect("upload");
    let mut mixed = CudaBackend::new(&dev_model, emu_b, opts(8)).expect("upload");
    let vocab = s.vocab_size;
    let mut seqs: Vec<Vec<u32>> = (0..3).map(|i| prompt(9 + i, i as u32, vocab)).collect();
    let mut tables = [(); 6].map(|_| BlockTable::default());
    let (ta, tb) = tables.split_at_mut(3);
    for (t, sq) in ta.iter_mut().chain(tb.iter_mut()).zip(seqs.iter().cycle()) {
        full.reserve(t, sq.len() + 8).unwrap();
        mixed.reserve(t, sq.len() + 8).unwrap();
    }
    use Row::*;
    let patterns = [
        [Greedy, Whole, Biased],
        [Whole, Biased, Whole],
        [Biased, Greedy, Whole],
        [Greedy, Biased, Biased],
    ];
    let mut start = vec![0; 3];
    for (step, rows) in patterns.iter().enumerate() {
        full.forward(&inputs(ta, &seqs, &start, &[None; 3]))
            .expect("step");
        // Each biased row bans the twin's pick, then lifts token 5 twice and leaves 6
        // as it is: the device must add every entry, in order.
        let biases: Vec<Vec<(u32, f32)>> = (0..3)
            .map(|i| {
                let banned = greedy(full.logits_mut(i));
                vec![(banned, f32::NEG_INFINITY), (5, 0.5), (6, 0.0), (5, 0.25)]
            })
            .collect();
        let marks: Vec<Option<&[(u32, f32)]>> = rows
            .iter()
            .zip(&biases)
            .map(|(row, bias)| match row {
                Whole => None,
                Greedy => Some(&[][..]),
                Biased => Some(&bias[..]),
            })
            .collect();
        mixed
            .forward(&inputs(tb, &seqs, &start, &marks))
            .expect("step");
        let mut next = Vec::new();
        for (i, &row) in rows.iter().enumerate() {
            let want = greedy(full.logits_mut(i));
            assert_eq!(full.greedy_pick(i), None, "unmarked rows have no pick");
            match row {
                Whole => {
                    assert_eq!(mixed.greedy_pick(i), None, "step {step} row {i}");
                    assert_eq!(
                        mixed.logits_mut(i),
                        full.logits_mut(i),
                        "step {step} row {i}"
                    );
                }
                Greedy => assert_eq!(mixed.greedy_pick(i), Some(want), "step {step} row {i}"),
                Biased => {
                    let mut biased = full.logits_mut(i).to_vec();
                    for &(id, b) in &biases[i] {
                        biased[id as usize] += b;
                    }
                    let pick = mixed.greedy_pick(i);
                    assert_eq!(pick, Some(greedy(&biased)), "step {step} row {i}");
                    assert_ne!(pick, Some(want), "step {step} row {i}: banned");
                }
            }
            next.push(want);
        }
        for (i, t) in next.into_iter().enumerate() {
            start[i] = seqs[i].len();
            seqs[i].push(t);
        }
    }
    let (captured, replayed) = mixed.graph_counts();
    assert!(captured >= 1 && replayed >= 1, "decode steps ran as graphs");
    assert!(
        mixed.gpu().launches_of(names::LOGIT_BIAS) >= 4,
        "one per step with a bias"
    );
}

/// Each sequence's tokens from `start`, all wanting logits, greedy (after a bias) where
/// `marked`.
fn inputs<'a>(
    tables: &'a [BlockTable],
    seqs: &'a [Vec<u32>],
    start: &[usize],
    marked: &[Option<&'a [(u32, f32)]>],
) -> Vec<SeqInput<'a>> {
    (0..3)
        .map(|i| SeqInput {
            table: &tables[i],
            tokens: &seqs[i][start[i]..],
            start_pos: start[i],
            want_logits: true,
            greedy: marked[i],
        })
        .collect()
}

/// Contexts past one attention partition (256 positions) split the decode attention
/// and merge the splits (attn_decode_reduce); against the CPU. Through a graph, so the
/// three splits of 520..523 positions are padded to four, the last one empty. (Launch
/// by launch runs the same kernels with three; the long prefill is the costliest thing
/// to emulate, so it runs once.)
#[test]
fn emulated_cuda_split_k_decode_matches_the_cpu_past_one_partition() {
    let mut s = one_layer(spec(Arch::Llama, GgmlType::Q8_0));
    // Two query heads over one kv head: half the prefill attention to emulate.
    (s.n_heads, s.n_kv_heads, s.context_length) = (2, 1, 1024);
    let long = ParityPlan {
        prompts: vec![prompt(520, 8, s.vocab_size), prompt(3, 9, s.vocab_size)],
        chunk: 260,
        steps: 5,
    };
    const _: () = assert!(
        520 > 2 * sparkd_kernels::consts::ATTN_PARTITION,
        "three splits"
    );
    let Some(emu) = check("split-K", &s, &long, opts(8)) else {
        return;
    };
    let reduces = emu
        .profile()
        .iter()
        .find(|k| k.kernel == "attn_decode_reduce")
        .map_or(0, |k| k.launches);
    assert_eq!(reduces, 3, "one split merge per decode step");
}

/// Resident memory (kB) of this process's mapping that starts at `addr`, from
/// /proc/self/smaps; `None` where that file does not exist.
fn mapping_rss_kb(addr: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut in_it = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, _)) = first.split_once('-') {
            if let Ok(start) = usize::from_str_radix(start, 16) {
                in_it = start == addr;
                continue;
            }
        }
        if in_it {
            if let Some(kb) = line.strip_prefix("Rss:") {
                return kb.trim().trim_end_matches("kB").trim().parse().ok();
            }
        }
    }
    None
}

/// The weights go up to the device from a mapping of the file in chunks, and each
/// chunk's pages go back after its upload: the process never holds the model, nor even
/// a whole tensor, on the host beside the device copy (on GB10 the two share one
/// memory). The emulator reports the mapping's resident size after every copy.
#[test]
fn uploading_a_mapped_model_gives_its_pages_back_chunk_by_chunk() {
    let Some(mut emu) = emulator() else { return };
    let mut s = SynthSpec::tiny();
    (s.d_model, s.ffn_dim, s.n_heads, s.n_kv_heads) = (512, 1536, 8, 4);
    // A 32k vocabulary: the embedding and the head are 17 MB each, several chunks.
    (s.n_layers, s.vocab_size, s.weight_type) = (4, 32768, GgmlType::Q8_0);
    s.tied_embeddings = false;
    let dir = std::env::temp_dir().join(format!("sparkd-cuda-upload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("model.gguf");
    synth_gguf(&s)
        .expect("synth")
        .write_file(&path)
        .expect("write");
    let file_kb = std::fs::metadata(&path).expect("stat").len() / 1024;

    let model = Model::load_mapped(&path).expect("load mapped");
    let base = model.file.bytes().as_ptr() as usize;
    let Some(before) = mapping_rss_kb(base) else {
        eprintln!("SKIPPED: no /proc/self/smaps");
        return;
    };
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = peak.clone();
    emu.probe_uploads(move || {
        let kb = mapping_rss_kb(base).unwrap_or(0);
        seen.fetch_max(kb, std::sync::atomic::Ordering::Relaxed);
    });
    let chunk = 256 << 10;
    let upload = CudaOptions {
        upload_chunk_bytes: chunk,
        ..opts(8)
    };
    let gpu = CudaBackend::new(&model, emu, upload).expect("upload");
    let after = mapping_rss_kb(base).expect("the mapping is still there");
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let largest_kb = (s.vocab_size * s.d_model * 34 / 32 / 1024) as u64; // a Q8_0 head
    eprintln!(
        "mapping of a {file_kb} kB model (largest tensor {largest_kb} kB): {before} kB \
         resident before the upload, at most {peak} kB during it, {after} kB after"
    );
    assert!(
        after < file_kb / 8,
        "{after} kB of a {file_kb} kB model still resident after the upload"
    );
    // One chunk in flight, plus what the kernel maps around a fault (whole large
    // folios, up to 2 MB each, on recent kernels): about 4 MB over the baseline here,
    // where a tensor at a time holds the largest tensor (19 MB seen).
    assert!(
        peak < before + largest_kb / 2,
        "{peak} kB resident during the upload (chunks of {} kB)",
        chunk / 1024
    );
    // The device copy is whole: the weights it reports add up to the file's tensors.
    assert!(
        gpu.w.bytes > file_kb * 1024 * 9 / 10,
        "{} bytes uploaded",
        gpu.w.bytes
    );
    // Status says what the model holds of the device.
    let line = gpu.report().device();
    let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
    let kv = gpu.kv_bytes_per_token() as u64
        * gpu.kv_total_blocks() as u64
        * crate::model::BLOCK_TOKENS as u64;
    assert_eq!(
        line,
        format!(
            "kernel emulator (CPU) · weights {}, KV cache {} (f16)",
            gib(gpu.w.bytes),
            gib(kv)
        )
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}
