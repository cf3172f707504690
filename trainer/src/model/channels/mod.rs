//! `model.channels` as one type per mode: each value of [`ChannelMode`] is a
//! [`ChannelModeKind`] in its own file (`fixed.rs`, `bag.rs`, `tokens.rs`), registered once in
//! [`KINDS`]. The model's backbone, the training step's items and channel subsets, the FLOP
//! count, the features and attention maps of the analyses, the export and the checkpoint's
//! record all ask the mode; docs/architecture.md lists where a new mode goes.
mod bag;
mod bag_items;
mod fixed;
mod hierarchical;
mod kind;
mod tokens;

pub use bag::bag_cls;
pub use bag_items::BagOfChannels;
pub use hierarchical::{expected_channels, hierarchical_sample};
pub use kind::{cls_attention_maps, ChannelModeKind, CombinationInput};

use crate::config::ChannelMode;

/// Every mode, one per value of [`ChannelMode`].
const KINDS: &[&dyn ChannelModeKind] = &[&fixed::Fixed, &bag::Bag, &tokens::Tokens];

/// Every mode's config value, in registry order (what a command offers as choices).
pub fn all_modes() -> &'static [ChannelMode] {
    static MODES: std::sync::LazyLock<Vec<ChannelMode>> =
        std::sync::LazyLock::new(|| KINDS.iter().map(|k| k.mode()).collect());
    &MODES
}

/// The mode `mode` names.
pub fn for_mode(mode: ChannelMode) -> &'static dyn ChannelModeKind {
    *KINDS
        .iter()
        .find(|k| k.mode() == mode)
        .expect("every channel mode is registered in KINDS")
}

/// The key of a checkpoint fingerprint that records the mode ([`ChannelModeKind::record`]).
pub const RECORD_KEY: &str = "model_channels";

/// Adds `mode`'s record to a checkpoint fingerprint (nothing for a mode that records none).
pub fn write_record(fingerprint: &mut serde_json::Value, mode: ChannelMode) {
    if let Some(record) = for_mode(mode).record() {
        fingerprint[RECORD_KEY] = record.into();
    }
}

/// The mode a fingerprint's record (`fingerprint[RECORD_KEY]`, `value` here) names; no record
/// is `fixed` (checkpoints written before the key existed, and every `fixed` one).
pub fn read_record(value: Option<&serde_json::Value>) -> Result<ChannelMode, serde_json::Error> {
    match value {
        None => Ok(ChannelMode::Fixed),
        Some(v) => serde_json::from_value(v.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every config value has its kind, and what it records reads back as it.
    #[test]
    fn every_mode_is_registered_and_its_record_reads_back() {
        // Every value the config accepts (serde's variants), each with its kind.
        for name in ["fixed", "bag", "tokens"] {
            let mode: ChannelMode = serde_json::from_value(name.into()).unwrap();
            assert!(all_modes().contains(&mode), "{name} is not registered");
            let kind = for_mode(mode);
            assert_eq!(kind.mode(), mode);
            let mut fp = serde_json::json!({});
            write_record(&mut fp, mode);
            assert_eq!(read_record(fp.get(RECORD_KEY)).unwrap(), mode);
        }
        assert_eq!(KINDS.len(), 3, "one kind per mode");
        assert_eq!(all_modes().len(), KINDS.len());
    }
}
