//! OME-Zarr plates (data/screen/ome_zarr.rs) against ome-zarr-py: `ome_zarr_oracle.py` writes
//! small HCS plates with `ome_zarr.writer` (NGFF 0.4 on Zarr v2; 0.5 on Zarr v3, unsharded
//! and sharded; 2 wells × 2 fields × 3 uint16 channels of 40×48 in 16×16 chunks, a label
//! image per field), reads them back with zarr-python and cuts every region with NumPy. Our
//! reader must return the same sites, the same crops to the last bit and the same labels, from
//! disk and from a moto S3 server.
use super::s3::{s3_behind_proxy, Proxy, Server, BUCKET, PREFIX};
use super::util::run_py_file;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use trainer::config::{DatasetLocation, ObjectStoreSection};
use trainer::data::screen::ome_zarr::{Ngff, OmeZarrPlate};
use trainer::data::screen::{FieldLayout, Region, ScreenError, PLATE, SITE, WELL};

/// The plates and the oracle's manifest, written once for the whole module.
struct Fixtures {
    dir: PathBuf,
    manifest: serde_json::Value,
}

fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ome_zarr_it");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = run_py_file("ome_zarr_oracle.py", &[dir.to_str().unwrap()]);
        assert_eq!(out.trim(), "ok");
        let manifest =
            serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        Fixtures { dir, manifest }
    })
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn local(name: &str) -> DatasetLocation {
    DatasetLocation::Local(fixtures().dir.join(format!("{name}.zarr")))
}

fn channels(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn open_local(name: &str, ch: &[&str], labels: Option<&str>) -> Result<OmeZarrPlate, ScreenError> {
    OmeZarrPlate::open(
        &local(name),
        &ObjectStoreSection::default(),
        &channels(ch),
        labels,
    )
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn field(v: &serde_json::Value, k: &str) -> i64 {
    v[k].as_i64().unwrap()
}

/// Checks `plate` against the oracle's sites, crops (bit for bit) and labels of `entry`.
fn check_plate(plate: &OmeZarrPlate, entry: &serde_json::Value, bin: &[u8]) {
    let name = entry["plate"].as_str().unwrap();
    let sites = entry["sites"].as_array().unwrap();
    assert_eq!(plate.sites().len(), sites.len(), "{name}: sites");
    for (got, want) in plate.sites().iter().zip(sites) {
        assert_eq!(
            got.name,
            want["name"].as_str().unwrap(),
            "{name}: site name"
        );
        let keys: Vec<&str> = got.metadata.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [PLATE, WELL, SITE],
            "{name}: metadata columns first, in order"
        );
        assert_eq!(got.get(PLATE), want["plate"].as_str());
        assert_eq!(got.get(WELL), want["well"].as_str());
        assert_eq!(got.get(SITE), want["field"].as_str());
    }
    assert_eq!(plate.channels(), strings(&entry["select"]).as_slice());
    let nc = field(entry, "channels") as usize;
    for r in entry["regions"].as_array().unwrap() {
        let region = Region {
            y0: field(r, "y0"),
            x0: field(r, "x0"),
            height: field(r, "height") as usize,
            width: field(r, "width") as usize,
        };
        let site = field(r, "site") as usize;
        let off = field(r, "offset") as usize;
        let n = nc * region.height * region.width;
        let want = f32s(&bin[off..off + 4 * n]);
        let got = plate.read_region(site, region).unwrap();
        assert_eq!(
            (got.channels, got.height, got.width),
            (nc, region.height, region.width)
        );
        let same = got
            .data
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{name}: site {site} region {region:?} differs from NumPy's"
        );
    }
    for l in entry["labels"].as_array().unwrap() {
        let site = field(l, "site") as usize;
        let (h, w) = (field(l, "height") as usize, field(l, "width") as usize);
        let off = field(l, "offset") as usize;
        let want = u32s(&bin[off..off + 4 * h * w]);
        let got = plate
            .read_labels(site)
            .unwrap()
            .expect("labels were asked for");
        assert_eq!((got.channels, got.height, got.width), (1, h, w));
        assert!(got.data == want, "{name}: labels of site {site}");
        let whole = plate.read_site(site).unwrap();
        assert_eq!((whole.height, whole.width), (h, w));
    }
}

fn entry(name: &str) -> &'static serde_json::Value {
    fixtures().manifest["plates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["plate"] == name)
        .unwrap()
}

fn bin(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().dir.join(format!("{name}.bin"))).unwrap()
}

fn open_entry(location: &DatasetLocation, s3: &ObjectStoreSection, name: &str) -> OmeZarrPlate {
    let select = strings(&entry(name)["select"]);
    OmeZarrPlate::open(location, s3, &select, Some("cells")).unwrap()
}

#[test]
fn plates_on_disk_read_as_numpy_reads_them() {
    for (name, ngff) in [("p04", Ngff::V04), ("p05", Ngff::V05), ("p05s", Ngff::V05)] {
        let plate = open_entry(&local(name), &ObjectStoreSection::default(), name);
        assert_eq!(plate.ngff(), ngff, "{name}");
        check_plate(&plate, entry(name), &bin(name));
    }
}

#[test]
fn the_plate_name_falls_back_to_the_store_name() {
    // p04 has no `name` attribute; p05 is named Plate05.
    let plate = open_local("p04", &["DNA"], None).unwrap();
    assert_eq!(plate.plate_name(), "p04");
    assert_eq!(plate.sites()[3].name, "p04/B3/1");
    assert_eq!(
        plate.read_labels(0).unwrap(),
        None,
        "no label name, no labels"
    );
    let d = plate.describe();
    assert!(
        d.contains("p04") && d.contains("0.4") && d.contains("2 wells"),
        "{d}"
    );
}

/// The moto server holding the fixtures behind the logging proxy of the object-store tests
/// (which counts the requests a read makes), and the `data.object_store` settings reaching it.
fn s3_server() -> (Server, Proxy, ObjectStoreSection) {
    s3_behind_proxy(&fixtures().dir)
}

fn s3_location(name: &str) -> DatasetLocation {
    format!("s3://{BUCKET}/{PREFIX}/{name}.zarr")
        .parse()
        .unwrap()
}

/// Every plate kind read from moto as from disk, and a region fetching only its chunks, one
/// GET each.
///
/// This test once stalled after about 600 requests: one HEAD or ranged GET reached moto and
/// was never answered. The cause was the test harness, not moto or our client: werkzeug (moto's
/// HTTP server) logs a line per request to stderr, `Server::spawn_moto` piped that stderr and
/// never read it, and once the pipe's 64 KiB were full the thread answering the next request
/// blocked in its log call (reproduced with boto3 alone: a stall after ~900 HEADs of shorter
/// keys with the pipe undrained, none in 2,000 with it drained). The pipe is now drained and
/// werkzeug's request log silenced.
#[test]
fn plates_on_s3_read_as_on_disk_and_only_the_chunks_a_region_needs() {
    let (_server, proxy, s3) = s3_server();
    for name in ["p05s", "p04"] {
        let plate = open_entry(&s3_location(name), &s3, name);
        check_plate(&plate, entry(name), &bin(name));
        assert!(plate.describe().contains(&format!("{name}.zarr")));
    }
    // p05: 3 channels chunked 1×1×16×16 (czyx). A region inside chunk (0, 0) of a field
    // already open fetches that chunk of each channel and nothing else.
    let plate = open_entry(&s3_location("p05"), &s3, "p05");
    proxy.clear();
    let region = Region {
        y0: 1,
        x0: 2,
        height: 10,
        width: 12,
    };
    plate.read_region(0, region).unwrap();
    // One GET per chunk and no HEAD (zarr_ranges.rs: zarrs_object_store would ask each
    // chunk's size first).
    let mut requests: Vec<(String, String)> = proxy
        .log()
        .into_iter()
        .map(|r| (r.method, r.target))
        .collect();
    requests.sort();
    let want: Vec<(String, String)> = (0..3)
        .map(|c| {
            let key = format!("/{BUCKET}/{PREFIX}/p05.zarr/A/1/0/s0/c/{c}/0/0/0");
            ("GET".to_string(), key)
        })
        .collect();
    assert_eq!(requests, want);
    // A plate that is not there names the store and what is missing.
    let e = OmeZarrPlate::open(&s3_location("nope"), &s3, &channels(&["DNA"]), None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("nope.zarr") && e.contains("plate group is missing"),
        "{e}"
    );
}

#[test]
fn a_missing_channel_names_the_plate_and_the_labels() {
    let e = open_local("p05", &["DNA", "Actin"], None).err().unwrap();
    let ScreenError::MissingChannel {
        source_name,
        channel,
        available,
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(channel, "Actin");
    assert_eq!(available, &channels(&["DNA", "RNA", "Mito"]));
    assert!(
        source_name.contains("p05.zarr") && source_name.contains("Plate05"),
        "{e}"
    );
}

#[test]
fn a_missing_well_names_the_store_and_the_key() {
    let e = open_local("pmissing", &["DNA"], None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("pmissing.zarr") && e.contains("B/3"), "{e}");
    assert!(e.contains("well listed in the plate"), "{e}");
}

#[test]
fn labels_of_another_size_are_refused_by_key() {
    let plate = open_local("plabels", &["DNA"], Some("cells")).unwrap();
    let e = plate.read_labels(0).err().unwrap().to_string();
    assert!(
        e.contains("plabels.zarr") && e.contains("A/1/0/labels/cells/s0"),
        "{e}"
    );
    assert!(e.contains("40×40") && e.contains("40×48"), "{e}");
    let e = open_local("p05", &["DNA"], Some("nuclei"))
        .unwrap()
        .read_labels(0)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("A/1/0/labels/nuclei") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn a_float_plate_reads_exactly_and_a_bool_plate_is_refused() {
    let plate = open_local("pf32", &["DNA", "RNA", "Mito"], None).unwrap();
    let got = plate.read_site(0).unwrap();
    let want = f32s(&bin("pf32"));
    assert_eq!(got.data.len(), want.len());
    assert!(got
        .data
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    let e = open_local("pbool", &["DNA"], None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("pbool.zarr") && e.contains("A/1/0/s0") && e.contains("bool"),
        "{e}"
    );
}

#[test]
fn a_path_that_is_no_plate_is_refused() {
    let refusal = |location: &DatasetLocation| {
        OmeZarrPlate::open(
            location,
            &ObjectStoreSection::default(),
            &channels(&["DNA"]),
            None,
        )
        .err()
        .unwrap()
        .to_string()
    };
    let e = refusal(&DatasetLocation::Local(
        Path::new("/nonexistent/x.zarr").to_path_buf(),
    ));
    assert!(e.contains("/nonexistent/x.zarr"), "{e}");
    // A well group (not a plate) has no `plate` attribute.
    let e = refusal(&DatasetLocation::Local(fixtures().dir.join("p05.zarr/A/1")));
    assert!(e.contains("zarr.json") && e.contains("\"plate\""), "{e}");
}
