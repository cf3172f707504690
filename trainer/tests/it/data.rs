//! Oracle tests of `trainer::data` against numpy / tifffile in the venv.
//!
//! Each test has Python compute the reference (tifffile decoding, numpy's
//! legacy RandomState shuffle, scDINO's min–max, ImageFolder's walk) and
//! compares value for value.

use std::path::Path;

use serde_json::Value;
use trainer::data::{
    build_index, decode_tiff_into, generate_synthetic, mean_std_subset, numpy_shuffled_indices,
    preprocess, read_tiff, train_heldout_split, Chw, DataError, ImageChw, SynthOptions,
};

use super::util::run_python;

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("bad JSON from python ({e}): {stdout:.300}"))
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().map_or(f32::NAN, |f| f as f32))
        .collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("index") as usize)
        .collect()
}

/// Bitwise equality that treats NaN == NaN (JSON `null` stands for NaN).
fn assert_same_f32(ours: &[f32], theirs: &[f32], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        assert!(same, "{what}: element {i}: ours {a:?}, reference {b:?}");
    }
}

const WRITE_LAYOUTS: &str = r#"
import sys, json, numpy as np, tifffile
d = sys.argv[1]
rng = np.random.default_rng(1)
H, W, C = 7, 9, 5
out = {}
def put(name, arr_chw, **kw):
    data = kw.pop('data')
    tifffile.imwrite(f'{d}/{name}.tif', data, **kw)
    back = tifffile.imread(f'{d}/{name}.tif')
    assert back.shape == data.shape, (name, back.shape, data.shape)
    out[name] = {'shape': list(arr_chw.shape),
                 'chw': arr_chw.astype(np.float32).ravel().tolist()}
for dt in ['uint8', 'uint16', 'float32', 'int16', 'uint32', 'float64']:
    if dt.startswith('float'):
        hwc = (rng.standard_normal((H, W, C)) * 1000).astype(dt)
    else:
        info = np.iinfo(dt)
        hwc = rng.integers(info.min, min(info.max, 2**24), (H, W, C), endpoint=True).astype(dt)
    put(f'contig_{dt}', hwc.transpose(2, 0, 1), data=hwc,
        photometric='minisblack', planarconfig='contig')
for dt in ['uint16', 'float32']:
    hwc = (rng.integers(0, 65535, (H, W, C))).astype(dt)
    put(f'contig_{dt}_bigendian', hwc.transpose(2, 0, 1), data=hwc,
        photometric='minisblack', planarconfig='contig', byteorder='>')
chw = rng.integers(0, 65535, (C, 40, W)).astype('uint16')
put('planar_strips', chw, data=chw, photometric='minisblack', planarconfig='separate',
    rowsperstrip=3)
hwc = rng.integers(0, 65535, (H, W, C)).astype('uint16')
put('contig_zlib', hwc.transpose(2, 0, 1), data=hwc, photometric='minisblack',
    planarconfig='contig', compression='zlib')
hwc = rng.integers(0, 65535, (20, 18, C)).astype('uint16')
put('contig_tiled', hwc.transpose(2, 0, 1), data=hwc, photometric='minisblack',
    planarconfig='contig', tile=(16, 16))
chw = rng.integers(0, 65535, (C, H, W)).astype('uint16')
put('planar_separate', chw, data=chw, photometric='minisblack', planarconfig='separate')
put('page_stack', chw, data=chw)
put('single_gray', chw[:1], data=chw[0])
# Two pages of different sizes must be rejected.
with tifffile.TiffWriter(f'{d}/mismatch.tif') as tw:
    tw.write(chw[0])
    tw.write(chw[1, :5, :5])
print(json.dumps(out))
"#;

#[test]
fn reader_matches_tifffile_for_every_layout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let expected = json(&run_python(WRITE_LAYOUTS, &[d]));
    let cases = expected.as_object().unwrap();
    assert!(cases.len() >= 14);
    for (name, case) in cases {
        let path = dir.path().join(format!("{name}.tif"));
        let img = read_tiff(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let shape = usizes(&case["shape"]);
        assert_eq!(
            vec![img.channels, img.height, img.width],
            shape,
            "{name}: shape"
        );
        assert_same_f32(&img.data, &f32s(&case["chw"]), name);
        // The loader's allocation-free path: same values, and taken exactly for the
        // uncompressed, striped, single-page files.
        let bytes = std::fs::read(&path).unwrap();
        let mut fast = ImageChw::default();
        let took_fast = trainer::data::tiff_fast::decode_uncompressed(&bytes, &mut fast);
        let expect_fast = !matches!(name.as_str(), "contig_zlib" | "contig_tiled" | "page_stack");
        assert_eq!(took_fast, expect_fast, "{name}: fast path taken");
        let mut via = ImageChw::default();
        decode_tiff_into(&bytes, &path, &mut via).unwrap();
        assert_eq!(via, img, "{name}: decode_tiff_into");
    }
    let err = read_tiff(&dir.path().join("mismatch.tif")).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::UnsupportedTiff { .. }), "{msg}");
    assert!(
        msg.contains("mismatch.tif") && msg.contains("same size"),
        "{msg}"
    );
}

#[test]
fn truncated_files_on_disk_are_errors_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    run_python(WRITE_LAYOUTS, &[d]);
    for name in [
        "contig_uint16",
        "planar_separate",
        "page_stack",
        "contig_zlib",
    ] {
        let bytes = std::fs::read(dir.path().join(format!("{name}.tif"))).unwrap();
        let cut_path = dir.path().join(format!("{name}-cut.tif"));
        let full = read_tiff(&dir.path().join(format!("{name}.tif"))).unwrap();
        // A cut may only drop bytes nobody reads (e.g. resolution values
        // after the last IFD); then the image must still be exactly right.
        // Anything else must be an error that names the file.
        let (mut cuts, mut errors) = (0, 0);
        for cut in (0..bytes.len()).step_by(5) {
            std::fs::write(&cut_path, &bytes[..cut]).unwrap();
            cuts += 1;
            match read_tiff(&cut_path) {
                Ok(img) => assert_eq!(img, full, "{name} cut at {cut} decoded to different data"),
                Err(err) => {
                    errors += 1;
                    assert!(
                        err.to_string().contains(&format!("{name}-cut.tif")),
                        "{err}"
                    );
                }
            }
        }
        assert!(
            errors * 10 > cuts * 9,
            "{name}: only {errors} of {cuts} cuts failed"
        );
    }
    let garbage = dir.path().join("garbage.tiff");
    std::fs::write(&garbage, b"this is not a tiff file at all").unwrap();
    assert!(matches!(read_tiff(&garbage), Err(DataError::Tiff { .. })));
}

const READ_SYNTH: &str = r#"
import sys, json, glob, numpy as np, tifffile
out = {}
for f in sorted(glob.glob(sys.argv[1] + '/**/*.tiff', recursive=True)):
    with tifffile.TiffFile(f) as tf:
        page = tf.pages[0]
        a = tf.asarray()
        tags = {t.name: t.value for t in page.tags.values()}
        out[f] = {'shape': list(a.shape), 'dtype': str(a.dtype), 'pages': len(tf.pages),
                  'planar': int(tags.get('PlanarConfiguration', 1)),
                  'extra': list(tags.get('ExtraSamples', ())),
                  'hwc': a.astype(np.float32).ravel().tolist()}
print(json.dumps(out))
"#;

#[test]
fn synthetic_files_read_identically_in_tifffile() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SynthOptions {
        out: dir.path().to_path_buf(),
        seed: 11,
        classes: 3,
        per_class: 4,
        ..SynthOptions::default()
    };
    let summary = generate_synthetic(&opts).unwrap();
    let files = json(&run_python(READ_SYNTH, &[dir.path().to_str().unwrap()]));
    let files = files.as_object().unwrap();
    assert_eq!(files.len(), summary.train_images + summary.test_images);
    assert_eq!(files.len(), 3 * 4 + 3);
    for (path, info) in files {
        assert_eq!(usizes(&info["shape"]), vec![50, 50, 5], "{path}");
        assert_eq!(info["dtype"], "uint16", "{path}");
        assert_eq!(info["pages"], 1, "{path}");
        assert_eq!(info["planar"], 1, "{path}");
        assert_eq!(usizes(&info["extra"]), vec![0, 0, 0, 0], "{path}");
        let ours = read_tiff(Path::new(path)).unwrap();
        assert_same_f32(&ours.to_hwc(), &f32s(&info["hwc"]), path);
    }
    // The synthetic Training folder is a valid ImageFolder with the PBMC-like classes.
    let index = build_index(&summary.training_dir, 0).unwrap();
    assert_eq!(index.classes, vec!["B", "CD4T", "CD8T"]);
    assert_eq!(index.len(), 12);
}

const NUMPY_SHUFFLES: &str = r#"
import sys, json, numpy as np
out = {}
for n in map(int, sys.argv[1].split(',')):
    for seed in map(int, sys.argv[2].split(',')):
        np.random.seed(seed)
        x = list(range(n))
        np.random.shuffle(x)
        out[f'{n}/{seed}'] = x
print(json.dumps(out))
"#;

const NS: &str = "0,1,2,3,100,1000,113564";
const SEEDS: [u32; 4] = [40, 42, 0, u32::MAX];

#[test]
fn shuffle_matches_numpy_legacy_random_state() {
    let seeds = SEEDS.map(|s| s.to_string()).join(",");
    let expected = json(&run_python(NUMPY_SHUFFLES, &[NS, &seeds]));
    let mut checked = 0;
    for n in NS.split(',').map(|s| s.parse::<usize>().unwrap()) {
        for seed in SEEDS {
            let theirs = usizes(&expected[format!("{n}/{seed}")]);
            let ours = numpy_shuffled_indices(n, seed);
            if let Some(i) = ours.iter().zip(&theirs).position(|(a, b)| a != b) {
                panic!(
                    "n={n} seed={seed}: first difference at {i}: ours {} numpy {}",
                    ours[i], theirs[i]
                );
            }
            assert_eq!(ours.len(), theirs.len());
            checked += 1;
        }
    }
    assert_eq!(checked, 28);
}

const SCDINO_SPLITS: &str = r#"
import sys, json, numpy
out = []
for n in map(int, sys.argv[1].split(',')):
    for frac in map(float, sys.argv[2].split(',')):
        for seed in map(int, sys.argv[3].split(',')):
            # main_dino.py, verbatim
            validation_split = float(1 - frac)
            indices = list(range(n))
            split = int(numpy.floor(validation_split * n))
            numpy.random.seed(seed)
            numpy.random.shuffle(indices)
            train_indices, val_indices = indices[split:], indices[:split]
            out.append({'n': n, 'frac': frac, 'seed': seed,
                        'train': train_indices, 'val': val_indices})
        # mean_std_dataset.py: seed 42, fraction_for_mean_std_calc = frac
        validation_split = 1 - frac
        indices = list(range(n))
        split = int(numpy.floor(validation_split * n))
        numpy.random.seed(42)
        numpy.random.shuffle(indices)
        out.append({'n': n, 'frac': frac, 'seed': 'meanstd', 'subset': indices[split:]})
print(json.dumps(out))
"#;

#[test]
fn splits_match_scdino_python() {
    let fracs = "0.8,0.7,0.9,0.2,0.33,1.0,0.0";
    let expected = json(&run_python(
        SCDINO_SPLITS,
        &["0,1,2,100,1000,113564", fracs, "40,0,4294967295"],
    ));
    let cases = expected.as_array().unwrap();
    assert_eq!(cases.len(), 6 * 7 * 4);
    for case in cases {
        let n = case["n"].as_u64().unwrap() as usize;
        let frac = case["frac"].as_f64().unwrap();
        if case["seed"] == "meanstd" {
            assert_eq!(
                mean_std_subset(n, frac).unwrap(),
                usizes(&case["subset"]),
                "mean/std n={n} f={frac}"
            );
        } else {
            let seed = case["seed"].as_u64().unwrap() as u32;
            let s = train_heldout_split(n, frac, seed).unwrap();
            assert_eq!(
                s.held_out,
                usizes(&case["val"]),
                "held-out n={n} f={frac} seed={seed}"
            );
            assert_eq!(
                s.train,
                usizes(&case["train"]),
                "train n={n} f={frac} seed={seed}"
            );
        }
    }
    // The quirk the f64 arithmetic must reproduce: 1 - 0.8 = 0.19999999999999996.
    assert_eq!(
        train_heldout_split(100, 0.8, 40).unwrap().held_out.len(),
        19
    );
}

const MINMAX: &str = r#"
import sys, json, numpy as np
cases = json.load(open(sys.argv[1]))
out = []
for c in cases:
    x = np.array([np.nan if v is None else v for v in c['hwc']], dtype=np.float64)
    x = x.reshape(c['h'], c['w'], c['c'])[:, :, c['sel']]
    # scDINO utils.normalize_numpy_0_to_1 at HEAD (zero-max fix of 8b2236b)
    x_min = x.min(axis=(0, 1), keepdims=True)
    x_max = x.max(axis=(0, 1), keepdims=True)
    if (x_max - x_min == 0).any():
        x_max[x_max == 0] = 1
    with np.errstate(invalid='ignore', divide='ignore'):
        scdino = (x - x_min) / (x_max - x_min)
    # The guarded version: min/max over finite pixels (0 if none), the same zero-max rule,
    # then a zero range or a non-finite pixel gives 0.
    finite = np.isfinite(x)
    lo = np.where(finite, x, np.inf).min(axis=(0, 1), keepdims=True)
    hi = np.where(finite, x, -np.inf).max(axis=(0, 1), keepdims=True)
    none = ~finite.any(axis=(0, 1), keepdims=True)
    lo[none] = 0
    hi[none] = 0
    constant = (hi - lo == 0)
    if constant.any():
        hi[hi == 0] = 1
    rng = hi - lo
    with np.errstate(invalid='ignore', divide='ignore'):
        g = np.where(finite & (rng != 0), (np.where(finite, x, 0) - lo) / np.where(rng == 0, 1, rng), 0.0)
    f32 = lambda a: [None if np.isnan(v) else float(v) for v in a.astype(np.float32).transpose(2, 0, 1).ravel()]
    out.append({'chw': f32(g), 'scdino': f32(scdino), 'scdino_nan': bool(np.isnan(scdino).any()),
                'constant': [int(i) for i in np.flatnonzero(constant.ravel())],
                'nonfinite': int((~finite).sum())})
print(json.dumps(out))
"#;

/// Deterministic test images (H×W×C) covering the min–max edge cases.
fn minmax_cases() -> Vec<(ImageChw, Vec<usize>)> {
    let (h, w) = (6, 5);
    let mut state = 7u64;
    let mut rnd = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32
    };
    let mut cases = Vec::new();
    // 1. normal u16-like channels, all 5 selected.
    let data: Vec<f32> = (0..5 * h * w).map(|_| (rnd() % 65536.0).floor()).collect();
    cases.push((Chw::new(5, h, w, data).unwrap(), vec![0, 1, 2, 3, 4]));
    // 2. all-zero channel next to a normal one (zero-max rule, no NaN).
    let mut data = vec![0.0; 3 * h * w];
    for v in &mut data[..h * w] {
        *v = (rnd() % 4096.0).floor();
    }
    cases.push((Chw::new(3, h, w, data.clone()).unwrap(), vec![0, 1, 2]));
    // 3. constant non-zero channel: NaN in scDINO, 0 here.
    for v in &mut data[h * w..2 * h * w] {
        *v = 1234.0;
    }
    cases.push((Chw::new(3, h, w, data.clone()).unwrap(), vec![2, 1, 0]));
    // 3b. the same image with the constant channel not selected.
    cases.push((Chw::new(3, h, w, data.clone()).unwrap(), vec![0, 2]));
    // 4. a channel in [-x, 0] plus a zero channel (max := 1 for both).
    for v in &mut data[h * w..2 * h * w] {
        *v = -(rnd() % 100.0).floor();
    }
    cases.push((Chw::new(3, h, w, data.clone()).unwrap(), vec![1, 2]));
    // 5. non-integer floats, channel subset with a repeat.
    let data: Vec<f32> = (0..4 * h * w).map(|_| rnd() / 3.7e5 - 11.0).collect();
    cases.push((Chw::new(4, h, w, data.clone()).unwrap(), vec![3, 0, 3]));
    // 6. a float image with NaN and ∞ pixels in one channel, and a channel all NaN.
    let mut data = data;
    data[3] = f32::NAN;
    data[h * w + 7] = f32::INFINITY;
    data[h * w + 8] = f32::NEG_INFINITY;
    for v in &mut data[2 * h * w..3 * h * w] {
        *v = f32::NAN;
    }
    cases.push((Chw::new(4, h, w, data).unwrap(), vec![0, 1, 2, 3]));
    // 7. an all-zero image.
    cases.push((Chw::new(2, h, w, vec![0.0; 2 * h * w]).unwrap(), vec![0, 1]));
    cases
}

/// Guarded min–max against a numpy oracle, and bit-identical to scDINO's own
/// `normalize_numpy_0_to_1` wherever scDINO's result has no NaN.
#[test]
fn minmax_matches_scdino_numpy() {
    let cases = minmax_cases();
    let payload: Vec<Value> = cases
        .iter()
        .map(|(img, sel)| {
            serde_json::json!({
                "h": img.height, "w": img.width, "c": img.channels, "sel": sel,
                "hwc": img.to_hwc().iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cases.json");
    std::fs::write(&input, serde_json::to_string(&payload).unwrap()).unwrap();
    let expected = json(&run_python(MINMAX, &[input.to_str().unwrap()]));
    let (mut scdino_nan, mut scdino_clean) = (0, 0);
    for (i, ((img, sel), reference)) in cases.iter().zip(expected.as_array().unwrap()).enumerate() {
        let opts = preprocess::PreprocessOptions {
            selected_channels: Some(sel.clone()),
            center_crop: 0,
        };
        let (out, outcome) = preprocess::preprocess(img, &opts).unwrap();
        assert!(
            out.data.iter().all(|v| v.is_finite()),
            "case {i}: not finite"
        );
        assert_same_f32(&out.data, &f32s(&reference["chw"]), &format!("case {i}"));
        assert_eq!(
            outcome.constant_channels,
            usizes(&reference["constant"]),
            "case {i}: constant channels"
        );
        assert_eq!(
            outcome.nonfinite_pixels as u64,
            reference["nonfinite"].as_u64().unwrap(),
            "case {i}: non-finite pixels"
        );
        if reference["scdino_nan"].as_bool().unwrap() {
            scdino_nan += 1;
        } else {
            scdino_clean += 1;
            assert_same_f32(
                &out.data,
                &f32s(&reference["scdino"]),
                &format!("case {i} = scDINO"),
            );
        }
    }
    assert!(
        scdino_nan >= 2 && scdino_clean >= 4,
        "{scdino_nan} NaN / {scdino_clean} clean cases"
    );
}

const IMAGEFOLDER: &str = r#"
import os, sys, json
# torchvision.datasets.folder.find_classes + make_dataset (torchvision is not
# in the venv), restricted to TIFF like our indexer.
root = sys.argv[1]
classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
samples = []
for ci, c in enumerate(classes):
    for r, _, fnames in sorted(os.walk(os.path.join(root, c), followlinks=True)):
        for f in sorted(fnames):
            p = os.path.join(r, f)
            if p.lower().endswith(('.tif', '.tiff')):
                samples.append([p, ci, p.split('/')[-1 - 2]])
print(json.dumps({'classes': classes, 'samples': samples}))
"#;

#[test]
fn index_matches_python_imagefolder_walk() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    for f in [
        "B/x/z/1.tif",
        "B/x-y/2.TIFF",
        "B/x/3.tiff",
        "B/4.tif",
        "B/x.y/5.tif",
        "B/notes.txt",
        "b/6.tif",
        "NK/Sub dir/7.tif",
        "NaiveT/8.tif",
        "NaiveT/a/9.tif",
        "CD4T/deep/er/10.tif",
        "Ümlaut/11.tif",
    ] {
        let p = root.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"").unwrap();
    }
    let expected = json(&run_python(IMAGEFOLDER, &[root.to_str().unwrap()]));
    let index = build_index(&root, 1).unwrap();
    let classes: Vec<String> = expected["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(index.classes, classes);
    let samples = expected["samples"].as_array().unwrap();
    assert_eq!(index.len(), samples.len());
    for (ours, theirs) in index.samples.iter().zip(samples) {
        assert_eq!(ours.path.to_str().unwrap(), theirs[0].as_str().unwrap());
        assert_eq!(ours.class_index as u64, theirs[1].as_u64().unwrap());
        assert_eq!(ours.label, theirs[2].as_str().unwrap());
    }
}

/// `data.split: stratified` on a real folder keeps scDINO's held-out count and holds out
/// every class, where scDINO's split at the same seed need not; `trainer pipeline`'s up-front
/// check names a held-out split too small to score (k above its kNN bank, classes missing)
/// with what to do, and is silent where the split can be scored.
#[test]
fn stratified_split_and_the_small_held_out_warning() {
    let dir = tempfile::tempdir().unwrap();
    generate_synthetic(&SynthOptions {
        out: dir.path().to_path_buf(),
        seed: 2,
        classes: 3,
        per_class: 8,
        size: 16,
        channels: 2,
        ..SynthOptions::default()
    })
    .unwrap();
    let cfg = |split: &str, fraction: f64, k: &str| {
        trainer::config::Config::from_yaml(
            &format!(
                "run: {{name: s, output_dir: {out}, seed: 7}}\ndata: {{dataset_dir: {data}, channel_names: [a, b], channel_combinations: [\"01\"], train_fraction: {fraction}, split: {split}}}\nmodel: {{arch: vit_tiny, patch_size: 4}}\naugment: {{global_crop_size: 8, local_crop_size: 4}}\ndownstream: {{knn: {{k: [{k}]}}}}\n",
                out = dir.path().join("out").display(),
                data = dir.path().join("Training").display(),
            ),
            "test",
        )
        .unwrap()
    };
    let c = cfg("stratified", 0.75, "20");
    let source = trainer::data::open_source(&c.data).unwrap();
    let index = source.index();
    let s = trainer::data::configured_split(index, &c.data, 7).unwrap();
    assert_eq!(
        s.held_out.len(),
        train_heldout_split(24, 0.75, 7).unwrap().held_out.len()
    );
    let labels: std::collections::BTreeSet<&str> =
        index.samples.iter().map(|x| x.label.as_str()).collect();
    assert_eq!(labels.len(), 3);
    for class in labels {
        let n = s
            .held_out
            .iter()
            .filter(|&&i| index.samples[i].label == class)
            .count();
        assert_eq!(n, 2, "{class}");
    }
    let small = trainer::pipeline::warn_small_held_out(&cfg("scdino", 0.95, "10, 20"))
        .unwrap()
        .expect("1 held-out image of 24 must be named");
    assert!(
        small.contains("1 of 24 images")
            && small.contains("k up to 20")
            && small.contains("2 of 3 classes have no held-out image")
            && small.contains("data.test_dir")
            && small.contains("data.split: stratified"),
        "{small}"
    );
    assert_eq!(
        trainer::pipeline::warn_small_held_out(&cfg("stratified", 0.5, "1, 5")).unwrap(),
        None
    );
}
