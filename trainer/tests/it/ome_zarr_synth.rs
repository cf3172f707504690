//! `trainer synth --layout ome-zarr` (data/screen/synth_zarr.rs): cells cut from the synthetic
//! plates equal the per-cell TIFFs they were pasted from, as the `fov` screen's do (screen.rs),
//! and ome-zarr-py reads the plates as written (`ome_zarr_synth_check.py`: NGFF 0.5 HCS
//! validation by ome-zarr-models, plate/well/field structure, channel labels, pixels).
use crate::screen::synth_options;
use crate::util::run_py_file;
use std::collections::BTreeMap;
use std::path::Path;
use trainer::config::{DataSection, DatasetLocation, ScreenLayout, ScreenSection};
use trainer::data::screen::open::open_screen;
use trainer::data::screen::synth_zarr::{generate_ome_zarr, OmeZarrSynthSummary, LABELS};
use trainer::data::{read_tiff, ImageSource};

/// The screen tests' synthetic screen (screen.rs) as plates in 16-px chunks (so a cell's box
/// crosses chunks).
fn synth(dir: &Path) -> OmeZarrSynthSummary {
    generate_ome_zarr(&synth_options(dir), 16).unwrap()
}

/// `cells.csv`: (plate, well, field, object) → the per-cell TIFF.
fn expected(s: &OmeZarrSynthSummary) -> BTreeMap<[String; 4], String> {
    std::fs::read_to_string(&s.cells_csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            ([f[0], f[1], f[2], f[3]].map(String::from), f[4].to_string())
        })
        .collect()
}

/// Every cell of every plate, placed by the label images or by the plate's object table,
/// masked or not, is the per-cell TIFF it came from, to the last bit; its class
/// (`Metadata_Well`) is its well, one class per well.
#[test]
fn cells_cut_from_the_synthetic_plates_are_the_per_cell_images() {
    let dir = tempfile::tempdir().unwrap();
    let s = synth(dir.path());
    assert_eq!((s.cells, s.sites, s.plates.len()), (21, 9, 2));
    let want = expected(&s);
    let base = ScreenSection {
        layout: ScreenLayout::OmeZarr,
        box_size: s.cell_size,
        label_column: Some("Metadata_Well".into()),
        ..ScreenSection::default()
    };
    let mut seen = 0;
    for (plate, objects) in s.plates.iter().zip(&s.objects) {
        let variants = [
            ScreenSection {
                labels: Some(LABELS.into()),
                ..base.clone()
            },
            ScreenSection {
                objects: Some(objects.display().to_string()),
                ..base.clone()
            },
            ScreenSection {
                objects: Some(objects.display().to_string()),
                labels: Some(LABELS.into()),
                mask_objects: true,
                ..base.clone()
            },
        ];
        for screen in variants {
            let data = DataSection {
                dataset_dir: DatasetLocation::Local(plate.clone()),
                channel_names: s.channel_names.clone(),
                screen: Some(screen.clone()),
                ..DataSection::default()
            };
            let src = open_screen(&data, &screen).unwrap();
            let n = src.index().len();
            assert!(n > 0, "{} ({screen:?})", plate.display());
            for (i, sample) in src.index().samples.iter().enumerate() {
                let meta = src.metadata(i);
                let get = |k: &str| meta.iter().find(|(m, _)| m == k).unwrap().1.clone();
                let key = [
                    "Metadata_Plate",
                    "Metadata_Well",
                    "Metadata_Site",
                    "Metadata_ObjectNumber",
                ]
                .map(get);
                let path = want.get(&key).unwrap_or_else(|| panic!("{key:?}"));
                let tiff = read_tiff(Path::new(path)).unwrap();
                let got = src.read(i).unwrap();
                assert_eq!((got.channels, got.height, got.width), (3, 20, 20));
                assert!(
                    got.data == tiff.data,
                    "{key:?} differs from {path} ({screen:?})"
                );
                assert_eq!(sample.label, key[1]);
            }
            seen += n;
        }
    }
    assert_eq!(seen, 3 * 21, "every cell, once per variant");
}

/// ome-zarr-py reads the plates as they were written: the plate validates as NGFF 0.5 HCS,
/// each plate has its wells (one per class, row = plate) and fields, every field its three
/// channels by name and a label image of its size, and the pixels of every cell's box are its
/// per-cell TIFF with zeros around them (checked in Python, against tifffile).
#[test]
fn ome_zarr_py_reads_the_synthetic_plates_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let s = synth(dir.path());
    let out = run_py_file("ome_zarr_synth_check.py", &[dir.path().to_str().unwrap()]);
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["cells"], 21, "{out}");
    let plates = report["plates"].as_array().unwrap();
    let names: Vec<&str> = plates.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["P1", "P2"]);
    let wells = |p: &serde_json::Value| -> Vec<String> {
        p["wells"].as_object().unwrap().keys().cloned().collect()
    };
    assert_eq!(wells(&plates[0]), ["A/01", "A/02", "A/03"]);
    assert_eq!(wells(&plates[1]), ["B/01", "B/02", "B/03"]);
    assert_eq!(plates[1]["rows"], serde_json::json!(["A", "B"]));
    assert_eq!(plates[0]["columns"], serde_json::json!(["01", "02", "03"]));
    // 7 cells a class shared out over 2 plates (4 and 3), 3 cells a site: 2 fields and 1.
    let fields: Vec<usize> = plates
        .iter()
        .flat_map(|p| p["wells"].as_object().unwrap().values())
        .map(|f| f.as_array().unwrap().len())
        .collect();
    assert_eq!(fields, [2, 2, 2, 1, 1, 1]);
    let side = 2 * 2 * 20 + 20;
    for p in plates {
        for field in p["wells"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|f| f.as_array().unwrap())
        {
            assert_eq!(field["shape"], serde_json::json!([3, side, side]));
            assert_eq!(field["dtype"], "uint16");
            assert_eq!(field["labels_shape"], serde_json::json!([side, side]));
            assert_eq!(field["channels"], serde_json::json!(s.channel_names));
        }
    }
}
