//! The `launcher` binary: rendering as shipped, refusals, and the whole chain, a preemption,
//! the NCCL test and the selftest on a real Slurm (scripts/slurm-local.sh; SLURM_CONF from env).
use super::util::{bin, ok, run, synth, synth_screen, text};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

#[test]
fn launcher_does_not_link_libtorch() {
    let out = Command::new("ldd").arg(bin("launcher")).output().unwrap();
    let libs = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ldd failed");
    // The libraries' names only: a load address can hold "c10" (0x…87c1000).
    let names: Vec<&str> = libs
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.contains("torch") && !n.contains("c10")),
        "{libs}"
    );
    // The trainer, by contrast, resolves libtorch through its embedded rpath.
    let out = Command::new("ldd").arg(bin("trainer")).output().unwrap();
    let libs = String::from_utf8_lossy(&out.stdout);
    assert!(libs.contains("libtorch_cpu.so => /"), "{libs}");
    assert!(!libs.contains("not found"), "{libs}");
}

#[test]
fn launcher_quotes_like_the_generated_scripts() {
    let quoted = ok("launcher", &["quote", "--", "/fsx/my data", "it's", "$X"]);
    assert_eq!(quoted.trim_end(), r"'/fsx/my data' 'it'\''s' '$X'");
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn launcher(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin("launcher"));
    c.args(args);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The shipped example renders into scripts bash accepts, with `/fsx` standing for a folder of
/// this machine; a trainer config outside every container mount is refused.
#[test]
fn shipped_example_renders_and_every_script_parses() {
    let dir = tempfile::tempdir().unwrap();
    let fsx = dir.path().join("fsx");
    let out = fsx.join("scdino/jobs");
    let example = std::fs::read_to_string(repo().join("slurm/cluster.example.yaml")).unwrap();
    let cluster = dir.path().join("cluster.yaml");
    std::fs::write(&cluster, example.replace("/fsx", s(&fsx))).unwrap();
    let config = fsx.join("scdino/configs/pbmc.yaml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::copy(repo().join("configs/demo.yaml"), &config).unwrap();
    let listed = ok(
        "launcher",
        &["render", "--cluster", s(&cluster), "--out", s(&out)],
    );
    let scripts: Vec<&str> = listed.lines().filter(|l| l.ends_with(".sbatch")).collect();
    assert_eq!(scripts.len(), 9, "{listed}");
    for sc in &scripts {
        let o = Command::new("bash").arg("-n").arg(sc).output().unwrap();
        assert!(o.status.success(), "{sc}: {}", text(&o.stderr));
    }
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["runtime"], "pyxis");
    assert_eq!(m["jobs"][1]["after"][0]["job"], "mean-std");
    let train = std::fs::read_to_string(scripts[1]).unwrap();
    let f = s(&fsx);
    for needle in [
        "--container-image=123456789012.dkr.ecr.us-east-1.amazonaws.com#scdino:0.1.0".to_string(),
        format!("--container-mounts={f}:{f},/opt/dlami/nvme:/scratch"),
        format!("--container-workdir={f}/scdino"),
        format!("--config {f}/scdino/configs/pbmc.yaml"),
        "--no-container-mount-home".to_string(),
        "container_env=FI_EFA_USE_HUGE_PAGE,FI_PROVIDER,NCCL_DEBUG,NCCL_SOCKET_IFNAME,AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,AWS_SESSION_TOKEN,MASTER_ADDR,MASTER_PORT".to_string(),
        "#SBATCH --signal=B:USR1@300".to_string(),
        "#SBATCH --requeue".to_string(),
        "#SBATCH --ntasks-per-node=4".to_string(),
        r#"MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"#.to_string(),
    ] {
        assert!(train.contains(&needle), "{needle} missing:\n{train}");
    }

    // The repository's config is outside every mount: the jobs could not read it.
    let outside = repo().join("configs/demo.yaml");
    let o = run(
        "launcher",
        &[
            "render",
            "--cluster",
            s(&cluster),
            "--config",
            s(&outside),
            "--out",
            s(&out),
        ],
    );
    assert!(!o.status.success());
    let e = text(&o.stderr);
    assert!(
        e.contains(&format!(
            "--config {} is not under any container mount",
            outside.display()
        )),
        "{e}"
    );
}

/// A credential written as a value is refused with key and line, and its value is not echoed.
#[test]
fn credentials_in_the_cluster_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c.yaml");
    std::fs::write(
        &c,
        "runtime: host\nhost:\n  trainer: /t\nenv:\n  AWS_SECRET_ACCESS_KEY: wJalrXUtnFEMI-do-not-echo\n",
    )
    .unwrap();
    let cfg = repo().join("configs/demo.yaml");
    let o = run(
        "launcher",
        &[
            "render",
            "--cluster",
            s(&c),
            "--config",
            s(&cfg),
            "--out",
            s(&dir.path().join("o")),
        ],
    );
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains(":5: `env.AWS_SECRET_ACCESS_KEY`") && err.contains("secrets:"),
        "{err}"
    );
    assert!(!err.contains("wJalrXUtnFEMI"), "{err}");
    assert!(!dir.path().join("o").exists());
    // Unknown keys name the key and line too.
    std::fs::write(
        &c,
        "runtime: host\nhost:\n  trainer: /t\nslurm:\n  gpus: 4\n",
    )
    .unwrap();
    let o = run(
        "launcher",
        &[
            "render",
            "--cluster",
            s(&c),
            "--config",
            s(&cfg),
            "--out",
            s(&dir.path().join("o")),
        ],
    );
    let err = text(&o.stderr);
    assert!(
        !o.status.success() && err.contains("gpus") && err.contains("line 5"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Real Slurm (scripts/test.sh starts scripts/slurm-local.sh and exports SLURM_CONF). Without a
// reachable Slurm these tests fail: a test that passes without its component proves nothing.

/// Panics unless `sinfo` answers (the cluster scripts/slurm-local.sh starts).
fn require_slurm() {
    let o = Command::new("sinfo").args(["-h", "-o", "%T"]).output();
    match o {
        Ok(o) if o.status.success() && !text(&o.stdout).trim().is_empty() => {}
        Ok(o) => panic!(
            "no reachable Slurm (SLURM_CONF={:?}; run through scripts/test.sh): {}{}",
            std::env::var("SLURM_CONF").ok(),
            text(&o.stdout),
            text(&o.stderr)
        ),
        Err(e) => panic!("sinfo cannot run (run through scripts/test.sh): {e}"),
    }
}

/// A YAML double-quoted scalar (JSON strings are valid YAML).
fn y(p: &Path) -> String {
    serde_json::to_string(s(p)).unwrap()
}

/// The stages the trainer runs (`trainer pipeline --list-stages`), each checked to be a
/// trainer subcommand. The chain test renders all of them, and the launcher refuses a stage
/// it does not know, so a stage missing on either side fails the test.
fn all_stages() -> Vec<String> {
    let listed = ok("trainer", &["pipeline", "--list-stages"]);
    let stages: Vec<String> = listed.lines().map(|l| l.trim().to_string()).collect();
    assert!(stages.len() >= 8, "{listed}");
    for st in &stages {
        let o = run("trainer", &[st, "--help"]);
        assert!(
            o.status.success(),
            "the trainer has no `{st}` stage: {}",
            text(&o.stderr)
        );
    }
    stages
}

/// A folder with a space, a quote and a `$` in its name: every path of the test lives in it.
fn hostile_dir(root: &Path) -> PathBuf {
    let d = root.join("sp ace'q$x");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn setup(root: &Path, train_extra: &str) -> PathBuf {
    let data = root.join("data");
    synth(&data, 5, 2, 12);
    let cfg = root.join("trainer config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "run:\n  name: slurmrun\n  output_dir: {out}\n  seed: 3\ndata:\n  dataset_dir: {data}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"02\"]\n  num_workers: 1\n  mean_std_fraction: 1.0\nmodel:\n  name: m\n  arch: vit_tiny\n  out_dim: 64\naugment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\ntrain:\n  precision: fp32\n  num_gpus: 1\n  batch_size_per_gpu: 4\n  checkpoint_every: 1\n  warmup_epochs: 0\n{train_extra}",
            out = y(&root.join("out")),
            data = y(&data.join("Training")),
        ),
    )
    .unwrap();
    cfg
}

/// A screen stored as fields of view (`trainer synth --layout fov`: 72 cells in 2 plates, one
/// well per class and plate, class `B` the negative control) and a run config whose
/// `data.screen` names it, in the channels [`setup`]'s model trains on.
fn screen_config(root: &Path) -> PathBuf {
    let data = root.join("screen");
    synth_screen(&data);
    let cfg = root.join("screen config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "data:\n  dataset_dir: {table}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  \
             channel_combinations: [\"02\"]\n  \
             screen:\n    objects: {objects}\n    box_size: 50\n    \
             label_column: Metadata_Treatment\n",
            table = y(&data.join("load_data.csv")),
            objects = y(&data.join("Nuclei.csv")),
        ),
    )
    .unwrap();
    cfg
}

fn cluster_file(root: &Path, stages: &[&str], training: &str) -> PathBuf {
    let c = root.join("cluster.yaml");
    let stages: Vec<String> = stages.iter().map(|x| x.to_string()).collect();
    std::fs::write(
        &c,
        format!(
            "runtime: host\nhost:\n  trainer: {t}\nworkdir: {w}\nslurm:\n  time: \"10\"\n  log_dir: {l}\nenv:\n  OMP_NUM_THREADS: \"1\"\nsecrets: [SCDINO_TEST_TOKEN]\ntraining:\n  threads: 1\n  signal_grace_seconds: 30\n{training}stages: {st}\n",
            t = y(&bin("trainer")),
            w = y(root),
            l = y(&root.join("logs dir")),
            st = serde_json::to_string(&stages).unwrap(),
        ),
    )
    .unwrap();
    c
}

fn status(out: &Path) -> Vec<Value> {
    let o = ok("launcher", &["status", "--out", s(out), "--json"]);
    serde_json::from_str::<Value>(&o)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

const ACTIVE: [&str; 6] = [
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "COMPLETING",
    "CONFIGURING",
    "SUSPENDED",
];

/// Polls until every job has ended; on timeout cancels the pipeline and fails.
fn wait_all(out: &Path, limit: Duration) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let st = status(out);
        if st
            .iter()
            .all(|j| !ACTIVE.contains(&j["state"].as_str().unwrap()))
        {
            return st;
        }
        if t0.elapsed() > limit {
            let _ = launcher(&["cancel", "--out", s(out)], &[]);
            panic!("pipeline did not finish within {limit:?}: {st:#?}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn log_of(job: &Value) -> String {
    std::fs::read_to_string(job["log"].as_str().unwrap()).unwrap_or_default()
}

/// Every file under `dir`, recursively, as lossy text (for secret scans).
fn all_text(dir: &Path) -> String {
    let mut acc = String::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            acc += &all_text(&p);
        } else if !p
            .extension()
            .is_some_and(|x| x == "tiff" || x == "safetensors")
        {
            acc += &String::from_utf8_lossy(&std::fs::read(&p).unwrap());
        }
    }
    acc
}

const SECRET: &str = "sekrit-Value-7d1f0c";

#[test]
fn slurm_chain_runs_every_stage_in_order() {
    require_slurm();
    let tmp = tempfile::tempdir().unwrap();
    let root = hostile_dir(tmp.path());
    let listed = all_stages();
    let stages: Vec<&str> = listed.iter().map(String::as_str).collect();
    // Training runs as 2 srun tasks (2 Gloo ranks meeting on the allocation's first node).
    // The `profiling` job embeds a screen stored as fields of view with the trained model and
    // runs the recipe on it (the model trains on class folders; the screen has their channels).
    let screen = screen_config(&root);
    let cfg = setup(
        &root,
        &format!(
            "  epochs: 2\ndownstream:\n  profiling:\n    enabled: true\n    screen: {}\n    \
             recipe:\n      perturbation: Metadata_Treatment\n      \
             negcon: Metadata_Treatment == B\n      normalize: {{by: []}}\n      \
             map: {{null_size: 200}}\n",
            y(&screen)
        ),
    );
    let cluster = cluster_file(&root, &stages, "  max_steps: 3\n");
    let yaml = std::fs::read_to_string(&cluster).unwrap();
    std::fs::write(
        &cluster,
        yaml.replacen("slurm:\n", "slurm:\n  tasks_per_node: 2\n", 1),
    )
    .unwrap();
    let out = root.join("jobs");
    let o = launcher(
        &[
            "submit",
            "--cluster",
            s(&cluster),
            "--config",
            s(&cfg),
            "--out",
            s(&out),
        ],
        &[("SCDINO_TEST_TOKEN", SECRET)],
    );
    let said = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{said}");
    assert!(said.contains("sbatch --test-only accepted all"), "{said}");
    assert!(
        said.contains(s(&root.join("logs dir"))),
        "log paths are printed: {said}"
    );

    let st = wait_all(&out, Duration::from_secs(300));
    let names: Vec<&str> = st.iter().map(|j| j["name"].as_str().unwrap()).collect();
    let mut want: Vec<&str> = stages.clone();
    for n in want.iter_mut() {
        if *n == "train" {
            *n = "train-c0";
        }
    }
    assert_eq!(names, want);
    for j in &st {
        assert_eq!(j["state"], "COMPLETED", "{j:#}\n{}", log_of(j));
        assert_eq!(j["exit_code"], "0:0", "{j:#}");
        // The job wrote its log where the manifest says, through a path with ' and $ and a space.
        let log = log_of(j);
        assert!(
            log.contains(&format!("[launcher] {} job", j["name"].as_str().unwrap())),
            "{log}"
        );
    }
    // In dependency order: each job started after every job it depends on ended (1-second
    // resolution; attention needs only training, so it may overlap features/knn/umap).
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let by_name = |n: &str| st.iter().find(|j| j["name"] == n).unwrap();
    let mut checked = 0;
    for job in manifest["jobs"].as_array().unwrap() {
        let me = by_name(job["name"].as_str().unwrap());
        for dep in job["after"].as_array().unwrap() {
            let d = by_name(dep["job"].as_str().unwrap());
            assert!(
                me["start_time"].as_str().unwrap() >= d["end_time"].as_str().unwrap(),
                "{me:#} started before its dependency {d:#} ended"
            );
            checked += 1;
        }
    }
    assert!(checked >= stages.len() - 1, "{manifest:#}");
    // Outputs.
    let run_dir = root.join("out/slurmrun");
    assert!(run_dir.join("mean_and_std_of_dataset.txt").exists());
    let model = run_dir.join("scDINO_ViTs/m_channel_APC_DAPI");
    assert!(model.join("checkpoint.safetensors").exists());
    let train_log = log_of(&st[names.iter().position(|n| *n == "train-c0").unwrap()]);
    assert!(train_log.contains("step limit reached"), "{train_log}");
    assert!(
        train_log.contains("distributed: 2 ranks ("),
        "training ran as 2 ranks: {train_log}"
    );
    // Every analysis stage wrote its outputs (the files each stage's successor reads).
    let analyses = run_dir.join("m_channel_APC_DAPI_analyses");
    let has = |dir: &str, suffix: &str| {
        std::fs::read_dir(analyses.join(dir))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().ends_with(suffix))
            })
            .unwrap_or(false)
    };
    let want_files = [
        ("features", "CLS_features", "_features.safetensors"),
        ("knn", "kNN", "_knn_metrics.json"),
        ("umap", "embedding_plots", "_umap.png"),
    ];
    for (stage, dir, suffix) in want_files {
        assert!(has(dir, suffix), "{stage} wrote no {dir}/*{suffix}");
    }
    let any_manifest = std::fs::read_dir(analyses.join("attention_images"))
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.path().join("attention_images.json").is_file());
    assert!(any_manifest, "attention wrote no attention_images.json");
    // The profiling job embedded every cell of the screen and ran the recipe on them; the
    // report job, which ran after it, shows its scores.
    let profiled: Vec<PathBuf> = std::fs::read_dir(analyses.join("profiling"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(profiled.len(), 1, "one checkpoint profiled: {profiled:?}");
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(profiled[0].join("profile/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["cells_rows"], 72, "{summary:#}");
    let replicate = summary["replicate"]["map"]["mean_map"].as_f64().unwrap();
    assert!(replicate > 0.0 && replicate <= 1.0, "{summary:#}");
    assert!(profiled[0].join("profiling.json").is_file());
    let profiling_log = log_of(by_name("profiling"));
    assert!(
        profiling_log.contains("embed: 72/72 images"),
        "{profiling_log}"
    );
    let html = std::fs::read_to_string(analyses.join("report.html")).unwrap();
    assert!(
        html.contains("data:image/png;base64,"),
        "report has no images"
    );
    assert!(
        html.contains("<h2>Profiling a screen")
            && html.contains(&format!("<td>{replicate:.3}</td>")),
        "the report shows the profiling job's replicate mAP {replicate}"
    );
    // The secret reached no script, manifest, log or launcher output (it travels by name).
    assert!(!said.contains(SECRET));
    let everything = all_text(&root);
    assert!(!everything.contains(SECRET), "the secret value leaked");
    assert!(
        everything.contains("SCDINO_TEST_TOKEN"),
        "the secret's name is in the scripts"
    );
    // A second submit into the same folder is fine once everything has ended; status works.
    let table = ok("launcher", &["status", "--out", s(&out)]);
    assert!(table.contains("COMPLETED"), "{table}");
    // A Slurm client that cannot configure itself is an error with Slurm's own words, never
    // a table of UNKNOWN jobs. (An empty slurm.conf fails at once; a missing one makes the
    // client retry for a minute, and an unset SLURM_CONF makes it ask DNS.)
    let broken = root.join("empty-slurm.conf");
    std::fs::write(&broken, "").unwrap();
    for args in [
        vec!["status", "--out", s(&out)],
        vec!["status", "--out", s(&out), "--json"],
    ] {
        let o = launcher(&args, &[("SLURM_CONF", s(&broken))]);
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        assert!(
            !o.status.success(),
            "{args:?} exited 0:\n{stdout}\n{stderr}"
        );
        assert!(!stdout.contains("UNKNOWN"), "{stdout}");
        assert!(stderr.contains("scontrol show job -o"), "{stderr}");
        assert!(
            stderr.contains("Unable to process configuration file"),
            "{stderr}"
        );
        assert!(stderr.contains("set SLURM_CONF"), "{stderr}");
    }
    // Every job marked itself done: the same submission again submits nothing.
    let again = || {
        launcher(
            &[
                "submit",
                "--cluster",
                s(&cluster),
                "--config",
                s(&cfg),
                "--out",
                s(&out),
            ],
            &[("SCDINO_TEST_TOKEN", SECRET)],
        )
    };
    let o = again();
    let said = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{said}");
    assert!(
        said.contains("nothing to submit: every job finished earlier"),
        "{said}"
    );
    let table = ok("launcher", &["status", "--out", s(&out)]);
    assert_eq!(
        table.matches("FINISHED_EARLIER").count(),
        stages.len(),
        "{table}"
    );
    // A changed trainer config is a new pipeline: everything is submitted again.
    let mut text_cfg = std::fs::read_to_string(&cfg).unwrap();
    text_cfg.push_str("# changed\n");
    std::fs::write(&cfg, text_cfg).unwrap();
    let o = again();
    let said = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{said}");
    assert!(
        said.contains(&format!("submitted {} jobs", stages.len())),
        "{said}"
    );
    let _ = launcher(&["cancel", "--out", s(&out)], &[]);
}

#[test]
fn slurm_preemption_checkpoints_requeues_and_resumes() {
    preempt_requeue_resume(1);
}

/// The notice reaches a step of two Gloo ranks (srun forwards it to both tasks): they agree on
/// one step to stop at, rank 0 checkpoints, both exit 75, and the requeued job's two ranks
/// resume from that checkpoint.
#[test]
fn slurm_preemption_of_two_ranks_stops_both_and_resumes_both() {
    preempt_requeue_resume(2);
}

/// Trains under the real Slurm with `tasks` ranks, sends the batch shell SIGUSR1 after the
/// first epoch's checkpoint, and checks the job checkpointed, was requeued once and finished
/// every epoch exactly once.
fn preempt_requeue_resume(tasks: usize) {
    require_slurm();
    let tmp = tempfile::tempdir().unwrap();
    let root = hostile_dir(tmp.path());
    let epochs = 6;
    let cfg = setup(&root, &format!("  epochs: {epochs}\n"));
    let cluster = cluster_file(&root, &["train"], "");
    let yaml = std::fs::read_to_string(&cluster).unwrap();
    std::fs::write(
        &cluster,
        yaml.replacen(
            "slurm:\n",
            &format!("slurm:\n  tasks_per_node: {tasks}\n"),
            1,
        ),
    )
    .unwrap();
    let out = root.join("jobs");
    let o = launcher(
        &[
            "submit",
            "--cluster",
            s(&cluster),
            "--config",
            s(&cfg),
            "--out",
            s(&out),
        ],
        &[],
    );
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    let model = root.join("out/slurmrun/scDINO_ViTs/m_channel_APC_DAPI");
    // Wait for the first epoch's checkpoint, then deliver the notice to the batch shell as
    // Slurm's --signal=B:USR1 would.
    let t0 = Instant::now();
    while !model.join("checkpoint0000.safetensors").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "training did not start: {:#?}",
            status(&out)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let id = status(&out)[0]["job_id"].as_str().unwrap().to_string();
    let sc = Command::new("scancel")
        .args(["--signal=USR1", "--batch", &id])
        .output()
        .unwrap();
    assert!(sc.status.success(), "{}", text(&sc.stderr));

    let st = wait_all(&out, Duration::from_secs(400));
    let job = &st[0];
    let log = log_of(job);
    assert_eq!(job["state"], "COMPLETED", "{job:#}\n{log}");
    assert_eq!(job["restarts"], 1, "{job:#}\n{log}");
    for needle in [
        "got SIGUSR1, forwarding it to the training step",
        "checkpoint written at epoch",
        "stopped by signal (a run that had started wrote a checkpoint first)",
        "requeueing job",
        "restart 1 on",
        "resuming from",
        "training finished",
        "train-c0 finished with exit code 0",
    ] {
        assert!(
            log.contains(needle),
            "{needle:?} missing from the log:\n{log}"
        );
    }
    if tasks > 1 {
        // Both runs, the stopped one and the resumed one, were `tasks` ranks.
        let runs = log
            .matches(&format!("distributed: {tasks} ranks ("))
            .count();
        assert_eq!(runs, 2, "{log}");
    }
    // Every epoch logged exactly once: the resumed run continued, it did not start over.
    let epochs_logged = super::util::logged_epochs(&model.join("log.txt"));
    assert_eq!(epochs_logged, (0..epochs).collect::<Vec<u64>>(), "{log}");
}

/// `launcher nccl-test` on the real Slurm: one job of two tasks (Gloo, chosen automatically
/// without CUDA) meets at the rendezvous the script derives, and the launcher's verdict follows
/// the gate: a low one passes, an impossible one fails with a non-zero exit.
#[test]
fn slurm_nccl_test_passes_a_low_gate_and_fails_an_impossible_one() {
    require_slurm();
    let tmp = tempfile::tempdir().unwrap();
    let root = hostile_dir(tmp.path());
    let cluster = cluster_file(&root, &["train"], "");
    let nccl_test = |out: &str, op: &str, gate: &str| {
        launcher(
            &[
                "nccl-test",
                "--cluster",
                s(&cluster),
                "--out",
                s(&root.join(out)),
                "--tasks-per-node",
                "2",
                "--op",
                op,
                "--min-bytes",
                "4K",
                "--max-bytes",
                "64K",
                "--factor",
                "4",
                "--iters",
                "3",
                "--warmup",
                "1",
                "--min-busbw",
                gate,
                "--wait-timeout",
                "240",
            ],
            &[],
        )
    };
    let o = nccl_test("low gate", "all", "0.000001");
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("nccl-test PASSED: 2 ranks, backend gloo, gate 0.000001 GB/s"),
        "{stdout}"
    );
    for op in ["all_reduce", "all_gather", "reduce_scatter", "broadcast"] {
        assert!(
            stdout.contains(&format!("{op:<15} average busbw")),
            "{op}: {stdout}"
        );
    }
    let st = status(&root.join("low gate"));
    assert_eq!(st.len(), 1);
    assert_eq!(st[0]["state"], "COMPLETED", "{:#}", st[0]);
    let log = log_of(&st[0]);
    assert!(log.contains("2 ranks (Slurm variables)"), "{log}");
    assert!(log.contains("# Out of bounds values : 0 OK"), "{log}");

    let o = nccl_test("impossible gate", "all_reduce", "1e9");
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(!o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("nccl-test FAILED")
            && stderr.contains("all_reduce: average busbw")
            && stderr.contains("below the gate 1000000000 GB/s"),
        "{stderr}"
    );
    let st = status(&root.join("impossible gate"));
    assert_eq!(st[0]["state"], "FAILED", "{:#}\n{}", st[0], log_of(&st[0]));
}

/// `launcher selftest` on 2 tasks of the real Slurm: every task reports, the all-reduce across
/// both passes element by element, the GPU checks are skipped on this CPU machine, and one
/// table comes back.
#[test]
fn slurm_selftest_runs_on_every_task_and_reports_one_table() {
    require_slurm();
    let tmp = tempfile::tempdir().unwrap();
    let root = hostile_dir(tmp.path());
    let cluster = cluster_file(&root, &["train"], "");
    let o = launcher(
        &[
            "selftest",
            "--cluster",
            s(&cluster),
            "--out",
            s(&root.join("selftest")),
            "--tasks-per-node",
            "2",
            "--wait-timeout",
            "240",
        ],
        &[],
    );
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("selftest PASSED on 2 tasks"), "{stdout}");
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row: {stdout}"))
            .to_string()
    };
    let all_reduce = line("all-reduce");
    assert!(
        all_reduce.contains("pass pass")
            && all_reduce.contains("Gloo over 2 ranks")
            && all_reduce.contains(" 0 wrong"),
        "{all_reduce}"
    );
    assert!(line("train step cpu").contains("pass pass"), "{stdout}");
    assert!(
        line("train step gpu fp32").contains("skip skip"),
        "{stdout}"
    );
    let sdpa = line("sdpa backend");
    assert!(
        sdpa.contains("pass pass") && sdpa.contains("Cpu: fp32 "),
        "{sdpa}"
    );
}

/// `launcher scaling` with 1 and 2 tasks on the real Slurm (Gloo): both sizes train from
/// scratch one after the other, and the report (Markdown, JSON, PNG) holds both rows with the
/// global batch and lr the trainer used and efficiency 1 for the smallest size.
#[test]
fn slurm_scaling_measures_one_and_two_tasks_and_writes_the_report() {
    require_slurm();
    let tmp = tempfile::tempdir().unwrap();
    let root = hostile_dir(tmp.path());
    let cfg = setup(&root, "  epochs: 10\n");
    let cluster = cluster_file(&root, &["train"], "");
    let out = root.join("scaling");
    let o = launcher(
        &[
            "scaling",
            "--cluster",
            s(&cluster),
            "--config",
            s(&cfg),
            "--out",
            s(&out),
            "--nodes",
            "1",
            "--tasks-per-node",
            "1,2",
            "--steps",
            "6",
            "--wait-timeout",
            "300",
        ],
        &[],
    );
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("scaling.json")).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{report:#}");
    assert_eq!(rows[0]["tasks"], 1);
    assert_eq!(rows[1]["tasks"], 2);
    assert_eq!(rows[0]["global_batch"], 4);
    assert_eq!(rows[1]["global_batch"], 8);
    // The trainer's linear rule: lr 0.0005 per 256 images (scDINO's default) x global batch.
    let lr = |r: &Value| r["peak_lr"].as_f64().unwrap();
    assert!(
        (lr(&rows[1]) / lr(&rows[0]) - 2.0).abs() < 1e-9,
        "{report:#}"
    );
    assert_eq!(rows[0]["scaling_efficiency"], 1.0);
    for r in rows {
        assert!(r["images_per_second"].as_f64().unwrap() > 0.0, "{r:#}");
        assert_eq!(r["timed_steps"], 4, "{r:#}");
        let e = r["scaling_efficiency"].as_f64().unwrap();
        assert!(e > 0.0 && e < 2.5, "{r:#}");
    }
    let md = std::fs::read_to_string(out.join("scaling.md")).unwrap();
    assert!(
        md.contains("| nodes | tasks/node | tasks | global batch |"),
        "{md}"
    );
    assert!(stdout.contains("| 1 | 2 | 2 | 8 |"), "{stdout}");
    // training.threads of the cluster file reaches every size, as in the pipeline.
    let script = std::fs::read_to_string(out.join("02-scaling-1x2.sbatch")).unwrap();
    assert!(
        script.contains("  --max-steps 6 \\\n  --threads 1\n"),
        "{script}"
    );
    let png = std::fs::read(out.join("scaling.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // Each size trained from scratch in its own folder (the 2-task run did not resume the other).
    for size in ["scaling-1x1", "scaling-1x2"] {
        let log: String = std::fs::read_dir(root.join("logs dir"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(size))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect();
        assert!(!log.contains("resuming from"), "{size}: {log}");
        assert!(out.join("runs").join(size).is_dir(), "{size}");
    }
}

/// A stand-in for the trainer on the cluster's `host.trainer`: every call records its words
/// (NUL-separated) as `calls/JOB.TASK.ID.args` (TASK: the array index, else `r` + the rank;
/// ID: the array's job id, else the job's), its rank, world and rendezvous host as `.env`, and
/// the calls recorded before it as `.seen`.
fn recording_trainer(root: &Path) -> PathBuf {
    let p = root.join("trainer stand-in");
    std::fs::create_dir_all(root.join("calls")).unwrap();
    std::fs::write(
        &p,
        r#"#!/bin/bash
set -euo pipefail
d="$(dirname "$0")/calls"
f="$d/${SLURM_JOB_NAME#scdino-}.${SLURM_ARRAY_TASK_ID:-r$SLURM_PROCID}.${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"
ls "$d" > "$f.seen"
printf '%s\0' "$@" > "$f.args"
echo "$SLURM_PROCID $SLURM_NTASKS ${MASTER_ADDR:-}" > "$f.env"
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// One call the stand-in recorded.
#[derive(Debug)]
struct Call {
    /// `JOB.TASK.ID`.
    stem: String,
    words: Vec<String>,
    /// `RANK WORLD MASTER_ADDR`.
    env: String,
    /// The calls recorded before it.
    seen: String,
}

/// The calls the stand-in recorded, by file stem.
fn recorded_calls(root: &Path) -> Vec<Call> {
    let d = root.join("calls");
    let mut stems: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(".args").map(str::to_string))
        .collect();
    stems.sort();
    let read = |stem: &str, ext: &str| std::fs::read_to_string(d.join(format!("{stem}.{ext}")));
    stems
        .into_iter()
        .map(|stem| {
            let words = read(&stem, "args")
                .unwrap()
                .split('\0')
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect();
            let env = read(&stem, "env").unwrap().trim().to_string();
            let seen = read(&stem, "seen").unwrap();
            Call {
                stem,
                words,
                env,
                seen,
            }
        })
        .collect()
}

/// `launcher embed` on the real Slurm in both layouts, through paths with a space, a quote and
/// a `$`: `--array 3` submits a job array whose task i runs `embed … --shard-index i
/// --shard-count 3` and a merge job that starts only after all of them (`embed … --merge`);
/// the one-job layout runs 2 ranks with Slurm's rank variables and the rendezvous. Submitting
/// the same command again (the resume) is accepted once the jobs ended and runs the same
/// scripts again. The trainer is a stand-in that records its calls: this checks what the
/// launcher renders and submits; the real `trainer embed` runs under Slurm in
/// `slurm_embedding_with_the_real_trainer_equals_one_process`.
#[test]
fn slurm_embedding_array_merges_after_every_shard_and_ranks_run_as_one_job() {
    require_slurm();
    let tmp = tempfile::tempdir().unwrap();
    let root = hostile_dir(tmp.path());
    let cluster = cluster_file(&root, &["train"], "");
    let yaml = std::fs::read_to_string(&cluster).unwrap();
    let stand_in = recording_trainer(&root);
    std::fs::write(&cluster, yaml.replace(&y(&bin("trainer")), &y(&stand_in))).unwrap();
    std::fs::create_dir_all(root.join("images")).unwrap();
    std::fs::write(root.join("ck.safetensors"), b"").unwrap();
    let table = root.join("emb/screen.parquet");
    let (checkpoint, images) = (root.join("ck.safetensors"), root.join("images"));
    let embed = |out: &str, layout: &[&str]| {
        let out = root.join(out);
        let mut args = vec![
            "embed",
            "--cluster",
            s(&cluster),
            "--out",
            s(&out),
            "--checkpoint",
            s(&checkpoint),
            "--images",
            s(&images),
            "--embeddings",
            s(&table),
            "--path-pattern",
            "{Plate}/{Well}_{Cell}.tiff",
        ];
        args.extend(layout);
        let o = launcher(&args, &[("SCDINO_TEST_TOKEN", SECRET)]);
        let said = format!("{}{}", text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{said}");
        said
    };
    let said = embed("array", &["--array", "3", "--array-limit", "2"]);
    assert!(
        said.contains("sbatch --test-only accepted all 2 jobs"),
        "{said}"
    );
    let said = embed("ranks", &["--tasks-per-node", "2"]);
    assert!(
        said.contains("sbatch --test-only accepted all 1 jobs"),
        "{said}"
    );
    for out in ["array", "ranks"] {
        for j in wait_all(&root.join(out), Duration::from_secs(120)) {
            assert_eq!(j["state"], "COMPLETED", "{j:#}\n{}", log_of(&j));
        }
    }
    let common: Vec<String> = [
        "embed",
        "--checkpoint",
        s(&checkpoint),
        "--images",
        s(&images),
        "--out",
        s(&table),
        "--path-pattern",
        "{Plate}/{Well}_{Cell}.tiff",
    ]
    .iter()
    .map(|w| w.to_string())
    .collect();
    let with = |extra: &[&str]| -> Vec<String> {
        common
            .iter()
            .cloned()
            .chain(extra.iter().map(|w| w.to_string()))
            .collect()
    };
    // The shards' calls carry the array's job id, the merge's its own.
    let check_array_round = |calls: &[Call], ids: &[String]| {
        let of = |job: &str, id: &str| -> Vec<&Call> {
            calls
                .iter()
                .filter(|c| {
                    c.stem.starts_with(&format!("{job}.")) && c.stem.ends_with(&format!(".{id}"))
                })
                .collect()
        };
        let shards = of("embed-shards", &ids[0]);
        assert_eq!(shards.len(), 3, "{calls:#?}");
        for (i, c) in shards.iter().enumerate() {
            let i = i.to_string();
            assert_eq!(c.stem, format!("embed-shards.{i}.{}", ids[0]));
            assert_eq!(c.words, with(&["--shard-count", "3", "--shard-index", &i]));
            assert_eq!(c.env, "0 1", "one task per array job: {c:?}");
        }
        let merge = of("embed-merge", &ids[1]);
        assert_eq!(merge.len(), 1, "{calls:#?}");
        assert_eq!(merge[0].words, with(&["--merge"]));
        for c in &shards {
            assert!(
                merge[0].seen.contains(&format!("{}.args", c.stem)),
                "merge ran before {}: {}",
                c.stem,
                merge[0].seen
            );
        }
    };
    let calls = recorded_calls(&root);
    let ids = |out: &str| -> Vec<String> {
        status(&root.join(out))
            .iter()
            .map(|j| j["job_id"].as_str().unwrap().to_string())
            .collect()
    };
    let first_ids = ids("array");
    check_array_round(&calls, &first_ids);
    let ranks: Vec<_> = calls
        .iter()
        .filter(|c| c.stem.starts_with("embed."))
        .collect();
    assert_eq!(ranks.len(), 2, "{calls:#?}");
    for (rank, c) in ranks.iter().enumerate() {
        assert_eq!(c.words, with(&[]));
        assert_eq!(c.env, format!("{rank} 2 localhost"), "{c:?}");
    }
    // Resume: the same command again, once the jobs ended, runs the same scripts again (the
    // trainer keeps the parts that finished).
    let first = std::fs::read_to_string(root.join("array/01-embed-shards.sbatch")).unwrap();
    embed("array", &["--array", "3", "--array-limit", "2"]);
    let again = std::fs::read_to_string(root.join("array/01-embed-shards.sbatch")).unwrap();
    assert_eq!(first, again);
    for j in wait_all(&root.join("array"), Duration::from_secs(120)) {
        assert_eq!(j["state"], "COMPLETED", "{j:#}\n{}", log_of(&j));
    }
    let second_ids = ids("array");
    assert_ne!(second_ids, first_ids);
    check_array_round(&recorded_calls(&root), &second_ids);
    let second_id = &second_ids[0];
    // Array logs land per task (`%A_%a`), and the secret travelled by name only.
    let logs: Vec<String> = std::fs::read_dir(root.join("logs dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for i in 0..3 {
        assert!(
            logs.contains(&format!("embed-shards-{second_id}_{i}.out")),
            "{logs:?}"
        );
    }
    assert!(!all_text(&root).contains(SECRET), "the secret value leaked");
}

/// `launcher embed` running the real `trainer embed` on the real Slurm, through paths with a
/// space, a quote and a `$`: a checkpoint of one training step embeds the 24 images of a
/// synthetic dataset as one job of 2 ranks, and as a job array of 3 shards and its merge job;
/// both tables are byte for byte the table one `trainer embed` process writes on this machine
/// (same rows, same order, same features, same key-value metadata).
#[test]
fn slurm_embedding_with_the_real_trainer_equals_one_process() {
    require_slurm();
    let tmp = tempfile::tempdir().unwrap();
    let root = hostile_dir(tmp.path());
    let cfg = setup(&root, "  epochs: 1\n");
    ok(
        "trainer",
        &[
            "train",
            "--config",
            s(&cfg),
            "--max-steps",
            "1",
            "--threads",
            "1",
        ],
    );
    let checkpoint =
        root.join("out/slurmrun/scDINO_ViTs/m_channel_APC_DAPI/checkpoint.safetensors");
    let images = root.join("data/Training");
    let pattern = "{Class}/{Cell}.tiff";
    let table = |name: &str| root.join(format!("tables/{name}.parquet"));
    let single = ok(
        "trainer",
        &[
            "embed",
            "--checkpoint",
            s(&checkpoint),
            "--images",
            s(&images),
            "--path-pattern",
            pattern,
            "--out",
            s(&table("single")),
        ],
    );
    assert!(single.contains("24 rows ->"), "{single}");
    let cluster = cluster_file(&root, &["train"], "");
    let submit = |name: &str, layout: &[&str]| {
        let out = root.join(format!("jobs {name}"));
        let mut args = vec![
            "embed",
            "--cluster",
            s(&cluster),
            "--checkpoint",
            s(&checkpoint),
            "--images",
            s(&images),
            "--path-pattern",
            pattern,
        ];
        let embeddings = table(name);
        args.extend(["--out", s(&out), "--embeddings", s(&embeddings)]);
        args.extend(layout);
        let o = launcher(&args, &[]);
        assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
        out
    };
    let jobs = [
        submit("ranks", &["--tasks-per-node", "2"]),
        submit("array", &["--array", "3", "--array-limit", "2"]),
    ];
    for out in &jobs {
        let ended = wait_all(out, Duration::from_secs(120));
        assert!(!ended.is_empty());
        for j in ended {
            assert_eq!(j["state"], "COMPLETED", "{j:#}\n{}", log_of(&j));
        }
    }
    let want = std::fs::read(table("single")).unwrap();
    for name in ["ranks", "array"] {
        let got = std::fs::read(table(name)).unwrap();
        assert!(
            got == want,
            "the {name} table differs from the single-process table"
        );
    }
}

/// The image bakes in no tunable (they would beat `--container-env` under Pyxis), sets the
/// NVIDIA runtime variables, installs EFA user space only, and builds the NCCL trainer.
#[test]
fn containerfile_keeps_tunables_out_and_ships_efa_and_nccl() {
    let text = std::fs::read_to_string(repo().join("Containerfile")).unwrap();
    let mut in_env = false;
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with("ENV ") {
            in_env = true;
        } else if !line.starts_with(' ') {
            in_env = false;
        }
        if in_env {
            for bad in ["NCCL_", "FI_", "OMP_NUM_THREADS"] {
                assert!(!l.contains(bad), "tunable baked into the image: {line}");
            }
        }
    }
    assert!(text.contains("NVIDIA_VISIBLE_DEVICES=all"));
    assert!(text.contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility"));
    assert!(text.contains("efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify"));
    assert!(text.contains("--features nccl"));
    assert!(text.contains("/opt/amazon/ofi-nccl/lib"));
}
