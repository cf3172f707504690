//! `trainer data pack`: the dataset as WebDataset-style tar shards plus an index.
use anyhow::{bail, Context, Result};
use clap::Args;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::Instant;
use trainer::config::DatasetLocation;
use trainer::data::object_store::Remote;
use trainer::data::open_source;
use trainer::data::shards::{pack, upload, PackEvent, PackOptions, UploadEvent};

#[derive(Debug, Args)]
pub struct PackArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Output directory (created; point `data.dataset_dir` at it to train from the shards),
    /// or `s3://`, `gs://` or `az://` bucket/prefix: packed into `--staging` first, then uploaded (shards, then the
    /// index last; shards already there with the same size and sha256 are skipped).
    #[arg(long)]
    out: String,
    /// With a store `--out` (s3://, gs://, az://): the local directory to pack into before uploading (kept, so a
    /// rerun resumes both the pack and the upload). Default: `trainer-pack-<hash of --out>`
    /// under the system temp dir.
    #[arg(long)]
    staging: Option<PathBuf>,
    /// Close a shard before it exceeds this size: bytes, or with a K/M/G suffix (powers of
    /// 1024). WebDataset recommends 100 MB–1 GB.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    shard_size: u64,
    /// Also close a shard after this many samples (0 = no limit).
    #[arg(long, default_value_t = 0)]
    shard_samples: usize,
    /// Seed of the pack-time shuffle that spreads classes over all shards.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep ImageFolder order in the shards (then each shard holds one or few classes, and
    /// `data.order: shard_sequential` batches would be nearly single-class).
    #[arg(long)]
    no_shuffle: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("unknown size suffix in {s:?} (use K, M or G)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 256M)"))?;
    match n.checked_mul(mult) {
        Some(v) if v > 0 => Ok(v),
        _ => Err(format!("{s:?} must be positive and below 16 EiB")),
    }
}

impl PackArgs {
    pub fn run(self) -> Result<()> {
        let cfg = self.config.load()?;
        let out: DatasetLocation = self.out.parse().context("--out")?;
        let local_out: PathBuf = match &out {
            DatasetLocation::Remote(url) => {
                if cfg.data.dataset_dir == out {
                    bail!("--out must differ from data.dataset_dir");
                }
                match &self.staging {
                    Some(d) => d.clone(),
                    None => {
                        let h = Sha256::digest(url.root().as_bytes());
                        let h: String = h[..8].iter().map(|b| format!("{b:02x}")).collect();
                        std::env::temp_dir().join(format!("trainer-pack-{h}"))
                    }
                }
            }
            DatasetLocation::Local(dir) => dir.clone(),
        };
        if let Some(src) = cfg.data.dataset_dir.local() {
            let out_abs = std::path::absolute(&local_out).unwrap_or(local_out.clone());
            let src_abs = std::path::absolute(src).unwrap_or(src.to_path_buf());
            if out_abs == src_abs {
                bail!("--out must differ from data.dataset_dir");
            }
        }
        let t0 = Instant::now();
        let source =
            open_source(&cfg.data).with_context(|| format!("opening {}", cfg.data.dataset_dir))?;
        tracing::info!(
            "packing {} into {} (shards of at most {} bytes{})",
            source.describe(),
            local_out.display(),
            self.shard_size,
            if self.shard_samples > 0 {
                format!(" / {} samples", self.shard_samples)
            } else {
                String::new()
            }
        );
        let opts = PackOptions {
            out: local_out.clone(),
            max_shard_bytes: self.shard_size,
            max_shard_samples: self.shard_samples,
            shuffle: !self.no_shuffle,
            seed: self.seed,
        };
        let mut report = |e: PackEvent| match e {
            PackEvent::Verified {
                shard,
                samples,
                bytes,
            } => {
                tracing::info!("shard {shard:6}: verified ({samples} samples, {bytes} bytes), kept")
            }
            PackEvent::Damaged { shard, reason } => {
                tracing::info!("shard {shard:6}: {reason}; rewriting from here")
            }
            PackEvent::Written {
                shard,
                samples,
                bytes,
                done,
                total,
            } => {
                let secs = t0.elapsed().as_secs_f64().max(1e-9);
                tracing::info!(
                    "shard {shard:6}: {samples} samples, {:.1} MB written [{done}/{total} images, {:.0} images/s]",
                    bytes as f64 / 1e6,
                    done as f64 / secs
                );
            }
        };
        let s = pack(
            source.as_ref(),
            cfg.data.label_folder_depth,
            &opts,
            &mut report,
        )
        .with_context(|| format!("packing into {}", local_out.display()))?;
        println!(
            "packed {} images into {} shards ({:.1} MB) in {}: {} shards written, {} verified and kept; {:.1} s, {:.0} images/s",
            s.samples,
            s.shards,
            s.bytes as f64 / 1e6,
            local_out.display(),
            s.written_shards,
            s.verified_shards,
            s.seconds,
            s.written_samples as f64 / s.seconds.max(1e-9)
        );
        if let DatasetLocation::Remote(url) = &out {
            let t1 = Instant::now();
            let remote = Remote::open(url, &cfg.data.object_store)
                .with_context(|| format!("opening {}", self.out))?;
            let mut report = |e: UploadEvent| match e {
                UploadEvent::Skipped { shard, bytes } => {
                    tracing::info!("shard {shard:6}: already in the bucket ({bytes} bytes, same sha256), skipped")
                }
                UploadEvent::Uploaded { shard, bytes } => {
                    tracing::info!("shard {shard:6}: uploaded ({:.1} MB)", bytes as f64 / 1e6)
                }
            };
            let u = upload(&local_out, &remote, &mut report)
                .with_context(|| format!("uploading {} to {}", local_out.display(), self.out))?;
            println!(
                "uploaded to {}: {} shards uploaded ({:.1} MB), {} already there; index {}; {:.1} s",
                remote.url.root(),
                u.uploaded_shards,
                u.uploaded_bytes as f64 / 1e6,
                u.skipped_shards,
                if u.index_uploaded { "uploaded" } else { "unchanged" },
                t1.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("M").is_err());
    }
}
