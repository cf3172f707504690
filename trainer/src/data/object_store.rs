//! The object-store client: `s3://bucket/prefix` URLs, the S3 client built from the
//! environment plus `data.s3`, and a blocking API over it.
//!
//! `object_store` is async; the loader's workers are plain threads. [`Remote`] owns a small
//! tokio runtime and blocks on it, so callers (loader workers, the prefetcher, `trainer data
//! preload`, shard writers) never see async code. Several threads may block on the same
//! runtime at once; the runtime's two workers only drive socket I/O.
//!
//! Credentials never come from the config: `AmazonS3Builder::from_env` reads `AWS_*`
//! variables (keys, session token, web identity / IRSA, ECS container credentials) and falls
//! back to the EC2 instance metadata service. Shared-config profiles (`~/.aws/credentials`,
//! `AWS_PROFILE`) are not read by `object_store`; export them first
//! (`eval "$(aws configure export-credentials --format env)"`).
use super::error::DataError;
use crate::config::S3Section;
pub use crate::config::S3Url;
use ::object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use ::object_store::path::Path as ObjPath;
use ::object_store::{BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, RetryConfig};
use futures_util::StreamExt;
use std::sync::{Arc, Once};
use std::time::Duration;

/// One listed object.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Key relative to the prefix.
    pub rel: String,
    /// The store's own path of the object (used as is for GETs, so keys with characters
    /// that `object_store` would re-encode are fetched exactly as listed).
    pub location: ObjPath,
    pub size: u64,
}

/// A bucket prefix with a blocking client.
pub struct Remote {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    pub url: S3Url,
    credentials: CredentialSource,
    backoff: (Duration, Duration),
    retry_timeout: Duration,
    /// Whole operations repeated after `object_store`'s own retries gave up.
    pub outer_retries: std::sync::atomic::AtomicU64,
}

/// Whether a failed request may succeed if tried again later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// 5xx, 429/503 throttling, 408, connection refused or reset, timeouts.
    Later,
    /// Everything else: 4xx (bad request, wrong region, missing object, permissions,
    /// credentials), redirects, malformed responses.
    Never,
}

/// Classifies `e` by what the server or the connection said. `object_store` folds HTTP 400,
/// wrong-region redirects and credential-provider failures into `Error::Generic` beside the
/// 5xx and connection errors that are worth riding out, so a `Generic` error's source chain
/// is read: the HTTP status the server answered (in the text of the client's request error,
/// "status code: NNN"; the type holding it is private to `object_store`) decides, and a
/// transport error without a status (connect, send, timeout, reset) is transient.
pub fn retry_class(e: &::object_store::Error) -> Retry {
    if !matches!(e, ::object_store::Error::Generic { .. }) {
        return Retry::Never;
    }
    let mut transport = false;
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(cause) = next {
        if let Some(status) = http_status(&cause.to_string()) {
            return if status >= 500 || status == 429 || status == 408 {
                Retry::Later
            } else {
                Retry::Never
            };
        }
        if let Some(h) = cause.downcast_ref::<::object_store::client::HttpError>() {
            use ::object_store::client::HttpErrorKind as K;
            transport |= !matches!(h.kind(), K::Decode);
        }
        next = cause.source();
    }
    if transport {
        Retry::Later
    } else {
        Retry::Never
    }
}

/// The status in `object_store`'s "Server returned non-2xx status code: 503 Service
/// Unavailable: …" text.
fn http_status(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text.get(at..at + 3)?.parse().ok()
}

/// Where the S3 client's credentials come from, in `object_store`'s order of precedence;
/// named in credential and permission errors. Holds variable names and endpoints only,
/// never a key, token or role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`).
    Keys { session_token: bool },
    /// IRSA: `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, exchanged at STS.
    WebIdentity,
    /// ECS task role: `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`.
    EcsTask,
    /// EKS Pod Identity: `AWS_CONTAINER_CREDENTIALS_FULL_URI` + its token file.
    EksPodIdentity,
    /// No variables: the EC2 instance metadata service (IMDS) at this endpoint.
    InstanceMetadata { endpoint: String },
}

impl CredentialSource {
    fn of(b: &AmazonS3Builder) -> Self {
        let has = |k: AmazonS3ConfigKey| b.get_config_value(&k).is_some();
        if has(AmazonS3ConfigKey::AccessKeyId) || has(AmazonS3ConfigKey::SecretAccessKey) {
            CredentialSource::Keys {
                session_token: has(AmazonS3ConfigKey::Token),
            }
        } else if has(AmazonS3ConfigKey::WebIdentityTokenFile) && has(AmazonS3ConfigKey::RoleArn) {
            CredentialSource::WebIdentity
        } else if has(AmazonS3ConfigKey::ContainerCredentialsRelativeUri) {
            CredentialSource::EcsTask
        } else if has(AmazonS3ConfigKey::ContainerCredentialsFullUri)
            && has(AmazonS3ConfigKey::ContainerAuthorizationTokenFile)
        {
            CredentialSource::EksPodIdentity
        } else {
            CredentialSource::InstanceMetadata {
                endpoint: b
                    .get_config_value(&AmazonS3ConfigKey::MetadataEndpoint)
                    .unwrap_or_else(|| "http://169.254.169.254".into()),
            }
        }
    }
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Keys { session_token } => write!(
                f,
                "credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY{}",
                if *session_token { " with AWS_SESSION_TOKEN" } else { "" }
            ),
            CredentialSource::WebIdentity => write!(
                f,
                "credentials from the web identity token (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN) exchanged at STS"
            ),
            CredentialSource::EcsTask => write!(
                f,
                "credentials from the ECS task role (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI)"
            ),
            CredentialSource::EksPodIdentity => write!(
                f,
                "credentials from EKS Pod Identity (AWS_CONTAINER_CREDENTIALS_FULL_URI)"
            ),
            CredentialSource::InstanceMetadata { endpoint } => write!(
                f,
                "no AWS_* credential variables set, so credentials from the instance metadata service at {endpoint}"
            ),
        }
    }
}

/// The S3 client for `url` (bucket and prefix taken from it) with `data.s3`'s endpoint,
/// region, plain-HTTP permission, timeouts and retry policy; credentials from the
/// environment (and where from).
fn build_store(url: &S3Url, s3: &S3Section) -> Result<(AmazonS3, CredentialSource), DataError> {
    static TLS: Once = Once::new();
    // rustls is built with ring only (aws-lc-rs would add a slow C/cmake build); make it the
    // process default so reqwest finds it.
    TLS.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    let mut b = AmazonS3Builder::from_env().with_bucket_name(url.bucket());
    if let Some(ep) = &s3.endpoint {
        b = b.with_endpoint(ep);
    }
    if let Some(region) = &s3.region {
        b = b.with_region(region);
    } else if std::env::var_os("AWS_DEFAULT_REGION").is_none() {
        if let Ok(r) = std::env::var("AWS_REGION") {
            b = b.with_region(r);
        }
    }
    if s3.allow_http {
        b = b.with_allow_http(true);
    }
    // Set through config keys, not `with_client_options`, which would replace the client
    // settings `from_env` read (AWS_ALLOW_HTTP, AWS_PROXY_URL, ...).
    b = b
        .with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
            format!("{}s", s3.request_timeout_seconds.max(1)),
        )
        .with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
            format!("{}s", s3.request_timeout_seconds.clamp(1, 10)),
        );
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(s3.retry_initial_backoff_ms.max(1)),
            max_backoff: Duration::from_millis(
                s3.retry_max_backoff_ms.max(s3.retry_initial_backoff_ms),
            ),
            base: 2.0,
        },
        max_retries: s3.max_retries,
        retry_timeout: Duration::from_secs(s3.retry_timeout_seconds),
    };
    let credentials = CredentialSource::of(&b);
    let store = b
        .with_retry(retry)
        .build()
        .map_err(|e| DataError::StoreConfig {
            url: url.root(),
            reason: e.to_string(),
        })?;
    Ok((store, credentials))
}

impl Remote {
    pub fn open(url: &S3Url, s3: &S3Section) -> Result<Self, DataError> {
        let url = url.clone();
        let (store, credentials) = build_store(&url, s3)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("object-store")
            .enable_all()
            .build()
            .map_err(|e| DataError::io(url.root(), "starting the object-store runtime", e))?;
        // Credentials are fetched once here, so that a missing or refused credential fails
        // at once, named as such, instead of inside every request's retries.
        let provider = store.credentials().clone();
        rt.block_on(provider.get_credential())
            .map_err(|e| DataError::Credentials {
                url: url.root(),
                credentials: credentials.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            rt,
            store: Arc::new(store),
            credentials,
            url,
            backoff: (
                Duration::from_millis(s3.retry_initial_backoff_ms.max(1)),
                Duration::from_millis(s3.retry_max_backoff_ms.max(s3.retry_initial_backoff_ms)),
            ),
            retry_timeout: Duration::from_secs(s3.retry_timeout_seconds),
            outer_retries: Default::default(),
        })
    }

    /// Runs `op` again, with exponential backoff, while it fails transiently and
    /// `retry_timeout_seconds` has not passed. `object_store` retries each request on its own
    /// (`max_retries`, jittered backoff), but that budget lasts about a second with short
    /// backoffs; this outer loop is what rides out an endpoint that is down for longer (a
    /// restarted server, a network blip).
    fn retrying<T, F, Fut>(&self, op: F) -> Result<T, ::object_store::Error>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, ::object_store::Error>>,
    {
        let start = std::time::Instant::now();
        let (mut delay, max) = self.backoff;
        loop {
            match self.rt.block_on(op()) {
                Err(e)
                    if retry_class(&e) == Retry::Later
                        && start.elapsed() + delay < self.retry_timeout =>
                {
                    self.outer_retries
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(max);
                }
                r => return r,
            }
        }
    }

    /// The error for a failed request on `url`; a refusal (400, 401, 403) also names where
    /// the credentials came from.
    pub fn error(
        &self,
        url: impl Into<String>,
        context: &'static str,
        e: ::object_store::Error,
    ) -> DataError {
        use ::object_store::Error as E;
        let refused = match &e {
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => true,
            E::Generic { .. } => retry_class(&e) == Retry::Never,
            _ => false,
        };
        let mut err = DataError::store(url, context, e);
        if refused {
            if let DataError::ObjectStore { note, .. } = &mut err {
                *note = format!(" (the client used {})", self.credentials);
            }
        }
        err
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Runs a future of the caller's own (e.g. a multipart upload) on this client's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Every object below the prefix, in the store's order.
    pub fn list(&self) -> Result<Vec<Listed>, DataError> {
        let prefix = (!self.url.prefix().is_empty()).then(|| ObjPath::from(self.url.prefix()));
        let strip = if self.url.prefix().is_empty() {
            String::new()
        } else {
            format!("{}/", self.url.prefix())
        };
        let metas = self
            .retrying(|| async {
                let mut out = Vec::new();
                let mut stream = self.store.list(prefix.as_ref());
                while let Some(meta) = stream.next().await {
                    out.push(meta?);
                }
                Ok(out)
            })
            .map_err(|e| self.error(self.url.root(), "listing", e))?;
        Ok(metas
            .into_iter()
            .map(|meta| {
                let key: &str = meta.location.as_ref();
                let rel = key.strip_prefix(&strip).unwrap_or(key).to_string();
                Listed {
                    rel,
                    location: meta.location,
                    size: meta.size,
                }
            })
            .collect())
    }

    /// The whole object at `location` (retried per `data.s3`); `expected` (from the
    /// listing) catches a truncated body.
    pub fn get(&self, location: &ObjPath, expected: Option<u64>) -> Result<Vec<u8>, DataError> {
        let url = || format!("s3://{}/{}", self.url.bucket(), location.as_ref());
        let bytes = self.retrying(|| async { self.store.get(location).await?.bytes().await });
        let bytes = bytes.map_err(|e| self.error(url(), "reading object", e))?;
        if let Some(n) = expected {
            if bytes.len() as u64 != n {
                return Err(DataError::CorruptObject {
                    url: url(),
                    reason: format!("listed with {n} bytes but read {}", bytes.len()),
                });
            }
        }
        Ok(bytes.to_vec())
    }

    /// The size of `rel` (relative to the prefix), or `None` if there is no such object
    /// (one HEAD, retried per `data.s3`).
    pub fn head(&self, rel: &str) -> Result<Option<u64>, DataError> {
        let key = ObjPath::from(self.url.key(rel).as_str());
        match self.retrying(|| async { self.store.head(&key).await }) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(::object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(self.url.url_of(rel), "checking object", e)),
        }
    }

    /// `len` bytes of `rel` (relative to the prefix) from `offset`, in one ranged GET
    /// (retried per `data.s3`); a short body is an error.
    pub fn get_range(&self, rel: &str, offset: u64, len: usize) -> Result<Vec<u8>, DataError> {
        let key = ObjPath::from(self.url.key(rel).as_str());
        let range = offset..offset + len as u64;
        let bytes = self
            .retrying(|| async { self.store.get_range(&key, range.clone()).await })
            .map_err(|e| self.error(self.url.url_of(rel), "reading byte range", e))?;
        if bytes.len() != len {
            return Err(DataError::CorruptObject {
                url: self.url.url_of(rel),
                reason: format!(
                    "asked for {len} bytes at offset {offset} but read {}",
                    bytes.len()
                ),
            });
        }
        Ok(bytes.to_vec())
    }

    /// Writes `rel` (relative to the prefix) in one request.
    pub fn put(&self, rel: &str, bytes: Vec<u8>) -> Result<(), DataError> {
        let key = self.url.key(rel);
        self.rt
            .block_on(self.store.put(&ObjPath::from(key.as_str()), bytes.into()))
            .map_err(|e| self.error(self.url.url_of(rel), "writing object", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_read_from_the_client_error_text() {
        let text = "Error performing GET http://127.0.0.1:9/b/k in 2ms - Server returned non-2xx status code: 400 Bad Request: <Error>status code: 503</Error>";
        assert_eq!(http_status(text), Some(400));
        assert_eq!(
            http_status("Server returned non-2xx status code: 503 Service Unavailable"),
            Some(503)
        );
        assert_eq!(http_status("Received redirect without LOCATION"), None);
        assert_eq!(http_status("status code: 4"), None);
    }
}
