//! `launcher`: renders and submits the scDINO pipeline as Slurm jobs (Pyxis/Enroot).
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use launcher::cluster::Cluster;
use launcher::render::{self, Inputs, Manifest, Rendered};
use launcher::slurm;
use std::path::{Path, PathBuf};

mod image_cmd;

#[derive(Debug, Parser)]
#[command(
    name = "launcher",
    version,
    about = "Build and run the scDINO image; submit the pipeline to Slurm with Pyxis/Enroot"
)]
struct Cli {
    /// `text` (readable lines) or `json` (one object per line, for log shipping); levels via
    /// `SCDINO_LOG` or `RUST_LOG`. Only a command's result goes to stdout.
    #[arg(long, global = true, env = scdino_base::log::FORMAT_ENV, value_name = "FORMAT")]
    log_format: Option<scdino_base::log::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write one reviewable sbatch script per job and manifest.json into --out.
    Render(RenderArgs),
    /// Render, check every script with `sbatch --test-only`, then submit the chain
    /// (`--build TAG` first builds the image and pushes or squashes it).
    Submit {
        #[command(flatten)]
        render: RenderArgs,
        #[command(flatten)]
        build: image_cmd::SubmitBuildArgs,
    },
    /// Per-job state of a submitted pipeline (scontrol; sacct where accounting exists).
    Status {
        /// The folder `launcher submit` wrote.
        #[arg(long)]
        out: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Cancel every pending or running job of a submitted pipeline.
    Cancel {
        #[arg(long)]
        out: PathBuf,
    },
    /// Submit `trainer collectives-bench` on one task per GPU across the nodes, wait for it and
    /// report pass/fail (exit 1 on fail): a check of the fabric before a long training run.
    NcclTest(NcclTestArgs),
    /// Submit `trainer selftest` on every task of an allocation (CUDA, NCCL, EFA, a GPU training
    /// step against the CPU, an all-reduce across all tasks), wait, and print one table (exit 1
    /// on any failure).
    Selftest(OneJobArgs),
    /// Measure training throughput at several allocation sizes (fixed per-task batch) and
    /// write the scaling-efficiency table as Markdown, JSON and PNG.
    Scaling(ScalingArgs),
    /// Embed a screen with a trained checkpoint on Slurm (the trainer's `embed`): one job of
    /// one rank per GPU, or `--array N` one-task jobs and a merge job. Checks every script
    /// with `sbatch --test-only`, then submits; the same command again resumes.
    Embed(EmbedArgs),
    /// Build, push, inspect or squash the trainer image (Docker Engine API).
    #[command(subcommand)]
    Image(image_cmd::ImageCommand),
    /// Run the image on this machine (local GPU smoke test): `launcher run IMAGE -- pipeline`.
    Run(image_cmd::RunArgs),
    /// Print a command line with every word quoted for the shell, as generated scripts do.
    Quote {
        /// The words to quote.
        words: Vec<String>,
    },
}

#[derive(Debug, Args)]
struct RenderArgs {
    /// cluster.yaml (see slurm/cluster.example.yaml).
    #[arg(long)]
    cluster: PathBuf,
    /// The trainer config (default: `trainer_config` of cluster.yaml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Folder for the scripts and manifest.json (on a filesystem the nodes see).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct NcclTestArgs {
    #[command(flatten)]
    job: OneJobArgs,
    /// all_reduce (what data-parallel training uses), all_gather, reduce_scatter, broadcast, all.
    #[arg(long, default_value = "all_reduce")]
    op: String,
    /// Smallest buffer (K, M, G binary suffixes, as nccl-tests' -b).
    #[arg(long, default_value = "64M")]
    min_bytes: String,
    /// Largest buffer (nccl-tests' -e). The gate averages over all sizes: keep them large.
    #[arg(long, default_value = "1G")]
    max_bytes: String,
    #[arg(long, default_value_t = 4)]
    factor: u32,
    #[arg(long, default_value_t = 20)]
    iters: u32,
    #[arg(long, default_value_t = 5)]
    warmup: u32,
    /// Fail when any op's busbw averaged over the sizes is below this many GB/s.
    #[arg(long)]
    min_busbw: Option<f64>,
    /// gloo or nccl (default: the trainer picks NCCL on GPUs, else Gloo).
    #[arg(long)]
    backend: Option<String>,
}

fn nccl_test(a: NcclTestArgs) -> Result<()> {
    use launcher::nccl_test::{self, Options};
    let cwd = std::env::current_dir().context("current directory")?;
    let cluster = Cluster::load(&a.job.cluster)?;
    let out = absolute(&a.job.out, &cwd);
    let opts = Options {
        nodes: a.job.nodes,
        tasks_per_node: a.job.tasks_per_node,
        op: a.op,
        min_bytes: a.min_bytes,
        max_bytes: a.max_bytes,
        factor: a.factor,
        iters: a.iters,
        warmup: a.warmup,
        min_busbw: a.min_busbw,
        backend: a.backend,
    };
    let alloc = opts.allocation(&cluster);
    let mut r = nccl_test::render(&cluster, &opts, &out, &cwd)?;
    r.manifest.cluster_file = Some(absolute(&a.job.cluster, &cwd));
    let (state, log_path, log) = submit_one_and_wait(&mut r, &out, alloc, a.job.wait_timeout)?;
    let job = &r.manifest.jobs[0];
    let world = (alloc.nodes * alloc.tasks_per_node) as usize;
    let Some(report) = nccl_test::find_report(&log) else {
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "nccl-test FAILED: job {} ended {} (exit {}) without a report in {}; its last lines:\n{}",
            job.job_id.as_deref().unwrap_or("?"),
            state.state,
            state.exit_code,
            log_path.display(),
            tail.join("\n")
        );
    };
    print!("{}", nccl_test::summary(&report));
    let mut why = nccl_test::judge(&report, world, a.min_busbw);
    // A rank that died after the report (or a failed step) fails the test too. UNKNOWN: Slurm
    // already forgot the job and there is no accounting; the report is all there is.
    if why.is_empty() && !state.state.ended_well() {
        why.push(format!(
            "the job ended {} (exit {})",
            state.state, state.exit_code
        ));
    }
    let gate = a
        .min_busbw
        .map(|m| format!("gate {m} GB/s"))
        .unwrap_or_else(|| "no busbw gate".into());
    if why.is_empty() {
        println!(
            "nccl-test PASSED: {} ranks, backend {}, {gate}; log {}",
            report.world,
            report.backend,
            log_path.display()
        );
        Ok(())
    } else {
        bail!(
            "nccl-test FAILED ({gate}, job {} {}): {}; log {}",
            job.job_id.as_deref().unwrap_or("?"),
            state.state,
            why.join("; "),
            log_path.display()
        )
    }
}

/// Submits a one-job render into `out` (refusing a folder whose job is still active), waits
/// for the job to end and returns its final state, log path and log text.
fn submit_one_and_wait(
    r: &mut Rendered,
    out: &Path,
    alloc: launcher::render::Allocation,
    wait_timeout: u64,
) -> Result<(slurm::JobState, PathBuf, String)> {
    refuse_active(out)?;
    render::write(r, out)?;
    slurm::submit(out, &mut r.manifest, &mut |l| println!("{l}"))?;
    let job = &r.manifest.jobs[0];
    println!(
        "waiting for {} ({} nodes x {} tasks)",
        job.name, alloc.nodes, alloc.tasks_per_node
    );
    let state = slurm::wait(job, std::time::Duration::from_secs(wait_timeout))?;
    let log_path = job.log_path();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    Ok((state, log_path, log))
}

#[derive(Debug, Args)]
struct ScalingArgs {
    /// cluster.yaml (see slurm/cluster.example.yaml).
    #[arg(long)]
    cluster: PathBuf,
    /// The trainer config (default: `trainer_config` of cluster.yaml); its per-task batch is
    /// kept at every size.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Folder for the scripts, configs, runs and the report (scaling.md/.json/.png).
    #[arg(long)]
    out: PathBuf,
    /// Node counts to measure, e.g. 1,2,4.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    nodes: Vec<u32>,
    /// Tasks per node (default: slurm.tasks_per_node: one per GPU; 1 without GPUs); a list
    /// measures each.
    #[arg(long, value_delimiter = ',')]
    tasks_per_node: Vec<u32>,
    /// Training steps per size (the first two are warm-up).
    #[arg(long, default_value_t = 20)]
    steps: u64,
    /// Give up (and cancel the jobs) after this many seconds per size, queueing included.
    #[arg(long, default_value_t = 3600)]
    wait_timeout: u64,
}

fn scaling(a: ScalingArgs) -> Result<()> {
    use launcher::scaling;
    let cwd = std::env::current_dir().context("current directory")?;
    let cluster = Cluster::load(&a.cluster)?;
    let out = absolute(&a.out, &cwd);
    let config = a
        .config
        .clone()
        .or_else(|| cluster.trainer_config.clone())
        .context("no trainer config: pass --config or set trainer_config in the cluster file")?;
    let config = absolute(&config, &cwd);
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("reading the trainer config {}", config.display()))?;
    let tpn = if a.tasks_per_node.is_empty() {
        vec![cluster.slurm.ranks_per_node()]
    } else {
        a.tasks_per_node.clone()
    };
    let sizes = scaling::sizes(&a.nodes, &tpn)?;
    let host = launcher::container_view::HostPaths {
        trainer_config: &config,
        trainer_text: &text,
        config_from_cli: a.config.is_some(),
        cwd: &cwd,
        out: &out,
    };
    let mut r = scaling::render(&cluster, &host, &sizes, a.steps)?;
    r.manifest.cluster_file = Some(absolute(&a.cluster, &cwd));
    refuse_active(&out)?;
    // Every size starts from scratch: no checkpoint of an earlier measurement may be resumed.
    let runs = out.join("runs");
    if runs.exists() {
        std::fs::remove_dir_all(&runs).with_context(|| format!("removing {}", runs.display()))?;
    }
    render::write(&r, &out)?;
    slurm::submit(&out, &mut r.manifest, &mut |l| println!("{l}"))?;
    let mut measured = Vec::new();
    for (job, size) in r.manifest.jobs.iter().zip(&sizes) {
        println!("waiting for {} ({} tasks)", job.name, size.tasks());
        let state = slurm::wait(job, std::time::Duration::from_secs(a.wait_timeout))?;
        let log = std::fs::read_to_string(job.log_path()).unwrap_or_default();
        if !state.state.ended_well() {
            let _ = slurm::cancel(&r.manifest);
            bail!(
                "scaling: {} (job {}) ended {} (exit {}); log {}",
                job.name,
                job.job_id.as_deref().unwrap_or("?"),
                state.state,
                state.exit_code,
                job.log_path().display()
            );
        }
        measured.push((*size, scaling::parse_log(&log)));
    }
    let report = scaling::report(a.steps, &measured)?;
    print!("{}", scaling::markdown(&report));
    for p in scaling::write(&report, &out)? {
        println!("wrote {}", p.display());
    }
    Ok(())
}

#[derive(Debug, Args)]
struct EmbedArgs {
    /// cluster.yaml (see slurm/cluster.example.yaml).
    #[arg(long)]
    cluster: PathBuf,
    /// Folder for the scripts and manifest.json (and, by default, the logs).
    #[arg(long)]
    out: PathBuf,
    /// The trained checkpoint (the trainer's --checkpoint).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The images: a folder every node sees, or s3://, gs:// or az:// bucket/prefix.
    #[arg(long)]
    images: String,
    /// The Parquet table to write (the trainer's --out), on a filesystem every node sees;
    /// the parts go to OUT.parquet.parts/ beside it, failed images to OUT.errors.parquet.
    #[arg(long, value_name = "OUT.parquet")]
    embeddings: PathBuf,
    /// Image paths (column `path`, relative to --images) instead of listing --images.
    #[arg(long, value_name = "FILE.csv")]
    list: Option<PathBuf>,
    /// Metadata_* columns joined on its `path` column.
    #[arg(long, value_name = "FILE.csv")]
    metadata: Option<PathBuf>,
    /// e.g. '{Plate}/{Well}/{Site}_{Cell}.tiff' -> Metadata_Plate, Metadata_Well, ...
    #[arg(long)]
    path_pattern: Option<String>,
    /// Comma-separated channel names.
    #[arg(long)]
    channels: Option<String>,
    /// skip (bad images go to the errors table) or fail.
    #[arg(long, value_parser = ["skip", "fail"])]
    on_error: Option<String>,
    #[arg(long)]
    batch_size: Option<u32>,
    /// cpu, cuda or cuda:N.
    #[arg(long)]
    device: Option<String>,
    #[arg(long, value_parser = ["fp32", "bf16"])]
    precision: Option<String>,
    /// Nodes of the one job (default: slurm.nodes).
    #[arg(long, conflicts_with = "array")]
    nodes: Option<u32>,
    /// Ranks per node of the one job (default: slurm.tasks_per_node: one per GPU).
    #[arg(long, conflicts_with = "array")]
    tasks_per_node: Option<u32>,
    /// A job array of N one-task jobs (task i embeds slice i of N) and a merge job after them.
    #[arg(long, value_name = "N")]
    array: Option<u32>,
    /// At most this many array tasks at once (`--array=0-(N-1)%K`).
    #[arg(long, value_name = "K", requires = "array")]
    array_limit: Option<u32>,
    /// Write the scripts and manifest.json only; submit nothing.
    #[arg(long)]
    render_only: bool,
}

fn embed(a: EmbedArgs) -> Result<()> {
    use launcher::embed::{self, Layout, Options};
    let cwd = std::env::current_dir().context("current directory")?;
    let cluster = Cluster::load(&a.cluster)?;
    let out = absolute(&a.out, &cwd);
    let layout = match a.array {
        Some(count) => Layout::Array {
            count,
            limit: a.array_limit,
        },
        None => Layout::Ranks(launcher::render::Allocation::of(
            &cluster,
            a.nodes,
            a.tasks_per_node,
        )),
    };
    let opts = Options {
        checkpoint: a.checkpoint,
        images: a.images,
        table: a.embeddings,
        list: a.list,
        metadata: a.metadata,
        path_pattern: a.path_pattern,
        channels: a.channels,
        on_error: a.on_error,
        batch_size: a.batch_size,
        device: a.device,
        precision: a.precision,
        layout,
    };
    let mut r = embed::render(&cluster, &opts, &out, &cwd)?;
    r.manifest.cluster_file = Some(absolute(&a.cluster, &cwd));
    for w in &r.warnings {
        tracing::warn!("{w}");
    }
    if !a.render_only {
        refuse_active(&out)?;
    }
    render::write(&r, &out)?;
    if a.render_only {
        for (name, _) in &r.scripts {
            println!("{}", out.join(name).display());
        }
        println!("{}", out.join(render::MANIFEST).display());
        return Ok(());
    }
    slurm::submit(&out, &mut r.manifest, &mut |l| println!("{l}"))?;
    println!(
        "submitted {} jobs; the same command again resumes (finished parts are kept); follow with: launcher status --out {}",
        r.manifest.jobs.len(),
        launcher::shell::quote(&out.to_string_lossy())
    );
    Ok(())
}

/// Where and on how many tasks a one-job check runs (nccl-test, selftest).
#[derive(Debug, Args)]
struct OneJobArgs {
    /// cluster.yaml (see slurm/cluster.example.yaml).
    #[arg(long)]
    cluster: PathBuf,
    /// Folder for the script, manifest.json and (by default) the log.
    #[arg(long)]
    out: PathBuf,
    /// Nodes (default: slurm.nodes).
    #[arg(long)]
    nodes: Option<u32>,
    /// Tasks per node (default: slurm.tasks_per_node: one per GPU; 1 without GPUs).
    #[arg(long)]
    tasks_per_node: Option<u32>,
    /// Give up (and cancel the job) after this many seconds, queueing included.
    #[arg(long, default_value_t = 3600)]
    wait_timeout: u64,
}

fn selftest(a: OneJobArgs) -> Result<()> {
    use launcher::selftest;
    let cwd = std::env::current_dir().context("current directory")?;
    let cluster = Cluster::load(&a.cluster)?;
    let out = absolute(&a.out, &cwd);
    let alloc = launcher::render::Allocation::of(&cluster, a.nodes, a.tasks_per_node);
    let mut r = selftest::render(&cluster, alloc, &out, &cwd)?;
    r.manifest.cluster_file = Some(absolute(&a.cluster, &cwd));
    let (state, log_path, log) = submit_one_and_wait(&mut r, &out, alloc, a.wait_timeout)?;
    let job_id = r.manifest.jobs[0].job_id.clone().unwrap_or_default();
    let reports = selftest::find_reports(&log);
    let world = (alloc.nodes * alloc.tasks_per_node) as usize;
    print!("{}", selftest::table(&reports));
    let why = selftest::judge(&reports, world);
    if why.is_empty() {
        println!(
            "selftest PASSED on {world} tasks (job {job_id}, {}); log {}",
            state.state,
            log_path.display()
        );
        return Ok(());
    }
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    bail!(
        "selftest FAILED (job {job_id} {} exit {}): {}; log {}{}",
        state.state,
        state.exit_code,
        why.join("; "),
        log_path.display(),
        if reports.is_empty() {
            format!(", its last lines:\n{}", tail.join("\n"))
        } else {
            String::new()
        }
    )
}

/// Refuses a folder whose earlier jobs are still queued or running: writing over its manifest
/// would forget their ids.
fn refuse_active(out: &Path) -> Result<()> {
    let Ok(old) = Manifest::load(out) else {
        return Ok(());
    };
    let active: Vec<String> = slurm::status(&old)?
        .into_iter()
        .filter(slurm::JobState::is_active)
        .map(|s| format!("{} ({})", s.name, s.job_id.unwrap_or_default()))
        .collect();
    if !active.is_empty() {
        bail!(
            "{} holds jobs that are still queued or running: {}; `launcher cancel --out {}` first, or use another --out",
            out.display(),
            active.join(", "),
            out.display()
        );
    }
    Ok(())
}

fn absolute(p: &Path, cwd: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    }
}

fn do_render(a: &RenderArgs, image: Option<String>) -> Result<(PathBuf, Rendered)> {
    let cwd = std::env::current_dir().context("current directory")?;
    let loaded = Cluster::load(&a.cluster)?;
    let cluster = match image {
        None => loaded,
        Some(image) => {
            launcher::cluster::check_image_for(&image, loaded.container.enroot_version)
                .map_err(|m| anyhow::anyhow!("the built image cannot be used by Pyxis: {m}"))?;
            loaded.with_image(image)?
        }
    };
    let config = a
        .config
        .clone()
        .or_else(|| cluster.trainer_config.clone())
        .context("no trainer config: pass --config or set trainer_config in the cluster file")?;
    let config = absolute(&config, &cwd);
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("reading the trainer config {}", config.display()))?;
    let out = absolute(&a.out, &cwd);
    let inputs = Inputs {
        trainer_config: config,
        trainer_text: text,
        config_from_cli: a.config.is_some(),
        out: out.clone(),
        cwd: cwd.clone(),
        cluster_file: Some(absolute(&a.cluster, &cwd)),
    };
    let r = render::render(&cluster, &inputs)?;
    for w in &r.warnings {
        tracing::warn!("{w}");
    }
    Ok((out, r))
}

fn main() -> std::process::ExitCode {
    use scdino_base::log::{self, Identity};
    let cli = Cli::parse();
    let installed = log::format_from(cli.log_format).and_then(|f| {
        log::init(
            f,
            Identity::local(),
            &["launcher", "scdino_config", "scdino_base"],
            None,
        )
    });
    if let Err(e) = installed {
        eprintln!("Error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            log::report_error(&log::chain_text(e.as_ref()), &format!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::NcclTest(a) => nccl_test(a)?,
        Command::Selftest(a) => selftest(a)?,
        Command::Scaling(a) => scaling(a)?,
        Command::Embed(a) => embed(a)?,
        Command::Image(c) => image_cmd::image(c)?,
        Command::Run(a) => image_cmd::run_image(a)?,
        Command::Quote { words } => println!("{}", launcher::shell::join(words)),
        Command::Render(a) => {
            let (out, r) = do_render(&a, None)?;
            render::write(&r, &out)?;
            for (name, _) in &r.scripts {
                println!("{}", out.join(name).display());
            }
            println!("{}", out.join(render::MANIFEST).display());
        }
        Command::Submit { render: a, build } => {
            let out = absolute(&a.out, &std::env::current_dir()?);
            refuse_active(&out)?;
            let image = match &build.build {
                None => None,
                Some(_) => {
                    let cluster = Cluster::load(&a.cluster)?;
                    if cluster.runtime != launcher::cluster::Runtime::Pyxis {
                        bail!(
                            "--build makes an image for the jobs, but {} has runtime: host",
                            a.cluster.display()
                        );
                    }
                    let config = a
                        .config
                        .clone()
                        .or_else(|| cluster.trainer_config.clone())
                        .context("no trainer config: pass --config or set trainer_config in the cluster file")?;
                    build.image_for_jobs(&config, cluster.container.enroot_version)?
                }
            };
            let (out, mut r) = do_render(&a, image)?;
            render::mark_finished_earlier(&mut r, &out);
            render::write(&r, &out)?;
            if r.manifest.jobs.iter().all(|j| j.finished_earlier) {
                println!(
                    "nothing to submit: every job finished earlier with these same scripts (markers in {})",
                    out.join(render::DONE_DIR).display()
                );
                return Ok(());
            }
            slurm::submit(&out, &mut r.manifest, &mut |l| println!("{l}"))?;
            println!(
                "submitted {} jobs; manifest {}; follow with: launcher status --out {}",
                r.manifest
                    .jobs
                    .iter()
                    .filter(|j| !j.finished_earlier)
                    .count(),
                out.join(render::MANIFEST).display(),
                launcher::shell::quote(&out.to_string_lossy())
            );
        }
        Command::Status { out, json } => {
            let m = Manifest::load(&out)?;
            let states = slurm::status(&m)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&states)?);
            } else {
                print!("{}", slurm::table(&states));
            }
        }
        Command::Cancel { out } => {
            let m = Manifest::load(&out)?;
            let ids = slurm::cancel(&m)?;
            if ids.is_empty() {
                println!(
                    "nothing to cancel: no job of {} is pending or running",
                    out.display()
                );
            } else {
                println!("cancelled {}", ids.join(" "));
            }
        }
    }
    Ok(())
}
