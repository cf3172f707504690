//! The OCI image: build it from the Containerfile through the Docker Engine API (bollard), push
//! it, read its provenance back (oci-spec types, from the engine or the registry), run it on
//! this machine, and squash it into the file Enroot/Pyxis mount on a cluster.
pub mod builder;
pub mod context;
pub mod credentials;
pub mod engine;
pub mod ignore;
mod image_error;
pub mod inspect;
pub mod local_run;
pub mod provenance;
pub mod push;
pub mod reference;
pub mod squash;

pub use image_error::{
    BuildError, CredentialsError, EngineError, ReferenceError, RegistryError, SquashError,
};
use std::path::PathBuf;

/// Where the run config is baked into an image; the trainer reads it when `--config` is absent
/// (one constant, in the config crate both programs share).
pub use scdino_config::BAKED_CONFIG_PATH;

/// Label holding the SHA-256 of the baked run config.
pub const CONFIG_DIGEST_LABEL: &str = "org.scdino.config.sha256";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Ignore(#[from] ignore::IgnoreError),
    #[error("build context entry {name}: {message}")]
    Context { name: String, message: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("build failed at {step}: {message}")]
    BuildStep { step: String, message: String },
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error(transparent)]
    Squash(#[from] SquashError),
    #[error(transparent)]
    Config(#[from] scdino_config::ConfigError),
}
