//! `cluster.yaml`: where and how the pipeline runs on Slurm. Strict like the trainer's config:
//! unknown keys are errors, and values that parse but make no sense are reported with the key
//! and its line. Secrets are never values of this file: `secrets:` lists environment variable
//! *names* that the job inherits from the submitting shell.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use yaml_locate::KeyLines;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot read cluster file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Syntax, type and unknown-key errors; the message carries line, column and a snippet.
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}{}: `{key}`: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        origin: String,
        key: String,
        line: Option<usize>,
        message: String,
    },
}

/// How each stage's program is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// `srun --container-image=...` through the Pyxis SPANK plugin (Enroot).
    #[default]
    Pyxis,
    /// The trainer binary from a shared filesystem (clusters without Pyxis, and the tests).
    Host,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Cluster {
    /// The trainer config every stage runs (`--config` on the command line overrides it).
    pub trainer_config: Option<PathBuf>,
    pub runtime: Runtime,
    /// Working directory of every stage (relative paths in the trainer config resolve here).
    /// Host runtime: `#SBATCH --chdir`; Pyxis: `--container-workdir`. Default: the directory
    /// `launcher render` runs in.
    pub workdir: Option<PathBuf>,
    pub slurm: SlurmSection,
    pub container: ContainerSection,
    pub host: HostSection,
    /// Tunables (NCCL_*, FI_*, ...): exported by the batch script and, with Pyxis, listed in
    /// `--container-env` so they beat values baked into the image.
    pub env: BTreeMap<String, String>,
    /// Names (never values) of variables the job inherits from the submitting environment, e.g.
    /// `AWS_ACCESS_KEY_ID`. With Pyxis they are added to `--container-env` by name.
    pub secrets: Vec<String>,
    pub training: TrainingSection,
    /// The stages to render, in pipeline order. Default: all of them.
    pub stages: Vec<String>,
    /// Where the file came from, for messages about values checked later (at render time).
    #[serde(skip)]
    pub source: Source,
}

/// The file a cluster was read from and the line of each key; not part of its meaning (two
/// clusters that say the same are equal wherever they were written).
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub origin: String,
    pub lines: KeyLines,
}

impl PartialEq for Source {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Default for Cluster {
    fn default() -> Self {
        Self {
            trainer_config: None,
            runtime: Runtime::Pyxis,
            workdir: None,
            slurm: SlurmSection::default(),
            container: ContainerSection::default(),
            host: HostSection::default(),
            env: BTreeMap::new(),
            secrets: Vec::new(),
            training: TrainingSection::default(),
            stages: crate::render::STAGES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            source: Source::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlurmSection {
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// Nodes of a training job (other stages use one node).
    pub nodes: u32,
    /// GPUs per node; training runs one task per GPU (`--ntasks-per-node`), or one task per
    /// node when 0 (CPU clusters, tests).
    pub gpus_per_node: u32,
    /// Training ranks per node. Default: one per GPU, or 1 without GPUs. Set it on CPU
    /// clusters (and in tests) to run several Gloo ranks per node; with GPUs it must equal
    /// `gpus_per_node` (each rank owns one device).
    pub tasks_per_node: Option<u32>,
    pub cpus_per_task: u32,
    /// Memory per node (`--mem`): `0` (all of it), or a number with an optional K/M/G/T suffix.
    pub mem: Option<String>,
    /// Time limit of every job (one training segment): `MM`, `HH:MM:SS`, `D-HH:MM:SS`, ...
    pub time: String,
    /// Where job output goes (`<log_dir>/<stage>-<jobid>.out`). Default: `<out>/logs`.
    pub log_dir: Option<PathBuf>,
}

impl SlurmSection {
    /// Ranks per node of a distributed job.
    pub fn ranks_per_node(&self) -> u32 {
        self.tasks_per_node.unwrap_or(self.gpus_per_node.max(1))
    }
}

impl Default for SlurmSection {
    fn default() -> Self {
        Self {
            partition: None,
            account: None,
            qos: None,
            nodes: 1,
            gpus_per_node: 0,
            tasks_per_node: None,
            cpus_per_task: 1,
            mem: None,
            time: "01:00:00".into(),
            log_dir: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContainerSection {
    /// `REGISTRY#IMAGE:TAG` (Enroot 3.x syntax) or an absolute path to a `.sqsh` file; with
    /// `enroot_version: 4` also Docker-style `REGISTRY/IMAGE[:TAG][@sha256:…]` (digest-pinned).
    pub image: Option<String>,
    /// The Enroot the cluster runs: 3 (the norm on ParallelCluster/HyperPod AMIs) or 4, which
    /// adds Docker-style references and digests.
    pub enroot_version: u32,
    /// `SRC:DST[:FLAGS]`, SRC absolute (or `tmpfs`); flags joined with `+` (e.g. `ro+rprivate`).
    pub mounts: Vec<String>,
    /// The trainer inside the image.
    pub trainer: PathBuf,
    /// Mount the home directory (`--container-mount-home`); off by default.
    pub mount_home: bool,
}

impl Default for ContainerSection {
    fn default() -> Self {
        Self {
            image: None,
            enroot_version: 3,
            mounts: Vec::new(),
            trainer: "/opt/scdino/bin/trainer".into(),
            mount_home: false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostSection {
    /// The trainer binary on a filesystem every node sees (runtime: host).
    pub trainer: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainingSection {
    /// Training jobs per channel combination, chained with `afterany`; each resumes from the
    /// last checkpoint. Use > 1 when one time limit cannot hold the whole training.
    pub segments: u32,
    /// Seconds before the time limit at which Slurm sends USR1 to the batch shell
    /// (`--signal=B:USR1@<grace>`); the trainer checkpoints at the next step and exits 75.
    pub signal_grace_seconds: u32,
    /// `--requeue`, and a job whose trainer stopped on notice (exit 75) requeues itself.
    pub requeue: bool,
    /// `trainer train --max-steps` (global iteration at which every segment stops).
    pub max_steps: Option<u64>,
    /// `trainer train --threads`.
    pub threads: Option<u32>,
}

impl Default for TrainingSection {
    fn default() -> Self {
        Self {
            segments: 1,
            signal_grace_seconds: 120,
            requeue: true,
            max_steps: None,
            threads: None,
        }
    }
}

impl Cluster {
    pub fn load(path: &Path) -> Result<Self, ClusterError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClusterError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ClusterError> {
        let mut cluster: Cluster = if text.trim().is_empty() {
            Cluster::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| ClusterError::Parse {
                origin: origin.to_string(),
                message: e.to_string(),
            })?
        };
        cluster.source = Source {
            origin: origin.to_string(),
            lines: KeyLines::scan(text),
        };
        cluster.validate(&cluster.validator())?;
        Ok(cluster)
    }

    /// Reports a value of this file that is refused after loading (e.g. a path that no
    /// container mount covers), with its key and line.
    pub fn invalid(&self, key: &str, message: &str) -> ClusterError {
        self.validator().err(key, message)
    }

    fn validator(&self) -> Validator<'_> {
        Validator {
            origin: &self.source.origin,
            lines: &self.source.lines,
        }
    }

    /// Time limit in seconds (`None` = unlimited).
    pub fn time_limit_seconds(&self) -> Option<u64> {
        parse_time(&self.slurm.time).ok().flatten()
    }

    fn validate(&self, v: &Validator) -> Result<(), ClusterError> {
        let s = &self.slurm;
        v.check(s.nodes >= 1, "slurm.nodes", "must be at least 1")?;
        if let Some(t) = s.tasks_per_node {
            v.check(t >= 1, "slurm.tasks_per_node", "must be at least 1")?;
            v.check(
                s.gpus_per_node == 0 || t == s.gpus_per_node,
                "slurm.tasks_per_node",
                &format!(
                    "is {t} but must equal slurm.gpus_per_node ({}): one rank per GPU",
                    s.gpus_per_node
                ),
            )?;
        }
        v.check(
            s.cpus_per_task >= 1,
            "slurm.cpus_per_task",
            "must be at least 1",
        )?;
        for (key, value) in [
            ("slurm.partition", &s.partition),
            ("slurm.account", &s.account),
            ("slurm.qos", &s.qos),
        ] {
            if let Some(x) = value {
                v.check(
                    !x.is_empty()
                        && x.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_.,".contains(&b)),
                    key,
                    &format!("{x:?} is not a Slurm name (letters, digits, '-', '_', '.', ',')"),
                )?;
            }
        }
        if let Some(mem) = &s.mem {
            let digits = mem.trim_end_matches(['K', 'M', 'G', 'T']);
            v.check(
                !digits.is_empty()
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && mem.len() - digits.len() <= 1,
                "slurm.mem",
                &format!("{mem:?} must be 0 (all memory of the node) or a number with an optional K, M, G or T suffix, e.g. 64G"),
            )?;
        }
        let limit = parse_time(&s.time).map_err(|m| v.err("slurm.time", &m))?;
        if let Some(dir) = &s.log_dir {
            directive_path(v, "slurm.log_dir", dir)?;
            v.check(
                !dir.to_string_lossy().contains('%'),
                "slurm.log_dir",
                "must not contain '%' (Slurm reads it as a file-name pattern)",
            )?;
        }
        if let Some(w) = &self.workdir {
            directive_path(v, "workdir", w)?;
            v.check(w.is_absolute(), "workdir", "must be an absolute path")?;
        }

        match self.runtime {
            Runtime::Pyxis => {
                let image = self.container.image.as_deref().ok_or_else(|| {
                    v.err(
                        "container.image",
                        "runtime pyxis needs an image: REGISTRY#IMAGE:TAG or an absolute .sqsh path",
                    )
                })?;
                v.check(
                    matches!(self.container.enroot_version, 3 | 4),
                    "container.enroot_version",
                    "must be 3 or 4",
                )?;
                check_image_for(image, self.container.enroot_version)
                    .map_err(|e| v.err("container.image", &e.to_string()))?;
                for (i, m) in self.container.mounts.iter().enumerate() {
                    check_mount(m)
                        .map_err(|e| v.err(&format!("container.mounts[{i}]"), &e.to_string()))?;
                }
                v.check(
                    self.container.trainer.is_absolute(),
                    "container.trainer",
                    "must be an absolute path inside the image",
                )?;
            }
            Runtime::Host => {
                let t = self.host.trainer.as_deref().ok_or_else(|| {
                    v.err(
                        "host.trainer",
                        "runtime host needs the trainer binary's path on a filesystem every node sees",
                    )
                })?;
                v.check(t.is_absolute(), "host.trainer", "must be an absolute path")?;
            }
        }

        for key in self.env.keys() {
            let k = format!("env.{key}");
            v.check(
                is_env_name(key),
                &k,
                "is not an environment variable name (letters, digits, '_', not starting with a digit)",
            )?;
            v.check(
                !looks_like_secret(key),
                &k,
                "looks like a credential: never write secrets into cluster.yaml (they would end up in the scripts); list the name under `secrets:` and export it in the shell that runs `launcher submit`",
            )?;
            v.check(
                !RESERVED_ENV.contains(&key.as_str()),
                &k,
                "is set by the batch script itself (rendezvous) and cannot be overridden here",
            )?;
        }
        for (i, name) in self.secrets.iter().enumerate() {
            v.check(
                is_env_name(name),
                &format!("secrets[{i}]"),
                &format!("{name:?} must be the NAME of an environment variable, not its value"),
            )?;
            v.check(
                !self.env.contains_key(name),
                &format!("secrets[{i}]"),
                &format!("{name} is also under env:"),
            )?;
        }

        let t = &self.training;
        v.check(t.segments >= 1, "training.segments", "must be at least 1")?;
        v.check(
            t.signal_grace_seconds <= 65535,
            "training.signal_grace_seconds",
            "must be at most 65535 (Slurm's limit)",
        )?;
        if let Some(limit) = limit {
            v.check(
                u64::from(t.signal_grace_seconds) < limit,
                "training.signal_grace_seconds",
                &format!(
                    "is {} s but the time limit slurm.time is only {limit} s",
                    t.signal_grace_seconds
                ),
            )?;
        }
        v.check(
            t.max_steps != Some(0),
            "training.max_steps",
            "must be positive",
        )?;
        v.check(t.threads != Some(0), "training.threads", "must be positive")?;

        v.check(!self.stages.is_empty(), "stages", "list at least one stage")?;
        let mut last = None;
        for (i, st) in self.stages.iter().enumerate() {
            let key = format!("stages[{i}]");
            let pos = crate::render::STAGES
                .iter()
                .position(|s| s == st)
                .ok_or_else(|| {
                    v.err(
                        &key,
                        &format!(
                            "unknown stage {st:?}; the stages are {}",
                            crate::render::STAGES.join(", ")
                        ),
                    )
                })?;
            v.check(
                last.is_none_or(|l| pos > l),
                &key,
                &format!(
                    "stage {st:?} is out of order or repeated; pipeline order: {}",
                    crate::render::STAGES.join(", ")
                ),
            )?;
            last = Some(pos);
        }
        Ok(())
    }
}

/// Variables the training batch script sets itself.
pub const RESERVED_ENV: [&str; 2] = ["MASTER_ADDR", "MASTER_PORT"];

pub fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.as_bytes()[0].is_ascii_digit()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Names that hold credentials by convention (AWS_SECRET_ACCESS_KEY, HF_TOKEN, ...).
pub fn looks_like_secret(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    [
        "SECRET",
        "TOKEN",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "PRIVATE",
        "ACCESS_KEY",
        "API_KEY",
    ]
    .iter()
    .any(|w| n.contains(w))
}

/// Slurm time formats → seconds; `Ok(None)` for UNLIMITED/INFINITE.
pub fn parse_time(t: &str) -> Result<Option<u64>, String> {
    let bad = || {
        format!("{t:?} is not a Slurm time limit: write MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    };
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") {
        return Ok(None);
    }
    let num = |s: &str| -> Result<u64, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 6 {
            Err(bad())
        } else {
            s.parse().map_err(|_| bad())
        }
    };
    let secs = if let Some((d, rest)) = t.split_once('-') {
        let parts: Vec<&str> = rest.split(':').collect();
        let hms = match parts.as_slice() {
            [h] => num(h)? * 3600,
            [h, m] => num(h)? * 3600 + num(m)? * 60,
            [h, m, s] => num(h)? * 3600 + num(m)? * 60 + num(s)?,
            _ => return Err(bad()),
        };
        num(d)? * 86400 + hms
    } else {
        let parts: Vec<&str> = t.split(':').collect();
        match parts.as_slice() {
            [m] => num(m)? * 60,
            [m, s] => num(m)? * 60 + num(s)?,
            [h, m, s] => num(h)? * 3600 + num(m)? * 60 + num(s)?,
            _ => return Err(bad()),
        }
    };
    if secs == 0 {
        return Err(format!("{t:?} is a zero time limit"));
    }
    Ok(Some(secs))
}

/// Why `container.image` cannot be given to Pyxis/Enroot as written; each says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefError {
    #[error("{0:?} is not a squashfs file path")]
    NotAFilePath(String),
    #[error("{0:?}: use an absolute .sqsh path (compute nodes do not share the submit directory's meaning)")]
    RelativeSquashfs(String),
    #[error("{0:?} would be pulled from Docker Hub (Pyxis treats only paths starting with '/' or '.' as files): write the absolute path")]
    SquashfsFromHub(String),
    #[error("{0:?}: digests need Enroot 4; pin a tag (REGISTRY#IMAGE:TAG) for Enroot 3.x")]
    DigestNeedsEnroot4(String),
    #[error("{image:?}: registry {registry:?} is not a host name")]
    Registry { image: String, registry: String },
    #[error("{image:?} looks like a Docker-style registry/image reference; Enroot 3.x needs REGISTRY#IMAGE:TAG, e.g. {suggestion}")]
    DockerStyle { image: String, suggestion: String },
    #[error("{image:?}: image name {name:?} may hold only lower-case letters, digits, '/', '.', '_', '-'")]
    Name { image: String, name: String },
    #[error("{image:?}: tag {tag:?} may hold only letters, digits, '.', '_', '-'")]
    Tag { image: String, tag: String },
    #[error(
        "{reason} (Enroot 4 syntax: REGISTRY/IMAGE[:TAG][@sha256:HEX] or REGISTRY#IMAGE[:TAG])"
    )]
    Enroot4 { reason: String },
}

/// Why a `container.mounts` entry is not a Pyxis mount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    #[error("{0:?}: one mount per list entry, without ',' (Pyxis separates mounts with ',')")]
    Several(String),
    #[error("{0:?} must be SRC:DST or SRC:DST:FLAGS (flags joined with '+')")]
    Shape(String),
    #[error("{0:?}: the source must be an absolute path (or tmpfs/umount)")]
    Source(String),
    #[error("{0:?}: the destination must be an absolute path")]
    Destination(String),
}

/// An image reference as the cluster's Enroot reads it: Enroot 4 also takes Docker-style
/// `REGISTRY/IMAGE[:TAG][@sha256:HEX]` (commit f29a45c), which pins the exact image by digest.
pub fn check_image_for(image: &str, enroot_version: u32) -> Result<(), ImageRefError> {
    if enroot_version < 4 || image.starts_with('/') || image.starts_with('.') {
        return check_image(image);
    }
    let uri = image.strip_prefix("docker://").unwrap_or(image);
    // Enroot 4 still accepts `[USER@]REGISTRY#IMAGE`: validate it as REGISTRY/IMAGE.
    let docker = match uri.split_once('#') {
        Some((reg, rest)) => format!("{}/{rest}", reg.rsplit_once('@').map_or(reg, |(_, r)| r)),
        None => uri.to_string(),
    };
    crate::image::reference::ImageRef::parse(&docker)
        .map(|_| ())
        .map_err(|e| ImageRefError::Enroot4 {
            reason: e.to_string(),
        })
}

/// Enroot 3.x image references: `[USER@][REGISTRY#]IMAGE[:TAG]`, or a squashfs path.
pub fn check_image(image: &str) -> Result<(), ImageRefError> {
    if image.starts_with('/') {
        return if image.ends_with('/') || image.contains('\n') {
            Err(ImageRefError::NotAFilePath(image.into()))
        } else {
            Ok(())
        };
    }
    if image.starts_with('.') {
        return Err(ImageRefError::RelativeSquashfs(image.into()));
    }
    if image.ends_with(".sqsh") {
        return Err(ImageRefError::SquashfsFromHub(image.into()));
    }
    let rest = image
        .strip_prefix("docker://")
        .unwrap_or(image)
        .rsplit_once('@')
        .map_or(image, |(_, r)| r);
    if image.contains("@sha256:") {
        return Err(ImageRefError::DigestNeedsEnroot4(image.into()));
    }
    let (registry, name_tag) = match rest.split_once('#') {
        Some((r, n)) => (Some(r), n),
        None => (None, rest),
    };
    if let Some(r) = registry {
        if r.is_empty()
            || !r
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
        {
            return Err(ImageRefError::Registry {
                image: image.into(),
                registry: r.into(),
            });
        }
    }
    let (name, tag) = match name_tag.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (name_tag, None),
    };
    if registry.is_none() {
        if let Some(first) = name.split('/').next() {
            if name.contains('/')
                && (first.contains('.') || first.contains(':') || first == "localhost")
            {
                return Err(ImageRefError::DockerStyle {
                    image: image.into(),
                    suggestion: format!("{}#{}", first, &image[first.len() + 1..]),
                });
            }
        }
    }
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"/._-".contains(&b))
    {
        return Err(ImageRefError::Name {
            image: image.into(),
            name: name.into(),
        });
    }
    if let Some(t) = tag {
        if t.is_empty()
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(ImageRefError::Tag {
                image: image.into(),
                tag: t.into(),
            });
        }
    }
    Ok(())
}

/// One Pyxis mount: `SRC[:DST[:FLAGS]]`.
pub fn check_mount(m: &str) -> Result<(), MountError> {
    if m.contains(',') || m.contains('\n') {
        return Err(MountError::Several(m.into()));
    }
    let parts: Vec<&str> = m.split(':').collect();
    if parts.len() > 3 || parts.iter().any(|p| p.is_empty()) {
        return Err(MountError::Shape(m.into()));
    }
    let src = parts[0];
    if !(src.starts_with('/') || src == "tmpfs" || src == "umount") {
        return Err(MountError::Source(m.into()));
    }
    if let Some(dst) = parts.get(1) {
        if !dst.starts_with('/') {
            return Err(MountError::Destination(m.into()));
        }
    }
    Ok(())
}

/// The container path of a host path, through the mounts (`None` when no mount covers it).
pub fn container_path(mounts: &[String], host: &Path) -> Option<PathBuf> {
    mounts
        .iter()
        .filter_map(|m| {
            let mut p = m.split(':');
            let src = Path::new(p.next()?);
            let dst = p.next().map(Path::new).unwrap_or(src);
            let rel = host.strip_prefix(src).ok()?;
            // `dst.join("")` would add a trailing '/'.
            let inside = if rel.as_os_str().is_empty() {
                dst.to_path_buf()
            } else {
                dst.join(rel)
            };
            Some((src.as_os_str().len(), inside))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, p)| p)
}

/// Paths that go into `#SBATCH` lines: sbatch reads quotes there but eats backslashes.
fn directive_path(v: &Validator, key: &str, p: &Path) -> Result<(), ClusterError> {
    let s = p.to_string_lossy();
    v.check(
        !s.contains('\\') && !s.contains('\n'),
        key,
        "must not contain a backslash or a newline (sbatch cannot read them in #SBATCH lines)",
    )
}

pub(crate) struct Validator<'a> {
    pub origin: &'a str,
    pub lines: &'a KeyLines,
}

impl Validator<'_> {
    pub fn err(&self, key: &str, message: &str) -> ClusterError {
        ClusterError::Invalid {
            origin: self.origin.to_string(),
            key: key.to_string(),
            line: self.lines.line_of(key),
            message: message.to_string(),
        }
    }

    pub fn check(&self, ok: bool, key: &str, message: &str) -> Result<(), ClusterError> {
        if ok {
            Ok(())
        } else {
            Err(self.err(key, message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(yaml: &str) -> String {
        Cluster::from_yaml(yaml, "c.yaml").unwrap_err().to_string()
    }

    const HOST: &str = "runtime: host\nhost:\n  trainer: /opt/trainer\n";

    #[test]
    fn unknown_keys_are_errors_with_a_line() {
        let e = err("runtime: host\nhost:\n  trainer: /t\nslurm:\n  nodse: 2\n");
        assert!(
            e.contains("c.yaml") && e.contains("nodse") && e.contains("line 5"),
            "{e}"
        );
    }

    #[test]
    fn invalid_values_name_key_and_line() {
        let e = err(&format!("{HOST}slurm:\n  time: 90 minutes\n"));
        assert!(e.starts_with("c.yaml:5: `slurm.time`"), "{e}");
        let e = err(&format!(
            "{HOST}training:\n  signal_grace_seconds: 600\nslurm:\n  time: \"5\"\n"
        ));
        assert!(
            e.starts_with("c.yaml:5: `training.signal_grace_seconds`"),
            "{e}"
        );
        let e = err(&format!("{HOST}stages: [train, mean-std]\n"));
        assert!(
            e.contains("`stages[1]`") && e.contains("out of order"),
            "{e}"
        );
        let e = err(&format!("{HOST}stages: [trian]\n"));
        assert!(e.contains("unknown stage"), "{e}");
        let e = err("runtime: pyxis\n");
        assert!(e.contains("`container.image`"), "{e}");
        let e = err("runtime: host\n");
        assert!(e.contains("`host.trainer`"), "{e}");
        let e = err(&format!("{HOST}slurm:\n  mem: 64GB\n"));
        assert!(e.contains("`slurm.mem`"), "{e}");
        let e = err(&format!(
            "{HOST}slurm:\n  gpus_per_node: 4\n  tasks_per_node: 2\n"
        ));
        assert!(
            e.contains("`slurm.tasks_per_node`") && e.contains("one rank per GPU"),
            "{e}"
        );
    }

    #[test]
    fn credentials_are_refused_as_values() {
        let e = err(&format!(
            "{HOST}env:\n  NCCL_DEBUG: INFO\n  AWS_SECRET_ACCESS_KEY: abc\n"
        ));
        assert!(
            e.starts_with("c.yaml:6: `env.AWS_SECRET_ACCESS_KEY`") && e.contains("secrets:"),
            "{e}"
        );
        let e = err(&format!("{HOST}secrets: [\"AKIA=xyz\"]\n"));
        assert!(e.contains("`secrets[0]`") && e.contains("NAME"), "{e}");
        let ok =
            Cluster::from_yaml(&format!("{HOST}secrets: [AWS_SECRET_ACCESS_KEY]\n"), "c").unwrap();
        assert_eq!(ok.secrets, ["AWS_SECRET_ACCESS_KEY"]);
    }

    #[test]
    fn time_formats() {
        assert_eq!(parse_time("30"), Ok(Some(1800)));
        assert_eq!(parse_time("1:30"), Ok(Some(90)));
        assert_eq!(parse_time("02:00:00"), Ok(Some(7200)));
        assert_eq!(parse_time("1-0"), Ok(Some(86400)));
        assert_eq!(parse_time("1-02:03:04"), Ok(Some(93784)));
        assert_eq!(parse_time("UNLIMITED"), Ok(None));
        assert!(parse_time("1h").is_err() && parse_time("").is_err() && parse_time("0").is_err());
    }

    #[test]
    fn images_in_enroot_3_syntax() {
        for ok in [
            "nvcr.io#nvidia/pytorch:25.06-py3",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com#scdino:v1",
            "ubuntu",
            "library/ubuntu:24.04",
            "/fsx/images/scdino.sqsh",
            "user@registry.example.com:5000#team/img:tag",
        ] {
            assert_eq!(check_image(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            (
                "nvcr.io/nvidia/pytorch:25.06-py3",
                "nvcr.io#nvidia/pytorch:25.06-py3",
            ),
            ("scdino.sqsh", "Docker Hub"),
            ("./scdino.sqsh", "absolute"),
            ("nvcr.io#nvidia/pytorch@sha256:abcd", "Enroot 4"),
            ("Registry#UPPER:tag", "lower-case"),
        ] {
            let e = check_image(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn images_in_enroot_4_syntax_take_digests() {
        let d = format!("sha256:{}", "0123456789abcdef".repeat(4));
        for ok in [
            format!("123456789012.dkr.ecr.us-east-1.amazonaws.com/scdino@{d}"),
            format!("127.0.0.1:5555/scdino/trainer:ci@{d}"),
            "nvcr.io/nvidia/pytorch:25.06-py3".to_string(),
            "nvcr.io#nvidia/pytorch:25.06-py3".to_string(),
            "/fsx/images/sha256-x.sqsh".to_string(),
        ] {
            assert_eq!(check_image_for(&ok, 4), Ok(()), "{ok}");
        }
        // Enroot 3 keeps refusing digests; Enroot 4 refuses a malformed one.
        assert!(matches!(
            check_image_for(&format!("nvcr.io#nvidia/pytorch@{d}"), 3),
            Err(ImageRefError::DigestNeedsEnroot4(_))
        ));
        assert!(check_image_for("nvcr.io/x@sha256:12", 4).is_err());
        assert!(matches!(
            check_image_for("./x.sqsh", 4),
            Err(ImageRefError::RelativeSquashfs(_))
        ));
    }

    #[test]
    fn mounts_and_container_paths() {
        assert!(check_mount("/fsx:/fsx").is_ok());
        assert!(check_mount("/nvme:/scratch:ro+rprivate").is_ok());
        assert!(check_mount("/fsx").is_ok());
        assert_eq!(
            check_mount("fsx:/fsx"),
            Err(MountError::Source("fsx:/fsx".into()))
        );
        assert_eq!(
            check_mount("/a:/a,/b:/b"),
            Err(MountError::Several("/a:/a,/b:/b".into()))
        );
        assert_eq!(
            check_mount("/a:b"),
            Err(MountError::Destination("/a:b".into()))
        );
        let mounts = ["/fsx:/fsx".to_string(), "/fsx/data:/data".to_string()];
        assert_eq!(
            container_path(&mounts, Path::new("/fsx/data/x.yaml")),
            Some(PathBuf::from("/data/x.yaml"))
        );
        assert_eq!(
            container_path(&mounts, Path::new("/fsx/cfg/x.yaml")),
            Some(PathBuf::from("/fsx/cfg/x.yaml"))
        );
        assert_eq!(container_path(&mounts, Path::new("/home/u/x.yaml")), None);
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm/cluster.example.yaml");
        let c = Cluster::load(&p).unwrap();
        assert_eq!(c.runtime, Runtime::Pyxis);
    }
}
