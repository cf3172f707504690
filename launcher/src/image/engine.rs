//! The connection to the Docker Engine: `DOCKER_HOST` when set (unix:// or tcp://), else the
//! default socket. Checked with a ping before any work starts, so a missing engine is one clear
//! message naming the socket instead of an error in the middle of a build.
use super::credentials::{Credentials, Found};
use super::{EngineError, ImageError};
use bollard::auth::DockerCredentials;
use bollard::Docker;

pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

pub async fn connect() -> Result<Docker, ImageError> {
    let (docker, place) = match std::env::var("DOCKER_HOST") {
        Ok(h) if !h.is_empty() => (Docker::connect_with_host(&h), format!("DOCKER_HOST={h}")),
        _ => (
            Docker::connect_with_unix(DEFAULT_SOCKET, 600, bollard::API_DEFAULT_VERSION),
            format!("{DEFAULT_SOCKET} (DOCKER_HOST is unset)"),
        ),
    };
    let hint = "start the engine (`sudo systemctl start docker`; on a test machine \
                `scripts/docker-local.sh start`) or point DOCKER_HOST at one";
    let docker = docker.map_err(|error| EngineError::Unreachable {
        place: place.clone(),
        hint,
        error,
    })?;
    // Speak the engine's API version (Debian's 20.10 engine answers 1.41, not bollard's 1.53).
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|error| EngineError::Silent { place, hint, error })?;
    Ok(docker)
}

/// The engine's form of registry credentials (sent as X-Registry-Auth, never logged).
pub fn docker_credentials(found: Option<&Found>, server: &str) -> Option<DockerCredentials> {
    found.map(|f| match &f.credentials {
        Credentials::Basic { username, password } => DockerCredentials {
            username: Some(username.clone()),
            password: Some(password.expose().to_string()),
            serveraddress: Some(server.to_string()),
            ..Default::default()
        },
        Credentials::IdentityToken(t) => DockerCredentials {
            identitytoken: Some(t.expose().to_string()),
            serveraddress: Some(server.to_string()),
            ..Default::default()
        },
    })
}

/// A short message for an engine error (bollard's Display includes the HTTP details).
pub fn engine_error(what: &str, e: bollard::errors::Error) -> ImageError {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError {
            status_code,
            message,
        } => EngineError::Refused {
            what: what.to_string(),
            status: status_code,
            message,
        }
        .into(),
        E::DockerStreamError { error } => EngineError::Stream {
            what: what.to_string(),
            error,
        }
        .into(),
        error => EngineError::Call {
            what: what.to_string(),
            error,
        }
        .into(),
    }
}

/// Removes a container and its anonymous volumes, running or not. Best effort: it runs on the
/// way out of an operation whose own result is what the caller reports.
pub async fn remove_container(docker: &Docker, id: &str) {
    let opts = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    let _ = docker.remove_container(id, Some(opts)).await;
}
