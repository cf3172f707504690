//! Shared helpers: the venv's Python (the oracle) and comparisons.
use std::path::PathBuf;
use std::process::Command;

/// The venv python holding torch, numpy and tifffile (`SCDINO_PYTHON` overrides).
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SCDINO_PYTHON") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup.sh (the oracles need the project venv)",
        p.display()
    );
    p
}

/// Directory of the Python oracle scripts.
pub fn py_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py")
}

fn run(mut cmd: Command, what: &str) -> String {
    cmd.env("PYTHONPATH", py_dir());
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start python for {what}: {e}"));
    assert!(
        out.status.success(),
        "python {what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("python printed non-UTF-8")
}

/// Runs a Python snippet with arguments (`sys.argv[1:]`), returning its stdout.
pub fn run_python(script: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(python());
    cmd.arg("-c").arg(script).args(args);
    run(cmd, "snippet")
}

/// Runs `tests/py/<name>` with arguments, returning its stdout.
pub fn run_py_file(name: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(python());
    cmd.arg(py_dir().join(name)).args(args);
    run(cmd, name)
}

/// Largest absolute difference between two tensors of the same shape.
pub fn max_abs_diff(a: &tch::Tensor, b: &tch::Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shape mismatch");
    (a - b).abs().max().double_value(&[])
}

/// libtorch's default generator is process-wide and the tests of this binary run in parallel
/// threads: a test that needs reproducible draws (drop path, initialisation) holds this lock
/// so no other test draws in between, which only works if every test that draws (random
/// tensors, building a model, even one whose weights are loaded afterwards) holds it too.
pub fn torch_rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
