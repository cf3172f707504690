//! Oracle and statistical tests of `trainer::augment` (scDINO multi-crop).
//!
//! * Each operation with fixed parameters is compared with torchvision 0.28 /
//!   PyTorch in the venv (`tests/py/augment_oracle.py`) to 1e-5 (max abs).
//! * Random parameters are compared with torchvision's own
//!   `RandomResizedCrop.get_params` (two-sample Kolmogorov–Smirnov bounds) and
//!   with the scDINO probabilities (binomial / uniform standard errors).
//! * Determinism, caller-buffer and threading equivalence, pixel statistics.

use std::path::Path;

use serde_json::{json, Value};
use trainer::augment::resize::CubicAxis;
use trainer::augment::DeviceAugment;
use trainer::augment::{
    adjust_brightness, crop_size_for_attempt, fallback_crop, gaussian_blur, hflip, normalize,
    random_resized_crop_params, resized_crop, resized_crop_hw, resized_crop_into, solarize, vflip,
    CropParams, CropRect, MultiCropAugment, MultiCropConfig, ResizeScratch, SampleKey, SampleRng,
    SCDINO_RATIO,
};
use trainer::data::ImageChw;

use super::util::run_py_file;

const TOL: f32 = 1e-5;
/// scDINO's published PBMC normalisation (mean tuple, std tuple).
const PBMC_MEAN: [f32; 5] = [0.2981, 0.5047, 0.1918, 0.2809, 0.3800];
const PBMC_STD: [f32; 5] = [0.2232, 0.1659, 0.2403, 0.1938, 0.1956];

// ---------------------------------------------------------------- helpers

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("bad JSON from python ({e}): {stdout:.300}"))
}

/// Uniform noise in [0, 1): the hardest input for interpolation parity.
fn noise_image(c: usize, h: usize, w: usize, seed: u64) -> ImageChw {
    let mut rng = SampleRng::from_seed(seed);
    let data = (0..c * h * w).map(|_| rng.uniform_f32()).collect();
    ImageChw::new(c, h, w, data).unwrap()
}

/// A smooth cell-like image in [0, 1] (blobs of different widths per channel).
fn smooth_image(c: usize, h: usize, w: usize) -> ImageChw {
    let mut data = Vec::with_capacity(c * h * w);
    for ch in 0..c {
        let r = 4.0 + 3.0 * ch as f32;
        for y in 0..h {
            for x in 0..w {
                let dy = y as f32 - h as f32 * (0.4 + 0.05 * ch as f32);
                let dx = x as f32 - w as f32 * 0.55;
                let v = (-(dx * dx + dy * dy) / (2.0 * r * r)).exp();
                data.push(0.05 + 0.9 * v);
            }
        }
    }
    ImageChw::new(c, h, w, data).unwrap()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_nan() || y.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f32::max)
}

/// A batch of oracle cases exchanged with python through raw f32 files.
struct Oracle {
    dir: tempfile::TempDir,
    cases: Vec<Value>,
}

impl Oracle {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            cases: Vec::new(),
        }
    }

    fn add(&mut self, op: &str, img: &ImageChw, params: Value) -> usize {
        let n = self.cases.len();
        let name = format!("in_{n}.f32");
        let bytes: Vec<u8> = img.data.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(self.dir.path().join(&name), bytes).unwrap();
        self.cases.push(json!({
            "op": op, "input": name,
            "shape": [img.channels, img.height, img.width], "params": params,
        }));
        n
    }

    /// Runs python; returns each case's output (shape, values).
    fn run(&self) -> Vec<(Vec<usize>, Vec<f32>)> {
        let d = self.dir.path();
        std::fs::write(
            d.join("spec.json"),
            json!({ "cases": self.cases }).to_string(),
        )
        .unwrap();
        let shapes = json(&run_py_file(
            "augment_oracle.py",
            &["ops", d.to_str().unwrap()],
        ));
        shapes
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(n, s)| {
                let shape: Vec<usize> = s
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as usize)
                    .collect();
                (shape, read_f32(&d.join(format!("out_{n}.f32"))))
            })
            .collect()
    }
}

fn read_f32(p: &Path) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn check(what: &str, ours: &ImageChw, theirs: &(Vec<usize>, Vec<f32>)) -> f32 {
    assert_eq!(
        theirs.0,
        vec![ours.channels, ours.height, ours.width],
        "{what}: shape"
    );
    let d = max_abs(&ours.data, &theirs.1);
    assert!(d <= TOL, "{what}: max |ours − torch| = {d:e} > {TOL:e}");
    d
}

fn crop_json(p: &CropParams) -> Value {
    let r = p.rect;
    json!({
        "rect": [r.top, r.left, r.height, r.width],
        "out_size": p.out_size,
        "hflip": p.hflip,
        "vflip": p.vflip,
        "brightness": p.brightness.iter().map(|&f| f as f64).collect::<Vec<_>>(),
        "blur_sigma": p.blur_sigma.map(|s| s as f64),
        "solarize": p.solarize,
    })
}

fn pbmc_augment() -> MultiCropAugment {
    MultiCropAugment::new(MultiCropConfig::scdino(
        PBMC_MEAN.to_vec(),
        PBMC_STD.to_vec(),
    ))
    .unwrap()
}

// ------------------------------------------------- fixed-parameter parity

#[test]
fn resized_crop_matches_torchvision_and_interpolate() {
    let images = [
        noise_image(1, 50, 50, 1),
        noise_image(5, 50, 50, 2),
        noise_image(5, 37, 53, 3),
    ];
    // (top, left, h, w, out_h, out_w): up-sampling (scDINO's case), full
    // image, down-sampling, non-square crops and outputs, 1-px and 2×3 crops
    // at the border, identity size.
    let rects: [(usize, usize, usize, usize, usize, usize); 10] = [
        (3, 5, 20, 25, 224, 224),
        (0, 0, 37, 50, 224, 224),
        (1, 2, 34, 44, 16, 16),
        (10, 0, 11, 32, 96, 96),
        (36, 49, 1, 1, 8, 8),
        (0, 47, 2, 3, 7, 7),
        (5, 5, 30, 20, 17, 45),
        (0, 0, 37, 50, 37, 50),
        (7, 3, 29, 33, 29, 33),
        (2, 9, 33, 41, 61, 23),
    ];
    let mut oracle = Oracle::new();
    let mut ours = Vec::new();
    for (n, img) in images.iter().enumerate() {
        for &(t, l, h, w, oh, ow) in &rects {
            let out = if oh == ow {
                resized_crop(img, t, l, h, w, oh).unwrap()
            } else {
                resized_crop_hw(img, CropRect::new(t, l, h, w), oh, ow).unwrap()
            };
            let p = json!({"top": t, "left": l, "h": h, "w": w, "out_h": oh, "out_w": ow});
            let a = oracle.add("resized_crop", img, p.clone());
            let b = oracle.add("interpolate", img, p);
            ours.push((
                format!("image {n} rect {:?}", (t, l, h, w, oh, ow)),
                out,
                a,
                b,
            ));
        }
    }
    let theirs = oracle.run();
    let mut worst = 0.0f32;
    for (what, out, a, b) in &ours {
        worst = worst.max(check(&format!("F.resized_crop {what}"), out, &theirs[*a]));
        worst = worst.max(check(&format!("F.interpolate {what}"), out, &theirs[*b]));
    }
    eprintln!("resized_crop: worst max-abs difference {worst:e}");
}

#[test]
fn folded_flips_equal_flip_after_resize() {
    let img = noise_image(3, 40, 45, 9);
    let rect = CropRect::new(4, 6, 23, 31);
    let base = resized_crop(&img, 4, 6, 23, 31, 64).unwrap();
    for (hf, vf) in [(true, false), (false, true), (true, true)] {
        let mut expect = base.clone();
        if hf {
            hflip(&mut expect);
        }
        if vf {
            vflip(&mut expect);
        }
        let mut out = vec![0.0; expect.data.len()];
        resized_crop_into(
            &img.data,
            3,
            40,
            45,
            rect,
            64,
            64,
            hf,
            vf,
            &mut out,
            &mut ResizeScratch::default(),
        );
        assert_eq!(
            out, expect.data,
            "flips ({hf}, {vf}) folded into the tables"
        );
    }
}

#[test]
fn pointwise_ops_and_blur_match_torchvision() {
    let img1 = noise_image(1, 50, 50, 11);
    let img5 = noise_image(5, 24, 31, 12);
    let tiny = noise_image(2, 3, 3, 13);
    let big = noise_image(5, 224, 224, 14);
    let mut oracle = Oracle::new();
    let mut ours: Vec<(String, ImageChw, usize)> = Vec::new();

    for (n, img) in [&img1, &img5].into_iter().enumerate() {
        let mut a = img.clone();
        hflip(&mut a);
        ours.push((format!("hflip {n}"), a, oracle.add("hflip", img, json!({}))));
        let mut a = img.clone();
        vflip(&mut a);
        ours.push((format!("vflip {n}"), a, oracle.add("vflip", img, json!({}))));
        for t in [0.5f32, 0.3] {
            let mut a = img.clone();
            solarize(&mut a, t);
            let k = oracle.add("solarize", img, json!({ "threshold": t }));
            ours.push((format!("solarize {t} {n}"), a, k));
        }
    }
    // Brightness: factors above 1 exercise the clamp at 1.
    for (img, factors) in [
        (&img1, vec![1.25f32]),
        (&img1, vec![0.5]),
        (&img5, vec![0.5, 1.25, 0.8137, 1.0, 1.1999]),
    ] {
        let mut a = img.clone();
        adjust_brightness(&mut a, &factors).unwrap();
        let f64s: Vec<f64> = factors.iter().map(|&f| f as f64).collect();
        let k = oracle.add("brightness", img, json!({ "factors": f64s }));
        ours.push((format!("brightness {factors:?}"), a, k));
    }
    for img in [&img1, &img5, &tiny, &big] {
        for sigma in [0.1f32, 0.5, 0.9871, 1.5] {
            let mut a = img.clone();
            gaussian_blur(&mut a, sigma).unwrap();
            let k = oracle.add("blur", img, json!({ "sigma": sigma as f64 }));
            let what = format!(
                "blur σ={sigma} {}×{}×{}",
                img.channels, img.height, img.width
            );
            ours.push((what, a, k));
        }
    }
    let mean: Vec<f32> = PBMC_MEAN.to_vec();
    let std: Vec<f32> = PBMC_STD.to_vec();
    let mut a = img5.clone();
    normalize(&mut a, &mean, &std).unwrap();
    let k = oracle.add(
        "normalize",
        &img5,
        json!({ "mean": mean.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                "std": std.iter().map(|&v| v as f64).collect::<Vec<_>>() }),
    );
    ours.push(("normalize".into(), a, k));

    let theirs = oracle.run();
    let mut worst = 0.0f32;
    for (what, out, k) in &ours {
        worst = worst.max(check(what, out, &theirs[*k]));
    }
    eprintln!("pointwise/blur: worst max-abs difference {worst:e}");

    // The clamp did act (values of 1.25·x > 1 exist in noise).
    let bright = &ours
        .iter()
        .find(|o| o.0.starts_with("brightness [1.25"))
        .unwrap()
        .1;
    assert!(bright.data.iter().filter(|&&v| v == 1.0).count() > 100);
}

#[test]
fn whole_pipeline_matches_torchvision_composition() {
    let aug = pbmc_augment();
    let img = smooth_image(5, 50, 50);
    // Pick sample indices so that every branch is exercised at least once.
    let mut picked: Vec<u64> = Vec::new();
    type Pred = fn(&CropParams) -> bool;
    let wanted: [(&str, Pred); 7] = [
        ("solarize", |p| p.solarize),
        ("no brightness", |p| p.brightness.is_empty()),
        ("brightness", |p| !p.brightness.is_empty()),
        ("no blur", |p| p.blur_sigma.is_none()),
        ("hflip only", |p| p.hflip && !p.vflip),
        ("vflip only", |p| p.vflip && !p.hflip),
        ("both flips", |p| p.hflip && p.vflip),
    ];
    for (name, pred) in wanted {
        let idx = (0..1000u64)
            .find(|&i| aug.plan(50, 50, SampleKey::new(7, 3, i)).iter().any(pred))
            .unwrap_or_else(|| panic!("no sample with {name}"));
        if !picked.contains(&idx) {
            picked.push(idx);
        }
    }
    let mut oracle = Oracle::new();
    let mut ours = Vec::new();
    for &i in &picked {
        let key = SampleKey::new(7, 3, i);
        let crops = aug.apply(&img, key).unwrap();
        for (k, (crop, p)) in crops.into_iter().zip(aug.plan(50, 50, key)).enumerate() {
            let spec = json!({
                "crop": crop_json(&p),
                "mean": PBMC_MEAN.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                "std": PBMC_STD.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            });
            let n = oracle.add("pipeline", &img, spec);
            ours.push((format!("sample {i} crop {k} {p:?}"), crop, n));
        }
    }
    let theirs = oracle.run();
    let mut worst = 0.0f32;
    for (what, out, n) in &ours {
        worst = worst.max(check(what, out, &theirs[*n]));
    }
    eprintln!(
        "pipeline: {} crops of samples {picked:?}, worst max-abs difference {worst:e}",
        ours.len()
    );
}

// ------------------------------------------------- crop geometry

#[test]
fn attempt_sizes_and_fallback_match_torchvision() {
    // Exact ties (sqrt = k + 0.5) check Python's round-half-to-even.
    let mut pairs: Vec<(f64, f64)> = vec![
        (6.25, 1.0),
        (12.25, 1.0),
        (2.25, 1.0),
        (0.25, 1.0),
        (30.25, 1.0),
        (2500.0, 1.0),
        (2550.25, 1.0),
        (1000.0, 0.75),
        (1000.0, 4.0 / 3.0),
    ];
    let mut rng = SampleRng::from_seed(5);
    for _ in 0..400 {
        pairs.push((rng.uniform_range(0.0, 3000.0), rng.uniform_range(0.7, 1.45)));
    }
    let shapes = [
        (50usize, 50usize),
        (10, 50),
        (50, 10),
        (3, 3),
        (37, 53),
        (60, 44),
        (7, 100),
        (100, 7),
    ];
    let req = json!({ "h": 50, "w": 50, "pairs": pairs, "fallback": shapes });
    let theirs = json(&run_py_file(
        "augment_oracle.py",
        &["geometry", &req.to_string()],
    ));
    let sizes = theirs["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), pairs.len());
    for (n, ((area, ratio), t)) in pairs.iter().zip(sizes).enumerate() {
        let ours = crop_size_for_attempt(50, 50, *area, *ratio);
        let theirs = t.as_array().map(|v| {
            (
                v[0].as_u64().unwrap() as usize,
                v[1].as_u64().unwrap() as usize,
            )
        });
        assert_eq!(ours, theirs, "pair {n}: area {area}, ratio {ratio}");
    }
    for (&(h, w), t) in shapes.iter().zip(theirs["fallback"].as_array().unwrap()) {
        let t: Vec<usize> = t
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let ours = fallback_crop(h, w, SCDINO_RATIO);
        assert_eq!(
            [ours.top, ours.left, ours.height, ours.width],
            [t[0], t[1], t[2], t[3]],
            "fallback {h}×{w}"
        );
        // And our sampler reaches the fallback the same way.
        let mut rng = SampleRng::from_seed(1);
        assert_eq!(
            random_resized_crop_params(h, w, (2.0, 3.0), SCDINO_RATIO, &mut rng),
            ours
        );
    }
}

/// Two-sample Kolmogorov–Smirnov statistic sup |F_a − F_b|.
fn ks(mut a: Vec<f64>, mut b: Vec<f64>) -> f64 {
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (mut i, mut j, mut d) = (0usize, 0usize, 0.0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / a.len() as f64 - j as f64 / b.len() as f64).abs());
    }
    d
}

#[derive(Default)]
struct Draws {
    area: Vec<f64>,
    log_aspect: Vec<f64>,
    i: Vec<f64>,
    j: Vec<f64>,
}

impl Draws {
    fn push(&mut self, h: usize, w: usize, r: CropRect) {
        self.area.push((r.height * r.width) as f64 / (h * w) as f64);
        self.log_aspect
            .push((r.width as f64 / r.height as f64).ln());
        self.i.push(r.top as f64);
        self.j.push(r.left as f64);
    }
}

#[test]
fn crop_distribution_matches_torchvision_get_params() {
    const N: usize = 20_000;
    // Two-sample KS critical value at α = 1e-3: c(α)·sqrt((n+m)/(nm)) with
    // c(α) = sqrt(−ln(α/2)/2) = 1.9495, n = m = 20000 → 0.0195. For discrete
    // variables (integer h, w, i, j) the test is conservative.
    let crit = (-(1e-3f64 / 2.0).ln() / 2.0).sqrt() * (2.0 / N as f64).sqrt();
    let setups = [
        (50usize, 50usize, (0.4, 1.0)),
        (50, 50, (0.05, 0.4)),
        (37, 53, (0.05, 0.4)),
        (50, 50, (0.14, 1.0)),
    ];
    let req = json!({
        "setups": setups.iter().map(|&(h, w, (lo, hi))| json!([h, w, lo, hi])).collect::<Vec<_>>(),
        "n": N,
        "seed": 0,
    });
    let all = json(&run_py_file(
        "augment_oracle.py",
        &["rrc", &req.to_string()],
    ));
    let mut ours_by_setup = Vec::new();
    for (s, &(h, w, scale)) in setups.iter().enumerate() {
        let out = &all[s];
        let col = |k: &str| -> Vec<usize> {
            out[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect()
        };
        let (ti, tj, th, tw) = (col("i"), col("j"), col("h"), col("w"));
        let mut theirs = Draws::default();
        for n in 0..N {
            theirs.push(h, w, CropRect::new(ti[n], tj[n], th[n], tw[n]));
        }
        let mut ours = Draws::default();
        for n in 0..N {
            let mut rng = SampleKey::new(123, s as u64, n as u64).rng(0);
            let r = random_resized_crop_params(h, w, scale, SCDINO_RATIO, &mut rng);
            assert!(r.fits(h, w));
            ours.push(h, w, r);
        }
        for (name, a, b) in [
            ("area fraction", &ours.area, &theirs.area),
            ("log aspect", &ours.log_aspect, &theirs.log_aspect),
            ("top", &ours.i, &theirs.i),
            ("left", &ours.j, &theirs.j),
        ] {
            let d = ks(a.clone(), b.clone());
            eprintln!("{h}×{w} scale {scale:?} {name}: KS D = {d:.4} (crit {crit:.4})");
            assert!(
                d < crit,
                "{h}×{w} scale {scale:?}: {name} KS D = {d} ≥ {crit}"
            );
        }
        ours_by_setup.push((ours, theirs));
    }
    // Power check: the same statistic flags a wrong scale (global vs local).
    let d = ks(
        ours_by_setup[0].0.area.clone(),
        ours_by_setup[1].1.area.clone(),
    );
    assert!(
        d > 10.0 * crit,
        "KS cannot tell scale (0.4,1) from (0.05,0.4): D = {d}"
    );
    // And a subtler one: (0.4, 1) against (0.14, 1).
    let d = ks(
        ours_by_setup[0].0.area.clone(),
        ours_by_setup[3].1.area.clone(),
    );
    assert!(
        d > crit,
        "KS cannot tell scale (0.4,1) from (0.14,1): D = {d}"
    );
}

// ------------------------------------------------- probabilities

#[test]
fn branch_rates_follow_scdino() {
    const N: usize = 20_000;
    let aug = pbmc_augment();
    let nc = aug.num_crops();
    let mut hflip = vec![0usize; nc];
    let mut vflip = vec![0usize; nc];
    let mut both_flips = vec![0usize; nc];
    let mut bright = vec![0usize; nc];
    let mut blur = vec![0usize; nc];
    let mut solar = vec![0usize; nc];
    let mut factors: Vec<f64> = Vec::new();
    let mut pairs01: Vec<(f64, f64)> = Vec::new();
    let mut sigmas: Vec<f64> = Vec::new();
    for n in 0..N {
        for (k, p) in aug
            .plan(50, 50, SampleKey::new(40, 0, n as u64))
            .iter()
            .enumerate()
        {
            assert_eq!(p.out_size, if k < 2 { 224 } else { 96 });
            hflip[k] += p.hflip as usize;
            vflip[k] += p.vflip as usize;
            both_flips[k] += (p.hflip && p.vflip) as usize;
            if !p.brightness.is_empty() {
                bright[k] += 1;
                assert_eq!(p.brightness.len(), 5);
                factors.extend(p.brightness.iter().map(|&f| f as f64));
                pairs01.push((p.brightness[0] as f64, p.brightness[1] as f64));
            }
            if let Some(s) = p.blur_sigma {
                blur[k] += 1;
                sigmas.push(s as f64);
            }
            solar[k] += p.solarize as usize;
        }
    }
    // Binomial rate within 5 standard errors sqrt(p(1−p)/N); for N = 20000
    // that is ±0.0177 at p = 0.5, ±0.0141 at p = 0.8 and 0.2, ±0.0106 at 0.1.
    let rate_ok = |what: &str, k: usize, count: usize, n: usize, p: f64| {
        let r = count as f64 / n as f64;
        let tol = 5.0 * (p * (1.0 - p) / n as f64).sqrt();
        assert!(
            (r - p).abs() <= tol,
            "crop {k} {what}: rate {r:.4} vs {p} (±{tol:.4})"
        );
    };
    for k in 0..nc {
        rate_ok("hflip", k, hflip[k], N, 0.5);
        rate_ok("vflip", k, vflip[k], N, 0.5);
        rate_ok("hflip∧vflip", k, both_flips[k], N, 0.25);
        rate_ok("brightness", k, bright[k], N, 0.8);
        let blur_p = [1.0, 0.1, 0.5][k.min(2)];
        if blur_p == 1.0 {
            assert_eq!(blur[k], N, "global crop 1 always blurs");
        } else {
            rate_ok("blur", k, blur[k], N, blur_p);
        }
        if k == 1 {
            rate_ok("solarize", k, solar[k], N, 0.2);
        } else {
            assert_eq!(solar[k], 0, "crop {k} must never solarise");
        }
    }
    // Uniform U(a, b): sd (b − a)/√12; mean within 5 standard errors.
    let uniform_ok = |what: &str, v: &[f64], a: f64, b: f64| {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let tol = 5.0 * (b - a) / 12f64.sqrt() / n.sqrt();
        assert!(
            (mean - (a + b) / 2.0).abs() <= tol,
            "{what}: mean {mean} (±{tol})"
        );
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        assert!(
            lo >= a && hi < b + 1e-6,
            "{what}: range [{lo}, {hi}] outside [{a}, {b})"
        );
        // With n ≥ 10^4 draws the extremes come within 0.1% of the ends.
        assert!(
            lo < a + (b - a) * 1e-3 && hi > b - (b - a) * 1e-3,
            "{what}: [{lo}, {hi}]"
        );
        // Quartiles: the empirical CDF at a quarter point is within 5 sd.
        for q in [0.25, 0.5, 0.75] {
            let x = a + q * (b - a);
            let f = v.iter().filter(|&&t| t < x).count() as f64 / n;
            let tol = 5.0 * (q * (1.0 - q) / n).sqrt();
            assert!((f - q).abs() <= tol, "{what}: F({x}) = {f} vs {q}");
        }
    };
    uniform_ok("brightness factor", &factors, 0.5, 1.25);
    uniform_ok("blur sigma", &sigmas, 0.1, 1.5);
    // Channel factors are drawn independently: |corr| < 5/√n.
    let n = pairs01.len() as f64;
    let (ma, mb) = (0.875, 0.875);
    let cov = pairs01
        .iter()
        .map(|(a, b)| (a - ma) * (b - mb))
        .sum::<f64>()
        / n;
    let corr = cov / (0.75f64.powi(2) / 12.0);
    assert!(
        corr.abs() < 5.0 / n.sqrt(),
        "channel 0/1 factor correlation {corr}"
    );
}

// ------------------------------------------------- determinism

#[test]
fn same_key_same_crops_and_buffers_agree() {
    let aug = pbmc_augment();
    let img = noise_image(5, 50, 50, 21);
    let key = SampleKey::new(40, 2, 17);
    let a = aug.apply(&img, key).unwrap();
    let b = aug.apply(&img, key).unwrap();
    assert_eq!(a.len(), 10);
    for (x, y) in a.iter().zip(&b) {
        assert!(x
            .data
            .iter()
            .zip(&y.data)
            .all(|(p, q)| p.to_bits() == q.to_bits()));
    }
    for other in [
        SampleKey::new(40, 2, 18),
        SampleKey::new(40, 3, 17),
        SampleKey::new(41, 2, 17),
    ] {
        let c = aug.apply(&img, other).unwrap();
        for (k, (x, y)) in a.iter().zip(&c).enumerate() {
            assert_ne!(
                x.data, y.data,
                "crop {k} of {other:?} equals that of {key:?}"
            );
        }
    }
    // Caller-provided buffers (e.g. slots of batch tensors) give the same crops.
    let mut bufs: Vec<Vec<f32>> = (0..10).map(|k| vec![f32::NAN; aug.crop_len(k)]).collect();
    let mut slices: Vec<&mut [f32]> = bufs.iter_mut().map(|v| v.as_mut_slice()).collect();
    aug.apply_into(&img, key, &mut slices).unwrap();
    for (x, y) in a.iter().zip(&bufs) {
        assert_eq!(&x.data, y);
    }
    // Rendering from the reported parameters gives the same crops.
    for (k, p) in aug.plan(50, 50, key).iter().enumerate() {
        assert_eq!(
            aug.render(&img, p).unwrap().data,
            a[k].data,
            "render crop {k}"
        );
    }
    // Wrong buffers are errors, not panics.
    let mut short = vec![0.0f32; 3];
    let mut bad: Vec<&mut [f32]> = vec![short.as_mut_slice()];
    assert!(aug.apply_into(&img, key, &mut bad).is_err());
    assert!(aug.apply(&noise_image(3, 50, 50, 1), key).is_err());
}

#[test]
fn threads_in_any_order_give_identical_crops() {
    let aug = pbmc_augment();
    let img = smooth_image(5, 50, 50);
    let indices: Vec<u64> = (0..24).collect();
    let sequential: Vec<Vec<ImageChw>> = indices
        .iter()
        .map(|&i| aug.apply(&img, SampleKey::new(1, 5, i)).unwrap())
        .collect();
    let mut parallel: Vec<(u64, Vec<ImageChw>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let (aug, img) = (&aug, &img);
                s.spawn(move || {
                    // Each thread walks its share backwards.
                    (0..24u64)
                        .rev()
                        .filter(|i| i % 4 == t)
                        .map(|i| (i, aug.apply(img, SampleKey::new(1, 5, i)).unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    parallel.sort_by_key(|(i, _)| *i);
    for ((i, crops), seq) in parallel.iter().zip(&sequential) {
        assert_eq!(crops, seq, "sample {i}");
    }
}

// ------------------------------------------------- pixel statistics

#[test]
fn constant_image_gives_predicted_values() {
    // A per-channel constant image stays constant through bicubic resizing
    // and blurring (weights sum to 1), so each output is exactly
    // (solarize(clamp(f·v)) − mean)/std from the reported parameters.
    let aug = pbmc_augment();
    let v = [0.1f32, 0.3, 0.5, 0.7, 0.9];
    let data: Vec<f32> = v
        .iter()
        .flat_map(|&x| std::iter::repeat_n(x, 50 * 50))
        .collect();
    let img = ImageChw::new(5, 50, 50, data).unwrap();
    for i in 0..40 {
        let key = SampleKey::new(3, 0, i);
        let crops = aug.apply(&img, key).unwrap();
        for (k, (crop, p)) in crops.iter().zip(aug.plan(50, 50, key)).enumerate() {
            for c in 0..5 {
                let mut x = v[c];
                if !p.brightness.is_empty() {
                    x = (p.brightness[c] * x).clamp(0.0, 1.0);
                }
                if p.solarize && x > 0.5 {
                    x = 1.0 - x;
                }
                let want = (x - PBMC_MEAN[c]) / PBMC_STD[c];
                let d = crop
                    .channel(c)
                    .iter()
                    .map(|y| (y - want).abs())
                    .fold(0.0, f32::max);
                assert!(
                    d < 1e-5,
                    "sample {i} crop {k} channel {c}: off by {d} ({p:?})"
                );
            }
        }
    }
}

#[test]
fn pipeline_output_statistics_are_sane() {
    // Identity normalisation exposes the raw value ranges.
    let mut cfg = MultiCropConfig::scdino(vec![0.0; 5], vec![1.0; 5]);
    cfg.local_crops_number = 4;
    let aug = MultiCropAugment::new(cfg).unwrap();
    let img = noise_image(5, 50, 50, 31);
    let (mut overshoot, mut unclamped_crops) = (0usize, 0usize);
    for i in 0..60 {
        let key = SampleKey::new(9, 1, i);
        let crops = aug.apply(&img, key).unwrap();
        for (crop, p) in crops.iter().zip(aug.plan(50, 50, key)) {
            assert!(crop.data.iter().all(|x| x.is_finite()));
            let (lo, hi) = crop
                .data
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
            // Keys' cubic (A = −0.75) has Σ|w| ≤ 1.375 per axis, so a
            // [0,1] input stays within [−0.45, 1.45] after a 2-D resize.
            assert!(lo >= -0.45 && hi <= 1.45, "range [{lo}, {hi}] {p:?}");
            if !p.brightness.is_empty() {
                // Clamped to [0, 1]; blur (convex) keeps it there; solarised
                // values are ≤ 0.5.
                let top = if p.solarize { 0.5 } else { 1.0 };
                assert!(lo >= 0.0 && hi <= top + 1e-6, "[{lo}, {hi}] {p:?}");
            } else {
                unclamped_crops += 1;
                overshoot += crop
                    .data
                    .iter()
                    .filter(|&&x| !(0.0..=1.0).contains(&x))
                    .count();
            }
        }
    }
    // Without the brightness branch nothing clamps the bicubic overshoot.
    assert!(
        unclamped_crops > 0 && overshoot > 0,
        "bicubic overshoot was clamped"
    );

    // Normalised with the image's own statistics, a smooth image's crops
    // average to about 0 with unit-order spread (loose sanity bounds).
    let img = smooth_image(5, 50, 50);
    let mut mean = Vec::new();
    let mut std = Vec::new();
    for c in 0..5 {
        let ch = img.channel(c);
        let m = ch.iter().map(|&x| x as f64).sum::<f64>() / ch.len() as f64;
        let v = ch.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / ch.len() as f64;
        mean.push(m as f32);
        std.push(v.sqrt() as f32);
    }
    let aug = MultiCropAugment::new(MultiCropConfig::scdino(mean, std)).unwrap();
    let (mut s1, mut s2, mut n) = (0.0f64, 0.0f64, 0usize);
    for i in 0..100 {
        let key = SampleKey::new(2, 0, i);
        let crops = aug.apply(&img, key).unwrap();
        // Global crop 1 (no solarisation), brightness branch not taken.
        let p = aug.sample_params(0, 50, 50, key);
        if p.brightness.is_empty() {
            for &x in &crops[0].data {
                s1 += x as f64;
                s2 += (x as f64).powi(2);
                n += 1;
            }
        }
    }
    let m = s1 / n as f64;
    let sd = (s2 / n as f64 - m * m).sqrt();
    assert!(
        m.abs() < 0.3 && (0.6..1.4).contains(&sd),
        "mean {m}, sd {sd}"
    );
}

// ------------------------------------------- fast CPU path vs. reference

/// Crop + resize written the plain way (PyTorch's loop order: for each output
/// row, `Σ_y w_y·(Σ_x w_x·src)` with the width sum innermost), no flips.
fn reference_resize(img: &ImageChw, r: CropRect, s: usize) -> ImageChw {
    let (ax, ay) = (
        CubicAxis::new(r.width, s, false),
        CubicAxis::new(r.height, s, false),
    );
    let mut data = Vec::with_capacity(img.channels * s * s);
    for c in 0..img.channels {
        let plane = img.channel(c);
        let at = |y: u32, x: u32| plane[(r.top + y as usize) * img.width + r.left + x as usize];
        for oy in 0..s {
            let row = |t: usize| {
                let y = ay.idx[oy][t];
                let (ix, wx) = (&ax.idx, &ax.w);
                move |ox: usize| {
                    at(y, ix[ox][0]) * wx[ox][0]
                        + at(y, ix[ox][1]) * wx[ox][1]
                        + at(y, ix[ox][2]) * wx[ox][2]
                        + at(y, ix[ox][3]) * wx[ox][3]
                }
            };
            let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
            let w = ay.w[oy];
            for ox in 0..s {
                data.push(r0(ox) * w[0] + r1(ox) * w[1] + r2(ox) * w[2] + r3(ox) * w[3]);
            }
        }
    }
    ImageChw::new(img.channels, s, s, data).unwrap()
}

#[test]
fn fast_pipeline_equals_separate_reference_ops_bit_for_bit() {
    // The fused, transposed, SIMD-dispatched crop pipeline must compute exactly
    // (bit for bit) what the plain composition of the individual ops computes.
    let aug = pbmc_augment();
    let img = noise_image(5, 50, 50, 77);
    let mut checked = [0usize; 4]; // brightness, blur, solarize, flips
    for i in 0..40 {
        let key = SampleKey::new(12, 3, i);
        let fast = aug.apply(&img, key).unwrap();
        for (k, p) in aug.plan(50, 50, key).iter().enumerate() {
            let mut x = reference_resize(&img, p.rect, p.out_size);
            if p.hflip {
                hflip(&mut x);
            }
            if p.vflip {
                vflip(&mut x);
            }
            if !p.brightness.is_empty() {
                adjust_brightness(&mut x, &p.brightness).unwrap();
                checked[0] += 1;
            }
            if let Some(sigma) = p.blur_sigma {
                gaussian_blur(&mut x, sigma).unwrap();
                checked[1] += 1;
            }
            if p.solarize {
                solarize(&mut x, 0.5);
                checked[2] += 1;
            }
            checked[3] += usize::from(p.hflip || p.vflip);
            normalize(&mut x, &PBMC_MEAN, &PBMC_STD).unwrap();
            let same = x
                .data
                .iter()
                .zip(&fast[k].data)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "sample {i} crop {k} differs: {p:?}");
        }
    }
    assert!(
        checked.iter().all(|&n| n > 0),
        "branches not all exercised: {checked:?}"
    );
}

// ------------------------------------------------- device path

fn batch_tensor(imgs: &[&ImageChw]) -> tch::Tensor {
    let (c, h, w) = (imgs[0].channels, imgs[0].height, imgs[0].width);
    let data: Vec<f32> = imgs.iter().flat_map(|i| i.data.iter().copied()).collect();
    tch::Tensor::from_slice(&data).view([imgs.len() as i64, c as i64, h as i64, w as i64])
}

fn tensor_values(t: &tch::Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.contiguous().view([-1])).unwrap()
}

/// Output positions along one axis whose four bicubic taps all lie strictly inside the
/// crop (no index clamped), eroded by the blur's reach if the crop blurs.
fn interior(n: usize, s: usize, flip: bool, blur: bool) -> Vec<bool> {
    let ax = CubicAxis::new(n, s, flip);
    let inside: Vec<bool> = ax
        .idx
        .iter()
        .map(|t| t[0] + 1 == t[1] && t[1] + 1 == t[2] && t[2] + 1 == t[3])
        .collect();
    if !blur {
        return inside;
    }
    (0..s)
        .map(|o| {
            (o as isize - 2..=o as isize + 2)
                .all(|q| q >= 0 && (q as usize) < s && inside[q as usize])
        })
        .collect()
}

#[test]
fn device_path_equals_cpu_path_inside_crops() {
    // Same keys → same parameters; inside the crop rectangle grid_sample and
    // crop + interpolate use the same taps and weights, so only rounding of the
    // sampling coordinates may differ. At the crop edges the device path reads
    // real neighbours instead of repeating the edge: small, bounded differences.
    let aug = std::sync::Arc::new(pbmc_augment());
    let dev = DeviceAugment::new(aug.clone());
    let imgs: Vec<ImageChw> = (0..12).map(|i| noise_image(5, 50, 50, 100 + i)).collect();
    let smooth = smooth_image(5, 50, 50);
    let mut all: Vec<&ImageChw> = imgs.iter().collect();
    all.push(&smooth);
    let keys: Vec<SampleKey> = (0..all.len() as u64)
        .map(|i| SampleKey::new(4, 1, i))
        .collect();
    let crops = dev.apply(&batch_tensor(&all), &keys).unwrap();
    assert_eq!(crops.len(), aug.num_crops());
    let (mut inner_n, mut inner_max, mut solar_straddles) = (0usize, 0.0f32, 0usize);
    let (mut edge_sum, mut edge_n) = (0.0f64, 0usize);
    for (b, (img, key)) in all.iter().zip(&keys).enumerate() {
        let cpu = aug.apply(img, *key).unwrap();
        for (k, p) in aug.plan(50, 50, *key).iter().enumerate() {
            let s = p.out_size;
            let size = crops[k].size();
            assert_eq!(size, vec![all.len() as i64, 5, s as i64, s as i64]);
            let ours = tensor_values(&crops[k].get(b as i64));
            let blur = p.blur_sigma.is_some();
            let ix = interior(p.rect.width, s, p.hflip, blur);
            let iy = interior(p.rect.height, s, p.vflip, blur);
            for c in 0..5 {
                for (y, &in_y) in iy.iter().enumerate() {
                    for (x, &in_x) in ix.iter().enumerate() {
                        let at = (c * s + y) * s + x;
                        let d = (ours[at] - cpu[k].data[at]).abs();
                        if in_x && in_y {
                            inner_n += 1;
                            if d > 1e-4 && p.solarize {
                                // A value within rounding of the 0.5 threshold may
                                // solarise on one path only.
                                solar_straddles += 1;
                            } else {
                                inner_max = inner_max.max(d);
                            }
                        } else {
                            edge_sum += d as f64;
                            edge_n += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "device vs cpu: {inner_n} interior pixels, max diff {inner_max:e}, {solar_straddles} \
         solarisation straddles; mean edge diff {:.4}",
        edge_sum / edge_n as f64
    );
    assert!(inner_n > 1_000_000, "too few interior pixels: {inner_n}");
    assert!(
        inner_max <= 1e-4,
        "interior max |device − cpu| = {inner_max:e}"
    );
    assert!(
        solar_straddles * 100_000 <= inner_n,
        "{solar_straddles} straddles"
    );
    let edge_mean = edge_sum / edge_n as f64;
    // Noise images make crop edges differ the most (independent neighbours).
    assert!(
        edge_mean < 0.25,
        "mean |device − cpu| at crop edges = {edge_mean}"
    );
}

/// (brightness fired, hflip, vflip, crop width, crop height) as read off a crop.
type RampObs = (bool, bool, bool, f64, f64);

/// Per crop (global 1 and locals; identity normalisation) what can be read off the image
/// of a ramp image: (brightness fired, hflip, vflip, crop width, crop height in pixels).
fn measure_ramp_crop(v: &[f32], s: usize, w: usize, h: usize) -> RampObs {
    let ch = |c: usize| &v[c * s * s..(c + 1) * s * s];
    // Resize and blur keep a constant within ~1e-7; a factor within 1e-6 of 1 (missed)
    // has probability ~1e-6 per crop.
    let bright = ch(2).iter().any(|x| (x - 0.5).abs() > 1e-6);
    let (mid, q) = (s / 2, s / 4);
    let xs = ch(0);
    let slope_x = (xs[mid * s + mid + q] - xs[mid * s + mid - q]) as f64 / (2 * q) as f64;
    let ys = ch(1);
    let slope_y = (ys[(mid + q) * s + mid] - ys[(mid - q) * s + mid]) as f64 / (2 * q) as f64;
    // Ramp value = coordinate / side, so one output pixel spans crop/S source pixels.
    let cw = slope_x.abs() * s as f64 * w as f64;
    let chh = slope_y.abs() * s as f64 * h as f64;
    (bright, slope_x < 0.0, slope_y < 0.0, cw, chh)
}

#[test]
fn device_path_distribution_matches_cpu_path() {
    // Channel 0 = x/50, channel 1 = y/50 (ramps), channel 2 = 0.5, channels 3–4 a cell.
    let (w, h) = (50usize, 50usize);
    let cell = smooth_image(5, h, w);
    let mut data = Vec::new();
    for c in 0..5 {
        for y in 0..h {
            for x in 0..w {
                data.push(match c {
                    0 => x as f32 / w as f32,
                    1 => y as f32 / h as f32,
                    2 => 0.5,
                    _ => cell.get(c, y, x),
                });
            }
        }
    }
    let img = ImageChw::new(5, h, w, data).unwrap();
    let aug = std::sync::Arc::new(
        MultiCropAugment::new(MultiCropConfig::scdino(vec![0.0; 5], vec![1.0; 5])).unwrap(),
    );
    let dev = DeviceAugment::new(aug.clone());
    let n = 240usize;
    let keys: Vec<SampleKey> = (0..n as u64).map(|i| SampleKey::new(8, 0, i)).collect();
    // Measurements per path: rows (bright, hflip, vflip, width, height) of unbrightened and
    // all crops, plus per-channel pixel sums over every crop.
    type Obs = (Vec<RampObs>, [(f64, f64, f64); 5]);
    let mut obs: [Obs; 2] = Default::default();
    let mut truth = Vec::new();
    let record = |o: &mut Obs, k: usize, v: &[f32]| {
        let s = aug.policy(k).size;
        o.0.push(measure_ramp_crop(v, s, w, h));
        for c in 3..5 {
            for &x in &v[c * s * s..(c + 1) * s * s] {
                let t = &mut o.1[c];
                t.0 += x as f64;
                t.1 += (x as f64).powi(2);
                t.2 += 1.0;
            }
        }
    };
    for chunk in keys.chunks(60) {
        let imgs: Vec<&ImageChw> = chunk.iter().map(|_| &img).collect();
        let crops = dev.apply(&batch_tensor(&imgs), chunk).unwrap();
        for (b, key) in chunk.iter().enumerate() {
            let cpu = aug.apply(&img, *key).unwrap();
            for k in (0..aug.num_crops()).filter(|&k| k != 1) {
                record(&mut obs[0], k, &cpu[k].data);
                record(&mut obs[1], k, &tensor_values(&crops[k].get(b as i64)));
                let p = aug.sample_params(k, h, w, *key);
                truth.push((p.rect.width as f64, p.rect.height as f64));
            }
        }
    }
    let m = truth.len() as f64;
    for (name, o) in ["cpu", "device"].iter().zip(&obs) {
        let rate = |f: &dyn Fn(&RampObs) -> bool| o.0.iter().filter(|r| f(r)).count() as f64 / m;
        // Binomial sd at n = 2160: 0.0108 for p = 0.5, 0.0086 for p = 0.8; 4 sd.
        let (pb, ph, pv) = (rate(&|r| r.0), rate(&|r| r.1), rate(&|r| r.2));
        assert!((pb - 0.8).abs() < 0.035, "{name}: brightness rate {pb}");
        assert!((ph - 0.5).abs() < 0.044, "{name}: hflip rate {ph}");
        assert!((pv - 0.5).abs() < 0.044, "{name}: vflip rate {pv}");
    }
    // Crop geometry read off the images (crops without the brightness factor, which would
    // scale the ramps): each path within 0.35 px of the sampled rectangle, so their scale and
    // ratio histograms agree.
    let (mut scales, mut ratios): ([Vec<f64>; 2], [Vec<f64>; 2]) = Default::default();
    for (p, o) in obs.iter().enumerate() {
        for (r, &(tw, th)) in o.0.iter().zip(&truth) {
            if r.0 {
                continue;
            }
            assert!(
                (r.3 - tw).abs() < 0.35 && (r.4 - th).abs() < 0.35,
                "path {p}: measured {}×{} for a {tw}×{th} crop",
                r.3,
                r.4
            );
            scales[p].push(r.3 * r.4 / (w * h) as f64);
            ratios[p].push(r.3 / r.4);
        }
    }
    assert!(
        scales[0].len() > 300,
        "{} unbrightened crops",
        scales[0].len()
    );
    let (ks_scale, ks_ratio) = (
        ks(scales[0].clone(), scales[1].clone()),
        ks(ratios[0].clone(), ratios[1].clone()),
    );
    eprintln!("KS cpu vs device: scale {ks_scale:.4}, ratio {ks_ratio:.4}");
    assert!(
        ks_scale < 0.03 && ks_ratio < 0.03,
        "KS scale {ks_scale}, ratio {ks_ratio}"
    );
    // Pixel statistics of the cell channels over every crop.
    for c in 3..5 {
        let st = |t: (f64, f64, f64)| {
            let mean = t.0 / t.2;
            (mean, (t.1 / t.2 - mean * mean).sqrt())
        };
        let (mc, sc) = st(obs[0].1[c]);
        let (md, sd) = st(obs[1].1[c]);
        eprintln!("channel {c}: cpu mean/std {mc:.5}/{sc:.5}, device {md:.5}/{sd:.5}");
        assert!(
            (mc - md).abs() < 0.005 && (sc - sd).abs() < 0.01 * sc,
            "channel {c}: cpu mean/std {mc}/{sc}, device {md}/{sd}"
        );
    }
}

#[test]
fn device_path_rejects_bad_batches() {
    let aug = std::sync::Arc::new(pbmc_augment());
    let dev = DeviceAugment::new(aug);
    let img = noise_image(5, 50, 50, 1);
    let key = SampleKey::new(0, 0, 0);
    assert!(
        dev.apply(&batch_tensor(&[&img]), &[key, key]).is_err(),
        "row count"
    );
    let three = noise_image(3, 50, 50, 1);
    assert!(
        dev.apply(&batch_tensor(&[&three]), &[key]).is_err(),
        "channels"
    );
    let flat = tch::Tensor::zeros([5, 50, 50], (tch::Kind::Float, tch::Device::Cpu));
    assert!(dev.apply(&flat, &[key]).is_err(), "rank");
}
