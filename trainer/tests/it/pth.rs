//! PyTorch `.pth` checkpoints read without Python, against PyTorch itself
//! (`tests/py/pth_oracle.py` writes them as scDINO does and computes scDINO's features).
use super::util::{max_abs_diff, run_py_file};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tch::{Kind, Tensor};
use trainer::analysis::features;
use trainer::config::{CheckpointKey, Config};
use trainer::data::mean_std::MeanStd;
use trainer::data::{generate_synthetic, SynthOptions};
use trainer::model::backbone::{checkpoint_tag, BackboneWeights};
use trainer::pth::{PthFile, TrainingArgs, Value};

/// Files shared by the tests of this module (writing a checkpoint with torch takes seconds),
/// under cargo's per-target test folder so reruns replace them.
fn shared_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("pth_it")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Dataset {
    data: PathBuf,
    out: PathBuf,
    mean_std: PathBuf,
    ms: MeanStd,
}

fn dataset() -> &'static Dataset {
    static D: OnceLock<Dataset> = OnceLock::new();
    D.get_or_init(|| {
        let dir = shared_dir("dataset");
        generate_synthetic(&SynthOptions {
            out: dir.join("data"),
            seed: 8,
            classes: 3,
            per_class: 9,
            ..SynthOptions::default()
        })
        .unwrap();
        let ms = MeanStd {
            mean: vec![0.31, 0.42, 0.25, 0.5, 0.37],
            std: vec![0.21, 0.18, 0.3, 0.25, 0.2],
        };
        let mean_std = dir.join("mean_and_std_of_dataset.txt");
        ms.write(&mean_std).unwrap();
        Dataset {
            data: dir.join("data/Training"),
            out: dir.join("out"),
            mean_std,
            ms,
        }
    })
}

/// An scDINO training checkpoint of a 5-channel vit_tiny after 3 epochs (`epoch` = 3).
fn scdino_pth() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let p = shared_dir("scdino").join("checkpoint.pth");
        run_py_file(
            "pth_oracle.py",
            &["scdino", p.to_str().unwrap(), "5", "11", "3", "01234"],
        );
        p
    })
}

/// `proto2.pth`, `proto4.pth`, `expected.safetensors`, `legacy.pth`.
fn zoo() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = shared_dir("zoo");
        run_py_file("pth_oracle.py", &["zoo", dir.to_str().unwrap()]);
        dir
    })
}

fn config(combination: &str, features_extra: &str) -> Config {
    let d = dataset();
    let yaml = format!(
        "run:\n  name: p\n  output_dir: {out}\n  seed: 5\ndata:\n  dataset_dir: {data}\n  channel_names: [aTub, BF, DAPI, Oct4, PE]\n  channel_combinations: [\"{combination}\"]\nmodel:\n  arch: vit_tiny\n  patch_size: 16\ndownstream:\n  features:\n    resize_length: 48\n    batch_size_per_gpu: 4\n{features_extra}",
        out = d.out.display(),
        data = d.data.display(),
    );
    Config::from_yaml(&yaml, "pth-test").unwrap()
}

/// scDINO's features for the rows of `set`, computed by PyTorch from `ckpt`.
fn pytorch_features(
    ckpt: &Path,
    key: &str,
    set: &features::FeatureSet,
    sel: &[usize],
    adapt: &str,
) -> Tensor {
    let dir = tempfile::tempdir().unwrap();
    let paths = dir.path().join("paths.txt");
    std::fs::write(&paths, set.paths.join("\n")).unwrap();
    let out = dir.path().join("features.safetensors");
    run_py_file(
        "pth_oracle.py",
        &[
            "features",
            ckpt.to_str().unwrap(),
            key,
            paths.to_str().unwrap(),
            &serde_json::to_string(sel).unwrap(),
            dataset().mean_std.to_str().unwrap(),
            "48",
            adapt,
            out.to_str().unwrap(),
        ],
    );
    let mut t = Tensor::read_safetensors(&out).unwrap();
    assert_eq!(t.len(), 1);
    t.remove(0).1
}

fn assert_close(ours: &Tensor, theirs: &Tensor, what: &str) {
    assert_eq!(ours.size(), theirs.size(), "{what}: shapes");
    let d = max_abs_diff(ours, theirs);
    assert!(d <= 1e-4, "{what}: features differ from PyTorch by {d}");
}

#[test]
fn scdino_checkpoint_features_match_pytorch_for_teacher_and_student() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let ck = scdino_pth();
    let ms = &dataset().ms;
    let teacher = features::extract(&config("01234", ""), 0, ck, ms).unwrap();
    assert_eq!(teacher.labels.len(), 5, "floor(0.2·27) held out");
    // scDINO's `epoch` holds epochs done; checkpoint{E}.pth and the feature files use E = 2.
    assert_eq!(teacher.tag, "epoch2");
    let reference = pytorch_features(ck, "teacher", &teacher, &[0, 1, 2, 3, 4], "null");
    assert_close(&teacher.features, &reference, "teacher");

    let cfg = config("01234", "    checkpoint_key: student\n");
    let student = features::extract(&cfg, 0, ck, ms).unwrap();
    let reference = pytorch_features(ck, "student", &student, &[0, 1, 2, 3, 4], "null");
    assert_close(
        &student.features,
        &reference,
        "student (module.backbone.* keys)",
    );
    let apart = max_abs_diff(&teacher.features, &student.features);
    assert!(
        apart > 1e-2,
        "teacher and student features should differ, max diff {apart}"
    );
}

#[test]
fn scdino_checkpoint_contents_are_readable() {
    let ck = scdino_pth();
    let w = BackboneWeights::load(ck, CheckpointKey::Teacher).unwrap();
    assert_eq!(w.epoch, Some(3));
    let args = w.args.as_ref().unwrap();
    assert_eq!(args.arch.as_deref(), Some("vit_tiny"));
    assert_eq!(args.patch_size, Some(16));
    assert_eq!(args.selected_channels.as_deref(), Some("0,1,2,3,4"));
    // vit_tiny: cls_token, pos_embed, patch_embed weight+bias, 12 blocks of 12, final norm.
    assert_eq!(w.tensors.len(), 4 + 12 * 12 + 2);
    assert!(w.tensors.keys().all(|k| !k.starts_with("head.")));
    assert_eq!(
        w.tensors["patch_embed.proj.weight"].size(),
        [192, 5, 16, 16]
    );

    let f = PthFile::open(ck).unwrap();
    let root = f.root();
    let student = root.get("student").unwrap().dict_items().unwrap();
    assert!(student.iter().any(|(k, _)| k.starts_with("module.head.")));
    assert!(student
        .iter()
        .all(|(k, _)| k.starts_with("module.backbone.") || k.starts_with("module.head.")));
    let groups = root
        .get("optimizer")
        .unwrap()
        .get("param_groups")
        .unwrap()
        .items()
        .unwrap();
    assert_eq!(groups.len(), 2);
    assert!(matches!(groups[1].get("weight_decay"), Some(Value::Float(w)) if w == 0.0));
    let state = root.get("optimizer").unwrap().get("state").unwrap();
    assert!(matches!(state, Value::Dict(ref d) if !d.borrow().is_empty()));
    let center = root.get("dino_loss").unwrap().get("center").unwrap();
    let center = f.tensor(center.as_tensor().unwrap()).unwrap();
    assert_eq!(center.size(), [1, 64]);
    assert!(center.abs().sum(Kind::Float).double_value(&[]) > 0.0);
}

#[test]
fn bare_fp16_state_dict_features_match_pytorch() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let dir = shared_dir("bare");
    let ck = dir.join("dino_vittiny16_fp16.pth");
    run_py_file(
        "pth_oracle.py",
        &["bare", ck.to_str().unwrap(), "2", "3", "float16"],
    );
    let w = BackboneWeights::load(&ck, CheckpointKey::Teacher).unwrap();
    assert_eq!(w.tensors["cls_token"].kind(), Kind::Half);
    assert_eq!(w.epoch, None);
    let set = features::extract(&config("24", ""), 0, &ck, &dataset().ms).unwrap();
    assert_eq!(set.tag, "model_dino_vittiny16_fp16");
    assert_eq!(checkpoint_tag(&ck).unwrap(), set.tag);
    let reference = pytorch_features(&ck, "teacher", &set, &[2, 4], "null");
    assert_close(&set.features, &reference, "bare fp16 state dict");
}

#[test]
fn channel_mismatch_is_an_error_naming_both_counts_and_the_file() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let ck = scdino_pth();
    let err = features::extract(&config("24", ""), 0, ck, &dataset().ms)
        .err()
        .expect("5-channel checkpoint, 2-channel combination")
        .to_string();
    assert!(err.contains(&ck.display().to_string()), "{err}");
    assert!(err.contains("takes 5 channels"), "{err}");
    assert!(err.contains("has 2"), "{err}");
    assert!(err.contains("use_mean_patch_embedding"), "{err}");
}

#[test]
fn mean_patch_embedding_matches_pytorch() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let ck = scdino_pth();
    let cfg = config("24", "    use_mean_patch_embedding: true\n");
    let set = features::extract(&cfg, 0, ck, &dataset().ms).unwrap();
    let reference = pytorch_features(ck, "teacher", &set, &[2, 4], "\"mean\"");
    assert_close(&set.features, &reference, "mean patch embedding");
}

#[test]
fn custom_embedding_map_matches_pytorch_and_checks_its_entries() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let ck = scdino_pth();
    let ms = &dataset().ms;
    let cfg = config("24", "    custom_embedding_map: {2: 4, 4: 0}\n");
    let set = features::extract(&cfg, 0, ck, ms).unwrap();
    let reference = pytorch_features(ck, "teacher", &set, &[2, 4], r#"{"2": 4, "4": 0}"#);
    assert_close(&set.features, &reference, "custom embedding map");

    let cfg = config("24", "    custom_embedding_map: {2: 4}\n");
    let err = features::extract(&cfg, 0, ck, ms)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("channel 4 has no entry in downstream.features.custom_embedding_map"),
        "{err}"
    );
    let cfg = config("24", "    custom_embedding_map: {2: 4, 4: 5}\n");
    let err = features::extract(&cfg, 0, ck, ms)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("checkpoint channel 5"), "{err}");
    assert!(err.contains("only 5 channels"), "{err}");
}

#[test]
fn import_gives_a_safetensors_backbone_with_identical_features() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let ck = scdino_pth();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("imported.safetensors");
    BackboneWeights::load(ck, CheckpointKey::Teacher)
        .unwrap()
        .save(&out, CheckpointKey::Teacher)
        .unwrap();
    let cfg = config("01234", "");
    let from_pth = features::extract(&cfg, 0, ck, &dataset().ms).unwrap();
    let imported = features::extract(&cfg, 0, &out, &dataset().ms).unwrap();
    assert_eq!(imported.tag, from_pth.tag);
    // The header-only reader names both files as loading them does.
    assert_eq!(checkpoint_tag(ck).unwrap(), from_pth.tag);
    assert_eq!(checkpoint_tag(&out).unwrap(), from_pth.tag);
    assert_eq!(from_pth.tag, "epoch2");
    assert_eq!(max_abs_diff(&imported.features, &from_pth.features), 0.0);
    // The imported file holds no training state: resuming from it must not be mistaken for
    // one of our training checkpoints.
    let meta = trainer::checkpoint::load(&out).unwrap().meta;
    assert!(meta.fingerprint.contains("imported_from"), "{meta:?}");
}

#[test]
fn reader_honours_views_dtypes_and_python_values_for_protocols_2_and_4() {
    let dir = zoo();
    let expected: Vec<(String, Tensor)> =
        Tensor::read_safetensors(dir.join("expected.safetensors")).unwrap();
    assert_eq!(expected.len(), 11);
    for proto in ["proto2.pth", "proto4.pth"] {
        let f = PthFile::open(&dir.join(proto)).unwrap();
        let root = f.root();
        let tensors = root.get("tensors").unwrap();
        for (name, want) in &expected {
            let t = tensors
                .get(name)
                .unwrap_or_else(|| panic!("{proto}: {name} missing"));
            let got = f.tensor(t.as_tensor().unwrap()).unwrap();
            assert_eq!(got.kind(), want.kind(), "{proto}: {name} dtype");
            assert_eq!(got.size(), want.size(), "{proto}: {name} shape");
            assert!(got.equal(want), "{proto}: {name} values differ");
        }
        // Views of one storage reference the same record with their own offset/strides.
        let base = tensors.get("base").unwrap().as_tensor().unwrap().clone();
        let step = tensors.get("step").unwrap().as_tensor().unwrap().clone();
        assert_eq!(step.storage.key, base.storage.key);
        assert_eq!((step.offset, step.stride.clone()), (5, vec![7]));
        let shared = root.get("shared").unwrap().items().unwrap();
        assert_eq!(shared[0].as_tensor(), shared[1].as_tensor());

        let nested = root.get("nested").unwrap();
        let list = nested.get("list").unwrap().items().unwrap();
        let ints: Vec<Option<i64>> = list[..4].iter().map(Value::as_int).collect();
        assert_eq!(
            ints,
            [Some(1), Some(-2), Some(1 << 40), Some(-(1 << 40))],
            "{proto}"
        );
        assert!(matches!(list[4], Value::Float(x) if x == 0.25));
        assert!(matches!(list[5], Value::None));
        assert!(matches!(list[6], Value::Bool(true)));
        assert!(matches!(list[7], Value::Bool(false)));
        let tuple = nested.get("tuple").unwrap().items().unwrap();
        assert_eq!(tuple[1].as_str(), Some("ééé"));
        assert_eq!(root.get("long_text").unwrap().as_str().unwrap().len(), 300);
        let args = TrainingArgs::from_value(&root.get("args").unwrap()).unwrap();
        assert_eq!(args.arch.as_deref(), Some("vit_small"));
        assert_eq!(args.patch_size, Some(8));
        assert_eq!(args.selected_channels.as_deref(), Some("0,3"));
    }
}

/// Offset of the bytes of archive record `name` (after its local header and padding).
fn record_data_offset(bytes: &[u8], name: &str) -> usize {
    let at = bytes
        .windows(name.len())
        .position(|w| w == name.as_bytes())
        .unwrap();
    let header = at - 30;
    assert_eq!(&bytes[header..header + 4], b"PK\x03\x04");
    let extra = u16::from_le_bytes([bytes[header + 28], bytes[header + 29]]) as usize;
    at + name.len() + extra
}

#[test]
fn damaged_legacy_and_foreign_files_give_clear_errors() {
    let dir = zoo();
    let legacy = dir.join("legacy.pth");
    let err = BackboneWeights::load(&legacy, CheckpointKey::Teacher)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains(&legacy.display().to_string()), "{err}");
    assert!(err.contains("legacy"), "{err}");
    assert!(err.contains("torch>=1.6"), "{err}");

    let good = std::fs::read(dir.join("proto2.pth")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.pth");
    for cut in [4, 100, good.len() / 2, good.len() - 1] {
        std::fs::write(&bad, &good[..cut]).unwrap();
        let err = PthFile::open(&bad).err().unwrap().to_string();
        assert!(err.contains("bad.pth"), "cut at {cut}: {err}");
        assert!(err.contains("damaged checkpoint"), "cut at {cut}: {err}");
    }

    // A flipped byte in the pickle, then in a tensor's storage: CRC errors naming the record.
    let mut flipped = good.clone();
    flipped[record_data_offset(&good, "proto2/data.pkl") + 40] ^= 0x55;
    std::fs::write(&bad, &flipped).unwrap();
    let err = PthFile::open(&bad).err().unwrap().to_string();
    assert!(
        err.contains("proto2/data.pkl") && err.contains("CRC-32"),
        "{err}"
    );

    let f = PthFile::open(&dir.join("proto2.pth")).unwrap();
    let base = f
        .root()
        .get("tensors")
        .unwrap()
        .get("base")
        .unwrap()
        .as_tensor()
        .unwrap()
        .clone();
    let record = format!("proto2/data/{}", base.storage.key);
    let mut flipped = good.clone();
    flipped[record_data_offset(&good, &record) + 3] ^= 0x55;
    std::fs::write(&bad, &flipped).unwrap();
    let f = PthFile::open(&bad).unwrap();
    let err = f.tensor(&base).err().unwrap().to_string();
    assert!(err.contains(&record) && err.contains("CRC-32"), "{err}");

    std::fs::write(&bad, b"just some text, not a checkpoint").unwrap();
    let err = PthFile::open(&bad).err().unwrap().to_string();
    assert!(err.contains("not a PyTorch checkpoint"), "{err}");
    let err = BackboneWeights::load(&bad, CheckpointKey::Teacher)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("bad.pth"), "{err}");
}
