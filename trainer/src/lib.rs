//! scDINO on libtorch: configuration, multi-channel TIFF data and ViT-DINO models.
#[cfg(test)]
mod alloc_count;
pub mod analysis;
pub mod augment;
pub mod checkpoint;
/// The run config lives in its own crate (no libtorch) so the launcher applies the same rules.
pub use scdino_config as config;
pub mod data;
pub mod device;
pub mod dist;
pub mod layout;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod plot;
pub mod precision;
pub mod probe;
pub mod pth;
pub mod selftest;
pub mod train;

/// Writes `line` and a newline to stderr in one `write` call. The ranks of a job share
/// stderr, and `eprintln!` writes each formatted piece separately, so another rank's output
/// could land inside a line (a checksum the tests compare, a stage the log reports).
pub fn eprint_line(line: &str) {
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), buf.as_bytes());
}
