//! Screens as they are stored (issue: fields of view + segmentation): cells cut from sites
//! equal the per-cell images they were made of, and equal NumPy's slices of fields of view
//! written by tifffile with tables written by pandas; bad input names its file and row.
use super::s3::{s3_behind_proxy, Backend, PREFIX};
use crate::util::run_python;
use std::path::Path;
use trainer::config::{
    DataSection, DatasetLocation, ObjectStoreSection, ScreenBorder, ScreenSection,
};
use trainer::data::screen::open::open_screen;
use trainer::data::screen::synth::{generate_screen, ScreenSynthOptions};
use trainer::data::{read_tiff, ImageSource, SynthOptions};

fn screen_data(table: &Path, channels: &[&str], screen: ScreenSection) -> DataSection {
    DataSection {
        dataset_dir: DatasetLocation::Local(table.to_path_buf()),
        channel_names: channels.iter().map(|s| s.to_string()).collect(),
        screen: Some(screen.clone()),
        ..DataSection::default()
    }
}

/// The small synthetic screen the screen tests share: 3 classes × 7 cells of 20 px, 3
/// channels, 2 plates, 3 cells a site.
pub(super) fn synth_options(dir: &Path) -> ScreenSynthOptions {
    ScreenSynthOptions {
        cells: SynthOptions {
            out: dir.to_path_buf(),
            seed: 5,
            classes: 3,
            per_class: 7,
            size: 20,
            channels: 3,
            donors: 1,
        },
        plates: 2,
        per_site: 3,
    }
}

fn synth(dir: &Path) -> trainer::data::screen::synth::ScreenSynthSummary {
    generate_screen(&synth_options(dir)).unwrap()
}

/// Every cell cut from the synthetic screen is, to the last bit, the per-cell TIFF it was
/// pasted from, whether the cells come from the object table or the label images, masked or
/// not; each carries its site's metadata and its class from `Metadata_Treatment`.
#[test]
fn cells_cut_from_fields_of_view_are_the_per_cell_images() {
    let dir = tempfile::tempdir().unwrap();
    let s = synth(dir.path());
    assert_eq!(s.cells, 21);
    let names: Vec<&str> = s.channel_names.iter().map(String::as_str).collect();
    let expected: Vec<(String, String)> = std::fs::read_to_string(&s.cells_csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                format!("{}/{}/{}/{}", f[0], f[1], f[2], f[3]),
                f[4].to_string(),
            )
        })
        .collect();
    let base = ScreenSection {
        box_size: s.cell_size,
        label_column: Some("Metadata_Treatment".into()),
        ..ScreenSection::default()
    };
    let variants = [
        ScreenSection {
            objects: Some(s.objects.display().to_string()),
            ..base.clone()
        },
        ScreenSection {
            labels: Some("Nuclei".into()),
            ..base.clone()
        },
        ScreenSection {
            objects: Some(s.objects.display().to_string()),
            labels: Some("Nuclei".into()),
            mask_objects: true,
            site_cache: 1,
            ..base.clone()
        },
    ];
    for screen in variants {
        let src = open_screen(&screen_data(&s.load_data, &names, screen.clone()), &screen).unwrap();
        assert_eq!(src.index().len(), 21, "{screen:?}");
        assert_eq!(src.index().classes, ["B", "CD4T", "CD8T"]);
        for (i, sample) in src.index().samples.iter().enumerate() {
            let key = sample
                .path
                .strip_prefix(&s.load_data)
                .unwrap()
                .to_string_lossy()
                .to_string();
            let (_, path) = expected
                .iter()
                .find(|(k, _)| *k == key)
                .unwrap_or_else(|| panic!("{key}"));
            let want = read_tiff(Path::new(path)).unwrap();
            let got = src.read(i).unwrap();
            assert_eq!((got.channels, got.height, got.width), (3, 20, 20));
            assert!(
                got.data == want.data,
                "{key} differs from {path} ({screen:?})"
            );
            let class = Path::new(path).parent().unwrap().file_name().unwrap();
            assert_eq!(sample.label, class.to_string_lossy());
            let meta = src.metadata(i);
            let keys: Vec<&str> = meta.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(
                keys,
                [
                    "Metadata_Plate",
                    "Metadata_Well",
                    "Metadata_Site",
                    "Metadata_Treatment",
                    "Metadata_ObjectNumber",
                    "Metadata_Center_X",
                    "Metadata_Center_Y"
                ]
            );
        }
    }
}

/// Fields of view written by tifffile, a LoadData table and an object table written by
/// pandas (CellProfiler's `Orig` channel names, `URL_` and `FileName_`/`PathName_` columns,
/// an illumination function per channel): each cell equals NumPy's slice of the site around
/// its centre, divided by the illumination function; a cell at the border is left out
/// (`skip`, counted) or zero-padded exactly as `np.pad` (`pad`).
#[test]
fn cells_equal_numpy_slices_of_fields_written_by_python() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys, json, numpy as np, pandas as pd, tifffile, os
d = sys.argv[1]; rng = np.random.default_rng(7)
os.makedirs(f"{d}/img", exist_ok=True); os.makedirs(f"{d}/illum", exist_ok=True)
H, W, B = 41, 37, 8
rows, objs, crops = [], [], {}
illum = {ch: (0.5 + rng.random((H, W))).astype(np.float64) for ch in ["DNA", "Mito"]}
for ch, f in illum.items(): np.save(f"{d}/illum/P1_Illum{ch}.npy", f)
for n, (well, site) in enumerate([("A01", "1"), ("B02", "2")], start=1):
    planes = {ch: rng.integers(0, 65535, (H, W), dtype=np.uint16) for ch in ["DNA", "Mito"]}
    for ch, p in planes.items(): tifffile.imwrite(f"{d}/img/{well}_{site}_{ch}.tif", p)
    rows.append({"ImageNumber": n, "Metadata_Plate": "P1", "Metadata_Well": well, "Metadata_Site": site,
                 "Metadata_Dose": 0.5 * n, "Metadata_Ctrl": n == 1,
                 "URL_OrigDNA": f"{d}/img/{well}_{site}_DNA.tif",
                 "FileName_OrigMito": f"{well}_{site}_Mito.tif", "PathName_OrigMito": "img",
                 "FileName_IllumDNA": "P1_IllumDNA.npy", "PathName_IllumDNA": f"{d}/illum",
                 "FileName_IllumMito": "P1_IllumMito.npy", "PathName_IllumMito": "illum"})
    centres = [(10.2, 12.7), (20.5, 30.49), (2.0, 3.0), (35.9, 39.6)]
    stack = np.stack([planes["DNA"] / illum["DNA"], planes["Mito"] / illum["Mito"]]).astype(np.float32)
    padded = np.pad(stack, ((0, 0), (B, B), (B, B)))
    for o, (x, y) in enumerate(centres, start=1):
        cx, cy = int(np.floor(x + 0.5)), int(np.floor(y + 0.5))
        y0, x0 = cy - B // 2, cx - B // 2
        crops[f"P1/{well}/{site}/{o}"] = padded[:, y0 + B:y0 + 2 * B, x0 + B:x0 + 2 * B].ravel().tolist()
        objs.append({"ImageNumber": n, "ObjectNumber": o, "Nuclei_Location_Center_X": x, "Nuclei_Location_Center_Y": y})
pd.DataFrame(rows).to_csv(f"{d}/load_data.csv", index=False)
pd.DataFrame(objs).to_csv(f"{d}/Nuclei.csv", index=False)
json.dump(crops, open(f"{d}/crops.json", "w"))
# The same tables as Parquet, as pandas and polars write them: the LoadData table by pandas
# (pyarrow strings, a float dose, a bool); the object table by polars, joined by plate/well/
# site keys stored as floats with a null centre column beside the used ones.
pd.DataFrame(rows).to_parquet(f"{d}/load_data.parquet", index=False)
import polars as pl
site_of = {r["ImageNumber"]: r for r in rows}
pl.DataFrame({
    "Metadata_Plate": [site_of[o["ImageNumber"]]["Metadata_Plate"] for o in objs],
    "Metadata_Well": [site_of[o["ImageNumber"]]["Metadata_Well"] for o in objs],
    "Metadata_Site": [float(site_of[o["ImageNumber"]]["Metadata_Site"]) for o in objs],
    "ObjectNumber": [o["ObjectNumber"] for o in objs],
    "Nuclei_Location_Center_X": [o["Nuclei_Location_Center_X"] for o in objs],
    "Nuclei_Location_Center_Y": [o["Nuclei_Location_Center_Y"] for o in objs],
    "Cells_AreaShape_Area": [None] * len(objs),
}, schema_overrides={"Cells_AreaShape_Area": pl.Float64}).write_parquet(f"{d}/Nuclei.parquet")
"#;
    run_python(script, &[dir.path().to_str().unwrap()]);
    let crops: std::collections::BTreeMap<String, Vec<f32>> =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("crops.json")).unwrap())
            .unwrap();
    let table = dir.path().join("load_data.csv");
    for border in [ScreenBorder::Skip, ScreenBorder::Pad] {
        let screen = ScreenSection {
            objects: Some(dir.path().join("Nuclei.csv").display().to_string()),
            box_size: 8,
            border,
            ..ScreenSection::default()
        };
        let src = open_screen(
            &screen_data(&table, &["DNA", "Mito"], screen.clone()),
            &screen,
        )
        .unwrap();
        let inside = ["1", "2"];
        let n = if border == ScreenBorder::Skip { 4 } else { 8 };
        assert_eq!(src.index().len(), n, "{border:?}");
        assert_eq!(src.skipped().at_border, 8 - n);
        for (i, sample) in src.index().samples.iter().enumerate() {
            let key = sample
                .path
                .strip_prefix(&table)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if border == ScreenBorder::Skip {
                assert!(
                    inside.iter().any(|o| key.ends_with(&format!("/{o}"))),
                    "{key} is at the border"
                );
            }
            let got = src.read(i).unwrap();
            let want = &crops[&key];
            let worst = got
                .data
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
                .fold(0f32, f32::max);
            assert!(worst <= 1e-6, "{key}: relative difference {worst}");
        }
        let m = src.metadata(0);
        assert!(m.contains(&("Metadata_Dose".into(), "0.5".into())), "{m:?}");
        assert!(
            m.contains(&("Metadata_Ctrl".into(), "True".into())),
            "{m:?}"
        );
    }
    // The Parquet tables give the same cells, pixels and metadata (a bool reads `true`, as
    // everywhere a Parquet bool is read).
    let open = |table: &str, objects: &str| {
        let screen = ScreenSection {
            objects: Some(dir.path().join(objects).display().to_string()),
            box_size: 8,
            border: ScreenBorder::Pad,
            ..ScreenSection::default()
        };
        let data = screen_data(&dir.path().join(table), &["DNA", "Mito"], screen.clone());
        open_screen(&data, &screen).unwrap()
    };
    let csv = open("load_data.csv", "Nuclei.csv");
    for (table, objects) in [
        ("load_data.parquet", "Nuclei.csv"),
        ("load_data.csv", "Nuclei.parquet"),
        ("load_data.parquet", "Nuclei.parquet"),
    ] {
        let pq = open(table, objects);
        assert_eq!(pq.index().len(), csv.index().len(), "{table} + {objects}");
        for i in 0..csv.index().len() {
            assert_eq!(pq.read(i).unwrap().data, csv.read(i).unwrap().data);
            let want: Vec<_> = csv
                .metadata(i)
                .into_iter()
                .map(|(k, v)| match (table, v.as_str()) {
                    ("load_data.parquet", "True") => (k, "true".to_string()),
                    ("load_data.parquet", "False") => (k, "false".to_string()),
                    _ => (k, v),
                })
                .collect();
            assert_eq!(pq.metadata(i), want, "{table} + {objects}, cell {i}");
        }
    }
    // A Parquet table cut short in transfer: an error naming the file, no panic.
    let bytes = std::fs::read(dir.path().join("Nuclei.parquet")).unwrap();
    std::fs::write(dir.path().join("cut.parquet"), &bytes[..bytes.len() / 2]).unwrap();
    let screen = ScreenSection {
        objects: Some(dir.path().join("cut.parquet").display().to_string()),
        box_size: 8,
        ..ScreenSection::default()
    };
    let data = screen_data(
        &dir.path().join("load_data.csv"),
        &["DNA", "Mito"],
        screen.clone(),
    );
    let e = open_screen(&data, &screen).err().unwrap().to_string();
    assert!(
        e.contains("cut.parquet") && e.contains("not a readable Parquet table"),
        "{e}"
    );
}

/// Bad input names its file and row: a row naming a missing file, a channel the table lacks,
/// a centre that is no number, an object of no site, a label image of another size.
#[test]
fn bad_screens_name_the_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let s = synth(dir.path());
    let names: Vec<&str> = s.channel_names.iter().map(String::as_str).collect();
    let objects = s.objects.display().to_string();
    let open = |table: &Path, channels: &[&str], screen: ScreenSection| {
        open_screen(&screen_data(table, channels, screen.clone()), &screen)
    };
    let with_objects = ScreenSection {
        objects: Some(objects.clone()),
        box_size: 20,
        ..ScreenSection::default()
    };
    // A channel the table does not have.
    let e = open(&s.load_data, &["DAPI", "Actin"], with_objects.clone())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("load_data.csv") && e.contains("\"Actin\"") && e.contains("DAPI"),
        "{e}"
    );
    // A row naming a file that is not there: opening works, reading that site names it.
    let text = std::fs::read_to_string(&s.load_data).unwrap();
    let broken = dir.path().join("broken.csv");
    std::fs::write(
        &broken,
        text.replacen("r01c01f01-ch2.tiff", "missing-ch2.tiff", 1),
    )
    .unwrap();
    let src = open(&broken, &names, with_objects.clone()).unwrap();
    let e = src.read(0).unwrap_err().to_string();
    assert!(e.contains("missing-ch2.tiff"), "{e}");
    assert!(
        src.read(src.index().len() - 1).is_ok(),
        "other sites still read"
    );
    // An object table with a centre that is not a number, and one naming no site.
    let obj = std::fs::read_to_string(&s.objects).unwrap();
    let mut lines: Vec<String> = obj.lines().map(String::from).collect();
    lines[3] = lines[3].rsplit_once(',').unwrap().0.to_string() + ",NaN";
    let bad = dir.path().join("bad_objects.csv");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let e = open(
        &s.load_data,
        &names,
        ScreenSection {
            objects: Some(bad.display().to_string()),
            ..with_objects.clone()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("bad_objects.csv: row 3") && e.contains("Nuclei_Location_Center_Y"),
        "{e}"
    );
    let orphan = dir.path().join("orphan.csv");
    std::fs::write(
        &orphan,
        "ImageNumber,ObjectNumber,Location_Center_X,Location_Center_Y\n1,1,5,5\n99,1,5,5\n",
    )
    .unwrap();
    let e = open(
        &s.load_data,
        &names,
        ScreenSection {
            objects: Some(orphan.display().to_string()),
            ..with_objects.clone()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("orphan.csv: row 2") && e.contains("ImageNumber 99"),
        "{e}"
    );
    // A centre outside its site: refused when the screen opens (`border: skip`), or when the
    // cell is read (`pad`: an error for that cell alone, naming its site and object).
    let outside = dir.path().join("outside.csv");
    std::fs::write(
        &outside,
        "ImageNumber,ObjectNumber,Location_Center_X,Location_Center_Y\n1,1,5,5\n1,2,5000,5\n",
    )
    .unwrap();
    let outside_screen = ScreenSection {
        objects: Some(outside.display().to_string()),
        ..with_objects.clone()
    };
    let e = open(&s.load_data, &names, outside_screen.clone())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("site P1/A01/1") && e.contains("object 2 has its centre (X 5000, Y 5) outside"),
        "{e}"
    );
    let src = open(
        &s.load_data,
        &names,
        ScreenSection {
            border: ScreenBorder::Pad,
            ..outside_screen
        },
    )
    .unwrap();
    assert!(src.read(0).is_ok());
    let e = src.read(1).unwrap_err().to_string();
    assert!(e.contains("object 2 has its centre"), "{e}");
    // A label image of another size than its site, with mask_objects.
    let label = dir.path().join("labels/P1/r01c01f01-nuclei.tiff");
    let small = trainer::data::Chw::new(1, 10, 10, vec![1u16; 100]).unwrap();
    trainer::data::write_tiff_u16_chunky(&label, &small).unwrap();
    let masked = ScreenSection {
        labels: Some("Nuclei".into()),
        mask_objects: true,
        ..with_objects
    };
    let src = open(&s.load_data, &names, masked).unwrap();
    let e = src.read(0).unwrap_err().to_string();
    assert!(
        e.contains("P1/A01/1") && e.contains("label image is 10×10"),
        "{e}"
    );
}

/// `data.order: sites` decodes each site once per epoch: the cells of a screen read in that
/// order, with a cache of two sites (windows of one site), cost one read per site, on one
/// rank or two; scDINO's shuffle over all cells, with the same cache, reads sites again.
#[test]
fn the_sites_order_reads_each_site_once_per_epoch() {
    use trainer::config::SampleOrder;
    use trainer::train::sampler::configured_epoch_order;
    let dir = tempfile::tempdir().unwrap();
    let s = synth(dir.path());
    let names: Vec<&str> = s.channel_names.iter().map(String::as_str).collect();
    let screen = ScreenSection {
        box_size: s.cell_size,
        objects: Some(s.objects.display().to_string()),
        site_cache: 2,
        ..ScreenSection::default()
    };
    let sites_reads = |order: SampleOrder, world: usize| -> Vec<(usize, u64)> {
        let data = DataSection {
            order,
            ..screen_data(&s.load_data, &names, screen.clone())
        };
        let src = open_screen(&data, &screen).unwrap();
        // Every site of the table holds cells.
        let sites = src.site_layout().unwrap().len();
        let rows = std::fs::read_to_string(&s.load_data)
            .unwrap()
            .lines()
            .count()
            - 1;
        assert_eq!(sites, rows);
        let all: Vec<usize> = (0..src.index().len()).collect();
        (0..world)
            .map(|rank| {
                src.report();
                let order = configured_epoch_order(&data, &src, &all, 3, 1, rank, world).unwrap();
                assert_eq!(order.len(), 21usize.div_ceil(world));
                for &i in &order {
                    src.read(i).unwrap();
                }
                let touched: std::collections::BTreeSet<String> = order
                    .iter()
                    .map(|&i| {
                        let m = src.metadata(i);
                        format!("{}/{}/{}", m[0].1, m[1].1, m[2].1)
                    })
                    .collect();
                (touched.len(), src.sites_decoded())
            })
            .collect()
    };
    // One rank: as many reads as sites.
    let [(sites, reads)] = sites_reads(SampleOrder::Sites, 1)[..] else {
        unreachable!()
    };
    assert!(sites > 3);
    assert_eq!(reads, sites as u64);
    // Two ranks: each reads every site of its share once.
    for (touched, reads) in sites_reads(SampleOrder::Sites, 2) {
        assert_eq!(reads, touched as u64);
    }
    let [(touched, reads)] = sites_reads(SampleOrder::Exact, 1)[..] else {
        unreachable!()
    };
    assert_eq!(touched, sites);
    assert!(
        reads > sites as u64 + 4,
        "the exact order read {reads} sites for {sites}"
    );
    // Windows of one 3-cell site are fewer cells than 2 workers × batch 16 hold in flight:
    // the log says so and what to raise (2.33 cells a site: windows of 28 sites); a cache of
    // 56 sites is enough, 54 is not.
    let warn_for = |site_cache: usize| {
        let screen = ScreenSection {
            site_cache,
            ..screen.clone()
        };
        let data = DataSection {
            order: SampleOrder::Sites,
            num_workers: 2,
            ..screen_data(&s.load_data, &names, screen.clone())
        };
        let src = open_screen(&data, &screen).unwrap();
        trainer::train::sampler::site_window_warning(&data, &src, 16)
    };
    let w = warn_for(2).unwrap();
    assert!(
        w.contains("windows of 1 site ")
            && w.contains("raise data.screen.site_cache to at least 56"),
        "{w}"
    );
    assert_eq!(warn_for(56), None);
    assert!(warn_for(54).is_some());
    // A source that is not a screen cannot be read by sites: validation refuses the config
    // without `data.screen`, and the order names the dataset if it gets that far.
    let data = DataSection {
        order: SampleOrder::Sites,
        ..screen_data(&s.load_data, &names, screen.clone())
    };
    let src = open_screen(&data, &screen).unwrap();
    let local = trainer::data::LocalSource::from_index(src.index().clone());
    let e = configured_epoch_order(&data, &local, &[0], 3, 1, 0, 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data.order: sites") && e.contains("load_data.csv"),
        "{e}"
    );
}

/// An object table of a plate has many rows and many feature columns, of which a screen
/// reads four: 140,000 objects with 40 feature columns (NaNs among them), written by pandas
/// as `.csv.gz` and by pyarrow as Parquet in row groups of 100,000 (so the streamed reader
/// crosses both a chunk and a row group), list exactly the cells pandas lists, also from a
/// bucket; the Parquet table damaged in the bucket (cut short, or a page header overwritten
/// in the second row group) is an error naming its URL. An object listed twice is named by
/// its second row and its first.
#[test]
fn large_object_tables_stream_alike_from_csv_gz_and_parquet_row_groups() {
    let dir = tempfile::tempdir().unwrap();
    let s = synth(dir.path());
    let script = r#"
import sys, json, numpy as np, pandas as pd, pyarrow as pa, pyarrow.parquet as pq
d, load_data = sys.argv[1], sys.argv[2]
numbers = pd.read_csv(load_data)["ImageNumber"].tolist()
rng = np.random.default_rng(3)
n = 140_000
image = np.array([numbers[i % len(numbers)] for i in range(n)])
obj = np.arange(n) // len(numbers) + 1
x = np.round(rng.random(n) * 10 + 5, 3)
y = np.round(rng.random(n) * 10 + 5, 3)
df = pd.DataFrame({"ImageNumber": image, "ObjectNumber": obj,
                   "Nuclei_Location_Center_X": x, "Nuclei_Location_Center_Y": y})
for k in range(40):
    f = rng.random(n); f[rng.random(n) < 0.1] = np.nan
    df[f"Nuclei_Feature_{k}"] = f
df = df.sample(frac=1.0, random_state=0)  # rows in no particular order
df.to_csv(f"{d}/store/big.csv.gz", index=False)
pq.write_table(pa.Table.from_pandas(df, preserve_index=False), f"{d}/store/big.parquet", row_group_size=100_000)
site = {num: i for i, num in enumerate(numbers)}
order = sorted(zip(df["ImageNumber"], df["ObjectNumber"], df["Nuclei_Location_Center_X"], df["Nuclei_Location_Center_Y"]),
               key=lambda r: (site[r[0]], r[1]))
json.dump([[site[a], int(b), float(c), float(e)] for a, b, c, e in order], open(f"{d}/expected.json", "w"))
meta = pq.ParquetFile(f"{d}/store/big.parquet").metadata
names = [meta.schema.column(i).name for i in range(meta.num_columns)]
chunk = meta.row_group(1).column(names.index("Nuclei_Location_Center_X"))
open(f"{d}/x_page.txt", "w").write(str(chunk.data_page_offset if chunk.dictionary_page_offset is None else chunk.dictionary_page_offset))
"#;
    let d = dir.path();
    std::fs::create_dir_all(d.join("store")).unwrap();
    run_python(
        script,
        &[d.to_str().unwrap(), s.load_data.to_str().unwrap()],
    );
    let expected: Vec<(usize, u64, f64, f64)> =
        serde_json::from_slice(&std::fs::read(d.join("expected.json")).unwrap()).unwrap();
    assert_eq!(expected.len(), 140_000);
    let names: Vec<&str> = s.channel_names.iter().map(String::as_str).collect();
    let screen = |objects: &Path| ScreenSection {
        objects: Some(objects.display().to_string()),
        box_size: 20,
        border: ScreenBorder::Pad,
        ..ScreenSection::default()
    };
    let cells = |objects: &str, store: Option<&ObjectStoreSection>| {
        let sec = ScreenSection {
            objects: Some(objects.to_string()),
            ..screen(Path::new(objects))
        };
        let mut data = screen_data(&s.load_data, &names, sec.clone());
        if let Some(store) = store {
            data.object_store = store.clone();
        }
        let src = open_screen(&data, &sec).unwrap();
        src.cells()
            .iter()
            .map(|c| (c.site, c.object, c.x, c.y))
            .collect::<Vec<(usize, u64, f64, f64)>>()
    };
    for table in ["big.csv.gz", "big.parquet"] {
        let got = cells(d.join("store").join(table).to_str().unwrap(), None);
        assert!(got == expected, "{table}: the cells differ from pandas'");
    }
    // The same tables in a bucket (moto, behind the logging proxy) give the same cells, read
    // in ranges, never whole: the CSV front to back in 8 MiB requests, the Parquet table its
    // footer and the four columns' chunks, a fraction of the file.
    // Beside them, the Parquet table damaged two ways: cut short in transfer (no footer), and
    // with the first page header of a column the screen reads overwritten in the second row
    // group (the footer intact: the damage is met mid-stream, after 100,000 good rows).
    let bytes = std::fs::read(d.join("store/big.parquet")).unwrap();
    std::fs::write(d.join("store/cut.parquet"), &bytes[..bytes.len() / 2]).unwrap();
    let mut overwritten = bytes.clone();
    let page: usize = std::fs::read_to_string(d.join("x_page.txt"))
        .unwrap()
        .parse()
        .unwrap();
    overwritten[page..page + 64].fill(0xA5);
    std::fs::write(d.join("store/overwritten.parquet"), &overwritten).unwrap();
    let (_server, proxy, store) = s3_behind_proxy(&d.join("store"));
    for table in ["cut.parquet", "overwritten.parquet"] {
        let url = Backend::S3.url(&format!("{PREFIX}/{table}"));
        let sec = ScreenSection {
            objects: Some(url.clone()),
            ..screen(Path::new(&url))
        };
        let mut data = screen_data(&s.load_data, &names, sec.clone());
        data.object_store = store.clone();
        let e = open_screen(&data, &sec).err().map(|e| e.to_string());
        let e = e.unwrap_or_else(|| panic!("{table} from S3 was read as a table"));
        assert!(e.contains(&url) && e.contains("Parquet"), "{table}: {e}");
    }
    for table in ["big.csv.gz", "big.parquet"] {
        proxy.clear();
        let got = cells(&Backend::S3.url(&format!("{PREFIX}/{table}")), Some(&store));
        assert!(
            got == expected,
            "{table} from S3: the cells differ from pandas'"
        );
        let size = std::fs::metadata(d.join("store").join(table))
            .unwrap()
            .len();
        let gets: Vec<_> = proxy
            .log()
            .into_iter()
            .filter(|r| r.method == "GET" && r.target.contains(table))
            .collect();
        let fetched: u64 = gets
            .iter()
            .map(|r| {
                let range = r
                    .range
                    .as_deref()
                    .unwrap_or_else(|| panic!("{table}: a GET without a range"));
                let (a, b) = range.trim_start_matches("bytes=").split_once('-').unwrap();
                b.parse::<u64>().unwrap() + 1 - a.parse::<u64>().unwrap()
            })
            .sum();
        if table.ends_with(".gz") {
            assert_eq!(fetched, size, "{table}");
            assert_eq!(gets.len() as u64, size.div_ceil(8 << 20), "{table}");
        } else {
            assert!(
                fetched * 5 < size,
                "{table}: {fetched} of {size} bytes fetched"
            );
        }
    }
    std::fs::write(
        d.join("twice.csv"),
        "ImageNumber,ObjectNumber,Location_Center_X,Location_Center_Y\n\
         1,1,5,5\n2,1,5,5\n2,2,6,6\n1,1,7,7\n2,1,8,8\n",
    )
    .unwrap();
    let sec = screen(&d.join("twice.csv"));
    let e = open_screen(&screen_data(&s.load_data, &names, sec.clone()), &sec)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("twice.csv: row 4")
            && e.contains("object 1 of site")
            && e.contains("first in row 1"),
        "{e}"
    );
}
