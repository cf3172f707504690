//! Files: durable replacement (the trainer's own, from `scdino-base`) and digests.
pub use scdino_base::fs::{sync_dir, write_atomic};

/// Lower-case hex of bytes (digests as registries, labels and markers write them).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::digest(bytes))
}
