//! The rendered nccl-test script (golden, `bash -n`, a run with stand-ins for srun and
//! scontrol) and the verdict read back from a job log.
use super::*;
use crate::render::fixtures::{bash_n, example_cluster, example_preamble, StandIns, EXAMPLE_SRUN};

fn opts() -> Options {
    Options {
        nodes: None,
        tasks_per_node: None,
        op: "all_reduce".into(),
        min_bytes: "64M".into(),
        max_bytes: "1G".into(),
        factor: 4,
        iters: 20,
        warmup: 5,
        min_busbw: Some(40.0),
        backend: None,
    }
}

/// The Pyxis script for the shipped example: the training job's allocation, srun flags,
/// container options and rendezvous, with collectives-bench instead of train, not preemptible.
#[test]
fn pyxis_nccl_test_script_golden() {
    let r = render(
        &example_cluster(),
        &opts(),
        Path::new("/fsx/scdino/nccl"),
        Path::new("/fsx/scdino"),
    )
    .unwrap();
    assert_eq!(r.scripts.len(), 1);
    let (name, text) = &r.scripts[0];
    assert_eq!(name, "nccl-test.sbatch");
    let want = format!(
        "{}{EXAMPLE_SRUN}collectives-bench \\
  --op all_reduce \\
  --min-bytes 64M \\
  --max-bytes 1G \\
  --factor 4 \\
  --iters 20 \\
  --warmup 5 \\
  --min-busbw 40 \\
  --json -
echo \"[launcher] nccl-test finished\"
",
        example_preamble("nccl-test", "nccl-test", "", "")
    );
    assert_eq!(text, &want);
    bash_n(text);
    let m = &r.manifest;
    assert_eq!(m.jobs.len(), 1);
    assert_eq!(
        m.jobs[0].log,
        Path::new("/fsx/scdino/logs/nccl-test-%j.out")
    );
    assert_eq!(m.trainer_config, None);
}

/// Host runtime with overrides: the allocation follows --nodes/--tasks-per-node, the backend
/// is passed on, and srun receives every word exactly (stand-ins for srun and scontrol).
#[test]
fn host_nccl_test_script_runs_with_the_allocation_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let trainer = dir.path().join("bin dir/trainer");
    let yaml = format!(
        "runtime: host\nhost:\n  trainer: {t:?}\nworkdir: /w\nslurm:\n  nodes: 4\n",
        t = trainer.to_str().unwrap()
    );
    let cluster = Cluster::from_yaml(&yaml, "c.yaml").unwrap();
    let mut o = opts();
    o.nodes = Some(1);
    o.tasks_per_node = Some(2);
    o.min_busbw = None;
    o.backend = Some("gloo".into());
    o.op = "all".into();
    let r = render(&cluster, &o, &dir.path().join("out"), Path::new("/cwd")).unwrap();
    let script = &r.scripts[0].1;
    bash_n(script);
    assert!(
        script.contains(
            "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n"
        ),
        "{script}"
    );
    assert!(!script.contains("gpus-per-node"), "{script}");
    assert!(
        !script.contains("--signal") && !script.contains("requeue"),
        "{script}"
    );
    assert!(!script.contains("--min-busbw"), "{script}");

    let fake = StandIns::new(&dir.path().join("fake"), "", "task/affinity", &["n1"]);
    let out = fake.run(
        script,
        &[("SLURM_JOB_ID", "7"), ("SLURM_JOB_NODELIST", "n1")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("master n1:61007"));
    let args = fake.srun_args();
    let want: Vec<&str> = vec![
        "--kill-on-bad-exit=1",
        "--cpu-bind=none",
        trainer.to_str().unwrap(),
        "collectives-bench",
        "--op",
        "all",
        "--min-bytes",
        "64M",
        "--max-bytes",
        "1G",
        "--factor",
        "4",
        "--iters",
        "20",
        "--warmup",
        "5",
        "--backend",
        "gloo",
        "--json",
        "-",
    ];
    assert_eq!(args, want);
}

const LOG: &str = r#"[launcher] nccl-test job 12 restart 0 on n1, master n1:61012
collectives-bench: 2 ranks (Slurm variables), master n1:61012, backend gloo
# collectives-bench: backend gloo, 2 ranks, float32, 3 timed iterations after 1 warm-up
{"not": "a report"}
{"kind":"scdino.collectives_bench","backend":"gloo","world":2,"dtype":"float32","iters":3,"warmup":1,"gate":"average busbw over the sizes, per op","min_busbw_gbps":null,"ops":[{"op":"all_reduce","bus_factor":1.0,"sizes":[{"size_bytes":4096,"count":1024,"time_us":100.0,"algbw_gbps":0.04096,"busbw_gbps":0.04096,"wrong":0},{"size_bytes":8192,"count":2048,"time_us":100.0,"algbw_gbps":0.08192,"busbw_gbps":0.08192,"wrong":0}],"avg_busbw_gbps":0.06144}],"wrong":0,"passed":true,"failures":[]}
[launcher] nccl-test finished
"#;

#[test]
fn the_verdict_comes_from_the_report_in_the_log() {
    let r = find_report(LOG).unwrap();
    assert_eq!((r.world, r.backend.as_str(), r.ops.len()), (2, "gloo", 1));
    assert!(judge(&r, 2, None).is_empty());
    assert!(judge(&r, 2, Some(0.06)).is_empty());
    let slow = judge(&r, 2, Some(0.07));
    assert_eq!(slow.len(), 1);
    assert!(
        slow[0].contains("all_reduce: average busbw 0.061 GB/s is below the gate 0.07"),
        "{slow:?}"
    );
    assert!(judge(&r, 4, None)[0].contains("2 ranks took part, the allocation has 4"));
    let mut wrong = r.clone();
    wrong.wrong = 5;
    assert_eq!(judge(&wrong, 2, None), ["5 wrong elements"]);
    let mut failed = r.clone();
    failed.passed = false;
    failed.failures = vec!["x".into()];
    assert_eq!(judge(&failed, 2, None), ["x"]);
    assert!(find_report("no json here\n{\"kind\":\"other\"}\n").is_none());
    assert!(summary(&r).contains("all_reduce      average busbw 0.061 GB/s"));
}
