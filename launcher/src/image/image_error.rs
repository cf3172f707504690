//! What can go wrong with the image, one type per party that fails: the Docker Engine, a
//! registry, the credential sources, the build, the squashfs export. Each variant carries the
//! values its message names, so a caller can tell the cases apart without reading text.
use std::path::PathBuf;
use std::process::ExitStatus;

/// The Docker Engine: reaching it and what it answers.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no Docker Engine at {place}: {error}; {hint}")]
    Unreachable {
        place: String,
        hint: &'static str,
        error: bollard::errors::Error,
    },
    #[error("the Docker Engine at {place} does not answer: {error}; {hint}")]
    Silent {
        place: String,
        hint: &'static str,
        error: bollard::errors::Error,
    },
    /// The engine answered a request with an HTTP error.
    #[error("{what}: {message} (HTTP {status})")]
    Refused {
        what: String,
        status: u16,
        message: String,
    },
    /// An error line in the engine's progress stream.
    #[error("{what}: {error}")]
    Stream { what: String, error: String },
    #[error("{what}: {error}")]
    Call {
        what: String,
        error: bollard::errors::Error,
    },
    #[error("the engine's config of {image} is not an OCI image config: {error}")]
    ConfigNotOci {
        image: String,
        error: oci_spec::OciSpecError,
    },
    #[error("the engine reported no image ID")]
    NoImageId,
    #[error("the engine stopped reporting on the container")]
    ContainerUnreported,
    /// Installing the SIGINT/SIGTERM handlers that stop a running container.
    #[error("{0}")]
    Signals(std::io::Error),
}

/// A registry: reaching it, its answers, and what it holds.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("HTTP client: {0}")]
    HttpClient(reqwest::Error),
    #[error("registry {registry} is unreachable at {url}: {cause}{hint}")]
    Unreachable {
        registry: String,
        url: String,
        /// The connection error with its causes, one line.
        cause: String,
        /// Empty, or a `; ...` suggestion.
        hint: String,
    },
    #[error("registry {registry} refused the credentials from {source_name} (HTTP 401)")]
    CredentialsRefused {
        registry: String,
        /// Where the credentials came from (never the credentials).
        source_name: String,
    },
    #[error(
        "registry {registry} needs credentials (HTTP 401) and none were found: log in with `docker login {registry}`, configure a credential helper in ~/.docker/config.json, or set ${username_env} and ${password_env}"
    )]
    NeedsCredentials {
        registry: String,
        username_env: &'static str,
        password_env: &'static str,
    },
    #[error("registry {registry} answered {status} at {url}")]
    Status {
        registry: String,
        status: reqwest::StatusCode,
        url: String,
    },
    #[error("pushing {image} to {registry}: {error}")]
    PushRejected {
        image: String,
        registry: String,
        error: String,
    },
    #[error("the engine finished pushing {image} without reporting a digest")]
    PushWithoutDigest { image: String },
    /// The reference as the registry client reads it.
    #[error("{image}: {error}")]
    Reference {
        image: String,
        error: oci_client::ParseError,
    },
    #[error("{what} of {image} from {url}: {error}")]
    Read {
        what: &'static str,
        image: String,
        url: String,
        error: oci_client::errors::OciDistributionError,
    },
    #[error("the manifest of {image} is not an OCI/Docker v2 image manifest: {error}")]
    ManifestNotOci {
        image: String,
        error: oci_spec::OciSpecError,
    },
    #[error("the config blob of {image} is not an OCI image config: {error}")]
    ConfigNotOci {
        image: String,
        error: oci_spec::OciSpecError,
    },
}

/// The Docker config's credentials and its credential helpers. No variant holds a secret.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("cannot read {path}: {error}")]
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{origin}: not valid JSON: {error}")]
    NotJson {
        origin: String,
        error: serde_json::Error,
    },
    #[error("{origin}: auths.{key}.auth is not base64 of USER:PASSWORD")]
    AuthNotBase64 { origin: String, key: String },
    #[error("credential helper {program} (named in the Docker config) cannot run: {error}")]
    HelperCannotRun {
        program: String,
        error: std::io::Error,
    },
    #[error("{program}: {error}")]
    HelperIo {
        program: String,
        error: std::io::Error,
    },
    /// The helper's own message describes its failure; it never echoes a secret back.
    #[error("{program} get {server} failed ({status}): {message}")]
    HelperFailed {
        program: String,
        server: String,
        status: ExitStatus,
        message: String,
    },
    #[error("{program} printed no JSON credentials")]
    HelperNotJson { program: String },
    #[error("{program} answered without Username/Secret")]
    HelperIncomplete { program: String },
}

/// `launcher image build`, before and around the engine's build.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("image build needs at least one --tag")]
    NoTag,
    #[error("--config bakes the run config into the final stage, but --target {target} is not the final stage of {}", containerfile.display())]
    TargetNotFinal {
        target: String,
        containerfile: PathBuf,
    },
    #[error("BINARIES=prebuilt needs {}: build it first (cargo build --release --workspace --bins) or pass --prebuilt-dir", binary.display())]
    PrebuiltMissing { binary: PathBuf },
    #[error("{} failed: {stderr}", script.display())]
    StagingFailed { script: PathBuf, stderr: String },
    #[error("context writer: {0}")]
    ContextWriter(tokio::task::JoinError),
}

/// `launcher image squash`: the export of the image's filesystem and mksquashfs.
#[derive(Debug, thiserror::Error)]
pub enum SquashError {
    #[error("the engine has no image {image}: build it (launcher image build) or pull it first")]
    NoSuchImage { image: String },
    #[error("the engine reports no ID for {image}")]
    NoImageId { image: String },
    #[error("cannot run mksquashfs ({0}): install squashfs-tools")]
    MksquashfsMissing(std::io::Error),
    #[error("mksquashfs failed: {stderr}")]
    MksquashfsFailed { stderr: String },
    #[error("unpacker: {0}")]
    Unpacker(tokio::task::JoinError),
    #[error("reading the exported filesystem: {0}")]
    ExportUnreadable(std::io::Error),
    #[error("bad path in the export: {0}")]
    ExportPath(std::io::Error),
    #[error("unpacking {} from the export: {error}", path.display())]
    Unpack {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Why a string is not an image reference (`REGISTRY/REPO[:TAG][@sha256:HEX]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference `{reference}`: {why}")]
pub struct ReferenceError {
    pub reference: String,
    pub why: &'static str,
}
