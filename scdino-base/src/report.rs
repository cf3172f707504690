//! Machine-readable reports inside job logs. The tasks of a Slurm step share one log, and
//! Slurm forwards each task's output in buffers of about a kilobyte, so one task's long line
//! can be cut by another task's output (seen with two `trainer selftest` tasks on a busy
//! node: a 1 kB JSON report lost). A report is therefore printed as numbered lines far below
//! that size, `@scdino-report KIND RANK I/N CHUNK`, and put back together by its reader.
use std::collections::BTreeMap;

pub const LINE_PREFIX: &str = "@scdino-report";
/// Bytes of report per line (the whole line stays under 512 bytes).
const CHUNK: usize = 400;

/// The lines that carry `text` (one line of JSON: no newline), a report of `kind` (one word)
/// from task `rank`.
pub fn encode(kind: &str, rank: usize, text: &str) -> Vec<String> {
    assert!(!kind.contains(char::is_whitespace) && !text.contains('\n'));
    let mut chunks = Vec::new();
    let mut rest = text;
    while !rest.is_empty() || chunks.is_empty() {
        let mut end = rest.len().min(CHUNK);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        chunks.push(&rest[..end]);
        rest = &rest[end..];
    }
    let n = chunks.len();
    chunks
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{LINE_PREFIX} {kind} {rank} {}/{n} {c}", i + 1))
        .collect()
}

/// Every complete report of `kind` in `log`, by rank: the last one each rank completed. Lines
/// of other tasks between the parts do not matter; a report with a part missing is left out.
pub fn decode(log: &str, kind: &str) -> BTreeMap<usize, String> {
    let mut done = BTreeMap::new();
    let mut partial: BTreeMap<usize, Vec<Option<String>>> = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.trim_start().strip_prefix(LINE_PREFIX) else {
            continue;
        };
        let mut f = rest.trim_start().splitn(4, ' ');
        let (Some(k), Some(rank), Some(part), chunk) = (f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let (Ok(rank), Some((i, n))) = (rank.parse::<usize>(), part.split_once('/')) else {
            continue;
        };
        let (Ok(i), Ok(n)) = (i.parse::<usize>(), n.parse::<usize>()) else {
            continue;
        };
        if k != kind || i == 0 || i > n {
            continue;
        }
        let parts = partial.entry(rank).or_default();
        if i == 1 || parts.len() != n {
            *parts = vec![None; n];
        }
        parts[i - 1] = Some(chunk.unwrap_or("").to_string());
        if parts.iter().all(Option::is_some) {
            let text: String = parts.drain(..).flatten().collect();
            done.insert(rank, text);
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_short_long_and_multibyte() {
        for text in [
            String::new(),
            "{\"a\":1}".to_string(),
            format!("{{\"d\":\"{}\"}}", "é→x ".repeat(300)),
        ] {
            let lines = encode("k", 3, &text);
            assert!(lines.iter().all(|l| l.len() < 512), "{lines:?}");
            assert_eq!(decode(&lines.join("\n"), "k")[&3], text);
        }
    }

    /// Two tasks' reports with their lines interleaved, other output in between, a report
    /// of another kind, and a rank whose report lost a line: both whole reports come back,
    /// the broken one does not.
    #[test]
    fn interleaved_reports_are_reassembled_and_broken_ones_left_out() {
        let a = format!("{{\"rank\":0,\"x\":\"{}\"}}", "a".repeat(900));
        let b = format!("{{\"rank\":1,\"x\":\"{}\"}}", "b".repeat(900));
        let c = format!("{{\"rank\":2,\"x\":\"{}\"}}", "c".repeat(900));
        let (la, lb, mut lc) = (encode("k", 0, &a), encode("k", 1, &b), encode("k", 2, &c));
        lc.remove(1);
        let mut log = vec!["table line".to_string()];
        for i in 0..3 {
            log.push(la[i].clone());
            log.push("noise from rank 1".into());
            log.push(lb[i].clone());
            if let Some(l) = lc.get(i) {
                log.push(l.clone());
            }
        }
        log.extend(encode("other", 0, "{}"));
        let got = decode(&log.join("\n"), "k");
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!((&got[&0], &got[&1]), (&a, &b));
    }
}
