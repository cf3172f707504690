//! Data-parallel training over Gloo between real processes on 127.0.0.1.
use super::util::{bin, launch, ok, run, synth, text, write_yaml};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn dataset(dir: &Path) -> PathBuf {
    // 24 images: floor(0.2·24) = 4 held out, 20 train = 5 global batches of 4 exactly.
    let data = dir.join("data");
    synth(&data, 21, 2, 12);
    data.join("Training")
}

fn config(dir: &Path, data: &Path, name: &str, batch: usize, extra: &str) -> String {
    write_yaml(
        dir,
        name,
        &format!(
            "run:\n  name: {name}\n  output_dir: {out}\ndata:\n  dataset_dir: {data}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"02\"]\n  num_workers: 1\nmodel:\n  name: m\n  arch: vit_tiny\n  out_dim: 64\n  drop_path_rate: 0.0\ntrain:\n  epochs: 2\n  batch_size_per_gpu: {batch}\n  warmup_epochs: 0\n  precision: fp32\n  lr: 0.05\n  dist_timeout_seconds: 60\n{extra}augment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\n",
            out = dir.join("out").display(),
            data = data.display()
        ),
    )
}

fn checkpoint(dir: &Path, name: &str) -> PathBuf {
    dir.join("out")
        .join(name)
        .join("scDINO_ViTs/m_channel_APC_DAPI/checkpoint.safetensors")
}

/// Compares the student/teacher tensors of two checkpoints: `(fraction of elements that
/// differ by more than 1e-5 relative to their tensor's scale, largest absolute difference)`.
///
/// Why not "every element within 1e-5": Adam divides each gradient by its own magnitude, so
/// an element whose gradient is float noise around zero gets an update of up to ±lr whatever
/// the implementation; two correct runs that merely sum in another order (DDP vs one process,
/// or PyTorch vs itself) disagree there. Such elements are rare and bounded by Σlr; a real
/// bug (wrong samples, wrong averaging, a stale centre) changes almost every element. The key
/// bias (`attn.qkv.bias[D:2D]`) is left out entirely: its gradient is zero in exact arithmetic
/// (softmax ignores a shift shared by all keys), so all of it is noise.
fn compare(a: &Path, b: &Path) -> (f64, f64) {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let script = "import sys, numpy as np\nfrom safetensors.numpy import load_file\na, b = load_file(sys.argv[1]), load_file(sys.argv[2])\nbad = total = 0\nworst = 0.0\nfor k in a:\n    if not k.startswith(('student.', 'teacher.')):\n        continue\n    x, y = a[k].astype('f8').ravel(), b[k].astype('f8').ravel()\n    if k.endswith('attn.qkv.bias'):\n        d = x.shape[0] // 3\n        x, y = np.concatenate([x[:d], x[2 * d:]]), np.concatenate([y[:d], y[2 * d:]])\n    diff = abs(x - y)\n    bad += int((diff > 1e-5 * max(abs(y).max(), 1e-3)).sum())\n    total += x.size\n    worst = max(worst, diff.max())\nprint(bad / total, worst)";
    let out = Command::new(py)
        .args(["-c", script, a.to_str().unwrap(), b.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Vec<f64> = text(&out.stdout)
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0], v[1])
}

fn checksums(stderr: &str) -> Vec<String> {
    let mut v: Vec<String> = stderr
        .lines()
        .filter_map(|l| {
            l.split_once("student parameter checksum ")
                .map(|(_, c)| c.trim().to_string())
        })
        .collect();
    v.sort();
    v
}

/// Runs `trainer launch --nproc {world} -- train` on `cfg` and returns rank 0's per-step
/// losses after checking that all ranks ended with the same parameters.
fn launch_train(world: usize, port: &str, cfg: &str, steps: &[&str]) -> Vec<f64> {
    let nproc = world.to_string();
    let mut args = launch(&nproc, port, &[], &["train", "--config", cfg]);
    args.extend(steps);
    let out = run("trainer", &args);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Every line of a rank says which rank wrote it (the launcher itself printed nothing).
    for rank in 0..world {
        let prefix = format!("[rank {rank}/{world} local {rank} ");
        assert!(
            err.lines().any(|l| l.starts_with(&prefix)),
            "{prefix}: {err}"
        );
    }
    assert!(err.lines().all(|l| l.starts_with("[rank ")), "{err}");
    let sums = checksums(&err);
    assert_eq!(sums.len(), world, "{err}");
    assert!(
        sums.iter().all(|s| s == &sums[0]),
        "ranks diverged: {sums:?}"
    );
    step_losses(&err)
}

#[test]
fn ddp_overlapped_or_not_and_fsdp_with_2_and_4_ranks_match_one_process_with_the_same_global_batch()
{
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    // Three iterations: long enough to exercise loss, centre, clipping, AdamW and EMA across
    // ranks, short enough that Adam's amplified float noise (see `compare`) stays rare.
    let steps = ["--threads", "1", "--max-steps", "3"];
    let single = config(dir.path(), &data, "single", 4, "  log_every: 1\n");
    let mut args = vec!["train", "--config", &single];
    args.extend(steps);
    let single_out = run("trainer", &args);
    assert!(single_out.status.success(), "{}", text(&single_out.stderr));
    let single_losses = step_losses(&text(&single_out.stderr));
    assert_eq!(single_losses.len(), 3);
    let same_losses = |what: &str, losses: &[f64]| {
        assert_eq!(losses.len(), 3, "{what}");
        for (x, y) in losses.iter().zip(&single_losses) {
            assert!((x - y).abs() <= 1e-5 * y.abs(), "{what}: loss {x} vs {y}");
        }
    };
    // 3 steps at lr ≤ 0.05·4/256: Σlr < 2.4e-3. Measured here vs one process: 0.01 % (2
    // ranks) and 0.03 % (4 ranks, batch 1 each) of elements; a real bug moves nearly all.
    let close = |what: &str, a: &str, b: &str, max_outliers: f64| {
        let (outliers, worst) = compare(&checkpoint(dir.path(), a), &checkpoint(dir.path(), b));
        assert!(
            outliers <= max_outliers,
            "{what}: {:.4}% of elements differ",
            outliers * 100.0
        );
        assert!(
            worst <= 2.0 * 2.4e-3,
            "{what}: an element moved {worst} apart"
        );
    };
    for (world, ports) in [
        (2usize, ["29631", "29633", "29635"]),
        (4, ["29641", "29643", "29645"]),
    ] {
        let batch = 4 / world;
        // DDP with the default overlapped (hook-driven) buckets.
        let ddp = format!("ddp{world}");
        let cfg = config(dir.path(), &data, &ddp, batch, "  log_every: 1\n");
        same_losses(&ddp, &launch_train(world, ports[0], &cfg, &steps));
        close(&format!("{ddp} vs one process"), &ddp, "single", 1e-3);
        if world == 2 {
            // Buckets reduced after backward: with two ranks a sum is a + b in any bucket
            // layout, so the weights must be bit-identical to the overlapped run.
            let name = "ddp2_after_backward";
            let cfg = config(
                dir.path(),
                &data,
                name,
                batch,
                "  log_every: 1\n  ddp_overlap: false\n",
            );
            same_losses(name, &launch_train(world, ports[1], &cfg, &steps));
            let (outliers, worst) =
                compare(&checkpoint(dir.path(), name), &checkpoint(dir.path(), &ddp));
            assert_eq!(
                (outliers, worst),
                (0.0, 0.0),
                "overlapped vs after-backward DDP"
            );
        }
        // FSDP: the same numbers from sharded state (clipping norms come from partial sums,
        // the only change in arithmetic). Measured: 5e-5 % of elements (2 ranks) differ from
        // DDP by more than 1e-5 relative.
        let fsdp = format!("fsdp{world}");
        let cfg = config(
            dir.path(),
            &data,
            &fsdp,
            batch,
            "  log_every: 1\n  strategy: fsdp\n",
        );
        same_losses(&fsdp, &launch_train(world, ports[2], &cfg, &steps));
        close(&format!("{fsdp} vs {ddp}"), &fsdp, &ddp, 1e-4);
        close(&format!("{fsdp} vs one process"), &fsdp, "single", 1e-3);
    }
}

/// FSDP resume: a rank SIGKILLed mid-epoch fails the job; the relaunch resumes from the
/// per-rank shard files and ends bit-identical to an uninterrupted run; the consolidated
/// checkpoint (single-process format) feeds `trainer features`.
#[test]
fn fsdp_resumes_from_shards_after_a_kill_and_its_consolidated_checkpoint_feeds_features() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let fsdp = "  log_every: 1\n  strategy: fsdp\n";
    let straight = config(dir.path(), &data, "straight", 2, fsdp);
    launch_train(
        2,
        "29671",
        &straight,
        &["--threads", "1", "--max-steps", "4"],
    );
    let cfg = config(dir.path(), &data, "killed", 2, fsdp);
    launch_train(2, "29673", &cfg, &["--threads", "1", "--max-steps", "2"]);
    let model = dir.path().join("out/killed/scDINO_ViTs/m_channel_APC_DAPI");
    for r in 0..2 {
        assert!(model
            .join(format!("fsdp/rank{r}of2/checkpoint.safetensors"))
            .exists());
    }
    // Resume and get killed after iteration 3 (before epoch 0's end at iteration 5 writes).
    let mut launcher = Command::new(bin("trainer"))
        .args(launch(
            "2",
            "29675",
            &["--grace", "10"],
            &["train", "--config", &cfg, "--threads", "1"],
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::{BufRead, BufReader};
    let mut reader = BufReader::new(launcher.stderr.take().unwrap());
    let mut seen = String::new();
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 0 && !line.contains("Epoch: [0/2]  [3/5]") {
        seen.push_str(&line);
        line.clear();
    }
    assert!(seen.contains("resuming from the FSDP shards"), "{seen}");
    let pgrep = Command::new("pgrep")
        .args(["-f", "-n", "killed.yaml --threads 1"])
        .output()
        .unwrap();
    let pid = text(&pgrep.stdout).trim().to_string();
    assert!(!pid.is_empty(), "no rank process found");
    assert!(Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap()
        .success());
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut reader, &mut rest);
    assert!(!launcher.wait().unwrap().success(), "{rest}");
    // The relaunch resumes from the shards at iteration 2 and stops at 4, like `straight`.
    let nproc_args = launch(
        "2",
        "29677",
        &[],
        &[
            "train",
            "--config",
            &cfg,
            "--threads",
            "1",
            "--max-steps",
            "4",
        ],
    );
    let out = run("trainer", &nproc_args);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("resuming from the FSDP shards") && err.contains("(iteration 2)"),
        "{err}"
    );
    let (outliers, worst) = compare(
        &checkpoint(dir.path(), "killed"),
        &checkpoint(dir.path(), "straight"),
    );
    assert_eq!(
        (outliers, worst),
        (0.0, 0.0),
        "resumed vs straight FSDP run"
    );
    // The consolidated checkpoint is an ordinary one: features read it.
    ok("trainer", &["features", "--config", &cfg, "--threads", "1"]);
    let csv = dir
        .path()
        .join("out/killed/m_channel_APC_DAPI_analyses/CLS_features/step4_features.csv");
    let rows: Vec<Vec<f64>> = std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 4, "held-out images");
    assert!(rows
        .iter()
        .all(|r| r.len() == 192 && r.iter().all(|v| v.is_finite())));

    // Without shards (lost, or another world size) a resume re-shards the consolidated
    // checkpoint, optimizer state included: the same parameters as the straight run.
    let resharded = config(dir.path(), &data, "resharded", 2, fsdp);
    launch_train(
        2,
        "29679",
        &resharded,
        &["--threads", "1", "--max-steps", "2"],
    );
    let model = dir
        .path()
        .join("out/resharded/scDINO_ViTs/m_channel_APC_DAPI");
    std::fs::remove_dir_all(model.join("fsdp")).unwrap();
    let out = run(
        "trainer",
        &launch(
            "2",
            "29683",
            &[],
            &[
                "train",
                "--config",
                &resharded,
                "--threads",
                "1",
                "--max-steps",
                "4",
            ],
        ),
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("resuming from the FSDP shards"), "{err}");
    assert!(
        err.contains("resuming from") && err.contains("(iteration 2)"),
        "{err}"
    );
    assert_eq!(
        compare(
            &checkpoint(dir.path(), "resharded"),
            &checkpoint(dir.path(), "straight")
        ),
        (0.0, 0.0),
        "re-sharded resume vs straight FSDP run"
    );
}

/// The channel-adaptive models under the parallel strategies: for `tokens` (every rank on the
/// same hierarchically sampled channel subset in a step) and `bag` ((image, channel) items
/// spread over the ranks), DDP and FSDP on 2 ranks give one process's losses and parameters,
/// at the same global batch and the tolerances of the fixed model's test.
#[test]
fn adaptive_models_under_ddp_and_fsdp_match_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let steps = ["--threads", "1", "--max-steps", "3"];
    for (mode, ports) in [("tokens", ["29691", "29693"]), ("bag", ["29695", "29697"])] {
        let cfg = |name: &str, batch: usize, extra: &str| {
            let path = config(dir.path(), &data, name, batch, extra);
            let text = std::fs::read_to_string(&path).unwrap().replace(
                "  drop_path_rate: 0.0\n",
                &format!("  drop_path_rate: 0.0\n  channels: {mode}\n"),
            );
            std::fs::write(&path, text).unwrap();
            path
        };
        let ck = |name: &str| {
            dir.path().join("out").join(name).join(format!(
                "scDINO_ViTs/m_{mode}_channel_APC_BF_DAPI_GREEN_PE/checkpoint.safetensors"
            ))
        };
        let single = format!("{mode}_single");
        let path = cfg(&single, 4, "  log_every: 1\n");
        let mut args = vec!["train", "--config", &path];
        args.extend(steps);
        let out = run("trainer", &args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let single_losses = step_losses(&text(&out.stderr));
        assert_eq!(single_losses.len(), 3, "{mode}");
        for (strategy, port) in [("ddp", ports[0]), ("fsdp", ports[1])] {
            let name = format!("{mode}_{strategy}2");
            let path = cfg(
                &name,
                2,
                &format!("  log_every: 1\n  strategy: {strategy}\n"),
            );
            let losses = launch_train(2, port, &path, &steps);
            assert_eq!(losses.len(), 3, "{name}");
            for (x, y) in losses.iter().zip(&single_losses) {
                assert!((x - y).abs() <= 1e-5 * y.abs(), "{name}: loss {x} vs {y}");
            }
            let (outliers, worst) = compare(&ck(&name), &ck(&single));
            assert!(
                outliers <= 1e-3,
                "{name}: {:.4}% of elements differ",
                outliers * 100.0
            );
            assert!(
                worst <= 2.0 * 2.4e-3,
                "{name}: an element moved {worst} apart"
            );
        }
    }
}

/// DINOv2's stabilisers under the parallel strategies. Sinkhorn-Knopp centring all-reduces
/// its sums and register tokens are one more declared parameter: DDP and FSDP on 2 ranks give
/// one process's losses and parameters. KoLeo runs per rank (as DINOv2), so 2 ranks differ
/// from one process there, but DDP and FSDP must agree with each other; so must iBOT (each
/// rank masks its own images), whose patch centre is averaged over the ranks.
#[test]
fn dinov2_stabilisers_under_ddp_and_fsdp() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let steps = ["--threads", "1", "--max-steps", "3"];
    let cfg = |name: &str, batch: usize, extra: &str| {
        let path = config(dir.path(), &data, name, batch, extra);
        let text = std::fs::read_to_string(&path).unwrap().replace(
            "  drop_path_rate: 0.0\n",
            "  drop_path_rate: 0.0\n  num_register_tokens: 2\n",
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let ck = |name: &str| checkpoint(dir.path(), name);
    let sk = "  log_every: 1\n  centering: sinkhorn_knopp\n";
    let path = cfg("sk_single", 4, sk);
    let mut args = vec!["train", "--config", &path];
    args.extend(steps);
    let out = run("trainer", &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let single_losses = step_losses(&text(&out.stderr));
    assert_eq!(single_losses.len(), 3);
    let close = |a: &str, b: &str, la: &[f64], lb: &[f64]| {
        assert_eq!(la.len(), lb.len(), "{a} vs {b}");
        for (x, y) in la.iter().zip(lb) {
            assert!((x - y).abs() <= 1e-5 * y.abs(), "{a}: loss {x} vs {b} {y}");
        }
        let (outliers, worst) = compare(&ck(a), &ck(b));
        assert!(
            outliers <= 1e-3,
            "{a} vs {b}: {:.4}% of elements differ",
            outliers * 100.0
        );
        assert!(
            worst <= 2.0 * 2.4e-3,
            "{a} vs {b}: an element moved {worst} apart"
        );
    };
    let mut koleo = Vec::new();
    let mut ibot = Vec::new();
    for (strategy, ports) in [
        ("ddp", ["29601", "29605", "29617"]),
        ("fsdp", ["29609", "29613", "29621"]),
    ] {
        let name = format!("sk_{strategy}2");
        let path = cfg(&name, 2, &format!("{sk}  strategy: {strategy}\n"));
        let losses = launch_train(2, ports[0], &path, &steps);
        close(&name, "sk_single", &losses, &single_losses);
        let name = format!("koleo_{strategy}2");
        let path = cfg(
            &name,
            2,
            &format!("{sk}  strategy: {strategy}\n  koleo_weight: 0.1\n"),
        );
        koleo.push((name, launch_train(2, ports[1], &path, &steps)));
        // iBOT through the shared head with its EMA patch centre (each rank masks its own
        // images, so two ranks differ from one process; 8 px patches give a 32 px crop a 4 × 4
        // grid to mask).
        let name = format!("ibot_{strategy}2");
        let path = cfg(
            &name,
            2,
            &format!("  log_every: 1\n  strategy: {strategy}\n  ibot:\n    weight: 1.0\n"),
        );
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("  out_dim: 64\n", "  out_dim: 64\n  patch_size: 8\n");
        std::fs::write(&path, text).unwrap();
        ibot.push((name, launch_train(2, ports[2], &path, &steps)));
    }
    close(&ibot[0].0, &ibot[1].0, &ibot[0].1, &ibot[1].1);
    let digests = super::util::tensor_digests(&ck(&ibot[0].0));
    assert!(digests.contains_key("ibot_patch_loss.center"));
    assert!(
        (koleo[0].1[0] - single_losses[0]).abs() > 1e-3,
        "KoLeo did not change the loss"
    );
    close(&koleo[0].0, &koleo[1].0, &koleo[0].1, &koleo[1].1);
}

/// The per-iteration losses of rank 0's progress lines.
fn step_losses(stderr: &str) -> Vec<f64> {
    stderr
        .lines()
        .filter_map(|l| l.split_once("  loss: "))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn a_killed_rank_fails_the_job_fast_and_a_relaunch_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let cfg = config(dir.path(), &data, "kill", 2, "  log_every: 1\n");
    let cfg_long = cfg.replace("kill.yaml", "kill_long.yaml");
    std::fs::write(
        &cfg_long,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("epochs: 2", "epochs: 40"),
    )
    .unwrap();
    let mut launcher = Command::new(bin("trainer"))
        .args(launch(
            "2",
            "29651",
            &["--grace", "10"],
            &["train", "--config", &cfg_long, "--threads", "1"],
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until epoch 1 is under way (a checkpoint exists), then SIGKILL rank 1.
    use std::io::{BufRead, BufReader};
    let mut reader = BufReader::new(launcher.stderr.take().unwrap());
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 0 && !line.contains("Epoch: [1/40]  [2/") {
        line.clear();
    }
    let pgrep = Command::new("pgrep")
        .args(["-f", "-n", "kill_long.yaml --threads 1"])
        .output()
        .unwrap();
    let pid = text(&pgrep.stdout).trim().to_string();
    assert!(!pid.is_empty(), "no rank process found");
    let started = std::time::Instant::now();
    assert!(Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap()
        .success());
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut reader, &mut rest);
    let status = launcher.wait().unwrap();
    assert!(!status.success(), "{rest}");
    assert!(
        started.elapsed().as_secs() < 30,
        "took {:?}",
        started.elapsed()
    );
    assert!(rest.contains("exited with"), "{rest}");
    // A relaunch (with the normal epoch count) resumes from the last checkpoint and finishes.
    std::fs::write(
        &cfg_long,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("epochs: 2", "epochs: 3"),
    )
    .unwrap();
    let out = run(
        "trainer",
        &launch(
            "2",
            "29661",
            &[],
            &["train", "--config", &cfg_long, "--threads", "1"],
        ),
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("resuming from"), "{err}");
    let log = std::fs::read_to_string(
        dir.path()
            .join("out/kill/scDINO_ViTs/m_channel_APC_DAPI/log.txt"),
    )
    .unwrap();
    assert_eq!(log.lines().count(), 3, "{log}");
}

/// A rank waiting at a rendezvous for a rank that is not coming, as the other ranks of a
/// multi-rank pipeline wait while rank 0 runs the single-rank stages, stops on SIGTERM at
/// once with the preemption code (75), not after `train.dist_timeout_seconds` (10 minutes
/// here): at training's rendezvous as a worker and as rank 0, and at a features stage's.
#[test]
fn a_stop_signal_ends_a_rank_waiting_at_a_rendezvous() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let cfg = config(dir.path(), &data, "waits", 4, "");
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        yaml.replace("dist_timeout_seconds: 60", "dist_timeout_seconds: 600"),
    )
    .unwrap();
    // One rank of two, alone: whatever it waits for never comes.
    let stopped_alone = |rank: &str, port: &str, command: &str| {
        let mut child = Command::new(bin("trainer"))
            .args([command, "--config", &cfg, "--threads", "1"])
            .env_remove("LD_LIBRARY_PATH")
            .envs([
                ("RANK", rank),
                ("LOCAL_RANK", rank),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port),
            ])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Long enough to be at the rendezvous (the process starts in about a second).
        std::thread::sleep(std::time::Duration::from_secs(4));
        assert!(
            child.try_wait().unwrap().is_none(),
            "{command} on rank {rank} did not wait"
        );
        let signalled = std::time::Instant::now();
        assert!(Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success());
        let out = child.wait_with_output().unwrap();
        let waited = signalled.elapsed();
        let err = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(75),
            "{command} on rank {rank}: {err}"
        );
        assert!(
            waited < std::time::Duration::from_secs(20),
            "{command} on rank {rank} took {waited:?} to stop: {err}"
        );
    };
    stopped_alone("1", "29887", "pipeline");
    stopped_alone("0", "29889", "train");
    let model = dir.path().join("out/waits/scDINO_ViTs/m_channel_APC_DAPI");
    assert!(
        !model.join("checkpoint.safetensors").exists(),
        "a run stopped before the ranks met wrote a checkpoint"
    );
    // Trained by one process; a worker of two then reaches the features stage's rendezvous.
    let trained = run("trainer", &["train", "--config", &cfg, "--threads", "1"]);
    assert!(trained.status.success(), "{}", text(&trained.stderr));
    stopped_alone("1", "29891", "pipeline");
    fn files_under(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files_under(&path, found);
            } else {
                found.push(path);
            }
        }
    }
    let mut written = vec![];
    files_under(&dir.path().join("out/waits"), &mut written);
    assert!(
        written
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".safetensors")),
        "no checkpoint: {written:?}"
    );
    let features: Vec<_> = written
        .iter()
        .filter(|p| p.to_string_lossy().contains("_features."))
        .collect();
    assert!(features.is_empty(), "features written: {features:?}");
}

/// `features` launched on 3 ranks writes the same rows, once each and in held-out order, as
/// one process (every rank embeds every third image; rank 0 gathers and writes).
#[test]
fn features_on_three_ranks_equal_one_process_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // 52 images: floor(0.2·52) = 10 held out, not a multiple of 3 (ranks get 4, 3, 3 rows).
    synth(&data, 4, 2, 26);
    let cfg = config(dir.path(), &data.join("Training"), "feat", 4, "");
    ok(
        "trainer",
        &[
            "train",
            "--config",
            &cfg,
            "--max-steps",
            "2",
            "--threads",
            "1",
        ],
    );
    let analyses = dir.path().join("out/feat/m_channel_APC_DAPI_analyses");
    // A checkpoint after 2 steps of the first epoch is tagged `step2` (not `epoch0`, which
    // is the weights after the whole first epoch).
    let csv = analyses.join("CLS_features/step2_features.csv");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let rows = |s: &str| -> Vec<Vec<f64>> {
        s.lines()
            .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
            .collect()
    };
    ok("trainer", &["features", "--config", &cfg, "--threads", "1"]);
    let single = rows(&read(&csv));
    let single_labels = read(&analyses.join("class_labels.csv"));
    let single_paths = read(&analyses.join("image_paths.csv"));
    std::fs::remove_dir_all(&analyses).unwrap();
    let out = run(
        "trainer",
        &launch(
            "3",
            "29655",
            &[],
            &["features", "--config", &cfg, "--threads", "1"],
        ),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Only rank 0 reports (and writes).
    assert_eq!(
        text(&out.stdout).matches(" rows -> ").count(),
        1,
        "{}",
        text(&out.stdout)
    );
    let multi = rows(&read(&csv));
    assert_eq!(multi.len(), 10);
    assert_eq!(single.len(), 10);
    for (i, (a, b)) in multi.iter().zip(&single).enumerate() {
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-5, "row {i} differs by {worst}");
    }
    // Distinct rows: no image embedded twice.
    for i in 0..multi.len() {
        for j in i + 1..multi.len() {
            assert_ne!(multi[i], multi[j], "rows {i} and {j} are duplicates");
        }
    }
    assert_eq!(read(&analyses.join("class_labels.csv")), single_labels);
    assert_eq!(read(&analyses.join("image_paths.csv")), single_paths);
}

/// `--log-format json` on the launcher reaches the ranks; every stderr line is one JSON
/// object naming its rank, local rank, world size and host; the progress line's fields agree
/// with its text; `SCDINO_LOG=warn` silences a successful command's stderr while its result
/// stays on stdout.
#[test]
fn json_logs_name_rank_and_host_and_the_filter_applies() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let cfg = config(dir.path(), &data, "json", 2, "  log_every: 1\n");
    let out = run(
        "trainer",
        &[
            &["--log-format", "json"][..],
            &launch(
                "2",
                "29737",
                &[],
                &[
                    "train",
                    "--config",
                    &cfg,
                    "--threads",
                    "1",
                    "--max-steps",
                    "2",
                ],
            ),
        ]
        .concat(),
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines.len() >= 8, "{err}");
    for v in &lines {
        let rank = v["rank"].as_u64().unwrap_or_else(|| panic!("{v}"));
        assert!(
            rank < 2 && v["local_rank"] == rank && v["world_size"] == 2,
            "{v}"
        );
        assert_eq!(v["host"], host.trim(), "{v}");
        let ts = v["timestamp"].as_str().unwrap();
        assert!(
            ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{ts}"
        );
        assert!(v["level"] == "INFO" || v["level"] == "WARN", "{v}");
    }
    let progress: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["target"] == "trainer::progress")
        .collect();
    assert_eq!(progress.len(), 2, "rank 0 logs every step: {err}");
    for p in &progress {
        assert_eq!(p["rank"], 0);
        let loss = p["fields"]["loss"].as_f64().unwrap();
        let said = step_losses(p["message"].as_str().unwrap());
        assert_eq!(said.len(), 1);
        assert!((said[0] - loss).abs() <= 1e-6 * loss.abs(), "{p}");
        assert!(
            p["fields"]["flops_per_second"].as_f64().unwrap() > 0.0,
            "{p}"
        );
    }
    let sums: Vec<f64> = lines
        .iter()
        .filter_map(|v| v["fields"]["checksum"].as_f64())
        .collect();
    assert_eq!(sums.len(), 2, "{err}");
    assert_eq!(sums[0], sums[1]);

    let quiet = Command::new(bin("trainer"))
        .args(["mean-std", "--config", &cfg])
        .env("SCDINO_LOG", "warn")
        .output()
        .unwrap();
    assert!(quiet.status.success(), "{}", text(&quiet.stderr));
    assert_eq!(text(&quiet.stderr), "");
    let ms: serde_json::Value = serde_json::from_str(text(&quiet.stdout).trim()).unwrap();
    assert!(ms.is_object() || ms.is_array(), "{ms}");
}

/// `trainer launch` without `--nproc` starts `train.num_gpus` ranks of the launched command's
/// config (scDINO's processes per node), each with its rank's environment; a command without
/// `--config` needs `--nproc`.
#[test]
fn launch_without_nproc_starts_train_num_gpus_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    synth(&data, 3, 2, 2);
    // `dist_url` makes every rank log a line (the notice that nothing reads it).
    let cfg = write_yaml(
        dir.path(),
        "three",
        &format!(
            "data:\n  dataset_dir: {}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"0\"]\ntrain:\n  num_gpus: 3\n  dist_url: tcp://127.0.0.1:1\n",
            data.join("Training").display()
        ),
    );
    let out = run(
        "trainer",
        &[
            "launch",
            "--master-port",
            "29613",
            "--",
            "data",
            "read-bench",
            "--config",
            &cfg,
            "--no-decode",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.contains("images_per_s"))
            .count(),
        3,
        "{stdout}"
    );
    assert!(
        stderr.contains("launch: 3 ranks (train.num_gpus of"),
        "{stderr}"
    );
    for rank in 0..3 {
        let prefix = format!("[rank {rank}/3 local {rank} ");
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&prefix) && l.contains("`train.dist_url`")),
            "{prefix}: {stderr}"
        );
    }

    let out = run("trainer", &["launch", "--", "collectives-bench"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--nproc is not given") && err.contains("collectives-bench"),
        "{err}"
    );
}
