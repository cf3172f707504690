//! `launcher embed`: the trainer's `embed` command (a trained checkpoint over a screen's
//! images, into one Parquet table) as Slurm jobs, through the same script renderer as the
//! pipeline (srun, Pyxis, env, secrets by name, every value quoted). Two layouts:
//!
//! - [`Layout::Ranks`]: one job of `nodes × tasks_per_node` tasks, one rank per GPU; the ranks
//!   split the sorted image list, each writes its own parts, rank 0 merges them;
//! - [`Layout::Array`]: a job array of one-task jobs, task `i` embedding slice `i` of `N`
//!   (`--shard-index "$SLURM_ARRAY_TASK_ID" --shard-count N`), then a merge job (`--merge`)
//!   that waits for every task (`afterok`). Arrays suit queues that start small jobs sooner.
//!
//! Resume is the trainer's: its parts and their manifest live in `OUT.parquet.parts/`, so
//! submitting the same jobs again keeps what finished and embeds only the rest.
use crate::cluster::{Cluster, Runtime};
use crate::container_view;
use crate::render::{self, Allocation, ArrayTasks, Dependency, Job, Manifest, Rendered, Shape};
use scdino_config::DatasetLocation;
use std::path::{Path, PathBuf};

/// The one job of [`Layout::Ranks`].
pub const JOB: &str = "embed";
/// The job array of [`Layout::Array`].
pub const SHARDS_JOB: &str = "embed-shards";
/// The merge job of [`Layout::Array`].
pub const MERGE_JOB: &str = "embed-merge";
/// The trainer option that takes an array task's index.
const SHARD_INDEX: &str = "--shard-index";

/// How the work is spread over Slurm jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One job whose tasks are the ranks (one per GPU); rank 0 merges.
    Ranks(Allocation),
    /// `count` one-task jobs (at most `limit` running at once), then a merge job.
    Array { count: u32, limit: Option<u32> },
}

/// What to embed and how: the trainer's `embed` options, passed on as given (paths as the
/// submitting host sees them, relative ones against the folder the launcher runs in).
#[derive(Debug, Clone)]
pub struct Options {
    pub checkpoint: PathBuf,
    /// A folder, or `s3://`, `gs://` or `az://` bucket/prefix (read over the network: no mount
    /// needed).
    pub images: String,
    /// The Parquet table (`--out` of the trainer); its parts go to `OUT.parquet.parts/`.
    pub table: PathBuf,
    pub list: Option<PathBuf>,
    pub metadata: Option<PathBuf>,
    pub path_pattern: Option<String>,
    pub channels: Option<String>,
    pub on_error: Option<String>,
    pub batch_size: Option<u32>,
    pub device: Option<String>,
    pub precision: Option<String>,
    pub layout: Layout,
}

/// Turns the paths the user named into the paths the jobs use.
struct Paths<'a> {
    cluster: &'a Cluster,
    cwd: &'a Path,
    /// Inputs this host does not see (a job would fail at its start unless the nodes do).
    missing: Vec<String>,
}

impl Paths<'_> {
    /// `path` (of option `what`) as the jobs see it: absolute, through the mounts under Pyxis.
    fn job_path(&mut self, what: &str, path: &Path, input: bool) -> anyhow::Result<String> {
        let host = self.cwd.join(path);
        if input && !host.exists() {
            self.missing.push(format!("{what} {}", host.display()));
        }
        let inside = match self.cluster.runtime {
            Runtime::Host => host,
            Runtime::Pyxis => container_view::named_path(self.cluster, &host, what)?,
        };
        Ok(inside.to_string_lossy().into_owned())
    }
}

/// The trainer's words shared by every job, one option per line of the script.
fn trainer_args(o: &Options, paths: &mut Paths) -> anyhow::Result<Vec<Vec<String>>> {
    let images = match o.images.parse::<DatasetLocation>() {
        Ok(DatasetLocation::Remote(_)) => o.images.clone(),
        Ok(DatasetLocation::Local(dir)) => paths.job_path("--images", &dir, true)?,
        Err(e) => anyhow::bail!("--images: {e}"),
    };
    let table = o.table.to_string_lossy();
    anyhow::ensure!(
        !table.contains("://"),
        "--embeddings {table} must be a path on a filesystem every task sees: the tasks write their parts beside it ({table}.parts/)"
    );
    let mut a: Vec<Vec<String>> = vec![
        vec!["embed".into()],
        vec![
            "--checkpoint".into(),
            paths.job_path("--checkpoint", &o.checkpoint, true)?,
        ],
        vec!["--images".into(), images],
        vec![
            "--out".into(),
            paths.job_path("--embeddings", &o.table, false)?,
        ],
    ];
    for (flag, file) in [("--list", &o.list), ("--metadata", &o.metadata)] {
        if let Some(f) = file {
            a.push(vec![flag.into(), paths.job_path(flag, f, true)?]);
        }
    }
    let batch = o.batch_size.map(|b| b.to_string());
    for (flag, value) in [
        ("--path-pattern", &o.path_pattern),
        ("--channels", &o.channels),
        ("--on-error", &o.on_error),
        ("--batch-size", &batch),
        ("--device", &o.device),
        ("--precision", &o.precision),
    ] {
        if let Some(v) = value {
            a.push(vec![flag.into(), v.clone()]);
        }
    }
    Ok(a)
}

/// One job to render: its shape, the trainer words after the shared ones, its log and what it
/// waits for.
struct Planned {
    name: &'static str,
    shape: Shape,
    extra: Vec<Vec<String>>,
    log: PathBuf,
    after: Vec<Dependency>,
}

/// The jobs of a layout, in submission order.
fn plan(layout: Layout, log_dir: &Path, gpus_per_node: u32) -> anyhow::Result<Vec<Planned>> {
    let one_job = |array: Option<ArrayTasks>, one_gpu: bool| Shape {
        distributed: None,
        one_gpu,
        preemptible: false,
        array,
    };
    match layout {
        Layout::Ranks(alloc) => {
            anyhow::ensure!(
                alloc.nodes >= 1 && alloc.tasks_per_node >= 1,
                "--nodes and --tasks-per-node must be at least 1"
            );
            Ok(vec![Planned {
                name: JOB,
                shape: Shape {
                    distributed: Some(alloc),
                    ..one_job(None, false)
                },
                extra: vec![],
                log: log_dir.join(format!("{JOB}-%j.out")),
                after: vec![],
            }])
        }
        Layout::Array { count, limit } => {
            anyhow::ensure!(count >= 1, "--array must be at least 1");
            anyhow::ensure!(limit != Some(0), "--array-limit must be at least 1");
            let tasks = ArrayTasks {
                count,
                limit,
                index_option: SHARD_INDEX,
            };
            let shards = Planned {
                name: SHARDS_JOB,
                shape: one_job(Some(tasks), gpus_per_node > 0),
                extra: vec![vec!["--shard-count".into(), count.to_string()]],
                log: log_dir.join(format!("{SHARDS_JOB}-%A_%a.out")),
                after: vec![],
            };
            let merge = Planned {
                name: MERGE_JOB,
                shape: one_job(None, false),
                extra: vec![vec!["--merge".into()]],
                log: log_dir.join(format!("{MERGE_JOB}-%j.out")),
                after: vec![Dependency {
                    job: SHARDS_JOB.into(),
                    kind: "afterok".into(),
                }],
            };
            Ok(vec![shards, merge])
        }
    }
}

/// The scripts and manifest of `launcher embed` for `out` (the render folder).
pub fn render(cluster: &Cluster, o: &Options, out: &Path, cwd: &Path) -> anyhow::Result<Rendered> {
    let mut paths = Paths {
        cluster,
        cwd,
        missing: vec![],
    };
    let args = trainer_args(o, &mut paths)?;
    let log_dir = render::log_dir(cluster, out)?;
    let ctx = render::context(cluster, cwd)?;
    let mut jobs = Vec::new();
    let mut scripts = Vec::new();
    for (i, p) in plan(o.layout, &log_dir, cluster.slurm.gpus_per_node)?
        .into_iter()
        .enumerate()
    {
        let script = format!("{:02}-{}.sbatch", i + 1, p.name);
        let words: Vec<Vec<String>> = args.iter().cloned().chain(p.extra).collect();
        let text = ctx.job_script(p.name, JOB, p.shape, &words, &p.log, None);
        scripts.push((script.clone(), text));
        jobs.push(Job::new(p.name, JOB, &script, p.log, p.after));
    }
    let warnings = paths
        .missing
        .into_iter()
        .map(|m| format!("{m} does not exist on this host: the jobs fail at their start unless the nodes see it there"))
        .collect();
    Ok(Rendered {
        manifest: Manifest::without_config(cluster, log_dir, jobs),
        scripts,
        files: vec![],
        warnings,
    })
}

#[cfg(test)]
mod tests;
