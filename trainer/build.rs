//! Embeds an rpath to the venv's `torch/lib` so `trainer` runs without LD_LIBRARY_PATH, and
//! compiles the small C++ shim (csrc/) against the same libtorch's headers.
//!
//! With the `cuda` feature the shim also builds the CUDA graph entry points (csrc/cuda_graph.cpp)
//! against the CUDA headers of the pip wheels next to torch and links libtorch_cuda.
//! With the `nccl` feature (which implies `cuda`) it also builds ProcessGroupNCCL (platform-notes §4.7): it
//! needs the CUDA and NCCL headers of the pip wheels next to torch, plus two header sets those
//! wheels lack (scripts/nccl-headers.sh fetches them; `CUDA_EXTRA_INCLUDE` overrides where),
//! and links libtorch_cuda/libc10_cuda with `--no-as-needed`: nothing references them by symbol,
//! so the default `--as-needed` would drop them and libtorch would then see no GPU (§3.2).
//!
//! torch-sys passes its rpath only to the C++ wrapper's compile step, never to the final link
//! (platform-notes §3.1), and `rustc-link-arg` does not propagate to dependents, so every
//! package producing a libtorch-linked executable needs this.
use std::path::{Path, PathBuf};
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

/// Include folders for the CUDA build (with `nccl`: also NCCL's); panics with the fix when a
/// required header is missing.
fn cuda_includes(torch_dir: &Path, nccl: bool) -> Vec<PathBuf> {
    println!("cargo:rerun-if-env-changed=CUDA_EXTRA_INCLUDE");
    let site = torch_dir.parent().expect("torch lives in site-packages");
    let mut dirs = vec![
        site.join("nvidia/cu13/include"),
        site.join("nvidia/nccl/include"),
    ];
    let extra: Vec<PathBuf> = match std::env::var("CUDA_EXTRA_INCLUDE") {
        Ok(v) => std::env::split_paths(&v).collect(),
        Err(_) => {
            let d = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/cuda-extra/nvidia/cu13/include");
            vec![d.clone(), d.join("cccl")]
        }
    };
    dirs.extend(extra);
    for (header, hint) in [
        (
            "cuda_runtime.h",
            "the nvidia-cuda-runtime wheel next to torch",
        ),
        ("nccl.h", "the nvidia-nccl wheel next to torch"),
        ("crt/host_config.h", "run scripts/nccl-headers.sh"),
        ("nv/target", "run scripts/nccl-headers.sh"),
    ] {
        if header == "nccl.h" && !nccl {
            continue;
        }
        assert!(
            dirs.iter().any(|d| d.join(header).exists()),
            "--features cuda/nccl: {header} is in none of {dirs:?}; {hint} (or set CUDA_EXTRA_INCLUDE)"
        );
    }
    dirs
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
    let nccl = std::env::var_os("CARGO_FEATURE_NCCL").is_some();
    // `nccl` implies `cuda` (Cargo.toml); the CUDA graph shim needs the CUDA headers only.
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    let mut build = cc::Build::new();
    if cuda {
        for d in cuda_includes(&torch_dir, nccl) {
            build.include(d);
        }
        build.define("SCDINO_CUDA", None);
    }
    if nccl {
        build
            .define("SCDINO_NCCL", None)
            .define("USE_C10D_NCCL", None);
    }
    build
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
        .file("csrc/jit.cpp")
        .file("csrc/foreach.cpp")
        .file("csrc/cuda_graph.cpp")
        .compile("scdino_shim");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    if cuda {
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,-lc10_cuda,--as-needed");
    }
    // $ORIGIN/../lib first: in the image the binary sits in /opt/scdino/bin with libtorch and
    // its CUDA libraries staged flat into /opt/scdino/lib (scripts/stage-runtime.sh), so it
    // never depends on a path of the build machine; on the host that folder does not exist
    // and the venv's torch/lib is found next.
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/../lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
}
