//! Talking to Slurm: `sbatch --test-only` before anything is submitted, `sbatch --parsable`
//! chained with `--dependency`, per-job state from `scontrol show job -o` (sacct only where
//! accounting exists), `scancel`. The commands come from PATH; `SLURM_CONF` selects the cluster.
use crate::render::{Job, Manifest};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

fn run(cmd: &str, args: &[&str]) -> Result<Output> {
    Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {cmd} (is the Slurm client installed and on PATH?)"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

/// `sbatch --test-only`: Slurm validates the script and the request without submitting.
pub fn test_only(script: &Path) -> Result<()> {
    let s = script.to_string_lossy();
    let out = run("sbatch", &["--test-only", &s])?;
    if !out.status.success() {
        bail!(
            "sbatch --test-only refused {}: {}",
            script.display(),
            text(&out.stderr)
        );
    }
    Ok(())
}

/// The `--dependency` value for a job, from the ids of the jobs it waits for.
/// Jobs in `finished` (done in an earlier submission) are not waited for.
pub fn dependency(
    job: &Job,
    ids: &BTreeMap<String, String>,
    finished: &[String],
) -> Result<Option<String>> {
    let mut by_kind: Vec<(String, Vec<String>)> = Vec::new();
    for d in job
        .after
        .iter()
        .filter(|d| ids.contains_key(&d.job) || !finished.contains(&d.job))
    {
        let id = ids
            .get(&d.job)
            .with_context(|| format!("{} waits for {}, which has no job id", job.name, d.job))?;
        match by_kind.iter_mut().find(|(k, _)| *k == d.kind) {
            Some((_, v)) => v.push(id.clone()),
            None => by_kind.push((d.kind.clone(), vec![id.clone()])),
        }
    }
    if by_kind.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        by_kind
            .into_iter()
            .map(|(k, v)| format!("{k}:{}", v.join(":")))
            .collect::<Vec<_>>()
            .join(","),
    ))
}

/// Submits every job of a rendered folder in order. Everything is checked with
/// `sbatch --test-only` first; if a submission fails, the jobs already submitted are cancelled.
/// The job ids are written into the manifest as they come.
pub fn submit(out: &Path, manifest: &mut Manifest, say: &mut dyn FnMut(String)) -> Result<()> {
    // Slurm does not create the folder of --output; a job without it fails without a log.
    std::fs::create_dir_all(&manifest.log_dir)
        .with_context(|| format!("creating the log folder {}", manifest.log_dir.display()))?;
    let finished: Vec<String> = manifest
        .jobs
        .iter()
        .filter(|j| j.finished_earlier)
        .map(|j| j.name.clone())
        .collect();
    for job in manifest.jobs.iter().filter(|j| !j.finished_earlier) {
        test_only(&out.join(&job.script))?;
    }
    say(format!(
        "sbatch --test-only accepted all {} jobs",
        manifest.jobs.len() - finished.len()
    ));
    if !finished.is_empty() {
        say(format!(
            "finished earlier with these same scripts, not submitted again: {}",
            finished.join(" ")
        ));
    }
    let mut ids = BTreeMap::new();
    for i in 0..manifest.jobs.len() {
        let job = &manifest.jobs[i];
        if job.finished_earlier {
            continue;
        }
        let script = out.join(&job.script);
        let result = dependency(job, &ids, &finished).and_then(|dep| {
            let mut args = vec!["--parsable".to_string()];
            if let Some(d) = &dep {
                args.push(format!("--dependency={d}"));
            }
            args.push(script.to_string_lossy().into_owned());
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = run("sbatch", &argv)?;
            let stdout = text(&o.stdout);
            // `--parsable` prints `<id>` or `<id>;<cluster>`.
            let id = stdout.split(';').next().unwrap_or("").trim().to_string();
            if !o.status.success() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
                bail!(
                    "sbatch failed for {}: {} {}",
                    job.name,
                    stdout,
                    text(&o.stderr)
                );
            }
            Ok((id, dep))
        });
        match result {
            Ok((id, dep)) => {
                ids.insert(job.name.clone(), id.clone());
                manifest.jobs[i].job_id = Some(id.clone());
                manifest.save(out)?;
                let j = &manifest.jobs[i];
                say(format!(
                    "{:<14} job {:<8} {:<28} log {}",
                    j.name,
                    id,
                    dep.map(|d| format!("after {d}")).unwrap_or_default(),
                    j.log_path().display()
                ));
            }
            Err(e) => {
                let submitted: Vec<String> = ids.values().cloned().collect();
                if !submitted.is_empty() {
                    say(format!(
                        "cancelling the jobs already submitted: {}",
                        submitted.join(" ")
                    ));
                    let args: Vec<&str> = submitted.iter().map(String::as_str).collect();
                    let _ = run("scancel", &args);
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

/// A job's state: Slurm's `JobState` names (scontrol, sacct), and the launcher's own for a job
/// Slurm does not know. Shown and serialised as Slurm spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlurmState {
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    Requeued,
    /// Another of Slurm's states (NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, SUSPENDED, ...).
    Other(String),
    /// Slurm forgot the job and there is no accounting to ask.
    Unknown,
    /// Not submitted (yet).
    NotSubmitted,
    /// Skipped: done in an earlier submission with the same script.
    FinishedEarlier,
}

impl SlurmState {
    /// From Slurm's spelling (`CANCELLED by 1000` keeps its first word, as sacct prints it).
    pub fn parse(s: &str) -> Self {
        match s.split_whitespace().next().unwrap_or("") {
            "PENDING" => Self::Pending,
            "RUNNING" => Self::Running,
            "COMPLETED" => Self::Completed,
            "FAILED" => Self::Failed,
            "CANCELLED" => Self::Cancelled,
            "TIMEOUT" => Self::Timeout,
            "REQUEUED" => Self::Requeued,
            "UNKNOWN" | "" => Self::Unknown,
            other => Self::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Pending => "PENDING",
            Self::Running => "RUNNING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
            Self::Timeout => "TIMEOUT",
            Self::Requeued => "REQUEUED",
            Self::Other(s) => s,
            Self::Unknown => "UNKNOWN",
            Self::NotSubmitted => "NOT_SUBMITTED",
            Self::FinishedEarlier => "FINISHED_EARLIER",
        }
    }

    /// Not ended yet: waiting, running, or between the two (a requeued job is pending again).
    pub fn is_active(&self) -> bool {
        match self {
            Self::Pending | Self::Running | Self::Requeued => true,
            Self::Other(s) => matches!(
                s.as_str(),
                "REQUEUE_HOLD"
                    | "REQUEUE_FED"
                    | "SUSPENDED"
                    | "CONFIGURING"
                    | "COMPLETING"
                    | "RESIZING"
                    | "SIGNALING"
                    | "STAGE_OUT"
                    | "STOPPED"
                    | "RESV_DEL_HOLD"
            ),
            _ => false,
        }
    }

    /// Ended without a failure to report: completed, or forgotten by Slurm (whose outcome
    /// the job's log and outputs tell).
    pub fn ended_well(&self) -> bool {
        matches!(self, Self::Completed | Self::Unknown)
    }
}

impl std::fmt::Display for SlurmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for SlurmState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One job's state as Slurm reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobState {
    pub name: String,
    pub job_id: Option<String>,
    pub state: SlurmState,
    pub reason: String,
    pub exit_code: String,
    pub restarts: u32,
    pub run_time: String,
    /// `scontrol`'s StartTime/EndTime (`2025-01-31T12:00:00`, or `Unknown`).
    pub start_time: String,
    pub end_time: String,
    pub log: String,
}

impl JobState {
    pub fn is_active(&self) -> bool {
        self.state.is_active()
    }
}

/// `Key=Value` pairs of `scontrol show job -o`.
pub fn parse_scontrol(line: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    // Values may contain spaces (e.g. Reason, Command): a token without '=' continues the value.
    let mut last: Option<String> = None;
    for tok in line.split_whitespace() {
        match tok.split_once('=') {
            Some((k, v))
                if !k.is_empty()
                    && k.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || b == b'_' || b == b':' || b == b'/'
                    }) =>
            {
                map.insert(k.to_string(), v.to_string());
                last = Some(k.to_string());
            }
            _ => {
                if let Some(k) = &last {
                    let v = map.get_mut(k).unwrap();
                    v.push(' ');
                    v.push_str(tok);
                }
            }
        }
    }
    map
}

/// The `scontrol show job -o` line that tells a job's state. A job array prints one line per
/// task (pending tasks share one): the array is as far as an active task, else as its first
/// task that did not complete, else completed.
pub fn telling_task(out: &str) -> BTreeMap<String, String> {
    let tasks: Vec<BTreeMap<String, String>> = out
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(parse_scontrol)
        .collect();
    let state = |kv: &BTreeMap<String, String>| {
        SlurmState::parse(kv.get("JobState").map_or("", String::as_str))
    };
    let pick = tasks
        .iter()
        .position(|t| state(t).is_active())
        .or_else(|| tasks.iter().position(|t| state(t) != SlurmState::Completed))
        .unwrap_or(0);
    tasks.into_iter().nth(pick).unwrap_or_default()
}

pub fn state(job: &Job) -> Result<JobState> {
    let mut s = JobState {
        name: job.name.clone(),
        job_id: job.job_id.clone(),
        state: if job.finished_earlier {
            SlurmState::FinishedEarlier
        } else {
            SlurmState::NotSubmitted
        },
        reason: String::new(),
        exit_code: String::new(),
        restarts: 0,
        run_time: String::new(),
        start_time: String::new(),
        end_time: String::new(),
        log: job.log_path().display().to_string(),
    };
    let Some(id) = &job.job_id else {
        return Ok(s);
    };
    let o = run("scontrol", &["show", "job", "-o", id])?;
    if o.status.success() {
        let kv = telling_task(&text(&o.stdout));
        s.state = SlurmState::parse(kv.get("JobState").map_or("", String::as_str));
        s.reason = kv.get("Reason").cloned().unwrap_or_default();
        if s.reason == "None" {
            s.reason.clear();
        }
        s.exit_code = kv.get("ExitCode").cloned().unwrap_or_default();
        s.restarts = kv.get("Restarts").and_then(|r| r.parse().ok()).unwrap_or(0);
        s.run_time = kv.get("RunTime").cloned().unwrap_or_default();
        s.start_time = kv.get("StartTime").cloned().unwrap_or_default();
        s.end_time = kv.get("EndTime").cloned().unwrap_or_default();
        return Ok(s);
    }
    // Only "Invalid job id" means the controller forgot the job (MinJobAge); any other
    // failure is the Slurm client or controller failing, which is no job state.
    let err = text(&o.stderr);
    if !err.contains("Invalid job id specified") {
        bail!(
            "scontrol show job -o {id} failed ({}): {err}{}",
            o.status,
            client_hint(&err)
        );
    }
    s.state = SlurmState::Unknown;
    s.reason = "not known to slurmctld any more and no accounting (sacct) to ask".into();
    let Ok(o) = run(
        "sacct",
        &["-n", "-P", "-X", "-j", id, "-o", "State,ExitCode,Elapsed"],
    ) else {
        return Ok(s); // no sacct on this node: no accounting to ask
    };
    let err = text(&o.stderr);
    if !o.status.success() {
        if err.contains("accounting storage is disabled") {
            return Ok(s);
        }
        bail!(
            "sacct -j {id} failed ({}): {err}{}",
            o.status,
            client_hint(&err)
        );
    }
    if let Some(l) = text(&o.stdout).lines().next() {
        let f: Vec<&str> = l.split('|').collect();
        if f.len() == 3 {
            s.state = SlurmState::parse(f[0]);
            s.exit_code = f[1].to_string();
            s.run_time = f[2].to_string();
            s.reason = "from sacct".into();
        }
    }
    Ok(s)
}

/// What to look at when a Slurm client command fails for want of its configuration.
fn client_hint(stderr: &str) -> &'static str {
    if stderr.contains("configuration") || stderr.contains("slurm.conf") {
        " (the Slurm client found no configuration: set SLURM_CONF to the cluster's slurm.conf, or run where the login node's client is set up)"
    } else {
        ""
    }
}

pub fn status(manifest: &Manifest) -> Result<Vec<JobState>> {
    manifest.jobs.iter().map(state).collect()
}

/// A fixed-width table, one job per line.
pub fn table(states: &[JobState]) -> String {
    let mut o = format!(
        "{:<14} {:<8} {:<12} {:<6} {:<8} {:<10} {}\n",
        "JOB", "ID", "STATE", "EXIT", "RESTARTS", "TIME", "REASON / LOG"
    );
    for s in states {
        o.push_str(&format!(
            "{:<14} {:<8} {:<12} {:<6} {:<8} {:<10} {}\n",
            s.name,
            s.job_id.as_deref().unwrap_or("-"),
            s.state,
            s.exit_code,
            s.restarts,
            s.run_time,
            if s.reason.is_empty() {
                s.log.clone()
            } else {
                format!("{} / {}", s.reason, s.log)
            }
        ));
    }
    o
}

/// Polls one submitted job until it has ended (or Slurm forgot it); on timeout cancels it.
pub fn wait(job: &Job, limit: std::time::Duration) -> Result<JobState> {
    let t0 = std::time::Instant::now();
    loop {
        let s = state(job)?;
        if !s.is_active() {
            return Ok(s);
        }
        if t0.elapsed() > limit {
            if let Some(id) = &job.job_id {
                let _ = run("scancel", &[id]);
            }
            bail!(
                "{} (job {}) did not end within {} s (state {}); cancelled it",
                job.name,
                job.job_id.as_deref().unwrap_or("?"),
                limit.as_secs(),
                s.state
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// Cancels every job of the pipeline that is still pending or running; returns their ids.
pub fn cancel(manifest: &Manifest) -> Result<Vec<String>> {
    let active: Vec<String> = status(manifest)?
        .into_iter()
        .filter(JobState::is_active)
        .filter_map(|s| s.job_id)
        .collect();
    if !active.is_empty() {
        let args: Vec<&str> = active.iter().map(String::as_str).collect();
        let o = run("scancel", &args)?;
        if !o.status.success() {
            bail!("scancel {}: {}", active.join(" "), text(&o.stderr));
        }
    }
    Ok(active)
}

#[cfg(test)]
mod tests {
    #[test]
    fn job_states_parse_show_and_serialise_as_slurm_spells_them() {
        for (text, state, active) in [
            ("PENDING", SlurmState::Pending, true),
            ("RUNNING", SlurmState::Running, true),
            ("REQUEUED", SlurmState::Requeued, true),
            ("COMPLETING", SlurmState::Other("COMPLETING".into()), true),
            ("COMPLETED", SlurmState::Completed, false),
            ("CANCELLED by 1000", SlurmState::Cancelled, false),
            ("NODE_FAIL", SlurmState::Other("NODE_FAIL".into()), false),
            ("", SlurmState::Unknown, false),
        ] {
            let parsed = SlurmState::parse(text);
            assert_eq!(parsed, state, "{text}");
            assert_eq!(parsed.is_active(), active, "{text}");
            let shown = format!("{parsed}");
            assert_eq!(SlurmState::parse(&shown), parsed, "{text}");
            assert_eq!(
                serde_json::to_string(&parsed).unwrap(),
                format!("\"{shown}\"")
            );
        }
        assert_eq!(format!("{:<12}|", SlurmState::Failed), "FAILED      |");
        assert_eq!(SlurmState::NotSubmitted.as_str(), "NOT_SUBMITTED");
        assert_eq!(SlurmState::FinishedEarlier.as_str(), "FINISHED_EARLIER");
        assert!(SlurmState::Completed.ended_well() && SlurmState::Unknown.ended_well());
        assert!(!SlurmState::Failed.ended_well() && !SlurmState::Timeout.ended_well());
    }

    use super::*;
    use crate::render::Dependency;

    #[test]
    fn dependencies_group_by_kind() {
        let job = Job {
            name: "features".into(),
            stage: "features".into(),
            script: "x".into(),
            log: "/l/features-%j.out".into(),
            after: vec![
                Dependency {
                    job: "train-c0".into(),
                    kind: "afterok".into(),
                },
                Dependency {
                    job: "train-c1".into(),
                    kind: "afterok".into(),
                },
                Dependency {
                    job: "seg".into(),
                    kind: "afterany".into(),
                },
            ],
            job_id: Some("42".into()),
            finished_earlier: false,
        };
        let ids: BTreeMap<String, String> = [("train-c0", "7"), ("train-c1", "8"), ("seg", "9")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .into();
        assert_eq!(
            dependency(&job, &ids, &[]).unwrap().as_deref(),
            Some("afterok:7:8,afterany:9")
        );
        assert_eq!(job.log_path(), Path::new("/l/features-42.out"));
        assert!(dependency(&job, &BTreeMap::new(), &[]).is_err());
        // Jobs that finished in an earlier submission are not waited for.
        let ids: BTreeMap<String, String> = [("train-c1", "8")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .into();
        let finished = ["train-c0".to_string(), "seg".to_string()];
        assert_eq!(
            dependency(&job, &ids, &finished).unwrap().as_deref(),
            Some("afterok:8")
        );
        let all = ["train-c0".into(), "train-c1".into(), "seg".into()];
        assert_eq!(dependency(&job, &BTreeMap::new(), &all).unwrap(), None);
    }

    /// A job array is as far as its least advanced task: running while one runs or waits,
    /// failed when a task failed, completed only when every task did.
    #[test]
    fn an_array_takes_the_state_of_its_telling_task() {
        let line = |task: &str, state: &str, exit: &str| {
            format!("JobId=1{task} ArrayJobId=10 ArrayTaskId={task} JobState={state} Reason=None ExitCode={exit}")
        };
        let out = |lines: &[String]| lines.join("\n");
        let done = [line("0", "COMPLETED", "0:0"), line("1", "COMPLETED", "0:0")];
        assert_eq!(telling_task(&out(&done))["JobState"], "COMPLETED");
        let failed = [
            line("0", "COMPLETED", "0:0"),
            line("1", "FAILED", "1:0"),
            line("2", "COMPLETED", "0:0"),
        ];
        assert_eq!(telling_task(&out(&failed))["ExitCode"], "1:0");
        let running = [
            line("0", "FAILED", "1:0"),
            line("1", "RUNNING", "0:0"),
            line("2-3", "PENDING", "0:0"),
        ];
        assert_eq!(telling_task(&out(&running))["ArrayTaskId"], "1");
        assert!(telling_task("").is_empty());
    }

    #[test]
    fn scontrol_one_line_output() {
        let kv = parse_scontrol("JobId=12 JobName=scdino-train-c0 UserId=root(0) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 ExitCode=0:0 RunTime=00:00:03 Command=/tmp/a b/01-train.sbatch WorkDir=/tmp");
        assert_eq!(kv["JobState"], "PENDING");
        assert_eq!(kv["Restarts"], "1");
        assert_eq!(kv["ExitCode"], "0:0");
        assert_eq!(kv["Command"], "/tmp/a b/01-train.sbatch");
    }
}
