//! The schema of `cluster.yaml` as written: one struct per section, every field defaulted.
use scdino_config::PIPELINE_STAGES;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

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

/// The whole file as written, with defaults filled in: what validation reads. A
/// [`super::Cluster`] holds it validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterFile {
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
    /// The stages to render, in pipeline order, as written (validation makes them
    /// [`super::Cluster::stages`]). Default: all of them.
    pub stages: Vec<String>,
}

impl Default for ClusterFile {
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
            stages: PIPELINE_STAGES.map(String::from).to_vec(),
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
