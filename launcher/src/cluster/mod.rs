//! `cluster.yaml`: where and how the pipeline runs on Slurm. Strict like the trainer's config:
//! unknown keys are errors, and values that parse but make no sense are reported with the key
//! and its line. Secrets are never values of this file: `secrets:` lists environment variable
//! *names* that the job inherits from the submitting shell.
//!
//! The file is validated once into a [`Cluster`], which cannot change afterwards: what renders
//! the jobs is what was checked. A different cluster (the same file with a freshly built
//! image) is a new one, validated again ([`Cluster::with_image`]).
mod names;
mod pyxis;
mod sections;

pub use names::{is_env_name, looks_like_secret, parse_time, RESERVED_ENV};
pub use pyxis::{
    check_image, check_image_for, check_mount, container_path, ImageRefError, MountError,
};
pub use sections::{
    ClusterFile, ContainerSection, HostSection, Runtime, SlurmSection, TrainingSection,
};

use scdino_config::{Invalid, Stage, Validator};
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
    /// A value that parses but makes no sense, with its key and line.
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

impl From<scdino_config::Unparsed> for ClusterError {
    fn from(u: scdino_config::Unparsed) -> Self {
        ClusterError::Parse {
            origin: u.origin,
            message: u.message,
        }
    }
}

/// A validated cluster file. Its sections are read through `Deref` (`cluster.slurm.nodes`)
/// and cannot change, so rendering relies on what validation established (an image with
/// Pyxis, a trainer path on the host) instead of checking again.
///
/// ```compile_fail,E0594
/// let c = launcher::cluster::Cluster::from_yaml("runtime: host\nhost:\n  trainer: /t\n", "c").unwrap();
/// c.slurm.nodes = 2; // no DerefMut: a validated cluster cannot be changed in place
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    file: ClusterFile,
    stages: Vec<Stage>,
    program: Program,
    source: Source,
}

/// How every job starts the trainer, as validation found it in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// `srun --container-image=IMAGE` (Pyxis); the trainer is `container.trainer`.
    Pyxis { image: String },
    /// The trainer binary on a filesystem every node sees.
    Host { trainer: PathBuf },
}

/// The file a cluster was read from and the line of each key; not part of its meaning (two
/// clusters that say the same are equal wherever they were written).
#[derive(Debug, Clone, Default)]
struct Source {
    origin: String,
    lines: KeyLines,
}

impl PartialEq for Source {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::ops::Deref for Cluster {
    type Target = ClusterFile;

    fn deref(&self) -> &ClusterFile {
        &self.file
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
        let file: ClusterFile = scdino_config::parse_yaml(text, origin)?;
        let source = Source {
            origin: origin.to_string(),
            lines: KeyLines::scan(text),
        };
        Ok(Self::validate(file, source)?)
    }

    /// This cluster with `container.image` replaced (an image `launcher submit --build` just
    /// made), validated again; errors still name this file's lines.
    pub fn with_image(&self, image: String) -> Result<Self, ClusterError> {
        let mut file = self.file.clone();
        file.container.image = Some(image);
        Ok(Self::validate(file, self.source.clone())?)
    }

    /// The stages to render, in pipeline order.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// How the jobs start the trainer.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Reports a value of this file that is refused after loading (e.g. a path that no
    /// container mount covers), with its key and line.
    pub fn invalid(&self, key: &str, message: &str) -> ClusterError {
        self.validator().err(key, message).into()
    }

    fn validator(&self) -> Validator<'_> {
        Validator::new(&self.source.origin, &self.source.lines)
    }

    fn validate(file: ClusterFile, source: Source) -> Result<Self, Invalid> {
        let v = Validator::new(&source.origin, &source.lines);
        let limit = check_slurm(&v, &file.slurm)?;
        if let Some(w) = &file.workdir {
            directive_path(&v, "workdir", w)?;
            v.check(w.is_absolute(), "workdir", "must be an absolute path")?;
        }
        let program = program(&v, &file)?;
        check_env(&v, &file)?;
        check_training(&v, &file.training, limit)?;
        let stages = stages(&v, &file.stages)?;
        Ok(Cluster {
            file,
            stages,
            program,
            source,
        })
    }
}

/// The `slurm` section; returns its time limit in seconds (None: unlimited).
fn check_slurm(v: &Validator, s: &SlurmSection) -> Result<Option<u64>, Invalid> {
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
    Ok(limit)
}

/// The runtime's own section: an image Pyxis can pull, or the trainer's path on the host.
fn program(v: &Validator, file: &ClusterFile) -> Result<Program, Invalid> {
    match file.runtime {
        Runtime::Pyxis => {
            let c = &file.container;
            let image = c.image.clone().ok_or_else(|| {
                v.err(
                    "container.image",
                    "runtime pyxis needs an image: REGISTRY#IMAGE:TAG or an absolute .sqsh path",
                )
            })?;
            v.check(
                matches!(c.enroot_version, 3 | 4),
                "container.enroot_version",
                "must be 3 or 4",
            )?;
            check_image_for(&image, c.enroot_version)
                .map_err(|e| v.err("container.image", &e.to_string()))?;
            for (i, m) in c.mounts.iter().enumerate() {
                check_mount(m)
                    .map_err(|e| v.err(&format!("container.mounts[{i}]"), &e.to_string()))?;
            }
            v.check(
                c.trainer.is_absolute(),
                "container.trainer",
                "must be an absolute path inside the image",
            )?;
            Ok(Program::Pyxis { image })
        }
        Runtime::Host => {
            let trainer = file.host.trainer.clone().ok_or_else(|| {
                v.err(
                    "host.trainer",
                    "runtime host needs the trainer binary's path on a filesystem every node sees",
                )
            })?;
            v.check(
                trainer.is_absolute(),
                "host.trainer",
                "must be an absolute path",
            )?;
            Ok(Program::Host { trainer })
        }
    }
}

/// `env:` holds tunables only; `secrets:` holds names only.
fn check_env(v: &Validator, file: &ClusterFile) -> Result<(), Invalid> {
    for key in file.env.keys() {
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
    for (i, name) in file.secrets.iter().enumerate() {
        v.check(
            is_env_name(name),
            &format!("secrets[{i}]"),
            &format!("{name:?} must be the NAME of an environment variable, not its value"),
        )?;
        v.check(
            !file.env.contains_key(name),
            &format!("secrets[{i}]"),
            &format!("{name} is also under env:"),
        )?;
    }
    Ok(())
}

/// `limit`: the job time limit in seconds, which the preemption notice must fit in.
fn check_training(v: &Validator, t: &TrainingSection, limit: Option<u64>) -> Result<(), Invalid> {
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
    v.check(t.threads != Some(0), "training.threads", "must be positive")
}

/// `stages:` as pipeline stages, each once and in pipeline order.
fn stages(v: &Validator, written: &[String]) -> Result<Vec<Stage>, Invalid> {
    v.check(!written.is_empty(), "stages", "list at least one stage")?;
    let order = scdino_config::PIPELINE_STAGES.join(", ");
    let mut stages: Vec<Stage> = Vec::new();
    for (i, name) in written.iter().enumerate() {
        let key = format!("stages[{i}]");
        let stage: Stage = name.parse().map_err(|e| v.err(&key, &format!("{e}")))?;
        v.check(
            stages.last().is_none_or(|last| stage > *last),
            &key,
            &format!("stage {name:?} is out of order or repeated; pipeline order: {order}"),
        )?;
        stages.push(stage);
    }
    Ok(stages)
}

/// Paths that go into `#SBATCH` lines: sbatch reads quotes there but eats backslashes.
fn directive_path(v: &Validator, key: &str, p: &Path) -> Result<(), Invalid> {
    let s = p.to_string_lossy();
    v.check(
        !s.contains('\\') && !s.contains('\n'),
        key,
        "must not contain a backslash or a newline (sbatch cannot read them in #SBATCH lines)",
    )
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
