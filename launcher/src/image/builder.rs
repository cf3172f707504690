//! `launcher image build`: the Containerfile built by the engine's classic builder from a
//! context streamed as tar, optionally with the run config baked in and the host's binaries as
//! `prebuilt/`. The config is validated by the trainer's own rules (the shared `scdino-config`
//! crate) before the engine sees anything.
use super::context::Context;
use super::engine::engine_error;
use super::provenance as prov;
use super::reference::ImageRef;
use super::{BuildError, EngineError, ImageError, BAKED_CONFIG_PATH, CONFIG_DIGEST_LABEL};
use bollard::query_parameters::{BuildImageOptions, TagImageOptionsBuilder};
use bollard::Docker;
use futures_util::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Name of the generated Containerfile inside the context (the user's file plus the bake step).
const GENERATED_FILE: &str = ".launcher/Containerfile";
/// Where the baked config travels inside the context.
const CONTEXT_CONFIG: &str = ".launcher/config.yaml";

#[derive(Debug, Clone)]
pub struct BuildRequest {
    /// The context root (the repository).
    pub context: PathBuf,
    /// The Containerfile, relative to the current directory.
    pub file: PathBuf,
    /// At least one; the first is built, the others tagged onto it.
    pub tags: Vec<ImageRef>,
    pub build_args: BTreeMap<String, String>,
    pub target: Option<String>,
    /// A trainer run config to bake into the image.
    pub config: Option<PathBuf>,
    /// Folder holding the built `trainer` and `launcher` for `BINARIES=prebuilt`.
    pub prebuilt_dir: PathBuf,
    /// The venv whose wheels the prebuilt libraries come from (provenance labels only).
    pub venv: PathBuf,
    /// `networkmode` of the RUN steps (`host` where the engine has no bridge).
    pub network: Option<String>,
    pub no_cache: bool,
}

/// Validates the run config with the trainer's rules; `(text, sha256 hex)` of the very bytes
/// that were validated (and will be baked).
pub fn validated_config(path: &Path) -> Result<(String, String), ImageError> {
    let text = std::fs::read_to_string(path).map_err(|source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    scdino_config::Config::from_yaml(&text, &path.display().to_string())?;
    let digest = crate::fsutil::sha256_hex(text.as_bytes());
    Ok((text, digest))
}

/// Everything decided before the engine is contacted: the generated Containerfile, the
/// context and the labels. Errors here (bad config, missing binaries) start no build.
pub struct Prepared {
    pub context: Context,
    pub labels: BTreeMap<String, String>,
    /// Keeps the staged prebuilt folder alive until the context is streamed.
    _staging: Option<tempfile::TempDir>,
}

pub fn prepare(req: &BuildRequest) -> Result<Prepared, ImageError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ImageError::Io { path, source }
    };
    // The config first: a config that does not validate must stop everything.
    let baked = req.config.as_deref().map(validated_config).transpose()?;
    let mut file_text = std::fs::read_to_string(&req.file).map_err(io(&req.file))?;
    let defaults = prov::arg_defaults(&file_text);
    let arg = |k: &str| {
        req.build_args
            .get(k)
            .or_else(|| defaults.get(k))
            .cloned()
            .unwrap_or_default()
    };
    let prebuilt = arg("BINARIES") == "prebuilt";

    let mut labels = BTreeMap::new();
    labels.insert(prov::TITLE.into(), "scdino-trainer".into());
    labels.insert(prov::VERSION.into(), env!("CARGO_PKG_VERSION").into());
    labels.insert(
        prov::CREATED.into(),
        prov::rfc3339(prov::now_or_source_date_epoch()),
    );
    labels.insert(
        prov::REVISION.into(),
        prov::git_revision(&req.context).unwrap_or_else(|| "unknown".into()),
    );
    if let Some(src) = prov::git_source(&req.context) {
        labels.insert(prov::SOURCE.into(), src);
    }
    let base = arg("CUDA_IMAGE");
    labels.insert(prov::BASE.into(), base.clone());
    labels.insert(
        prov::EFA.into(),
        match arg("EFA_INSTALLER_VERSION") {
            v if v.is_empty() => "none".into(),
            v => v,
        },
    );
    labels.insert(
        prov::BINARIES.into(),
        if prebuilt { "prebuilt" } else { "source" }.into(),
    );
    let wheels = prov::wheel_versions(&req.venv);
    let reqs =
        std::fs::read_to_string(req.context.join("scripts/requirements.txt")).unwrap_or_default();
    let torch = if prebuilt {
        wheels.torch.clone()
    } else {
        prov::torch_pin(&reqs)
    };
    labels.insert(
        prov::TORCH.into(),
        torch.unwrap_or_else(|| "unknown".into()),
    );
    // libtorch brings its CUDA runtime from the wheels; the base image's CUDA is what the
    // driver must support as well. Both are recorded.
    let cuda = match (wheels.cuda_runtime.clone(), prov::cuda_of_base(&base)) {
        (Some(w), Some(b)) => format!("{w} (wheel), {b} (base image)"),
        (Some(w), None) => format!("{w} (wheel); base image without CUDA"),
        (None, Some(b)) => format!("{b} (base image)"),
        (None, None) => "unknown".into(),
    };
    labels.insert(prov::CUDA.into(), cuda);

    let mut context = Context::scan(&req.context)?;
    let mut staging = None;
    if prebuilt {
        let dir = tempfile::tempdir().map_err(io(Path::new("<tempdir>")))?;
        let out = dir.path().join("prebuilt");
        stage_prebuilt(&req.context, &req.prebuilt_dir, &out)?;
        // NCCL is in the image only if the prebuilt trainer loads it.
        let nccl = std::fs::read_dir(out.join("lib"))
            .map_err(io(&out))?
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("libnccl"));
        labels.insert(
            prov::NCCL.into(),
            match (nccl, wheels.nccl.clone()) {
                (true, Some(v)) => v,
                (true, None) => "unknown".into(),
                (false, _) => "none (trainer built without the nccl feature)".into(),
            },
        );
        context.add_tree("prebuilt", &out)?;
        staging = Some(dir);
    } else {
        labels.insert(
            prov::NCCL.into(),
            wheels.nccl.clone().unwrap_or_else(|| "unknown".into()),
        );
    }

    if let Some((text, digest)) = &baked {
        if let Some(t) = &req.target {
            if last_stage(&file_text).as_deref() != Some(t.as_str()) {
                return Err(BuildError::TargetNotFinal {
                    target: t.clone(),
                    containerfile: req.file.clone(),
                }
                .into());
            }
        }
        file_text.push_str(&format!(
            "\n# Added by launcher image build --config: the run config, baked.\nCOPY {CONTEXT_CONFIG} {BAKED_CONFIG_PATH}\n"
        ));
        context.add_bytes(CONTEXT_CONFIG, text.clone().into_bytes());
        labels.insert(CONFIG_DIGEST_LABEL.into(), digest.clone());
    }
    context.add_bytes(GENERATED_FILE, file_text.into_bytes());
    Ok(Prepared {
        context,
        labels,
        _staging: staging,
    })
}

/// `AS name` of the last FROM line.
fn last_stage(containerfile: &str) -> Option<String> {
    containerfile
        .lines()
        .rfind(|l| l.trim_start().to_ascii_uppercase().starts_with("FROM "))
        .and_then(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let i = words.iter().position(|w| w.eq_ignore_ascii_case("AS"))?;
            words.get(i + 1).map(|s| s.to_string())
        })
}

/// Runs scripts/stage-runtime.sh on the host's binaries: the same staging the source build does.
fn stage_prebuilt(root: &Path, bin_dir: &Path, out: &Path) -> Result<(), ImageError> {
    let bins: Vec<PathBuf> = ["trainer", "launcher"]
        .iter()
        .map(|b| bin_dir.join(b))
        .collect();
    for b in &bins {
        if !b.is_file() {
            return Err(BuildError::PrebuiltMissing { binary: b.clone() }.into());
        }
    }
    let script = root.join("scripts/stage-runtime.sh");
    let res = std::process::Command::new(&script)
        .arg(out)
        .args(&bins)
        .output()
        .map_err(|source| ImageError::Io {
            path: script.clone(),
            source,
        })?;
    if !res.status.success() {
        return Err(BuildError::StagingFailed {
            script,
            stderr: String::from_utf8_lossy(&res.stderr).trim().to_string(),
        }
        .into());
    }
    Ok(())
}

/// Where build output goes: a progress bar with the step on a terminal, plain lines otherwise.
pub struct BuildLog {
    bar: Option<indicatif::ProgressBar>,
    /// The last `Step N/M : …` line, named when a step fails.
    step: Option<String>,
}

impl BuildLog {
    pub fn new(terminal: bool) -> Self {
        let text_log = scdino_base::log::current_format() == scdino_base::log::LogFormat::Text;
        let bar = (terminal && text_log).then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{pos}/{len}] {elapsed} {wide_msg}",
                )
                .expect("static template"),
            );
            b.enable_steady_tick(std::time::Duration::from_millis(200));
            b
        });
        Self { bar, step: None }
    }

    fn line(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("Step ") {
            // `Step 3/12 : RUN …`
            if let Some((nm, what)) = rest.split_once(" : ") {
                if let Some((n, m)) = nm.split_once('/') {
                    if let (Ok(n), Ok(m), Some(b)) = (n.parse(), m.parse(), &self.bar) {
                        b.set_length(m);
                        b.set_position(n);
                        b.set_message(what.to_string());
                    }
                }
            }
            self.step = Some(line.to_string());
        }
        match &self.bar {
            Some(b) => b.println(line),
            None => tracing::info!("{line}"),
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Streams the context to the engine and follows the build; tags the extra tags. The image ID
/// (`sha256:…`).
pub async fn build(
    docker: &Docker,
    req: &BuildRequest,
    prepared: Prepared,
    log: &mut BuildLog,
) -> Result<String, ImageError> {
    let Prepared {
        context,
        labels,
        _staging,
    } = prepared;
    let first = req.tags.first().ok_or(BuildError::NoTag)?;
    let options = BuildImageOptions {
        dockerfile: GENERATED_FILE.into(),
        t: Some(first.to_string()),
        rm: true,
        forcerm: true,
        nocache: req.no_cache,
        buildargs: Some(
            req.build_args
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>(),
        ),
        labels: Some(labels.into_iter().collect()),
        target: req.target.clone().unwrap_or_default(),
        networkmode: req.network.clone(),
        ..Default::default()
    };
    let (body, writer) = context.into_stream();
    let mut stream = docker.build_image(options, None, Some(bollard::body_stream(body)));
    let mut id = None;
    let mut partial = String::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(text) = info.stream {
                    partial.push_str(&text);
                    while let Some(i) = partial.find('\n') {
                        let line: String = partial.drain(..=i).collect();
                        log.line(line.trim_end());
                    }
                }
                if let Some(img) = info.aux {
                    id = img.id.or(id);
                }
            }
            Err(bollard::errors::Error::DockerStreamError { error }) => {
                log.finish();
                return Err(ImageError::BuildStep {
                    step: log.step.clone().unwrap_or_else(|| "the first step".into()),
                    message: error.trim().to_string(),
                });
            }
            Err(e) => {
                log.finish();
                // A context that could not be written is the more useful error.
                if let Ok(Err(w)) = writer.await {
                    return Err(w);
                }
                return Err(engine_error("image build", e));
            }
        }
    }
    log.finish();
    if !partial.trim().is_empty() {
        log.line(partial.trim_end());
    }
    writer.await.map_err(BuildError::ContextWriter)??;
    let id = match id {
        Some(id) => id,
        // Older engines announce the ID only in the stream text.
        None => docker
            .inspect_image(&first.to_string())
            .await
            .map_err(|e| engine_error("inspecting the built image", e))?
            .id
            .ok_or(EngineError::NoImageId)?,
    };
    for tag in &req.tags[1..] {
        let opts = TagImageOptionsBuilder::default()
            .repo(&tag.name())
            .tag(tag.tag_or_latest())
            .build();
        docker
            .tag_image(&id, Some(opts))
            .await
            .map_err(|e| engine_error(&format!("tagging {tag}"), e))?;
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_stage_name() {
        let f = "FROM a AS build\nRUN x\nfrom b as runtime\n";
        assert_eq!(last_stage(f).as_deref(), Some("runtime"));
        assert_eq!(last_stage("FROM a\n"), None);
    }
}
