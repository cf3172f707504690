//! Embeds an rpath to the venv's `torch/lib` so `trainer` runs without LD_LIBRARY_PATH, and
//! compiles the small C++ shim (csrc/) against the same libtorch's headers.
//!
//! torch-sys passes its rpath only to the C++ wrapper's compile step, never to the final link
//! (platform-notes §3.1), and `rustc-link-arg` does not propagate to dependents, so every
//! package producing a libtorch-linked executable needs this.
use std::path::PathBuf;
use std::process::Command;

/// `(torch package dir, C++11 ABI flag)` from the Python that has torch (`PYTHON` overrides).
fn torch_from_python() -> (PathBuf, bool) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let out = Command::new(&python)
        .args([
            "-c",
            "import torch, os; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} to locate torch: {e}"));
    assert!(
        out.status.success(),
        "{python} cannot import torch; run scripts/setup.sh first:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("torch path is not UTF-8");
    let mut lines = text.lines();
    let dir = PathBuf::from(lines.next().expect("torch dir").trim());
    let abi = lines.next().map(str::trim) == Some("1");
    (dir, abi)
}

fn main() {
    println!("cargo:rerun-if-env-changed=PYTHON");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc");
    let (torch_dir, abi) = match std::env::var("LIBTORCH") {
        Ok(root) => (PathBuf::from(root), true),
        Err(_) => torch_from_python(),
    };
    let lib_dir = torch_dir.join("lib");
    let include = torch_dir.join("include");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .opt_level(2)
        .std("c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", if abi { "1" } else { "0" })
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include("csrc/gloo_stub")
        .define("USE_C10D_GLOO", None)
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(false)
        .file("csrc/shim.cpp")
        .file("csrc/c10d.cpp")
        .compile("scdino_shim");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
}
