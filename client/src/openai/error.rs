//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` plus a status.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::backend::BackendError;
use crate::protocol::ErrorKind;

/// An error answer. The `metric` label counts it in `/metrics` (`errors_total{kind}`).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub error_type: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub metric: &'static str,
}

/// Put on error responses so the metrics layer can count errors by kind without parsing
/// bodies.
#[derive(Debug, Clone, Copy)]
pub struct ErrorMetric(pub &'static str);

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    error_type: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// A 400 about one request field (`param` is OpenAI's dotted path to it).
    pub fn invalid(param: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            error_type: "invalid_request_error",
            param: param.into(),
            code: None,
            metric: "invalid_request",
        }
    }

    /// A 400 for a field this shim does not implement (e.g. `n` > 1, content parts of
    /// other types).
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self {
            code: Some("unsupported_value"),
            ..Self::invalid(param.to_string(), message)
        }
    }

    pub fn bad_json(message: impl Into<String>) -> Self {
        Self {
            metric: "bad_json",
            ..Self::invalid(None, message)
        }
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: Some("payload_too_large"),
            metric: "payload_too_large",
            ..Self::invalid(
                None,
                format!("the request body is larger than {limit} bytes"),
            )
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            code: Some("invalid_api_key"),
            metric: "unauthorized",
            ..Self::invalid(
                None,
                "missing or incorrect API key: send `Authorization: Bearer <key>`",
            )
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: Some("not_found"),
            metric: "not_found",
            ..Self::invalid(None, message)
        }
    }

    pub fn method_not_allowed() -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: Some("method_not_allowed"),
            metric: "method_not_allowed",
            ..Self::invalid(None, "method not allowed for this endpoint")
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            error_type: "server_error",
            param: None,
            code: None,
            metric: "internal",
        }
    }

    /// The `{"error": ...}` object, also sent as an SSE event when a stream fails.
    /// Serialised directly (not through `serde_json::Value`) to keep OpenAI's field order.
    pub fn body_json(&self) -> String {
        let body = ErrorBody {
            error: ErrorObject {
                message: &self.message,
                error_type: self.error_type,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        // Serialising plain strings and options cannot fail.
        serde_json::to_string(&body).unwrap_or_default()
    }
}

impl From<BackendError> for ApiError {
    fn from(err: BackendError) -> Self {
        let message = err.to_string();
        match err {
            BackendError::Unavailable(_) => Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message,
                error_type: "server_error",
                param: None,
                code: Some("daemon_unavailable"),
                metric: "unavailable",
            },
            BackendError::Busy(_) => Self {
                status: StatusCode::TOO_MANY_REQUESTS,
                message,
                // What OpenAI sends for a request-rate limit.
                error_type: "requests",
                param: None,
                code: Some("rate_limit_exceeded"),
                metric: "busy",
            },
            BackendError::Rejected { kind, message } => rejected(kind, message),
            BackendError::Engine(_) => Self {
                code: Some("engine_error"),
                metric: "engine",
                ..Self::internal(message)
            },
            BackendError::Protocol(_) => Self {
                status: StatusCode::BAD_GATEWAY,
                code: Some("protocol_error"),
                metric: "protocol",
                ..Self::internal(message)
            },
        }
    }
}

/// A request the daemon refused, by the daemon's reason.
fn rejected(kind: ErrorKind, message: String) -> ApiError {
    match kind {
        // OpenAI answers an unknown model with 404 `model_not_found`.
        ErrorKind::UnknownModel => ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("model_not_found"),
            metric: "unknown_model",
            ..ApiError::invalid("model".to_string(), message)
        },
        ErrorKind::ContextOverflow => ApiError {
            code: Some("context_length_exceeded"),
            metric: "context_overflow",
            ..ApiError::invalid(None, message)
        },
        ErrorKind::Busy => ApiError::from(BackendError::Busy(message)),
        ErrorKind::ShuttingDown => ApiError::from(BackendError::Unavailable(message)),
        ErrorKind::Engine => ApiError::from(BackendError::Engine(message)),
        ErrorKind::InvalidRequest => ApiError::invalid(None, message),
        // The request as the daemon would read it is over its frame limit (which may be
        // smaller than the shim's body limit): the caller's to make smaller.
        ErrorKind::FrameTooLarge => ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: Some("payload_too_large"),
            metric: "payload_too_large",
            ..ApiError::invalid(
                None,
                format!("the request is too large for sparkd: {message}"),
            )
        },
        // Anything else is the shim's own fault (bad frame, duplicate id...), not the caller's.
        ErrorKind::BadFrame
        | ErrorKind::Handshake
        | ErrorKind::VersionMismatch
        | ErrorKind::DuplicateId
        | ErrorKind::NotAllowed
        | ErrorKind::Internal => {
            ApiError::from(BackendError::Protocol(format!("{kind:?}: {message}")))
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let headers = [(header::CONTENT_TYPE, "application/json")];
        let mut response = (self.status, headers, self.body_json()).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            // The queue frees as generations end, within seconds: OpenAI's SDKs wait for
            // what this says before they retry, instead of their own backoff.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response.extensions_mut().insert(ErrorMetric(self.metric));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_map_to_openai_statuses() {
        let cases = [
            (BackendError::Unavailable("gone".into()), 503),
            (BackendError::Busy("full".into()), 429),
            (BackendError::Engine("boom".into()), 500),
            (BackendError::Protocol("v2".into()), 502),
            (
                BackendError::Rejected {
                    kind: ErrorKind::UnknownModel,
                    message: "x".into(),
                },
                404,
            ),
            (
                BackendError::Rejected {
                    kind: ErrorKind::ContextOverflow,
                    message: "x".into(),
                },
                400,
            ),
            (
                BackendError::Rejected {
                    kind: ErrorKind::FrameTooLarge,
                    message: "x".into(),
                },
                413,
            ),
            (
                BackendError::Rejected {
                    kind: ErrorKind::InvalidRequest,
                    message: "x".into(),
                },
                400,
            ),
            (
                BackendError::Rejected {
                    kind: ErrorKind::Busy,
                    message: "x".into(),
                },
                429,
            ),
            (
                BackendError::Rejected {
                    kind: ErrorKind::ShuttingDown,
                    message: "x".into(),
                },
                503,
            ),
        ];
        for (err, status) in cases {
            let api = ApiError::from(err.clone());
            assert_eq!(api.status.as_u16(), status, "{err:?}");
        }
    }

    #[test]
    fn body_has_openai_shape() {
        let text = ApiError::invalid("temperature".to_string(), "too hot").body_json();
        assert!(
            text.starts_with(r#"{"error":{"message":"too hot","type""#),
            "{text}"
        );
        let body: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["error"]["message"], "too hot");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "temperature");
        assert!(body["error"]["code"].is_null());
    }
}
