//! Dataset mean/std against a numpy implementation of scDINO's algorithm.
use super::util::run_python;
use trainer::data::mean_std;
use trainer::data::{generate_synthetic, ImageSource, LocalSource, SynthOptions};

/// scDINO dropped an image with a constant non-zero channel (0/0 = NaN); we keep it with the
/// channel scaled to 0, count it per channel, and otherwise match scDINO's arithmetic.
#[test]
fn mean_std_matches_numpy_with_constant_channel_images_kept() {
    let dir = tempfile::tempdir().unwrap();
    generate_synthetic(&SynthOptions {
        out: dir.path().to_path_buf(),
        seed: 4,
        classes: 3,
        per_class: 17,
        ..SynthOptions::default()
    })
    .unwrap();
    let root = dir.path().join("Training");
    // Images whose channel 1 is a non-zero constant: min–max gives NaN in scDINO.
    run_python(
        "import sys, numpy as np, tifffile\nfor i in range(4):\n    a = np.random.RandomState(i).randint(0, 4000, (50, 50, 5)).astype(np.uint16)\n    a[:, :, 1] = 7\n    tifffile.imwrite(f'{sys.argv[1]}/B/B-zz{i}.tiff', a, photometric='minisblack', planarconfig='contig')",
        &[root.to_str().unwrap()],
    );
    let source = LocalSource::open(&root, 0).unwrap();
    let index = source.index();
    assert_eq!(index.len(), 55);
    let (ours, quality) =
        mean_std::compute_with(&source, 0.2, 0, 3, trainer::config::OnCorrupt::Fail).unwrap();
    let list = dir.path().join("paths.txt");
    std::fs::write(&list, index.path_strings().join("\n")).unwrap();
    let out = run_python(
        r#"
import sys, json, numpy as np, tifffile
paths = open(sys.argv[1]).read().split("\n")
indices = list(range(len(paths)))
np.random.seed(42)
np.random.shuffle(indices)
split = int(np.floor((1 - 0.2) * len(paths)))
cnt, fst, snd = 0, np.zeros(5), np.zeros(5)
constant = np.zeros(5, dtype=int)
for i in indices[split:]:
    x = tifffile.imread(paths[i]).astype(np.float64)
    mn, mx = x.min(axis=(0, 1)), x.max(axis=(0, 1))
    constant += (mx - mn == 0)
    if np.any(mx - mn == 0):
        mx = np.where(mx == 0, 1, mx)
    rng = mx - mn
    x = np.where(rng == 0, 0.0, (x - mn) / np.where(rng == 0, 1, rng))
    x = x.astype(np.float32).astype(np.float64)  # scDINO's items are float32 tensors
    n = x.shape[0] * x.shape[1]
    fst = (cnt * fst + x.sum(axis=(0, 1))) / (cnt + n)
    snd = (cnt * snd + (x ** 2).sum(axis=(0, 1))) / (cnt + n)
    cnt += n
print(json.dumps({"mean": list(fst), "std": list(np.sqrt(snd - fst ** 2)),
                  "constant": [int(c) for c in constant], "images": len(indices[split:])}))
"#,
        &[list.to_str().unwrap()],
    );
    let reference: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let constant: Vec<usize> = reference["constant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert!(
        constant[1] >= 1,
        "the subset should include a constant image: {out}"
    );
    assert_eq!(quality.constant_images, constant);
    assert_eq!(quality.images as u64, reference["images"].as_u64().unwrap());
    assert!(ours.mean.iter().chain(&ours.std).all(|v| v.is_finite()));
    for (key, ours) in [("mean", &ours.mean), ("std", &ours.std)] {
        let theirs: Vec<f64> = reference[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        for (c, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(
                (a - b).abs() <= 1e-9 * b.abs(),
                "{key}[{c}]: {a} vs numpy {b}"
            );
        }
    }
    // The file round-trips and is the JSON scDINO writes.
    let f = dir.path().join("mean_and_std_of_dataset.txt");
    ours.write(&f).unwrap();
    assert_eq!(mean_std::MeanStd::read(&f).unwrap(), ours);
}

/// Train two steps, extract features, and recompute them in PyTorch from the checkpoint's
/// teacher weights and scDINO's preprocessing (tifffile, min–max, bilinear resize, normalise).
#[test]
fn features_match_pytorch_from_the_checkpoint() {
    let _rng = super::util::torch_rng_lock();
    use trainer::analysis::features;
    use trainer::config::Config;
    use trainer::train::run::{model_dir, train, TrainOptions};
    tch::set_num_threads(2);
    let dir = tempfile::tempdir().unwrap();
    generate_synthetic(&SynthOptions {
        out: dir.path().join("data"),
        seed: 8,
        classes: 3,
        per_class: 9,
        ..SynthOptions::default()
    })
    .unwrap();
    let yaml = format!(
        "run:\n  name: f\n  output_dir: {out}\n  seed: 5\ndata:\n  dataset_dir: {data}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"24\"]\n  num_workers: 2\nmodel:\n  arch: vit_tiny\n  out_dim: 64\ntrain:\n  epochs: 1\n  batch_size_per_gpu: 4\n  warmup_epochs: 0\n  precision: fp32\n  lr: 0.05\naugment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\ndownstream:\n  features:\n    resize_length: 48\n    batch_size_per_gpu: 4\n",
        out = dir.path().join("out").display(),
        data = dir.path().join("data/Training").display()
    );
    let cfg = Config::from_yaml(&yaml, "test").unwrap();
    let opts = TrainOptions {
        max_steps: Some(2),
        ..TrainOptions::default()
    };
    train(&cfg, &opts).unwrap();
    let ckpt = model_dir(&cfg, &[2, 4]).join("checkpoint.safetensors");
    let ms = mean_std::MeanStd::read(&cfg.run_dir().join("mean_and_std_of_dataset.txt")).unwrap();
    let set = features::extract(&cfg, 0, &ckpt, &ms).unwrap();
    assert_eq!(set.labels.len(), 5, "floor(0.2·27) held out");
    for (label, path) in set.labels.iter().zip(&set.paths) {
        assert!(path.contains(&format!("/{label}/")), "{label} vs {path}");
    }
    let files = trainer::layout::RunLayout::new(&cfg).model(&cfg, &[2, 4]);
    features::write(&files, "epoch0", &set).unwrap();
    let out_dir = files.analyses();
    let out = run_python(
        r#"
import sys, json, numpy as np, tifffile, torch, torch.nn.functional as F
from safetensors.torch import load_file
from dino_reference import VisionTransformer
ckpt, analyses, ms = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
sel = [2, 4]
state = {k[len("teacher.backbone."):]: v for k, v in load_file(ckpt).items() if k.startswith("teacher.backbone.")}
vit = VisionTransformer("vit_tiny", 16, len(sel)).eval()
vit.load_state_dict(state)
mean = torch.tensor([ms["mean"][c] for c in sel]).view(-1, 1, 1)
std = torch.tensor([ms["std"][c] for c in sel]).view(-1, 1, 1)
rows = []
for p in open(analyses + "/image_paths.csv").read().split():
    x = tifffile.imread(p).astype(np.float64)[:, :, sel]
    mn, mx = x.min(axis=(0, 1)), x.max(axis=(0, 1))
    if np.any(mx - mn == 0):
        mx = np.where(mx == 0, 1, mx)
    x = torch.from_numpy(((x - mn) / (mx - mn)).astype(np.float32)).permute(2, 0, 1)
    x = F.interpolate(x[None], size=(48, 48), mode="bilinear", align_corners=False)[0]
    rows.append((x - mean) / std)
with torch.no_grad():
    f = vit(torch.stack(rows))
f = F.normalize(f, dim=-1)
ours = np.loadtxt(analyses + "/CLS_features/epoch0_features.csv", delimiter=",")
print(float(np.abs(ours - f.double().numpy()).max()), ours.shape[0], float(np.abs(np.linalg.norm(ours, axis=1) - 1).max()))
"#,
        &[
            ckpt.to_str().unwrap(),
            out_dir.to_str().unwrap(),
            cfg.run_dir()
                .join("mean_and_std_of_dataset.txt")
                .to_str()
                .unwrap(),
        ],
    );
    let v: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(v[1], 5.0);
    assert!(v[0] <= 1e-4, "features differ from PyTorch by {}", v[0]);
    assert!(v[2] <= 1e-6, "rows are not unit norm: {}", v[2]);

    // The analyses run on `train.device`: asking for a GPU this process cannot use is an
    // error naming the key (here: no CUDA build, no GPU), never a silent CPU run.
    let on_gpu = Config::from_yaml(
        &yaml.replace("train:\n", "train:\n  device: cuda\n"),
        "test",
    )
    .unwrap();
    let e = features::extract(&on_gpu, 0, &ckpt, &ms)
        .err()
        .expect("no GPU here")
        .to_string();
    assert!(e.contains("train.device is cuda"), "{e}");
    let e = trainer::analysis::attention::write_attention_maps(
        &on_gpu,
        0,
        &ckpt,
        &ms,
        &dir.path().join("attn"),
    )
    .expect_err("no GPU here")
    .to_string();
    assert!(e.contains("train.device is cuda"), "{e}");
}

/// scDINO issue #5: a padded (all-zero) stain, a channel constant in one image, an all-zero
/// image and NaN pixels in a float TIFF. Mean/std, training and features all run and every
/// feature is finite, with the padded channel selected and not selected; the dataset's zero
/// std stays 0 in the file and is normalised with std 1.
#[test]
fn constant_and_nan_channels_train_and_give_finite_features() {
    let _rng = super::util::torch_rng_lock();
    use trainer::analysis::features;
    use trainer::config::Config;
    use trainer::train::run::{model_dir, train, TrainOptions};
    tch::set_num_threads(2);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    run_python(
        r#"
import sys, os, numpy as np, tifffile
root = sys.argv[1]
rs = np.random.RandomState(3)
for cls in ("a", "b"):
    os.makedirs(f"{root}/{cls}")
    for i in range(12):
        x = rs.rand(24, 24, 3).astype(np.float32) * 1000
        x[:, :, 0] += (300 if cls == "a" else 0) * np.linspace(0, 1, 24)[None, :]
        x[:, :, 2] = 0                          # a padded stain: zero everywhere
        if i == 0: x[:] = 0                     # an all-zero image
        if i == 1: x[:, :, 0] = 5.0             # channel 0 constant in this image only
        if i == 2: x[3:7, 3:7, 1] = np.nan      # NaN pixels in a float TIFF
        if i == 3: x[0, 0, 0] = np.inf
        tifffile.imwrite(f"{root}/{cls}/{cls}{i:02}.tiff", x, photometric="minisblack", planarconfig="contig")
"#,
        &[data.to_str().unwrap()],
    );
    let yaml = format!(
        "run:\n  name: c\n  output_dir: {out}\n  seed: 5\ndata:\n  dataset_dir: {data}\n  channel_names: [A, B, PAD]\n  channel_combinations: [\"012\", \"01\"]\n  mean_std_fraction: 1.0\n  num_workers: 1\nmodel:\n  arch: vit_tiny\n  patch_size: 8\n  out_dim: 32\ntrain:\n  epochs: 1\n  batch_size_per_gpu: 4\n  warmup_epochs: 0\n  precision: fp32\naugment:\n  global_crop_size: 16\n  local_crop_size: 8\n  local_crops_number: 2\ndownstream:\n  features:\n    resize_length: 24\n    batch_size_per_gpu: 8\n",
        out = dir.path().join("out").display(),
        data = data.display()
    );
    let cfg = Config::from_yaml(&yaml, "test").unwrap();
    for (combination, channels) in [(0, vec![0, 1, 2]), (1, vec![0, 1])] {
        let opts = TrainOptions {
            combination,
            max_steps: Some(2),
            ..TrainOptions::default()
        };
        train(&cfg, &opts).unwrap();
        let ms =
            mean_std::MeanStd::read(&cfg.run_dir().join("mean_and_std_of_dataset.txt")).unwrap();
        assert_eq!(
            ms.std[2], 0.0,
            "the padded channel's std stays 0 in the file"
        );
        assert!(ms.std[0] > 0.0 && ms.std[1] > 0.0);
        let (_, std) = ms.select(&channels, &cfg.data.channel_names);
        assert!(std.iter().all(|s| *s > 0.0), "{std:?}");
        let ckpt = model_dir(&cfg, &channels).join("checkpoint.safetensors");
        let set = features::extract(&cfg, combination, &ckpt, &ms).unwrap();
        assert_eq!(set.labels.len(), 4, "floor(0.2·24) held out");
        let finite = set.features.isfinite().all().int64_value(&[]);
        assert_eq!(finite, 1, "combination {combination}: non-finite features");
        // Every row, including the guarded images, is a real unit-norm feature.
        let norms = set.features.norm_scalaropt_dim(2.0, [1], false);
        assert!((norms - 1.0).abs().max().double_value(&[]) < 1e-5);
    }
    // The held-out rows of the guarded images are their own features, not image 0's (scDINO
    // replaced them): hold out 22 of the 24 images (seeded; a00–a02, b01, b03 among them) and compare.
    let all = Config::from_yaml(
        &yaml.replace(
            "  mean_std_fraction: 1.0\n",
            "  mean_std_fraction: 1.0\n  train_fraction: 0.05\n  split: scdino\n",
        ),
        "test",
    )
    .unwrap();
    let ms = mean_std::MeanStd::read(&cfg.run_dir().join("mean_and_std_of_dataset.txt")).unwrap();
    let ckpt = model_dir(&cfg, &[0, 1, 2]).join("checkpoint.safetensors");
    let set = features::extract(&all, 0, &ckpt, &ms).unwrap();
    assert_eq!(set.labels.len(), 22);
    let f = &set.features;
    let row = |p: &str| {
        let found = set.paths.iter().position(|q| q.ends_with(&format!("/{p}")));
        found.unwrap_or_else(|| panic!("{p} is not held out: {:?}", set.paths)) as i64
    };
    for guarded in ["a01.tiff", "a02.tiff", "b01.tiff", "b03.tiff"] {
        let d = (f.get(row(guarded)) - f.get(row("a00.tiff")))
            .abs()
            .max()
            .double_value(&[]);
        assert!(d > 1e-4, "{guarded} has the all-zero image's features");
    }
}
