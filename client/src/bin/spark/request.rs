//! The generation flags `run` and `chat` share, and the request they make.

use spark_client::protocol::{
    ChatMessage, GenerateOption, GenerateRequest, OutputFormat, PromptInput, SamplingParams,
    ToolChatMessage, ToolChoice, ToolSpec,
};

use crate::exit::Usage;

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
    /// Functions the model may call: a JSON file holding an array of OpenAI tool
    /// definitions; calls are printed as `name(arguments)`, one per line
    #[arg(long, value_name = "FILE", conflicts_with = "schema")]
    pub tools: Option<std::path::PathBuf>,
    /// Whether the model calls a tool: auto, none, required, or one function's name
    /// [default: auto]
    #[arg(long, value_name = "CHOICE", requires = "tools")]
    pub tool_choice: Option<String>,
    /// Variables for the model's chat template, as a JSON object, e.g.
    /// '{"enable_thinking": false}' to keep Qwen 3 from thinking
    #[arg(long, value_name = "JSON")]
    pub chat_template_kwargs: Option<String>,
}

/// The functions offered (`--tools`) and how the model may call them (`--tool-choice`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSet {
    pub tools: Vec<ToolSpec>,
    pub choice: ToolChoice,
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
        // Bad arguments (exit 2), as a bad --tools file is.
        let text = std::fs::read_to_string(path)
            .map_err(|err| Usage(format!("cannot read the schema {}: {err}", path.display())))?;
        // The daemon checks what the schema says; a file that is not JSON at all is
        // worth saying here, with its line and column.
        serde_json::from_str::<serde_json::Value>(&text)
            .map_err(|err| Usage(format!("the schema {} is not JSON: {err}", path.display())))?;
        Ok(OutputFormat::JsonSchema { schema: text })
    }

    /// The `--tools` file, read and checked, with the `--tool-choice`. Every problem is a
    /// usage error (exit code 2), found before anything is sent.
    pub fn tool_set(&self) -> anyhow::Result<Option<ToolSet>> {
        let Some(path) = &self.tools else {
            return Ok(None);
        };
        if self.format != Format::Text {
            return Err(
                Usage("--tools answers in text: it cannot go with --format json".into()).into(),
            );
        }
        let text = std::fs::read_to_string(path).map_err(|err| {
            Usage(format!(
                "cannot read the tools file {}: {err}",
                path.display()
            ))
        })?;
        let bad_file = |err: spark_client::openai::ToolError| {
            Usage(format!("the tools file {}: {err}", path.display()))
        };
        let tools = spark_client::openai::tools_from_json(&text).map_err(bad_file)?;
        if tools.is_empty() {
            return Err(Usage(format!("the tools file {} holds no tools", path.display())).into());
        }
        let choice = match &self.tool_choice {
            None => ToolChoice::Auto,
            Some(word) => spark_client::openai::choice_by_word(word, &tools).map_err(|_| {
                Usage(format!(
                    "--tool-choice {word}: not auto, none, required or a function of {}",
                    path.display()
                ))
            })?,
        };
        Ok(Some(ToolSet { tools, choice }))
    }

    /// The request's options: `--chat-template-kwargs`, checked to be a JSON object
    /// (a usage error otherwise; the daemon checks the names).
    pub fn options(&self) -> anyhow::Result<Vec<GenerateOption>> {
        let Some(json) = &self.chat_template_kwargs else {
            return Ok(Vec::new());
        };
        match serde_json::from_str::<serde_json::Value>(json) {
            Ok(serde_json::Value::Object(map)) if map.is_empty() => Ok(Vec::new()),
            Ok(serde_json::Value::Object(_)) => {
                Ok(vec![GenerateOption::TemplateVariables(json.clone())])
            }
            Ok(_) => Err(Usage(
                "--chat-template-kwargs takes a JSON object, e.g. '{\"enable_thinking\": false}'"
                    .into(),
            )
            .into()),
            Err(err) => Err(Usage(format!("--chat-template-kwargs is not JSON: {err}")).into()),
        }
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

    /// The conversation so far, behind the system message if one was given. Without
    /// tools it is the plain `Chat` that daemons older than protocol 1.5 also take.
    pub fn chat(&self, turns: &[ToolChatMessage], tools: Option<&ToolSet>) -> PromptInput {
        let system = self
            .system
            .iter()
            .map(|text| ToolChatMessage::new("system", text.clone()));
        let messages = system.chain(turns.iter().cloned());
        match tools {
            Some(set) => PromptInput::ChatWithTools {
                messages: messages.collect(),
                tools: set.tools.clone(),
                choice: set.choice.clone(),
                parallel: true,
            },
            None => PromptInput::Chat {
                messages: messages.map(plain_message).collect(),
            },
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

/// A turn of a conversation without tools: one that made no calls, so only its text.
fn plain_message(message: ToolChatMessage) -> ChatMessage {
    ChatMessage::new(message.role, message.content.unwrap_or_default())
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
        let PromptInput::Chat { messages } = args.chat(&[ToolChatMessage::new("user", "hi")], None)
        else {
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

#[cfg(test)]
mod tool_tests {
    use super::*;
    use clap::Parser;
    use spark_client::protocol::ToolCall;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: RequestArgs,
    }

    fn try_parse(argv: &[&str]) -> Result<RequestArgs, clap::Error> {
        Wrapper::try_parse_from(std::iter::once("x").chain(argv.iter().copied())).map(|w| w.args)
    }

    const WEATHER: &str = r#"[{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]"#;

    /// A tools file in a folder of its own, removed on drop.
    struct ToolsFile(std::path::PathBuf);

    impl ToolsFile {
        fn new(name: &str, text: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("spark-tools-{}-{name}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("tools.json");
            std::fs::write(&path, text).unwrap();
            Self(path)
        }

        fn arg(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }

    impl Drop for ToolsFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
        }
    }

    fn usage_error(args: &RequestArgs) -> String {
        let err = args.tool_set().expect_err("a usage error");
        assert!(err.downcast_ref::<Usage>().is_some(), "{err:#}");
        err.to_string()
    }

    #[test]
    fn tools_and_a_choice_are_read_from_the_flags() {
        let file = ToolsFile::new("ok", WEATHER);
        let set = try_parse(&["--tools", file.arg()])
            .unwrap()
            .tool_set()
            .unwrap()
            .unwrap();
        assert_eq!(set.tools[0].name, "get_weather");
        assert_eq!(set.choice, ToolChoice::Auto);
        for (word, choice) in [
            ("required", ToolChoice::Required),
            ("none", ToolChoice::None),
            ("get_weather", ToolChoice::Function("get_weather".into())),
        ] {
            let args = try_parse(&["--tools", file.arg(), "--tool-choice", word]).unwrap();
            assert_eq!(args.tool_set().unwrap().unwrap().choice, choice);
        }
        // No --tools: no tools.
        assert_eq!(try_parse(&[]).unwrap().tool_set().unwrap(), None);
    }

    #[test]
    fn bad_tools_are_usage_errors() {
        let file = ToolsFile::new(
            "bad",
            r#"[{"type": "function", "function": {"name": "a b"}}]"#,
        );
        let message = usage_error(&try_parse(&["--tools", file.arg()]).unwrap());
        assert!(message.contains("tools[0].function.name"), "{message}");
        let empty = ToolsFile::new("empty", "[]");
        usage_error(&try_parse(&["--tools", empty.arg()]).unwrap());
        let not_json = ToolsFile::new("not-json", "[{");
        usage_error(&try_parse(&["--tools", not_json.arg()]).unwrap());
        usage_error(&try_parse(&["--tools", "/nonexistent/tools.json"]).unwrap());
        let good = ToolsFile::new("choice", WEATHER);
        let message =
            usage_error(&try_parse(&["--tools", good.arg(), "--tool-choice", "get_time"]).unwrap());
        assert!(message.contains("get_time"), "{message}");
        usage_error(&try_parse(&["--tools", good.arg(), "--format", "json"]).unwrap());
        // clap itself refuses a choice without tools and tools with a schema.
        assert!(try_parse(&["--tool-choice", "auto"]).is_err());
        assert!(try_parse(&["--tools", good.arg(), "--schema", good.arg()]).is_err());
    }

    #[test]
    fn tools_make_the_chat_one_with_tools_and_keep_earlier_calls() {
        let file = ToolsFile::new("chat", WEATHER);
        let args = try_parse(&["--tools", file.arg(), "--system", "be brief"]).unwrap();
        let set = args.tool_set().unwrap().unwrap();
        let answered = ToolChatMessage {
            role: "assistant".into(),
            content: None,
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Oslo"}"#.into(),
            }],
            tool_call_id: None,
        };
        let turns = [ToolChatMessage::new("user", "weather?"), answered.clone()];
        let PromptInput::ChatWithTools {
            messages,
            tools,
            choice,
            parallel,
        } = args.chat(&turns, Some(&set))
        else {
            panic!("expected a chat with tools");
        };
        assert_eq!(messages[0], ToolChatMessage::new("system", "be brief"));
        assert_eq!(messages[2], answered);
        assert_eq!(tools, set.tools);
        assert_eq!((choice, parallel), (ToolChoice::Auto, true));
    }
}
