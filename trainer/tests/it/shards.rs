//! Packed shards: the packed dataset is the same dataset (index, labels, split, bytes,
//! training, features), Python's `tarfile` reads the shards, and `pack` resumes and verifies.
use super::util::run_python;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use trainer::config::{Config, DataFormat, DataSection};
use trainer::data::shards::tar::{member_span, END_SPAN};
use trainer::data::shards::{
    pack, LocalShardStore, PackEvent, PackOptions, ShardIndexFile, ShardSource, INDEX_FILE,
    JOURNAL_FILE,
};
use trainer::data::{
    generate_synthetic, open_source, train_heldout_split, DataError, DatasetIndex, ImageSource,
    LocalSource, SynthOptions,
};

fn synth(dir: &Path, classes: usize, per_class: usize) -> PathBuf {
    generate_synthetic(&SynthOptions {
        out: dir.join("data"),
        seed: 8,
        classes,
        per_class,
        size: 20,
        ..SynthOptions::default()
    })
    .unwrap();
    dir.join("data/Training")
}

fn opts(out: &Path, max_bytes: u64, max_samples: usize) -> PackOptions {
    PackOptions {
        out: out.to_path_buf(),
        max_shard_bytes: max_bytes,
        max_shard_samples: max_samples,
        shuffle: true,
        seed: 1,
    }
}

fn pack_quiet(
    src: &dyn ImageSource,
    o: &PackOptions,
) -> Result<trainer::data::shards::PackSummary, DataError> {
    pack(src, 0, o, &mut |_| {})
}

fn data_section(dir: &Path, format: DataFormat, depth: usize) -> DataSection {
    DataSection {
        dataset_dir: dir.to_path_buf().into(),
        format,
        label_folder_depth: depth,
        ..DataSection::default()
    }
}

fn read_dir_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn packed_dataset_is_the_same_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let tree = synth(dir.path(), 4, 11);
    let packed = dir.path().join("packed");
    let local = LocalSource::open(&tree, 0).unwrap();
    // Room for exactly 3 samples (TIFF + JSON member each) per shard: cut by bytes.
    let one = std::fs::metadata(&local.index().samples[0].path)
        .unwrap()
        .len();
    let max = 3 * (member_span(one) + member_span(100)) + END_SPAN;
    let s = pack_quiet(&local, &opts(&packed, max, 0)).unwrap();
    assert_eq!(s.samples, 44);
    assert_eq!(s.shards, 15);
    assert_eq!(s.written_shards, s.shards);
    for k in 0..15 {
        let len = std::fs::metadata(packed.join(format!("shard-{k:06}.tar")))
            .unwrap()
            .len();
        assert!(
            len <= max && (k == 14 || len == max),
            "shard {k}: {len} of {max}"
        );
    }

    // `auto` detects the shards; the index is the tree's, field for field.
    for format in [DataFormat::Auto, DataFormat::Shards] {
        let src = open_source(&data_section(&packed, format, 0)).unwrap();
        assert!(src.describe().contains("shards"), "{}", src.describe());
        let a: &DatasetIndex = src.index();
        assert_eq!(a, local.index());
        for i in 0..a.len() {
            assert_eq!(
                src.read_bytes(i).unwrap(),
                local.read_bytes(i).unwrap(),
                "sample {i}"
            );
            assert_eq!(src.read(i).unwrap().data, local.read(i).unwrap().data);
        }
        let (sa, sb) = (
            train_heldout_split(a.len(), 0.8, 40).unwrap(),
            train_heldout_split(local.index().len(), 0.8, 40).unwrap(),
        );
        assert_eq!(sa, sb);
        // The layout covers every sample once.
        let mut all: Vec<usize> = src.shard_layout().unwrap().concat();
        all.sort_unstable();
        assert_eq!(all, (0..44).collect::<Vec<_>>());
    }
    // `folder` on the packed directory does not silently read it as a tree.
    assert!(open_source(&data_section(&packed, DataFormat::Folder, 0)).is_err());
    // A tree is never taken for shards by `auto`.
    let tree_src = open_source(&data_section(&tree, DataFormat::Auto, 0)).unwrap();
    assert!(tree_src.shard_layout().is_none());

    // Another label depth re-cuts labels from the original paths exactly as the tree does.
    let deep = open_source(&data_section(&packed, DataFormat::Shards, 1)).unwrap();
    let deep_tree = LocalSource::open(&tree, 1).unwrap();
    assert_eq!(deep.index(), deep_tree.index());
    assert!(deep.index().samples.iter().all(|s| s.label == "Training"));

    // Shards hold classes mixed (pack-time shuffle).
    let src = ShardSource::open(Arc::new(LocalShardStore::new(&packed)), 0).unwrap();
    let mixed = src
        .shard_layout()
        .unwrap()
        .iter()
        .filter(|m| {
            let c0 = local.index().samples[m[0]].class_index;
            m.iter()
                .any(|&p| local.index().samples[p].class_index != c0)
        })
        .count();
    assert!(mixed >= 4, "only {mixed} shards mix classes");
}

/// Python's `tarfile` (what WebDataset builds on) reads every shard: members `<key>.tiff`
/// hold the original files' bytes at the index's offsets, `<key>.json` the metadata.
#[test]
fn python_tarfile_reads_the_shards() {
    let dir = tempfile::tempdir().unwrap();
    let tree = synth(dir.path(), 3, 5);
    let packed = dir.path().join("packed");
    let local = LocalSource::open(&tree, 0).unwrap();
    pack_quiet(&local, &opts(&packed, 1 << 30, 4)).unwrap();
    let out = run_python(
        r#"
import sys, json, tarfile, hashlib, os, zlib
root = sys.argv[1]
index = json.load(open(os.path.join(root, "shard-index.json")))
seen = 0
for k, shard in enumerate(index["shards"]):
    path = os.path.join(root, shard["file"])
    data = open(path, "rb").read()
    assert hashlib.sha256(data).hexdigest() == shard["sha256"], shard["file"]
    assert len(data) == shard["bytes"]
    with tarfile.open(path) as tf:
        members = tf.getmembers()
        assert len(members) == 2 * shard["samples"], (len(members), shard)
        for m in members:
            key, ext = m.name.split(".", 1)
            body = tf.extractfile(m).read()
            if ext == "tiff":
                s = index["samples"][int(key)]
                assert s["key"] == key and s["shard"] == k and s["offset"] == m.offset_data, (s, m.offset_data)
                original = open(os.path.join(index["root"], s["path"]), "rb").read()
                assert body == original, m.name
                assert zlib.crc32(body) == s["crc32"]
                seen += 1
            else:
                meta = json.loads(body)
                s = index["samples"][meta["position"]]
                assert meta == {"path": s["path"], "label": s["label"], "class_index": s["class_index"], "position": s["position"]}
print(seen, len(index["shards"]))
"#,
        &[packed.to_str().unwrap()],
    );
    assert_eq!(out.trim(), "15 4");
}

/// Fails reading sample number `fail_at` (in pack order), like a crash mid-pack.
struct Failing {
    inner: LocalSource,
    reads: AtomicUsize,
    fail_at: usize,
}

impl ImageSource for Failing {
    fn index(&self) -> &DatasetIndex {
        self.inner.index()
    }
    fn read_bytes(&self, i: usize) -> Result<Vec<u8>, DataError> {
        if self.reads.fetch_add(1, Ordering::SeqCst) == self.fail_at {
            return Err(DataError::InvalidArgument("simulated crash".into()));
        }
        self.inner.read_bytes(i)
    }
    fn describe(&self) -> String {
        "failing".into()
    }
}

#[test]
fn pack_resumes_verifies_and_refuses_other_settings() {
    let dir = tempfile::tempdir().unwrap();
    let tree = synth(dir.path(), 2, 10);
    let local = LocalSource::open(&tree, 0).unwrap();
    let reference = dir.path().join("reference");
    let o = opts(&reference, 1 << 30, 3);
    pack_quiet(&local, &o).unwrap();
    let want = read_dir_bytes(&reference);
    assert_eq!(want.len(), 7 + 1, "7 shards of <= 3 samples + the index");

    // Idempotent: a rerun verifies everything, writes nothing, changes no byte.
    let mut events = Vec::new();
    let s = pack(&local, 0, &o, &mut |e| events.push(e)).unwrap();
    assert_eq!(
        (s.written_shards, s.verified_shards, s.written_samples),
        (0, 7, 0)
    );
    assert!(events
        .iter()
        .all(|e| matches!(e, PackEvent::Verified { .. })));
    assert_eq!(read_dir_bytes(&reference), want);

    // Crash after 2 complete shards: the journal records them; the rerun keeps them.
    let out = dir.path().join("resumed");
    let failing = Failing {
        inner: local.clone(),
        reads: AtomicUsize::new(0),
        fail_at: 7,
    };
    let err = pack_quiet(&failing, &opts(&out, 1 << 30, 3)).unwrap_err();
    assert!(err.to_string().contains("simulated crash"));
    assert!(out.join(JOURNAL_FILE).exists() && !out.join(INDEX_FILE).exists());
    let s = pack_quiet(&local, &opts(&out, 1 << 30, 3)).unwrap();
    assert_eq!((s.verified_shards, s.written_shards), (2, 5));
    assert_eq!(s.written_samples, 20 - 6);
    let mut got = read_dir_bytes(&out);
    got.retain(|(n, _)| !n.starts_with('.'));
    assert_eq!(got, want, "resumed pack identical to an uninterrupted one");

    // A damaged shard is detected and it and the ones after it are rewritten.
    let victim = out.join("shard-000004.tar");
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[700] ^= 0xFF;
    std::fs::write(&victim, bytes).unwrap();
    let mut damaged = Vec::new();
    let s = pack(&local, 0, &opts(&out, 1 << 30, 3), &mut |e| {
        if let PackEvent::Damaged { shard, .. } = e {
            damaged.push(shard)
        }
    })
    .unwrap();
    assert_eq!(damaged, vec![4]);
    assert_eq!((s.verified_shards, s.written_shards), (4, 3));
    let mut got = read_dir_bytes(&out);
    got.retain(|(n, _)| !n.starts_with('.'));
    assert_eq!(got, want);

    // Other settings into the same directory: refused, nothing touched.
    let err = pack_quiet(&local, &opts(&out, 1 << 30, 4)).unwrap_err();
    assert!(err.to_string().contains("other settings"), "{err}");
    let mut got = read_dir_bytes(&out);
    got.retain(|(n, _)| !n.starts_with('.'));
    assert_eq!(got, want);
}

#[test]
fn corrupt_member_is_an_error_naming_shard_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let tree = synth(dir.path(), 2, 4);
    let packed = dir.path().join("packed");
    let local = LocalSource::open(&tree, 0).unwrap();
    pack_quiet(&local, &opts(&packed, 1 << 30, 0)).unwrap();
    let index: ShardIndexFile =
        serde_json::from_slice(&std::fs::read(packed.join(INDEX_FILE)).unwrap()).unwrap();
    let s = &index.samples[5];
    let shard = packed.join(&index.shards[s.shard].file);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[(s.offset + s.length / 2) as usize] ^= 0x55;
    std::fs::write(&shard, bytes).unwrap();
    let src = ShardSource::open(Arc::new(LocalShardStore::new(&packed)), 0).unwrap();
    let err = src.read(5).unwrap_err().to_string();
    assert!(
        err.contains("shard-000000.tar") && err.contains(&s.key),
        "{err}"
    );
    assert!(err.contains("CRC-32"), "{err}");
    // Other samples are unaffected.
    assert_eq!(src.read_bytes(4).unwrap(), local.read_bytes(4).unwrap());
    // A truncated shard: an I/O error naming the file.
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let src = ShardSource::open(Arc::new(LocalShardStore::new(&packed)), 0).unwrap();
    let last = (0..8).max_by_key(|&i| index.samples[i].offset).unwrap();
    let err = src.read_bytes(last).unwrap_err().to_string();
    assert!(err.contains("shard-000000.tar"), "{err}");
    // A broken index is an error naming it.
    std::fs::write(packed.join(INDEX_FILE), b"{\"format\": 1}").unwrap();
    let err = open_source(&data_section(&packed, DataFormat::Auto, 0))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains(INDEX_FILE), "{err}");
}

/// Training (exact order) and features from the shards equal those from the tree, bit for bit.
#[test]
fn training_and_features_from_shards_equal_the_folder() {
    let _rng = super::util::torch_rng_lock();
    use trainer::analysis::features;
    use trainer::data::mean_std;
    use trainer::train::run::{model_dir, train, TrainOptions};
    tch::set_num_threads(2);
    let dir = tempfile::tempdir().unwrap();
    let tree = synth(dir.path(), 3, 9);
    let packed = dir.path().join("packed");
    pack_quiet(
        &LocalSource::open(&tree, 0).unwrap(),
        &opts(&packed, 1 << 30, 5),
    )
    .unwrap();
    let cfg_for = |name: &str, data: &Path| {
        let yaml = format!(
            "run:\n  name: {name}\n  output_dir: {out}\n  seed: 5\ndata:\n  dataset_dir: {data}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"24\"]\n  num_workers: 2\nmodel:\n  arch: vit_tiny\n  out_dim: 64\ntrain:\n  epochs: 1\n  batch_size_per_gpu: 4\n  warmup_epochs: 0\n  precision: fp32\n  lr: 0.05\naugment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\ndownstream:\n  features:\n    resize_length: 48\n    batch_size_per_gpu: 4\n",
            out = dir.path().join("out").display(),
            data = data.display()
        );
        Config::from_yaml(&yaml, "test").unwrap()
    };
    let mut results = Vec::new();
    for (name, data) in [("folder", &tree), ("shards", &packed)] {
        let cfg = cfg_for(name, data);
        train(
            &cfg,
            &TrainOptions {
                max_steps: Some(2),
                ..TrainOptions::default()
            },
        )
        .unwrap();
        let ckpt = model_dir(&cfg, &[2, 4]).join("checkpoint.safetensors");
        let ms =
            mean_std::MeanStd::read(&cfg.run_dir().join("mean_and_std_of_dataset.txt")).unwrap();
        let mut tensors = tch::Tensor::read_safetensors(&ckpt).unwrap();
        tensors.sort_by(|x, y| x.0.cmp(&y.0));
        let set = features::extract(&cfg, 0, &ckpt, &ms).unwrap();
        results.push((ms, tensors, set));
    }
    let (a, b) = (&results[0], &results[1]);
    assert_eq!(a.0, b.0, "mean/std");
    assert_eq!(a.1.len(), b.1.len());
    for ((na, ta), (nb, tb)) in a.1.iter().zip(&b.1) {
        assert_eq!(na, nb);
        assert!(ta.equal(tb), "checkpoint tensor {na} differs");
    }
    assert_eq!(a.2.labels, b.2.labels);
    assert_eq!(a.2.paths, b.2.paths);
    assert_eq!(a.2.indices, b.2.indices);
    assert!(a.2.features.equal(&b.2.features), "features differ");
    assert_eq!(a.2.labels.len(), 5);
}

/// What the training loop calls: `exact` is the seeded permutation on any source;
/// `shard_sequential` streams the packed layout, and is refused on loose files.
#[test]
fn configured_order_follows_data_order() {
    use trainer::config::SampleOrder;
    use trainer::data::shards::shard_sequential_order;
    use trainer::train::sampler::{configured_epoch_order, epoch_order};
    let dir = tempfile::tempdir().unwrap();
    let tree = synth(dir.path(), 3, 10);
    let packed = dir.path().join("packed");
    let local = LocalSource::open(&tree, 0).unwrap();
    pack_quiet(&local, &opts(&packed, 1 << 30, 4)).unwrap();
    let shards = open_source(&data_section(&packed, DataFormat::Auto, 0)).unwrap();
    let train = train_heldout_split(30, 0.8, 40).unwrap().train;
    let mut data = data_section(&packed, DataFormat::Auto, 0);
    data.shuffle_buffer = 3;
    for (rank, world) in [(0, 1), (1, 2)] {
        let exact = configured_epoch_order(&data, shards.as_ref(), &train, 9, 2, rank, world);
        assert_eq!(exact.unwrap(), epoch_order(&train, 9, 2, rank, world));
        data.order = SampleOrder::ShardSequential;
        let seq =
            configured_epoch_order(&data, shards.as_ref(), &train, 9, 2, rank, world).unwrap();
        let layout = shards.shard_layout().unwrap();
        assert_eq!(
            seq,
            shard_sequential_order(layout, &train, 3, 9, 2, rank, world)
        );
        assert_ne!(seq, epoch_order(&train, 9, 2, rank, world));
        let err = configured_epoch_order(&data, &local, &train, 9, 2, rank, world)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("data.order") && err.contains("trainer data pack"),
            "{err}"
        );
        data.order = SampleOrder::Exact;
    }
}

/// `data.cache` with a local / FSx dataset: the first pass copies every image (or whole shard)
/// into the cache; afterwards the original can vanish and every read still succeeds, with the
/// same bytes, from the cache.
#[test]
fn fsx_folder_and_shards_are_served_from_the_node_local_cache() {
    use trainer::data::cache::NodeCache;
    use trainer::data::shards::{CachedShardStore, LocalShardStore};
    let dir = tempfile::tempdir().unwrap();
    let fsx = dir.path().join("fsx");
    let tree = synth(&fsx, 2, 6);
    let reference = LocalSource::open(&tree, 0).unwrap();
    let want: Vec<Vec<u8>> = (0..reference.index().len())
        .map(|i| reference.read_bytes(i).unwrap())
        .collect();
    let packed = dir.path().join("fsx-packed");
    pack_quiet(&reference, &opts(&packed, 4 << 10, 0)).unwrap();
    let nvme = dir.path().join("nvme");

    // The folder, through open_source with data.cache.
    let mut data = data_section(&tree, DataFormat::Auto, 0);
    data.cache.dir = Some(nvme.clone());
    let src = open_source(&data).unwrap();
    assert!(
        src.describe().contains("node-local cache"),
        "{}",
        src.describe()
    );
    assert_eq!(src.index(), reference.index());
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&src.read_bytes(i).unwrap(), w, "{i}");
        assert_eq!(src.read(i).unwrap(), reference.read(i).unwrap(), "{i}");
    }
    // The shards, whole, through the same cache.
    let cache = NodeCache::open(&nvme, &nvme.join("packed-copy"), 1 << 30, 1).unwrap();
    let store =
        Arc::new(CachedShardStore::open(Arc::new(LocalShardStore::new(&packed)), cache).unwrap());
    let shards = ShardSource::open(store.clone(), 0).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&shards.read_bytes(i).unwrap(), w, "{i}");
    }
    store.wait_for_downloads();
    let (_, direct_reads) = store.reads();

    // The shared file system goes away: everything still reads, from the cache.
    std::fs::rename(&fsx, dir.path().join("gone")).unwrap();
    std::fs::rename(&packed, dir.path().join("gone-packed")).unwrap();
    assert!(reference.read_bytes(0).is_err());
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&src.read_bytes(i).unwrap(), w, "{i}");
        assert_eq!(&shards.read_bytes(i).unwrap(), w, "{i}");
    }
    let report = src.report().unwrap();
    assert!(
        report.contains(&format!("{} hits", 2 * want.len())),
        "{report}"
    );
    assert!(store.reads().0 >= want.len() as u64);
    assert_eq!(store.reads().1, direct_reads, "a read went past the cache");
}
