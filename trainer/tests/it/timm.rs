//! Reading timm folders: models timm itself creates and saves (`tests/py/timm_oracle.py`:
//! DINOv2's ViT-S/14 with registers and LayerScale, a 5-channel ViT-S/16) load into our ViT
//! and give timm's CLS features at the saved size and at others (timm's own position
//! resampling); `trainer export --format timm` of such a folder writes its tensors back bit
//! for bit; layouts our ViT does not compute are refused naming the tensor or key and file.
use super::util::{max_abs_diff, run_py_file, torch_rng_lock};
use std::path::Path;
use std::process::Command;
use tch::{nn, Tensor};
use trainer::model::{timm, VisionTransformer};

/// timm's models and features, written once per test into `dir`.
fn oracle(dir: &Path) -> serde_json::Value {
    let out = run_py_file("timm_oracle.py", &[dir.to_str().unwrap()]);
    serde_json::from_str(out.trim()).expect("the oracle prints JSON")
}

fn tensors(path: &Path) -> std::collections::BTreeMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

#[test]
fn timm_models_give_timms_cls_features_at_every_size() {
    let _rng = torch_rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let sizes = oracle(dir.path());
    for (name, layer_scale, registers) in [("dinov2", true, 4), ("vits16", false, 0)] {
        let folder = dir.path().join(name);
        let model = timm::read(&folder).unwrap();
        let cfg = model.cfg;
        assert_eq!(cfg.layer_scale.is_some(), layer_scale, "{name}");
        assert_eq!(cfg.num_register_tokens, registers, "{name}");
        assert_eq!(cfg.no_embed_class, name == "dinov2", "{name}");
        assert_eq!(cfg.depth, 2, "{name}");
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let vit = VisionTransformer::new(vs.root() / "backbone", cfg);
        model.load_into(&vs, "backbone.").unwrap();
        let feats = tensors(&folder.join("features.safetensors"));
        let sizes = sizes[name].as_array().unwrap();
        assert_eq!(sizes.len(), 3);
        for hw in sizes {
            let (h, w) = (hw[0].as_i64().unwrap(), hw[1].as_i64().unwrap());
            let x = &feats[&format!("x_{h}x{w}")];
            let theirs = &feats[&format!("y_{h}x{w}")];
            let ours = tch::no_grad(|| vit.forward_t(x, false));
            let diff = max_abs_diff(&ours, theirs);
            assert!(diff < 1e-5, "{name} at {h}×{w}: |ours - timm| = {diff}");
            assert!(
                theirs.abs().max().double_value(&[]) > 0.1,
                "features are not trivial"
            );
        }
    }
}

#[test]
fn timm_folder_exports_back_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    oracle(dir.path());
    for (name, side) in [("dinov2", "56"), ("vits16", "48")] {
        let folder = dir.path().join(name);
        let out = dir.path().join(format!("{name}-export"));
        let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
            .args([
                "export",
                "--format",
                "timm",
                "--image-size",
                side,
                "--checkpoint",
            ])
            .arg(&folder)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let source = tensors(&folder.join("model.safetensors"));
        let exported = tensors(&out.join("model.safetensors"));
        assert_eq!(
            source.keys().collect::<Vec<_>>(),
            exported.keys().collect::<Vec<_>>(),
            "{name}: the same timm names"
        );
        for (k, t) in &source {
            let e = &exported[k];
            assert_eq!(t.size(), e.size(), "{name} {k}");
            let same = t
                .to_kind(tch::Kind::Float)
                .eq_tensor(e)
                .all()
                .int64_value(&[]);
            assert_eq!(same, 1, "{name} {k} differs after the round trip");
        }
        // The export's config.json reads back to the same network.
        let again = timm::read(&out).unwrap();
        assert_eq!(again.cfg, timm::read(&folder).unwrap().cfg, "{name}");
    }
}

#[test]
fn timm_layouts_our_vit_cannot_compute_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    oracle(dir.path());
    // Registers with positions (no_embed_class=False and reg_tokens).
    let err = timm::read(&dir.path().join("regpos"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("pos_embed") && err.contains("model.safetensors") && err.contains("registers"),
        "{err}"
    );
    // A model_args key that changes the network.
    let folder = dir.path().join("vits16");
    let config = folder.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    cfg["model_args"]["qk_norm"] = serde_json::json!(true);
    std::fs::write(&config, cfg.to_string()).unwrap();
    let err = timm::read(&folder).unwrap_err().to_string();
    assert!(
        err.contains("model_args.qk_norm") && err.contains("config.json"),
        "{err}"
    );
    cfg["model_args"]["qk_norm"] = serde_json::json!(false);
    cfg["model_args"]["act_layer"] = serde_json::json!("quick_gelu");
    std::fs::write(&config, cfg.to_string()).unwrap();
    let err = timm::read(&folder).unwrap_err().to_string();
    assert!(err.contains("model_args.act_layer"), "{err}");
    // A model_args size the tensors contradict.
    cfg["model_args"]
        .as_object_mut()
        .unwrap()
        .remove("act_layer");
    cfg["model_args"]["depth"] = serde_json::json!(3);
    std::fs::write(&config, cfg.to_string()).unwrap();
    let err = timm::read(&folder).unwrap_err().to_string();
    assert!(
        err.contains("model_args.depth is 3") && err.contains("depth = 2"),
        "{err}"
    );
    // A tensor our model lacks, and one it needs that the file lacks.
    cfg["model_args"]["depth"] = serde_json::json!(2);
    std::fs::write(&config, cfg.to_string()).unwrap();
    let model = timm::read(&folder).unwrap();
    let mut wrong = model.cfg;
    wrong.layer_scale = Some(1e-5);
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _vit = VisionTransformer::new(vs.root() / "backbone", wrong);
    let err = model.load_into(&vs, "backbone.").unwrap_err().to_string();
    assert!(
        err.contains("blocks.0.ls1.gamma") && err.contains("model.safetensors"),
        "{err}"
    );
    let mut wrong = model.cfg;
    wrong.patch_size = 8;
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _vit = VisionTransformer::new(vs.root() / "backbone", wrong);
    let err = model.load_into(&vs, "backbone.").unwrap_err().to_string();
    assert!(err.contains("patch_embed.proj.weight has shape"), "{err}");
}
