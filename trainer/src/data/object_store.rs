//! The object-store client: `s3://`, `gs://` and `az://` bucket/prefix URLs, the store's
//! client built from the environment plus `data.object_store` ([`build`]), and one blocking API over
//! it that listing, reads, preload, shard reads and writes all go through.
//!
//! `object_store` is async; the loader's workers are plain threads. [`Remote`] owns a small
//! tokio runtime and blocks on it, so callers (loader workers, the prefetcher, `trainer data
//! preload`, shard writers) never see async code. Several threads may block on the same
//! runtime at once; the runtime's two workers only drive socket I/O.
//!
//! Credentials never come from the config: each store's builder reads its own variables.
//! S3: `AWS_*` (keys, session token, web identity / IRSA, ECS container credentials), else
//! the EC2 instance metadata service; shared-config profiles (`~/.aws/credentials`,
//! `AWS_PROFILE`) are not read by `object_store`, export them first
//! (`eval "$(aws configure export-credentials --format env)"`). Google Cloud Storage:
//! `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_SERVICE_ACCOUNT_KEY` / `GOOGLE_APPLICATION_CREDENTIALS`,
//! else gcloud's application default credentials, else the instance metadata service. Azure:
//! `AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_ACCOUNT_KEY`, a SAS, a token, a service
//! principal or workload identity, else the managed identity endpoint.
mod build;
mod credentials;

use super::data_error::DataError;
use crate::config::ObjectStoreSection;
pub use crate::config::{Scheme, StoreUrl};
use ::object_store::path::Path as ObjPath;
use ::object_store::{ObjectStore, ObjectStoreExt};
pub use credentials::CredentialSource;
use futures_util::StreamExt;
use std::sync::Arc;
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

/// A bucket (container) prefix with a blocking client.
pub struct Remote {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    pub url: StoreUrl,
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
///
/// One rule serves every store: S3, GCS and Azure clients share `object_store`'s request and
/// retry layer (and so its error text), and the stores agree on what the statuses mean:
/// throttling is 429 or 503 (S3's SlowDown, GCS's rateLimitExceeded, Azure's ServerBusy),
/// refusals 401/403, a missing bucket or container 404.
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

impl Remote {
    pub fn open(url: &StoreUrl, s3: &ObjectStoreSection) -> Result<Self, DataError> {
        let url = url.clone();
        let built = build::build_store(&url, s3)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("object-store")
            .enable_all()
            .build()
            .map_err(|e| DataError::io(url.root(), "starting the object-store runtime", e))?;
        // Credentials are fetched once here, so that a missing or refused credential fails
        // at once, named as such, instead of inside every request's retries.
        rt.block_on(built.check)
            .map_err(|e| DataError::Credentials {
                url: url.root(),
                service: url.scheme().service(),
                credentials: built.credentials.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            rt,
            store: built.store,
            credentials: built.credentials,
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

    /// The whole object at `location` (retried per `data.object_store`); `expected` (from the
    /// listing) catches a truncated body.
    pub fn get(&self, location: &ObjPath, expected: Option<u64>) -> Result<Vec<u8>, DataError> {
        let url = || self.url.url_of_key(location.as_ref());
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
    /// (one HEAD, retried per `data.object_store`).
    pub fn head(&self, rel: &str) -> Result<Option<u64>, DataError> {
        let key = ObjPath::from(self.url.key(rel).as_str());
        match self.retrying(|| async { self.store.head(&key).await }) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(::object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(self.url.url_of(rel), "checking object", e)),
        }
    }

    /// `len` bytes of `rel` (relative to the prefix) from `offset`, in one ranged GET
    /// (retried per `data.object_store`); a short body is an error.
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
