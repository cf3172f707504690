//! Golden tests of the rendered scripts, `bash -n` on each, and a round trip of hostile values
//! through a real bash with stand-ins for `srun` and `scontrol`.
use super::*;
use crate::cluster::Cluster;
use std::process::Command;

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm/example")
}

fn bash_n(text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("s.sbatch");
    std::fs::write(&f, text).unwrap();
    let out = Command::new("bash").arg("-n").arg(&f).output().unwrap();
    assert!(
        out.status.success(),
        "bash -n: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn example() -> Rendered {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm/cluster.example.yaml");
    let cluster = Cluster::load(&p).unwrap();
    let inputs = Inputs {
        trainer_config: cluster.trainer_config.clone().unwrap(),
        combinations: 1,
        out: "/fsx/scdino/jobs".into(),
        cwd: "/fsx/scdino".into(),
        cluster_file: Some("/fsx/scdino/cluster.yaml".into()),
    };
    render(&cluster, &inputs).unwrap()
}

/// `slurm/example/` is `slurm/cluster.example.yaml` rendered as shipped. Regenerate with
/// `LAUNCHER_BLESS=1 cargo test -p launcher` after a deliberate change, and review the diff.
#[test]
fn shipped_example_matches_slurm_example_folder() {
    let r = example();
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let mut files: Vec<(String, String)> = r.scripts.clone();
    files.push((
        MANIFEST.into(),
        serde_json::to_string_pretty(&r.manifest).unwrap() + "\n",
    ));
    let dir = example_dir();
    if std::env::var_os("LAUNCHER_BLESS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        for (name, text) in &files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    assert_eq!(on_disk, names, "slurm/example/ is stale: LAUNCHER_BLESS=1");
    for (name, text) in &files {
        let want = std::fs::read_to_string(dir.join(name)).unwrap();
        assert_eq!(
            text, &want,
            "slurm/example/{name} differs from the rendering (LAUNCHER_BLESS=1 to update)"
        );
        if name.ends_with(".sbatch") {
            bash_n(text);
        }
    }
    let stages: Vec<&str> = r.manifest.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(
        stages,
        [
            "mean-std",
            "train-c0",
            "features",
            "knn",
            "umap",
            "attention",
            "report"
        ]
    );
}

/// The Pyxis training script, exactly. Every flag the reference asks for is here.
#[test]
fn pyxis_training_script_golden() {
    let r = example();
    let text = &r.scripts[1].1;
    let want = r#"#!/bin/bash
# scDINO pipeline job `train-c0` (stage train), rendered by launcher 0.1.0.
# Re-render rather than edit. Every value is shell-quoted; no secret is written here.
#SBATCH --job-name=scdino-train-c0
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --output=/fsx/scdino/logs/train-c0-%j.out
#SBATCH --open-mode=append
#SBATCH --export=ALL
#SBATCH --kill-on-invalid-dep=yes
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
set -euo pipefail

# Tunables (with Pyxis also listed in --container-env, so they beat the image's ENV).
export FI_EFA_USE_HUGE_PAGE=0
export FI_PROVIDER=efa
export NCCL_DEBUG=WARN
export NCCL_SOCKET_IFNAME='^docker,lo,veth'
# Secrets, by name only: inherited from the environment `launcher submit` ran in: AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN

# Rendezvous: the first node of the allocation, a port derived from the job id.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
MASTER_PORT=$((SLURM_JOB_ID % 4536 + 61000))
export MASTER_ADDR MASTER_PORT
echo "[launcher] train-c0 job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT"

# The batch shell gets USR1 (--signal=B:) or TERM and forwards it to the training step;
# the trainer checkpoints at the next step and exits 75.
step=
forward() {
  echo "[launcher] got SIG$1, forwarding it to the training step"
  if [ -n "$step" ]; then kill -s "$1" "$step" 2>/dev/null || true; fi
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
srun \
  --kill-on-bad-exit=1 \
  --cpu-bind=none \
  '--container-image=123456789012.dkr.ecr.us-east-1.amazonaws.com#scdino:0.1.0' \
  --container-mounts=/fsx:/fsx,/opt/dlami/nvme:/scratch \
  --container-workdir=/fsx/scdino \
  --no-container-mount-home \
  --container-env=FI_EFA_USE_HUGE_PAGE,FI_PROVIDER,NCCL_DEBUG,NCCL_SOCKET_IFNAME,AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,AWS_SESSION_TOKEN,MASTER_ADDR,MASTER_PORT \
  /opt/scdino/bin/trainer train \
  --config /fsx/scdino/configs/pbmc.yaml \
  --combination 0 &
step=$!
# bash runs traps only between commands: wait until the step has really ended.
while kill -0 "$step" 2>/dev/null; do wait "$step" || true; done
rc=0; wait "$step" || rc=$?
if [ "$rc" -eq 75 ]; then
  echo "[launcher] the trainer checkpointed on notice: requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
echo "[launcher] train-c0 finished with exit code $rc"
exit "$rc"
"#;
    assert_eq!(text, want);
}

const HOST: &str = "runtime: host
host:
  trainer: /shared/bin/trainer
workdir: /shared/work
slurm:
  time: \"30\"
  log_dir: /shared/logs
training:
  segments: 2
  requeue: false
  signal_grace_seconds: 60
  max_steps: 10
  threads: 2
stages: [mean-std, train, knn, report]
";

fn host_inputs(combinations: usize) -> Inputs {
    Inputs {
        trainer_config: "/shared/cfg.yaml".into(),
        combinations,
        out: "/shared/jobs".into(),
        cwd: "/elsewhere".into(),
        cluster_file: None,
    }
}

/// Segments chain with afterany, stages with afterok; missing stages are skipped over
/// (knn waits for training when features is not rendered).
#[test]
fn host_runtime_plan_with_segments_and_missing_stages() {
    let cluster = Cluster::from_yaml(HOST, "c.yaml").unwrap();
    let r = render(&cluster, &host_inputs(2)).unwrap();
    let deps: Vec<String> = r
        .manifest
        .jobs
        .iter()
        .map(|j| {
            let after: Vec<String> = j
                .after
                .iter()
                .map(|d| format!("{}:{}", d.kind, d.job))
                .collect();
            format!("{} <- {}", j.name, after.join(" "))
        })
        .collect();
    assert_eq!(
        deps,
        [
            "mean-std <- ",
            "train-c0-s1 <- afterok:mean-std",
            "train-c0-s2 <- afterany:train-c0-s1",
            "train-c1-s1 <- afterok:mean-std",
            "train-c1-s2 <- afterany:train-c1-s1",
            "knn <- afterok:train-c0-s2 afterok:train-c1-s2",
            // attention (not rendered) needs train: report waits for it directly too.
            "report <- afterok:knn afterok:train-c0-s2 afterok:train-c1-s2",
        ]
    );
    let files: Vec<&str> = r.scripts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        files,
        [
            "01-mean-std.sbatch",
            "02-train-c0-s1.sbatch",
            "03-train-c0-s2.sbatch",
            "04-train-c1-s1.sbatch",
            "05-train-c1-s2.sbatch",
            "06-knn.sbatch",
            "07-report.sbatch"
        ]
    );
    let train = &r.scripts[4].1;
    let want_tail = r#"srun \
  --kill-on-bad-exit=1 \
  --cpu-bind=none \
  /shared/bin/trainer train \
  --config /shared/cfg.yaml \
  --combination 1 \
  --max-steps 10 \
  --threads 2 &
step=$!
# bash runs traps only between commands: wait until the step has really ended.
while kill -0 "$step" 2>/dev/null; do wait "$step" || true; done
rc=0; wait "$step" || rc=$?
echo "[launcher] train-c1-s2 finished with exit code $rc"
exit "$rc"
"#;
    assert!(train.ends_with(want_tail), "{train}");
    assert!(train.contains(
        "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=1\n#SBATCH --time=30\n#SBATCH --chdir=/shared/work\n#SBATCH --output=/shared/logs/train-c1-s2-%j.out\n"
    ), "{train}");
    assert!(train.contains("#SBATCH --signal=B:USR1@60\n#SBATCH --no-requeue\n"));
    assert!(!train.contains("container"));
    let knn = &r.scripts[5].1;
    assert!(knn.ends_with(
        "srun \\\n  /shared/bin/trainer knn \\\n  --config /shared/cfg.yaml\necho \"[launcher] knn finished\"\n"
    ), "{knn}");
    for (_, s) in &r.scripts {
        bash_n(s);
    }
}

/// Hostile values survive rendering: a real bash runs the script with stand-ins for srun and
/// scontrol, and srun receives every word exactly.
#[test]
fn hostile_paths_and_values_round_trip_through_bash() {
    let dir = tempfile::tempdir().unwrap();
    let weird = dir
        .path()
        .join("my data/it's \"q\" $HOME `id` $(id) ;&|<>*?");
    std::fs::create_dir_all(&weird).unwrap();
    let cfg = weird.join("conf ig.yaml");
    let trainer = weird.join("bin/trainer x");
    let yaml = format!(
        "runtime: host\nhost:\n  trainer: {t:?}\nworkdir: {w:?}\nslurm:\n  log_dir: {w:?}\nenv:\n  WEIRD: \"a b'c $(touch /tmp/pwned) `x` \\\"d\\\"\"\ntraining:\n  max_steps: 3\nstages: [train]\n",
        t = trainer.to_str().unwrap(),
        w = weird.to_str().unwrap(),
    );
    let cluster = Cluster::from_yaml(&yaml, "c.yaml").unwrap();
    assert_eq!(cluster.env["WEIRD"], "a b'c $(touch /tmp/pwned) `x` \"d\"");
    let mut inputs = host_inputs(1);
    inputs.trainer_config = cfg.clone();
    let r = render(&cluster, &inputs).unwrap();
    let script = &r.scripts[0].1;
    bash_n(script);

    // Stand-ins: srun records its arguments (NUL-separated) and $WEIRD, then exits 0.
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let rec = dir.path().join("srun.args");
    let env_rec = dir.path().join("srun.env");
    let srun = format!(
        "#!/bin/bash\nprintf '%s\\0' \"$@\" > {}\nprintf '%s' \"$WEIRD\" > {}\n",
        crate::shell::quote(rec.to_str().unwrap()),
        crate::shell::quote(env_rec.to_str().unwrap())
    );
    for (name, body) in [
        ("srun", srun.as_str()),
        ("scontrol", "#!/bin/bash\necho node-a\necho node-b\n"),
    ] {
        let p = bin.join(name);
        std::fs::write(&p, body).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let f = dir.path().join("job.sbatch");
    std::fs::write(&f, script).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = Command::new("bash")
        .arg(&f)
        .env("PATH", path)
        .env("SLURM_JOB_ID", "4600")
        .env("SLURM_JOB_NODELIST", "node-[a-b]")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("master node-a:61064"), "{stdout}");
    let args = std::fs::read(&rec).unwrap();
    let args: Vec<String> = args
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8(a.to_vec()).unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "--kill-on-bad-exit=1",
            "--cpu-bind=none",
            trainer.to_str().unwrap(),
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--combination",
            "0",
            "--max-steps",
            "3"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&env_rec).unwrap(),
        "a b'c $(touch /tmp/pwned) `x` \"d\""
    );
    // The #SBATCH lines carry the same values, quoted (sbatch reads quotes there; the real
    // Slurm round trip of --output is in tests/e2e/launcher_cli.rs).
    assert!(script.contains(&format!(
        "#SBATCH --chdir={}\n",
        crate::shell::quote(weird.to_str().unwrap())
    )));
}

#[test]
fn pyxis_paths_go_through_the_mounts() {
    let yaml = "container:\n  image: /fsx/img.sqsh\n  mounts: [\"/fsx/project:/work\"]\nstages: [mean-std]\n";
    let cluster = Cluster::from_yaml(yaml, "c.yaml").unwrap();
    let inputs = Inputs {
        trainer_config: "/fsx/project/cfg/a.yaml".into(),
        combinations: 1,
        out: "/fsx/project/jobs".into(),
        cwd: "/fsx/project/sub".into(),
        cluster_file: None,
    };
    let r = render(&cluster, &inputs).unwrap();
    let s = &r.scripts[0].1;
    assert!(s.contains("  --container-image=/fsx/img.sqsh \\\n"), "{s}");
    assert!(s.contains("  --container-workdir=/work/sub \\\n"), "{s}");
    assert!(s.contains("  --config /work/cfg/a.yaml\n"), "{s}");
    assert!(
        s.contains("#SBATCH --output=/fsx/project/jobs/logs/mean-std-%j.out\n"),
        "{s}"
    );
    assert!(!s.contains("--container-env"), "{s}");
    assert!(!s.contains("#SBATCH --chdir"), "{s}");
}

#[test]
fn trainer_config_combinations() {
    assert_eq!(trainer_combinations("", "x").unwrap(), 6);
    assert_eq!(trainer_combinations("run:\n  name: a\n", "x").unwrap(), 6);
    assert_eq!(
        trainer_combinations(
            "data:\n  channel_combinations: [\"01234\", [0, 1], \"2\"]\n  other: 1\n",
            "x"
        )
        .unwrap(),
        3
    );
    assert!(trainer_combinations("data: [", "x").is_err());
}
