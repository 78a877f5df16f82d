//! Command-line arguments of `sparkd` and the small subcommands (bench, pull, synth).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use spark_client::models::{self, DEFAULT_MODEL};

use crate::backend::cuda::DeviceRequest;
use crate::model::{synth, Arch, Model};
use crate::quant::GgmlType;

#[derive(Debug, Parser)]
#[command(
    name = "sparkd",
    version,
    about = "Resident LLM daemon: one model loaded once, served over a Unix socket"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Load the model and serve requests (the default).
    Serve(Box<ServeArgs>),
    /// Benchmark the engine on a model: prefill, decode, batched decode.
    Bench(BenchArgs),
    /// Download a known model into the models folder.
    Pull(PullArgs),
    /// Write a synthetic GGUF model with random weights (tests, benchmarks).
    Synth(SynthArgs),
    /// Compare the GPU forward with the CPU's on a model (logits and greedy tokens);
    /// prints one JSON line. Exit 0: parity, 1: a mismatch, 2: an error (no GPU...).
    GpuParity(GpuParityArgs),
}

/// Flags of `sparkd serve`. Every one may also come from the config file (`--config`);
/// a flag given on the command line wins over the file, the file over the defaults.
#[derive(Debug, Args, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeArgs {
    /// Config file (TOML) with any of these settings, e.g. /etc/sparkd/sparkd.toml.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Model name (see `spark pull`) or path to a .gguf file [default: smollm2-135m-instruct].
    #[arg(long, env = "SPARKD_MODEL")]
    pub model: Option<String>,
    /// Socket path [default: $SPARKD_SOCKET, else $XDG_RUNTIME_DIR/sparkd/sparkd.sock, else /run/sparkd/sparkd.sock for root].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Compute device: auto, cpu, cuda or cuda:N [default: auto, which takes a
    /// supported GPU when the CUDA stack is usable and else the CPU].
    #[arg(long)]
    pub device: Option<DeviceRequest>,
    /// CPU threads for the forward pass [default: physical cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Replay decode steps as captured CUDA graphs [default: on]; `off` launches every
    /// kernel of every step (for comparison, or to rule graphs out).
    #[arg(
        long,
        value_name = "on|off",
        hide_possible_values = true,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub cuda_graphs: Option<bool>,
    /// Launch each kernel while the one before it finishes (programmatic dependent
    /// launch, sm_90 and newer) [default: on]; `off` launches them one after another.
    #[arg(
        long,
        value_name = "on|off",
        hide_possible_values = true,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub cuda_pdl: Option<bool>,
    /// Keep the KV blocks of finished prompts and reuse them for prompts that start
    /// the same way (a chat's history, a shared system prompt) [default: on]; `off`
    /// computes every prompt in full.
    #[arg(
        long,
        value_name = "on|off",
        hide_possible_values = true,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub prefix_cache: Option<bool>,
    /// KV cache size in tokens, shared by all running sequences [default: 16384].
    #[arg(long)]
    pub kv_tokens: Option<usize>,
    /// Cap on prompt + completion tokens per request [default: the model's context].
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Sequences decoded together at most [default: 16].
    #[arg(long)]
    pub max_running: Option<usize>,
    /// Requests that may wait beyond the running ones before new ones get `busy` [default: 64].
    #[arg(long)]
    pub max_queued: Option<usize>,
    /// Requests one user (uid) may have running or queued at once [default: no cap].
    #[arg(long)]
    pub max_per_uid: Option<usize>,
    /// Tokens per forward step, decodes plus prompt chunks [default: 512].
    #[arg(long)]
    pub step_tokens: Option<usize>,
    /// While streams are decoding, feed long prompts in chunks that keep a step to about
    /// this many milliseconds (sized from what recent steps cost), so the streams are
    /// not stalled behind them [default: 100]; 0 always takes --step-tokens.
    #[arg(long, value_name = "MS")]
    pub step_target_ms: Option<f64>,
    /// Chat template file replacing the model's own.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Variables every chat's template sees, as a JSON object (e.g.
    /// '{"enable_thinking": false}' for Qwen 3); a request's own chat_template_kwargs
    /// override them name by name.
    #[arg(long, value_name = "JSON")]
    pub chat_template_kwargs: Option<String>,
    /// Largest accepted frame in bytes [default: 1 MiB].
    #[arg(long)]
    pub max_frame_bytes: Option<usize>,
    /// Finished jobs kept for `spark jobs` [default: 1000].
    #[arg(long)]
    pub keep_jobs: Option<usize>,
    /// Seconds running generations get to finish on SIGTERM [default: 30].
    #[arg(long)]
    pub shutdown_grace: Option<f64>,
    /// Seconds a client may take no bytes while its events wait before its generations
    /// are cancelled and its connection closed [default: 30].
    #[arg(long)]
    pub stall_timeout: Option<f64>,
    /// Users allowed to connect besides root and the daemon's user (repeatable).
    #[arg(long = "allow-uid")]
    pub allowed_uids: Option<Vec<u32>>,
    /// Groups whose members may connect (repeatable).
    #[arg(long = "allow-gid")]
    pub allowed_gids: Option<Vec<u32>>,
    /// Do not fetch a known model that is missing; fail instead.
    #[arg(long)]
    #[serde(default)]
    pub no_pull: bool,
}

impl ServeArgs {
    /// Fills every setting not given on the command line from the config file.
    pub fn with_config_file(self) -> anyhow::Result<ServeArgs> {
        let Some(path) = self.config.clone() else {
            return Ok(self);
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let file: ServeArgs =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(ServeArgs {
            config: self.config,
            model: self.model.or(file.model),
            socket: self.socket.or(file.socket),
            device: self.device.or(file.device),
            threads: self.threads.or(file.threads),
            cuda_graphs: self.cuda_graphs.or(file.cuda_graphs),
            cuda_pdl: self.cuda_pdl.or(file.cuda_pdl),
            prefix_cache: self.prefix_cache.or(file.prefix_cache),
            kv_tokens: self.kv_tokens.or(file.kv_tokens),
            ctx: self.ctx.or(file.ctx),
            max_running: self.max_running.or(file.max_running),
            max_queued: self.max_queued.or(file.max_queued),
            step_tokens: self.step_tokens.or(file.step_tokens),
            step_target_ms: self.step_target_ms.or(file.step_target_ms),
            max_per_uid: self.max_per_uid.or(file.max_per_uid),
            chat_template: self.chat_template.or(file.chat_template),
            chat_template_kwargs: self.chat_template_kwargs.or(file.chat_template_kwargs),
            max_frame_bytes: self.max_frame_bytes.or(file.max_frame_bytes),
            keep_jobs: self.keep_jobs.or(file.keep_jobs),
            shutdown_grace: self.shutdown_grace.or(file.shutdown_grace),
            stall_timeout: self.stall_timeout.or(file.stall_timeout),
            allowed_uids: self.allowed_uids.or(file.allowed_uids),
            allowed_gids: self.allowed_gids.or(file.allowed_gids),
            no_pull: self.no_pull || file.no_pull,
        })
    }
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model name or path.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Threads [default: physical cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// llama.cpp bin folder: also run its llama-bench and print ratios.
    #[arg(long)]
    pub peer: Option<PathBuf>,
    /// Print JSON (one object on the CPU; JSON lines on CUDA) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Device to benchmark: cpu (the default: the CPU benchmark above), cuda[:N], or
    /// auto. On CUDA: decode at --batches, prefill at --prefill, JSON lines.
    #[arg(long)]
    pub device: Option<DeviceRequest>,
    /// CUDA only: decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub batches: Vec<usize>,
    /// CUDA only: prefill lengths in tokens.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    pub prefill: Vec<usize>,
    /// CUDA only: then per-kernel device times of a decode step (smallest and largest
    /// batch, launch by launch) and of the longest prefill.
    #[arg(long)]
    pub profile: bool,
}

#[derive(Debug, Args)]
pub struct GpuParityArgs {
    /// Model path (or name).
    #[arg(long)]
    pub model: String,
    /// Greedy steps to compare in each of the two runs (the prompt's last logits count
    /// as the first): two sequences decoded on the mat-vec, five on the tensor cores.
    #[arg(long, default_value_t = 32)]
    pub steps: usize,
    /// GPU: cuda or cuda:N.
    #[arg(long, default_value = "cuda")]
    pub device: DeviceRequest,
    /// CPU threads of the reference [default: physical cores].
    #[arg(long)]
    pub threads: Option<usize>,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    #[arg(default_value = DEFAULT_MODEL)]
    pub name: String,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SynthPreset {
    /// A few layers, 64 wide: for tests.
    Tiny,
    /// 256 wide, head size 64, Q4_K/Q6_K mix: for tests of the K-quant and
    /// tensor-core attention paths.
    Small,
    /// Llama-3-8B shapes, Q4_K/Q6_K mix: for GPU benchmarks.
    Llama3_8b,
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value = "tiny")]
    pub preset: SynthPreset,
    /// Architecture: llama, qwen2, qwen3 or mistral3.
    #[arg(long)]
    pub arch: Option<String>,
    #[arg(long)]
    pub layers: Option<usize>,
    /// Weight type of the layer matrices (e.g. Q4_1, Q4_K, Q8_0, F16).
    #[arg(long)]
    pub weight_type: Option<String>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Take the vocabulary, special tokens and chat template of this GGUF file (a real
    /// model's, or a vocabulary-only file) instead of the synthetic ones.
    #[arg(long, value_name = "GGUF")]
    pub vocab_from: Option<PathBuf>,
}

/// Resolves a model name or path, fetching a known model when it is missing and
/// `may_pull` allows.
pub fn model_path(name: &str, may_pull: bool) -> anyhow::Result<PathBuf> {
    match models::resolve_model(name) {
        Ok(p) => Ok(p),
        Err(models::ModelsError::NotDownloaded { name, .. }) if may_pull => {
            tracing::info!(model = %name, "model missing; fetching it");
            Ok(models::pull(&name, &mut models::QuietProgress)?)
        }
        Err(e) => Err(e.into()),
    }
}

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(request) = args.device.filter(|d| *d != DeviceRequest::Cpu) {
        let choice = crate::backend::cuda::probe(request)
            .with_context(|| format!("no CUDA device for --device {request}"))?;
        if let crate::backend::cuda::DeviceChoice::Cuda { gpu, arch, .. } = choice {
            let path = model_path(&args.model, true)?;
            let model = Model::load_mapped(&path)?;
            return crate::bench_cuda::run(
                &model,
                &gpu,
                arch,
                &args.batches,
                &args.prefill,
                args.json,
                args.profile,
            );
        }
    }
    let path = model_path(&args.model, true)?;
    let model = std::sync::Arc::new(Model::load(&path)?);
    let threads = args
        .threads
        .unwrap_or_else(crate::backend::cpu::physical_cores);
    let report = crate::bench::run(model, &args.model, threads, args.peer.as_deref())?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        crate::bench::print_table(&report);
    }
    Ok(())
}

/// `sparkd gpu-parity`: `Ok(true)` on parity, `Ok(false)` on a mismatch.
pub fn gpu_parity(args: GpuParityArgs) -> anyhow::Result<bool> {
    crate::bench_cuda::parity(&args)
}

pub fn pull(args: PullArgs) -> anyhow::Result<()> {
    let path = models::pull(&args.name, &mut models::QuietProgress)?;
    println!("{}", path.display());
    Ok(())
}

pub fn synth(args: SynthArgs) -> anyhow::Result<()> {
    let mut spec = match args.preset {
        SynthPreset::Tiny => synth::SynthSpec::tiny(),
        SynthPreset::Small => synth::SynthSpec::small(),
        SynthPreset::Llama3_8b => synth::SynthSpec::llama3_8b(),
    };
    if let Some(a) = &args.arch {
        spec.arch = Arch::from_name(a).with_context(|| format!("unknown architecture `{a}`"))?;
    }
    if let Some(l) = args.layers {
        spec.n_layers = l;
    }
    if let Some(t) = &args.weight_type {
        spec.weight_type = parse_type(t)?;
        spec.mixed_k = false;
    }
    if let Some(s) = args.seed {
        spec.seed = s;
    }
    if let Some(path) = &args.vocab_from {
        let file = crate::gguf::GgufFile::open(path)
            .with_context(|| format!("reading the vocabulary of {}", path.display()))?;
        spec = spec
            .with_vocabulary_of(file.metadata())
            .with_context(|| format!("{} has no token list", path.display()))?;
    }
    let w = synth::synth_gguf(&spec)?;
    w.write_file(&args.out)?;
    println!("{}", args.out.display());
    Ok(())
}

fn parse_type(s: &str) -> anyhow::Result<GgmlType> {
    GgmlType::weight_type_named(s).with_context(|| format!("unknown weight type `{s}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_file_parses_and_unknown_keys_are_refused() {
        let shipped: ServeArgs =
            toml::from_str(include_str!("../../systemd/sparkd.toml")).expect("sparkd.toml parses");
        assert_eq!(shipped.model.as_deref(), Some("smollm2-135m-instruct"));
        assert_eq!(shipped.stall_timeout, Some(30.0));
        assert!(toml::from_str::<ServeArgs>("modle = \"x\"\n").is_err());
        // The commented-out template variables, as a user would uncomment them.
        let line = include_str!("../../systemd/sparkd.toml")
            .lines()
            .find_map(|l| l.strip_prefix("# chat_template_kwargs"))
            .expect("documented");
        let vars: ServeArgs = toml::from_str(&format!("chat_template_kwargs{line}")).unwrap();
        let json = vars.chat_template_kwargs.expect("set");
        assert!(crate::text::TemplateVars::parse(&json).is_ok(), "{json}");
    }

    /// `sparkd serve <args>`'s options, or clap's kind of error.
    fn parse_serve(args: &[&str]) -> Result<ServeArgs, clap::error::ErrorKind> {
        let mut argv = vec!["sparkd", "serve"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Some(Cmd::Serve(a))) => Ok(*a),
            Ok(_) => panic!("not serve"),
            Err(e) => Err(e.kind()),
        }
    }

    #[test]
    fn cuda_graphs_takes_on_and_off_and_the_flag_wins_over_the_file() {
        let parse = |args: &[&str]| parse_serve(args).map(|a| a.cuda_graphs);
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&["--cuda-graphs", "off"]), Ok(Some(false)));
        assert_eq!(parse(&["--cuda-graphs", "on"]), Ok(Some(true)));
        assert!(parse(&["--cuda-graphs", "sometimes"]).is_err());

        let dir = std::env::temp_dir().join(format!("sparkd-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sparkd.toml");
        std::fs::write(&file, "cuda_graphs = false\n").unwrap();
        let from_file = ServeArgs {
            config: Some(file.clone()),
            ..Default::default()
        };
        assert_eq!(
            from_file.clone().with_config_file().unwrap().cuda_graphs,
            Some(false)
        );
        let flag_wins = ServeArgs {
            cuda_graphs: Some(true),
            ..from_file
        };
        assert_eq!(
            flag_wins.with_config_file().unwrap().cuda_graphs,
            Some(true)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cuda_pdl_takes_on_and_off_from_the_flag_or_the_file() {
        let parse = |args: &[&str]| parse_serve(args).map(|a| a.cuda_pdl);
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&["--cuda-pdl", "off"]), Ok(Some(false)));
        assert_eq!(parse(&["--cuda-pdl", "on"]), Ok(Some(true)));
        assert!(parse(&["--cuda-pdl", "maybe"]).is_err());
        let file: ServeArgs = toml::from_str("cuda_pdl = false\n").expect("parses");
        assert_eq!(file.cuda_pdl, Some(false));
    }

    #[test]
    fn prefix_cache_takes_on_and_off_and_the_flag_wins_over_the_file() {
        let parse = |args: &[&str]| parse_serve(args).map(|a| a.prefix_cache);
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&["--prefix-cache", "off"]), Ok(Some(false)));
        assert_eq!(parse(&["--prefix-cache", "on"]), Ok(Some(true)));
        assert!(parse(&["--prefix-cache", "later"]).is_err());

        let dir = std::env::temp_dir().join(format!("sparkd-cli-prefix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sparkd.toml");
        std::fs::write(&file, "prefix_cache = false\n").unwrap();
        let merged = |flag: Option<bool>| {
            ServeArgs {
                config: Some(file.clone()),
                prefix_cache: flag,
                ..Default::default()
            }
            .with_config_file()
            .unwrap()
            .prefix_cache
        };
        assert_eq!(merged(None), Some(false));
        assert_eq!(merged(Some(true)), Some(true));
        std::fs::remove_dir_all(&dir).ok();
    }
}
