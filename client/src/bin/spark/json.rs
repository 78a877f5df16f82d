//! JSON views for `--json` output: one object per line, with finish reasons and error
//! kinds as lowercase strings rather than the protocol's variant names.

use serde::Serialize;
use spark_client::{
    kind_name,
    protocol::{
        DoneEvent, JobEntry, PrefillEvent, ReasoningEvent, Timings, TokenEvent, ToolCallEvent,
        Usage,
    },
    ClientError,
};

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event<'a> {
    Token {
        id: u64,
        token: u32,
        text: &'a str,
    },
    /// A piece of a thinking model's reasoning, before the token that wrote it.
    Reasoning {
        id: u64,
        text: &'a str,
    },
    /// A function call the model made (`--tools`). `id` is the generation's, as in the
    /// other events; `call_id` is the call's own.
    ToolCall {
        id: u64,
        index: u32,
        call_id: &'a str,
        name: &'a str,
        /// The JSON object's text, as the daemon sent it.
        arguments: &'a str,
    },
    Done {
        id: u64,
        finish_reason: &'static str,
        usage: &'a Usage,
        /// Prompt tokens the daemon took from its prefix cache; left out when it did not
        /// say (no token was generated, or the daemon is older than protocol 1.2).
        #[serde(skip_serializing_if = "Option::is_none")]
        cached_tokens: Option<u32>,
        timings: &'a Timings,
    },
    Error {
        id: Option<u64>,
        kind: &'static str,
        message: String,
    },
}

impl<'a> Event<'a> {
    pub fn token(event: &'a TokenEvent) -> Self {
        Event::Token {
            id: event.id,
            token: event.token,
            text: &event.text,
        }
    }

    pub fn reasoning(event: &'a ReasoningEvent) -> Self {
        Event::Reasoning {
            id: event.id,
            text: &event.text,
        }
    }

    pub fn tool_call(event: &'a ToolCallEvent) -> Self {
        Event::ToolCall {
            id: event.id,
            index: event.index,
            call_id: &event.call.id,
            name: &event.call.name,
            arguments: &event.call.arguments,
        }
    }

    pub fn done(event: &'a DoneEvent, prefill: Option<&PrefillEvent>) -> Self {
        Event::Done {
            id: event.id,
            finish_reason: event.finish_reason.as_str(),
            usage: &event.usage,
            cached_tokens: prefill.map(|p| p.cached_tokens),
            timings: &event.timings,
        }
    }

    pub fn error(id: Option<u64>, err: &ClientError) -> Self {
        Event::Error {
            id,
            kind: error_kind(err),
            message: err.to_string(),
        }
    }
}

fn error_kind(err: &ClientError) -> &'static str {
    match err {
        ClientError::DaemonNotRunning { .. } => "daemon_not_running",
        ClientError::Connect { .. } => "connect",
        ClientError::Busy(_) => "busy",
        ClientError::Engine(_) => "engine",
        ClientError::Disconnected => "disconnected",
        ClientError::Protocol(_) => "protocol",
        ClientError::Io(_) => "io",
        other => other.kind().map_or("error", kind_name),
    }
}

#[derive(Debug, Serialize)]
pub struct Job<'a> {
    job: u64,
    request_id: u64,
    client_pid: Option<u32>,
    client_uid: Option<u32>,
    model: &'a str,
    engine: &'a str,
    started_unix_ms: u64,
    finished_unix_ms: u64,
    usage: &'a Usage,
    /// Prompt tokens taken from the prefix cache; `null` when not known.
    cached_tokens: Option<u32>,
    timings: &'a Timings,
    finish_reason: &'static str,
    estimated: bool,
}

impl<'a> From<&'a JobEntry> for Job<'a> {
    fn from(entry: &'a JobEntry) -> Self {
        let job = &entry.record;
        Job {
            job: job.job,
            request_id: job.request_id,
            client_pid: job.client_pid,
            client_uid: job.client_uid,
            model: &job.model,
            engine: &job.engine,
            started_unix_ms: job.started_unix_ms,
            finished_unix_ms: job.finished_unix_ms,
            usage: &job.usage,
            cached_tokens: entry.cached_tokens,
            timings: &job.timings,
            finish_reason: job.finish_reason.as_str(),
            estimated: job.estimated,
        }
    }
}

/// One JSON value on one line.
pub fn line<T: Serialize>(value: &T) -> String {
    // Serializing these plain structs cannot fail; fall back to `null` rather than panic.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_client::protocol::FinishReason;

    #[test]
    fn token_and_done_lines() {
        let token = TokenEvent {
            id: 3,
            token: 42,
            text: "hi\n".into(),
            logprobs: None,
        };
        assert_eq!(
            line(&Event::token(&token)),
            r#"{"type":"token","id":3,"token":42,"text":"hi\n"}"#
        );
        let done = DoneEvent {
            id: 3,
            finish_reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 5,
                completion_tokens: 1,
            },
            timings: Timings {
                ttft_ms: Some(12.5),
                ..Timings::default()
            },
        };
        let value: serde_json::Value =
            serde_json::from_str(&line(&Event::done(&done, None))).unwrap();
        assert_eq!(value["type"], "done");
        assert_eq!(value["finish_reason"], "stop");
        assert_eq!(value["usage"]["completion_tokens"], 1);
        assert_eq!(value["timings"]["ttft_ms"], 12.5);
        assert!(value["timings"]["decode_tps"].is_null());
        assert!(value.get("cached_tokens").is_none());
        let prefill = PrefillEvent {
            id: 3,
            prompt_tokens: 5,
            cached_tokens: 4,
        };
        let value: serde_json::Value =
            serde_json::from_str(&line(&Event::done(&done, Some(&prefill)))).unwrap();
        assert_eq!(value["cached_tokens"], 4);
    }

    #[test]
    fn tool_call_lines() {
        let event = ToolCallEvent {
            id: 3,
            index: 1,
            call: spark_client::protocol::ToolCall {
                id: "call_x".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Oslo"}"#.into(),
            },
        };
        assert_eq!(
            line(&Event::tool_call(&event)),
            r#"{"type":"tool_call","id":3,"index":1,"call_id":"call_x","name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}"#
        );
    }

    #[test]
    fn error_lines_name_the_kind() {
        let err = ClientError::InvalidRequest {
            kind: spark_client::protocol::ErrorKind::ContextOverflow,
            message: "too long".into(),
        };
        let value: serde_json::Value =
            serde_json::from_str(&line(&Event::error(Some(1), &err))).unwrap();
        assert_eq!(value["type"], "error");
        assert_eq!(value["kind"], "context_overflow");
        assert_eq!(value["id"], 1);
    }
}
