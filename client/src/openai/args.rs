//! The `spark serve-openai` flags, ready to `#[command(flatten)]` into the CLI.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{OpenAiConfig, UpstreamSpec, API_KEY_ENV, DEFAULT_LISTEN, DEFAULT_MAX_BODY_BYTES};

/// Flags of `spark serve-openai`. No `Debug`: it holds the API key.
#[derive(Clone, clap::Args)]
pub struct ServeOpenAiArgs {
    /// Address and port the OpenAI-compatible HTTP API listens on.
    #[arg(long, default_value_t = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Require `Authorization: Bearer <KEY>` on every /v1 request.
    #[arg(long, env = API_KEY_ENV, hide_env_values = true)]
    pub api_key: Option<String>,
    /// Largest accepted request body, in bytes (larger ones get 413).
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Forward requests for this engine's models to it (repeatable; http only), e.g.
    /// `ollama=http://127.0.0.1:11434`. Its models are read from URL/v1/models.
    #[arg(long = "upstream", value_name = "NAME=URL")]
    pub upstreams: Vec<UpstreamSpec>,
}

impl ServeOpenAiArgs {
    /// The server settings for the daemon at `socket_path`. An empty key (e.g.
    /// `SPARKD_API_KEY=`) means no key rather than a key nobody can send.
    pub fn into_config(self, socket_path: PathBuf) -> OpenAiConfig {
        OpenAiConfig {
            listen: self.listen,
            socket_path,
            api_key: self.api_key.filter(|k| !k.is_empty()),
            max_body_bytes: self.max_body_bytes,
            upstreams: self.upstreams,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeOpenAiArgs,
    }

    fn parse(argv: &[&str]) -> OpenAiConfig {
        let cli = Cli::try_parse_from(std::iter::once("spark").chain(argv.iter().copied()))
            .expect("parse");
        cli.args.into_config(PathBuf::from("/run/x.sock"))
    }

    #[test]
    fn flags_override_defaults() {
        let config = parse(&[
            "--listen",
            "0.0.0.0:9000",
            "--api-key",
            "k",
            "--max-body-bytes",
            "10",
        ]);
        assert_eq!(config.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(config.api_key.as_deref(), Some("k"));
        assert_eq!(config.max_body_bytes, 10);
        assert_eq!(config.socket_path, PathBuf::from("/run/x.sock"));
        assert!(config.upstreams.is_empty());
    }

    #[test]
    fn upstreams_repeat_and_bad_ones_are_refused() {
        let config = parse(&[
            "--upstream",
            "ollama=http://127.0.0.1:11434",
            "--upstream",
            "llama=http://127.0.0.1:8091/v1",
        ]);
        let upstreams: Vec<(&str, &str)> = config
            .upstreams
            .iter()
            .map(|u| (u.name.as_str(), u.url.as_str()))
            .collect();
        assert_eq!(
            upstreams,
            [
                ("ollama", "http://127.0.0.1:11434"),
                ("llama", "http://127.0.0.1:8091")
            ]
        );
        let refused = Cli::try_parse_from(["spark", "--upstream", "x=https://h:1"]);
        assert!(refused.is_err());
    }

    #[test]
    fn empty_key_means_none_and_listen_defaults_to_loopback() {
        let config = parse(&["--api-key", ""]);
        assert_eq!(config.api_key, None);
        assert_eq!(config.listen, DEFAULT_LISTEN);
        assert!(config.listen.ip().is_loopback());
    }

    #[test]
    fn config_debug_hides_the_key() {
        let shown = format!("{:?}", parse(&["--api-key", "s3cret-key"]));
        assert!(
            !shown.contains("s3cret-key") && shown.contains("<set>"),
            "{shown}"
        );
    }
}
