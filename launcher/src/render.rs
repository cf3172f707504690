//! Renders the pipeline as one reviewable sbatch script per job plus a JSON manifest. Every
//! value written into a script goes through [`crate::shell::quote`]; no secret value is ever
//! written (secrets travel by name, from the submitting environment).
use crate::cluster::{Cluster, Runtime};
use crate::container_view;
use crate::fsutil::sha256_hex;
use crate::shell::{join, quote};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The pipeline's stages in order; each runs `trainer <stage> --config FILE`.
pub use scdino_config::PIPELINE_STAGES as STAGES;

/// Variables of the job's environment that reach a Pyxis container even when the image sets
/// them (a `case` pattern): the fabric's tunables, which a cluster's modules or the user set.
const TUNABLE_PATTERNS: &str = "NCCL_* | FI_* | OFI_* | GLOO_* | UCX_* | TORCH_NCCL_*";

/// Read by Enroot's nvidia hook (`98-nvidia.sh`) when a container starts.
const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// Exit code of a trainer that checkpointed on SIGUSR1/SIGTERM (`EX_TEMPFAIL`).
pub use scdino_base::exit::PREEMPTED as EXIT_PREEMPTED;

/// What each stage needs from earlier ones.
fn needs(stage: &str) -> &'static [&'static str] {
    match stage {
        "train" => &["mean-std"],
        "features" | "attention" | "evaluate" => &["train"],
        "knn" | "umap" => &["features"],
        "report" => &["knn", "evaluate", "umap", "attention"],
        _ => &[],
    }
}

/// Stages that get one GPU when the cluster has GPUs (training gets all of them).
fn uses_gpu(stage: &str) -> bool {
    matches!(stage, "features" | "attention" | "evaluate")
}

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
    /// The log path of a submitted job (`%j` replaced).
    pub fn log_path(&self) -> PathBuf {
        match &self.job_id {
            Some(id) => PathBuf::from(self.log.to_string_lossy().replace("%j", id)),
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

/// The jobs of the pipeline, in submission order, with their dependencies.
fn plan(cluster: &Cluster, models: usize) -> Vec<(String, String, Vec<Dependency>)> {
    let enabled = |s: &str| cluster.stages.iter().any(|x| x == s);
    // The jobs that stand for a stage once it is planned (training: the last segments).
    let mut finals: Vec<(String, Vec<String>)> = Vec::new();
    fn resolve(
        stage: &str,
        finals: &[(String, Vec<String>)],
        enabled: &dyn Fn(&str) -> bool,
        out: &mut Vec<String>,
    ) {
        for &n in needs(stage) {
            if enabled(n) {
                if let Some((_, jobs)) = finals.iter().find(|(s, _)| s == n) {
                    for j in jobs {
                        if !out.contains(j) {
                            out.push(j.clone());
                        }
                    }
                }
            } else {
                resolve(n, finals, enabled, out);
            }
        }
    }
    let mut jobs = Vec::new();
    for stage in STAGES.iter().filter(|s| enabled(s)) {
        let mut deps = Vec::new();
        resolve(stage, &finals, &enabled, &mut deps);
        let after_ok: Vec<Dependency> = deps
            .into_iter()
            .map(|job| Dependency {
                job,
                kind: "afterok".into(),
            })
            .collect();
        if *stage == "train" {
            let segs = cluster.training.segments;
            let mut lasts = Vec::new();
            for c in 0..models {
                let mut prev: Option<String> = None;
                for s in 1..=segs {
                    let name = if segs > 1 {
                        format!("train-c{c}-s{s}")
                    } else {
                        format!("train-c{c}")
                    };
                    let after = match &prev {
                        None => after_ok.clone(),
                        Some(p) => vec![Dependency {
                            job: p.clone(),
                            kind: "afterany".into(),
                        }],
                    };
                    jobs.push((name.clone(), stage.to_string(), after));
                    prev = Some(name);
                }
                lasts.extend(prev);
            }
            finals.push((stage.to_string(), lasts));
        } else {
            jobs.push((stage.to_string(), stage.to_string(), after_ok));
            finals.push((stage.to_string(), vec![stage.to_string()]));
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
            if let Some(image) = cluster.container.image.as_deref() {
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
    for (i, (name, stage, after)) in plan(cluster, models).into_iter().enumerate() {
        let file = format!("{:02}-{name}.sbatch", i + 1);
        let log = log_dir.join(format!("{name}-%j.out"));
        let combination = name
            .strip_prefix("train-c")
            .map(|r| r.split('-').next().unwrap().parse::<usize>().unwrap());
        let done = Done {
            dir: inputs.out.join(DONE_DIR),
            config_sha256: &config_sha256,
        };
        scripts.push((
            file.clone(),
            ctx.stage_script(&name, &stage, &config, combination, &log, &done),
        ));
        jobs.push(Job {
            name,
            stage,
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
    let (program, workdir) = match cluster.runtime {
        Runtime::Host => (
            cluster.host.trainer.clone().expect("validated"),
            cluster.workdir.clone().unwrap_or_else(|| cwd.to_path_buf()),
        ),
        Runtime::Pyxis => (
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
    };
    let script = format!("{name}.sbatch");
    let text = context(cluster, cwd)?.job_script(name, name, shape, args, &log, None);
    Ok(Rendered {
        manifest: Manifest {
            launcher_version: env!("CARGO_PKG_VERSION").into(),
            cluster_file: None,
            trainer_config: None,
            runtime: cluster.runtime,
            log_dir,
            jobs: vec![Job {
                name: name.into(),
                stage: name.into(),
                script: script.clone(),
                log,
                after: vec![],
                job_id: None,
                finished_earlier: false,
            }],
        },
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

fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

impl Ctx<'_> {
    /// `trainer <stage> --config FILE [...]`: training on every GPU of `slurm.nodes` nodes,
    /// preemptible; the other stages as one task.
    fn stage_script(
        &self,
        name: &str,
        stage: &str,
        config: &Path,
        combination: Option<usize>,
        log: &Path,
        done: &Done,
    ) -> String {
        let c = self.cluster;
        let train = stage == "train";
        let shape = Shape {
            distributed: train.then(|| Allocation {
                nodes: c.slurm.nodes,
                tasks_per_node: c.slurm.ranks_per_node(),
                gpus_per_node: c.slurm.gpus_per_node,
            }),
            one_gpu: uses_gpu(stage),
            preemptible: train,
        };
        let mut args: Vec<Vec<String>> =
            vec![vec![stage.into()], vec!["--config".into(), p(config)]];
        if let Some(ci) = combination {
            args.push(vec!["--combination".into(), ci.to_string()]);
            if let Some(m) = c.training.max_steps {
                args.push(vec!["--max-steps".into(), m.to_string()]);
            }
            if let Some(t) = c.training.threads {
                args.push(vec!["--threads".into(), t.to_string()]);
            }
        }
        self.job_script(name, stage, shape, &args, log, Some(done))
    }

    /// One sbatch script that runs `trainer <args>` under srun. `args` holds the trainer's
    /// words grouped one option per line, for review.
    pub(crate) fn job_script(
        &self,
        name: &str,
        stage: &str,
        shape: Shape,
        args: &[Vec<String>],
        log: &Path,
        done: Option<&Done>,
    ) -> String {
        let c = self.cluster;
        let sl = &c.slurm;
        let distributed = shape.distributed.is_some();
        let preemptible = shape.preemptible;
        let pyxis = c.runtime == Runtime::Pyxis;
        let mut o = String::new();
        let mut line = |s: &str| {
            o.push_str(s);
            o.push('\n');
        };
        line("#!/bin/bash");
        line(&format!(
            "# scDINO pipeline job `{name}` (stage {stage}), rendered by launcher {}.",
            env!("CARGO_PKG_VERSION")
        ));
        line(
            "# Re-render rather than edit. Every value is shell-quoted; no secret is written here.",
        );
        if let Some(d) = done {
            line(&format!(
                "# Trainer config sha256 {} (part of this script, whose hash marks it done).",
                d.config_sha256
            ));
        }
        let mark_done = done.map(|d| {
            format!(
                "mkdir -p {dir} && sha256sum < \"$0\" | cut -d' ' -f1 > {file}",
                dir = quote(&p(&d.dir)),
                file = quote(&p(&d.dir.join(name)))
            )
        });
        let d = |k: &str, v: &str| format!("#SBATCH --{k}={}", quote(v));
        line(&d("job-name", &format!("scdino-{name}")));
        for (k, v) in [
            ("partition", &sl.partition),
            ("account", &sl.account),
            ("qos", &sl.qos),
        ] {
            if let Some(v) = v {
                line(&d(k, v));
            }
        }
        if let Some(a) = shape.distributed {
            line(&d("nodes", &a.nodes.to_string()));
            line(&d("ntasks-per-node", &a.tasks_per_node.to_string()));
            if a.gpus_per_node > 0 {
                line(&d("gpus-per-node", &a.gpus_per_node.to_string()));
            }
        } else {
            line(&d("nodes", "1"));
            line(&d("ntasks", "1"));
            if sl.gpus_per_node > 0 && shape.one_gpu {
                line(&d("gpus-per-node", "1"));
            }
        }
        line(&d("cpus-per-task", &sl.cpus_per_task.to_string()));
        if let Some(m) = &sl.mem {
            line(&d("mem", m));
        }
        line(&d("time", &sl.time));
        if !pyxis {
            line(&d("chdir", &p(&self.workdir)));
        }
        line(&d("output", &p(log)));
        line(&d("open-mode", "append"));
        line(&d("export", "ALL"));
        line(&d("kill-on-invalid-dep", "yes"));
        if preemptible {
            line(&d(
                "signal",
                &format!("B:USR1@{}", c.training.signal_grace_seconds),
            ));
            line(if c.training.requeue {
                "#SBATCH --requeue"
            } else {
                "#SBATCH --no-requeue"
            });
        }
        line("set -euo pipefail");
        line("");
        if !c.env.is_empty() {
            line("# Tunables (with Pyxis also listed in --container-env, so they beat the image's ENV).");
            for (k, v) in &c.env {
                line(&format!("export {k}={}", quote(v)));
            }
        }
        let no_gpu_hook =
            pyxis && sl.gpus_per_node == 0 && !c.env.contains_key(NVIDIA_VISIBLE_DEVICES);
        if no_gpu_hook {
            line("# No GPUs on this cluster: the image's NVIDIA_VISIBLE_DEVICES=all would make Enroot's");
            line("# nvidia hook require nvidia-container-cli, which CPU nodes lack; void skips the hook.");
            line(&format!("export {NVIDIA_VISIBLE_DEVICES}=void"));
        }
        if !c.secrets.is_empty() {
            line(&format!(
                "# Secrets, by name only: inherited from the environment `launcher submit` ran in: {}",
                c.secrets.join(" ")
            ));
        }
        if distributed {
            line("");
            line("# Rendezvous: the first node of the allocation, a port derived from the job id.");
            // `sed -n 1p` reads all input: `head -n1` would leave scontrol to die of SIGPIPE, which
            // `set -o pipefail` turns into a failed job on allocations with many nodes.
            line(r#"MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"#);
            line("MASTER_PORT=$((SLURM_JOB_ID % 4536 + 61000))");
            line("export MASTER_ADDR MASTER_PORT");
            line(&format!(
                r#"echo "[launcher] {} job $SLURM_JOB_ID restart ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT""#,
                quote(name)
            ));
        } else {
            line(&format!(
                r#"echo "[launcher] {} job $SLURM_JOB_ID on $SLURM_JOB_NODELIST""#,
                quote(name)
            ));
        }
        line("");

        if distributed {
            line("# Ranks use many threads each: no CPU binding, where the cluster binds at all");
            line("# (with TaskPlugin=task/none srun would only warn that it cannot).");
            line("cpu_bind=()");
            line(
                r#"case "$(scontrol show config 2>/dev/null | sed -n 's/^TaskPlugin *= *//p')" in"#,
            );
            line("  *affinity* | *cgroup*) cpu_bind=(--cpu-bind=none) ;;");
            line("esac");
        }
        if pyxis {
            // Pyxis keeps an image's ENV over the job's unless the name is in --container-env.
            let mut names: Vec<&str> = c.env.keys().map(String::as_str).collect();
            if no_gpu_hook {
                names.push(NVIDIA_VISIBLE_DEVICES);
            }
            names.extend(c.secrets.iter().map(String::as_str));
            if distributed {
                names.extend(crate::cluster::RESERVED_ENV);
            }
            line(
                "# Variables the container takes from the job, not from the image's ENV: the ones",
            );
            line("# above and every network tunable set in the job's environment.");
            line(&format!("container_env={}", quote(&names.join(","))));
            line("for name in $(compgen -e); do");
            line(&format!(
                "  case $name in {TUNABLE_PATTERNS}) ;; *) continue ;; esac"
            ));
            line(
                r#"  case ",$container_env," in *",$name,"*) ;; *) container_env="${container_env:+$container_env,}$name" ;; esac"#,
            );
            line("done");
            line("container_env_opt=()");
            line(
                r#"if [ -n "$container_env" ]; then container_env_opt=("--container-env=$container_env"); fi"#,
            );
        }
        if distributed || pyxis {
            line("");
        }

        // One option (with its value) per line for review; every word quoted on its own.
        let mut srun: Vec<String> = vec!["srun".into()];
        let mut opt = |words: &[&str]| srun.push(join(words));
        if distributed {
            opt(&["--kill-on-bad-exit=1"]);
            srun.push(r#""${cpu_bind[@]}""#.into());
        }
        if pyxis {
            let k = &c.container;
            let mut opt = |words: &[&str]| srun.push(join(words));
            opt(&[&format!(
                "--container-image={}",
                k.image.as_deref().unwrap()
            )]);
            if !k.mounts.is_empty() {
                opt(&[&format!("--container-mounts={}", k.mounts.join(","))]);
            }
            opt(&[&format!("--container-workdir={}", p(&self.workdir))]);
            opt(&[if k.mount_home {
                "--container-mount-home"
            } else {
                "--no-container-mount-home"
            }]);
            srun.push(r#""${container_env_opt[@]}""#.into());
        }
        // The program goes on the line of the first trainer word (the subcommand).
        let mut words = args.iter();
        let mut first = vec![p(&self.program)];
        first.extend(words.next().into_iter().flatten().cloned());
        srun.push(join(first));
        srun.extend(words.map(join));
        let cmd = srun.join(" \\\n  ");
        if !preemptible {
            line(&cmd);
            if let Some(m) = &mark_done {
                line("# Done: a rerun of `launcher submit` with this same script skips the job.");
                line(m);
            }
            line(&format!(r#"echo "[launcher] {} finished""#, quote(name)));
            return o;
        }
        line("# The batch shell gets USR1 (--signal=B:) or TERM and forwards it to the training step;");
        line(&format!(
            "# the trainer checkpoints at the next step and exits {EXIT_PREEMPTED}."
        ));
        line("step=");
        line("forward() {");
        line(r#"  echo "[launcher] got SIG$1, forwarding it to the training step""#);
        line(r#"  if [ -n "$step" ]; then kill -s "$1" "$step" 2>/dev/null || true; fi"#);
        line("}");
        line("trap 'forward USR1' USR1");
        line("trap 'forward TERM' TERM");
        line(&format!("{cmd} &"));
        line("step=$!");
        line("# bash runs traps only between commands: wait until the step has really ended.");
        line(r#"while kill -0 "$step" 2>/dev/null; do wait "$step" || true; done"#);
        line(r#"rc=0; wait "$step" || rc=$?"#);
        if c.training.requeue {
            line(&format!("if [ \"$rc\" -eq {EXIT_PREEMPTED} ]; then"));
            line(
                r#"  echo "[launcher] the trainer checkpointed on notice: requeueing job $SLURM_JOB_ID""#,
            );
            line(r#"  scontrol requeue "$SLURM_JOB_ID""#);
            line("  exit 0");
            line("fi");
        }
        if let Some(m) = &mark_done {
            line("# Done: a rerun of `launcher submit` with this same script skips the job.");
            line(&format!(r#"if [ "$rc" -eq 0 ]; then {m}; fi"#));
        }
        line(&format!(
            r#"echo "[launcher] {} finished with exit code $rc""#,
            quote(name)
        ));
        line(r#"exit "$rc""#);
        o
    }
}

#[cfg(test)]
mod tests;
