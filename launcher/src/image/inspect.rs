//! `launcher image inspect`: the image config (and, from a registry, the manifest) as OCI
//! types, from the local engine or straight from the registry, with the provenance labels
//! printed first. The engine's inspect answer is converted into an OCI `ImageConfiguration`
//! (the engine keeps the same fields), so both sources print through one path.
use super::engine::engine_error;
use super::push::base_url;
use super::reference::ImageRef;
use super::{credentials, EngineError, ImageError, RegistryError};
use bollard::Docker;
use oci_spec::image::{ImageConfiguration, ImageManifest};
use serde_json::{json, Value};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct ImageFacts {
    /// `engine` or the registry's base URL.
    pub from: String,
    /// The image ID (`sha256:` of the config), when known.
    pub id: Option<String>,
    /// The manifest digest in the registry (from the registry, or the engine's RepoDigests).
    pub manifest_digest: Option<String>,
    pub repo_digests: Vec<String>,
    pub config: ImageConfiguration,
    pub manifest: Option<ImageManifest>,
}

impl ImageFacts {
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.config
            .config()
            .as_ref()
            .and_then(|c| c.labels().clone())
            .map(|l| l.into_iter().collect())
            .unwrap_or_default()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "from": self.from,
            "id": self.id,
            "manifest_digest": self.manifest_digest,
            "repo_digests": self.repo_digests,
            "labels": self.labels(),
            "config": serde_json::to_value(&self.config).unwrap_or(Value::Null),
            "manifest": self.manifest.as_ref().map(|m| serde_json::to_value(m).unwrap_or(Value::Null)),
        })
    }

    pub fn to_text(&self) -> String {
        let mut s = format!("from: {}\n", self.from);
        if let Some(id) = &self.id {
            s += &format!("id: {id}\n");
        }
        if let Some(d) = &self.manifest_digest {
            s += &format!("manifest digest: {d}\n");
        }
        for d in &self.repo_digests {
            s += &format!("repo digest: {d}\n");
        }
        if let Some(m) = &self.manifest {
            let total: u64 = m.layers().iter().map(|l| l.size()).sum();
            s += &format!(
                "layers: {} ({:.1} MiB compressed)\n",
                m.layers().len(),
                total as f64 / (1 << 20) as f64
            );
        }
        s += &format!(
            "platform: {}/{}\n",
            self.config.os(),
            self.config.architecture()
        );
        if let Some(c) = self.config.config() {
            if let Some(e) = c.entrypoint() {
                s += &format!("entrypoint: {e:?}\n");
            }
            if let Some(e) = c.cmd() {
                s += &format!("cmd: {e:?}\n");
            }
            if let Some(w) = c.working_dir() {
                s += &format!("workdir: {w}\n");
            }
        }
        s += "labels:\n";
        for (k, v) in self.labels() {
            s += &format!("  {k}: {v}\n");
        }
        s
    }
}

/// The image from the engine, or `None` when the engine does not have it.
pub async fn from_engine(docker: &Docker, image: &str) -> Result<Option<ImageFacts>, ImageError> {
    let info = match docker.inspect_image(image).await {
        Ok(i) => i,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => return Ok(None),
        Err(e) => return Err(engine_error(&format!("inspecting {image}"), e)),
    };
    let c = info.config.clone().unwrap_or_default();
    let volumes: Option<BTreeMap<String, Value>> = c
        .volumes
        .as_ref()
        .map(|v| v.iter().map(|k| (k.clone(), json!({}))).collect());
    let doc = json!({
        "created": info.created,
        "architecture": info.architecture.clone().unwrap_or_else(|| "amd64".into()),
        "os": info.os.clone().unwrap_or_else(|| "linux".into()),
        "config": {
            "User": c.user,
            "Env": c.env,
            "Entrypoint": c.entrypoint,
            "Cmd": c.cmd,
            "WorkingDir": c.working_dir,
            "Labels": c.labels,
            "Volumes": volumes,
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": info.root_fs.as_ref().and_then(|r| r.layers.clone()).unwrap_or_default(),
        },
    });
    let config =
        ImageConfiguration::from_reader(serde_json::to_vec(&strip_nulls(doc)).unwrap().as_slice())
            .map_err(|error| EngineError::ConfigNotOci {
                image: image.to_string(),
                error,
            })?;
    let repo_digests = info.repo_digests.clone().unwrap_or_default();
    Ok(Some(ImageFacts {
        from: "engine".into(),
        id: info.id.clone(),
        manifest_digest: None,
        repo_digests,
        config,
        manifest: None,
    }))
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

const MANIFEST_TYPES: [&str; 2] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// The manifest and config straight from the registry (what a cluster node will pull).
pub async fn from_registry(image: &ImageRef, plain_http: bool) -> Result<ImageFacts, ImageError> {
    crate::tls::install_ring_provider();
    let registry = image.registry_host().to_string();
    let reference: oci_client::Reference =
        image
            .to_string()
            .parse()
            .map_err(|error| RegistryError::Reference {
                image: image.to_string(),
                error,
            })?;
    let protocol = if super::push::uses_plain_http(image, plain_http) {
        oci_client::client::ClientProtocol::Http
    } else {
        oci_client::client::ClientProtocol::Https
    };
    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol,
        ..Default::default()
    });
    let found = credentials::lookup(&registry)?;
    let auth = match found.as_ref().map(|f| &f.credentials) {
        None => oci_client::secrets::RegistryAuth::Anonymous,
        Some(credentials::Credentials::Basic { username, password }) => {
            oci_client::secrets::RegistryAuth::Basic(
                username.clone(),
                password.expose().to_string(),
            )
        }
        Some(credentials::Credentials::IdentityToken(t)) => {
            oci_client::secrets::RegistryAuth::Bearer(t.expose().to_string())
        }
    };
    let url = base_url(image, plain_http);
    // oci-client's errors name the URL and status; they never include the credentials.
    let fail = |what: &'static str, error| RegistryError::Read {
        what,
        image: image.to_string(),
        url: url.clone(),
        error,
    };
    let (raw, digest) = client
        .pull_manifest_raw(&reference, &auth, &MANIFEST_TYPES)
        .await
        .map_err(|e| fail("reading the manifest", e))?;
    let manifest = ImageManifest::from_reader(raw.as_ref()).map_err(|error| {
        RegistryError::ManifestNotOci {
            image: image.to_string(),
            error,
        }
    })?;
    let mut blob = Vec::new();
    client
        .pull_blob(&reference, manifest.config().digest().as_ref(), &mut blob)
        .await
        .map_err(|e| fail("reading the config", e))?;
    let config = ImageConfiguration::from_reader(blob.as_slice()).map_err(|error| {
        RegistryError::ConfigNotOci {
            image: image.to_string(),
            error,
        }
    })?;
    Ok(ImageFacts {
        from: url,
        id: Some(manifest.config().digest().to_string()),
        manifest_digest: Some(digest),
        repo_digests: Vec::new(),
        config,
        manifest: Some(manifest),
    })
}
