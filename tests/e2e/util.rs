//! Locating and running the built binaries.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `target/<profile>/<name>`, next to this test executable's `deps/` folder.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let p = profile_dir.join(name);
    assert!(
        p.exists(),
        "{} is not built: run scripts/test.sh (it builds the binaries before the tests)",
        p.display()
    );
    p
}

/// Runs a binary without LD_LIBRARY_PATH: the rpath alone must find libtorch.
pub fn run(name: &str, args: &[&str]) -> Output {
    Command::new(bin(name))
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs and requires success, returning stdout.
pub fn ok(name: &str, args: &[&str]) -> String {
    let out = run(name, args);
    assert!(
        out.status.success(),
        "{name} {args:?} failed ({}):\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The words of `trainer launch --nproc NPROC --master-port PORT [OPTIONS] -- COMMAND…`: the
/// one place the tests spell a local multi-process launch (`options`, e.g. `--grace 10`, go
/// before `--`).
pub fn launch<'a>(
    nproc: &'a str,
    port: &'a str,
    options: &[&'a str],
    command: &[&'a str],
) -> Vec<&'a str> {
    let mut words = vec!["launch", "--nproc", nproc, "--master-port", port];
    words.extend_from_slice(options);
    words.push("--");
    words.extend_from_slice(command);
    words
}

/// `trainer synth` into `out` (its `Training/` folder is the dataset); returns stdout.
pub fn synth(out: &Path, seed: u64, classes: usize, per_class: usize) -> String {
    ok(
        "trainer",
        &[
            "synth",
            "--out",
            out.to_str().unwrap(),
            "--seed",
            &seed.to_string(),
            "--classes",
            &classes.to_string(),
            "--per-class",
            &per_class.to_string(),
        ],
    )
}

/// `trainer synth --layout fov` into `out`: a screen stored as fields of view (LoadData
/// table `load_data.csv`, object table `Nuclei.csv`), 72 cells in 2 plates, one well per class
/// (`A`, `B`, `C`) and plate, 4 cells a site.
pub fn synth_screen(out: &Path) {
    ok(
        "trainer",
        &[
            "synth",
            "--layout",
            "fov",
            "--out",
            out.to_str().unwrap(),
            "--classes",
            "3",
            "--per-class",
            "24",
            "--plates",
            "2",
            "--per-site",
            "4",
        ],
    );
}

/// The model folder of run `name` (output dir `dir/out`, model `m`, channels APC and DAPI)
/// that the tests' configs produce.
pub fn model_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join("out")
        .join(name)
        .join("scDINO_ViTs/m_channel_APC_DAPI")
}

/// Every tensor of a safetensors file → sha256 of its bytes, read by the venv's Python
/// `safetensors` (an independent reader).
pub fn tensor_digests(path: &Path) -> std::collections::BTreeMap<String, String> {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let out = Command::new(py)
        .args(["-c", "import sys, hashlib\nfrom safetensors.numpy import load_file\nfor k, v in sorted(load_file(sys.argv[1]).items()):\n    print(k, hashlib.sha256(v.tobytes()).hexdigest())", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Writes a config as `dir/{name}.yaml` and returns its path.
pub fn write_yaml(dir: &Path, name: &str, yaml: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path.to_str().unwrap().to_string()
}

/// The `epoch` of every line of a scDINO-style `log.txt`, in order: once per epoch when a run
/// resumed instead of restarting.
pub fn logged_epochs(log_txt: &Path) -> Vec<u64> {
    std::fs::read_to_string(log_txt)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["epoch"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

/// Waits (up to `limit`) until `file` exists, sends `signal` (e.g. "-TERM") to `child`, and
/// returns what it wrote and its exit status: how the tests stop a run at a known point.
pub fn signal_once_exists(
    child: std::process::Child,
    file: &Path,
    signal: &str,
    limit: std::time::Duration,
) -> Output {
    let start = std::time::Instant::now();
    while !file.exists() {
        assert!(start.elapsed() < limit, "{} never appeared", file.display());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    child.wait_with_output().unwrap()
}
