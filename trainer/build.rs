//! Embeds an rpath to the venv's `torch/lib` so `trainer` runs without LD_LIBRARY_PATH.
//!
//! torch-sys passes its rpath only to the C++ wrapper's compile step, never to the final link
//! (platform-notes §3.1), and `rustc-link-arg` does not propagate to dependents, so every
//! package producing a libtorch-linked executable needs this.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PYTHON");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    let lib_dir = match std::env::var("LIBTORCH") {
        Ok(root) => format!("{root}/lib"),
        Err(_) => {
            let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
            let out = Command::new(&python)
                .args([
                    "-c",
                    "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))",
                ])
                .output()
                .unwrap_or_else(|e| panic!("cannot run {python} to locate torch: {e}"));
            assert!(
                out.status.success(),
                "{python} cannot import torch; run scripts/setup.sh first:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout)
                .expect("torch path is not UTF-8")
                .trim()
                .to_string()
        }
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
}
