//! What an image says about itself: the OCI annotation keys (as labels, which is where the
//! Docker Engine keeps them) plus the versions that decide whether it runs on a cluster
//! (torch, the CUDA runtime, NCCL, the EFA installer) and the digest of the baked run config.
//! Every value is derived from the build inputs; none comes from the environment, so nothing
//! secret can land in a label (a git remote's `user:token@` is stripped).
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

pub const REVISION: &str = "org.opencontainers.image.revision";
pub const CREATED: &str = "org.opencontainers.image.created";
pub const SOURCE: &str = "org.opencontainers.image.source";
pub const VERSION: &str = "org.opencontainers.image.version";
pub const TITLE: &str = "org.opencontainers.image.title";
pub const TORCH: &str = "org.scdino.torch.version";
pub const CUDA: &str = "org.scdino.cuda.version";
pub const NCCL: &str = "org.scdino.nccl.version";
pub const EFA: &str = "org.scdino.efa-installer.version";
pub const BINARIES: &str = "org.scdino.binaries";
pub const BASE: &str = "org.scdino.base-image";

/// The `ARG NAME=DEFAULT` lines of a Containerfile, with `${OTHER}` references to earlier
/// ARGs expanded (enough for `CUDA_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-…`).
pub fn arg_defaults(containerfile: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for line in containerfile.lines() {
        let Some(rest) = line.trim().strip_prefix("ARG ") else {
            continue;
        };
        if let Some((k, v)) = rest.trim().split_once('=') {
            let v = expand(v.trim().trim_matches('"'), &out);
            out.entry(k.trim().to_string()).or_insert(v);
        }
    }
    out
}

fn expand(v: &str, vars: &BTreeMap<String, String>) -> String {
    let mut s = v.to_string();
    for (k, val) in vars {
        s = s
            .replace(&format!("${{{k}}}"), val)
            .replace(&format!("${k}"), val);
    }
    s
}

/// Versions of the Python wheels libtorch comes from, read from a venv's `*.dist-info` names.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WheelVersions {
    pub torch: Option<String>,
    pub cuda_runtime: Option<String>,
    pub nccl: Option<String>,
}

pub fn wheel_versions(venv: &Path) -> WheelVersions {
    let mut v = WheelVersions::default();
    let Ok(lib) = std::fs::read_dir(venv.join("lib")) else {
        return v;
    };
    for py in lib.flatten() {
        let Ok(site) = std::fs::read_dir(py.path().join("site-packages")) else {
            continue;
        };
        for e in site.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(stem) = name.strip_suffix(".dist-info") else {
                continue;
            };
            let Some((pkg, ver)) = stem.rsplit_once('-') else {
                continue;
            };
            let slot = match pkg {
                "torch" => &mut v.torch,
                p if p.starts_with("nvidia_cuda_runtime") => &mut v.cuda_runtime,
                p if p.starts_with("nvidia_nccl") => &mut v.nccl,
                _ => continue,
            };
            *slot = Some(ver.to_string());
        }
    }
    v
}

/// The `torch==X` pin of a requirements file: what a source build installs.
pub fn torch_pin(requirements: &str) -> Option<String> {
    requirements
        .lines()
        .find_map(|l| l.trim().strip_prefix("torch=="))
        .map(|v| v.trim().to_string())
}

/// `git rev-parse HEAD` (+ `-dirty` when the tree has changes) of `dir`; `None` outside git.
pub fn git_revision(dir: &Path) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let rev = String::from_utf8(out.stdout).ok()?.trim().to_string();
    let dirty = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    Some(if dirty { format!("{rev}-dirty") } else { rev })
}

/// The `origin` remote of `dir` without any `user[:password]@` part.
pub fn git_source(dir: &Path) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["remote", "get-url", "origin"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let url = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!url.is_empty()).then(|| strip_userinfo(&url))
}

pub fn strip_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (auth, path) = rest.split_once('/').unwrap_or((rest, ""));
            let host = auth.rsplit_once('@').map_or(auth, |(_, h)| h);
            if path.is_empty() && !rest.contains('/') {
                format!("{scheme}://{host}")
            } else {
                format!("{scheme}://{host}/{path}")
            }
        }
        None => url.to_string(),
    }
}

/// RFC 3339 UTC for `secs` since the epoch (`SOURCE_DATE_EPOCH` makes builds reproducible).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = scdino_base::log::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub fn now_or_source_date_epoch() -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        })
}

/// The CUDA version in a `nvidia/cuda:13.0.1-runtime-…` reference, if it is one.
pub fn cuda_of_base(image: &str) -> Option<String> {
    let (_, tag) = image.rsplit_once("cuda:")?;
    let v: String = tag
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    (!v.is_empty()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_defaults_expand_earlier_args() {
        let f = "ARG CUDA_VERSION=13.0.1\nARG CUDA_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04\nFROM x\n  ARG EFA_INSTALLER_VERSION=1.47.0\nARG NOVALUE\n";
        let a = arg_defaults(f);
        assert_eq!(a["CUDA_IMAGE"], "nvidia/cuda:13.0.1-runtime-ubuntu24.04");
        assert_eq!(a["EFA_INSTALLER_VERSION"], "1.47.0");
        assert!(!a.contains_key("NOVALUE"));
        assert_eq!(cuda_of_base(&a["CUDA_IMAGE"]).as_deref(), Some("13.0.1"));
        assert_eq!(cuda_of_base("scdino-base:bookworm"), None);
    }

    #[test]
    fn dates_and_urls() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_568_461), "2026-11-25T01:01:01Z");
        assert_eq!(
            strip_userinfo("https://user:ghp_secret@github.com/org/scdino.git"),
            "https://github.com/org/scdino.git"
        );
        assert_eq!(
            strip_userinfo("git@github.com:org/scdino.git"),
            "git@github.com:org/scdino.git"
        );
        assert_eq!(
            torch_pin("# x\ntorch==2.13.0\nnumpy==2\n").as_deref(),
            Some("2.13.0")
        );
    }
}
