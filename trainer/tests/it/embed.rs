//! `trainer embed`: the features stage's numbers for any image set (every channel mode and a
//! channel subset by name), resumable after SIGKILL without duplicates or losses, the same
//! table from 1 rank, 2 ranks or 2 array shards, bad images in the errors table, metadata from
//! a path pattern and a CSV with what does not line up reported, and images read from S3.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use trainer::analysis::profiles::{self, OwnedColumn, StreamedTable};
use trainer::config::Config;
use trainer::data::{generate_synthetic, write_tiff_u16_chunky, ImageChwU16, SynthOptions};
use trainer::embed::{run, EmbedOptions, OnError};
use trainer::pipeline::stages::{run_features, tag_of_checkpoint, Target};
use trainer::train::run::{train, TrainOptions};

fn synth(dir: &Path) {
    generate_synthetic(&SynthOptions {
        out: dir.join("data"),
        seed: 5,
        classes: 3,
        per_class: 8,
        size: 24,
        channels: 3,
        ..SynthOptions::default()
    })
    .unwrap();
}

/// `mode`: `model.channels`, possibly followed by more model keys (", key: value").
fn config(dir: &Path, mode: &str, features: &str) -> Config {
    let name = label(mode);
    Config::from_yaml(
        &format!(
            "run: {{name: {name}, output_dir: {out}, seed: 3}}\ndata: {{dataset_dir: {data}, channel_names: [a, b, c], channel_combinations: [\"012\", \"0\", \"12\"], num_workers: 1}}\nmodel: {{name: m, arch: vit_tiny, patch_size: 8, out_dim: 32, channels: {mode}}}\ntrain: {{epochs: 1, batch_size_per_gpu: 4, precision: fp32, warmup_epochs: 0, lr: 0.01}}\naugment: {{global_crop_size: 16, local_crop_size: 8, local_crops_number: 1}}\ndownstream: {{features: {{resize_length: 16, batch_size_per_gpu: 5{features}}}}}\n",
            out = dir.join("out").display(),
            data = dir.join("data/Training").display(),
        ),
        "test",
    )
    .unwrap()
}

/// A file-name-safe label of a [`config`] mode.
fn label(mode: &str) -> String {
    mode.replace([',', ':', ' '], "")
}

/// A channel combination of the run config and the channel names `trainer embed` is given.
type Combination<'a> = (usize, &'a [&'a str]);

fn options(ckpt: &Path, images: &str, out: &Path) -> EmbedOptions {
    EmbedOptions {
        checkpoint: ckpt.to_path_buf(),
        images: images.to_string(),
        screen: None,
        out: out.to_path_buf(),
        list: None,
        metadata: None,
        path_pattern: None,
        channels: None,
        on_error: OnError::Skip,
        batch_size: None,
        device: tch::Device::Cpu,
        bf16: false,
        shard: None,
        merge_only: false,
        part_size: 7,
        readers: 2,
    }
}

fn strings<'a>(t: &'a StreamedTable, name: &str) -> &'a [String] {
    let i = t.columns.iter().position(|c| c.name() == name).unwrap();
    match &t.data[i] {
        OwnedColumn::Strings(v) => v,
        OwnedColumn::Ints(_) => panic!("{name} is not a string column"),
    }
}

/// The features stage and `trainer embed` on the same folder with the same checkpoint, for
/// `fixed` (all channels; one channel, the others zero-filled), `tokens` and `bag` (all
/// channels; a subset by name), and `tokens` with a channel-separate and a mixing block read
/// with each channel's own pass (`tokens_pool: joint_and_alone`, the shipped tokens recipe's
/// pool): every held-out row of the stage is the embed row of the same image, bit for bit
/// when embed batches the images as the stage does (to float rounding in other batches), and
/// the table says which channels it holds.
#[test]
fn embed_gives_the_features_stage_numbers_in_every_channel_mode() {
    let _rng = super::util::torch_rng_lock();
    tch::set_num_threads(2);
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path());
    let images = dir.path().join("data/Training").display().to_string();
    let cases: [(&str, &str, &[Combination]); 4] = [
        (
            "fixed",
            ", missing_channels: zeros",
            &[(0, &["a", "b", "c"]), (1, &["a"])],
        ),
        ("tokens", "", &[(0, &["a", "b", "c"]), (2, &["b", "c"])]),
        ("bag", "", &[(0, &["a", "b", "c"]), (2, &["b", "c"])]),
        (
            "tokens, channel_separate_blocks: 1, channel_mixing_blocks: 1",
            ", tokens_pool: joint_and_alone",
            &[(0, &["a", "b", "c"]), (2, &["b", "c"])],
        ),
    ];
    for (mode, features, combos) in cases {
        let cfg = config(dir.path(), mode, features);
        let mode = label(mode);
        train(&cfg, &TrainOptions::default()).unwrap();
        let ck = trainer::layout::RunLayout::new(&cfg)
            .model(&cfg, &cfg.training_channels(0).unwrap())
            .latest_checkpoint();
        let tag = tag_of_checkpoint(&ck).unwrap();
        for &(combination, names) in combos {
            let t = Target::new(&cfg, combination).unwrap();
            run_features(&t, &ck, &tag, None).unwrap();
            let stage = profiles::read(&t.files.profiles(&tag)).unwrap();
            let out = dir.path().join(format!("{mode}{combination}.parquet"));
            let mut opts = options(&ck, &images, &out);
            opts.channels = Some(names.iter().map(|n| n.to_string()).collect());
            let s = run(&opts).unwrap();
            assert_eq!((s.images, s.errors, s.merged), (24, 0, Some((24, 0))));
            let table = profiles::read_streamed(&out).unwrap();
            assert_eq!(
                table.dim as i64,
                stage.features.size()[1],
                "{mode} {names:?}"
            );
            if features.contains("joint_and_alone") {
                // The joint pass's CLS and k channel parts, then each channel alone: (3k+1)·D.
                assert_eq!(table.dim, (3 * names.len() + 1) * 192, "{names:?}");
            }
            assert!(strings(&table, "Metadata_Channels")
                .iter()
                .all(|c| *c == names.join("+")));
            let paths = strings(&table, "Metadata_ImagePath");
            let embedded = tch::Tensor::from_slice(&table.values)
                .reshape([table.rows as i64, table.dim as i64]);
            assert!(!stage.paths.is_empty());
            // The whole folder, batched by embed's parts: the same numbers up to the float
            // rounding of GEMM kernels chosen by batch size.
            for (r, p) in stage.paths.iter().enumerate() {
                let row = paths
                    .iter()
                    .position(|q| q == p)
                    .unwrap_or_else(|| panic!("{p}"));
                let diff = (embedded.get(row as i64) - stage.features.get(r as i64))
                    .abs()
                    .max()
                    .double_value(&[]);
                assert!(diff <= 1e-6, "{mode} {names:?} {p}: {diff}");
            }
            // The held-out images listed in the stage's order, batched as the stage batches
            // them: bit for bit.
            let list = dir.path().join(format!("{mode}{combination}.csv"));
            let rel: Vec<String> = stage
                .paths
                .iter()
                .map(|p| p.strip_prefix(&format!("{images}/")).unwrap().to_string())
                .collect();
            std::fs::write(&list, format!("path\n{}\n", rel.join("\n"))).unwrap();
            let out = dir
                .path()
                .join(format!("{mode}{combination}-held-out.parquet"));
            let mut opts = options(&ck, &images, &out);
            opts.channels = Some(names.iter().map(|n| n.to_string()).collect());
            opts.list = Some(list);
            opts.part_size = stage.paths.len();
            run(&opts).unwrap();
            let table = profiles::read_streamed(&out).unwrap();
            assert_eq!(strings(&table, "Metadata_ImagePath"), &stage.paths[..]);
            let embedded = tch::Tensor::from_slice(&table.values)
                .reshape([table.rows as i64, table.dim as i64]);
            let diff = (embedded - &stage.features).abs().max().double_value(&[]);
            assert_eq!(diff, 0.0, "{mode} {names:?}: held-out rows batched alike");
        }
    }
}

/// `--precision bf16` (the backbone in bfloat16, features written as float32) gives the fp32
/// rows' directions: every row's cosine to its fp32 row at least 0.999 (bf16 keeps 8 bits of
/// mantissa and the matmuls accumulate in fp32 on every CPU backend, AMX or AVX-512). A rerun in the other precision into the
/// same parts folder is refused, naming `--precision`, as its parts would mix precisions.
#[test]
fn embed_in_bf16_keeps_the_fp32_directions_and_never_mixes_precisions() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path());
    let ck = {
        let _rng = super::util::torch_rng_lock();
        tch::set_num_threads(2);
        let cfg = config(dir.path(), "fixed", "");
        train(&cfg, &TrainOptions::default()).unwrap();
        trainer::layout::RunLayout::new(&cfg)
            .model(&cfg, &cfg.training_channels(0).unwrap())
            .latest_checkpoint()
    };
    let images = dir.path().join("data/Training").display().to_string();
    let rows = |out: &Path, bf16: bool| {
        let mut opts = options(&ck, &images, out);
        opts.bf16 = bf16;
        let s = run(&opts).unwrap();
        assert_eq!((s.images, s.errors), (24, 0));
        let t = profiles::read_streamed(out).unwrap();
        let paths = strings(&t, "Metadata_ImagePath").to_vec();
        let v = tch::Tensor::from_slice(&t.values).reshape([t.rows as i64, t.dim as i64]);
        (paths, v)
    };
    let (p32, f32s) = rows(&dir.path().join("fp32.parquet"), false);
    let bf16_out = dir.path().join("bf16.parquet");
    let (p16, f16s) = rows(&bf16_out, true);
    assert_eq!(p32, p16);
    assert_eq!(f16s.kind(), tch::Kind::Float);
    // Rows are unit length, so the cosine is the row-wise dot product.
    let cos = (&f32s * &f16s).sum_dim_intlist(1, false, tch::Kind::Double);
    let worst = cos.min().double_value(&[]);
    eprintln!("worst cosine of a bf16 row to its fp32 row: {worst}");
    assert!(
        worst >= 0.999,
        "worst cosine of a bf16 row to its fp32 row: {worst}"
    );
    let exact = (&f32s - &f16s).abs().max().double_value(&[]);
    assert!(
        exact > 0.0,
        "bf16 gave the fp32 numbers exactly: it did not run in bf16"
    );
    let mut again = options(&ck, &images, &bf16_out);
    again.bf16 = false;
    let e = run(&again).unwrap_err().to_string();
    assert!(e.contains("--precision"), "{e}");
}

fn trainer_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trainer"));
    c.args(args).env("OMP_NUM_THREADS", "1");
    c
}

fn ok(o: Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{text}");
    text
}

/// A screen in its own layout (`P*/W*/s*_c*.tiff`, copied from the synthetic images), an
/// unreadable file and an image with one channel, a metadata CSV missing one image and
/// naming one that does not exist.
fn screen(dir: &Path) -> (PathBuf, PathBuf) {
    let screen = dir.join("screen");
    let mut csv = String::from("path,Treatment\n");
    let mut tiffs: Vec<PathBuf> = walk(&dir.join("data/Training"));
    tiffs.sort();
    for (n, src) in tiffs.into_iter().enumerate() {
        let rel = format!("P{}/W{}/s{}_c{n}.tiff", n % 2, n % 3, n % 4);
        let dst = screen.join(&rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(src, &dst).unwrap();
        if n != 5 {
            csv.push_str(&format!("{rel},drug{}\n", n % 2));
        }
    }
    csv.push_str("P7/W0/s0_c0.tiff,drug9\n");
    std::fs::write(screen.join("P0/broken.tiff"), b"not a tiff").unwrap();
    let one = ImageChwU16::new(1, 24, 24, vec![7u16; 576]).unwrap();
    write_tiff_u16_chunky(&screen.join("P1/W0/s0_c99.tiff"), &one).unwrap();
    let meta = dir.join("meta.csv");
    std::fs::write(&meta, csv).unwrap();
    (screen, meta)
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Real processes on a screen layout: the uninterrupted table; a run killed with SIGKILL once
/// a part exists, then rerun, writes the same table (no row twice, none lost); so do 2 ranks
/// (`trainer launch --nproc 2`) and 2 array shards with a `--merge`. The two bad images are
/// in the errors table with their reasons, the metadata mismatches are reported with counts
/// and examples, and `--on-error fail` stops naming the file.
#[test]
fn embed_resumes_after_sigkill_and_ranks_and_shards_write_the_same_table() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path());
    let ck = {
        let _rng = super::util::torch_rng_lock();
        let cfg = config(dir.path(), "fixed", "");
        train(&cfg, &TrainOptions::default()).unwrap();
        trainer::layout::RunLayout::new(&cfg)
            .model(&cfg, &[0, 1, 2])
            .latest_checkpoint()
    };
    let (screen, meta) = screen(dir.path());
    let out = |name: &str| dir.path().join(format!("{name}.parquet"));
    let args = |name: &str| -> Vec<String> {
        [
            "embed",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--images",
            screen.to_str().unwrap(),
            "--metadata",
            meta.to_str().unwrap(),
            "--path-pattern",
            "{Plate}/{Well}/{Site}_{Cell}.tiff",
            "--part-size",
            "2",
            "--out",
            out(name).to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    };
    let strs = |v: &[String]| v.to_vec();
    let full = ok(trainer_cmd(&[]).args(strs(&args("full"))).output().unwrap());
    for want in [
        "26 images: 13 parts embedded, 0 already finished, 2 images not embedded",
        "metadata: 1 image paths do not match --path-pattern \"{Plate}/{Well}/{Site}_{Cell}.tiff\" (their pattern columns are null) (e.g. P0/broken.tiff)",
        "metadata: 3 images have no row in",
        "(e.g. P0/broken.tiff, P1/W0/s0_c99.tiff, P1/W2/s1_c5.tiff)",
        "metadata: 1 rows of",
        "name no image of this job (e.g. P7/W0/s0_c0.tiff)",
        "24 rows ->",
        "2 images in",
    ] {
        assert!(full.contains(want), "{want:?} not in:\n{full}");
    }
    let table = profiles::read_streamed(&out("full")).unwrap();
    let names: Vec<&str> = table.columns.iter().map(|c| c.name()).collect();
    assert_eq!(
        names,
        [
            "Metadata_ImagePath",
            "Metadata_Plate",
            "Metadata_Well",
            "Metadata_Site",
            "Metadata_Cell",
            "Metadata_Treatment",
            "Metadata_Checkpoint",
            "Metadata_Epoch",
            "Metadata_Channels"
        ]
    );
    assert_eq!((table.rows, table.dim), (24, 192));
    let row = strings(&table, "Metadata_ImagePath")
        .iter()
        .position(|p| p.ends_with("P1/W2/s1_c5.tiff"))
        .unwrap();
    assert_eq!(strings(&table, "Metadata_Cell")[row], "c5");
    assert_eq!(
        strings(&table, "Metadata_Treatment")[row],
        "",
        "no row: null"
    );
    let first = strings(&table, "Metadata_ImagePath")
        .iter()
        .position(|p| p.ends_with("P0/W0/s0_c0.tiff"))
        .unwrap();
    assert_eq!(strings(&table, "Metadata_Treatment")[first], "drug0");
    let errors = profiles::read_streamed(&dir.path().join("full.errors.parquet")).unwrap();
    let reasons = strings(&errors, "reason");
    assert!(strings(&errors, "Metadata_ImagePath")[0].ends_with("P0/broken.tiff"));
    assert!(reasons[0].contains("broken.tiff"), "{reasons:?}");
    assert!(
        reasons[1].contains("has 1 channels but data.channel_names lists 3"),
        "{reasons:?}"
    );
    let same = |name: &str| {
        assert_eq!(
            std::fs::read(out(name)).unwrap(),
            std::fs::read(out("full")).unwrap(),
            "{name}"
        );
    };
    // SIGKILL once a part is finished, then the same command again.
    let mut child = trainer_cmd(&[])
        .args(strs(&args("killed")))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let parts = dir.path().join("killed.parquet.parts");
    while !parts.join("part-0000000.json").exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "exited before a part was written"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out("killed").exists(), "killed after it finished");
    let again = ok(trainer_cmd(&[])
        .args(strs(&args("killed")))
        .output()
        .unwrap());
    assert!(!again.contains(" 0 already finished"), "{again}");
    same("killed");
    ok(trainer_cmd(&["launch", "--nproc", "2", "--"])
        .args(strs(&args("ranks")))
        .output()
        .unwrap());
    same("ranks");
    for i in ["0", "1"] {
        let shard = ok(trainer_cmd(&[])
            .args(strs(&args("shards")))
            .args(["--shard-index", i, "--shard-count", "2"])
            .output()
            .unwrap());
        assert!(
            !shard.contains("rows ->"),
            "a shard does not merge: {shard}"
        );
    }
    ok(trainer_cmd(&[])
        .args(strs(&args("shards")))
        .arg("--merge")
        .output()
        .unwrap());
    same("shards");
    let fail = trainer_cmd(&[])
        .args(strs(&args("fail")))
        .args(["--on-error", "fail"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&fail.stderr);
    assert!(!fail.status.success());
    assert!(
        err.contains("broken.tiff") && err.contains("--on-error fail"),
        "{err}"
    );
    // A metadata CSV with a key twice cannot be joined.
    std::fs::write(
        dir.path().join("dup.csv"),
        "path,X\na.tiff,1\na.tiff,2\n./a.tiff,3\n",
    )
    .unwrap();
    let mut o = options(&ck, screen.to_str().unwrap(), &out("dup"));
    o.metadata = Some(dir.path().join("dup.csv"));
    let e = run(&o).err().unwrap().to_string();
    assert!(
        e.ends_with("dup.csv: 1 paths have more than one row (e.g. a.tiff); a path must have one row to be joined"),
        "{e}"
    );
}

/// Images below an `s3://` prefix (a moto server), listed and read through the object store,
/// give the table of the same images on disk.
#[test]
fn embed_reads_images_from_s3() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path());
    let ck = {
        let _rng = super::util::torch_rng_lock();
        let cfg = config(dir.path(), "tokens", "");
        train(&cfg, &TrainOptions::default()).unwrap();
        trainer::layout::RunLayout::new(&cfg)
            .model(&cfg, &[0, 1, 2])
            .latest_checkpoint()
    };
    let local = dir.path().join("data/Training");
    let moto = super::s3::Server::start(super::s3::Backend::S3, &local);
    super::s3::fake_credentials();
    let url = format!("s3://{}/{}", super::s3::BUCKET, super::s3::PREFIX);
    let o = ok(trainer_cmd(&[
        "embed",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--images",
        &url,
        "--path-pattern",
        "{Class}/{File}.tiff",
        "--out",
        dir.path().join("s3.parquet").to_str().unwrap(),
    ])
    .env(
        "AWS_ENDPOINT_URL",
        format!("http://127.0.0.1:{}", moto.port),
    )
    .env("AWS_ALLOW_HTTP", "true")
    .env("AWS_REGION", "us-east-1")
    .output()
    .unwrap());
    assert!(o.contains("24 rows ->"), "{o}");
    let mut opts = options(
        &ck,
        local.to_str().unwrap(),
        &dir.path().join("local.parquet"),
    );
    opts.path_pattern = Some("{Class}/{File}.tiff".into());
    run(&opts).unwrap();
    let (s3, disk) = (
        profiles::read_streamed(&dir.path().join("s3.parquet")).unwrap(),
        profiles::read_streamed(&dir.path().join("local.parquet")).unwrap(),
    );
    assert_eq!(s3.values, disk.values);
    assert_eq!(
        strings(&s3, "Metadata_Class"),
        strings(&disk, "Metadata_Class")
    );
    assert!(strings(&s3, "Metadata_ImagePath")[0].starts_with(&format!("{url}/")));
}

/// A model trained on the synthetic set (`fixed`, all three channels).
fn trained_fixed(dir: &Path) -> PathBuf {
    let _rng = super::util::torch_rng_lock();
    tch::set_num_threads(2);
    let cfg = config(dir, "fixed", "");
    train(&cfg, &TrainOptions::default()).unwrap();
    trainer::layout::RunLayout::new(&cfg)
        .model(&cfg, &[0, 1, 2])
        .latest_checkpoint()
}

/// Crops of varying size and aspect ratio, as segmentation boxes and imaging flow cytometry
/// give them (a 60×40 crop among 50×50 ones used to panic the process in `Tensor::stack`):
/// every synthetic image is rewritten at one of five shapes, square, tall, wide and not a
/// multiple of the patch. The features stage and `trainer embed` both take them (each shape
/// keeps its aspect ratio through the resize, shorter side to `resize_length`), embed gives
/// the features stage's rows and nothing is an error. Equal to float rounding, not bit for
/// bit: images of one shape run as one batch, and the held-out images (features) and all
/// images (embed) make batches of other sizes; a CPU GEMM's last bit depends on the rows it
/// is given (1.6e-7 seen), so each row must agree to 1e-6 (unit rows: 6 decimal places).
#[test]
fn embed_and_features_take_crops_of_every_size_and_aspect() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path());
    let shapes = [(24, 24), (30, 20), (20, 36), (60, 40), (17, 29)];
    let mut tiffs = walk(&dir.path().join("data/Training"));
    tiffs.sort();
    for (n, path) in tiffs.iter().enumerate() {
        let (h, w) = shapes[n % shapes.len()];
        let data: Vec<u16> = (0..3 * h * w)
            .map(|i| ((i * 7919 + n * 104_729) % 4093) as u16)
            .collect();
        let img = ImageChwU16::new(3, h, w, data).unwrap();
        write_tiff_u16_chunky(path, &img).unwrap();
    }
    let _rng = super::util::torch_rng_lock();
    tch::set_num_threads(2);
    let cfg = config(dir.path(), "fixed", "");
    train(&cfg, &TrainOptions::default()).unwrap();
    let ck = trainer::layout::RunLayout::new(&cfg)
        .model(&cfg, &[0, 1, 2])
        .latest_checkpoint();
    let tag = tag_of_checkpoint(&ck).unwrap();
    let t = Target::new(&cfg, 0).unwrap();
    run_features(&t, &ck, &tag, None).unwrap();
    let stage = profiles::read(&t.files.profiles(&tag)).unwrap();
    let out = dir.path().join("mixed.parquet");
    let images = dir.path().join("data/Training").display().to_string();
    let s = run(&options(&ck, &images, &out)).unwrap();
    assert_eq!((s.images, s.errors, s.merged), (24, 0, Some((24, 0))));
    let table = profiles::read_streamed(&out).unwrap();
    let paths = strings(&table, "Metadata_ImagePath");
    let embedded =
        tch::Tensor::from_slice(&table.values).reshape([table.rows as i64, table.dim as i64]);
    assert!(stage.paths.len() >= 4, "{}", stage.paths.len());
    let mut held_out_shapes = std::collections::HashSet::new();
    for (r, p) in stage.paths.iter().enumerate() {
        let n = tiffs
            .iter()
            .position(|t| t.display().to_string() == *p)
            .unwrap();
        held_out_shapes.insert(n % shapes.len());
        let row = paths.iter().position(|q| q == p).unwrap();
        let diff = (embedded.get(row as i64) - stage.features.get(r as i64))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff <= 1e-6, "{p}: {diff}");
    }
    assert!(
        held_out_shapes.len() >= 2,
        "the held-out rows cover one shape only"
    );
}

fn tiny_screen(dir: &Path) -> PathBuf {
    let screen = dir.join("names");
    let one = ImageChwU16::new(3, 8, 8, vec![1u16; 192]).unwrap();
    std::fs::create_dir_all(screen.join("P1")).unwrap();
    write_tiff_u16_chunky(&screen.join("P1/A01_s1.tiff"), &one).unwrap();
    screen
}

/// A metadata column named like one the table writes (`Metadata_ImagePath`, `_Checkpoint`,
/// `_Epoch`, `_Channels`, with or without the prefix, from the CSV or a pattern field), or
/// given twice, would write two Parquet columns of one name, which pandas refuses: it is
/// refused before anything is embedded (the checkpoint is never opened), naming both sources
/// and never a source that was not given.
#[test]
fn embed_refuses_metadata_columns_that_collide() {
    let dir = tempfile::tempdir().unwrap();
    let screen = tiny_screen(dir.path());
    let missing = dir.path().join("no-such-checkpoint.safetensors");
    let attempt = |csv_header: Option<&str>, pattern: Option<&str>| {
        let mut opts = options(
            &missing,
            screen.to_str().unwrap(),
            &dir.path().join("o.parquet"),
        );
        if let Some(h) = csv_header {
            let csv = dir.path().join("meta.csv");
            let values = vec!["x"; h.split(',').count()].join(",");
            std::fs::write(&csv, format!("path,{h}\nP1/A01_s1.tiff,{values}\n")).unwrap();
            opts.metadata = Some(csv);
        }
        opts.path_pattern = pattern.map(str::to_string);
        match run(&opts) {
            Ok(_) => panic!("{csv_header:?} {pattern:?} was accepted"),
            Err(e) => e.to_string(),
        }
    };
    for name in ["ImagePath", "Checkpoint", "Epoch", "Channels"] {
        for given in [name.to_string(), format!("Metadata_{name}")] {
            let e = attempt(Some(&given), None);
            assert!(
                e.contains(&format!("column Metadata_{name} comes from the embedding table itself and from column \"{given}\" of "))
                    && e.contains("meta.csv"),
                "{e}"
            );
        }
        let e = attempt(None, Some(&format!("P1/{{{name}}}_s1.tiff")));
        assert!(
            e.contains(&format!("column Metadata_{name} comes from the embedding table itself and from --path-pattern field {{{name}}}")),
            "{e}"
        );
    }
    let e = attempt(Some("Treatment,Metadata_Treatment"), None);
    assert!(
        e.contains("column Metadata_Treatment comes from column \"Treatment\" of ")
            && e.contains("and from column \"Metadata_Treatment\" of ")
            && !e.contains("path-pattern"),
        "{e}"
    );
    let e = attempt(Some("Well"), Some("{Plate}/{Well}_s1.tiff"));
    assert!(
        e.contains("column Metadata_Well comes from --path-pattern field {Well} and from column \"Well\" of "),
        "{e}"
    );
    // The refusals came before the checkpoint was read.
    assert!(!e.contains("no-such-checkpoint"), "{e}");
}

/// A rerun with corrected metadata (the CSV fixed, or another pattern giving the same column
/// names) keeps the finished parts (no image is embedded again) and writes the corrected
/// values; the manifest records what the metadata was made from. The same folder given as
/// a relative path is the same job, not another one.
#[test]
fn embed_rerun_with_other_metadata_rejoins_it_without_re_embedding() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path());
    let ck = trained_fixed(dir.path());
    let (screen, _) = screen(dir.path());
    std::fs::remove_file(screen.join("P0/broken.tiff")).unwrap();
    std::fs::remove_file(screen.join("P1/W0/s0_c99.tiff")).unwrap();
    let csv = dir.path().join("treat.csv");
    let write_csv = |value: &str| {
        let mut text = String::from("path,Treatment\n");
        for p in walk(&screen) {
            let rel = p.strip_prefix(&screen).unwrap().display().to_string();
            text.push_str(&format!("{rel},{value}\n"));
        }
        std::fs::write(&csv, text).unwrap();
    };
    let out = dir.path().join("t.parquet");
    let embed = |pattern: &str, images: &str| {
        let mut opts = options(&ck, images, &out);
        opts.metadata = Some(csv.clone());
        opts.path_pattern = Some(pattern.to_string());
        let s = run(&opts).unwrap();
        (s, profiles::read_streamed(&out).unwrap())
    };
    let absolute = screen.display().to_string();
    write_csv("WRONG");
    let (first, t1) = embed("P{Plate}/W{Well}/{Site}_{Cell}.tiff", &absolute);
    assert_eq!((first.parts_embedded, first.parts_kept), (4, 0));
    assert!(strings(&t1, "Metadata_Treatment")
        .iter()
        .all(|v| v == "WRONG"));
    assert!(strings(&t1, "Metadata_Plate")
        .iter()
        .all(|v| v == "0" || v == "1"));
    let manifest =
        std::fs::read_to_string(dir.path().join("t.parquet.parts/manifest.json")).unwrap();
    assert!(
        manifest.contains("csv_sha256") && manifest.contains("P{Plate}/W{Well}"),
        "{manifest}"
    );

    write_csv("dmso");
    // The same folder, relative to the working directory.
    let cwd = std::env::current_dir().unwrap();
    let up = "../".repeat(cwd.components().count() - 1);
    let relative = format!("{up}{}", absolute.trim_start_matches('/'));
    let (second, t2) = embed("{Plate}/{Well}/{Site}_{Cell}.tiff", &relative);
    assert_eq!((second.parts_embedded, second.parts_kept), (0, 4));
    assert_eq!(t2.rows, t1.rows);
    assert!(strings(&t2, "Metadata_Treatment")
        .iter()
        .all(|v| v == "dmso"));
    assert!(strings(&t2, "Metadata_Plate")
        .iter()
        .all(|v| v == "P0" || v == "P1"));
    assert_eq!(t2.values, t1.values, "the features changed");
    let manifest2 =
        std::fs::read_to_string(dir.path().join("t.parquet.parts/manifest.json")).unwrap();
    assert!(
        manifest2.contains("\"{Plate}/{Well}/{Site}_{Cell}.tiff\"") && manifest2 != manifest,
        "{manifest2}"
    );
}

/// `trainer embed --device cuda` without a GPU names `--device`, not a config key it was
/// never given.
#[test]
fn embed_on_cuda_without_a_gpu_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let screen = tiny_screen(dir.path());
    let o = trainer_cmd(&[
        "embed",
        "--checkpoint",
        "x.safetensors",
        "--images",
        screen.to_str().unwrap(),
        "--out",
        dir.path().join("o.parquet").to_str().unwrap(),
        "--device",
        "cuda",
    ])
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(text.contains("--device is cuda but"), "{text}");
    assert!(!text.contains("train.device"), "{text}");
}

/// One meaning per tag, and the untrained network as a first-class checkpoint: with
/// `downstream.score_untrained` training writes `checkpoint_init.safetensors` before its
/// first step (student = teacher, iteration 0), tagged `init`; a `--max-steps 1` checkpoint
/// is `step1`, not `epoch0`; the checkpoint after the first epoch is `epoch0` and records one
/// epoch done; the pipeline analyses `init` first, then the numbered ones, and its features
/// are written under that tag.
#[test]
fn untrained_network_is_tagged_init_and_a_mid_epoch_checkpoint_step_n() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path());
    let _rng = super::util::torch_rng_lock();
    tch::set_num_threads(2);
    let yaml = config(dir.path(), "fixed", "").sections();
    let mut sections = yaml;
    sections.downstream.score_untrained = true;
    let cfg = Config::from_sections(sections, "test").unwrap();
    let files = trainer::layout::RunLayout::new(&cfg).model(&cfg, &[0, 1, 2]);
    let partial = TrainOptions {
        max_steps: Some(1),
        ..TrainOptions::default()
    };
    train(&cfg, &partial).unwrap();
    let init = files.initial_checkpoint();
    assert_eq!(tag_of_checkpoint(&init).unwrap(), "init");
    assert_eq!(
        tag_of_checkpoint(&files.latest_checkpoint()).unwrap(),
        "step1"
    );
    let ck = trainer::checkpoint::load(&init).unwrap();
    assert_eq!((ck.meta.epoch, ck.meta.iteration), (0, 0));
    let students: Vec<&String> = ck
        .tensors
        .keys()
        .filter(|k| k.starts_with("student.backbone."))
        .collect();
    assert!(!students.is_empty());
    for k in students {
        let teacher = k.replacen("student.", "teacher.", 1);
        let diff = (&ck.tensors[k] - &ck.tensors[&teacher])
            .abs()
            .max()
            .double_value(&[]);
        assert_eq!(diff, 0.0, "{k}: the untrained student is the teacher");
    }
    train(&cfg, &TrainOptions::default()).unwrap();
    let t = Target::new(&cfg, 0).unwrap();
    let numbered = t.numbered_checkpoints();
    let tags: Vec<&str> = numbered.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(tags, ["init", "epoch0"]);
    let after = trainer::checkpoint::read_meta(&numbered[1].1).unwrap();
    assert_eq!(after.epoch, 1);
    assert_eq!(tag_of_checkpoint(&numbered[1].1).unwrap(), "epoch0");
    run_features(&t, &init, "init", None).unwrap();
    assert_eq!(t.feature_tags(), ["init"]);
    run_features(&t, &numbered[1].1, "epoch0", None).unwrap();
    assert_eq!(t.feature_tags(), ["init", "epoch0"]);
}
