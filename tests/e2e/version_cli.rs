//! `trainer --version` names the libtorch it runs on and the CUDA and NCCL behind it: the GPU
//! image is checked with it on a machine without a driver (scripts/gpu-image.sh).
use super::util::{ok, run, text};

/// The torch pin of scripts/requirements.txt, which the venv and so both builds use.
fn torch_pin() -> String {
    let req = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/requirements.txt"
    ))
    .expect("scripts/requirements.txt");
    req.lines()
        .find_map(|l| l.strip_prefix("torch=="))
        .expect("a torch== pin")
        .trim()
        .to_string()
}

/// Whether `text` has `word` followed by a digit (a version, not "none").
fn names_version(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        text[i + word.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

#[test]
fn cpu_build_names_torch_and_says_it_has_no_cuda_or_nccl() {
    let v = ok("trainer", &["--version"]);
    assert!(
        v.starts_with("trainer ") && v.contains(&format!("torch {}", torch_pin())),
        "{v}"
    );
    assert!(v.contains("CUDA none") && v.contains("NCCL none"), "{v}");
}

/// `scripts/test.sh` builds `trainer-nccl` on every run; its versions come from libtorch_cuda
/// with no GPU or driver present.
#[test]
fn nccl_build_names_torch_cuda_cudnn_and_nccl() {
    let o = run("trainer-nccl", &["--version"]);
    let v = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(v.contains(&format!("torch {}", torch_pin())), "{v}");
    for word in ["CUDA ", "cuDNN ", "NCCL "] {
        assert!(names_version(&v, word), "no {word}version in: {v}");
    }
    assert!(v.contains("(nccl feature)"), "{v}");
}
