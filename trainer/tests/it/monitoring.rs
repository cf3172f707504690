//! Monitoring output (`trainer::monitoring`): TensorBoard event files read back by the `tensorboard`
//! package (with its CRC checks), and Prometheus textfiles parsed by
//! `prometheus_client`'s parser.
use super::util::run_python;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use trainer::monitoring::{
    crc32c, masked_crc32c, Metric, MetricKind, MetricsError, PromTextfile, TensorBoardWriter,
};

/// Reads an event file with TensorBoard's own record reader (which raises on
/// any CRC mismatch), re-checks the framing and CRCs independently, and prints
/// every Event with floats as bit patterns so the comparison is exact.
const READ_EVENTS: &str = r#"
import sys, json, struct
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow as pw, errors
from tensorboard.compat.proto import event_pb2
path = sys.argv[1]
fbits = lambda v: struct.unpack('<I', struct.pack('<f', v))[0]
dbits = lambda v: struct.unpack('<Q', struct.pack('<d', v))[0]
r = pw.PyRecordReader_New(path.encode(), 0, None, None)
records = []
while True:
    try:
        r.GetNext()
    except errors.OutOfRangeError:
        break
    records.append(r.record())
data = open(path, 'rb').read()
off = n = 0
while off < len(data):
    (ln,) = struct.unpack_from('<Q', data, off)
    assert struct.unpack_from('<I', data, off + 8)[0] == pw.masked_crc32c(data[off:off + 8]), 'length crc'
    body = data[off + 12:off + 12 + ln]
    assert struct.unpack_from('<I', data, off + 12 + ln)[0] == pw.masked_crc32c(body), 'data crc'
    assert body == records[n]
    off += 16 + ln
    n += 1
assert off == len(data) and n == len(records), (off, len(data), n, len(records))
out = []
for rec in records:
    ev = event_pb2.Event.FromString(rec)
    out.append({
        'what': ev.WhichOneof('what'),
        'file_version': ev.file_version,
        'step': ev.step,
        'wall': dbits(ev.wall_time),
        'values': [[v.tag, fbits(v.simple_value), v.WhichOneof('value')] for v in ev.summary.value],
    })
print(json.dumps(out))
"#;

/// What TensorBoard's UI backend sees: scalars per tag via EventAccumulator.
const ACCUMULATE: &str = r#"
import sys, json, struct
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
fbits = lambda v: struct.unpack('<I', struct.pack('<f', v))[0]
dbits = lambda v: struct.unpack('<Q', struct.pack('<d', v))[0]
ea = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0})
ea.Reload()
print(json.dumps({t: [[s.step, dbits(s.wall_time), fbits(s.value)] for s in ea.Scalars(t)]
                  for t in ea.Tags()['scalars']}))
"#;

/// TensorBoard's tolerant loader (the one the UI polls with), per file.
const LOAD_EVENTS: &str = r#"
import sys, json
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
print(json.dumps([[[e.WhichOneof('what'), e.step] for e in EventFileLoader(p).Load()]
                  for p in sys.argv[1:]]))
"#;

/// Parses a textfile strictly with prometheus_client; values as f64 bits.
const PARSE_PROM: &str = r#"
import sys, json, struct
from prometheus_client.parser import text_string_to_metric_families
dbits = lambda v: struct.unpack('<Q', struct.pack('<d', v))[0]
text = open(sys.argv[1], encoding='utf-8').read()
print(json.dumps([{'name': f.name, 'type': f.type, 'help': f.documentation,
                   'samples': [[s.name, s.labels, dbits(s.value)] for s in f.samples]}
                  for f in text_string_to_metric_families(text)]))
"#;

/// One written event: step, wall time, (tag, value) pairs.
type Expected = (i64, f64, Vec<(String, f32)>);

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("bad JSON from python ({e}): {s}"))
}

fn event_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[test]
fn crc32c_matches_the_standard_vector_and_tensorboard() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    let inputs: [&[u8]; 4] = [b"", b"123456789", &[0u8; 8], b"brain.Event:2"];
    let hex: Vec<String> = inputs
        .iter()
        .map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
        .collect();
    let args: Vec<&str> = hex.iter().map(String::as_str).collect();
    let out = run_python(
        "import sys\n\
         from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c, crc32c\n\
         for h in sys.argv[1:]:\n    b = bytes.fromhex(h); print(crc32c(b), masked_crc32c(b))",
        &args,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), inputs.len());
    for (input, line) in inputs.iter().zip(lines) {
        let want: Vec<u32> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        assert_eq!([crc32c(input), masked_crc32c(input)], want[..], "{input:?}");
    }
}

#[test]
fn tensorboard_reads_back_tags_steps_values_and_wall_times_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("runs/exp1");
    let mut w = TensorBoardWriter::create(&dir).unwrap();
    assert_eq!(event_files(&dir), [w.path().to_owned()]);
    let name = w.path().file_name().unwrap().to_str().unwrap().to_owned();
    let pid = std::process::id();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    assert!(
        name.rsplit('.').nth(1) == Some(&pid.to_string()),
        "pid missing in {name}"
    );
    let secs: u64 = name.split('.').nth(3).unwrap().parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(secs <= now && now - secs < 60, "{secs} vs {now}");

    // Zero must survive (simple_value is in a oneof: absent would drop it),
    // as must -0, non-finite values, subnormals and extremes.
    let values = [
        1.0f32,
        0.0,
        -0.0,
        0.1,
        -3.25e-3,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        std::f32::consts::PI,
    ];
    let t0 = 1_700_000_000.123_456_7f64;
    let mut expected: Vec<Expected> = Vec::new();
    for (i, &v) in values.iter().enumerate() {
        let step = i as i64 * 1000 + (1 << 40);
        let wall = t0 + i as f64 * 0.317;
        let pairs = [("train/loss", v), ("train/lr ü", v * 0.5)];
        w.add_scalars_at(step, wall, &pairs).unwrap();
        expected.push((
            step,
            wall,
            pairs.iter().map(|(t, v)| (t.to_string(), *v)).collect(),
        ));
    }
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let last_step = (1i64 << 40) + 1_000_000;
    w.add_scalar("epoch/knn_top1", 0.875, last_step).unwrap();
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // Nothing empty is recorded.
    w.add_scalars(last_step, &[]).unwrap();
    w.flush().unwrap();

    let events = json(&run_python(READ_EVENTS, &[w.path().to_str().unwrap()]));
    let events = events.as_array().unwrap();
    assert_eq!(events.len(), 1 + values.len() + 1);
    assert_eq!(events[0]["what"], "file_version");
    assert_eq!(events[0]["file_version"], "brain.Event:2");
    for (ev, (step, wall, pairs)) in events[1..].iter().zip(&expected) {
        assert_eq!(ev["what"], "summary");
        assert_eq!(ev["step"].as_i64().unwrap(), *step);
        assert_eq!(ev["wall"].as_u64().unwrap(), wall.to_bits());
        let got = ev["values"].as_array().unwrap();
        assert_eq!(got.len(), pairs.len());
        for (g, (tag, v)) in got.iter().zip(pairs) {
            assert_eq!(g[0].as_str().unwrap(), tag);
            assert_eq!(g[2], "simple_value", "{tag} = {v} lost its value");
            let bits = g[1].as_u64().unwrap() as u32;
            if v.is_nan() {
                assert!(f32::from_bits(bits).is_nan());
            } else {
                assert_eq!(bits, v.to_bits(), "{tag}: {} vs {v}", f32::from_bits(bits));
            }
        }
    }
    let last = &events[events.len() - 1];
    assert_eq!(last["step"].as_i64().unwrap(), last_step);
    assert_eq!(last["values"][0][0], "epoch/knn_top1");
    assert_eq!(
        last["values"][0][1].as_u64().unwrap() as u32,
        0.875f32.to_bits()
    );
    let wall = f64::from_bits(last["wall"].as_u64().unwrap());
    assert!(
        (before..=after).contains(&wall),
        "{before} <= {wall} <= {after}"
    );

    // The TensorBoard backend sees the same scalars, tag by tag.
    let acc = json(&run_python(ACCUMULATE, &[dir.to_str().unwrap()]));
    let acc = acc.as_object().unwrap();
    let mut tags: Vec<&str> = acc.keys().map(String::as_str).collect();
    tags.sort();
    assert_eq!(tags, ["epoch/knn_top1", "train/loss", "train/lr ü"]);
    let loss = acc["train/loss"].as_array().unwrap();
    assert_eq!(loss.len(), values.len());
    for (s, (step, wall, pairs)) in loss.iter().zip(&expected) {
        assert_eq!(s[0].as_i64().unwrap(), *step);
        assert_eq!(s[1].as_u64().unwrap(), wall.to_bits());
        let v = f32::from_bits(s[2].as_u64().unwrap() as u32);
        assert!(v.to_bits() == pairs[0].1.to_bits() || (v.is_nan() && pairs[0].1.is_nan()));
    }
}

#[test]
fn tensorboard_negative_and_zero_steps_roundtrip() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = TensorBoardWriter::create(tmp.path()).unwrap();
    for step in [0i64, -1, i64::MIN, i64::MAX, 127, 128] {
        w.add_scalar("s", step as f32, step).unwrap();
    }
    w.flush().unwrap();
    let events = json(&run_python(READ_EVENTS, &[w.path().to_str().unwrap()]));
    let steps: Vec<i64> = events.as_array().unwrap()[1..]
        .iter()
        .map(|e| e["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, [0, -1, i64::MIN, i64::MAX, 127, 128]);
}

#[test]
fn tensorboard_writes_are_buffered_until_flush_or_drop() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = TensorBoardWriter::create(tmp.path()).unwrap();
    let path = w.path().to_owned();
    // The version record is on disk at once, so the run is visible immediately.
    let header = file_len(&path);
    assert!(header > 0);
    w.add_scalar("a", 1.0, 1).unwrap();
    assert_eq!(file_len(&path), header, "scalars should be buffered");
    w.flush().unwrap();
    let one = file_len(&path);
    assert!(one > header);
    w.add_scalar("a", 2.0, 2).unwrap();
    drop(w);
    assert!(file_len(&path) > one, "drop must flush");
    let events = json(&run_python(READ_EVENTS, &[path.to_str().unwrap()]));
    assert_eq!(events.as_array().unwrap().len(), 3);
    // Many scalars flush on their own (bounded memory), in whole records.
    let mut w = TensorBoardWriter::create(tmp.path()).unwrap();
    assert_ne!(w.path(), path, "two writers must not share a file");
    for i in 0..5000 {
        w.add_scalar("train/loss", i as f32, i).unwrap();
    }
    let partial = w.path().to_owned();
    assert!(file_len(&partial) > 64 * 1024);
    let events = json(&run_python(READ_EVENTS, &[partial.to_str().unwrap()]));
    let n = events.as_array().unwrap().len();
    assert!(n > 1 && n < 5001, "{n}");
    drop(w);
    let events = json(&run_python(READ_EVENTS, &[partial.to_str().unwrap()]));
    assert_eq!(events.as_array().unwrap().len(), 5001);
}

#[test]
fn truncated_last_record_leaves_earlier_records_readable() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = TensorBoardWriter::create(&tmp.path().join("run")).unwrap();
    for step in 0..10 {
        w.add_scalars(step, &[("loss", step as f32), ("lr", 0.1)])
            .unwrap();
    }
    w.sync().unwrap();
    let path = w.path().to_owned();
    let boundary = file_len(&path);
    w.add_scalars(10, &[("loss", 10.0), ("lr", 0.1)]).unwrap();
    drop(w);
    let full = std::fs::read(&path).unwrap();
    let last_len = full.len() as u64 - boundary;
    assert!(last_len > 16);

    // Cut inside the length, its CRC, the data and the data CRC of the last record.
    let cuts = [1u64, 8, 11, 12, 20, last_len - 4, last_len - 1];
    let mut files = Vec::new();
    for cut in cuts {
        let p = tmp.path().join(format!("cut{cut}"));
        std::fs::write(&p, &full[..(boundary + cut) as usize]).unwrap();
        files.push(p.to_str().unwrap().to_owned());
    }
    files.push(path.to_str().unwrap().to_owned());
    let args: Vec<&str> = files.iter().map(String::as_str).collect();
    let loaded = json(&run_python(LOAD_EVENTS, &args));
    let loaded = loaded.as_array().unwrap();
    let steps = |i: usize| -> Vec<i64> {
        let evs = loaded[i].as_array().unwrap();
        assert_eq!(evs[0][0], "file_version");
        evs[1..].iter().map(|e| e[1].as_i64().unwrap()).collect()
    };
    for (i, cut) in cuts.iter().enumerate() {
        assert_eq!(steps(i), (0..10).collect::<Vec<_>>(), "cut at +{cut}");
    }
    assert_eq!(steps(cuts.len()), (0..11).collect::<Vec<_>>());
}

#[test]
fn tensorboard_create_reports_the_path_on_error() {
    let tmp = tempfile::tempdir().unwrap();
    let blocker = tmp.path().join("not_a_dir");
    std::fs::write(&blocker, b"x").unwrap();
    let err = TensorBoardWriter::create(&blocker.join("run")).unwrap_err();
    assert!(matches!(err, MetricsError::Io { .. }));
    assert!(err.to_string().contains(blocker.to_str().unwrap()), "{err}");
}

fn training_metrics(step: f64) -> Vec<Metric> {
    let run = "exp \"α\" \\ 2\nretry";
    vec![
        Metric::gauge("scdino_loss", "DINO loss.\nLast \\ step \"mean\".", 1.25)
            .label("run", run)
            .label("rank", "0"),
        Metric::counter("scdino_steps_total", "Optimizer steps.", step).label("run", run),
        Metric::gauge("scdino_lr", "", f64::NAN).label("run", run),
        // Interleaved with other families: must still be written contiguously.
        Metric::gauge("scdino_loss", "DINO loss.\nLast \\ step \"mean\".", -2.5e-7)
            .label("run", run)
            .label("rank", "1"),
        Metric::gauge("scdino:grad_norm", "Clipped.", f64::INFINITY),
        Metric::gauge("scdino_min", "", f64::NEG_INFINITY),
        Metric::gauge("scdino_big", "", 1e300).label("empty", ""),
    ]
}

#[test]
fn prometheus_textfile_parses_with_prometheus_client() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("scdino.prom");
    let prom = PromTextfile::new(&path);
    let metrics = training_metrics(4096.0);
    prom.write(&metrics).unwrap();

    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, prom.render(&metrics).unwrap());
    for family in [
        "scdino_loss",
        "scdino_steps_total",
        "scdino_lr",
        "scdino:grad_norm",
    ] {
        assert_eq!(
            text.matches(&format!("# TYPE {family} ")).count(),
            1,
            "{text}"
        );
    }
    assert_eq!(text.matches("# HELP scdino_loss ").count(), 1);
    assert!(text.contains(" NaN\n") && text.contains(" +Inf\n") && text.contains(" -Inf\n"));

    let parsed = json(&run_python(PARSE_PROM, &[path.to_str().unwrap()]));
    let fams = parsed.as_array().unwrap();
    let names: Vec<&str> = fams.iter().map(|f| f["name"].as_str().unwrap()).collect();
    // prometheus_client names a counter family without its `_total` suffix.
    assert_eq!(
        names,
        [
            "scdino_loss",
            "scdino_steps",
            "scdino_lr",
            "scdino:grad_norm",
            "scdino_min",
            "scdino_big"
        ]
    );
    let types: Vec<&str> = fams.iter().map(|f| f["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["gauge", "counter", "gauge", "gauge", "gauge", "gauge"]
    );
    assert_eq!(fams[0]["help"], "DINO loss.\nLast \\ step \"mean\".");

    // Every sample comes back with its labels (unescaped) and exact value.
    let samples: Vec<&Value> = fams
        .iter()
        .flat_map(|f| f["samples"].as_array().unwrap())
        .collect();
    let mut order = vec![0, 3, 1, 2, 4, 5, 6]; // metrics index per sample, family-grouped
    assert_eq!(samples.len(), metrics.len());
    for (s, i) in samples.iter().zip(order.drain(..)) {
        let m = &metrics[i];
        assert_eq!(s[0].as_str().unwrap(), m.name);
        let labels = s[1].as_object().unwrap();
        assert_eq!(labels.len(), m.labels.len(), "{s}");
        for (k, v) in &m.labels {
            assert_eq!(labels[k].as_str().unwrap(), v, "label {k} of {}", m.name);
        }
        let got = f64::from_bits(s[2].as_u64().unwrap());
        assert!(
            got.to_bits() == m.value.to_bits() || (got.is_nan() && m.value.is_nan()),
            "{}: {got} vs {}",
            m.name,
            m.value
        );
    }
}

#[test]
fn prometheus_rejects_invalid_metrics_and_keeps_the_old_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("scdino.prom");
    let prom = PromTextfile::new(&path);
    prom.write(&training_metrics(1.0)).unwrap();
    let good = std::fs::read_to_string(&path).unwrap();

    let bad: Vec<(Vec<Metric>, &str)> = vec![
        (vec![Metric::gauge("scdino-loss", "", 1.0)], "scdino-loss"),
        (vec![Metric::gauge("1loss", "", 1.0)], "1loss"),
        (vec![Metric::gauge("", "", 1.0)], "``"),
        (
            vec![Metric::gauge("loss", "", 1.0).label("ra nk", "0")],
            "ra nk",
        ),
        (
            vec![Metric::gauge("loss", "", 1.0).label("__name__", "x")],
            "__name__",
        ),
        (
            vec![Metric::gauge("loss", "", 1.0)
                .label("rank", "0")
                .label("rank", "1")],
            "twice",
        ),
        (
            vec![
                Metric::gauge("loss", "", 1.0),
                Metric::counter("loss", "", 1.0),
            ],
            "TYPE",
        ),
        (
            vec![
                Metric::gauge("loss", "a", 1.0).label("rank", "0"),
                Metric::gauge("loss", "b", 1.0).label("rank", "1"),
            ],
            "HELP",
        ),
        (
            vec![
                Metric::gauge("loss", "", 1.0)
                    .label("run", "r")
                    .label("rank", "0"),
                Metric::gauge("loss", "", 2.0)
                    .label("rank", "0")
                    .label("run", "r"),
            ],
            "duplicate",
        ),
    ];
    for (metrics, why) in bad {
        let err = prom.write(&metrics).unwrap_err();
        assert!(
            matches!(err, MetricsError::InvalidMetric { .. }),
            "{why}: {err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(path.to_str().unwrap()), "{msg}");
        assert!(msg.contains(why), "expected `{why}` in: {msg}");
    }
    assert_eq!(std::fs::read_to_string(&path).unwrap(), good);
    let entries: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(entries.len(), 1, "temp files left behind");

    // An unwritable target: the error names it and no temp file remains.
    let missing = tmp.path().join("no/such/dir/x.prom");
    let err = PromTextfile::new(&missing)
        .write(&training_metrics(1.0))
        .unwrap_err();
    assert!(err.to_string().contains("no/such/dir"), "{err}");
    let target_dir = tmp.path().join("target_is_dir.prom");
    std::fs::create_dir(&target_dir).unwrap();
    std::fs::write(target_dir.join("keep"), b"x").unwrap();
    let err = PromTextfile::new(&target_dir)
        .write(&training_metrics(1.0))
        .unwrap_err();
    assert!(err.to_string().contains("target_is_dir.prom"), "{err}");
    let mut left: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["scdino.prom", "target_is_dir.prom"]);
}

/// A generation of the textfile whose completeness a reader can check without
/// a full parser: a header sample announcing the filler count, the fillers,
/// and an end marker.
fn generation(g: usize) -> Vec<Metric> {
    let n = if g.is_multiple_of(2) { 2000 } else { 1 };
    let mut v = vec![Metric::gauge("test_fillers", "Filler count.", n as f64)];
    for i in 0..n {
        v.push(
            Metric::gauge("test_filler", "Padding to make writes slow.", i as f64)
                .label("i", i.to_string())
                .label(
                    "run",
                    "atomic \"run\"\nwith a long label value to take space",
                ),
        );
    }
    v.push(Metric::counter("test_end_total", "Generation.", g as f64));
    v
}

fn check_complete(text: &str) -> Result<usize, String> {
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let first = samples.first().ok_or("empty file")?;
    let n: usize = first
        .strip_prefix("test_fillers ")
        .ok_or_else(|| format!("bad first sample {first:?}"))?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let fillers = samples
        .iter()
        .filter(|l| l.starts_with("test_filler{"))
        .count();
    if fillers != n {
        return Err(format!("{fillers} of {n} fillers"));
    }
    let last = samples.last().unwrap();
    if !text.ends_with('\n') || !last.starts_with("test_end_total ") {
        return Err(format!("truncated: last sample {last:?}"));
    }
    Ok(n)
}

#[test]
fn prometheus_readers_never_see_a_partial_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("scdino.prom");
    let prom = PromTextfile::new(&path);
    prom.write(&generation(1)).unwrap();
    let done = Arc::new(AtomicBool::new(false));

    let reader = {
        let (path, done) = (path.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut reads, mut big) = (0usize, 0usize);
            while !done.load(Ordering::Acquire) {
                let text = std::fs::read_to_string(&path).expect("file must always exist");
                match check_complete(&text) {
                    Ok(n) => big += usize::from(n > 1),
                    Err(e) => panic!("read {reads}: partial file: {e}"),
                }
                reads += 1;
            }
            (reads, big)
        })
    };
    for g in 0..200 {
        prom.write(&generation(g)).unwrap();
    }
    done.store(true, Ordering::Release);
    let (reads, big) = reader.join().expect("reader saw a partial file");
    assert!(
        reads > 20 && big > 0,
        "reader too slow to test: {reads}, {big}"
    );

    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["scdino.prom"], "temp files left behind");
    // The last generation (199, small) parses strictly too.
    let parsed = json(&run_python(PARSE_PROM, &[path.to_str().unwrap()]));
    let fams = parsed.as_array().unwrap();
    assert_eq!(fams.len(), 3);
    assert_eq!(fams[2]["name"], "test_end");
    assert_eq!(fams[2]["type"], "counter");
    assert_eq!(
        f64::from_bits(fams[2]["samples"][0][2].as_u64().unwrap()),
        199.0
    );
    assert_eq!(
        fams[1]["samples"][0][1]["run"],
        "atomic \"run\"\nwith a long label value to take space"
    );
}

#[test]
fn metric_builders_set_kind_and_labels() {
    let m = Metric::counter("a_total", "h", 3.0)
        .label("run", "r")
        .label("rank", "2");
    assert_eq!(m.kind, MetricKind::Counter);
    assert_eq!(
        m.labels,
        [
            ("run".to_owned(), "r".to_owned()),
            ("rank".to_owned(), "2".to_owned())
        ]
    );
    let text = PromTextfile::new("x.prom").render(&[m]).unwrap();
    assert_eq!(
        text,
        "# HELP a_total h\n# TYPE a_total counter\na_total{run=\"r\",rank=\"2\"} 3\n"
    );
}
