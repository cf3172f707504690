//! `trainer metrics`: the profiling field's scores on any profile table (see
//! `trainer::scoring` and docs/scoring.md).
use anyhow::Result;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use trainer::scoring::map::{self, MapOptions, PairRules};
use trainer::scoring::nn::Metric;
use trainer::scoring::normalize::{self, Method, NormalizeOptions, SpherizeMethod};
use trainer::scoring::recipe::Recipe;
use trainer::scoring::table::{split_columns, write_profiles};
use trainer::scoring::{aggregate, chammi, consensus, profile, select, summary, ProfileTable};

#[derive(Debug, Subcommand)]
pub enum MetricsCommand {
    /// copairs average precision per profile and mean average precision per group.
    Map(MapArgs),
    /// How much a batch column drives the embedding (scib, CHAMMI leave-one-group-out).
    Batch(BatchArgs),
    /// pycytominer's normalisations, written as a new profile table.
    Normalize(NormalizeArgs),
    /// The CHAMMI benchmark score.
    Chammi(ChammiArgs),
    /// pycytominer's consensus: one profile per replicate group (median or mean).
    Consensus(ConsensusArgs),
    /// pycytominer's feature_select: the table without the features it excludes.
    Select(SelectArgs),
    /// pycytominer's aggregate: single cells to one profile per well (streamed).
    Aggregate(AggregateArgs),
    /// The profiling recipe in one run: aggregate, normalize, select, (spherize), mAP.
    Profile(ProfileArgs),
}

impl MetricsCommand {
    /// The table the command reads.
    fn profiles(&self) -> &Path {
        match self {
            MetricsCommand::Map(a) => &a.profiles,
            MetricsCommand::Batch(a) => &a.profiles,
            MetricsCommand::Normalize(a) => &a.profiles,
            MetricsCommand::Chammi(a) => &a.profiles,
            MetricsCommand::Consensus(a) => &a.profiles,
            MetricsCommand::Select(a) => &a.profiles,
            MetricsCommand::Aggregate(a) => &a.profiles,
            MetricsCommand::Profile(a) => &a.profiles,
        }
    }

    /// Runs the command; a panic (a bug: bad input is an error) becomes an error naming the
    /// table, so a user learns which file triggered it and the exit is an ordinary failure.
    pub fn run(self) -> Result<()> {
        let path = self.profiles().to_path_buf();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.dispatch())).unwrap_or_else(
            |payload| {
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(anyhow::anyhow!(
                    "{}: internal error while scoring this table (please report it): {what}",
                    path.display()
                ))
            },
        )
    }

    fn dispatch(self) -> Result<()> {
        match self {
            MetricsCommand::Map(a) => a.run(),
            MetricsCommand::Batch(a) => a.run(),
            MetricsCommand::Normalize(a) => a.run(),
            MetricsCommand::Chammi(a) => a.run(),
            MetricsCommand::Consensus(a) => a.run(),
            MetricsCommand::Select(a) => a.run(),
            MetricsCommand::Aggregate(a) => a.run(),
            MetricsCommand::Profile(a) => a.run(),
        }
    }
}

fn cols(v: &Option<String>) -> Vec<String> {
    v.as_deref().map(split_columns).unwrap_or_default()
}

/// Writes `value` as pretty JSON at `path` (atomically) and prints it.
fn emit_json<T: serde::Serialize>(value: &T, path: Option<&Path>) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    if let Some(p) = path {
        scdino_base::fs::write_atomic(p, text.as_bytes())?;
    }
    println!("{text}");
    Ok(())
}

/// `trainer metrics map`.
#[derive(Debug, Args)]
pub struct MapArgs {
    #[arg(long, value_name = "FILE")]
    profiles: PathBuf,
    /// Columns equal within a positive pair (comma-separated).
    #[arg(long, value_name = "COLS")]
    pos_sameby: String,
    /// Columns that must all differ within a positive pair.
    #[arg(long, value_name = "COLS")]
    pos_diffby: Option<String>,
    /// Columns equal within a negative pair.
    #[arg(long, value_name = "COLS")]
    neg_sameby: Option<String>,
    /// Columns that must all differ within a negative pair.
    #[arg(long, value_name = "COLS")]
    neg_diffby: Option<String>,
    /// `COLUMN=VALUE`: add copairs' `Metadata_Reference_Index` (row index on these rows,
    /// -1 elsewhere) for phenotypic activity against controls.
    #[arg(long, value_name = "COL=VALUE")]
    reference: Option<String>,
    /// AP per profile (Parquet).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Group columns of the mAP (default: --pos-sameby).
    #[arg(long, value_name = "COLS")]
    map_by: Option<String>,
    #[arg(long, default_value_t = 10_000)]
    null_size: usize,
    #[arg(long, default_value_t = 0.05)]
    threshold: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// mAP per group (Parquet).
    #[arg(long, value_name = "FILE")]
    map_out: Option<PathBuf>,
    /// Summary JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

impl MapArgs {
    fn run(self) -> Result<()> {
        let mut table = ProfileTable::read(&self.profiles)?;
        if let Some(r) = &self.reference {
            let (c, v) = r
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--reference {r}: expected COLUMN=VALUE"))?;
            map::assign_reference_index(&mut table, c, v)?;
        }
        let rules = PairRules {
            pos_sameby: split_columns(&self.pos_sameby),
            pos_diffby: cols(&self.pos_diffby),
            neg_sameby: cols(&self.neg_sameby),
            neg_diffby: cols(&self.neg_diffby),
        };
        let map_by = self
            .map_by
            .as_deref()
            .map(split_columns)
            .unwrap_or_else(|| rules.pos_sameby.clone());
        let opts = MapOptions {
            null_size: self.null_size,
            threshold: self.threshold,
            seed: self.seed,
        };
        let (ap, rows, summary) = summary::map_summary(&table, &rules, &map_by, opts)?;
        map::write_ap_table(&self.out, &table, &ap)?;
        if let Some(path) = &self.map_out {
            map::write_map_table(path, &map_by, &rows)?;
        }
        emit_json(&summary, self.json.as_deref())
    }
}

/// `trainer metrics batch`.
#[derive(Debug, Args)]
pub struct BatchArgs {
    #[arg(long, value_name = "FILE")]
    profiles: PathBuf,
    /// The batch column (Metadata_Donor, Metadata_Plate, ...).
    #[arg(long, default_value = "Metadata_Donor")]
    batch: String,
    /// The biological label column.
    #[arg(long, default_value = "Metadata_Class")]
    label: String,
    /// scanpy's n_neighbors (counting the row itself) for graph connectivity.
    #[arg(long, default_value_t = 15)]
    n_neighbors: usize,
    /// Seed of the shuffled-batch control.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

impl BatchArgs {
    fn run(self) -> Result<()> {
        let table = ProfileTable::read(&self.profiles)?;
        let s = summary::batch_summary(
            &table,
            &self.batch,
            &self.label,
            self.n_neighbors,
            self.seed,
        )?;
        emit_json(&s, self.json.as_deref())
    }
}

/// `trainer metrics normalize`.
#[derive(Debug, Args)]
pub struct NormalizeArgs {
    #[arg(long, value_name = "FILE")]
    profiles: PathBuf,
    #[arg(long, value_enum)]
    method: Method,
    /// Fit on these rows only (`COLUMN=VALUE`, e.g. Metadata_Condition=Control).
    #[arg(long, value_name = "COL=VALUE")]
    controls: Option<String>,
    /// Fit and apply per group of these columns (e.g. Metadata_Plate); default global.
    #[arg(long, value_name = "COLS")]
    by: Option<String>,
    #[arg(long, value_enum, default_value = "ZCA-cor")]
    spherize_method: SpherizeMethod,
    #[arg(long, default_value_t = 1e-6)]
    spherize_epsilon: f64,
    #[arg(long, default_value_t = 1e-18)]
    mad_robustize_epsilon: f64,
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

impl NormalizeArgs {
    fn run(self) -> Result<()> {
        let table = ProfileTable::read(&self.profiles)?;
        let controls = match &self.controls {
            None => None,
            Some(c) => {
                let (k, v) = c
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--controls {c}: expected COLUMN=VALUE"))?;
                Some((k.to_string(), v.to_string()))
            }
        };
        let out = normalize::normalize(
            &table,
            &NormalizeOptions {
                method: self.method,
                controls,
                by: cols(&self.by),
                spherize_method: self.spherize_method,
                spherize_epsilon: self.spherize_epsilon,
                mad_epsilon: self.mad_robustize_epsilon,
            },
        )?;
        write_profiles(&self.out, &out.meta, &out.feature_names, &out.features)?;
        tracing::info!("normalised profiles: {}", self.out.display());
        Ok(())
    }
}

/// `trainer metrics chammi`.
#[derive(Debug, Args)]
pub struct ChammiArgs {
    #[arg(long, value_name = "FILE")]
    profiles: PathBuf,
    #[arg(long, default_value = "Metadata_Dataset")]
    dataset: String,
    #[arg(long, default_value = "Metadata_Task")]
    task: String,
    #[arg(long, default_value = "Metadata_Class")]
    label: String,
    /// HPA task 3's leave-one-out groups (CHAMMI's `cell_type`).
    #[arg(long, default_value = "Metadata_cell_type")]
    hpa_group: String,
    /// CP task 4's leave-one-out groups (CHAMMI's `Plate`).
    #[arg(long, default_value = "Metadata_Plate")]
    cp_group: String,
    /// The 1-NN distance (CHAMMI's `knn_metric`).
    #[arg(long, value_enum, default_value = "cosine")]
    metric: Metric,
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

impl ChammiArgs {
    fn run(self) -> Result<()> {
        let table = ProfileTable::read(&self.profiles)?;
        let s = chammi::chammi(
            &table,
            &chammi::ChammiOptions {
                dataset: self.dataset,
                task: self.task,
                label: self.label,
                hpa_group: self.hpa_group,
                cp_group: self.cp_group,
                metric: self.metric,
            },
        )?;
        emit_json(&s, self.json.as_deref())
    }
}

/// `trainer metrics consensus`.
#[derive(Debug, Args)]
pub struct ConsensusArgs {
    #[arg(long, value_name = "FILE")]
    profiles: PathBuf,
    /// The columns whose rows are replicates of one profile (comma-separated).
    #[arg(
        long,
        value_name = "COLS",
        default_value = "Metadata_Plate,Metadata_Well"
    )]
    replicate_columns: String,
    #[arg(long, value_enum, default_value = "median")]
    operation: consensus::Operation,
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

impl ConsensusArgs {
    fn run(self) -> Result<()> {
        let table = ProfileTable::read(&self.profiles)?;
        let out = consensus::consensus(
            &table,
            &split_columns(&self.replicate_columns),
            self.operation,
        )?;
        write_profiles(&self.out, &out.meta, &out.feature_names, &out.features)?;
        tracing::info!(
            "{} consensus profiles of {} rows: {}",
            out.rows,
            table.rows,
            self.out.display()
        );
        Ok(())
    }
}

/// `trainer metrics select`.
#[derive(Debug, Args)]
pub struct SelectArgs {
    #[arg(long, value_name = "FILE")]
    profiles: PathBuf,
    /// Operations in order, comma-separated (pycytominer's `operation`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "variance_threshold"
    )]
    operations: Vec<select::Operation>,
    #[arg(long, default_value_t = 1e-6)]
    min_variance: f64,
    #[arg(long, default_value_t = 0.05)]
    freq_cut: f64,
    #[arg(long, default_value_t = 0.01)]
    unique_cut: f64,
    #[arg(long, default_value_t = 0.9)]
    corr_threshold: f64,
    #[arg(long, default_value_t = 0.05)]
    na_cutoff: f64,
    /// CSV with a `blocklist` column of feature names (the `blocklist` operation).
    #[arg(long, value_name = "FILE")]
    blocklist: Option<PathBuf>,
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

impl SelectArgs {
    fn run(self) -> Result<()> {
        let table = ProfileTable::read(&self.profiles)?;
        let blocklist = match &self.blocklist {
            Some(p) => select::read_blocklist(p)?,
            None if self.operations.contains(&select::Operation::Blocklist) => {
                anyhow::bail!("the blocklist operation needs --blocklist FILE")
            }
            None => vec![],
        };
        let kept = select::select(
            &table,
            &select::SelectOptions {
                operations: self.operations,
                min_variance: self.min_variance,
                freq_cut: self.freq_cut,
                unique_cut: self.unique_cut,
                corr_threshold: self.corr_threshold,
                na_cutoff: self.na_cutoff,
                blocklist,
            },
        )?;
        let out = select::keep_features(&table, &kept);
        write_profiles(&self.out, &out.meta, &out.feature_names, &out.features)?;
        tracing::info!(
            "kept {} of {} features: {}",
            kept.len(),
            table.dim(),
            self.out.display()
        );
        Ok(())
    }
}

/// `trainer metrics aggregate`.
#[derive(Debug, Args)]
pub struct AggregateArgs {
    /// Single-cell table (Parquet); read column by column, never whole.
    #[arg(long, value_name = "FILE")]
    profiles: PathBuf,
    /// Group-by columns (pycytominer's `strata`).
    #[arg(
        long,
        value_name = "COLS",
        default_value = "Metadata_Plate,Metadata_Well"
    )]
    strata: String,
    #[arg(long, value_enum, default_value = "median")]
    operation: consensus::Operation,
    /// Feature columns (comma-separated); default: every float column not named `Metadata_*`.
    #[arg(long, value_name = "COLS")]
    features: Option<String>,
    /// Metadata columns constant within each group, carried into the output (a plate map's
    /// perturbation and control columns).
    #[arg(long, value_name = "COLS")]
    keep: Option<String>,
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

impl AggregateArgs {
    fn run(self) -> Result<()> {
        let agg = aggregate::aggregate(
            &self.profiles,
            &aggregate::AggregateOptions {
                strata: split_columns(&self.strata),
                keep: cols(&self.keep),
                features: self.features.as_deref().map(split_columns),
                operation: self.operation,
            },
        )?;
        agg.write(&self.out)?;
        tracing::info!(
            "{} profiles of {} rows: {}",
            agg.groups(),
            agg.cells,
            self.out.display()
        );
        Ok(())
    }
}

/// `trainer metrics profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// Single-cell table (Parquet) with plate, well, perturbation and control columns.
    #[arg(long, value_name = "FILE")]
    profiles: PathBuf,
    /// The recipe (YAML, docs/scoring.md); default: the JUMP recipe.
    #[arg(long, value_name = "FILE")]
    recipe: Option<PathBuf>,
    /// Folder for the intermediate tables, AP/mAP tables, summary.json, figures, index.html.
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
}

impl ProfileArgs {
    fn run(self) -> Result<()> {
        let recipe = match &self.recipe {
            Some(p) => Recipe::read(p)?,
            None => Recipe::default(),
        };
        let s = profile::profile(
            &self.profiles,
            &recipe,
            self.recipe.as_deref(),
            &self.out_dir,
        )?;
        for (name, t) in [("replicate", &s.replicate), ("activity", &s.activity)] {
            if let Some(t) = t {
                println!(
                    "{name}: mean mAP {:.4}, fraction retrieved {:.4} of {} groups",
                    t.map.mean_map, t.map.fraction_retrieved, t.map.groups
                );
            }
        }
        println!("{}", self.out_dir.join(&s.html).display());
        Ok(())
    }
}
