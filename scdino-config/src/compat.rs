//! scDINO keys this trainer accepts and does not read. They stay in the schema so that scDINO's
//! files, and what `trainer config import-scdino` writes from them, load unchanged; a file
//! that sets one is told so at load ([`crate::Config::load`]), and the reference page says so
//! next to the key, both from [`IGNORED_KEYS`], so neither can claim an effect the code lacks.
use crate::KeyLines;

/// A key that is accepted for scDINO compatibility and ignored, and what decides instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IgnoredKey {
    /// The dotted key, e.g. `train.dist_url`.
    pub key: &'static str,
    /// What takes its place, as the end of a sentence.
    pub instead: &'static str,
}

/// Every key of the run config that nothing reads.
pub const IGNORED_KEYS: [IgnoredKey; 3] = [
    IgnoredKey {
        key: "train.dist_url",
        instead: "the ranks meet where `trainer launch` or Slurm's variables say (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), as scDINO's env:// did",
    },
    IgnoredKey {
        key: "downstream.features.num_gpus",
        instead: "the features stage runs on the ranks `trainer launch` or srun start",
    },
    IgnoredKey {
        key: "downstream.features.num_workers",
        instead: "the features stage reads its images in order without worker threads (an S3 dataset is fetched ahead as `data.object_store` says)",
    },
];

/// A key that was renamed: a file that writes the old one is refused naming the new one, so a
/// setting is never dropped in silence (the schema would only say that the old key is unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenamedKey {
    /// The old dotted key, e.g. `data.s3`.
    pub old: &'static str,
    /// The key that holds the same setting now.
    pub new: &'static str,
    /// Why it was renamed, as the end of a sentence.
    pub why: &'static str,
}

/// Every renamed key of the run config.
pub const RENAMED_KEYS: [RenamedKey; 1] = [RenamedKey {
    old: "data.s3",
    new: "data.object_store",
    why: "the same settings serve s3://, gs:// and az:// datasets alike",
}];

/// The first renamed key a file writes.
pub fn renamed_key_written(lines: &KeyLines) -> Option<RenamedKey> {
    RENAMED_KEYS
        .iter()
        .find(|k| lines.written(k.old).is_some())
        .copied()
}

/// The refusal of a renamed key: what to write instead.
pub fn renamed_key_message(key: &RenamedKey) -> String {
    format!(
        "renamed to `{}` ({}): write the same keys under `{}`",
        key.new, key.why, key.new
    )
}

/// The [`IGNORED_KEYS`] a file writes, with their lines (a key left at its default is not
/// the user's choice and is not listed).
pub fn ignored_keys_written(lines: &KeyLines) -> Vec<(IgnoredKey, usize)> {
    IGNORED_KEYS
        .iter()
        .filter_map(|k| lines.written(k.key).map(|line| (*k, line)))
        .collect()
}

/// The load-time notice for one ignored key of `origin`.
pub fn ignored_key_notice(origin: &str, key: &IgnoredKey, line: usize) -> String {
    format!(
        "{origin}:{line}: `{}` is accepted for scDINO compatibility and ignored: {}",
        key.key, key.instead
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_the_file_writes_are_reported_with_their_lines() {
        let text = "train:\n  epochs: 3\n  dist_url: tcp://h:1\ndownstream:\n  features: {num_workers: 4}\n";
        let found = ignored_keys_written(&KeyLines::scan(text));
        let keys: Vec<(&str, usize)> = found.iter().map(|(k, l)| (k.key, *l)).collect();
        assert_eq!(
            keys,
            [
                ("train.dist_url", 3),
                ("downstream.features.num_workers", 5)
            ]
        );
        // Defaults, and a section written without the key, are not the user's choice.
        assert!(ignored_keys_written(&KeyLines::scan("")).is_empty());
        assert!(ignored_keys_written(&KeyLines::scan(
            "downstream:\n  features:\n    normalize: true\n"
        ))
        .is_empty());
        let notice = ignored_key_notice("c.yaml", &found[0].0, found[0].1);
        assert!(
            notice.starts_with(
                "c.yaml:3: `train.dist_url` is accepted for scDINO compatibility and ignored: "
            ),
            "{notice}"
        );
    }

    /// Every listed key exists in the schema (a renamed field would leave a dead entry).
    #[test]
    fn every_ignored_key_is_a_key_of_the_schema() {
        let defaults = serde_json::to_value(crate::Sections::default()).unwrap();
        for k in IGNORED_KEYS {
            let v = k.key.split('.').fold(&defaults, |v, part| &v[part]);
            assert!(!v.is_null(), "{} is not a key of the run config", k.key);
        }
    }

    /// A renamed key's new name is a key of the schema and its old one is not (else the old
    /// one would be refused while the schema still reads it).
    #[test]
    fn renamed_keys_point_from_a_dead_key_to_a_live_one() {
        let defaults = serde_json::to_value(crate::Sections::default()).unwrap();
        let at = |key: &str| key.split('.').fold(&defaults, |v, part| &v[part]).clone();
        for k in RENAMED_KEYS {
            assert!(
                !at(k.new).is_null(),
                "{} is not a key of the run config",
                k.new
            );
            assert!(
                at(k.old).is_null(),
                "{} is still a key of the run config",
                k.old
            );
        }
    }
}
