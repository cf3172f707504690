//! `launcher image push`: the engine pushes (it holds the layers); the launcher finds the
//! credentials, checks first that the registry answers and accepts them (so a wrong password or
//! an unreachable registry is one clear message), and reports `NAME@sha256:…`.
use super::credentials::{self, Credentials, Found};
use super::engine::{docker_credentials, engine_error};
use super::reference::ImageRef;
use super::{ImageError, RegistryError};
use bollard::query_parameters::PushImageOptionsBuilder;
use bollard::Docker;
use futures_util::StreamExt;

/// The scheme for the registry API: HTTPS unless the user asked for plain HTTP or the
/// registry is on this machine (localhost, 127.0.0.0/8, [::1]), which Docker also talks to
/// over plain HTTP by default.
pub fn base_url(image: &ImageRef, plain_http: bool) -> String {
    let host = match image.registry_host() {
        "docker.io" => "registry-1.docker.io",
        h => h,
    };
    let plain = uses_plain_http(image, plain_http);
    format!("{}://{host}", if plain { "http" } else { "https" })
}

/// `--plain-http` given, or a registry on this machine (localhost, 127.0.0.0/8, [::1]), which
/// Docker also talks to over plain HTTP by default: the one rule every registry call uses.
pub fn uses_plain_http(image: &ImageRef, plain_http: bool) -> bool {
    plain_http || image.is_loopback()
}

pub fn http_client() -> Result<reqwest::Client, ImageError> {
    crate::tls::install_ring_provider();
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(15))
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .map_err(|e| RegistryError::HttpClient(e).into())
}

/// `GET /v2/` with the credentials: the registry must answer, and a registry that challenges
/// for Basic auth must accept them. Bearer challenges (Docker Hub, GHCR) are left to the
/// engine's token exchange. Messages carry the registry and the credential source only.
pub async fn preflight(
    image: &ImageRef,
    found: Option<&Found>,
    plain_http: bool,
) -> Result<(), ImageError> {
    let url = format!("{}/v2/", base_url(image, plain_http));
    let client = http_client()?;
    let mut req = client.get(&url);
    if let Some(Found {
        credentials: Credentials::Basic { username, password },
        ..
    }) = found
    {
        req = req.basic_auth(username, Some(password.expose()));
    }
    let registry = image.registry_host();
    let resp = req.send().await.map_err(|e| {
        let hint = if plain_http || image.is_loopback() {
            String::new()
        } else {
            "; a registry without TLS needs --plain-http".into()
        };
        RegistryError::Unreachable {
            registry: registry.to_string(),
            url: url.clone(),
            cause: error_chain(&e),
            hint,
        }
    })?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if status.as_u16() == 401 {
        if challenge.starts_with("bearer") {
            return Ok(());
        }
        return Err(match found {
            Some(f) => RegistryError::CredentialsRefused {
                registry: registry.to_string(),
                source_name: f.source.clone(),
            },
            None => RegistryError::NeedsCredentials {
                registry: registry.to_string(),
                username_env: credentials::ENV_USERNAME,
                password_env: credentials::ENV_PASSWORD,
            },
        }
        .into());
    }
    Err(RegistryError::Status {
        registry: registry.to_string(),
        status,
        url,
    }
    .into())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Pushes `image` (present in the engine under that name) and returns its manifest digest.
pub async fn push(
    docker: &Docker,
    image: &ImageRef,
    plain_http: bool,
) -> Result<String, ImageError> {
    if image.registry.is_none() {
        // Pushing a bare name goes to Docker Hub: almost never what a cluster user wants.
        tracing::info!("[launcher] {image} names no registry: pushing to Docker Hub");
    }
    let found = credentials::lookup(image.registry_host())?;
    if let Some(f) = &found {
        tracing::info!(
            "[launcher] credentials for {} from {}",
            image.registry_host(),
            f.source
        );
    }
    preflight(image, found.as_ref(), plain_http).await?;
    let opts = PushImageOptionsBuilder::default()
        .tag(image.tag_or_latest())
        .build();
    let creds = docker_credentials(found.as_ref(), image.registry_host());
    let mut stream = docker.push_image(&image.name(), Some(opts), creds);
    let mut digest = None;
    while let Some(item) = stream.next().await {
        let info = item.map_err(|e| match e {
            bollard::errors::Error::DockerStreamError { error } => RegistryError::PushRejected {
                image: image.to_string(),
                registry: image.registry_host().to_string(),
                error: error.trim().to_string(),
            }
            .into(),
            other => engine_error(&format!("pushing {image}"), other),
        })?;
        if let Some(status) = info.status {
            // Final line: `TAG: digest: sha256:HEX size: N`.
            if let Some(d) = status
                .split_once("digest: ")
                .and_then(|(_, r)| r.split_whitespace().next())
            {
                digest = Some(d.to_string());
            }
            // Per-layer byte counts ("Pushing") would flood a log; the rest is one line each.
            if status != "Pushing" {
                tracing::info!("[push] {status}");
            }
        }
    }
    digest.ok_or_else(|| {
        RegistryError::PushWithoutDigest {
            image: image.to_string(),
        }
        .into()
    })
}
