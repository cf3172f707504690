//! Renders the pipeline as one reviewable sbatch script per job plus a JSON manifest. Every
//! value written into a script goes through [`crate::shell::quote`]; no secret value is ever
//! written (secrets travel by name, from the submitting environment).
use crate::cluster::{Cluster, Program, Runtime};
use crate::container_view;
use crate::fsutil::sha256_hex;
use scdino_config::{JobKind, Stage};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

mod job_script;

/// Variables of the job's environment that reach a Pyxis container even when the image sets
/// them (a `case` pattern): the fabric's tunables, which a cluster's modules or the user set.
const TUNABLE_PATTERNS: &str = "NCCL_* | FI_* | OFI_* | GLOO_* | UCX_* | TORCH_NCCL_*";

/// Read by Enroot's nvidia hook (`98-nvidia.sh`) when a container starts.
const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// Exit code of a trainer that checkpointed on SIGUSR1/SIGTERM (`EX_TEMPFAIL`).
pub use scdino_base::exit::PREEMPTED as EXIT_PREEMPTED;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    /// The job (by name) this one waits for.
    pub job: String,
    /// `afterok` between stages; `afterany` between training segments.
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Unique within the pipeline: `mean-std`, `train-c0`, `train-c0-s2`, ...
    pub name: String,
    pub stage: String,
    /// Script file name inside the render folder.
    pub script: String,
    /// Output file, with Slurm's `%j` for the job id.
    pub log: PathBuf,
    pub after: Vec<Dependency>,
    /// Filled by `launcher submit`.
    #[serde(default)]
    pub job_id: Option<String>,
    /// Not submitted: it finished earlier with this very script (its done marker matches).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub finished_earlier: bool,
}

impl Job {
    /// A job not submitted yet.
    pub fn new(
        name: &str,
        stage: &str,
        script: &str,
        log: PathBuf,
        after: Vec<Dependency>,
    ) -> Self {
        Job {
            name: name.into(),
            stage: stage.into(),
            script: script.into(),
            log,
            after,
            job_id: None,
            finished_earlier: false,
        }
    }

    /// The log path of a submitted job (`%j`, and a job array's `%A`, replaced; an array's
    /// task index `%a` stays).
    pub fn log_path(&self) -> PathBuf {
        match &self.job_id {
            Some(id) => PathBuf::from(
                self.log
                    .to_string_lossy()
                    .replace("%j", id)
                    .replace("%A", id),
            ),
            None => self.log.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub launcher_version: String,
    pub cluster_file: Option<PathBuf>,
    /// None for jobs that read no trainer config (`launcher nccl-test`).
    #[serde(default)]
    pub trainer_config: Option<PathBuf>,
    pub runtime: Runtime,
    pub log_dir: PathBuf,
    pub jobs: Vec<Job>,
}

pub const MANIFEST: &str = "manifest.json";

impl Manifest {
    /// The manifest of jobs that read no trainer config (`launcher nccl-test`, `selftest`,
    /// `embed`); `cluster_file` is the caller's to fill.
    pub fn without_config(cluster: &Cluster, log_dir: PathBuf, jobs: Vec<Job>) -> Self {
        Manifest {
            launcher_version: env!("CARGO_PKG_VERSION").into(),
            cluster_file: None,
            trainer_config: None,
            runtime: cluster.runtime,
            log_dir,
            jobs,
        }
    }

    pub fn load(out: &Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        let p = out.join(MANIFEST);
        let text = std::fs::read_to_string(&p)
            .with_context(|| format!("reading {} (render or submit first)", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
    }

    pub fn save(&self, out: &Path) -> anyhow::Result<()> {
        use anyhow::Context;
        let p = out.join(MANIFEST);
        let text = serde_json::to_string_pretty(self)? + "\n";
        crate::fsutil::write_atomic(&p, text.as_bytes())
            .with_context(|| format!("writing {}", p.display()))
    }
}

/// Everything rendering needs besides the cluster file.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The trainer config, absolute, as the submitting host sees it.
    pub trainer_config: PathBuf,
    /// Its text: validated with the trainer's own rules before anything is rendered, and the
    /// source of the paths a container must see.
    pub trainer_text: String,
    /// The trainer config was named by `--config` (else by the cluster file).
    pub config_from_cli: bool,
    /// The render folder (absolute).
    pub out: PathBuf,
    /// The default working directory (absolute).
    pub cwd: PathBuf,
    pub cluster_file: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Rendered {
    pub manifest: Manifest,
    /// (file name, text), in submission order.
    pub scripts: Vec<(String, String)>,
    /// Other files of the render folder: (file name, text), e.g. the container's copy of the
    /// trainer config.
    pub files: Vec<(String, String)>,
    /// Things a reviewer should know (printed on stderr).
    pub warnings: Vec<String>,
}

/// One job of the pipeline as planned: which stage it runs and what it waits for.
struct Planned {
    /// Unique within the pipeline: the stage's name, or `train-c<combination>[-s<segment>]`.
    name: String,
    stage: Stage,
    /// The model a training job trains (`--combination`); None for the other stages.
    combination: Option<usize>,
    after: Vec<Dependency>,
}

fn after_ok(jobs: Vec<String>) -> Vec<Dependency> {
    jobs.into_iter()
        .map(|job| Dependency {
            job,
            kind: "afterok".into(),
        })
        .collect()
}

/// The jobs a stage waits for: those standing for each stage it needs (`finals`); a need
/// that is not rendered passes its own needs on.
fn waits_for(
    stage: Stage,
    cluster: &Cluster,
    finals: &[(Stage, Vec<String>)],
    out: &mut Vec<String>,
) {
    for &need in stage.needs() {
        if !cluster.stages().contains(&need) {
            waits_for(need, cluster, finals, out);
            continue;
        }
        if let Some((_, jobs)) = finals.iter().find(|(s, _)| *s == need) {
            for j in jobs {
                if !out.contains(j) {
                    out.push(j.clone());
                }
            }
        }
    }
}

/// The training jobs: per model, `training.segments` jobs chained with `afterany` (each
/// resumes from the last checkpoint), the first waiting for `after`. Also returns each
/// model's last job, which later stages wait for.
fn training_jobs(
    stage: Stage,
    cluster: &Cluster,
    models: usize,
    after: &[Dependency],
) -> (Vec<Planned>, Vec<String>) {
    let segs = cluster.training.segments;
    let mut jobs = Vec::new();
    let mut lasts = Vec::new();
    for c in 0..models {
        let mut prev: Option<String> = None;
        for s in 1..=segs {
            let name = if segs > 1 {
                format!("{stage}-c{c}-s{s}")
            } else {
                format!("{stage}-c{c}")
            };
            let after = match prev.take() {
                None => after.to_vec(),
                Some(job) => vec![Dependency {
                    job,
                    kind: "afterany".into(),
                }],
            };
            jobs.push(Planned {
                name: name.clone(),
                stage,
                combination: Some(c),
                after,
            });
            prev = Some(name);
        }
        lasts.extend(prev);
    }
    (jobs, lasts)
}

/// The jobs of the pipeline, in submission order, with their dependencies.
fn plan(cluster: &Cluster, models: usize) -> Vec<Planned> {
    // The jobs that stand for a stage once it is planned (training: the last segments).
    let mut finals: Vec<(Stage, Vec<String>)> = Vec::new();
    let mut jobs = Vec::new();
    for &stage in cluster.stages() {
        let mut deps = Vec::new();
        waits_for(stage, cluster, &finals, &mut deps);
        let after = after_ok(deps);
        if stage.job() == JobKind::Training {
            let (trained, lasts) = training_jobs(stage, cluster, models, &after);
            finals.push((stage, lasts));
            jobs.extend(trained);
        } else {
            finals.push((stage, vec![stage.name().to_string()]));
            jobs.push(Planned {
                name: stage.name().to_string(),
                stage,
                combination: None,
                after,
            });
        }
    }
    jobs
}

pub fn render(cluster: &Cluster, inputs: &Inputs) -> anyhow::Result<Rendered> {
    let origin = inputs.trainer_config.display().to_string();
    // One training job per model: per combination (`fixed`), or one for all (`bag`,
    // `tokens`), whose analyses then run for every combination.
    let models = scdino_config::Config::from_yaml(&inputs.trainer_text, &origin)?.trained_models();
    let config_sha256 = sha256_hex(inputs.trainer_text.as_bytes());
    let mut warnings = Vec::new();
    let mut files = Vec::new();
    let log_dir = log_dir(cluster, &inputs.out)?;
    let ctx = context(cluster, &inputs.cwd)?;
    let config = match cluster.runtime {
        Runtime::Host => inputs.trainer_config.clone(),
        Runtime::Pyxis => {
            let view = container_view::map(
                cluster,
                &container_view::HostPaths {
                    trainer_config: &inputs.trainer_config,
                    trainer_text: &inputs.trainer_text,
                    config_from_cli: inputs.config_from_cli,
                    cwd: &inputs.cwd,
                    out: &inputs.out,
                },
            )?;
            if let Some(text) = view.config_copy {
                warnings.push(format!(
                    "the container mounts move paths of {}: the jobs read {} (the same config with the container's paths)",
                    inputs.trainer_config.display(),
                    inputs.out.join(container_view::CONTAINER_CONFIG).display()
                ));
                files.push((container_view::CONTAINER_CONFIG.to_string(), text));
            }
            if let Program::Pyxis { image } = cluster.program() {
                if image.starts_with('/') && !Path::new(image).exists() {
                    warnings.push(format!(
                        "the image {image} does not exist on this host: every job would fail at its start unless the nodes see a file there"
                    ));
                }
            }
            view.config
        }
    };
    let mut jobs = Vec::new();
    let mut scripts = Vec::new();
    let done = Done {
        dir: inputs.out.join(DONE_DIR),
        config_sha256: &config_sha256,
    };
    for (i, job) in plan(cluster, models).into_iter().enumerate() {
        let Planned {
            name,
            stage,
            combination,
            after,
        } = job;
        let file = format!("{:02}-{name}.sbatch", i + 1);
        let log = log_dir.join(format!("{name}-%j.out"));
        scripts.push((
            file.clone(),
            ctx.stage_script(&name, stage, &config, combination, &log, &done),
        ));
        jobs.push(Job {
            name,
            stage: stage.name().to_string(),
            script: file,
            log,
            after,
            job_id: None,
            finished_earlier: false,
        });
    }
    Ok(Rendered {
        manifest: Manifest {
            launcher_version: env!("CARGO_PKG_VERSION").into(),
            cluster_file: inputs.cluster_file.clone(),
            trainer_config: Some(inputs.trainer_config.clone()),
            runtime: cluster.runtime,
            log_dir,
            jobs,
        },
        scripts,
        files,
        warnings,
    })
}

/// The log folder of a cluster's jobs (`slurm.log_dir`, else `<out>/logs`), refusing characters
/// sbatch would read specially in `--output`.
pub fn log_dir(cluster: &Cluster, out: &Path) -> anyhow::Result<PathBuf> {
    let log_dir = cluster
        .slurm
        .log_dir
        .clone()
        .unwrap_or_else(|| out.join("logs"));
    let s = log_dir.to_string_lossy();
    anyhow::ensure!(
        !s.contains('%') && !s.contains('\\') && !s.contains('\n'),
        "the log folder {} must not contain '%', '\\' or a newline (sbatch reads them specially)",
        log_dir.display()
    );
    Ok(log_dir)
}

/// The trainer program and working directory every job of `cluster` uses (container paths with
/// Pyxis). `cwd` is the default working directory, as the submitting host sees it.
pub(crate) fn context<'a>(
    cluster: &'a Cluster,
    cwd: &Path,
) -> Result<Ctx<'a>, container_view::ViewError> {
    let (program, workdir) = match cluster.program() {
        Program::Host { trainer } => (
            trainer.clone(),
            cluster.workdir.clone().unwrap_or_else(|| cwd.to_path_buf()),
        ),
        Program::Pyxis { .. } => (
            cluster.container.trainer.clone(),
            container_view::workdir(cluster, cwd)?,
        ),
    };
    Ok(Ctx {
        cluster,
        program,
        workdir,
    })
}

/// A folder holding one multi-task job that runs `trainer <args>` on `alloc` (`launcher
/// nccl-test`, `launcher selftest`), with a one-job manifest so `status`/`cancel --out` work.
pub(crate) fn one_job(
    cluster: &Cluster,
    name: &str,
    alloc: Allocation,
    args: &[Vec<String>],
    out: &Path,
    cwd: &Path,
) -> anyhow::Result<Rendered> {
    anyhow::ensure!(
        alloc.nodes >= 1 && alloc.tasks_per_node >= 1,
        "--nodes and --tasks-per-node must be at least 1"
    );
    let log_dir = log_dir(cluster, out)?;
    let log = log_dir.join(format!("{name}-%j.out"));
    let shape = Shape {
        distributed: Some(alloc),
        one_gpu: false,
        preemptible: false,
        array: None,
    };
    let script = format!("{name}.sbatch");
    let text = context(cluster, cwd)?.job_script(name, name, shape, args, &log, None);
    let job = Job::new(name, name, &script, log, vec![]);
    Ok(Rendered {
        manifest: Manifest::without_config(cluster, log_dir, vec![job]),
        scripts: vec![(script, text)],
        files: vec![],
        warnings: vec![],
    })
}

/// The task layout of a multi-task job: `nodes` × `tasks_per_node` ranks that meet at a
/// rendezvous on the first node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub nodes: u32,
    pub tasks_per_node: u32,
    /// `--gpus-per-node` (0: none requested).
    pub gpus_per_node: u32,
}

impl Allocation {
    /// `nodes` × `tasks_per_node`, each defaulting to the cluster's (`slurm.nodes`, one task per
    /// GPU or 1 without GPUs), with the cluster's GPUs per node.
    pub fn of(cluster: &Cluster, nodes: Option<u32>, tasks_per_node: Option<u32>) -> Self {
        Allocation {
            nodes: nodes.unwrap_or(cluster.slurm.nodes),
            tasks_per_node: tasks_per_node.unwrap_or(cluster.slurm.ranks_per_node()),
            gpus_per_node: cluster.slurm.gpus_per_node,
        }
    }
}

/// What a job script must arrange around its trainer command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Several tasks with a rendezvous (MASTER_ADDR/PORT), `--kill-on-bad-exit`, no CPU
    /// binding; None: one task on one node.
    pub distributed: Option<Allocation>,
    /// One GPU for a single-task job (when the cluster has GPUs).
    pub one_gpu: bool,
    /// Training: `--signal`, `--requeue` and the trap that forwards the notice to the step.
    pub preemptible: bool,
    /// A job array of one-task jobs (`launcher embed --array`); None: one job.
    pub array: Option<ArrayTasks>,
}

/// `--array=0-(count-1)[%limit]`: `count` one-task jobs, at most `limit` at once. Each passes
/// its index to the trainer as `index_option "$SLURM_ARRAY_TASK_ID"`, the one word of a script
/// that the shell expands (a Slurm variable, never a user's value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArrayTasks {
    pub count: u32,
    pub limit: Option<u32>,
    pub index_option: &'static str,
}

/// Writes the scripts (mode 0755), the manifest and creates the log folder.
pub fn write(r: &Rendered, out: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    // Scripts from an earlier render that this one no longer has would confuse a reviewer.
    for e in std::fs::read_dir(out)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "sbatch") {
            std::fs::remove_file(&p)?;
        }
    }
    for (name, text) in &r.scripts {
        let p = out.join(name);
        crate::fsutil::write_atomic(&p, text.as_bytes())
            .with_context(|| format!("writing {}", p.display()))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
    }
    let copy = out.join(container_view::CONTAINER_CONFIG);
    if copy.exists()
        && !r
            .files
            .iter()
            .any(|(n, _)| n == container_view::CONTAINER_CONFIG)
    {
        std::fs::remove_file(&copy)?;
    }
    for (name, text) in &r.files {
        let p = out.join(name);
        crate::fsutil::write_atomic(&p, text.as_bytes())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    r.manifest.save(out)
}

/// Where a pipeline job records that it finished: `<out>/done/<job>` holds the sha256 of the
/// script that ran (the script hashes itself, `$0`, on success). The script carries the
/// trainer config's digest, so a changed config, image, argument or launcher changes the hash.
pub const DONE_DIR: &str = "done";

pub(crate) struct Done<'a> {
    dir: PathBuf,
    config_sha256: &'a str,
}

/// The jobs of a fresh render that finished earlier: a done marker holding the hash of the
/// same script, and every job it waits for finished earlier too. Marks them in the manifest.
pub fn mark_finished_earlier(r: &mut Rendered, out: &Path) {
    let mut finished: Vec<String> = Vec::new();
    for job in &mut r.manifest.jobs {
        let Some((_, text)) = r.scripts.iter().find(|(n, _)| *n == job.script) else {
            continue;
        };
        let marker =
            std::fs::read_to_string(out.join(DONE_DIR).join(&job.name)).unwrap_or_default();
        let same = marker.trim() == sha256_hex(text.as_bytes());
        if same && job.after.iter().all(|d| finished.contains(&d.job)) {
            job.finished_earlier = true;
            finished.push(job.name.clone());
        }
    }
}

pub(crate) struct Ctx<'a> {
    cluster: &'a Cluster,
    program: PathBuf,
    workdir: PathBuf,
}

impl Ctx<'_> {
    /// `trainer <stage> --config FILE [...]`: training on every GPU of `slurm.nodes` nodes,
    /// preemptible; the other stages as one task.
    fn stage_script(
        &self,
        name: &str,
        stage: Stage,
        config: &Path,
        combination: Option<usize>,
        log: &Path,
        done: &Done,
    ) -> String {
        let c = self.cluster;
        let train = stage.job() == JobKind::Training;
        let shape = Shape {
            distributed: train.then(|| Allocation {
                nodes: c.slurm.nodes,
                tasks_per_node: c.slurm.ranks_per_node(),
                gpus_per_node: c.slurm.gpus_per_node,
            }),
            one_gpu: stage.job() == JobKind::OneGpu,
            preemptible: train,
            array: None,
        };
        let config = config.to_string_lossy().into_owned();
        let mut args: Vec<Vec<String>> =
            vec![vec![stage.name().into()], vec!["--config".into(), config]];
        if let Some(ci) = combination {
            args.push(vec!["--combination".into(), ci.to_string()]);
            if let Some(m) = c.training.max_steps {
                args.push(vec!["--max-steps".into(), m.to_string()]);
            }
            if let Some(t) = c.training.threads {
                args.push(vec!["--threads".into(), t.to_string()]);
            }
        }
        self.job_script(name, stage.name(), shape, &args, log, Some(done))
    }
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;
