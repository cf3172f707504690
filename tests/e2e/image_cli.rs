//! The image against a real Docker Engine and a real registry (started by scripts/test.sh via
//! scripts/docker-local.sh): `launcher image build` with the prebuilt binaries and a baked run
//! config, `launcher run` of `trainer pipeline` without `--config` inside the container (stopped
//! by SIGTERM, resumed, finished, outputs on the host mount), push to the loopback registry,
//! provenance read back from the registry, squash for Enroot, the GPU device request as the
//! engine records it, and the bad inputs (invalid config, failing step, no engine, plain HTTP
//! not asked for).
use super::util::{bin, logged_epochs, signal_once_exists, synth, text};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The loopback registry and base image scripts/docker-local.sh provides. Missing means the
/// tests were not started through scripts/test.sh: a failure, never a silent skip.
fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is unset: run the image tests through scripts/test.sh, which starts the Docker Engine and registry (scripts/docker-local.sh)")
    })
}

fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn launcher(args: &[&str]) -> Output {
    Command::new(bin("launcher"))
        .args(args)
        .current_dir(repo_root())
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn launcher_ok(args: &[&str]) -> String {
    let out = launcher(args);
    assert!(
        out.status.success(),
        "launcher {args:?} failed ({}):\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The tests that build whole images (libtorch in them: ~0.9 GB each, plus its exported root
/// filesystem and squash file while squashing) take turns: two of them side by side held 6.2 GB
/// of disk at their peak, one at a time about half, and a CI run on a machine with less room
/// failed with "no space left on device" in both and in the trainer tests beside them.
fn one_image_build_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that panicked while holding its turn leaves nothing the next one depends on.
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Removes the named images when the test ends, passed or not, so that what a test built does
/// not take disk for the rest of the run (scripts/test.sh's clean-tests only runs at the end).
struct RemovedAtEnd(Vec<String>);

impl Drop for RemovedAtEnd {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rmi", "--force"])
            .args(&self.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The build arguments of the offline build exactly as the Containerfile's header comment
/// documents them (so the documented command is the tested one), its base image being the
/// local one the test setup made.
fn offline_args(base: &str) -> Vec<String> {
    let file = std::fs::read_to_string(repo_root().join("Containerfile")).unwrap();
    let header: String = file
        .lines()
        .take_while(|l| l.starts_with('#') || l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let start = header
        .find("launcher image build --tag scdino:ci")
        .expect("the Containerfile documents the offline build");
    let command: String = header[start..]
        .lines()
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .trim_end_matches('\\')
                .trim()
        })
        .take_while(|l| !l.is_empty())
        .take_while(|l| l.contains("--build-arg") || l.starts_with("launcher image build"))
        .collect::<Vec<_>>()
        .join(" ");
    let words: Vec<&str> = command.split_whitespace().collect();
    // The documented base is scripts/docker-local.sh's default; SCDINO_BASE_IMAGE may rename it.
    let args: Vec<String> = words
        .windows(2)
        .filter(|w| w[0] == "--build-arg")
        .map(|w| match w[1].split_once('=') {
            Some(("CUDA_IMAGE", _)) => format!("CUDA_IMAGE={base}"),
            _ => w[1].to_string(),
        })
        .collect();
    assert!(
        args.contains(&"BINARIES=prebuilt".to_string()) && args.len() == 3,
        "the documented offline build changed: {command}"
    );
    args.into_iter()
        .flat_map(|a| ["--build-arg".to_string(), a])
        .collect()
}

/// Container paths: the data is mounted at /data, outputs at /out.
const RUN_CONFIG: &str = "run:\n  name: img\n  output_dir: /out\n  seed: 40\n\
    data:\n  dataset_dir: /data/Training\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  \
    channel_combinations: [\"02\"]\n  num_workers: 2\n\
    model:\n  name: m\n  arch: vit_tiny\n  out_dim: 256\n\
    augment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\n\
    train:\n  epochs: 3\n  checkpoint_every: 1\n  batch_size_per_gpu: 16\n  \
    precision: fp32\n  num_gpus: 1\n  warmup_epochs: 1\n  lr: 0.005\n\
    downstream:\n  features:\n    resize_length: 32\n  \
    attention:\n    image_size: 48\n  knn:\n    k: [3, 5]\n  \
    umap:\n    n_neighbors: 10\n    epochs: 60\n";

fn sha256_of(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    text(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn image_builds_runs_the_baked_pipeline_pushes_inspects_and_squashes() {
    // First, so that it is released last: after the images and the squash files are gone.
    let _turn = one_image_build_at_a_time();
    let registry = env("SCDINO_TEST_REGISTRY");
    let base = env("SCDINO_BASE_IMAGE");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    synth(&data, 3, 4, 20);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let cfg = dir.path().join("run.yaml");
    std::fs::write(&cfg, RUN_CONFIG).unwrap();
    let local = "scdino-e2e:test";
    let remote = format!("{registry}/scdino-e2e/trainer:test");
    let _images = RemovedAtEnd(vec![local.to_string(), remote.clone()]);

    // Build: prebuilt binaries, the config baked, two tags; stdout is the image ID.
    let mut args: Vec<String> = ["image", "build", "--tag", local, "--tag", &remote]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(offline_args(&base));
    args.extend(["--network", "host", "--config", cfg.to_str().unwrap()].map(String::from));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = launcher_ok(&argv).trim().to_string();
    assert!(id.starts_with("sha256:") && id.len() == 71, "{id}");
    assert_eq!(
        docker(&["image", "inspect", "-f", "{{.Id}}", &remote]).trim(),
        id
    );
    // Slim: no compiler, no Python, no test venv; the libraries the trainer loads, nothing else.
    let listing = docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "/bin/sh",
        local,
        "-c",
        "ls /opt/scdino/lib; command -v gcc python3 cc || true; ls /opt/venv 2>&1 || true",
    ]);
    assert!(
        listing.contains("libtorch_cpu.so") && listing.contains("libc10.so"),
        "{listing}"
    );
    assert!(
        !listing.contains("/usr/bin/gcc") && !listing.contains("/usr/bin/python3"),
        "{listing}"
    );
    assert!(
        listing.contains("No such file"),
        "a venv in the image: {listing}"
    );

    // Run the pipeline with no --config: the baked one. Stopped by SIGTERM once the first
    // checkpoint is on the host mount: the trainer checkpoints and the launcher exits 75.
    let mounts = [
        "--mount".to_string(),
        format!("{}:/data:ro", data.display()),
        "--mount".to_string(),
        format!("{}:/out", out.display()),
    ];
    let model = out.join("img/scDINO_ViTs/m_channel_APC_DAPI");
    let mut run = Command::new(bin("launcher"));
    run.args(["run", local])
        .args(&mounts)
        .args(["--", "pipeline"]);
    let child = run
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stopped = signal_once_exists(
        child,
        &model.join("checkpoint0000.safetensors"),
        "-TERM",
        Duration::from_secs(600),
    );
    let log = text(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(75), "{log}");
    assert!(
        log.contains("using the run config baked into this image, /opt/scdino/config.yaml"),
        "{log}"
    );
    assert!(!out
        .join("img/m_channel_APC_DAPI_analyses/report.html")
        .exists());
    // No container left behind.
    assert!(!docker(&["ps", "-a", "--format", "{{.Image}}"]).contains(local));

    // Run again: resumes and finishes; every output on the host, owned by the caller.
    let done = launcher(
        &[
            &["run", local][..],
            &mounts.iter().map(String::as_str).collect::<Vec<_>>(),
            &["--", "pipeline"],
        ]
        .concat(),
    );
    assert!(done.status.success(), "{}", text(&done.stderr));
    let report = out.join("img/m_channel_APC_DAPI_analyses/report.html");
    assert!(report.is_file(), "{}", text(&done.stderr));
    assert!(out
        .join("img/m_channel_APC_DAPI_analyses/kNN/global_kNN.txt")
        .is_file());
    let epochs = logged_epochs(&model.join("log.txt"));
    assert_eq!(epochs, [0, 1, 2], "resumed, not restarted");
    let uid = text(&Command::new("id").arg("-u").output().unwrap().stdout)
        .trim()
        .to_string();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&report).unwrap().uid().to_string(), uid);

    // A registry on loopback is plain HTTP without --plain-http (as in Docker); the push
    // prints NAME@sha256:DIGEST.
    let pushed = launcher_ok(&["image", "push", &remote]);
    let pushed = pushed.trim();
    let digest = pushed
        .strip_prefix(&format!("{registry}/scdino-e2e/trainer@"))
        .unwrap_or_else(|| panic!("{pushed}"));
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{pushed}"
    );

    // Provenance straight from the registry, by digest (OCI manifest + config).
    let json = launcher_ok(&["image", "inspect", pushed, "--registry", "--json"]);
    let facts: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(facts["manifest_digest"], digest);
    assert_eq!(facts["id"], id.as_str());
    let labels = &facts["labels"];
    assert_eq!(labels["org.scdino.config.sha256"], sha256_of(&cfg).as_str());
    assert_eq!(labels["org.scdino.torch.version"], "2.13.0");
    assert_eq!(labels["org.scdino.binaries"], "prebuilt");
    assert_eq!(labels["org.scdino.efa-installer.version"], "none");
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let git = text(
        &Command::new("git")
            .args(["-C", repo_root().to_str().unwrap(), "rev-parse", "HEAD"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(
        labels["org.opencontainers.image.revision"]
            .as_str()
            .unwrap()
            .starts_with(git.trim()),
        "{labels}"
    );
    assert!(labels["org.opencontainers.image.created"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    assert!(facts["manifest"]["layers"].as_array().unwrap().len() >= 2);
    // The engine reports the same labels.
    let engine: serde_json::Value =
        serde_json::from_str(&launcher_ok(&["image", "inspect", local, "--json"])).unwrap();
    assert_eq!(engine["labels"], *labels);

    // Squash: Enroot's layout, named by the image ID; reused when intact, rebuilt when not.
    let sq = dir.path().join("sqsh");
    let path = launcher_ok(&["image", "squash", local, "--out", sq.to_str().unwrap()]);
    let path = Path::new(path.trim()).to_path_buf();
    assert_eq!(
        path.file_name().unwrap().to_str().unwrap(),
        format!("{}.sqsh", id.replace(':', "-"))
    );
    let files = text(
        &Command::new("unsquashfs")
            .arg("-l")
            .arg(&path)
            .output()
            .unwrap()
            .stdout,
    );
    for f in [
        "opt/scdino/bin/trainer",
        "opt/scdino/lib/libtorch_cpu.so",
        "opt/scdino/config.yaml",
        "etc/rc",
        "etc/environment",
        "etc/rc.local",
        "etc/fstab",
        "workspace",
    ] {
        assert!(
            files.contains(&format!("squashfs-root/{f}\n")),
            "{f} missing"
        );
    }
    assert!(!files.contains("squashfs-root/.dockerenv"));
    let cat = |f: &str| {
        text(
            &Command::new("unsquashfs")
                .args(["-cat", path.to_str().unwrap(), f])
                .output()
                .unwrap()
                .stdout,
        )
    };
    let rc = cat("etc/rc");
    assert!(
        rc.contains("cd /workspace && unset OLDPWD || exit 1"),
        "{rc}"
    );
    assert!(rc.contains("exec /opt/scdino/bin/trainer \"$@\""), "{rc}");
    assert!(
        rc.contains(&format!("# org.scdino.config.sha256 {}", sha256_of(&cfg))),
        "{rc}"
    );
    assert!(cat("etc/environment").contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility\n"));
    assert_eq!(cat("opt/scdino/config.yaml"), RUN_CONFIG);
    // No library path of the build machine in the image: the binaries search
    // $ORIGIN/../lib alone (the host build also carries the venv's torch/lib), nothing sets
    // LD_LIBRARY_PATH, and the EFA libraries are in the loader's configuration instead.
    let environment = cat("etc/environment");
    assert!(!environment.contains("LD_LIBRARY_PATH"), "{environment}");
    let image_env = docker(&["image", "inspect", "-f", "{{json .Config.Env}}", local]);
    assert!(!image_env.contains("LD_LIBRARY_PATH"), "{image_env}");
    let efa_conf = cat("etc/ld.so.conf.d/scdino-efa.conf");
    for d in [
        "/opt/amazon/efa/lib",
        "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
    ] {
        assert!(efa_conf.lines().any(|l| l == d), "{d} not in {efa_conf}");
    }
    let host_path = host_torch_rpath();
    let extracted = dir.path().join("in-image");
    let un = Command::new("unsquashfs")
        .arg("-d")
        .arg(&extracted)
        .arg(&path)
        .arg("opt/scdino/bin")
        .output()
        .unwrap();
    assert!(un.status.success(), "{}", text(&un.stderr));
    for name in ["trainer", "launcher"] {
        let file = extracted.join("opt/scdino/bin").join(name);
        assert_eq!(runpath(&file), ["$ORIGIN/../lib"], "{name} in the image");
        assert_no_bytes(&file, &host_path);
    }
    let again = launcher(&["image", "squash", local, "--out", sq.to_str().unwrap()]);
    assert!(
        text(&again.stderr).contains("[squash] reused"),
        "{}",
        text(&again.stderr)
    );
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let redo = launcher(&["image", "squash", local, "--out", sq.to_str().unwrap()]);
    assert!(redo.status.success(), "{}", text(&redo.stderr));
    assert!(
        text(&redo.stderr).contains("is not a good copy"),
        "{}",
        text(&redo.stderr)
    );
    assert!(text(&redo.stderr).contains("[squash] wrote"));

    // The GPU request as `docker run --gpus all` makes it, read back from the engine.
    let cid = launcher_ok(&[
        "run",
        local,
        "--gpus",
        "all",
        "--create-only",
        "--",
        "train",
    ]);
    let cid = cid.trim();
    let host: serde_json::Value =
        serde_json::from_str(&docker(&["inspect", "-f", "{{json .HostConfig}}", cid])).unwrap();
    docker(&["rm", "-f", cid]);
    let req = &host["DeviceRequests"][0];
    assert_eq!(req["Count"], -1);
    assert_eq!(req["Capabilities"], serde_json::json!([["gpu"]]));
    assert_eq!(host["ShmSize"], 1 << 30);
    let limits = host["Ulimits"].as_array().unwrap();
    assert!(
        limits
            .iter()
            .any(|l| l["Name"] == "stack" && l["Hard"] == 64 << 20),
        "{limits:?}"
    );
    assert!(limits.iter().any(|l| l["Name"] == "memlock"), "{limits:?}");
}

#[test]
fn image_bad_inputs_are_refused_with_their_cause() {
    let base = env("SCDINO_BASE_IMAGE");
    let dir = tempfile::tempdir().unwrap();
    // A config that does not validate stops everything before the engine is contacted (here
    // there is none to contact): the file, line and key are named.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "run:\n  name: x\ntrain:\n  epochs: 0\n").unwrap();
    let out = Command::new(bin("launcher"))
        .args([
            "image",
            "build",
            "--tag",
            "scdino-e2e:bad",
            "--config",
            bad.to_str().unwrap(),
        ])
        .current_dir(repo_root())
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("{}:4: `train.epochs`", bad.display())),
        "{err}"
    );

    // No engine: the socket and how to start one.
    let out = Command::new(bin("launcher"))
        .args([
            "image",
            "squash",
            "scdino-e2e:test",
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no Docker Engine at DOCKER_HOST=unix:///nonexistent/docker.sock"),
        "{err}"
    );
    assert!(err.contains("scripts/docker-local.sh start"), "{err}");

    // A failing step: that step and the engine's message, non-zero exit.
    let ctx = dir.path().join("ctx");
    std::fs::create_dir(&ctx).unwrap();
    std::fs::write(
        ctx.join("Containerfile"),
        format!("FROM {base}\nRUN echo about to fail && false\nRUN echo never\n"),
    )
    .unwrap();
    let out = launcher(&[
        "image",
        "build",
        "--tag",
        "scdino-e2e:fail",
        "--network",
        "host",
        "--context",
        ctx.to_str().unwrap(),
        "--file",
        ctx.join("Containerfile").to_str().unwrap(),
    ]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    // (The step count includes the provenance LABEL steps the engine appends.)
    assert!(err.contains("build failed at Step 2/"), "{err}");
    assert!(
        err.contains(" : RUN echo about to fail && false: The command"),
        "{err}"
    );
    assert!(err.contains("returned a non-zero code: 1"), "{err}");
    assert!(
        err.contains("about to fail\n"),
        "the step's output is shown: {err}"
    );
}

/// A registry that wants Basic auth (Debian's docker-registry with an htpasswd file), started
/// by the test on a free loopback port; killed on drop.
struct AuthRegistry {
    child: std::process::Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl AuthRegistry {
    fn start(user: &str, password: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let py = repo_root().join(".venv/bin/python");
        let hash = Command::new(py)
            .args([
                "-W",
                "ignore",
                "-c",
                "import crypt, sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))",
                password,
            ])
            .output()
            .unwrap();
        assert!(hash.status.success(), "{}", text(&hash.stderr));
        std::fs::write(
            dir.path().join("htpasswd"),
            format!("{user}:{}\n", text(&hash.stdout).trim()),
        )
        .unwrap();
        let cfg = dir.path().join("registry.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root}\n\
                 http:\n  addr: 127.0.0.1:{port}\nauth:\n  htpasswd:\n    realm: test\n    path: {pw}\n",
                root = dir.path().join("data").display(),
                pw = dir.path().join("htpasswd").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        let start = Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "registry did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            addr,
            _dir: dir,
        }
    }
}

impl Drop for AuthRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn push_to_a_registry_with_auth_uses_the_credentials_and_never_shows_them() {
    let base = env("SCDINO_BASE_IMAGE");
    let password = "pw-5e3f9c1d-not-for-logs";
    let reg = AuthRegistry::start("ci", password);
    let image = format!("{}/auth/base:t", reg.addr);
    docker(&["tag", &base, &image]);
    let home = tempfile::tempdir().unwrap();
    let push = |envs: &[(&str, &str)]| {
        let mut c = Command::new(bin("launcher"));
        c.args(["image", "push", &image, "--plain-http"])
            .env("RUST_BACKTRACE", "0")
            .env("DOCKER_CONFIG", home.path())
            .env_remove("LAUNCHER_REGISTRY_USERNAME")
            .env_remove("LAUNCHER_REGISTRY_PASSWORD");
        for (k, v) in envs {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let all = text(&out.stdout) + &text(&out.stderr);
        assert!(!all.contains(password), "the password was printed:\n{all}");
        (out.status.success(), all)
    };
    // No credentials anywhere: a 401 that says how to provide them.
    let (ok, msg) = push(&[]);
    assert!(!ok);
    assert!(
        msg.contains(&format!(
            "registry {} needs credentials (HTTP 401) and none were found",
            reg.addr
        )),
        "{msg}"
    );
    // Wrong password in config.json: refused, naming where the credentials came from.
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    std::fs::write(
        home.path().join("config.json"),
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{}"}}}}}}"#,
            reg.addr,
            b64("ci:wrong")
        ),
    )
    .unwrap();
    let (ok, msg) = push(&[]);
    assert!(!ok);
    assert!(msg.contains("refused the credentials from"), "{msg}");
    assert!(msg.contains(&format!("auths.{}", reg.addr)), "{msg}");
    // The right ones in config.json: pushed, by digest.
    std::fs::write(
        home.path().join("config.json"),
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{}"}}}}}}"#,
            reg.addr,
            b64(&format!("ci:{password}"))
        ),
    )
    .unwrap();
    let (ok, msg) = push(&[]);
    assert!(ok, "{msg}");
    assert!(
        msg.contains(&format!("{}/auth/base@sha256:", reg.addr)),
        "{msg}"
    );
    // The environment wins over the file (wrong there now), and reading back works with it.
    std::fs::write(home.path().join("config.json"), "{}").unwrap();
    let creds = [
        ("LAUNCHER_REGISTRY_USERNAME", "ci"),
        ("LAUNCHER_REGISTRY_PASSWORD", password),
    ];
    let (ok, msg) = push(&creds);
    assert!(ok, "{msg}");
    let out = Command::new(bin("launcher"))
        .args([
            "image",
            "inspect",
            &image,
            "--registry",
            "--plain-http",
            "--json",
        ])
        .env("DOCKER_CONFIG", home.path())
        .envs(creds)
        .output()
        .unwrap();
    let all = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{all}");
    assert!(!all.contains(password));
    let facts: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert!(facts["manifest_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    docker(&["rmi", &image]);
}

/// `launcher submit --build TAG --squash-dir DIR`: builds the image with the trainer config
/// baked in, squashes it, and submits scripts whose `--container-image` is that file. (CI's
/// Slurm has no Pyxis, so the jobs themselves fail at `srun --container-image` and are
/// cancelled: what is checked is everything up to the submitted, `--test-only`-checked script.)
#[test]
fn submit_build_squashes_the_image_and_points_the_jobs_at_it() {
    // First, so that it is released last: after the images and the squash files are gone.
    let _turn = one_image_build_at_a_time();
    let base = env("SCDINO_BASE_IMAGE");
    std::env::var("SLURM_CONF").expect("SLURM_CONF is unset: run through scripts/test.sh");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.yaml");
    std::fs::write(&cfg, RUN_CONFIG).unwrap();
    let cluster = dir.path().join("cluster.yaml");
    std::fs::write(
        &cluster,
        format!(
            "trainer_config: {cfg}\nruntime: pyxis\nworkdir: {d}\nslurm:\n  time: \"5\"\n  log_dir: {d}/logs\n\
             container:\n  image: /replaced/by/the/build.sqsh\n  mounts:\n    - {d}:{d}\n    - {d}/data:/data\n    - {d}/out:/out\n\
             stages: [mean-std]\n",
            cfg = cfg.display(),
            d = dir.path().display()
        ),
    )
    .unwrap();
    let jobs = dir.path().join("jobs");
    let sq = dir.path().join("images");
    let _images = RemovedAtEnd(vec![
        "scdino-e2e:submit".to_string(),
        format!("{}/scdino-e2e/submit:t", env("SCDINO_TEST_REGISTRY")),
    ]);
    // Neither --push nor --squash-dir: refused before anything is built.
    let out = launcher(&[
        "submit",
        "--cluster",
        cluster.to_str().unwrap(),
        "--out",
        jobs.to_str().unwrap(),
        "--build",
        "scdino-e2e:submit",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--build needs --push"),
        "{}",
        text(&out.stderr)
    );

    let (out, script) = submit_built(
        &base,
        &cluster,
        &jobs,
        &[
            "--build",
            "scdino-e2e:submit",
            "--squash-dir",
            sq.to_str().unwrap(),
        ],
    );
    let id = docker(&["image", "inspect", "-f", "{{.Id}}", "scdino-e2e:submit"]);
    let sqsh = sq.join(format!("{}.sqsh", id.trim().replace(':', "-")));
    assert!(sqsh.is_file(), "{}", text(&out.stderr));
    assert!(
        script.contains(&format!("--container-image={}", sqsh.display())),
        "{script}"
    );
    assert!(
        text(&out.stdout).contains("submitted 1 jobs"),
        "{}",
        text(&out.stdout)
    );
    // The baked config is the trainer config, byte for byte.
    let baked = Command::new("unsquashfs")
        .args(["-cat", sqsh.to_str().unwrap(), "opt/scdino/config.yaml"])
        .output()
        .unwrap();
    assert_eq!(text(&baked.stdout), RUN_CONFIG);

    // --push on an Enroot 4 cluster: the jobs pull exactly the pushed image, by digest.
    let registry = env("SCDINO_TEST_REGISTRY");
    let c4 = std::fs::read_to_string(&cluster)
        .unwrap()
        .replace("container:\n", "container:\n  enroot_version: 4\n");
    let cluster4 = dir.path().join("cluster4.yaml");
    std::fs::write(&cluster4, c4).unwrap();
    let jobs4 = dir.path().join("jobs4");
    let tag = format!("{registry}/scdino-e2e/submit:t");
    let (_, script) = submit_built(
        &base,
        &cluster4,
        &jobs4,
        &["--build", &tag, "--push", "--plain-http"],
    );
    let pinned = script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("--container-image="))
        .unwrap_or_else(|| panic!("{script}"))
        .trim_matches('\'')
        .to_string();
    let digest = pinned
        .strip_prefix(&format!("{registry}/scdino-e2e/submit@"))
        .unwrap_or_else(|| panic!("{pinned}"));
    let facts: serde_json::Value = serde_json::from_str(&launcher_ok(&[
        "image",
        "inspect",
        &pinned,
        "--registry",
        "--plain-http",
        "--json",
    ]))
    .unwrap();
    assert_eq!(facts["manifest_digest"], digest);
    assert_eq!(
        facts["labels"]["org.scdino.config.sha256"],
        sha256_of(&cfg).as_str()
    );
}

/// `launcher submit --cluster CLUSTER --out JOBS` with `build` flags and the offline build
/// arguments; requires success, cancels the jobs (CI's Slurm has no Pyxis to run them) and
/// returns the output and the rendered mean-std script.
fn submit_built(base: &str, cluster: &Path, jobs: &Path, build: &[&str]) -> (Output, String) {
    let mut args: Vec<String> = [
        "submit",
        "--cluster",
        cluster.to_str().unwrap(),
        "--out",
        jobs.to_str().unwrap(),
        "--build-network",
        "host",
    ]
    .iter()
    .chain(build)
    .map(|s| s.to_string())
    .collect();
    args.extend(offline_args(base));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = launcher(&argv);
    let _ = launcher(&["cancel", "--out", jobs.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let script = std::fs::read_dir(jobs)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with("mean-std.sbatch"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .expect("a mean-std script");
    (out, script)
}

/// The DT_RUNPATH (or DT_RPATH) entries of an ELF file, as `readelf -d` reads them.
fn runpath(file: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(file)
        .output()
        .expect("readelf (binutils) runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter(|l| l.contains("(RUNPATH)") || l.contains("(RPATH)"))
        .filter_map(|l| Some(l.split_once('[')?.1.trim_end_matches(']').to_string()))
        .flat_map(|p| p.split(':').map(String::from).collect::<Vec<_>>())
        .collect()
}

/// The build machine's torch/lib folder that the host-built trainer's rpath names (so the
/// checks against it are not vacuous).
fn host_torch_rpath() -> String {
    let host = runpath(&bin("trainer"));
    assert_eq!(host.len(), 2, "{host:?}");
    assert_eq!(host[0], "$ORIGIN/../lib");
    assert!(
        host[1].starts_with('/') && host[1].ends_with("torch/lib"),
        "{host:?}"
    );
    host[1].clone()
}

fn assert_no_bytes(file: &Path, needle: &str) {
    let bytes = std::fs::read(file).unwrap();
    assert!(
        !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
        "{} holds the build machine's {needle}",
        file.display()
    );
}

/// `scripts/stage-runtime.sh` (the staging of both image builds) leaves the copies it stages
/// with the rpath `$ORIGIN/../lib` only, and they still resolve every library from the staged
/// folder alone.
#[test]
fn staged_binaries_carry_no_build_machine_path() {
    let host_path = host_torch_rpath();
    let out = tempfile::tempdir().unwrap();
    let staged = Command::new(repo_root().join("scripts/stage-runtime.sh"))
        .arg(out.path())
        .arg(bin("trainer"))
        .arg(bin("launcher"))
        .output()
        .unwrap();
    assert!(staged.status.success(), "{}", text(&staged.stderr));
    for name in ["trainer", "launcher"] {
        let file = out.path().join("bin").join(name);
        assert_eq!(runpath(&file), ["$ORIGIN/../lib"], "{name}");
        assert_no_bytes(&file, &host_path);
    }
    // The staged trainer loads libtorch from the staged lib/ (no LD_LIBRARY_PATH, and no
    // way back to the venv).
    let ldd = Command::new("ldd")
        .arg(out.path().join("bin/trainer"))
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let ldd = text(&ldd.stdout);
    let torch = ldd
        .lines()
        .find(|l| l.trim_start().starts_with("libtorch_cpu.so"))
        .unwrap_or_else(|| panic!("{ldd}"));
    assert!(
        torch.contains(
            &out.path()
                .join("bin/../lib/libtorch_cpu.so")
                .display()
                .to_string()
        ),
        "{torch}"
    );
    let version = Command::new(out.path().join("bin/trainer"))
        .arg("--version")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert!(version.status.success(), "{}", text(&version.stderr));
}
