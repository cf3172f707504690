//! Converts a scDINO pipeline yaml (the original `scDINO_full_pipeline.yaml` or the AWS
//! ParallelCluster port's variant) into our schema.
//!
//! Rules, so that the imported file reproduces what the scDINO run meant and did:
//! - a written value is kept, even under a misspelled key (`warump_epochs`, `techer_temp`); a
//!   note says what scDINO itself used instead, since it ignored such keys;
//! - a key absent from the scDINO yaml takes scDINO's argparse default, because that is what
//!   scDINO trained with (notably the crop scales missing from the AWS yaml);
//! - every key that has no place in our schema is reported, never dropped silently.
use super::sections::*;
use super::{Config, ConfigError};
use serde_json::{Map, Value};

mod reader;
use reader::{channel_combinations, channel_names, compact, take, Importer};

/// The result of an import: our YAML plus what the user should read.
#[derive(Debug)]
pub struct Imported {
    pub config: Config,
    /// Behaviour differences and choices made, one sentence each.
    pub notes: Vec<String>,
    /// `path = value` of every key that could not be mapped.
    pub unmapped: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{origin}: not a scDINO yaml: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}: the imported configuration is not valid: {source}")]
    Invalid {
        origin: String,
        #[source]
        source: ConfigError,
    },
}

pub fn import(text: &str, origin: &str) -> Result<Imported, ImportError> {
    let mut root = parse_root(text, origin)?;
    let mut imp = Importer::default();
    let mut s = Sections::default();
    // One call per scDINO section, in this order (the notes follow it).
    meta(&mut imp, &mut root, &mut s);
    let hyper = train_scdino(&mut imp, &mut root, &mut s);
    hyperparameters(&mut imp, hyper, &mut s, origin)?;
    downstream_analyses(&mut imp, &mut root, &mut s);
    for (k, v) in root {
        imp.unmapped.push(format!("{k} = {}", compact(&v)));
    }

    let yaml = serde_saphyr::to_string(&s).expect("sections always serialize");
    let config =
        Config::from_yaml(&yaml, "imported config").map_err(|source| ImportError::Invalid {
            origin: origin.into(),
            source,
        })?;
    Ok(Imported {
        config,
        notes: imp.notes,
        unmapped: imp.unmapped,
    })
}

/// The top level: a mapping of scDINO's sections.
fn parse_root(text: &str, origin: &str) -> Result<Map<String, Value>, ImportError> {
    let root: Value = serde_saphyr::from_str(text).map_err(|e| ImportError::Parse {
        origin: origin.into(),
        message: e.to_string(),
    })?;
    let Value::Object(root) = root else {
        return Err(ImportError::Parse {
            origin: origin.into(),
            message: "the top level must be a mapping with `meta`, `train_scDINO`, ...".into(),
        });
    };
    Ok(root)
}

/// `meta`: the run, the dataset and its channels.
fn meta(imp: &mut Importer, root: &mut Map<String, Value>, s: &mut Sections) {
    let mut meta = imp.section(root, "meta");
    imp.string(&mut meta, "meta.name_of_run", &mut s.run.name);
    imp.path(&mut meta, "meta.output_dir", &mut s.run.output_dir);
    let mut dataset_dir = String::new();
    if imp.string(&mut meta, "meta.dataset_dir", &mut dataset_dir) {
        match dataset_dir.parse::<crate::DatasetLocation>() {
            Ok(l) => s.data.dataset_dir = l,
            Err(e) => imp.bad(
                "meta.dataset_dir",
                &Value::String(dataset_dir),
                &e.to_string(),
            ),
        }
    }
    imp.uint(
        &mut meta,
        "meta.folder_depth_for_labels",
        &mut s.data.label_folder_depth,
    );
    imp.float(
        &mut meta,
        "meta.train_datasetsplit_fraction",
        &mut s.data.train_fraction,
    );
    // scDINO ignored classes when it split; an imported run holds out what scDINO held out.
    s.data.split = HeldOutSplit::Scdino;
    imp.notes.push(
        "data.split: scdino (scDINO's split, classes ignored); `stratified`, our default, holds out every class in proportion"
            .into(),
    );
    if !imp.u64(&mut meta, "meta.seed", &mut s.run.seed) {
        s.run.seed = 42;
        imp.absent("meta.seed", "42");
    }
    imp.boolean(&mut meta, "meta.images_are_RGB", &mut s.data.images_are_rgb);
    if let Some(v) = take(&mut meta, "meta.channel_dict") {
        match channel_names(&v) {
            Ok(names) => s.data.channel_names = names,
            Err(m) => imp.bad("meta.channel_dict", &v, &m),
        }
    }
    if let Some(v) = take(&mut meta, "meta.selected_channel_combination_per_run") {
        match channel_combinations(&v) {
            Ok((combos, note)) => {
                s.data.channel_combinations = combos;
                if let Some(n) = note {
                    imp.notes.push(n);
                }
            }
            Err(m) => imp.bad("meta.selected_channel_combination_per_run", &v, &m),
        }
    }
    imp.uint(&mut meta, "meta.center_crop", &mut s.data.center_crop);
    imp.leftovers("meta", meta);
}

/// `train_scDINO` without its hyperparameters, which it returns.
fn train_scdino(
    imp: &mut Importer,
    root: &mut Map<String, Value>,
    s: &mut Sections,
) -> Map<String, Value> {
    let mut train = imp.section(root, "train_scDINO");
    let hyper = imp.mapping(&mut train, "train_scDINO.hyperparameters");
    imp.string(&mut train, "train_scDINO.dino_vit_name", &mut s.model.name);
    imp.float(
        &mut train,
        "train_scDINO.fraction_for_mean_std_calc",
        &mut s.data.mean_std_fraction,
    );
    if imp.uint(&mut train, "train_scDINO.epochs", &mut s.train.epochs) {
        imp.notes.push(format!(
            "train_scDINO.epochs: scDINO's Snakefile trains epochs+1 = {} epochs; set train.epochs to {} to repeat that run exactly",
            s.train.epochs + 1,
            s.train.epochs + 1
        ));
    } else {
        s.train.epochs = 100;
        imp.absent("train_scDINO.epochs", "100");
    }
    if !imp.uint(
        &mut train,
        "train_scDINO.saveckp_freq",
        &mut s.train.checkpoint_every,
    ) {
        s.train.checkpoint_every = 5;
        imp.absent("train_scDINO.saveckp_freq", "5");
    }
    imp.uint(&mut train, "train_scDINO.num_gpus", &mut s.train.num_gpus);
    if !imp.uint(
        &mut train,
        "train_scDINO.batch_size_per_gpu",
        &mut s.train.batch_size_per_gpu,
    ) {
        s.train.batch_size_per_gpu = 64;
        imp.absent("train_scDINO.batch_size_per_gpu", "64");
    }
    if !imp.uint(
        &mut train,
        "train_scDINO.num_workers",
        &mut s.data.num_workers,
    ) {
        s.data.num_workers = 10;
        imp.absent("train_scDINO.num_workers", "10");
    }
    imp.string(&mut train, "train_scDINO.dist_url", &mut s.train.dist_url);
    imp.leftovers_with_hint(
        "train_scDINO",
        train,
        "node counts belong in the launcher's cluster.yaml",
    );
    hyper
}

const HYPER: &str = "train_scDINO.hyperparameters";

/// `train_scDINO.hyperparameters`: the model, the teacher, the optimizer and the crops. An
/// optimizer that does not train here is refused.
fn hyperparameters(
    imp: &mut Importer,
    mut hyper: Map<String, Value>,
    s: &mut Sections,
    origin: &str,
) -> Result<(), ImportError> {
    model_and_teacher(imp, &mut hyper, s);
    optimization(imp, &mut hyper, s, origin)?;
    drop_path_and_crops(imp, &mut hyper, s);
    imp.leftovers(HYPER, hyper);
    Ok(())
}

fn key(k: &str) -> String {
    format!("{HYPER}.{k}")
}

/// The ViT and its head, and the teacher's momentum and temperatures.
fn model_and_teacher(imp: &mut Importer, hyper: &mut Map<String, Value>, s: &mut Sections) {
    let h = HYPER;
    if let Some(v) = take(hyper, &key("arch")) {
        match v.as_str() {
            Some("vit_tiny") => s.model.arch = Arch::VitTiny,
            Some("vit_small") => s.model.arch = Arch::VitSmall,
            Some("vit_base") => s.model.arch = Arch::VitBase,
            Some("vit_large") => s.model.arch = Arch::VitLarge,
            _ => imp.bad(
                &key("arch"),
                &v,
                "expected vit_tiny, vit_small, vit_base or vit_large",
            ),
        }
    }
    imp.uint(hyper, &key("patch_size"), &mut s.model.patch_size);
    imp.uint(hyper, &key("out_dim"), &mut s.model.out_dim);
    imp.boolean(hyper, &key("norm_last_layer"), &mut s.model.norm_last_layer);
    imp.float(
        hyper,
        &key("momentum_teacher"),
        &mut s.train.momentum_teacher,
    );
    imp.boolean(hyper, &key("use_bn_in_head"), &mut s.model.use_bn_in_head);
    imp.float(
        hyper,
        &key("warmup_teacher_temp"),
        &mut s.train.warmup_teacher_temp,
    );
    imp.float(hyper, &key("teacher_temp"), &mut s.train.teacher_temp);
    if imp.float(hyper, &key("techer_temp"), &mut s.train.teacher_temp) {
        imp.notes.push(format!(
            "{h}.techer_temp is a misspelling that scDINO ignored (it trained with teacher_temp 0.04); imported as train.teacher_temp = {}",
            s.train.teacher_temp
        ));
    }
    imp.uint(
        hyper,
        &key("warmup_teacher_temp_epochs"),
        &mut s.train.warmup_teacher_temp_epochs,
    );
}

/// Precision, weight decay, clipping, the learning-rate schedule and the optimizer.
fn optimization(
    imp: &mut Importer,
    hyper: &mut Map<String, Value>,
    s: &mut Sections,
    origin: &str,
) -> Result<(), ImportError> {
    let h = HYPER;
    let mut fp16 = true;
    if imp.boolean(hyper, &key("use_fp16"), &mut fp16) {
        s.train.precision = if fp16 {
            Precision::Fp16
        } else {
            Precision::Fp32
        };
    }
    imp.float(hyper, &key("weight_decay"), &mut s.train.weight_decay);
    imp.float(
        hyper,
        &key("weight_decay_end"),
        &mut s.train.weight_decay_end,
    );
    imp.float(hyper, &key("clip_grad"), &mut s.train.clip_grad);
    imp.uint(
        hyper,
        &key("freeze_last_layer"),
        &mut s.train.freeze_last_layer,
    );
    imp.float(hyper, &key("lr"), &mut s.train.lr);
    let wrote_warmup = imp.uint(hyper, &key("warmup_epochs"), &mut s.train.warmup_epochs);
    if imp.uint(hyper, &key("warump_epochs"), &mut s.train.warmup_epochs) {
        imp.notes.push(format!(
            "{h}.warump_epochs is a misspelling that scDINO's own pipeline ignored (it warmed up for 10 epochs; the AWS Slurm port did read it); imported as train.warmup_epochs = {}",
            s.train.warmup_epochs
        ));
    } else if !wrote_warmup {
        s.train.warmup_epochs = 10;
        imp.absent(&key("warmup_epochs"), "10");
    }
    imp.float(hyper, &key("min_lr"), &mut s.train.min_lr);
    if let Some(v) = take(hyper, &key("optimizer")) {
        match v.as_str() {
            Some("adamw") => s.train.optimizer = Optimizer::Adamw,
            // Refused as validation refuses it: importing another optimizer's run as an
            // AdamW run would train something else than the file says.
            Some(name @ ("sgd" | "lars")) => {
                return Err(ImportError::Invalid {
                    origin: origin.into(),
                    source: ConfigError::Invalid {
                        origin: origin.into(),
                        key: "train.optimizer".into(),
                        line: None,
                        message: format!(
                            "{h}.optimizer is {name}, which is not implemented: only adamw (scDINO's default) trains here"
                        ),
                    },
                })
            }
            _ => imp.bad(&key("optimizer"), &v, "expected adamw"),
        }
    }
    Ok(())
}

/// Stochastic depth and the multi-crop scales (scDINO's defaults where absent).
fn drop_path_and_crops(imp: &mut Importer, hyper: &mut Map<String, Value>, s: &mut Sections) {
    imp.float(hyper, &key("drop_path_rate"), &mut s.model.drop_path_rate);
    if !imp.pair(
        hyper,
        &key("global_crops_scale"),
        &mut s.augment.global_crops_scale,
    ) {
        s.augment.global_crops_scale = (0.4, 1.0);
        imp.absent(&key("global_crops_scale"), "[0.4, 1.0]");
    }
    imp.uint(
        hyper,
        &key("local_crops_number"),
        &mut s.augment.local_crops_number,
    );
    if !imp.pair(
        hyper,
        &key("local_crops_scale"),
        &mut s.augment.local_crops_scale,
    ) {
        s.augment.local_crops_scale = (0.05, 0.4);
        imp.absent(&key("local_crops_scale"), "[0.05, 0.4]");
    }
}

/// `downstream_analyses`: one call per analysis.
fn downstream_analyses(imp: &mut Importer, root: &mut Map<String, Value>, s: &mut Sections) {
    let mut down = imp.section(root, "downstream_analyses");
    let d = &mut s.downstream;
    features(imp, &mut down, &mut d.features);
    attention(imp, &mut down, &mut d.attention);
    knn(imp, &mut down, &mut d.knn);
    umap(imp, &mut down, &mut d.umap);
    imp.leftovers("downstream_analyses", down);
}

/// `compute_cls_features`.
fn features(imp: &mut Importer, down: &mut Map<String, Value>, f: &mut FeaturesSection) {
    let p = "downstream_analyses.compute_cls_features";
    let mut feat = imp.mapping(down, p);
    imp.boolean(&mut feat, &format!("{p}.normalize"), &mut f.normalize);
    imp.uint(&mut feat, &format!("{p}.num_gpus"), &mut f.num_gpus);
    imp.uint(
        &mut feat,
        &format!("{p}.batch_size_per_gpu"),
        &mut f.batch_size_per_gpu,
    );
    imp.uint(&mut feat, &format!("{p}.num_workers"), &mut f.num_workers);
    if let Some(v) = take(&mut feat, &format!("{p}.checkpoint_key")) {
        match v.as_str() {
            Some("teacher") => f.checkpoint_key = CheckpointKey::Teacher,
            Some("student") => f.checkpoint_key = CheckpointKey::Student,
            _ => imp.bad(
                &format!("{p}.checkpoint_key"),
                &v,
                "expected teacher or student",
            ),
        }
    }
    imp.boolean(&mut feat, &format!("{p}.resize"), &mut f.resize);
    imp.uint(
        &mut feat,
        &format!("{p}.resize_length"),
        &mut f.resize_length,
    );
    imp.leftovers_with_hint(p, feat, "node counts belong in the launcher's cluster.yaml");
}

/// `attention_visualisation`.
fn attention(imp: &mut Importer, down: &mut Map<String, Value>, a: &mut AttentionSection) {
    let p = "downstream_analyses.attention_visualisation";
    let mut att = imp.mapping(down, p);
    imp.uint(
        &mut att,
        &format!("{p}.num_images_per_class"),
        &mut a.images_per_class,
    );
    imp.boolean(
        &mut att,
        &format!("{p}.resize_attention_image"),
        &mut a.resize,
    );
    imp.uint(&mut att, &format!("{p}.image_size"), &mut a.image_size);
    imp.leftovers(p, att);
}

/// `kNN.global` (the only kNN scDINO has).
fn knn(imp: &mut Importer, down: &mut Map<String, Value>, k: &mut KnnSection) {
    let mut knn = imp.mapping(down, "downstream_analyses.kNN");
    let mut global = imp.mapping(&mut knn, "downstream_analyses.kNN.global");
    imp.leftovers("downstream_analyses.kNN", knn);
    let p = "downstream_analyses.kNN.global";
    if let Some(v) = take(&mut global, &format!("{p}.n_neighbors")) {
        match v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|k| k as usize)).collect())
        {
            Some(ks) => k.k = ks,
            None => imp.bad(
                &format!("{p}.n_neighbors"),
                &v,
                "expected a list of whole numbers",
            ),
        }
    }
    imp.float(&mut global, &format!("{p}.temperature"), &mut k.temperature);
    imp.leftovers(p, global);
}

/// `umap_eval`.
fn umap(imp: &mut Importer, down: &mut Map<String, Value>, u: &mut UmapSection) {
    let p = "downstream_analyses.umap_eval";
    let mut um = imp.mapping(down, p);
    imp.uint(&mut um, &format!("{p}.n_neighbors"), &mut u.n_neighbors);
    imp.float(&mut um, &format!("{p}.min_dist"), &mut u.min_dist);
    imp.uint(&mut um, &format!("{p}.n_components"), &mut u.n_components);
    if let Some(v) = take(&mut um, &format!("{p}.metric")) {
        let metric = match v.as_str() {
            Some("euclidean") => Some(UmapMetric::Euclidean),
            Some("cosine") => Some(UmapMetric::Cosine),
            Some("manhattan") => Some(UmapMetric::Manhattan),
            Some("correlation") => Some(UmapMetric::Correlation),
            _ => None,
        };
        match metric {
            Some(m) => u.metric = m,
            None => imp.bad(
                &format!("{p}.metric"),
                &v,
                "supported metrics: euclidean, cosine, manhattan, correlation",
            ),
        }
    }
    imp.float(&mut um, &format!("{p}.spread"), &mut u.spread);
    imp.uint(&mut um, &format!("{p}.epochs"), &mut u.epochs);
    imp.boolean(
        &mut um,
        &format!("{p}.topometry_plots"),
        &mut u.topometry_plots,
    );
    imp.leftovers(p, um);
}
