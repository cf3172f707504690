//! The export's `README.md` model card: what the model is, what it was trained on and how,
//! the run's kNN and linear-probe scores for this checkpoint when its analyses are beside it,
//! and the exact lines that load it.
use super::model_record::{arch_name, network_name, Source};
use super::Format;
use crate::layout::ModelLayout;
use crate::model::backbone::checkpoint_tag;
use std::fmt::Write;

pub fn model_card(src: &Source, format: Format, how_to_load: &str) -> String {
    let m = &src.model;
    let cfg = src.vit_config();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# scDINO {} ({} backbone), {} export\n",
        arch_name(m.arch),
        network_name(src.network),
        format.name()
    );
    let _ = writeln!(
        s,
        "A ViT trained with DINO self-distillation on multi-channel microscopy images by `trainer` (scDINO on libtorch), exported by `trainer export --format {}` from `{}` ({} epochs done, iteration {}).\n",
        format.name(),
        src.path.display(),
        src.epoch,
        src.iteration
    );
    let _ = writeln!(s, "## Model\n");
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(
        s,
        "| architecture | {} (embed dim {}, depth {}, {} heads, MLP ratio {}) |",
        arch_name(m.arch),
        cfg.embed_dim,
        cfg.depth,
        cfg.num_heads,
        cfg.mlp_ratio
    );
    let _ = writeln!(
        s,
        "| patch size | {} (input {}×{}) |",
        cfg.patch_size, cfg.img_size, cfg.img_size
    );
    let _ = writeln!(s, "| model.channels | {} |", m.mode.name());
    let _ = writeln!(s, "| register tokens | {} |", m.num_register_tokens);
    let _ = writeln!(s, "| network | {} |", network_name(src.network));
    let _ = writeln!(s, "\n## Input channels and normalisation\n");
    let _ = writeln!(s, "| channel | name | mean | std |\n|---|---|---|---|");
    for (i, name) in m.channel_names.iter().enumerate() {
        let _ = writeln!(s, "| {i} | {name} | {} | {} |", src.mean[i], src.std[i]);
    }
    let _ = writeln!(
        s,
        "\nPreprocessing as in training and the features stage: the channels above, in that order; \
         each channel min-max scaled to [0, 1] per image; resized (bilinear) to the input size; \
         then `(x - mean) / std` per channel.\n"
    );
    let _ = writeln!(
        s,
        "{}\n",
        src.input
            .explain(&src.model.vit_config(), src.config.as_ref())
    );
    let _ = writeln!(s, "## How to load\n\n{how_to_load}");
    training(&mut s, src);
    scores(&mut s, src);
    if !src.config_yaml.trim().is_empty() {
        let _ = writeln!(
            s,
            "## The run config\n\n```yaml\n{}\n```",
            src.config_yaml.trim_end()
        );
    }
    s
}

fn training(s: &mut String, src: &Source) {
    let Some(c) = &src.config else {
        return;
    };
    let _ = writeln!(s, "## Training\n");
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(s, "| run | {} |", c.run.name);
    let _ = writeln!(s, "| data | `{}` |", c.data.dataset_dir);
    let _ = writeln!(
        s,
        "| training fraction | {} (the rest is held out for the analyses) |",
        c.data.train_fraction
    );
    let _ = writeln!(
        s,
        "| epochs | {} done of {} configured |",
        src.epoch, c.train.epochs
    );
    let _ = writeln!(s, "| batch size per GPU | {} |", c.train.batch_size_per_gpu);
    let _ = writeln!(
        s,
        "| optimizer, lr, weight decay | {}, {}, {} → {} |",
        serde_json::to_value(c.train.optimizer)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_else(|| format!("{:?}", c.train.optimizer)),
        c.train.lr,
        c.train.weight_decay,
        c.train.weight_decay_end
    );
    let _ = writeln!(s, "| seed | {} |\n", c.run.seed);
}

/// The pipeline's evaluation of this checkpoint, read from the model's analyses folder when
/// the checkpoint still sits in its run folder.
fn scores(s: &mut String, src: &Source) {
    let Some(dir) = src.path.parent() else {
        return;
    };
    let Some(layout) = ModelLayout::beside(dir) else {
        return;
    };
    let Ok(tag) = checkpoint_tag(&src.path) else {
        return;
    };
    let path = layout.evaluation_json(&tag);
    let Some(v) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    else {
        return;
    };
    let _ = writeln!(
        s,
        "## Scores\n\nFrom `{}` ({}, {} training and {} query images):\n",
        path.display(),
        v["queries_from"].as_str().unwrap_or("?"),
        v["n_train"],
        v["n_queries"]
    );
    let _ = writeln!(
        s,
        "| method | top-1 % | balanced accuracy % | macro-F1 |\n|---|---|---|---|"
    );
    let row = |s: &mut String, name: String, sc: &serde_json::Value| {
        let _ = writeln!(
            s,
            "| {name} | {:.2} | {:.2} | {:.4} |",
            sc["top1_percent"].as_f64().unwrap_or(f64::NAN),
            sc["balanced_accuracy_percent"].as_f64().unwrap_or(f64::NAN),
            sc["macro_f1"].as_f64().unwrap_or(f64::NAN)
        );
    };
    for k in v["knn"].as_array().into_iter().flatten() {
        row(s, format!("{}-NN", k["k"]), &k["scores"]);
    }
    row(s, "linear probe".to_string(), &v["linear_probe"]["scores"]);
    let _ = writeln!(s);
}
