//! The embedding jobs: the one-job script for the shipped example (golden), the job array and
//! its merge job run by a real bash with stand-ins for srun and scontrol, and the refusals.
use super::*;
use crate::render::fixtures::{bash_n, example_cluster, example_preamble, StandIns, EXAMPLE_SRUN};

fn opts(layout: Layout) -> Options {
    Options {
        checkpoint: "/fsx/scdino/out/run/checkpoint.safetensors".into(),
        images: "s3://screens/plate 1".into(),
        table: "embeddings/screen.parquet".into(),
        list: None,
        metadata: Some("meta.csv".into()),
        path_pattern: Some("{Plate}/{Well}/{Site}_{Cell}.tiff".into()),
        channels: Some("DAPI,GFP".into()),
        on_error: Some("fail".into()),
        batch_size: Some(64),
        device: None,
        precision: Some("bf16".into()),
        layout,
    }
}

/// The shipped example, one job: the training job's allocation, srun flags, container options
/// and rendezvous, the trainer's `embed` with the paths as the container sees them (relative
/// ones against the folder the launcher runs in), the S3 prefix as written, not preemptible.
#[test]
fn pyxis_embedding_job_golden() {
    let cluster = example_cluster();
    let all = Layout::Ranks(Allocation::of(&cluster, None, None));
    let out = Path::new("/fsx/scdino/embed-jobs");
    let r = render(&cluster, &opts(all), out, Path::new("/fsx/scdino")).unwrap();
    let names: Vec<&str> = r.scripts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["01-embed.sbatch"]);
    let want = format!(
        "{}{EXAMPLE_SRUN}embed \\
  --checkpoint /fsx/scdino/out/run/checkpoint.safetensors \\
  --images 's3://screens/plate 1' \\
  --out /fsx/scdino/embeddings/screen.parquet \\
  --metadata /fsx/scdino/meta.csv \\
  --path-pattern '{{Plate}}/{{Well}}/{{Site}}_{{Cell}}.tiff' \\
  --channels DAPI,GFP \\
  --on-error fail \\
  --batch-size 64 \\
  --precision bf16
echo \"[launcher] embed finished\"
",
        example_preamble("embed", "embed", "", "")
    );
    assert_eq!(r.scripts[0].1, want);
    bash_n(&want);
    let m = &r.manifest;
    assert_eq!((m.jobs.len(), m.trainer_config.as_ref()), (1, None));
    assert_eq!(m.jobs[0].log, Path::new("/fsx/scdino/logs/embed-%j.out"));
    // The inputs are not on this machine: said, not refused (the nodes may see them).
    assert!(
        r.warnings[0].starts_with(
            "--checkpoint /fsx/scdino/out/run/checkpoint.safetensors does not exist on this host"
        ),
        "{:?}",
        r.warnings
    );
    assert!(r.warnings[1].starts_with("--metadata /fsx/scdino/meta.csv"));
    assert_eq!(r.warnings.len(), 2, "S3 images are not looked for");
    // An array on a GPU cluster: one GPU per shard, none for the merge.
    let array = Layout::Array {
        count: 10,
        limit: None,
    };
    let r = render(&cluster, &opts(array), out, Path::new("/fsx/scdino")).unwrap();
    let (shards, merge) = (&r.scripts[0].1, &r.scripts[1].1);
    assert!(
        shards.contains("#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --gpus-per-node=1\n#SBATCH --array=0-9\n#SBATCH --cpus-per-task=8\n"),
        "{shards}"
    );
    assert!(
        merge.contains("#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --cpus-per-task=8\n"),
        "{merge}"
    );
}

/// Host runtime, every path hostile: task `i` of the array runs `embed … --shard-count 3
/// --shard-index i` (srun receives every word exactly, the index from Slurm's variable), the
/// merge job waits for the whole array and runs `embed … --merge`, without shards or array.
#[test]
fn array_tasks_embed_their_shard_and_the_merge_waits_for_all() {
    let dir = tempfile::tempdir().unwrap();
    let weird = dir.path().join("my data/it's \"q\" $HOME `id` ;&|*?");
    std::fs::create_dir_all(weird.join("images")).unwrap();
    let trainer = weird.join("bin/trainer x");
    let yaml = format!(
        "runtime: host\nhost:\n  trainer: {t:?}\nworkdir: /w\nslurm:\n  nodes: 4\n  log_dir: {l:?}\n",
        t = trainer.to_str().unwrap(),
        l = weird.join("logs").to_str().unwrap(),
    );
    let cluster = Cluster::from_yaml(&yaml, "c.yaml").unwrap();
    let mut o = opts(Layout::Array {
        count: 3,
        limit: Some(2),
    });
    o.images = "images".into();
    o.checkpoint = weird.join("ck $X.safetensors");
    o.metadata = None;
    o.on_error = None;
    o.batch_size = None;
    o.precision = None;
    o.channels = None;
    o.device = Some("cpu".into());
    let r = render(&cluster, &o, &weird.join("jobs"), &weird).unwrap();
    let names: Vec<&str> = r.scripts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["01-embed-shards.sbatch", "02-embed-merge.sbatch"]);
    let jobs = &r.manifest.jobs;
    assert_eq!(jobs[0].name, SHARDS_JOB);
    assert_eq!(jobs[1].after[0].job, SHARDS_JOB);
    assert_eq!(jobs[1].after[0].kind, "afterok");
    assert_eq!(jobs[0].log, weird.join("logs/embed-shards-%A_%a.out"));
    let mut submitted = jobs[0].clone();
    submitted.job_id = Some("42".into());
    assert_eq!(
        submitted.log_path(),
        weird.join("logs/embed-shards-42_%a.out")
    );
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(
        r.warnings[0].starts_with("--checkpoint "),
        "{:?}",
        r.warnings
    );
    let (shards, merge) = (&r.scripts[0].1, &r.scripts[1].1);
    bash_n(shards);
    bash_n(merge);
    assert!(
        shards.contains("#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --array=0-2%2\n"),
        "{shards}"
    );
    for s in [shards, merge] {
        assert!(!s.contains("MASTER_ADDR") && !s.contains("--signal"), "{s}");
    }
    assert!(
        !merge.contains("--array") && !merge.contains("--shard"),
        "{merge}"
    );

    let fake = StandIns::new(dir.path(), "", "task/none", &["n1"]);
    let (images, table) = (
        weird.join("images"),
        weird.join("embeddings/screen.parquet"),
    );
    let common = [
        trainer.to_str().unwrap(),
        "embed",
        "--checkpoint",
        o.checkpoint.to_str().unwrap(),
        "--images",
        images.to_str().unwrap(),
        "--out",
        table.to_str().unwrap(),
        "--path-pattern",
        "{Plate}/{Well}/{Site}_{Cell}.tiff",
        "--device",
        "cpu",
    ];
    let env = [
        ("SLURM_JOB_ID", "44"),
        ("SLURM_JOB_NODELIST", "n1"),
        ("SLURM_ARRAY_JOB_ID", "42"),
        ("SLURM_ARRAY_TASK_ID", "2"),
    ];
    let out = fake.run(shards, &env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("embed-shards job 42 task 2 (job 44) on n1"),
        "{stdout}"
    );
    let mut want: Vec<&str> = common.to_vec();
    want.extend(["--shard-count", "3", "--shard-index", "2"]);
    assert_eq!(fake.srun_args(), want);
    let out = fake.run(merge, &env[..2]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut want: Vec<&str> = common.to_vec();
    want.push("--merge");
    assert_eq!(fake.srun_args(), want);
}

#[test]
fn unreachable_paths_and_impossible_layouts_are_refused() {
    let cluster = example_cluster();
    let cwd = Path::new("/fsx/scdino");
    let out = Path::new("/fsx/scdino/e");
    let all = Layout::Ranks(Allocation::of(&cluster, None, None));
    let err = |o: &Options| render(&cluster, o, out, cwd).unwrap_err().to_string();
    let mut o = opts(all);
    o.checkpoint = "/home/me/ck.safetensors".into();
    assert_eq!(
        err(&o),
        "--checkpoint /home/me/ck.safetensors is not under any container mount (container.mounts: /fsx:/fsx, /opt/dlami/nvme:/scratch): the jobs could not reach it"
    );
    // A path already written as the container sees it is kept.
    o.checkpoint = "/scratch/ck.safetensors".into();
    let r = render(&cluster, &o, out, cwd).unwrap();
    assert!(r.scripts[0]
        .1
        .contains("  --checkpoint /scratch/ck.safetensors \\\n"));
    let mut o = opts(all);
    o.images = "/home/me/images".into();
    assert!(
        err(&o).starts_with("--images /home/me/images is not under"),
        "{}",
        err(&o)
    );
    o.images = "s3://".into();
    assert!(err(&o).contains("needs a bucket"), "{}", err(&o));
    o.images = "gs://".into();
    assert!(
        err(&o).contains("a gs:// dataset needs a bucket"),
        "{}",
        err(&o)
    );
    o.images = "http://host/images".into();
    assert!(err(&o).contains("only local paths"), "{}", err(&o));
    let mut o = opts(all);
    o.table = "s3://b/x.parquet".into();
    assert!(
        err(&o).contains("filesystem every task sees"),
        "{}",
        err(&o)
    );
    let mut o = opts(all);
    o.list = Some("/home/me/list.csv".into());
    assert!(
        err(&o).starts_with("--list /home/me/list.csv"),
        "{}",
        err(&o)
    );
    for (layout, why) in [
        (
            Layout::Array {
                count: 0,
                limit: None,
            },
            "--array must be at least 1",
        ),
        (
            Layout::Array {
                count: 2,
                limit: Some(0),
            },
            "--array-limit must be at least 1",
        ),
        (
            Layout::Ranks(Allocation::of(&cluster, Some(0), None)),
            "--nodes and --tasks-per-node must be at least 1",
        ),
    ] {
        assert_eq!(err(&opts(layout)), why);
    }
}
