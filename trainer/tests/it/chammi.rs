//! CHAMMI's tiled crops (`data.screen.layout: chammi`): every cell equals, to the last bit,
//! NumPy's `reshape(image, (h, channel_width, -1), order="F")` of the same file read by
//! scikit-image (CHAMMI's own loader), for 8- and 16-bit PNGs and 16-bit TIFFs of several
//! sizes and aspect ratios and 3-, 4- and 5-channel datasets in one table; bad rows name
//! their file and table row.
use crate::util::{run_py_file, run_python};
use std::collections::BTreeMap;
use std::path::Path;
use trainer::config::{DataSection, DatasetLocation, ScreenLayout, ScreenSection};
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
