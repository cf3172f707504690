//! `trainer collectives-bench` on two real processes (`trainer launch`, Gloo on 127.0.0.1):
//! the table, the JSON report, correctness, and the exit code of the gate.
use super::util::{launch, run, text};
use serde_json::Value;

fn bench(port: &str, json: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = launch(
        "2",
        port,
        &[],
        &[
            "collectives-bench",
            "--min-bytes",
            "4K",
            "--max-bytes",
            "64K",
            "--factor",
            "4",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    args.extend_from_slice(extra);
    run("trainer", &args)
}

const OPS: [&str; 4] = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"];

#[test]
fn collectives_bench_two_ranks_table_json_and_gate() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let o = bench("29671", &json, &["--min-busbw", "0.000001"]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{}\n{stdout}\n{stderr}", o.status);
    assert!(stderr.contains("2 ranks (torchrun variables)"), "{stderr}");
    // One table row per op and size, printed once (by rank 0 only).
    for op in OPS {
        for size in ["4096", "16384", "65536"] {
            let rows: Vec<&str> = stdout
                .lines()
                .filter(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.first() == Some(&op) && f.get(1) == Some(&size)
                })
                .collect();
            assert_eq!(rows.len(), 1, "{op} {size}:\n{stdout}");
            let f: Vec<&str> = rows[0].split_whitespace().collect();
            assert_eq!(f[3], "float", "{}", rows[0]);
            assert_eq!(f.last(), Some(&"0"), "#wrong: {}", rows[0]);
        }
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    assert!(stdout.contains(">= 0.000001 GB/s: PASSED"), "{stdout}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["kind"], "scdino.collectives_bench");
    assert_eq!(r["backend"], "gloo");
    assert_eq!(r["world"], 2);
    assert_eq!(r["passed"], true);
    assert_eq!(r["wrong"], 0);
    let ops: Vec<&str> = r["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, OPS);
    for op in r["ops"].as_array().unwrap() {
        let sizes: Vec<u64> = op["sizes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["size_bytes"].as_u64().unwrap())
            .collect();
        assert_eq!(sizes, [4096, 16384, 65536], "{op}");
        for s in op["sizes"].as_array().unwrap() {
            let (alg, bus) = (
                s["algbw_gbps"].as_f64().unwrap(),
                s["busbw_gbps"].as_f64().unwrap(),
            );
            assert!(alg > 0.0, "{s}");
            let factor = op["bus_factor"].as_f64().unwrap();
            assert!((bus - alg * factor).abs() <= 1e-9 * alg, "{s}");
        }
    }

    // An impossible gate: the same measurements, but every rank exits non-zero.
    std::fs::remove_file(&json).unwrap();
    let o = bench(
        "29681",
        &json,
        &["--op", "all_reduce", "--min-busbw", "1e9"],
    );
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(!o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(">= 1000000000 GB/s: FAILED"), "{stdout}");
    assert!(
        stderr.contains("collectives-bench FAILED: all_reduce: average busbw"),
        "{stderr}"
    );
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["passed"], false);
    assert_eq!(r["ops"].as_array().unwrap().len(), 1);
}

/// NCCL where it cannot work is refused before any rendezvous, saying why.
#[test]
fn collectives_bench_refuses_nccl_without_it() {
    let o = run("trainer", &["collectives-bench", "--backend", "nccl"]);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("--features nccl") || err.contains("CUDA is not available"),
        "{err}"
    );
}

/// `scripts/test.sh` builds `trainer-nccl` with `--features nccl` on every run, so the GPU path
/// compiles and links in CI; here it must say clearly why it cannot run (no GPU on CI).
#[test]
fn nccl_build_links_libtorch_cuda_and_fails_cleanly_without_a_gpu() {
    let exe = super::util::bin("trainer-nccl");
    let dynamic = std::process::Command::new("readelf")
        .args(["-d", exe.to_str().unwrap()])
        .output()
        .expect("readelf (binutils) runs");
    let dynamic = text(&dynamic.stdout);
    assert!(
        dynamic.contains("[libtorch_cuda.so]") && dynamic.contains("[libc10_cuda.so]"),
        "the nccl build must link libtorch_cuda (else CUDA is invisible to it):\n{dynamic}"
    );
    let o = run("trainer-nccl", &["collectives-bench", "--backend", "nccl"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("CUDA is not available"),
        "{}",
        text(&o.stderr)
    );
    // auto falls back to Gloo in the same binary: one process is a world of one.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = run(
        "trainer-nccl",
        &[
            "collectives-bench",
            "--op",
            "all_reduce",
            "--min-bytes",
            "4K",
            "--max-bytes",
            "4K",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["backend"], "gloo", "{report}");
}
