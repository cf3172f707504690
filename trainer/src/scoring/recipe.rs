//! The recipe of `trainer metrics profile`: which steps, with which parameters, as a small
//! strict YAML file (an unknown or misspelt key is an error naming the file and the key, so a
//! typo cannot silently fall back to a default). Every key is optional: an empty file, or no
//! file, is the JUMP recipe (docs/scoring.md, "From single cells to a screen's answer").
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::consensus::Operation;
use super::map::PairRules;
use super::normalize::{Method, SpherizeMethod};
use super::select;
use super::ScoringError;

/// The whole recipe, as written (defaults filled in by serde) and as echoed in the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Recipe {
    /// The column naming what was done to a well (the replicate groups of the mAP).
    pub perturbation: String,
    /// The plate column (replicates are sought on other plates; mAP is shown per plate).
    pub plate: String,
    /// The negative-control wells, `COLUMN == VALUE`.
    pub negcon: String,
    pub aggregate: AggregateStep,
    pub normalize: NormalizeStep,
    pub feature_select: SelectStep,
    /// Absent (the default): not sphered.
    pub spherize: Option<SpherizeStep>,
    pub map: MapStep,
}

impl Default for Recipe {
    fn default() -> Self {
        Self {
            perturbation: "Metadata_perturbation".into(),
            plate: "Metadata_Plate".into(),
            negcon: "Metadata_control_type == negcon".into(),
            aggregate: AggregateStep::default(),
            normalize: NormalizeStep::default(),
            feature_select: SelectStep::default(),
            spherize: None,
            map: MapStep::default(),
        }
    }
}

/// pycytominer `aggregate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AggregateStep {
    pub strata: Vec<String>,
    pub operation: Operation,
    /// Feature columns; absent: every float column not named `Metadata_*`.
    pub features: Option<Vec<String>>,
    /// Metadata carried per well; absent: the perturbation and negcon columns.
    pub keep: Option<Vec<String>>,
}

impl Default for AggregateStep {
    fn default() -> Self {
        Self {
            strata: vec!["Metadata_Plate".into(), "Metadata_Well".into()],
            operation: Operation::Median,
            features: None,
            keep: None,
        }
    }
}

/// pycytominer `normalize`, fitted per group of `by` on the `samples` rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NormalizeStep {
    pub method: Method,
    pub by: Vec<String>,
    /// `negcon` (the recipe's negative controls), `all`, or `COLUMN == VALUE`.
    pub samples: String,
    pub mad_robustize_epsilon: f64,
}

impl Default for NormalizeStep {
    fn default() -> Self {
        Self {
            method: Method::MadRobustize,
            by: vec!["Metadata_Plate".into()],
            samples: "negcon".into(),
            mad_robustize_epsilon: 1e-18,
        }
    }
}

/// pycytominer `feature_select`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SelectStep {
    pub operations: Vec<select::Operation>,
    pub min_variance: f64,
    pub freq_cut: f64,
    pub unique_cut: f64,
    pub corr_threshold: f64,
    pub na_cutoff: f64,
    /// pycytominer's blocklist CSV (a `blocklist` column); relative to the recipe file.
    pub blocklist: Option<String>,
}

impl Default for SelectStep {
    fn default() -> Self {
        Self {
            // JUMP's `featselect`: its variance test (freq_cut/unique_cut) is what
            // pycytominer 1.7 calls `frequency_threshold`.
            operations: vec![
                select::Operation::FrequencyThreshold,
                select::Operation::CorrelationThreshold,
                select::Operation::DropNaColumns,
            ],
            min_variance: 1e-6,
            freq_cut: 0.05,
            unique_cut: 0.01,
            corr_threshold: 0.9,
            na_cutoff: 0.05,
            blocklist: None,
        }
    }
}

/// pycytominer `normalize(method="spherize")`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpherizeStep {
    pub method: SpherizeMethod,
    pub epsilon: f64,
    /// As in [`NormalizeStep::samples`].
    pub samples: String,
    /// Fitted per group of these columns; empty (the default): once over the screen.
    pub by: Vec<String>,
}

impl Default for SpherizeStep {
    fn default() -> Self {
        Self {
            method: SpherizeMethod::ZcaCor,
            epsilon: 1e-6,
            samples: "negcon".into(),
            by: vec![],
        }
    }
}

/// The two mAP questions and copairs' null settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MapStep {
    /// Does a perturbation's well find its replicates on the other plates?
    pub replicate: Task,
    /// Does a perturbation's well stand out from the negative controls?
    pub activity: Task,
    pub null_size: usize,
    pub threshold: f64,
    pub seed: u64,
}

impl Default for MapStep {
    fn default() -> Self {
        Self {
            replicate: Task::default(),
            activity: Task::default(),
            null_size: 10_000,
            threshold: 0.05,
            seed: 0,
        }
    }
}

/// One mAP task; a column list left out takes the task's default (docs/scoring.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Task {
    pub enabled: bool,
    pub pos_sameby: Option<Vec<String>>,
    pub pos_diffby: Option<Vec<String>>,
    pub neg_sameby: Option<Vec<String>>,
    pub neg_diffby: Option<Vec<String>>,
}

impl Default for Task {
    fn default() -> Self {
        Self {
            enabled: true,
            pos_sameby: None,
            pos_diffby: None,
            neg_sameby: None,
            neg_diffby: None,
        }
    }
}

/// The reference index column copairs' `assign_reference_index` adds.
pub const REFERENCE_INDEX: &str = "Metadata_Reference_Index";

impl Recipe {
    /// Reads a recipe file (empty: every default), refusing unknown keys and bad values.
    pub fn read(path: &Path) -> Result<Self, ScoringError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScoringError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let recipe = if text.trim().is_empty() {
            Self::default()
        } else {
            serde_saphyr::from_str::<Self>(&text).map_err(|e| ScoringError::Invalid {
                path: path.to_path_buf(),
                what: format!("not a profiling recipe: {e}"),
            })?
        };
        recipe.check().map_err(|what| ScoringError::Invalid {
            path: path.to_path_buf(),
            what,
        })?;
        Ok(recipe)
    }

    /// Values serde cannot refuse: selections, empty lists, probabilities.
    pub fn check(&self) -> Result<(), String> {
        self.negcon_selection()?;
        self.samples(&self.normalize.samples, "normalize.samples")?;
        if let Some(s) = &self.spherize {
            self.samples(&s.samples, "spherize.samples")?;
        }
        if self.aggregate.strata.is_empty() {
            return Err("aggregate.strata: at least one column".into());
        }
        if self.map.null_size == 0 {
            return Err("map.null_size: at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.map.threshold) {
            return Err(format!(
                "map.threshold: {} is not a probability",
                self.map.threshold
            ));
        }
        Ok(())
    }

    /// The negative controls as `(column, value)`.
    pub fn negcon_selection(&self) -> Result<(String, String), String> {
        parse_selection(&self.negcon).map_err(|e| format!("negcon: {e}"))
    }

    /// A `samples` value as the rows to fit on: `None` = every row.
    pub fn samples(&self, value: &str, key: &str) -> Result<Option<(String, String)>, String> {
        match value.trim() {
            "all" => Ok(None),
            "negcon" => self.negcon_selection().map(Some),
            other => parse_selection(other)
                .map(Some)
                .map_err(|e| format!("{key}: {e} (or `negcon`, or `all`)")),
        }
    }

    /// The columns carried through aggregation.
    pub fn keep(&self) -> Vec<String> {
        self.aggregate.keep.clone().unwrap_or_else(|| {
            let mut v = vec![self.perturbation.clone()];
            if let Ok((c, _)) = self.negcon_selection() {
                if c != self.perturbation {
                    v.push(c);
                }
            }
            v
        })
    }

    /// Replicate retrieval across plates: same perturbation on another plate is a positive,
    /// another perturbation a negative.
    pub fn replicate_rules(&self) -> PairRules {
        let t = &self.map.replicate;
        let p = vec![self.perturbation.clone()];
        PairRules {
            pos_sameby: t.pos_sameby.clone().unwrap_or_else(|| p.clone()),
            pos_diffby: t
                .pos_diffby
                .clone()
                .unwrap_or_else(|| vec![self.plate.clone()]),
            neg_sameby: t.neg_sameby.clone().unwrap_or_default(),
            neg_diffby: t.neg_diffby.clone().unwrap_or(p),
        }
    }

    /// Phenotypic activity (copairs' recipe): a perturbation's wells are each other's
    /// positives, the negative controls (each its own reference index) the negatives.
    pub fn activity_rules(&self) -> PairRules {
        let t = &self.map.activity;
        let p = vec![self.perturbation.clone(), REFERENCE_INDEX.into()];
        PairRules {
            pos_sameby: t.pos_sameby.clone().unwrap_or_else(|| p.clone()),
            pos_diffby: t.pos_diffby.clone().unwrap_or_default(),
            neg_sameby: t.neg_sameby.clone().unwrap_or_default(),
            neg_diffby: t.neg_diffby.clone().unwrap_or(p),
        }
    }
}

/// `COLUMN == VALUE` (the value optionally in single or double quotes) as `(column, value)`.
pub fn parse_selection(text: &str) -> Result<(String, String), String> {
    let (c, v) = text
        .split_once("==")
        .ok_or_else(|| format!("`{text}` is not `COLUMN == VALUE`"))?;
    let c = c.trim();
    let v = v.trim();
    let v = v
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .or_else(|| v.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
        .unwrap_or(v);
    if c.is_empty() || v.is_empty() || c.contains(char::is_whitespace) {
        return Err(format!("`{text}` is not `COLUMN == VALUE`"));
    }
    Ok((c.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_jump_recipe() {
        let r = Recipe::default();
        assert_eq!(r.aggregate.strata, ["Metadata_Plate", "Metadata_Well"]);
        assert_eq!(r.aggregate.operation, Operation::Median);
        assert_eq!(r.normalize.method, Method::MadRobustize);
        assert_eq!(r.normalize.by, ["Metadata_Plate"]);
        assert_eq!(
            r.samples(&r.normalize.samples, "x").unwrap(),
            Some(("Metadata_control_type".into(), "negcon".into()))
        );
        assert_eq!(
            r.feature_select.operations,
            [
                select::Operation::FrequencyThreshold,
                select::Operation::CorrelationThreshold,
                select::Operation::DropNaColumns
            ]
        );
        assert_eq!(
            (r.feature_select.freq_cut, r.feature_select.unique_cut),
            (0.05, 0.01)
        );
        assert_eq!(r.feature_select.corr_threshold, 0.9);
        assert!(r.spherize.is_none());
        assert_eq!(
            (r.map.null_size, r.map.threshold, r.map.seed),
            (10_000, 0.05, 0)
        );
        assert_eq!(r.keep(), ["Metadata_perturbation", "Metadata_control_type"]);
        let rep = r.replicate_rules();
        assert_eq!(rep.pos_diffby, ["Metadata_Plate"]);
        assert_eq!(
            r.activity_rules().neg_diffby,
            ["Metadata_perturbation", REFERENCE_INDEX]
        );
    }

    #[test]
    fn yaml_is_strict_and_partial() {
        let r: Recipe = serde_saphyr::from_str(
            "perturbation: Metadata_cpd\nnormalize: {samples: all}\nspherize: {}\nfeature_select:\n  operations: [variance_threshold, blocklist]\n",
        )
        .unwrap();
        assert_eq!(r.perturbation, "Metadata_cpd");
        assert_eq!(r.normalize.samples, "all");
        assert_eq!(r.normalize.method, Method::MadRobustize);
        assert_eq!(r.spherize, Some(SpherizeStep::default()));
        assert_eq!(r.feature_select.operations.len(), 2);
        assert!(serde_saphyr::from_str::<Recipe>("normalise: {}\n").is_err());
        assert!(serde_saphyr::from_str::<Recipe>("normalize: {method: mad}\n").is_err());
        assert_eq!(
            parse_selection(" Metadata_x == 'neg con' ").unwrap(),
            ("Metadata_x".into(), "neg con".into())
        );
        assert!(parse_selection("Metadata_x = a").is_err());
    }
}
