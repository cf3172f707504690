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
