use super::util::{bin, ok};
use std::process::Command;

#[test]
fn launcher_does_not_link_libtorch() {
    let out = Command::new("ldd").arg(bin("launcher")).output().unwrap();
    let libs = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ldd failed");
    assert!(!libs.contains("torch") && !libs.contains("c10"), "{libs}");
    // The trainer, by contrast, resolves libtorch through its embedded rpath.
    let out = Command::new("ldd").arg(bin("trainer")).output().unwrap();
    let libs = String::from_utf8_lossy(&out.stdout);
    assert!(libs.contains("libtorch_cpu.so => /"), "{libs}");
    assert!(!libs.contains("not found"), "{libs}");
}

#[test]
fn launcher_quotes_like_the_generated_scripts() {
    let quoted = ok("launcher", &["quote", "--", "/fsx/my data", "it's", "$X"]);
    assert_eq!(quoted.trim_end(), r"'/fsx/my data' 'it'\''s' '$X'");
}
