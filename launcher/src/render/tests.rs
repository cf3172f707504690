//! Golden tests of the rendered scripts, `bash -n` on each, and a round trip of hostile values
//! through a real bash with stand-ins for `srun` and `scontrol`.
use super::fixtures::{bash_n, example_cluster, example_preamble, StandIns, EXAMPLE_SRUN};
use super::*;
use crate::cluster::Cluster;

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm/example")
}

fn example() -> Rendered {
    let cluster = example_cluster();
    let inputs = Inputs {
        trainer_config: cluster.trainer_config.clone().unwrap(),
        trainer_text: trainer_text(1, "/fsx/scdino"),
        config_from_cli: false,
        out: "/fsx/scdino/jobs".into(),
        cwd: "/fsx/scdino".into(),
        cluster_file: Some("/fsx/scdino/cluster.yaml".into()),
    };
    render(&cluster, &inputs).unwrap()
}

/// The docs name every stage the launcher renders (the one stage list): slurm/README.md's
/// job list and the `stages:` line of cluster.example.yaml.
#[test]
fn docs_list_every_rendered_stage() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let jobs = readme
        .split("\n- ")
        .find(|item| item.starts_with("Jobs"))
        .expect("slurm/README.md has a `- Jobs` item");
    let example_yaml = std::fs::read_to_string(root.join("cluster.example.yaml")).unwrap();
    let stages_line = example_yaml
        .lines()
        .find(|l| l.trim_start().starts_with("# stages:"))
        .expect("cluster.example.yaml documents `stages:`");
    let listed: Vec<&str> = stages_line
        .split('[')
        .nth(1)
        .and_then(|t| t.split(']').next())
        .unwrap()
        .split(',')
        .map(str::trim)
        .collect();
    assert_eq!(listed, scdino_config::PIPELINE_STAGES, "{stages_line}");
    let rendered: Vec<String> = example()
        .manifest
        .jobs
        .iter()
        .map(|j| j.stage.clone())
        .collect();
    for stage in scdino_config::PIPELINE_STAGES {
        assert!(
            rendered.iter().any(|r| r == stage),
            "{stage} is not rendered"
        );
        assert!(
            jobs.contains(&format!("`{stage}`")),
            "slurm/README.md's job list lacks {stage}:\n{jobs}"
        );
    }
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
            "evaluate",
            "umap",
            "attention",
            "profiling",
            "report"
        ]
    );
}

/// The Pyxis training script, exactly. Every flag the reference asks for is here.
#[test]
fn pyxis_training_script_golden() {
    let r = example();
    let text = &r.scripts[1].1;
    let preamble = example_preamble(
        "train-c0",
        "train",
        "# Trainer config sha256 4d6ea0c7a05c96cbe0d9c2e7fb617a7cdbc495dc960af4f9497ba327a949a980 (part of this script, whose hash marks it done).\n",
        "#SBATCH --signal=B:USR1@300\n#SBATCH --requeue\n",
    );
    let want = format!(
        r#"{preamble}# The batch shell gets USR1 (--signal=B:) or TERM and forwards it to the training step;
# the trainer checkpoints at the next step and exits 75.
step=
forward() {{
  echo "[launcher] got SIG$1, forwarding it to the training step"
  if [ -n "$step" ]; then kill -s "$1" "$step" 2>/dev/null || true; fi
}}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
{EXAMPLE_SRUN}train \
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
# Done: a rerun of `launcher submit` with this same script skips the job.
if [ "$rc" -eq 0 ]; then mkdir -p /fsx/scdino/jobs/done && sha256sum < "$0" | cut -d' ' -f1 > /fsx/scdino/jobs/done/train-c0; fi
echo "[launcher] train-c0 finished with exit code $rc"
exit "$rc"
"#
    );
    assert_eq!(text, &want);
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

/// A trainer config with `combinations` channel combinations, its folders under `root`.
fn trainer_text(combinations: usize, root: &str) -> String {
    let combos: Vec<String> = (0..combinations).map(|c| format!("\"{c}\"")).collect();
    format!(
        "run:\n  output_dir: {root}/out\ndata:\n  dataset_dir: {root}/data\n  channel_names: [a, b, c, d, e]\n  channel_combinations: [{}]\n",
        combos.join(", ")
    )
}

fn host_inputs(combinations: usize) -> Inputs {
    Inputs {
        trainer_config: "/shared/cfg.yaml".into(),
        trainer_text: trainer_text(combinations, "/shared"),
        config_from_cli: false,
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
  "${cpu_bind[@]}" \
  /shared/bin/trainer train \
  --config /shared/cfg.yaml \
  --combination 1 \
  --max-steps 10 \
  --threads 2 &
step=$!
# bash runs traps only between commands: wait until the step has really ended.
while kill -0 "$step" 2>/dev/null; do wait "$step" || true; done
rc=0; wait "$step" || rc=$?
# Done: a rerun of `launcher submit` with this same script skips the job.
if [ "$rc" -eq 0 ]; then mkdir -p /shared/jobs/done && sha256sum < "$0" | cut -d' ' -f1 > /shared/jobs/done/train-c1-s2; fi
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
        "srun \\\n  /shared/bin/trainer knn \\\n  --config /shared/cfg.yaml\n# Done: a rerun of `launcher submit` with this same script skips the job.\nmkdir -p /shared/jobs/done && sha256sum < \"$0\" | cut -d' ' -f1 > /shared/jobs/done/knn\necho \"[launcher] knn finished\"\n"
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
    inputs.out = weird.join("jobs");
    let mut r = render(&cluster, &inputs).unwrap();
    let script = r.scripts[0].1.clone();
    let script = &script;
    bash_n(script);

    // Stand-ins: srun records its arguments (NUL-separated) and $WEIRD, then exits 0.
    let env_rec = dir.path().join("srun.env");
    let record_env = format!(
        "printf '%s' \"$WEIRD\" > {}\n",
        crate::shell::quote(env_rec.to_str().unwrap())
    );
    let fake = StandIns::new(
        dir.path(),
        &record_env,
        "task/affinity,task/cgroup",
        &["node-a", "node-b"],
    );
    let out = fake.run(
        script,
        &[
            ("SLURM_JOB_ID", "4600"),
            ("SLURM_JOB_NODELIST", "node-[a-b]"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("master node-a:61064"), "{stdout}");
    // The job marked itself done with its own hash; a fresh render of the same pipeline sees
    // it as finished, and a changed script does not match.
    let marker = weird.join("jobs/done/train-c0");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap().trim(),
        sha256_hex(script.as_bytes())
    );
    mark_finished_earlier(&mut r, &inputs.out);
    assert!(r.manifest.jobs[0].finished_earlier);
    let mut changed = render(&cluster, &{
        let mut i = inputs.clone();
        i.trainer_text.push_str("# edited\n");
        i
    })
    .unwrap();
    mark_finished_earlier(&mut changed, &inputs.out);
    assert!(!changed.manifest.jobs[0].finished_earlier);
    let args = fake.srun_args();
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
        trainer_text: trainer_text(1, "/fsx/project"),
        config_from_cli: false,
        out: "/fsx/project/jobs".into(),
        cwd: "/fsx/project/sub".into(),
        cluster_file: None,
    };
    let r = render(&cluster, &inputs).unwrap();
    let s = &r.scripts[0].1;
    assert!(s.contains("  --container-image=/fsx/img.sqsh \\\n"), "{s}");
    assert!(s.contains("  --container-workdir=/work/sub \\\n"), "{s}");
    // The mount moves the config's folders: the jobs read a copy with container paths.
    assert!(
        s.contains("  --config /work/jobs/trainer-config.container.yaml\n"),
        "{s}"
    );
    let (name, copy) = &r.files[0];
    assert_eq!(name, crate::container_view::CONTAINER_CONFIG);
    assert!(
        copy.contains("/work/data")
            && copy.contains("/work/out")
            && !copy.contains("/fsx/project/data"),
        "{copy}"
    );
    assert!(r.warnings[0].contains("/fsx/project/jobs/trainer-config.container.yaml"));
    assert!(
        r.warnings[1].contains("the image /fsx/img.sqsh does not exist on this host"),
        "{:?}",
        r.warnings
    );
    assert!(
        s.contains("#SBATCH --output=/fsx/project/jobs/logs/mean-std-%j.out\n"),
        "{s}"
    );
    // A cluster without GPUs: Enroot's nvidia hook is switched off (found under real Pyxis:
    // the hook fails on nodes without nvidia-container-cli).
    assert!(s.contains("\nexport NVIDIA_VISIBLE_DEVICES=void\n"), "{s}");
    assert!(
        s.contains("\ncontainer_env=NVIDIA_VISIBLE_DEVICES\n"),
        "{s}"
    );
    assert!(!s.contains("#SBATCH --chdir"), "{s}");
}

#[test]
fn the_trainer_config_is_validated_and_sets_the_training_jobs() {
    let cluster = Cluster::from_yaml(HOST, "c.yaml").unwrap();
    let mut inputs = host_inputs(3);
    let r = render(&cluster, &inputs).unwrap();
    let trains: Vec<&str> = r
        .manifest
        .jobs
        .iter()
        .filter(|j| j.stage == "train")
        .map(|j| j.name.as_str())
        .collect();
    assert_eq!(trains.len(), 3 * cluster.training.segments as usize);
    inputs.trainer_text = "data:\n  channel_names: [a]\n  channel_combinations: [\"07\"]\n".into();
    let e = render(&cluster, &inputs).unwrap_err().to_string();
    assert!(
        e.starts_with("/shared/cfg.yaml:3: `data.channel_combinations"),
        "{e}"
    );
    inputs.trainer_text = "data: [".into();
    assert!(render(&cluster, &inputs).is_err());
}

/// The Pyxis training script run by bash with stand-ins: tunables set in the job's environment
/// (a cluster module's NCCL_* or FI_*) join --container-env so the image's ENV cannot win over
/// them, other variables do not, and without a task plugin that binds, no --cpu-bind is
/// passed (srun would warn that it cannot).
#[test]
fn pyxis_script_passes_job_tunables_and_binds_only_where_the_cluster_can() {
    let text = example().scripts[1].1.clone();
    let dir = tempfile::tempdir().unwrap();
    let run = |task_plugin: &str| -> Vec<String> {
        let fake = StandIns::new(dir.path(), "", task_plugin, &["node-a"]);
        let out = fake.run(
            &text,
            &[
                ("SLURM_JOB_ID", "4600"),
                ("SLURM_JOB_NODELIST", "node-a"),
                ("NCCL_ALGO", "Ring"),
                ("FI_EFA_FORK_SAFE", "1"),
                ("NCCL_DEBUG", "INFO"),
                ("UNRELATED_SETTING", "x"),
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        fake.srun_args()
    };
    let args = run("task/none");
    assert!(
        !args.iter().any(|a| a.starts_with("--cpu-bind")),
        "{args:?}"
    );
    let env = args
        .iter()
        .find_map(|a| a.strip_prefix("--container-env="))
        .unwrap();
    let names: Vec<&str> = env.split(',').collect();
    for want in [
        "NCCL_DEBUG",
        "MASTER_ADDR",
        "AWS_SECRET_ACCESS_KEY",
        "NCCL_ALGO",
        "FI_EFA_FORK_SAFE",
    ] {
        assert_eq!(
            names.iter().filter(|n| **n == want).count(),
            1,
            "{want}: {env}"
        );
    }
    assert!(!names.contains(&"UNRELATED_SETTING"), "{env}");
    let args = run("task/affinity,task/cgroup");
    assert_eq!(args[1], "--cpu-bind=none", "{args:?}");
}

/// A channel-adaptive trainer config (`model.channels: tokens`) trains one model for all its
/// combinations: one training job, whatever the number of combinations.
#[test]
fn an_adaptive_model_is_trained_by_one_job() {
    let cluster = Cluster::from_yaml(HOST, "c.yaml").unwrap();
    let mut inputs = host_inputs(3);
    inputs.trainer_text.push_str("model:\n  channels: tokens\n");
    let r = render(&cluster, &inputs).unwrap();
    let names: Vec<&str> = r.manifest.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(
        names,
        ["mean-std", "train-c0-s1", "train-c0-s2", "knn", "report"],
        "{names:?}"
    );
    let fixed = render(&cluster, &host_inputs(3)).unwrap();
    assert_eq!(
        fixed
            .manifest
            .jobs
            .iter()
            .filter(|j| j.stage == "train")
            .count(),
        6
    );
}
