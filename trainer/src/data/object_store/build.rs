//! One client per store, each built by `object_store`'s own builder for that store from the
//! environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`: credentials, proxies, and the store's other
//! variables), then `data.object_store`'s endpoint, plain-HTTP permission, timeouts and retry policy,
//! which mean the same for every store.
use super::credentials::CredentialSource;
use crate::config::{ObjectStoreSection, Scheme, StoreUrl};
use crate::data::data_error::DataError;
use ::object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use ::object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use ::object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use ::object_store::{BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::time::Duration;

/// Asks the client's credential provider once; an error says why no credential came.
pub(super) type CredentialCheck =
    Pin<Box<dyn Future<Output = Result<(), ::object_store::Error>> + Send>>;

/// A built client, where its credentials come from, and the one credential request that
/// proves them before any data request.
pub(super) struct Built {
    pub store: Arc<dyn ObjectStore>,
    pub credentials: CredentialSource,
    pub check: CredentialCheck,
}

impl Built {
    /// The check fetches one credential from the store's own provider, whatever its kind.
    fn new<C: Send + Sync + 'static>(
        store: impl ObjectStore,
        credentials: CredentialSource,
        provider: Arc<dyn ::object_store::CredentialProvider<Credential = C>>,
    ) -> Self {
        Self {
            store: Arc::new(store),
            credentials,
            check: Box::pin(async move { provider.get_credential().await.map(|_| ()) }),
        }
    }
}

/// The client settings every store's builder takes as config keys: set this way, not with
/// `with_client_options`, which would replace what `from_env` read (`*_ALLOW_HTTP`,
/// `*_PROXY_URL`, ...).
fn client_settings(s3: &ObjectStoreSection) -> Vec<(ClientConfigKey, String)> {
    let mut out = vec![
        (
            ClientConfigKey::Timeout,
            format!("{}s", s3.request_timeout_seconds.max(1)),
        ),
        (
            ClientConfigKey::ConnectTimeout,
            format!("{}s", s3.request_timeout_seconds.clamp(1, 10)),
        ),
    ];
    if s3.allow_http {
        out.push((ClientConfigKey::AllowHttp, "true".into()));
    }
    out
}

fn retry(s3: &ObjectStoreSection) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(s3.retry_initial_backoff_ms.max(1)),
            max_backoff: Duration::from_millis(
                s3.retry_max_backoff_ms.max(s3.retry_initial_backoff_ms),
            ),
            base: 2.0,
        },
        max_retries: s3.max_retries,
        retry_timeout: Duration::from_secs(s3.retry_timeout_seconds),
    }
}

/// The client for `url`'s store and bucket.
pub(super) fn build_store(url: &StoreUrl, s3: &ObjectStoreSection) -> Result<Built, DataError> {
    static TLS: Once = Once::new();
    // rustls is built with ring only (aws-lc-rs would add a slow C/cmake build); make it the
    // process default so reqwest finds it.
    TLS.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    let refused = |e: ::object_store::Error| DataError::StoreConfig {
        url: url.root(),
        reason: e.to_string(),
    };
    match url.scheme() {
        Scheme::S3 => {
            let b = s3_builder(url, s3);
            let credentials = CredentialSource::of_s3(&b);
            let store = b.build().map_err(refused)?;
            let provider = store.credentials().clone();
            Ok(Built::new(store, credentials, provider))
        }
        Scheme::Gcs => {
            let mut b = GoogleCloudStorageBuilder::from_env().with_bucket_name(url.bucket());
            if let Some(ep) = &s3.endpoint {
                b = b.with_config(GoogleConfigKey::BaseUrl, ep);
            }
            for (k, v) in client_settings(s3) {
                b = b.with_config(GoogleConfigKey::Client(k), v);
            }
            let credentials = CredentialSource::of_gcs(&b);
            let store = b.with_retry(retry(s3)).build().map_err(refused)?;
            let provider = store.credentials().clone();
            Ok(Built::new(store, credentials, provider))
        }
        Scheme::Azure => {
            let mut b = MicrosoftAzureBuilder::from_env().with_container_name(url.bucket());
            if let Some(ep) = &s3.endpoint {
                b = b.with_config(AzureConfigKey::Endpoint, ep);
            }
            for (k, v) in client_settings(s3) {
                b = b.with_config(AzureConfigKey::Client(k), v);
            }
            let credentials = CredentialSource::of_azure(&b);
            let store = b.with_retry(retry(s3)).build().map_err(refused)?;
            let provider = store.credentials().clone();
            Ok(Built::new(store, credentials, provider))
        }
    }
}

/// The S3 builder: bucket from the URL; `data.object_store.region`, else `AWS_REGION` when
/// `AWS_DEFAULT_REGION` (which `from_env` reads) is unset.
fn s3_builder(url: &StoreUrl, s3: &ObjectStoreSection) -> AmazonS3Builder {
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
    for (k, v) in client_settings(s3) {
        b = b.with_config(AmazonS3ConfigKey::Client(k), v);
    }
    b.with_retry(retry(s3))
}
