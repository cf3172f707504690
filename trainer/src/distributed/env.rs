//! Who am I in the job: torchrun variables, else Slurm's, else a single process.
use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// Where the values came from, for the start-up report.
    pub source: &'static str,
}

/// A rank variable that cannot be used, named with its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistEnvError {
    #[error("{var}={value:?} is not a whole number")]
    NotANumber { var: &'static str, value: String },
    #[error("MASTER_PORT={0:?} is not a port number")]
    NotAPort(String),
    #[error("SLURM_JOB_NODELIST is not set")]
    NoNodeList,
    #[error("SLURM_JOB_NODELIST is empty")]
    EmptyNodeList,
    #[error("SLURM_JOB_NODELIST: {0}")]
    Hostlist(#[from] HostlistError),
    #[error("rank {rank} is outside a world of {world}")]
    RankOutsideWorld { rank: usize, world: usize },
}

/// A Slurm hostlist that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("unclosed '[' in {0:?}")]
    Unclosed(String),
    #[error("bad range {range:?} in {item:?}")]
    BadRange { range: String, item: String },
    #[error("descending range {range:?} in {item:?}")]
    Descending { range: String, item: String },
}

impl DistEnv {
    pub fn single() -> Self {
        Self {
            rank: 0,
            world: 1,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            source: "single process",
        }
    }

    pub fn from_process_env() -> Result<Self, DistEnvError> {
        Self::from_vars(&std::env::vars().collect())
    }

    /// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) wins over Slurm
    /// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, first host of SLURM_JOB_NODELIST, a port
    /// from SLURM_JOB_ID unless MASTER_PORT/MASTER_ADDR are set).
    pub fn from_vars(v: &HashMap<String, String>) -> Result<Self, DistEnvError> {
        let num = |k: &'static str| -> Result<Option<usize>, DistEnvError> {
            v.get(k)
                .map(|s| {
                    s.trim()
                        .parse::<usize>()
                        .map_err(|_| DistEnvError::NotANumber {
                            var: k,
                            value: s.clone(),
                        })
                })
                .transpose()
        };
        let port = |default: u16| -> Result<u16, DistEnvError> {
            match v.get("MASTER_PORT") {
                Some(p) => p
                    .trim()
                    .parse()
                    .map_err(|_| DistEnvError::NotAPort(p.clone())),
                None => Ok(default),
            }
        };
        let env = if let (Some(rank), Some(world)) = (num("RANK")?, num("WORLD_SIZE")?) {
            DistEnv {
                rank,
                world,
                local_rank: num("LOCAL_RANK")?.unwrap_or(rank),
                master_addr: v
                    .get("MASTER_ADDR")
                    .cloned()
                    .unwrap_or_else(|| "127.0.0.1".into()),
                master_port: port(29500)?,
                source: "torchrun variables",
            }
        } else if let (Some(rank), Some(world)) = (num("SLURM_PROCID")?, num("SLURM_NTASKS")?) {
            let master = match v.get("MASTER_ADDR") {
                Some(a) => a.clone(),
                None => {
                    let list = v
                        .get("SLURM_JOB_NODELIST")
                        .or_else(|| v.get("SLURM_NODELIST"))
                        .ok_or(DistEnvError::NoNodeList)?;
                    expand_hostlist(list)?
                        .into_iter()
                        .next()
                        .ok_or(DistEnvError::EmptyNodeList)?
                }
            };
            let job = num("SLURM_JOB_ID")?.unwrap_or(0);
            DistEnv {
                rank,
                world,
                local_rank: num("SLURM_LOCALID")?.unwrap_or(0),
                master_addr: master,
                // Distinct jobs sharing a node get distinct ports: 20000–39999.
                master_port: port(20000 + (job % 20000) as u16)?,
                source: "Slurm variables",
            }
        } else {
            return Ok(Self::single());
        };
        if env.world == 0 || env.rank >= env.world {
            return Err(DistEnvError::RankOutsideWorld {
                rank: env.rank,
                world: env.world,
            });
        }
        Ok(env)
    }
}

/// Slurm hostlist expansion: `gpu-st-[1-3,7]` → gpu-st-1, gpu-st-2, gpu-st-3, gpu-st-7;
/// zero padding (`n[08-10]`), several bracket groups (`r[1-2]n[1-2]`) and comma-separated
/// lists (`a1,b[2-3]`).
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for item in split_top_level(list) {
        out.extend(expand_one(&item)?);
    }
    Ok(out)
}

fn split_top_level(s: &str) -> Vec<String> {
    let (mut parts, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for ch in s.chars() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                if !cur.is_empty() {
                    parts.push(std::mem::take(&mut cur));
                }
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if !cur.is_empty() {
        parts.push(cur);
    }
    parts
}

fn expand_one(item: &str) -> Result<Vec<String>, HostlistError> {
    let Some(open) = item.find('[') else {
        return Ok(vec![item.to_string()]);
    };
    let close = item[open..]
        .find(']')
        .map(|c| open + c)
        .ok_or_else(|| HostlistError::Unclosed(item.into()))?;
    let (prefix, ranges, rest) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    let tails = expand_one(rest)?;
    let mut out = Vec::new();
    for r in ranges.split(',') {
        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
        let width = lo.len();
        let bad = || HostlistError::BadRange {
            range: r.into(),
            item: item.into(),
        };
        let (a, b): (u64, u64) = (
            lo.parse().map_err(|_| bad())?,
            hi.parse().map_err(|_| bad())?,
        );
        if b < a {
            return Err(HostlistError::Descending {
                range: r.into(),
                item: item.into(),
            });
        }
        for n in a..=b {
            for t in &tails {
                out.push(format!("{prefix}{n:0width$}{t}"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn hostlists() {
        let cases: &[(&str, &[&str])] = &[
            (
                "gpu-st-[1-3,7]",
                &["gpu-st-1", "gpu-st-2", "gpu-st-3", "gpu-st-7"],
            ),
            ("node001", &["node001"]),
            ("n[08-10]", &["n08", "n09", "n10"]),
            ("a1,b[2-3]", &["a1", "b2", "b3"]),
            ("r[1-2]n[1-2]", &["r1n1", "r1n2", "r2n1", "r2n2"]),
            ("p4d-[5,9]-x", &["p4d-5-x", "p4d-9-x"]),
        ];
        for (list, want) in cases {
            assert_eq!(expand_hostlist(list).unwrap(), *want, "{list}");
        }
        assert!(expand_hostlist("n[3-1]").is_err());
        assert!(expand_hostlist("n[1-2").is_err());
    }

    #[test]
    fn discovery_table() {
        let t = DistEnv::from_vars(&vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "h0"),
            ("MASTER_PORT", "1234"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ]))
        .unwrap();
        assert_eq!(
            (
                t.rank,
                t.world,
                t.local_rank,
                t.master_addr.as_str(),
                t.master_port,
                t.source
            ),
            (3, 8, 1, "h0", 1234, "torchrun variables")
        );
        let s = DistEnv::from_vars(&vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_JOB_NODELIST", "gpu-st-[2-3,7]"),
            ("SLURM_JOB_ID", "123456"),
        ]))
        .unwrap();
        assert_eq!(
            (
                s.rank,
                s.world,
                s.local_rank,
                s.master_addr.as_str(),
                s.master_port
            ),
            (5, 8, 1, "gpu-st-2", 20000 + 3456)
        );
        let s2 = DistEnv::from_vars(&vars(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "x"),
            ("MASTER_PORT", "4000"),
        ]))
        .unwrap();
        assert_eq!(s2.master_port, 4000);
        assert_eq!(DistEnv::from_vars(&vars(&[])).unwrap(), DistEnv::single());
        assert_eq!(
            DistEnv::from_vars(&vars(&[("RANK", "2"), ("WORLD_SIZE", "2")])),
            Err(DistEnvError::RankOutsideWorld { rank: 2, world: 2 })
        );
        assert_eq!(
            DistEnv::from_vars(&vars(&[("RANK", "x"), ("WORLD_SIZE", "2")]))
                .unwrap_err()
                .to_string(),
            "RANK=\"x\" is not a whole number"
        );
    }
}
