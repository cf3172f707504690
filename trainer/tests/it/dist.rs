//! c10d collectives and DDP gradient averaging between two ranks (threads of this process,
//! each with its own Gloo process group over TCP on 127.0.0.1).
use std::time::Duration;
use tch::{Kind, Tensor};
use trainer::dist::ddp::Ddp;
use trainer::dist::group::{ProcessGroup, ReduceOp};
use trainer::dist::Collective;

fn on_two_ranks<T: Send + 'static>(port: u16, f: fn(ProcessGroup) -> T) -> Vec<T> {
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let g =
                    ProcessGroup::new("127.0.0.1", port, rank, 2, Duration::from_secs(60), false)
                        .unwrap();
                f(g)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1)).unwrap()
}

#[test]
fn collectives_compute_the_right_numbers() {
    let out = on_two_ranks(29701, |mut g| {
        let r = g.rank as f32;
        let mut a = Tensor::from_slice(&[1.0f32 + r, 10.0 * (r + 1.0)]);
        g.all_reduce(std::slice::from_mut(&mut a), ReduceOp::Sum)
            .unwrap();
        let mut m = Tensor::from_slice(&[r, 5.0 - r]);
        g.all_reduce(std::slice::from_mut(&mut m), ReduceOp::Max)
            .unwrap();
        let mut b = Tensor::from_slice(&[r + 7.0]);
        g.broadcast(&mut b, 1).unwrap();
        let mut gathered = Tensor::zeros([4], (Kind::Float, tch::Device::Cpu));
        g.all_gather(&mut gathered, &Tensor::from_slice(&[r, r + 0.5]))
            .unwrap();
        let mut scattered = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        g.reduce_scatter(
            &mut scattered,
            &(Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]) * f64::from(r + 1.0)),
            ReduceOp::Sum,
        )
        .unwrap();
        g.barrier().unwrap();
        (
            g.rank,
            values(&a),
            values(&m),
            values(&b),
            values(&gathered),
            values(&scattered),
        )
    });
    for (rank, a, m, b, gathered, scattered) in out {
        assert_eq!(a, vec![3.0, 30.0]);
        assert_eq!(m, vec![1.0, 5.0]);
        assert_eq!(b, vec![8.0], "broadcast from rank 1");
        assert_eq!(gathered, vec![0.0, 0.5, 1.0, 1.5]);
        // rank r receives shard r of (1·x + 2·x) = 3·x.
        let want = if rank == 0 {
            vec![3.0, 6.0]
        } else {
            vec![9.0, 12.0]
        };
        assert_eq!(scattered, want, "rank {rank}");
    }
}

#[test]
fn ddp_averages_gradients_across_ranks_in_buckets() {
    let out = on_two_ranks(29711, |g| {
        let r = g.rank as f64;
        let mut ddp = Ddp::new(g);
        ddp.bucket_bytes = 16; // force several buckets
        let mut grads = vec![
            Tensor::from_slice(&[1.0f32, 2.0, 3.0]) * (r + 1.0),
            Tensor::new(), // a parameter without gradient is skipped
            Tensor::from_slice(&[10.0f32, -4.0]).reshape([2, 1]) * (1.0 - r),
            Tensor::from_slice(&[r as f32; 5]),
        ];
        ddp.average_gradients(&mut grads).unwrap();
        let mut c = Tensor::from_slice(&[2.0f32 * (r as f32 + 1.0)]);
        ddp.all_reduce_sum(&mut c).unwrap();
        (
            values(&grads[0]),
            grads[1].defined(),
            values(&grads[2]),
            grads[2].size(),
            values(&grads[3]),
            values(&c),
        )
    });
    for (g0, g1_defined, g2, g2_shape, g3, c) in out {
        assert_eq!(g0, vec![1.5, 3.0, 4.5]);
        assert!(!g1_defined);
        assert_eq!(g2, vec![5.0, -2.0]);
        assert_eq!(g2_shape, vec![2, 1]);
        assert_eq!(g3, vec![0.5; 5]);
        assert_eq!(c, vec![6.0]);
    }
}

#[test]
fn rendezvous_without_peers_times_out_with_a_clear_error() {
    let started = std::time::Instant::now();
    let err = ProcessGroup::new("127.0.0.1", 29721, 0, 2, Duration::from_secs(3), false)
        .err()
        .expect("no peer");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(err.to_string().contains("rendezvous of rank 0/2"), "{err}");
}

/// The collectives benchmark on two real ranks: every op at every size, nccl-tests' busbw
/// factors for n = 2, the same verdict on both ranks, and the gate applied to the average.
#[test]
fn collectives_bench_measures_every_op_and_size_on_two_ranks() {
    use trainer::dist::bench::{run, BenchOptions, Op};
    let out = on_two_ranks(29731, |mut g| {
        let opts = |min| BenchOptions {
            ops: Op::ALL.to_vec(),
            sizes: vec![4096, 16384],
            iters: 3,
            warmup: 1,
            min_busbw_gbps: min,
            device: tch::Device::Cpu,
            backend: "gloo".into(),
        };
        let low = run(&mut g, &opts(Some(1e-9))).unwrap();
        let impossible = run(&mut g, &opts(Some(1e9))).unwrap();
        (low, impossible)
    });
    for (low, impossible) in &out {
        assert!(low.passed, "{}", low.table());
        assert_eq!(low.wrong, 0);
        assert_eq!(low.world, 2);
        let ops: Vec<Op> = low.ops.iter().map(|o| o.op).collect();
        assert_eq!(ops, Op::ALL);
        for o in &low.ops {
            let want_factor = if matches!(o.op, Op::AllReduce | Op::Broadcast) {
                1.0
            } else {
                0.5
            };
            assert_eq!(o.bus_factor, want_factor, "{:?}", o.op);
            let sizes: Vec<u64> = o.sizes.iter().map(|s| s.size_bytes).collect();
            assert_eq!(sizes, [4096, 16384]);
            for s in &o.sizes {
                assert_eq!(s.count, s.size_bytes / 4);
                assert!(s.time_us > 0.0 && s.time_us.is_finite(), "{s:?}");
                let algbw = s.size_bytes as f64 / 1e9 / (s.time_us / 1e6);
                assert!((s.algbw_gbps - algbw).abs() <= 1e-9 * algbw, "{s:?}");
                assert!((s.busbw_gbps - algbw * want_factor).abs() <= 1e-9 * algbw);
            }
            let avg = o.sizes.iter().map(|s| s.busbw_gbps).sum::<f64>() / 2.0;
            assert!((o.avg_busbw_gbps - avg).abs() <= 1e-12 * avg.max(1.0));
        }
        assert!(!impossible.passed);
        assert_eq!(impossible.failures.len(), 4, "{:?}", impossible.failures);
        assert_eq!(impossible.wrong, 0);
    }
    // Times are averaged across ranks, so both ranks report the same numbers.
    assert_eq!(out[0].0.ops, out[1].0.ops);
}

/// The correctness column can fail: the closed form accepts the real results of every op and
/// counts exactly the elements that were changed afterwards.
#[test]
fn collectives_bench_check_counts_corrupted_elements() {
    use trainer::dist::bench::{run_checked_once, wrong_elements, Op};
    let out = on_two_ranks(29741, |mut g| {
        let mut counts = Vec::new();
        for op in Op::ALL {
            // 40 B: 10 elements, 5 per rank for the sharded ops.
            let out = run_checked_once(&mut g, op, 40).unwrap();
            let clean = wrong_elements(op, &out, g.rank, g.world);
            let bad = out.copy();
            let _ = bad.narrow(0, 1, 2).fill_(-1.0);
            counts.push((op, clean, wrong_elements(op, &bad, g.rank, g.world)));
        }
        counts
    });
    for counts in out {
        for (op, clean, bad) in counts {
            assert_eq!((clean, bad), (0, 2), "{op:?}");
        }
    }
}
