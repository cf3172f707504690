//! YAML key → line lookup, shared with the launcher through the `yaml-locate` crate.
pub use yaml_locate::KeyLines;
