//! The generation flags `run` and `chat` share, and the request they make.

use anyhow::Context;
use spark_client::protocol::{
    ChatMessage, GenerateRequest, OutputFormat, PromptInput, SamplingParams,
};

#[derive(Debug, Clone, clap::Args)]
pub struct RequestArgs {
    /// A system message ahead of the conversation
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Stop after this many generated tokens [default: up to the end of the context]
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature; 0 is greedy [default: 0]
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Keep only the K most likely tokens; 0 disables
    #[arg(long, value_name = "K")]
    pub top_k: Option<u32>,
    /// Drop tokens less likely than this fraction of the most likely one
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Penalise recently generated tokens; 1 disables
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// Seed for reproducible sampling
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// End generation before this text (repeatable)
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// `json`: the answer is one JSON object, held to valid JSON token by token
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Hold the JSON answer to this JSON Schema (a file; implies `--format json`)
    #[arg(long, value_name = "FILE")]
    pub schema: Option<std::path::PathBuf>,
}

/// What form the answer takes (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

impl From<Format> for OutputFormat {
    fn from(format: Format) -> Self {
        match format {
            Format::Text => OutputFormat::Text,
            Format::Json => OutputFormat::JsonObject,
        }
    }
}

impl RequestArgs {
    /// The output format the flags ask for; reads and checks the `--schema` file.
    pub fn output_format(&self) -> anyhow::Result<OutputFormat> {
        let Some(path) = &self.schema else {
            return Ok(self.format.into());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the schema {}", path.display()))?;
        // The daemon checks what the schema says; a file that is not JSON at all is
        // worth saying here, with its line and column.
        serde_json::from_str::<serde_json::Value>(&text)
            .with_context(|| format!("the schema {} is not JSON", path.display()))?;
        Ok(OutputFormat::JsonSchema { schema: text })
    }

    pub fn sampling(&self) -> SamplingParams {
        let defaults = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(defaults.repeat_penalty),
            seed: self.seed.or(defaults.seed),
            ..defaults
        }
    }

    /// The conversation so far, behind the system message if one was given.
    pub fn chat(&self, turns: &[ChatMessage]) -> PromptInput {
        let system = self
            .system
            .iter()
            .map(|text| ChatMessage::new("system", text.clone()));
        PromptInput::Chat {
            messages: system.chain(turns.iter().cloned()).collect(),
        }
    }

    /// A generation of `input`; `model` is the one asked for (`None`: whichever the
    /// daemon serves).
    pub fn request(&self, id: u64, model: Option<String>, input: PromptInput) -> GenerateRequest {
        GenerateRequest {
            id,
            model,
            input,
            sampling: self.sampling(),
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            logprobs: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: RequestArgs,
    }

    fn parse(argv: &[&str]) -> RequestArgs {
        Wrapper::parse_from(std::iter::once("x").chain(argv.iter().copied())).args
    }

    #[test]
    fn unset_flags_keep_the_protocol_defaults() {
        assert_eq!(parse(&[]).sampling(), SamplingParams::default());
    }

    #[test]
    fn flags_reach_the_request() {
        let args = parse(&[
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--top-k",
            "40",
            "--min-p",
            "0.05",
            "--repeat-penalty",
            "1.1",
            "--seed",
            "7",
            "--stop",
            "\n\n",
            "--stop",
            "END",
            "--max-tokens",
            "32",
        ]);
        let request = args.request(
            3,
            Some("smollm2-135m-instruct".into()),
            PromptInput::Raw {
                text: "x".into(),
                special: true,
            },
        );
        assert_eq!(request.id, 3);
        assert_eq!(request.model.as_deref(), Some("smollm2-135m-instruct"));
        assert_eq!(request.max_tokens, Some(32));
        assert_eq!(request.stop, ["\n\n", "END"]);
        let s = request.sampling;
        assert_eq!(
            (
                s.temperature,
                s.top_p,
                s.top_k,
                s.min_p,
                s.repeat_penalty,
                s.seed
            ),
            (0.7, 0.9, 40, 0.05, 1.1, Some(7))
        );
    }

    #[test]
    fn system_message_leads_the_conversation() {
        let args = parse(&["--system", "be brief"]);
        let PromptInput::Chat { messages } = args.chat(&[ChatMessage::new("user", "hi")]) else {
            panic!("expected a chat input");
        };
        assert_eq!(
            messages,
            [
                ChatMessage::new("system", "be brief"),
                ChatMessage::new("user", "hi")
            ]
        );
    }
}
