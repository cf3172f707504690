//! One sbatch script that runs `trainer <args>` under srun, written section by section: the
//! header, the `#SBATCH` directives, the environment, the rendezvous, the container's
//! environment, the srun command and the ending (plain, or forwarding a preemption notice).
use super::{
    Allocation, Ctx, Done, Shape, EXIT_PREEMPTED, NVIDIA_VISIBLE_DEVICES, TUNABLE_PATTERNS,
};
use crate::cluster::{Program, RESERVED_ENV};
use crate::shell::{join, quote};
use std::path::Path;

fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// A script under construction, one line at a time.
#[derive(Default)]
struct Lines(String);

impl Lines {
    fn line(&mut self, s: &str) {
        self.0.push_str(s);
        self.0.push('\n');
    }

    /// `#SBATCH --key=value`, the value quoted.
    fn directive(&mut self, key: &str, value: &str) {
        self.line(&format!("#SBATCH --{key}={}", quote(value)));
    }
}

/// What one script is about: the job, its shape and what it runs.
struct Job<'a> {
    name: &'a str,
    shape: Shape,
    /// The container image with Pyxis; None on the host.
    image: Option<&'a str>,
    /// No GPUs and Pyxis: the job voids `NVIDIA_VISIBLE_DEVICES` so Enroot skips its hook.
    no_gpu_hook: bool,
}

impl Job<'_> {
    fn distributed(&self) -> bool {
        self.shape.distributed.is_some()
    }

    fn pyxis(&self) -> bool {
        self.image.is_some()
    }
}

impl Ctx<'_> {
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
        let image = match self.cluster.program() {
            Program::Pyxis { image } => Some(image.as_str()),
            Program::Host { .. } => None,
        };
        let job = Job {
            name,
            shape,
            image,
            no_gpu_hook: image.is_some()
                && self.cluster.slurm.gpus_per_node == 0
                && !self.cluster.env.contains_key(NVIDIA_VISIBLE_DEVICES),
        };
        let mut o = Lines::default();
        header(&mut o, name, stage, done);
        self.directives(&mut o, &job, log);
        self.environment(&mut o, &job);
        o.line("");
        if job.distributed() {
            cpu_binding(&mut o);
        }
        if job.pyxis() {
            self.container_env(&mut o, &job);
        }
        if job.distributed() || job.pyxis() {
            o.line("");
        }
        let cmd = self.srun(&job, args);
        let mark_done = done.map(|d| {
            format!(
                "mkdir -p {dir} && sha256sum < \"$0\" | cut -d' ' -f1 > {file}",
                dir = quote(&p(&d.dir)),
                file = quote(&p(&d.dir.join(name)))
            )
        });
        if shape.preemptible {
            self.preemptible_ending(&mut o, name, &cmd, mark_done.as_deref());
        } else {
            plain_ending(&mut o, name, &cmd, mark_done.as_deref());
        }
        o.0
    }

    fn directives(&self, o: &mut Lines, job: &Job, log: &Path) {
        let c = self.cluster;
        let sl = &c.slurm;
        o.directive("job-name", &format!("scdino-{}", job.name));
        for (k, v) in [
            ("partition", &sl.partition),
            ("account", &sl.account),
            ("qos", &sl.qos),
        ] {
            if let Some(v) = v {
                o.directive(k, v);
            }
        }
        allocation(o, job.shape, sl.gpus_per_node);
        if let Some(a) = job.shape.array {
            let limit = a.limit.map(|l| format!("%{l}")).unwrap_or_default();
            o.directive("array", &format!("0-{}{limit}", a.count.saturating_sub(1)));
        }
        o.directive("cpus-per-task", &sl.cpus_per_task.to_string());
        if let Some(m) = &sl.mem {
            o.directive("mem", m);
        }
        o.directive("time", &sl.time);
        if !job.pyxis() {
            o.directive("chdir", &p(&self.workdir));
        }
        o.directive("output", &p(log));
        o.directive("open-mode", "append");
        o.directive("export", "ALL");
        o.directive("kill-on-invalid-dep", "yes");
        if job.shape.preemptible {
            o.directive(
                "signal",
                &format!("B:USR1@{}", c.training.signal_grace_seconds),
            );
            o.line(if c.training.requeue {
                "#SBATCH --requeue"
            } else {
                "#SBATCH --no-requeue"
            });
        }
        o.line("set -euo pipefail");
        o.line("");
    }

    /// Tunables, the GPU hook's switch, the secrets' names, and the job's first log line.
    fn environment(&self, o: &mut Lines, job: &Job) {
        let c = self.cluster;
        if !c.env.is_empty() {
            o.line("# Tunables (with Pyxis also listed in --container-env, so they beat the image's ENV).");
            for (k, v) in &c.env {
                o.line(&format!("export {k}={}", quote(v)));
            }
        }
        if job.no_gpu_hook {
            o.line("# No GPUs on this cluster: the image's NVIDIA_VISIBLE_DEVICES=all would make Enroot's");
            o.line("# nvidia hook require nvidia-container-cli, which CPU nodes lack; void skips the hook.");
            o.line(&format!("export {NVIDIA_VISIBLE_DEVICES}=void"));
        }
        if !c.secrets.is_empty() {
            o.line(&format!(
                "# Secrets, by name only: inherited from the environment `launcher submit` ran in: {}",
                c.secrets.join(" ")
            ));
        }
        if job.distributed() {
            rendezvous(o, job.name);
        } else if job.shape.array.is_some() {
            o.line(&format!(
                r#"echo "[launcher] {} job $SLURM_ARRAY_JOB_ID task $SLURM_ARRAY_TASK_ID (job $SLURM_JOB_ID) on $SLURM_JOB_NODELIST""#,
                quote(job.name)
            ));
        } else {
            o.line(&format!(
                r#"echo "[launcher] {} job $SLURM_JOB_ID on $SLURM_JOB_NODELIST""#,
                quote(job.name)
            ));
        }
    }

    /// Pyxis keeps an image's ENV over the job's unless the name is in --container-env.
    fn container_env(&self, o: &mut Lines, job: &Job) {
        let c = self.cluster;
        let mut names: Vec<&str> = c.env.keys().map(String::as_str).collect();
        if job.no_gpu_hook {
            names.push(NVIDIA_VISIBLE_DEVICES);
        }
        names.extend(c.secrets.iter().map(String::as_str));
        if job.distributed() {
            names.extend(RESERVED_ENV);
        }
        o.line("# Variables the container takes from the job, not from the image's ENV: the ones");
        o.line("# above and every network tunable set in the job's environment.");
        o.line(&format!("container_env={}", quote(&names.join(","))));
        o.line("for name in $(compgen -e); do");
        o.line(&format!(
            "  case $name in {TUNABLE_PATTERNS}) ;; *) continue ;; esac"
        ));
        o.line(
            r#"  case ",$container_env," in *",$name,"*) ;; *) container_env="${container_env:+$container_env,}$name" ;; esac"#,
        );
        o.line("done");
        o.line("container_env_opt=()");
        o.line(
            r#"if [ -n "$container_env" ]; then container_env_opt=("--container-env=$container_env"); fi"#,
        );
    }

    /// The srun command, one option (with its value) per line for review; every word quoted
    /// on its own.
    fn srun(&self, job: &Job, args: &[Vec<String>]) -> String {
        let mut srun: Vec<String> = vec!["srun".into()];
        if job.distributed() {
            srun.push(join(["--kill-on-bad-exit=1"]));
            srun.push(r#""${cpu_bind[@]}""#.into());
        }
        if let Some(image) = job.image {
            let k = &self.cluster.container;
            srun.push(join([format!("--container-image={image}")]));
            if !k.mounts.is_empty() {
                srun.push(join([format!("--container-mounts={}", k.mounts.join(","))]));
            }
            srun.push(join([format!("--container-workdir={}", p(&self.workdir))]));
            srun.push(join([if k.mount_home {
                "--container-mount-home"
            } else {
                "--no-container-mount-home"
            }]));
            srun.push(r#""${container_env_opt[@]}""#.into());
        }
        // The program goes on the line of the first trainer word (the subcommand).
        let mut words = args.iter();
        let mut first = vec![p(&self.program)];
        first.extend(words.next().into_iter().flatten().cloned());
        srun.push(join(first));
        srun.extend(words.map(join));
        if let Some(a) = job.shape.array {
            srun.push(format!(
                r#"{} "$SLURM_ARRAY_TASK_ID""#,
                quote(a.index_option)
            ));
        }
        srun.join(" \\\n  ")
    }

    /// Runs the step in the background so the batch shell can forward a preemption notice;
    /// requeues the job when the trainer checkpointed on it.
    fn preemptible_ending(&self, o: &mut Lines, name: &str, cmd: &str, mark_done: Option<&str>) {
        o.line("# The batch shell gets USR1 (--signal=B:) or TERM and forwards it to the training step;");
        o.line(&format!(
            "# the trainer checkpoints at the next step and exits {EXIT_PREEMPTED}."
        ));
        o.line("step=");
        o.line("forward() {");
        o.line(r#"  echo "[launcher] got SIG$1, forwarding it to the training step""#);
        o.line(r#"  if [ -n "$step" ]; then kill -s "$1" "$step" 2>/dev/null || true; fi"#);
        o.line("}");
        o.line("trap 'forward USR1' USR1");
        o.line("trap 'forward TERM' TERM");
        o.line(&format!("{cmd} &"));
        o.line("step=$!");
        o.line("# bash runs traps only between commands: wait until the step has really ended.");
        o.line(r#"while kill -0 "$step" 2>/dev/null; do wait "$step" || true; done"#);
        o.line(r#"rc=0; wait "$step" || rc=$?"#);
        if self.cluster.training.requeue {
            o.line(&format!("if [ \"$rc\" -eq {EXIT_PREEMPTED} ]; then"));
            o.line(
                r#"  echo "[launcher] the trainer checkpointed on notice: requeueing job $SLURM_JOB_ID""#,
            );
            o.line(r#"  scontrol requeue "$SLURM_JOB_ID""#);
            o.line("  exit 0");
            o.line("fi");
        }
        if let Some(m) = mark_done {
            o.line("# Done: a rerun of `launcher submit` with this same script skips the job.");
            o.line(&format!(r#"if [ "$rc" -eq 0 ]; then {m}; fi"#));
        }
        o.line(&format!(
            r#"echo "[launcher] {} finished with exit code $rc""#,
            quote(name)
        ));
        o.line(r#"exit "$rc""#);
    }
}

fn header(o: &mut Lines, name: &str, stage: &str, done: Option<&Done>) {
    o.line("#!/bin/bash");
    o.line(&format!(
        "# scDINO pipeline job `{name}` (stage {stage}), rendered by launcher {}.",
        env!("CARGO_PKG_VERSION")
    ));
    o.line("# Re-render rather than edit. Every value is shell-quoted; no secret is written here.");
    if let Some(d) = done {
        o.line(&format!(
            "# Trainer config sha256 {} (part of this script, whose hash marks it done).",
            d.config_sha256
        ));
    }
}

/// Nodes, tasks and GPUs: the allocation of a distributed job, else one task on one node.
fn allocation(o: &mut Lines, shape: Shape, gpus_per_node: u32) {
    if let Some(Allocation {
        nodes,
        tasks_per_node,
        gpus_per_node,
    }) = shape.distributed
    {
        o.directive("nodes", &nodes.to_string());
        o.directive("ntasks-per-node", &tasks_per_node.to_string());
        if gpus_per_node > 0 {
            o.directive("gpus-per-node", &gpus_per_node.to_string());
        }
    } else {
        o.directive("nodes", "1");
        o.directive("ntasks", "1");
        if gpus_per_node > 0 && shape.one_gpu {
            o.directive("gpus-per-node", "1");
        }
    }
}

/// The first node of the allocation and a port derived from the job id.
fn rendezvous(o: &mut Lines, name: &str) {
    o.line("");
    o.line("# Rendezvous: the first node of the allocation, a port derived from the job id.");
    // `sed -n 1p` reads all input: `head -n1` would leave scontrol to die of SIGPIPE, which
    // `set -o pipefail` turns into a failed job on allocations with many nodes.
    o.line(r#"MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"#);
    o.line("MASTER_PORT=$((SLURM_JOB_ID % 4536 + 61000))");
    o.line("export MASTER_ADDR MASTER_PORT");
    o.line(&format!(
        r#"echo "[launcher] {} job $SLURM_JOB_ID restart ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT""#,
        quote(name)
    ));
}

/// Ranks use many threads each: no CPU binding, where the cluster binds at all.
fn cpu_binding(o: &mut Lines) {
    o.line("# Ranks use many threads each: no CPU binding, where the cluster binds at all");
    o.line("# (with TaskPlugin=task/none srun would only warn that it cannot).");
    o.line("cpu_bind=()");
    o.line(r#"case "$(scontrol show config 2>/dev/null | sed -n 's/^TaskPlugin *= *//p')" in"#);
    o.line("  *affinity* | *cgroup*) cpu_bind=(--cpu-bind=none) ;;");
    o.line("esac");
}

/// Runs the step in the foreground and marks the job done.
fn plain_ending(o: &mut Lines, name: &str, cmd: &str, mark_done: Option<&str>) {
    o.line(cmd);
    if let Some(m) = mark_done {
        o.line("# Done: a rerun of `launcher submit` with this same script skips the job.");
        o.line(m);
    }
    o.line(&format!(r#"echo "[launcher] {} finished""#, quote(name)));
}
