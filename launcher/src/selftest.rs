//! `launcher selftest`: one job that runs `trainer selftest` on every task of an allocation
//! (the nodes and tasks training would use), through the same script renderer as training
//! (srun, Pyxis, env, rendezvous). Every task prints its table and its JSON report (as
//! `scdino_base::report` lines, which survive the tasks' output being interleaved); the
//! launcher reads them all back from the job's log and reports one table, check by check.
use crate::cluster::Cluster;
use crate::render::{Allocation, Rendered};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

pub const JOB_NAME: &str = "selftest";
/// The `kind` field of the trainer's report (`trainer::selftest::REPORT_KIND`).
pub const REPORT_KIND: &str = "scdino.selftest";

#[derive(Debug, Clone, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: String,
    pub detail: String,
}

/// One task's report.
#[derive(Debug, Clone, Deserialize)]
pub struct Report {
    pub kind: String,
    pub host: String,
    pub rank: usize,
    pub world: usize,
    pub checks: Vec<Check>,
    pub passed: bool,
}

/// The selftest script and a one-job manifest (`launcher status/cancel --out` work on it).
pub fn render(
    cluster: &Cluster,
    alloc: Allocation,
    out: &Path,
    cwd: &Path,
) -> anyhow::Result<Rendered> {
    let args = [vec![JOB_NAME.to_string()], vec!["--json".to_string()]];
    crate::render::one_job(cluster, JOB_NAME, alloc, &args, out, cwd)
}

/// Every task's report in the log, one per rank (the last one a rank printed).
pub fn find_reports(log: &str) -> BTreeMap<usize, Report> {
    scdino_base::report::decode(log, REPORT_KIND)
        .into_values()
        .filter_map(|text| serde_json::from_str::<Report>(&text).ok())
        .filter(|r| r.kind == REPORT_KIND)
        .map(|r| (r.rank, r))
        .collect()
}

/// Why the allocation fails the selftest (empty: it passes): a task that did not report, and
/// every failed check with its rank, host and reason.
pub fn judge(reports: &BTreeMap<usize, Report>, world: usize) -> Vec<String> {
    let mut why = Vec::new();
    let missing: Vec<String> = (0..world)
        .filter(|r| !reports.contains_key(r))
        .map(|r| r.to_string())
        .collect();
    if !missing.is_empty() {
        why.push(format!(
            "no report from rank(s) {} of {world}",
            missing.join(", ")
        ));
    }
    for r in reports.values() {
        for c in r.checks.iter().filter(|c| c.status == "fail") {
            why.push(format!(
                "rank {} on {}: {}: {}",
                r.rank, r.host, c.name, c.detail
            ));
        }
        if !r.passed && r.checks.iter().all(|c| c.status != "fail") {
            why.push(format!("rank {} on {} reported a failure", r.rank, r.host));
        }
    }
    why
}

/// One line per check: the status on every rank, and the detail of rank 0 (or of the first
/// rank that failed it).
pub fn table(reports: &BTreeMap<usize, Report>) -> String {
    let Some(first) = reports.values().next() else {
        return String::new();
    };
    let width = first.checks.iter().map(|c| c.name.len()).max().unwrap_or(5);
    let mut o = format!(
        "{:<width$}  {:<w2$}  detail (rank 0, or the first failure)\n",
        "check",
        "status by rank",
        w2 = 5 * reports.len().max(3)
    );
    for (i, c) in first.checks.iter().enumerate() {
        let statuses: Vec<&str> = reports
            .values()
            .map(|r| r.checks.get(i).map_or("?", |c| c.status.as_str()))
            .collect();
        let detail = reports
            .values()
            .filter_map(|r| r.checks.get(i))
            .find(|c| c.status == "fail")
            .unwrap_or(c);
        o.push_str(&format!(
            "{:<width$}  {:<w2$}  {}\n",
            c.name,
            statuses.join(" "),
            detail.detail,
            w2 = 5 * reports.len().max(3)
        ));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANK1: &str = r#"{"kind":"scdino.selftest","host":"n1","rank":1,"local_rank":1,"world":2,"checks":[{"name":"cuda","status":"skip","detail":"no CUDA device visible (a CPU node)"},{"name":"all-reduce","status":"fail","detail":"Gloo over 2 ranks, 1048576 float32 elements, 3 wrong"}],"passed":false}"#;
    const RANK0: &str = r#"{"kind":"scdino.selftest","host":"n1","rank":0,"local_rank":0,"world":2,"checks":[{"name":"cuda","status":"skip","detail":"no CUDA device visible (a CPU node)"},{"name":"all-reduce","status":"pass","detail":"Gloo over 2 ranks, 1048576 float32 elements, 0 wrong"}],"passed":true}"#;

    /// A job log as two tasks write it: their report lines interleaved with each other and
    /// with other output.
    fn log() -> String {
        use scdino_base::report::encode;
        let (r1, r0) = (encode(REPORT_KIND, 1, RANK1), encode(REPORT_KIND, 0, RANK0));
        let mut lines = vec![
            "[launcher] selftest job 9 restart 0 on n1, master n1:61009".to_string(),
            "# selftest on n1 (rank 1/2, local rank 1)".to_string(),
        ];
        for i in 0..r1.len().max(r0.len()) {
            lines.extend(r1.get(i).cloned());
            lines.push("# selftest on n1 (rank 0/2, local rank 0)".into());
            lines.extend(r0.get(i).cloned());
        }
        lines.extend(encode("scdino.collectives_bench", 0, r#"{"world":2}"#));
        lines.join("\n")
    }

    #[test]
    fn reports_of_every_rank_are_read_and_failures_named() {
        let r = find_reports(&log());
        assert_eq!(r.len(), 2);
        let why = judge(&r, 2);
        assert_eq!(
            why,
            ["rank 1 on n1: all-reduce: Gloo over 2 ranks, 1048576 float32 elements, 3 wrong"]
        );
        let why = judge(&r, 3);
        assert!(why[0].contains("no report from rank(s) 2 of 3"), "{why:?}");
        let t = table(&r);
        assert!(t.contains("all-reduce"), "{t}");
        assert!(t.contains("pass fail"), "{t}");
        assert!(t.contains("3 wrong"), "{t}");
    }
}
