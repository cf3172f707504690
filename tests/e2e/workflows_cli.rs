//! The CI files shipped for users' repositories (.github/workflows/image.yml, the GitLab
//! example ci/gitlab-image.yml): linted by actionlint and zizmor (scripts/test.sh installs
//! both), and building the image with the same `launcher image build … --push` the tests
//! run, whose flags the launcher takes.
use super::util::{bin, text};
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `launcher image build` line of a CI file.
fn build_line(file: &str) -> String {
    std::fs::read_to_string(root().join(file))
        .unwrap()
        .lines()
        .find(|l| l.contains("launcher image build") && !l.trim_start().starts_with('#'))
        .unwrap_or_else(|| panic!("{file} does not build the image with the launcher"))
        .trim()
        .to_string()
}

#[test]
fn shipped_ci_files_lint_clean_and_build_with_the_launcher() {
    let workflow = root().join(".github/workflows/image.yml");
    let lint = Command::new("node")
        .arg(root().join("scripts/actionlint.cjs"))
        .arg(&workflow)
        .output()
        .expect("node (scripts/test.sh installs it)");
    let out = text(&lint.stdout) + &text(&lint.stderr);
    assert!(lint.status.success(), "actionlint:\n{out}");
    assert!(
        out.contains("Checking 1 workflow file(s)") && out.contains("passed"),
        "{out}"
    );

    let venv = root().join(".venv/bin/zizmor");
    let audit = Command::new(&venv)
        .args(["--offline", "--no-progress"])
        .arg(root().join(".github/workflows"))
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup.sh installs it)", venv.display()));
    let out = text(&audit.stdout) + &text(&audit.stderr);
    assert!(audit.status.success(), "zizmor:\n{out}");
    assert!(out.contains("No findings"), "{out}");

    // The GitLab example is YAML with the job, and both files push with the launcher.
    let py = root().join(".venv/bin/python");
    let parsed = Command::new(py)
        .args(["-c", "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); print(' '.join(d['build-image']['script']))"])
        .arg(root().join("ci/gitlab-image.yml"))
        .output()
        .unwrap();
    assert!(parsed.status.success(), "{}", text(&parsed.stderr));
    assert!(text(&parsed.stdout).contains("launcher image build"));
    let help = text(
        &Command::new(bin("launcher"))
            .args(["image", "build", "--help"])
            .output()
            .unwrap()
            .stdout,
    );
    for file in [".github/workflows/image.yml", "ci/gitlab-image.yml"] {
        let line = build_line(file);
        for flag in ["--tag", "--config", "--push"] {
            assert!(line.contains(flag), "{file}: {line}");
            assert!(help.contains(flag), "launcher image build has no {flag}");
        }
    }
}
