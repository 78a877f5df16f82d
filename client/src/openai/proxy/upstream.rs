//! The upstream engines (`--upstream NAME=URL`) and the models each one serves, as read
//! from its `/v1/models` every [`REFRESH_EVERY`] and, at most every [`MISS_REFRESH_AFTER`],
//! when a request names a model nobody is known to serve.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use futures::future::join_all;
use serde::Deserialize;

/// How often every upstream's model list is read again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// A request for an unknown model re-reads the lists if they are older than this.
pub const MISS_REFRESH_AFTER: Duration = Duration::from_secs(5);
/// The longest a request waits for that re-read before going to sparkd.
pub const MISS_REFRESH_WAIT: Duration = Duration::from_secs(2);
/// The longest one `/v1/models` call may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);
/// A model list larger than this is not read (a real one is a few KiB).
const MAX_LIST_BYTES: usize = 4 << 20;

/// `NAME=URL` as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSpec {
    /// Shown as the engine of its jobs.
    pub name: String,
    /// `http://host:port[/prefix]`, without a trailing `/` or `/v1`: request paths such
    /// as `/v1/chat/completions` are appended to it.
    pub url: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("expected NAME=URL, e.g. ollama=http://127.0.0.1:11434")]
    Shape,
    #[error("the name `{0}` may hold only letters, digits, `.`, `_` and `-`")]
    Name(String),
    #[error(
        "`{0}`: only http:// upstreams are supported (this build has no TLS); \
         use an engine on this host or a trusted network"
    )]
    Scheme(String),
    #[error("`{0}` is not a valid URL: {1}")]
    Url(String, String),
}

impl FromStr for UpstreamSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, url) = s.split_once('=').ok_or(SpecError::Shape)?;
        let (name, url) = (name.trim(), url.trim());
        if name.is_empty() || url.is_empty() {
            return Err(SpecError::Shape);
        }
        let name_ok = name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !name_ok {
            return Err(SpecError::Name(name.to_string()));
        }
        let parsed =
            reqwest::Url::parse(url).map_err(|e| SpecError::Url(url.into(), e.to_string()))?;
        if parsed.scheme() != "http" {
            return Err(SpecError::Scheme(url.to_string()));
        }
        if parsed.host_str().is_none() || parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(SpecError::Url(
                url.into(),
                "expected http://host:port with an optional path".into(),
            ));
        }
        let mut base = parsed.as_str().trim_end_matches('/').to_string();
        if let Some(root) = base.strip_suffix("/v1") {
            base = root.to_string();
        }
        Ok(UpstreamSpec {
            name: name.to_string(),
            url: base,
        })
    }
}

/// One upstream and what it was last seen serving.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub url: String,
    models: RwLock<Vec<String>>,
    /// Whether the last model-list read succeeded (to log changes only).
    reachable: AtomicBool,
}

impl Upstream {
    fn new(spec: UpstreamSpec) -> Self {
        Self {
            name: spec.name,
            url: spec.url,
            models: RwLock::new(Vec::new()),
            reachable: AtomicBool::new(true),
        }
    }

    /// The models it served at the last successful read.
    pub fn models(&self) -> Vec<String> {
        self.models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Ollama lists `llama3.2:latest` but accepts `llama3.2`.
    fn serves(&self, model: &str) -> bool {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models.iter().any(|m| {
            m == model
                || (!model.contains(':')
                    && m.strip_suffix(":latest").is_some_and(|base| base == model))
        })
    }

    async fn refresh(&self, http: &reqwest::Client) {
        match self.fetch_models(http).await {
            Ok(models) => {
                *self.models.write().unwrap_or_else(|e| e.into_inner()) = models;
                if !self.reachable.swap(true, Ordering::Relaxed) {
                    tracing::info!(upstream = %self.name, "upstream reachable again");
                }
            }
            // The last known list stays: a request for its models gets the upstream's
            // own failure (502) rather than a confusing "unknown model" from sparkd.
            Err(err) => {
                if self.reachable.swap(false, Ordering::Relaxed) {
                    tracing::warn!(upstream = %self.name, url = %self.url, %err, "cannot list the upstream's models");
                }
            }
        }
    }

    async fn fetch_models(&self, http: &reqwest::Client) -> Result<Vec<String>, String> {
        let url = format!("{}/v1/models", self.url);
        let response = http
            .get(&url)
            .timeout(LIST_TIMEOUT)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_LIST_BYTES as u64)
        {
            return Err(format!("{url}: the model list is too large"));
        }
        let body = response.bytes().await.map_err(|e| e.to_string())?;
        if body.len() > MAX_LIST_BYTES {
            return Err(format!("{url}: the model list is too large"));
        }
        parse_model_ids(&body).map_err(|e| format!("{url}: {e}"))
    }
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
    /// llama-server lists the names a model also answers to.
    #[serde(default)]
    aliases: Vec<String>,
}

/// The model ids (and aliases) of an OpenAI `/v1/models` answer.
pub fn parse_model_ids(body: &[u8]) -> Result<Vec<String>, serde_json::Error> {
    let list: ModelList = serde_json::from_slice(body)?;
    let mut ids = Vec::new();
    for entry in list.data {
        for id in std::iter::once(entry.id).chain(entry.aliases) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

/// Every upstream, in command-line order (the first one serving a model gets it).
#[derive(Debug)]
pub struct Registry {
    upstreams: Vec<Upstream>,
    /// When the lists were last read; the lock also makes concurrent misses wait for
    /// one read instead of each starting their own.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
}

impl Registry {
    pub fn new(specs: Vec<UpstreamSpec>) -> Self {
        Self {
            upstreams: specs.into_iter().map(Upstream::new).collect(),
            refreshed: tokio::sync::Mutex::new(None),
        }
    }

    pub fn upstreams(&self) -> &[Upstream] {
        &self.upstreams
    }

    /// The upstream known to serve `model`, without asking anyone.
    pub fn find(&self, model: &str) -> Option<&Upstream> {
        self.upstreams.iter().find(|u| u.serves(model))
    }

    /// Whether a miss would re-read the lists now (they are stale, or being read).
    pub fn miss_refresh_due(&self) -> bool {
        match self.refreshed.try_lock() {
            Ok(at) => !at.is_some_and(|at| at.elapsed() < MISS_REFRESH_AFTER),
            Err(_) => true,
        }
    }

    /// The upstream serving `model`; on a miss, re-reads stale lists first (waiting at
    /// most [`MISS_REFRESH_WAIT`]).
    pub async fn route(&self, http: &reqwest::Client, model: &str) -> Option<&Upstream> {
        if let Some(upstream) = self.find(model) {
            return Some(upstream);
        }
        let refresh = self.refresh_if_older(http, MISS_REFRESH_AFTER);
        // Too slow an upstream must not hold up requests for sparkd's own model.
        let _ = tokio::time::timeout(MISS_REFRESH_WAIT, refresh).await;
        self.find(model)
    }

    /// Reads every upstream's model list, all at once.
    pub async fn refresh(&self, http: &reqwest::Client) {
        self.refresh_if_older(http, Duration::ZERO).await;
    }

    async fn refresh_if_older(&self, http: &reqwest::Client, age: Duration) {
        let mut refreshed = self.refreshed.lock().await;
        if refreshed.is_some_and(|at| at.elapsed() < age) {
            return;
        }
        join_all(self.upstreams.iter().map(|u| u.refresh(http))).await;
        *refreshed = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_normalise() {
        let spec: UpstreamSpec = "ollama=http://127.0.0.1:11434".parse().unwrap();
        assert_eq!(spec.name, "ollama");
        assert_eq!(spec.url, "http://127.0.0.1:11434");
        let spec: UpstreamSpec = "llama = http://localhost:8091/v1/".parse().unwrap();
        assert_eq!(
            (spec.name.as_str(), spec.url.as_str()),
            ("llama", "http://localhost:8091")
        );
        let spec: UpstreamSpec = "x=http://10.0.0.2:8000/engine".parse().unwrap();
        assert_eq!(spec.url, "http://10.0.0.2:8000/engine");
    }

    #[test]
    fn bad_specs_say_why() {
        assert_eq!("nourl".parse::<UpstreamSpec>(), Err(SpecError::Shape));
        assert_eq!("=http://h:1".parse::<UpstreamSpec>(), Err(SpecError::Shape));
        assert!(matches!(
            "a b=http://h:1".parse::<UpstreamSpec>(),
            Err(SpecError::Name(_))
        ));
        assert!(matches!(
            "x=https://h:1".parse::<UpstreamSpec>(),
            Err(SpecError::Scheme(_))
        ));
        assert!(matches!(
            "x=http://h:1/?q=1".parse::<UpstreamSpec>(),
            Err(SpecError::Url(..))
        ));
        assert!(matches!(
            "x=not a url".parse::<UpstreamSpec>(),
            Err(SpecError::Url(..))
        ));
    }

    #[test]
    fn model_ids_include_llama_server_aliases() {
        let body = br#"{"object":"list","data":[{"id":"/models/a.gguf","aliases":["a"],"object":"model"},{"id":"b:latest","object":"model","owned_by":"library"}]}"#;
        assert_eq!(
            parse_model_ids(body).unwrap(),
            ["/models/a.gguf", "a", "b:latest"]
        );
        assert!(parse_model_ids(b"{}").is_err());
    }

    #[test]
    fn lookup_follows_command_line_order_and_ollama_tags() {
        let registry = Registry::new(vec![
            "one=http://127.0.0.1:1".parse().unwrap(),
            "two=http://127.0.0.1:2".parse().unwrap(),
        ]);
        *registry.upstreams[0].models.write().unwrap() = vec!["shared".into()];
        *registry.upstreams[1].models.write().unwrap() =
            vec!["shared".into(), "llama3.2:latest".into()];
        assert_eq!(
            registry.find("shared").map(|u| u.name.as_str()),
            Some("one")
        );
        assert_eq!(
            registry.find("llama3.2").map(|u| u.name.as_str()),
            Some("two")
        );
        assert_eq!(
            registry.find("llama3.2:latest").map(|u| u.name.as_str()),
            Some("two")
        );
        assert!(registry.find("llama3.2:1b").is_none());
        assert!(registry.find("other").is_none());
    }
}
