//! The optional bearer-token check in front of every `/v1` route.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// The key requests must present, if any.
#[derive(Clone, Default)]
pub struct ApiKey(pub Option<Arc<str>>);

impl std::fmt::Debug for ApiKey {
    // Never print the key itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ApiKey(set)"
        } else {
            "ApiKey(none)"
        })
    }
}

/// Middleware: answers 401 unless `Authorization: Bearer <key>` matches.
pub async fn require_api_key(State(key): State<ApiKey>, request: Request, next: Next) -> Response {
    match &key.0 {
        Some(expected) if !presented_key_matches(request.headers(), expected) => {
            ApiError::unauthorized().into_response()
        }
        _ => next.run(request).await,
    }
}

fn presented_key_matches(headers: &HeaderMap, expected: &str) -> bool {
    let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some((scheme, token)) = value.trim().split_once(' ') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return false;
    }
    // Constant time in the key's content, so timing does not reveal a matching prefix.
    // The length may leak; it is not the secret.
    token.trim().as_bytes().ct_eq(expected.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn only_the_exact_bearer_key_passes() {
        assert!(presented_key_matches(&headers("Bearer s3cret"), "s3cret"));
        assert!(presented_key_matches(&headers("bearer s3cret"), "s3cret"));
        assert!(!presented_key_matches(&headers("Bearer s3cre"), "s3cret"));
        assert!(!presented_key_matches(&headers("Bearer s3cretX"), "s3cret"));
        assert!(!presented_key_matches(&headers("Basic s3cret"), "s3cret"));
        assert!(!presented_key_matches(&headers("s3cret"), "s3cret"));
        assert!(!presented_key_matches(&HeaderMap::new(), "s3cret"));
    }
}
