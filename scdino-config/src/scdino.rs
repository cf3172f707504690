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
    let root: Value = serde_saphyr::from_str(text).map_err(|e| ImportError::Parse {
        origin: origin.into(),
        message: e.to_string(),
    })?;
    let Value::Object(mut root) = root else {
        return Err(ImportError::Parse {
            origin: origin.into(),
            message: "the top level must be a mapping with `meta`, `train_scDINO`, ...".into(),
        });
    };
    let mut imp = Importer::default();
    let mut s = Sections::default();

    let mut meta = imp.section(&mut root, "meta");
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

    let mut train = imp.section(&mut root, "train_scDINO");
    let mut hyper = match take(&mut train, "train_scDINO.hyperparameters") {
        Some(Value::Object(m)) => m,
        Some(other) => {
            imp.bad("train_scDINO.hyperparameters", &other, "expected a mapping");
            Map::new()
        }
        None => Map::new(),
    };
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

    let h = "train_scDINO.hyperparameters";
    let key = |k: &str| format!("{h}.{k}");
    if let Some(v) = take(&mut hyper, &key("arch")) {
        match v.as_str() {
            Some("vit_tiny") => s.model.arch = Arch::VitTiny,
            Some("vit_small") => s.model.arch = Arch::VitSmall,
            Some("vit_base") => s.model.arch = Arch::VitBase,
            _ => imp.bad(&key("arch"), &v, "expected vit_tiny, vit_small or vit_base"),
        }
    }
    imp.uint(&mut hyper, &key("patch_size"), &mut s.model.patch_size);
    imp.uint(&mut hyper, &key("out_dim"), &mut s.model.out_dim);
    imp.boolean(
        &mut hyper,
        &key("norm_last_layer"),
        &mut s.model.norm_last_layer,
    );
    imp.float(
        &mut hyper,
        &key("momentum_teacher"),
        &mut s.train.momentum_teacher,
    );
    imp.boolean(
        &mut hyper,
        &key("use_bn_in_head"),
        &mut s.model.use_bn_in_head,
    );
    imp.float(
        &mut hyper,
        &key("warmup_teacher_temp"),
        &mut s.train.warmup_teacher_temp,
    );
    imp.float(&mut hyper, &key("teacher_temp"), &mut s.train.teacher_temp);
    if imp.float(&mut hyper, &key("techer_temp"), &mut s.train.teacher_temp) {
        imp.notes.push(format!(
            "{h}.techer_temp is a misspelling that scDINO ignored (it trained with teacher_temp 0.04); imported as train.teacher_temp = {}",
            s.train.teacher_temp
        ));
    }
    imp.uint(
        &mut hyper,
        &key("warmup_teacher_temp_epochs"),
        &mut s.train.warmup_teacher_temp_epochs,
    );
    let mut fp16 = true;
    if imp.boolean(&mut hyper, &key("use_fp16"), &mut fp16) {
        s.train.precision = if fp16 {
            Precision::Fp16
        } else {
            Precision::Fp32
        };
    }
    imp.float(&mut hyper, &key("weight_decay"), &mut s.train.weight_decay);
    imp.float(
        &mut hyper,
        &key("weight_decay_end"),
        &mut s.train.weight_decay_end,
    );
    imp.float(&mut hyper, &key("clip_grad"), &mut s.train.clip_grad);
    imp.uint(
        &mut hyper,
        &key("freeze_last_layer"),
        &mut s.train.freeze_last_layer,
    );
    imp.float(&mut hyper, &key("lr"), &mut s.train.lr);
    let wrote_warmup = imp.uint(
        &mut hyper,
        &key("warmup_epochs"),
        &mut s.train.warmup_epochs,
    );
    if imp.uint(
        &mut hyper,
        &key("warump_epochs"),
        &mut s.train.warmup_epochs,
    ) {
        imp.notes.push(format!(
            "{h}.warump_epochs is a misspelling that scDINO's own pipeline ignored (it warmed up for 10 epochs; the AWS Slurm port did read it); imported as train.warmup_epochs = {}",
            s.train.warmup_epochs
        ));
    } else if !wrote_warmup {
        s.train.warmup_epochs = 10;
        imp.absent(&key("warmup_epochs"), "10");
    }
    imp.float(&mut hyper, &key("min_lr"), &mut s.train.min_lr);
    if let Some(v) = take(&mut hyper, &key("optimizer")) {
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
    imp.float(
        &mut hyper,
        &key("drop_path_rate"),
        &mut s.model.drop_path_rate,
    );
    if !imp.pair(
        &mut hyper,
        &key("global_crops_scale"),
        &mut s.augment.global_crops_scale,
    ) {
        s.augment.global_crops_scale = (0.4, 1.0);
        imp.absent(&key("global_crops_scale"), "[0.4, 1.0]");
    }
    imp.uint(
        &mut hyper,
        &key("local_crops_number"),
        &mut s.augment.local_crops_number,
    );
    if !imp.pair(
        &mut hyper,
        &key("local_crops_scale"),
        &mut s.augment.local_crops_scale,
    ) {
        s.augment.local_crops_scale = (0.05, 0.4);
        imp.absent(&key("local_crops_scale"), "[0.05, 0.4]");
    }
    imp.leftovers(h, hyper);

    let mut down = imp.section(&mut root, "downstream_analyses");
    let mut sub = |imp: &mut Importer, name: &str| -> Map<String, Value> {
        let path = format!("downstream_analyses.{name}");
        match take(&mut down, &path) {
            Some(Value::Object(m)) => m,
            Some(other) => {
                imp.bad(&path, &other, "expected a mapping");
                Map::new()
            }
            None => Map::new(),
        }
    };
    let p = "downstream_analyses.compute_cls_features";
    let mut feat = sub(&mut imp, "compute_cls_features");
    let f = &mut s.downstream.features;
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

    let p = "downstream_analyses.attention_visualisation";
    let mut att = sub(&mut imp, "attention_visualisation");
    let a = &mut s.downstream.attention;
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

    let mut knn = sub(&mut imp, "kNN");
    let mut global = match take(&mut knn, "downstream_analyses.kNN.global") {
        Some(Value::Object(m)) => m,
        Some(other) => {
            imp.bad(
                "downstream_analyses.kNN.global",
                &other,
                "expected a mapping",
            );
            Map::new()
        }
        None => Map::new(),
    };
    imp.leftovers("downstream_analyses.kNN", knn);
    let p = "downstream_analyses.kNN.global";
    if let Some(v) = take(&mut global, &format!("{p}.n_neighbors")) {
        match v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|k| k as usize)).collect())
        {
            Some(ks) => s.downstream.knn.k = ks,
            None => imp.bad(
                &format!("{p}.n_neighbors"),
                &v,
                "expected a list of whole numbers",
            ),
        }
    }
    imp.float(
        &mut global,
        &format!("{p}.temperature"),
        &mut s.downstream.knn.temperature,
    );
    imp.leftovers(p, global);

    let p = "downstream_analyses.umap_eval";
    let mut um = sub(&mut imp, "umap_eval");
    let u = &mut s.downstream.umap;
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
    imp.leftovers("downstream_analyses", down);

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

/// `{0: "aTub", 1: "BF"}` (original) or `"aTub,BF"` (AWS port) → names in channel order.
fn channel_names(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::String(csv) => Ok(csv.split(',').map(|s| s.trim().to_string()).collect()),
        Value::Object(m) => {
            let mut pairs: Vec<(usize, String)> = m
                .iter()
                .map(|(k, name)| {
                    let idx = k
                        .trim()
                        .parse::<usize>()
                        .map_err(|_| format!("key {k:?} is not a channel number"))?;
                    let name = name
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("the name of channel {idx} is not a string"))?;
                    Ok((idx, name))
                })
                .collect::<Result<_, String>>()?;
            pairs.sort();
            for (expect, (idx, _)) in pairs.iter().enumerate() {
                if *idx != expect {
                    return Err(format!(
                        "channel numbers must run 0, 1, 2, ... without gaps (missing {expect})"
                    ));
                }
            }
            Ok(pairs.into_iter().map(|(_, n)| n).collect())
        }
        _ => Err("expected a mapping {0: name, ...} or a comma-separated string".into()),
    }
}

/// `["01234", "0"]` (original) or `"0,1,2,3,4"` / a bare number (AWS port: one combination).
fn channel_combinations(v: &Value) -> Result<(Vec<ChannelCombination>, Option<String>), String> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|it| match it {
                Value::String(s) => Ok(ChannelCombination::Digits(s.clone())),
                Value::Number(n) => Ok(ChannelCombination::Digits(n.to_string())),
                _ => Err("each combination must be a string of channel digits".to_string()),
            })
            .collect::<Result<_, _>>()
            .map(|c| (c, None)),
        Value::String(s) if s.contains(',') => {
            let idx = s
                .split(',')
                .map(|p| p.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| format!("{s:?} is not a comma-separated list of channel numbers"))?;
            Ok((
                vec![ChannelCombination::Indices(idx)],
                Some(format!(
                    "meta.selected_channel_combination_per_run {s:?} (AWS form) is one combination of those channels"
                )),
            ))
        }
        Value::String(s) => Ok((vec![ChannelCombination::Digits(s.clone())], None)),
        Value::Number(n) => Ok((vec![ChannelCombination::Digits(n.to_string())], None)),
        _ => Err("expected a list of digit strings such as [\"01234\", \"0\"]".into()),
    }
}

#[derive(Default)]
struct Importer {
    notes: Vec<String>,
    unmapped: Vec<String>,
}

fn take(map: &mut Map<String, Value>, path: &str) -> Option<Value> {
    let key = path.rsplit('.').next().unwrap_or(path);
    map.remove(key)
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

impl Importer {
    fn section(&mut self, root: &mut Map<String, Value>, name: &str) -> Map<String, Value> {
        match root.remove(name) {
            Some(Value::Object(m)) => m,
            Some(other) => {
                self.bad(name, &other, "expected a mapping");
                Map::new()
            }
            None => {
                self.notes
                    .push(format!("section `{name}` is missing; defaults used"));
                Map::new()
            }
        }
    }

    fn bad(&mut self, path: &str, v: &Value, why: &str) {
        self.unmapped
            .push(format!("{path} = {} ({why})", compact(v)));
    }

    fn absent(&mut self, path: &str, used: &str) {
        self.notes.push(format!(
            "{path} is not set; scDINO ran with its argparse default {used}, imported as such"
        ));
    }

    fn leftovers(&mut self, section: &str, map: Map<String, Value>) {
        for (k, v) in map {
            self.unmapped
                .push(format!("{section}.{k} = {}", compact(&v)));
        }
    }

    fn leftovers_with_hint(&mut self, section: &str, map: Map<String, Value>, hint: &str) {
        for (k, v) in map {
            let why = if k == "nnodes" {
                format!(" ({hint})")
            } else {
                String::new()
            };
            self.unmapped
                .push(format!("{section}.{k} = {}{why}", compact(&v)));
        }
    }

    /// Each typed setter returns whether the key was present and mapped.
    fn string(&mut self, m: &mut Map<String, Value>, path: &str, out: &mut String) -> bool {
        match take(m, path) {
            Some(Value::String(s)) => {
                *out = s;
                true
            }
            Some(Value::Number(n)) => {
                *out = n.to_string();
                true
            }
            Some(v) => {
                self.bad(path, &v, "expected text");
                false
            }
            None => false,
        }
    }

    fn path(
        &mut self,
        m: &mut Map<String, Value>,
        path: &str,
        out: &mut std::path::PathBuf,
    ) -> bool {
        let mut s = String::new();
        let ok = self.string(m, path, &mut s);
        if ok {
            *out = s.into();
        }
        ok
    }

    fn u64(&mut self, m: &mut Map<String, Value>, path: &str, out: &mut u64) -> bool {
        match take(m, path) {
            Some(v) => match v.as_u64() {
                Some(x) => {
                    *out = x;
                    true
                }
                None => {
                    self.bad(path, &v, "expected a whole number");
                    false
                }
            },
            None => false,
        }
    }

    fn uint(&mut self, m: &mut Map<String, Value>, path: &str, out: &mut usize) -> bool {
        let mut x = 0u64;
        let ok = self.u64(m, path, &mut x);
        if ok {
            *out = x as usize;
        }
        ok
    }

    fn float(&mut self, m: &mut Map<String, Value>, path: &str, out: &mut f64) -> bool {
        match take(m, path) {
            Some(v) => match v.as_f64() {
                Some(x) => {
                    *out = x;
                    true
                }
                None => {
                    self.bad(path, &v, "expected a number");
                    false
                }
            },
            None => false,
        }
    }

    fn boolean(&mut self, m: &mut Map<String, Value>, path: &str, out: &mut bool) -> bool {
        match take(m, path) {
            Some(Value::Bool(b)) => {
                *out = b;
                true
            }
            Some(v) => {
                self.bad(path, &v, "expected True or False");
                false
            }
            None => false,
        }
    }

    fn pair(&mut self, m: &mut Map<String, Value>, path: &str, out: &mut (f64, f64)) -> bool {
        match take(m, path) {
            Some(v) => match v
                .as_array()
                .map(|a| a.iter().map(Value::as_f64).collect::<Vec<_>>())
            {
                Some(a) if a.len() == 2 && a.iter().all(Option::is_some) => {
                    *out = (a[0].unwrap_or_default(), a[1].unwrap_or_default());
                    true
                }
                _ => {
                    self.bad(
                        path,
                        &v,
                        "expected two numbers, e.g. !!python/tuple [0.4, 1.0]",
                    );
                    false
                }
            },
            None => false,
        }
    }
}
