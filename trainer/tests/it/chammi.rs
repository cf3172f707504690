//! CHAMMI's tiled crops (`data.screen.layout: chammi`): every cell equals, to the last bit,
//! NumPy's `reshape(image, (h, channel_width, -1), order="F")` of the same file read by
//! scikit-image (CHAMMI's own loader), for 8- and 16-bit PNGs and 16-bit TIFFs of several
//! sizes and aspect ratios and 3-, 4- and 5-channel datasets in one table; bad rows name
//! their file and table row.
use crate::util::{run_py_file, run_python};
use std::collections::BTreeMap;
use std::path::Path;
use trainer::config::{CellChannels, DataSection, DatasetLocation, ScreenLayout, ScreenSection};
use trainer::data::screen::cell_source::ScreenSource;
use trainer::data::screen::open::open_screen;
use trainer::data::ImageSource;

#[derive(serde::Deserialize)]
struct Folded {
    shape: Vec<usize>,
    data: Vec<i64>,
}

/// Writes the set (`tests/py/chammi_set.py`, `per` cells per dataset and split) and reads
/// its oracle.
fn chammi_set(dir: &Path, per: usize) -> BTreeMap<String, Folded> {
    run_py_file("chammi_set.py", &[dir.to_str().unwrap(), &per.to_string()]);
    serde_json::from_str(&std::fs::read_to_string(dir.join("fold.json")).unwrap()).unwrap()
}

fn open(table: &Path, channels: &[&str], screen: ScreenSection) -> Result<ScreenSource, String> {
    let data = DataSection {
        dataset_dir: DatasetLocation::Local(table.to_path_buf()),
        channel_names: channels.iter().map(|s| s.to_string()).collect(),
        screen: Some(screen.clone()),
        ..DataSection::default()
    };
    open_screen(&data, &screen).map_err(|e| e.to_string())
}

fn chammi() -> ScreenSection {
    ScreenSection {
        layout: ScreenLayout::Chammi,
        label_column: Some("Metadata_Label".into()),
        ..ScreenSection::default()
    }
}

/// The `file_path` of cell `i` (its path below the table).
fn file_of(src: &ScreenSource, table: &Path, i: usize) -> String {
    src.index().samples[i]
        .path
        .strip_prefix(table)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// Compares every cell of `src` with the oracle's channels `tiles(dataset)`.
fn assert_folds_equal(
    src: &ScreenSource,
    table: &Path,
    oracle: &BTreeMap<String, Folded>,
    tiles: impl Fn(&str) -> Vec<usize>,
) {
    for i in 0..src.index().len() {
        let file = file_of(src, table, i);
        let want = &oracle[&file];
        let (h, w) = (want.shape[1], want.shape[2]);
        let pick = tiles(file.split('/').next().unwrap());
        let got = src.read(i).unwrap();
        assert_eq!(
            (got.channels, got.height, got.width),
            (pick.len(), h, w),
            "{file}"
        );
        let want: Vec<i64> = pick
            .iter()
            .flat_map(|&c| want.data[c * h * w..(c + 1) * h * w].iter().copied())
            .collect();
        let got: Vec<i64> = got.data.iter().map(|&v| v as i64).collect();
        assert!(got == want, "{file}: not NumPy's fold of the same file");
    }
}

/// Each dataset with all its channels, a pair two datasets share (in another order than
/// either stores them), and the one channel all three share over the whole mixed table: every
/// cell is NumPy's Fortran-order fold, bit for bit; metadata and classes come from the table.
#[test]
fn chammi_cells_equal_numpys_fortran_fold() {
    let dir = tempfile::tempdir().unwrap();
    let oracle = chammi_set(dir.path(), 4);
    let table = dir.path().join("enriched_meta.csv");
    let all: [(&str, &[&str]); 3] = [
        ("Allen", &["nucleus", "membrane", "protein"]),
        ("HPA", &["microtubules", "protein", "nucleus", "er"]),
        ("CP", &["nucleus", "er", "rna", "golgi", "mito"]),
    ];
    for (dataset, names) in all {
        let screen = ScreenSection {
            datasets: Some(vec![dataset.into()]),
            ..chammi()
        };
        let src = open(&table, names, screen).unwrap();
        let tasks = match dataset {
            "Allen" => 2,
            "HPA" => 3,
            _ => 4,
        };
        assert_eq!(src.index().len(), 4 * (tasks + 1), "{dataset}");
        assert_folds_equal(&src, &table, &oracle, |_| (0..names.len()).collect());
    }
    // Allen and HPA share nucleus and protein, stored in other orders.
    let screen = ScreenSection {
        datasets: Some(vec!["Allen".into(), "HPA".into()]),
        ..chammi()
    };
    let src = open(&table, &["protein", "nucleus"], screen).unwrap();
    assert_eq!(src.index().len(), 12 + 16);
    assert_folds_equal(&src, &table, &oracle, |d| match d {
        "Allen" => vec![2, 0],
        _ => vec![1, 2],
    });
    // The whole table (3, 4 and 5 channels) read as the one channel all share.
    let src = open(&table, &["nucleus"], chammi()).unwrap();
    assert_eq!(src.index().len(), oracle.len());
    assert_folds_equal(&src, &table, &oracle, |d| match d {
        "HPA" => vec![2],
        _ => vec![0],
    });
    let meta = src.metadata(0);
    let keys: Vec<&str> = meta.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "Metadata_Dataset",
            "Metadata_file_path",
            "Metadata_ID",
            "Metadata_channel_width",
            "Metadata_Label",
            "Metadata_train_test_split",
            "Metadata_Task_one",
            "Metadata_Task_two",
            "Metadata_Task_three",
            "Metadata_Task_four",
            "Metadata_cell_type",
            "Metadata_Plate",
            "Metadata_Structure"
        ]
    );
    assert_eq!(meta[0].1, "Allen");
    assert_eq!(src.index().samples[0].label, "Allen_c0");
    assert_eq!(src.index().classes.len(), 3 * 2 + 2 * 2);
    // CHAMMI's training rows only.
    let screen = ScreenSection {
        rows: [("train_test_split".to_string(), vec!["Train".to_string()])].into(),
        ..chammi()
    };
    let src = open(&table, &["nucleus"], screen).unwrap();
    assert_eq!(src.index().len(), 12);
    assert!(
        src.describe().contains("Allen: 4, CP: 4, HPA: 4"),
        "{}",
        src.describe()
    );
}

/// Bad rows fail their own cell, naming the file and the table row: a missing file, a width
/// that is not a whole number of tiles, another number of tiles than the dataset's channels,
/// an empty `channel_width`, a 1-bit and an RGB PNG, a TIFF of two samples per pixel, a
/// file that is no image; the other cells still read. A dataset
/// lacking a named channel, one without channel names and a file listed twice are refused
/// when the table is opened, naming the row.
#[test]
fn bad_chammi_rows_name_the_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let oracle = chammi_set(dir.path(), 2);
    let d = dir.path();
    run_python(
        "import sys, numpy as np; from PIL import Image\n\
         Image.fromarray(np.ones((10, 36), bool)).save(sys.argv[1] + '/Allen/one_bit.png')\n\
         Image.fromarray(np.zeros((10, 36, 3), np.uint8)).save(sys.argv[1] + '/Allen/rgb.png')\n\
         import tifffile\n\
         tifffile.imwrite(sys.argv[1] + '/Allen/two.tif', np.zeros((10, 36, 2), np.uint16), photometric='minisblack', planarconfig='contig')\n\
         open(sys.argv[1] + '/Allen/text.png', 'w').write('not an image')",
        &[d.to_str().unwrap()],
    );
    let good = d.join("Allen/Train/000.png");
    for name in ["w5", "w9", "empty"] {
        std::fs::copy(&good, d.join(format!("Allen/{name}.png"))).unwrap();
    }
    let table = d.join("enriched_meta.csv");
    let mut text = std::fs::read_to_string(&table).unwrap();
    let header_and_rows = oracle.len() + 1;
    let bad = [
        ("Allen/missing.png", "12"),
        ("Allen/w5.png", "5"),
        ("Allen/w9.png", "9"),
        ("Allen/empty.png", ""),
        ("Allen/one_bit.png", "12"),
        ("Allen/rgb.png", "12"),
        ("Allen/two.tif", "12"),
        ("Allen/text.png", "12"),
    ];
    for (file, width) in bad {
        text.push_str(&format!(
            "{file},x,{width},Allen_c0,Train,False,False,False,False,,,s0\n"
        ));
    }
    std::fs::write(&table, &text).unwrap();
    let src = open(&table, &["nucleus"], chammi()).unwrap();
    assert_eq!(src.index().len(), header_and_rows - 1 + bad.len());
    let reasons = [
        "No such file",
        "not a whole number of 5-px tiles",
        "holds 4 tiles of 9 px but dataset Allen has 3 channels",
        "channel_width is empty",
        "is a PNG of 1-bit grayscale; CHAMMI's crops are 8- or 16-bit grayscale",
        "is a PNG of 8-bit RGB; CHAMMI's crops are 8- or 16-bit grayscale",
        "is a TIFF of 2 samples per pixel",
        "is neither a PNG nor a TIFF",
    ];
    for (k, ((file, _), reason)) in bad.iter().zip(reasons).enumerate() {
        let i = oracle.len() + k;
        assert_eq!(file_of(&src, &table, i), *file);
        let e = src.read(i).unwrap_err().to_string();
        let row = format!("enriched_meta.csv: row {}", oracle.len() + k + 1);
        assert!(
            e.contains(&row) && e.contains(file) && e.contains(reason),
            "{e} (wanted {row}, {file}, {reason})"
        );
    }
    assert!(src.read(0).is_ok(), "the good rows still read");
    // A channel a dataset lacks: refused at opening, naming the first row and its channels.
    let e = open(&table, &["rna"], chammi()).err().unwrap();
    assert!(
        e.contains("enriched_meta.csv: row 1")
            && e.contains("dataset Allen has channels [nucleus, membrane, protein], not \"rna\""),
        "{e}"
    );
    // A dataset with no channel names, and a file listed twice.
    for (row, reason) in [
        (
            "Other/a.png,x,4,l,Train,False,False,False,False,,,",
            "dataset \"Other\" has no channel names",
        ),
        (
            "Allen/Train/000.png,x,12,l,Train,False,False,False,False,,,",
            "is listed twice (rows 1 and",
        ),
    ] {
        std::fs::write(&table, format!("{text}{row}\n")).unwrap();
        let e = open(&table, &["nucleus"], chammi()).err().unwrap();
        assert!(e.contains(reason), "{e}");
        assert!(
            e.contains(&format!("row {}", header_and_rows + bad.len())),
            "{e}"
        );
    }
}

/// Every CHAMMI channel, in the order the model sees them.
const UNION: [&str; 8] = [
    "nucleus",
    "membrane",
    "protein",
    "microtubules",
    "er",
    "rna",
    "golgi",
    "mito",
];

/// `cell_channels: own`: the mixed 3-, 4- and 5-channel table read whole over the union of
/// the channels, each cell with the channels its dataset has (bit for bit NumPy's fold of
/// those tiles, in the union's order), and the per-channel mean/std over the cells that hold
/// each channel equal to NumPy's over the same min–max-scaled tiles. A dataset holding none
/// of the named channels is refused naming its row.
#[test]
fn chammi_cells_keep_their_own_channels_and_mean_std_counts_each_over_its_cells() {
    let dir = tempfile::tempdir().unwrap();
    let oracle = chammi_set(dir.path(), 3);
    let table = dir.path().join("enriched_meta.csv");
    let own = ScreenSection {
        cell_channels: CellChannels::Own,
        ..chammi()
    };
    let src = open(&table, &UNION, own.clone()).unwrap();
    assert_eq!(src.index().len(), oracle.len());
    assert!(
        src.describe().contains("(each cell its own)"),
        "{}",
        src.describe()
    );
    // Positions among UNION of each dataset's channels, and their tiles.
    let held = |d: &str| -> (Vec<usize>, Vec<usize>) {
        match d {
            "Allen" => (vec![0, 1, 2], vec![0, 1, 2]),
            // HPA stores microtubules, protein, nucleus, er.
            "HPA" => (vec![0, 2, 3, 4], vec![2, 1, 0, 3]),
            _ => (vec![0, 4, 5, 6, 7], vec![0, 1, 2, 3, 4]),
        }
    };
    for i in 0..src.index().len() {
        let file = file_of(&src, &table, i);
        let dataset = file.split('/').next().unwrap();
        assert_eq!(src.cell_channels(i).unwrap(), held(dataset).0, "{file}");
    }
    assert_folds_equal(&src, &table, &oracle, |d| held(d).1);
    // Mean/std over every cell: each channel over the cells that hold it.
    let (ms, quality) =
        trainer::data::mean_std::compute_with(&src, 1.0, 0, 2, trainer::config::OnCorrupt::Fail)
            .unwrap();
    assert_eq!(quality.images, oracle.len());
    let want = run_python(
        "import json, sys, numpy as np\n\
         fold = json.load(open(sys.argv[1] + '/fold.json'))\n\
         held = {'Allen': ([0, 1, 2], [0, 1, 2]), 'HPA': ([0, 2, 3, 4], [2, 1, 0, 3]), 'CP': ([0, 4, 5, 6, 7], [0, 1, 2, 3, 4])}\n\
         s, q, n = np.zeros(8), np.zeros(8), np.zeros(8)\n\
         for f, v in fold.items():\n\
         \x20   img = np.array(v['data'], np.float64).reshape(v['shape'])\n\
         \x20   for slot, tile in zip(*held[f.split('/')[0]]):\n\
         \x20       x = img[tile]\n\
         \x20       x = ((x - x.min()) / (x.max() - x.min())).astype(np.float32).astype(np.float64)\n\
         \x20       s[slot] += x.sum(); q[slot] += (x * x).sum(); n[slot] += x.size\n\
         m = s / n\n\
         print(json.dumps({'mean': m.tolist(), 'std': np.sqrt(q / n - m * m).tolist()}))",
        &[dir.path().to_str().unwrap()],
    );
    let want: trainer::data::mean_std::MeanStd = serde_json::from_str(want.trim()).unwrap();
    for c in 0..8 {
        assert!(
            (ms.mean[c] - want.mean[c]).abs() < 1e-9,
            "{c}: {ms:?} vs {want:?}"
        );
        assert!(
            (ms.std[c] - want.std[c]).abs() < 1e-9,
            "{c}: {ms:?} vs {want:?}"
        );
    }
    // Without `own`, the union is refused at the first row lacking a channel.
    let e = open(&table, &UNION, chammi()).err().unwrap();
    assert!(e.contains("data.screen.cell_channels: own"), "{e}");
    // A dataset holding none of the named channels.
    let e = open(&table, &["rna", "mito"], own).err().unwrap();
    assert!(
        e.contains("enriched_meta.csv: row 1")
            && e.contains("dataset Allen has channels [nucleus, membrane, protein], none of"),
        "{e}"
    );
}

/// Writes a training config for the CHAMMI-like table at `table` over the union channels
/// with `model.channels: mode` and `cell_channels: own`.
fn own_channels_config(dir: &Path, table: &Path, mode: &str, batch: usize) -> std::path::PathBuf {
    let cfg = dir.join(format!("{mode}.yaml"));
    std::fs::write(
        &cfg,
        format!(
            "run:\n  name: {mode}\n  output_dir: {out}\n  seed: 3\n\
             data:\n  dataset_dir: {table}\n  channel_names: [{names}]\n  \
             channel_combinations: [\"01234567\"]\n  num_workers: 2\n  train_fraction: 0.9\n  \
             screen:\n    layout: chammi\n    label_column: Metadata_Label\n    \
             cell_channels: own\n\
             model:\n  name: m\n  arch: vit_tiny\n  patch_size: 8\n  out_dim: 64\n  \
             channels: {mode}\n\
             augment:\n  global_crop_size: 16\n  local_crop_size: 8\n  local_crops_number: 1\n\
             train:\n  epochs: 1\n  warmup_epochs: 0\n  batch_size_per_gpu: {batch}\n  \
             precision: fp32\n",
            out = dir.join("out").display(),
            table = table.display(),
            names = UNION.join(", "),
        ),
    )
    .unwrap();
    cfg
}

/// `trainer train` on a table of 3-, 4- and 5-channel datasets with each cell's own
/// channels: `bag` takes exactly each training cell's own channels as its items, `tokens`
/// draws each step's batch from one channel set (as many steps as the sets' batches) and
/// trains every step on channels its cells hold; both write a checkpoint whose mean/std
/// covers every channel. `fixed` is refused.
#[test]
fn bag_and_tokens_train_on_cells_with_their_own_channels() {
    use trainer::config::Config;
    let dir = tempfile::tempdir().unwrap();
    chammi_set(dir.path(), 3);
    let table = dir.path().join("enriched_meta.csv");
    let batch = 4;
    for mode in ["bag", "tokens"] {
        let cfg_path = own_channels_config(dir.path(), &table, mode, batch);
        let cfg = Config::load(&cfg_path).unwrap();
        let source = trainer::data::open_source(&cfg.data).unwrap();
        let train = trainer::data::configured_split(source.index(), &cfg.data, cfg.run.seed as u32)
            .unwrap()
            .train;
        let own: Vec<Vec<usize>> = train
            .iter()
            .map(|&i| source.cell_channels(i).unwrap().to_vec())
            .collect();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_trainer"))
            .args([
                "train",
                "--config",
                cfg_path.to_str().unwrap(),
                "--threads",
                "1",
            ])
            .env("SCDINO_LOG", "info")
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{mode}: {log}");
        let model_dir = dir.path().join(format!(
            "out/{mode}/scDINO_ViTs/m_{mode}_channel_{}",
            UNION.join("_")
        ));
        let run_log = std::fs::read_to_string(model_dir.join("run_log.txt")).unwrap();
        assert!(model_dir.join("checkpoint.safetensors").exists());
        let iters = match mode {
            // One item per channel a training cell holds.
            "bag" => own.iter().map(Vec::len).sum::<usize>().div_ceil(batch),
            // Each channel set's cells in batches of their own.
            _ => {
                let mut per_set = std::collections::BTreeMap::<&Vec<usize>, usize>::new();
                for s in &own {
                    *per_set.entry(s).or_default() += 1;
                }
                assert_eq!(per_set.len(), 3, "three datasets, three sets");
                assert!(log.contains("cells by their channels"), "{log}");
                per_set.values().map(|n| n.div_ceil(batch)).sum()
            }
        };
        assert!(
            run_log.contains(&format!("iterations_per_epoch : {iters} ")),
            "{mode}: {run_log}"
        );
        let ms: trainer::data::mean_std::MeanStd = serde_json::from_str(
            &std::fs::read_to_string(
                dir.path()
                    .join(format!("out/{mode}/mean_and_std_of_dataset.txt")),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(ms.mean.len(), 8);
        assert!(ms.std.iter().all(|s| *s > 0.0), "{ms:?}");
    }
    let fixed =
        std::fs::read_to_string(own_channels_config(dir.path(), &table, "fixed", batch)).unwrap();
    let e = Config::from_yaml(&fixed, "fixed.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.channels") && e.contains("cell_channels: own"),
        "{e}"
    );
}
